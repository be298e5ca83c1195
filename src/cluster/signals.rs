//! Signals to the leader: which nodes' facts changed since it last looked.
//!
//! A set, not a queue: the leader derives from current facts, so many
//! signals for one node collapse into one, memory stays bounded by the
//! fleet, and a lost signal costs latency (the leader also resyncs fully on
//! winning, when its listener reconnects and at a periodic floor), never
//! correctness. In the single-replica memory mode the front doors signal
//! the inbox directly; with Postgres, fact transactions `NOTIFY` and the
//! leader's listener (see [`super::wakeups`]) feeds the inbox.

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::Notify;

/// What the front doors tell the rest of the cluster.
pub trait Signals: Send + Sync + 'static {
    /// The node's facts changed: the leader should look at it.
    fn node_changed(&self, node: &str);

    /// A registration replaced `old`, a session another replica may own:
    /// that replica should close the old stream. A replacement on this
    /// replica needs nothing (the stream registry closes the old stream).
    fn session_replaced(&self, _node: &str, _old: &crate::store::model::Session) {}
}

/// What the leader should look at next.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Batch {
    pub nodes: Vec<String>,
    /// Look at every node: a signal may have been lost.
    pub resync: bool,
}

#[derive(Default)]
struct Pending {
    dirty: BTreeSet<String>,
    resync: bool,
}

/// The leader's inbox.
#[derive(Default)]
pub struct Inbox {
    pending: Mutex<Pending>,
    wake: Notify,
}

impl Inbox {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks for a full resync (a signal may have been missed).
    pub fn resync(&self) {
        self.lock().resync = true;
        self.wake.notify_one();
    }

    /// Takes everything signalled so far, waiting until there is something.
    pub async fn next_batch(&self) -> Batch {
        loop {
            let notified = self.wake.notified();
            let batch = {
                let mut p = self.lock();
                Batch {
                    nodes: std::mem::take(&mut p.dirty).into_iter().collect(),
                    resync: std::mem::take(&mut p.resync),
                }
            };
            if batch != Batch::default() {
                return batch;
            }
            notified.await;
        }
    }

    /// Forgets what is pending: a new term starts with a full resync.
    pub fn clear(&self) {
        *self.lock() = Pending::default();
    }

    pub fn len(&self) -> usize {
        self.lock().dirty.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Signals for Inbox {
    fn node_changed(&self, node: &str) {
        self.lock().dirty.insert(node.to_string());
        self.wake.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn inbox_collapses_repeated_signals() {
        let inbox = Inbox::new();
        for node in ["b", "a", "b", "b"] {
            inbox.node_changed(node);
        }
        assert_eq!(inbox.next_batch().await.nodes, ["a", "b"]);
        assert!(inbox.is_empty());
    }

    #[tokio::test]
    async fn inbox_wakes_a_waiting_leader() {
        let inbox = std::sync::Arc::new(Inbox::new());
        let waiter = tokio::spawn({
            let inbox = inbox.clone();
            async move { inbox.next_batch().await }
        });
        tokio::task::yield_now().await;
        inbox.node_changed("n1");
        let batch = waiter.await.ok();
        assert_eq!(batch.map(|b| b.nodes), Some(vec!["n1".to_string()]));
    }

    #[tokio::test]
    async fn a_resync_request_is_a_batch_of_its_own() {
        let inbox = Inbox::new();
        inbox.resync();
        let batch = inbox.next_batch().await;
        assert!(batch.resync && batch.nodes.is_empty());
        inbox.node_changed("n");
        inbox.clear();
        inbox.node_changed("m");
        assert_eq!(
            inbox.next_batch().await,
            Batch {
                nodes: vec!["m".into()],
                resync: false
            }
        );
    }
}
