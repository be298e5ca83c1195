//! Moving this replica's nodes to the others by closing their streams: a
//! node whose registered stream ends makes one reconnect attempt, which
//! the load balancer sends to a replica still listening. One path for
//! every reason to move them:
//!
//! - an operator's drain (`Running::drain`: SIGTERM, `slim-cp drain`);
//! - the leader's drain flag, set when its relay cannot reach this
//!   replica (commands to these nodes would wait for a heal);
//! - Postgres unreachable from this replica alone.
//!
//! Each first closes the node listener (see `listen::gated`), waits the
//! load balancer's grace from the moment the socket closed, then closes
//! streams a batch at a time. The last two wait at most half the replica
//! TTL: a replica that lost Postgres is declared dead one TTL after its
//! last heartbeat, and a node whose session ends so keeps its links only
//! if it registers again within the departure grace; its nodes must have
//! moved by then (a refused connect is redispatched by the load balancer
//! anyway, so the shorter pause costs nothing).
//!
//! Why the last two also need a peer that says it is ready (its own word
//! over the relay: listening, its database answering, not draining): a
//! replica that lost Postgres cannot tell from its own heartbeat whether
//! only it lost it or everyone did. Waiting out the heartbeat TTL would
//! not tell either (nobody declares it dead when nobody reaches the
//! database), and closing streams when every replica has stopped
//! listening strands the nodes: their one reconnect is refused
//! everywhere. A ready peer is both the proof that Postgres is reachable
//! from the cluster (the leader, if any, will end this replica's sessions
//! anyway) and the place the nodes land. The relay addresses come from
//! the database while it answers and are kept for when it does not. With
//! no ready peer every stream stays open and the facts wait in the outbox
//! for the database, as the design asks of a cluster-wide outage.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::cluster::relay::RelayClient;
use crate::config::DrainConfig;
use crate::ops::Health;
use crate::transport::Registry;

/// Waits until the node listener has been closed for `grace`.
pub(super) async fn listener_closed_for(health: &Health, grace: Duration) {
    loop {
        let left = match health.closed_for() {
            Some(closed) if closed >= grace => return,
            Some(closed) => grace - closed,
            // The listener closes at once when told to; check again soon.
            None => Duration::from_millis(20),
        };
        tokio::time::sleep(left).await;
    }
}

/// Closes the streams of `registry` a batch at a time while `go_on()`;
/// returns how many are left.
pub(super) async fn close_in_batches(
    registry: &Registry,
    drain: &DrainConfig,
    go_on: impl Fn() -> bool,
) -> usize {
    loop {
        let streams = registry.snapshot();
        if streams.is_empty() || !go_on() {
            return streams.len();
        }
        for s in streams.iter().take(drain.batch) {
            registry.remove(s.node(), s.session());
        }
        let left = streams.len().saturating_sub(drain.batch);
        info!(left, "closed a batch of node streams");
        tokio::time::sleep(drain.interval).await;
    }
}

/// Moves the nodes of a clustered replica that cannot serve them.
pub(super) struct Handover {
    pub registry: Arc<Registry>,
    pub health: Arc<Health>,
    pub relay: Arc<RelayClient>,
    pub drain: DrainConfig,
    /// How long the listener stays closed before streams close: the
    /// drain's `lb_grace`, at most half the replica TTL.
    pub pause: Duration,
    pub every: Duration,
}

impl Handover {
    /// Checks every `every` until `cancel`.
    pub async fn run(self, cancel: CancellationToken) {
        loop {
            // One small read a beat: a peer that joined a moment before
            // the database went away is known.
            // Bounded: the database may go away in the middle of the read.
            if self.health.database_reachable() {
                let _ = tokio::time::timeout(self.every, self.relay.refresh_peers()).await;
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(self.every) => {}
            }
            if let Some(why) = self.due().await {
                warn!(
                    why,
                    streams = self.registry.len(),
                    "a peer is ready: moving this replica's nodes to it"
                );
                let left =
                    close_in_batches(&self.registry, &self.drain, || self.why().is_some()).await;
                info!(left, "handover done");
            }
        }
    }

    /// Why the nodes should move now, if they should.
    async fn due(&self) -> Option<&'static str> {
        let why = self.why()?;
        let closed = self.health.closed_for()?;
        if closed < self.pause || self.registry.is_empty() {
            return None;
        }
        self.relay
            .a_peer_is_ready(self.every.max(Duration::from_secs(1)))
            .await
            .then_some(why)
    }

    /// A reason to move the nodes, unless an operator's drain already
    /// moves them.
    fn why(&self) -> Option<&'static str> {
        if self.health.is_draining() {
            None
        } else if self.health.drain_flagged() {
            Some("the leader flagged this replica for drain")
        } else if !self.health.database_reachable() {
            Some("the database is unreachable from this replica")
        } else {
            None
        }
    }
}
