//! A running replica, and how it stops: handing leadership over, draining
//! its nodes to other replicas, shutting down.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use super::handover;
use crate::cluster::{ElectionHandle, Identity, Inbox, Leadership};
use crate::config::DrainConfig;
use crate::ops::{Health, Metrics};
use crate::reconcile::queue::WorkQueue;
use crate::reconcile::supervisor::QueueSlot;
use crate::store::Store;
use crate::transport::{Registry, Transport};

/// How long a replica going away waits for its streams' ends to be recorded.
const WRITERS_GRACE: Duration = Duration::from_secs(5);

/// A running replica.
pub struct Running {
    pub northbound_addr: SocketAddr,
    pub southbound_addr: SocketAddr,
    /// The relay listener of a clustered replica.
    pub relay_addr: Option<SocketAddr>,
    /// The HTTP endpoint (health, readiness, metrics), when enabled.
    pub http_addr: Option<SocketAddr>,
    pub store: Arc<dyn Store>,
    pub transport: Arc<Transport>,
    pub inbox: Arc<Inbox>,
    pub leadership: Arc<Leadership>,
    pub identity: Arc<Identity>,
    pub health: Arc<Health>,
    pub metrics: Arc<Metrics>,
    pub(super) parts: Parts,
}

/// What a running replica keeps to stop.
pub(super) struct Parts {
    pub election: Option<ElectionHandle>,
    pub queues: Arc<QueueSlot>,
    /// Set when the replica can no longer run (its id was taken).
    pub failure: watch::Receiver<Option<String>>,
    /// Asked by an operator (`slim-cp drain`).
    pub drain_requested: Arc<Notify>,
    pub drain: DrainConfig,
    pub cancel: CancellationToken,
    /// Stops the relay, last: peers reach this replica's streams until the
    /// streams' ends are recorded.
    pub relay_cancel: CancellationToken,
    pub writers: TaskTracker,
    pub acceptors: Vec<JoinHandle<()>>,
    pub tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Hands leadership over (if leading), stops listening, closes every
    /// node stream (their nodes reconnect to another replica), waits until
    /// the streams' ends are recorded, then stops the relay and the tasks.
    /// The order lets the new leader hand over cleanly: until the ends are
    /// recorded, its requests for these nodes still reach this replica and
    /// are answered (the session is gone), instead of failing to connect.
    pub async fn shutdown(self) {
        let p = self.parts;
        if let Some(election) = &p.election {
            election.resign().await;
        }
        self.health.set_listening(false);
        p.cancel.cancel();
        // Listening stops before any stream closes (see `listen`).
        for a in p.acceptors {
            let _ = a.await;
        }
        self.transport.registry().close_all();
        p.writers.close();
        if tokio::time::timeout(WRITERS_GRACE, p.writers.wait())
            .await
            .is_err()
        {
            warn!("some stream ends were not recorded in time; the cluster will expire them");
        }
        p.relay_cancel.cancel();
        for t in p.tasks {
            let _ = t.await;
        }
    }

    /// Moves this replica's nodes to the others before it stops: not
    /// ready (the load balancer takes it out), leadership handed over, no
    /// new node streams (connects are refused, never a handshake), a pause
    /// for the load balancer, then the streams closed in batches so their
    /// nodes re-register elsewhere without a storm. Returns when none is
    /// left.
    pub async fn drain(&self) {
        let d = &self.parts.drain;
        // Not ready, and the node listener closes (see `listen::gated`).
        self.health.set_draining();
        info!(streams = self.registry().len(), "draining");
        if let Some(election) = &self.parts.election {
            election.resign().await;
        }
        handover::listener_closed_for(&self.health, d.lb_grace).await;
        handover::close_in_batches(self.registry(), d, || true).await;
        info!("drained: no node stream left");
    }

    /// Resolves when an operator asks this replica to drain.
    pub async fn drain_requested(&self) {
        self.parts.drain_requested.notified().await;
    }

    /// Hands leadership over if this replica leads; returns the epoch left.
    pub async fn step_down(&self) -> Option<u64> {
        self.parts.election.as_ref()?.resign().await
    }

    pub fn registry(&self) -> &Arc<Registry> {
        self.transport.registry()
    }

    /// The current term's reconcile queue (`None` while not leading).
    pub fn queue(&self) -> Option<Arc<WorkQueue>> {
        self.parts.queues.get()
    }

    /// Resolves with the reason once the replica cannot go on; never for
    /// a replica that has nothing that could fail so (a single one).
    pub async fn failed(&self) -> String {
        let mut rx = self.parts.failure.clone();
        match rx.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone().unwrap_or_default(),
            Err(_) => std::future::pending().await,
        }
    }
}
