//! The leader's derivation loop: it takes signalled nodes from the inbox,
//! compares each node's record with what it saw last (level-based, see
//! [`super::lifecycle`]) and acts on departures and arrivals. Only the leader
//! runs it; in memory mode the single replica is the leader.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::inbox::{Inbox, Signals};
use super::lifecycle::{Seen, Transition, transitions};
use crate::store::model::DepartureKind;
use crate::store::{Store, StoreError};

/// A floor for the full resync, whatever `reconcile_period` says: a missed
/// signal must never leave a node underived for long.
pub const RESYNC_FLOOR: Duration = Duration::from_secs(60);

/// How long to wait before retrying a node whose derivation failed.
const RETRY_DELAY: Duration = Duration::from_millis(500);

pub struct Leader {
    store: Arc<dyn Store>,
    inbox: Arc<Inbox>,
    seen: HashMap<String, Seen>,
    resync_every: Duration,
}

impl Leader {
    pub fn new(store: Arc<dyn Store>, inbox: Arc<Inbox>, reconcile_period: Duration) -> Self {
        let resync_every = if reconcile_period.is_zero() {
            RESYNC_FLOOR
        } else {
            reconcile_period.min(RESYNC_FLOOR)
        };
        Self {
            store,
            inbox,
            seen: HashMap::new(),
            resync_every,
        }
    }

    /// Runs until `cancel` fires. Starts with a full resync: a new leader
    /// assumes nothing about what an earlier one did.
    pub async fn run(mut self, cancel: CancellationToken) {
        self.resync().await;
        let mut tick = tokio::time::interval(self.resync_every);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tick.tick() => self.resync().await,
                batch = self.inbox.next_batch() => {
                    for node in batch {
                        self.derive_or_retry(&node).await;
                    }
                }
            }
        }
        info!("leader work stopped");
    }

    /// Marks every known node dirty, including ones only this leader remembers.
    async fn resync(&mut self) {
        match self.store.list_nodes().await {
            Ok(nodes) => nodes.iter().for_each(|n| self.inbox.node_changed(&n.id)),
            Err(e) => warn!(error = %e, "full resync could not list nodes"),
        }
        self.seen.keys().for_each(|n| self.inbox.node_changed(n));
    }

    async fn derive_or_retry(&mut self, node: &str) {
        if let Err(e) = self.derive(node).await {
            warn!(node, error = %e, "derivation failed; retrying");
            let inbox = self.inbox.clone();
            let node = node.to_string();
            tokio::spawn(async move {
                tokio::time::sleep(RETRY_DELAY).await;
                inbox.node_changed(&node);
            });
        }
    }

    async fn derive(&mut self, node: &str) -> Result<(), StoreError> {
        let record = self.store.get_node(node).await?;
        let seen = self.seen.get(node).copied();
        let (todo, next) = transitions(seen, record.as_ref());
        let mut forgotten = false;
        for t in todo {
            forgotten |= self.apply(node, t).await?;
        }
        match next.filter(|_| !forgotten) {
            Some(s) => self.seen.insert(node.to_string(), s),
            None => self.seen.remove(node),
        };
        Ok(())
    }

    /// Acts on one transition; returns whether the node's record is gone.
    async fn apply(&self, node: &str, t: Transition) -> Result<bool, StoreError> {
        debug!(node, ?t, "lifecycle transition");
        match t {
            Transition::Arrived { generation } => {
                // Announcements of older sessions go; the node replays its
                // current ones after registering.
                self.store.drop_templates_before(node, generation).await?;
                Ok(false)
            }
            Transition::Departed { generation, kind } => {
                let upto = generation.saturating_add(1);
                self.store.drop_templates_before(node, upto).await?;
                let forgotten = kind == DepartureKind::Deregistered
                    && self.store.forget_node(node, generation).await?;
                if forgotten {
                    info!(node, "deregistered node forgotten");
                }
                Ok(forgotten)
            }
        }
    }
}
