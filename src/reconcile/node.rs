//! Reconciling one node: read its desired state and its live tables, send
//! the one command that closes the gap (see [`super::diff`]), record the
//! node's answers. Returns what the queue should do next; errors go through
//! [`policy`], the one place that maps a failure to a next action.

use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, warn};

use super::diff::{self, Live, Step};
use super::queue::Outcome;
use crate::cluster::LeaderToken;
use crate::names;
use crate::proto::sb;
use crate::store::model::RouteStatus;
use crate::store::{ChangeSet, Store, StoreError};
use crate::transport::{Transport, TransportError};

/// How long a route whose link is not on the node yet waits before the
/// node is looked at again.
pub const DEFER: Duration = Duration::from_secs(2);

/// What one reconcile needs.
pub struct Reconciler {
    pub store: Arc<dyn Store>,
    pub transport: Arc<Transport>,
    /// The term the commands are issued under.
    pub token: LeaderToken,
    pub orphan_detection: bool,
}

/// Why a reconcile did not converge.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("node: {0}")]
    Transport(#[from] TransportError),
    #[error("the node refused part of the command: {0}")]
    Refused(String),
}

/// The next action after an error. A sign that another leader took over
/// (a fenced write, a node that has seen a newer epoch) deposes this one.
pub fn policy(node: &str, err: &ReconcileError, token: &LeaderToken) -> Outcome {
    match err {
        // The session is gone: its next registration enqueues the node.
        ReconcileError::Transport(
            TransportError::NotConnected(_) | TransportError::SessionEnded,
        ) => {
            debug!(node, %err, "node went away during reconcile");
            Outcome::Done
        }
        ReconcileError::Store(StoreError::Fenced { .. }) => {
            token.depose("a reconcile write was fenced");
            Outcome::Done
        }
        ReconcileError::Transport(TransportError::Fenced { highest, .. }) => {
            if *highest > token.epoch() {
                token.depose("a node has seen a newer leader");
            }
            Outcome::Done
        }
        ReconcileError::Transport(TransportError::NotLeader(_)) => Outcome::Done,
        _ => {
            warn!(node, %err, "reconcile failed; will retry");
            Outcome::Requeue
        }
    }
}

impl Reconciler {
    pub async fn run(&self, node: &str) -> Outcome {
        match self.reconcile(node).await {
            Ok(outcome) => outcome,
            Err(e) => policy(node, &e, &self.token),
        }
    }

    async fn reconcile(&self, node: &str) -> Result<Outcome, ReconcileError> {
        let target = match self.transport.target(node).await {
            Ok(t) => t,
            // Not connected anywhere: its next registration enqueues it.
            Err(TransportError::NotConnected(_)) => return Ok(Outcome::Done),
            Err(e) => return Err(e.into()),
        };
        let links = self.store.links_touching(node).await?;
        let routes = self.store.routes_sourced(node).await?;
        let (conns, live_routes) = tokio::try_join!(
            self.transport.list_connections_at(&target),
            self.transport.list_routes_at(&target)
        )?;
        let live = Live {
            connections: &conns,
            routes: &live_routes,
        };
        let step = diff::decide(node, &links, &routes, &live, self.orphan_detection);
        for id in &step.already {
            self.store.mark_route(id, RouteStatus::Applied, "").await?;
        }
        if !step.gone.is_empty() {
            let changes = ChangeSet {
                delete_links: step.gone.clone(),
                ..ChangeSet::default()
            };
            self.store.apply(changes).await?;
        }
        if step.has_command() {
            let ack = self
                .transport
                .command_at(&target, step.command.clone(), &self.token)
                .await?;
            self.record(node, &step, &ack).await?;
        }
        Ok(if step.deferred > 0 {
            Outcome::RequeueAfter(DEFER)
        } else {
            Outcome::Done
        })
    }

    /// Records the node's per-item answers; any failure makes the whole
    /// step fail so the queue retries with backoff.
    async fn record(
        &self,
        node: &str,
        step: &Step,
        ack: &sb::ConfigurationCommandAck,
    ) -> Result<(), ReconcileError> {
        let mut failures = Vec::new();
        let mut gone = Vec::new();
        for s in &ack.connections_status {
            if step.creating.contains(&s.link_id) {
                self.store
                    .mark_link_sent(&s.link_id, node, s.success, &s.error_msg)
                    .await?;
                if !s.success {
                    failures.push(format!("link {}: {}", s.link_id, s.error_msg));
                }
            } else if step.deleting.contains(&s.link_id) {
                if s.success || diff::is_not_found(&s.error_msg) {
                    gone.push(s.link_id.clone());
                } else {
                    failures.push(format!("delete {}: {}", s.link_id, s.error_msg));
                }
            }
        }
        for s in &ack.routes_status {
            let Some(route) = &s.route else { continue };
            let key = route
                .name
                .as_ref()
                .and_then(|n| names::from_wire(n).ok())
                .zip(route.link_id.clone());
            let Some(id) = key.and_then(|k| step.setting.get(&k)) else {
                continue;
            };
            let status = if s.success {
                RouteStatus::Applied
            } else {
                RouteStatus::Failed
            };
            self.store.mark_route(id, status, &s.error_msg).await?;
            if !s.success {
                failures.push(format!("route {id}: {}", s.error_msg));
            }
        }
        if !gone.is_empty() {
            self.store
                .apply(ChangeSet {
                    delete_links: gone,
                    ..ChangeSet::default()
                })
                .await?;
        }
        match failures.is_empty() {
            true => Ok(()),
            false => Err(ReconcileError::Refused(failures.join("; "))),
        }
    }
}
