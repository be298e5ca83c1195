//! Several replicas on one Postgres database: who they are (identity,
//! membership and liveness), who leads (election, lease, fencing epoch),
//! how they reach each other's node streams (the relay), how the leader
//! hears of new facts (signals and wake-ups), and the operator's view
//! (status, step-down).
//!
//! The single replica of the memory store uses only [`Leadership::solo`],
//! the in-process [`Inbox`] and the admin service; everything else here
//! needs Postgres.

pub mod admin;
pub mod election;
pub mod expiry;
mod identity;
mod leadership;
pub mod membership;
mod pgconn;
pub mod reachability;
pub mod relay;
mod replica;
mod signals;
pub mod unreachable;
pub mod wakeups;

use std::sync::Arc;

pub use election::{Election, ElectionHandle};
pub use identity::{Identity, hostname};
pub use leadership::{LeaderToken, Leadership, Role};
pub use replica::{FencedWrites, QueueDepth, Replica};
pub use signals::{Batch, Inbox, Signals};

use crate::store::model::Session;
use relay::RelayClient;

/// Signals of a replica sharing Postgres. Fact transactions wake the
/// leader themselves (`NOTIFY`), wherever it runs, so `node_changed` has
/// nothing left to do here; a replaced session's owner is told over the
/// relay.
pub struct ClusterSignals {
    pub identity: Arc<Identity>,
    pub relay: Arc<RelayClient>,
}

impl Signals for ClusterSignals {
    fn node_changed(&self, _node: &str) {}

    fn session_replaced(&self, node: &str, old: &Session) {
        // This run's own streams are replaced in its registry; an earlier
        // run of this id is gone with its streams.
        if self.identity.id() == old.owner.id {
            return;
        }
        let (relay, node, old) = (self.relay.clone(), node.to_string(), old.clone());
        tokio::spawn(async move { relay.close_session(&node, &old).await });
    }
}
