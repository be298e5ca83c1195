//! The streams this replica owns, by node id. Removal is guarded by session
//! id, so the late close of a replaced stream cannot remove its successor.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use uuid::Uuid;

use super::NodeStream;
use super::stream::Gate;

#[derive(Default)]
pub struct Registry {
    streams: Mutex<HashMap<String, Arc<NodeStream>>>,
    /// Per node, kept across its sessions: a newer session must not reset
    /// the highest epoch its node has seen.
    gates: Mutex<HashMap<String, Arc<Gate>>>,
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<NodeStream>>> {
        self.streams.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes `stream` the node's stream; the one it replaces is closed.
    pub fn insert(&self, stream: Arc<NodeStream>) {
        let replaced = self.lock().insert(stream.node().to_string(), stream);
        if let Some(old) = replaced {
            old.close();
        }
    }

    /// Removes and closes the node's stream if it still belongs to `session`.
    pub fn remove(&self, node: &str, session: Uuid) -> bool {
        let removed = {
            let mut map = self.lock();
            match map.get(node) {
                Some(s) if s.session() == session => map.remove(node),
                _ => None,
            }
        };
        removed.map(|s| s.close()).is_some()
    }

    /// The node's epoch gate, shared by all its streams on this replica.
    pub fn gate(&self, node: &str) -> Arc<Gate> {
        let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        gates.entry(node.to_string()).or_default().clone()
    }

    pub fn get(&self, node: &str) -> Option<Arc<NodeStream>> {
        self.lock().get(node).cloned()
    }

    /// Every stream, at this moment.
    pub fn snapshot(&self) -> Vec<Arc<NodeStream>> {
        self.lock().values().cloned().collect()
    }

    /// Requests waiting for a reply, over every stream.
    pub fn waiting(&self) -> usize {
        self.lock().values().map(|s| s.waiting()).sum()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Closes the streams of `group`'s nodes (their ids are `group/node`),
    /// whose registration auth was withdrawn: they must register again.
    /// Returns how many there were.
    pub fn close_group(&self, group: &str) -> usize {
        let members: Vec<_> = self
            .lock()
            .values()
            .filter(|s| s.node().split_once('/').is_some_and(|(g, _)| g == group))
            .cloned()
            .collect();
        for s in &members {
            s.close();
        }
        members.len()
    }

    /// Closes every stream (shutdown): their nodes reconnect elsewhere.
    pub fn close_all(&self) {
        let all: Vec<_> = self.lock().drain().map(|(_, s)| s).collect();
        for s in all {
            s.close();
        }
    }
}
