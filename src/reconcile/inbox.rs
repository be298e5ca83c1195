//! The leader's inbox: the set of nodes whose facts changed since the leader
//! last looked. A set, not a queue: the leader derives from current facts,
//! so many signals for one node collapse into one, memory stays bounded by
//! the fleet size, and a lost signal costs latency (the periodic full resync
//! catches it), never correctness.

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::Notify;

/// Where fact writers announce that a node's facts changed.
pub trait Signals: Send + Sync + 'static {
    fn node_changed(&self, node: &str);
}

#[derive(Default)]
pub struct Inbox {
    dirty: Mutex<BTreeSet<String>>,
    wake: Notify,
}

impl Inbox {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeSet<String>> {
        self.dirty.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes every node signalled so far, waiting until there is one.
    pub async fn next_batch(&self) -> Vec<String> {
        loop {
            let notified = self.wake.notified();
            let batch: Vec<String> = std::mem::take(&mut *self.lock()).into_iter().collect();
            if !batch.is_empty() {
                return batch;
            }
            notified.await;
        }
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Signals for Inbox {
    fn node_changed(&self, node: &str) {
        self.lock().insert(node.to_string());
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
        assert_eq!(inbox.next_batch().await, ["a", "b"]);
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
        assert_eq!(waiter.await.ok(), Some(vec!["n1".to_string()]));
    }
}
