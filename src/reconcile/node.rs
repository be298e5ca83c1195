//! Reconciling one node: read its desired state and its live tables, send
//! the one command that closes the gap (see [`super::diff`]), record the
//! node's answers. Returns what the queue should do next; errors go through
//! [`policy`], the one place that maps a failure to a next action.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info, warn};

use super::diff::{self, Live, Step};
use super::queue::{Outcome, WorkQueue};
use super::stranded::{self, Stranded};
use super::view::{DesiredView, NodeRows, ViewRoute};
use super::workers::Run;
use super::working::LinkWrites;
use crate::cluster::LeaderToken;
use crate::names;
use crate::ops::Metrics;
use crate::proto::sb;
use crate::store::model::{Link, LinkAnswer, RouteMark, RouteStatus};
use crate::store::{Store, StoreError};
use crate::transport::{Target, Transport, TransportError};

/// How long a route whose link is not on the node yet waits before the
/// node is looked at again.
pub const DEFER: Duration = Duration::from_secs(2);

/// How long after deleting a link to drop stranded routes its source is
/// looked at again to create it: time for the node to close it.
pub const RECREATE_AFTER: Duration = Duration::from_millis(200);

/// What one reconcile needs.
pub struct Reconciler {
    pub store: Arc<dyn Store>,
    /// Where the links it writes are named for the leader's working state.
    pub link_writes: Arc<LinkWrites>,
    /// The desired state as the leader holds it: a reconcile reads its
    /// node's rows there, and from the store only when it is silent.
    pub view: Arc<DesiredView>,
    pub transport: Arc<Transport>,
    /// The term the commands are issued under.
    pub token: LeaderToken,
    pub orphan_detection: bool,
    pub metrics: Arc<Metrics>,
    /// Links to re-create, and the queue that brings their ends round.
    pub stranded: Arc<Stranded>,
    pub queue: Arc<WorkQueue>,
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
        // Its owner is handing its nodes over: retry, to reach the node
        // where it registers next (its registration enqueues it too).
        ReconcileError::Transport(TransportError::OwnerDrained(_)) => {
            info!(node, %err, "reconcile failed; will retry");
            Outcome::Requeue
        }
        _ => {
            warn!(node, %err, "reconcile failed; will retry");
            Outcome::Requeue
        }
    }
}

impl Reconciler {
    /// Reconciles `node`: its own part (its tables, the command) in this
    /// run, the record of what it answered as the run's tail (see
    /// [`super::workers`]), so that the worker can go on to the next node
    /// while the record is written.
    pub async fn run(self: Arc<Self>, node: String) -> Run {
        let started = tokio::time::Instant::now();
        match self.command(&node).await {
            Ok(Commanded::Settled(outcome)) => {
                Run::Done(self.finished(&node, started, Ok(outcome)))
            }
            Err(e) => Run::Done(self.finished(&node, started, Err(e))),
            Ok(Commanded::ToRecord(sent)) => Run::Tail(Box::pin(async move {
                let recorded = self.record_sent(&node, sent, started).await;
                self.finished(&node, started, recorded)
            })),
        }
    }

    /// Counts a reconcile that began at `started` and maps its result to
    /// the queue's next action.
    fn finished(
        &self,
        node: &str,
        started: tokio::time::Instant,
        result: Result<Outcome, ReconcileError>,
    ) -> Outcome {
        let (outcome, label) = match result {
            Ok(outcome) => (outcome, outcome_label(outcome)),
            Err(e) => (policy(node, &e, &self.token), error_label(&e)),
        };
        self.metrics
            .reconcile_seconds
            .observe(started.elapsed().as_secs_f64());
        self.metrics
            .reconciles
            .get_or_create(&[("outcome", label)])
            .inc();
        outcome
    }

    /// The node's part: compares its tables with the desired state and
    /// sends the command that closes the gap, if any.
    async fn command(&self, node: &str) -> Result<Commanded, ReconcileError> {
        let t0 = tokio::time::Instant::now();
        // The node's tables and the desired state are independent: one
        // round trip's wait (the longer of the two), not two in a row.
        let (looked, desired) = tokio::join!(self.look(node), self.desired(node));
        let (target, conns, live_routes) = match looked {
            Ok(found) => found,
            // Not connected anywhere: its next registration enqueues it.
            Err(TransportError::NotConnected(_)) => return Ok(Commanded::Settled(Outcome::Done)),
            Err(e) => return Err(e.into()),
        };
        let NodeRows {
            mut links,
            routes,
            entries,
        } = desired?;
        links.extend(self.dialed_elsewhere(&links, &conns).await?);
        let looked = t0.elapsed();
        let live = Live {
            connections: &conns,
            routes: &live_routes,
        };
        let mut step = diff::decide(node, &links, &routes, &live, self.orphan_detection);
        let session = target.session();
        let flagged = |l: &str| self.stranded.is_flagged(l, session);
        // Flagged links being created again: their old connection is gone.
        let again: Vec<String> = (step.creating.iter())
            .filter(|l| flagged(l))
            .cloned()
            .collect();
        step.drop_links(node, &links, flagged);
        step.defer_links(&self.dead_ends(&links, &step).await);
        let outcome = next_outcome(&step);
        // Routes the node already holds, tombstones it no longer does:
        // recorded with the command's answers (one write, not two), or
        // alone when there is no command.
        let seen = Seen {
            marks: step.already.iter().map(|id| applied(id)).collect(),
            gone: std::mem::take(&mut step.gone),
        };
        let ack = match step.has_command() {
            true => Some(
                self.transport
                    .command_at(&target, step.command.clone(), &self.token)
                    .await?,
            ),
            false if seen.marks.is_empty() && seen.gone.is_empty() => {
                return Ok(Commanded::Settled(outcome));
            }
            false => None,
        };
        Ok(Commanded::ToRecord(Box::new(Sent {
            step,
            ack,
            seen,
            links,
            entries,
            again,
            outcome,
            looked,
            commanded: t0.elapsed(),
        })))
    }

    /// Records what the node answered (or, without a command, what it was
    /// seen to hold); the reconcile's outcome once written. `started`:
    /// when the reconcile began.
    async fn record_sent(
        &self,
        node: &str,
        mut sent: Box<Sent>,
        started: tokio::time::Instant,
    ) -> Result<Outcome, ReconcileError> {
        let Some(ack) = sent.ack.take() else {
            let seen = &sent.seen;
            self.write_record(node, &[], &seen.marks, &seen.gone, &sent.entries)
                .await?;
            return Ok(sent.outcome);
        };
        let refused = stranded::refused_removals(&sent.step, &ack);
        self.strand(node, &sent.links, &refused).await;
        self.record(node, &mut sent, &ack).await?;
        debug!(
            node,
            looked = ?sent.looked,
            commanded = ?sent.commanded,
            total = ?started.elapsed(),
            "reconciled with a command"
        );
        Ok(sent.outcome)
    }

    /// The links touching `node` and the routes it sources: from the
    /// view, or from the store when the view cannot tell.
    async fn desired(&self, node: &str) -> Result<NodeRows, StoreError> {
        if let Some(rows) = self.view.of(node) {
            return Ok(rows);
        }
        let (links, routes) = self.store.reconcile_view(node).await?;
        Ok(NodeRows {
            links,
            routes,
            entries: Vec::new(),
        })
    }

    /// The links of another source whose outgoing connection the node
    /// holds: it was their source before they moved while it was away.
    async fn dialed_elsewhere(
        &self,
        links: &[Link],
        conns: &[sb::ConnectionEntry],
    ) -> Result<Vec<Link>, StoreError> {
        let known: BTreeSet<&str> = links.iter().map(|l| l.link_id.as_str()).collect();
        let unknown: Vec<String> = (diff::outgoing_links(conns).into_iter())
            .filter(|id| !known.contains(id))
            .map(str::to_string)
            .collect();
        if unknown.is_empty() {
            return Ok(Vec::new());
        }
        self.store.get_links(&unknown).await
    }

    /// Where the node is, and its live connection and route tables.
    async fn look(
        &self,
        node: &str,
    ) -> Result<(Target, Vec<sb::ConnectionEntry>, Vec<sb::RouteEntry>), TransportError> {
        let target = self.transport.target(node).await?;
        let (conns, routes) = tokio::try_join!(
            self.transport.list_connections_at(&target),
            self.transport.list_routes_at(&target)
        )?;
        Ok((target, conns, routes))
    }

    /// The links the step would create whose claimed destination has no
    /// session now (it died and its grace has not run out). A real node
    /// dials inside its command handler and reads its control stream one
    /// message at a time, so a dial towards a dead end would hold every
    /// later command (the delete that ends it too) until the dial gives up.
    async fn dead_ends(&self, links: &[Link], step: &Step) -> Vec<String> {
        let creating: Vec<&Link> = links
            .iter()
            .filter(|l| step.creating.contains(&l.link_id))
            .collect();
        let dests: BTreeSet<&str> = creating
            .iter()
            .filter_map(|l| l.dest_node.as_deref())
            .collect();
        if dests.is_empty() {
            return Vec::new();
        }
        // One lookup for all: a gateway's first command creates dozens of
        // links, and on Postgres each lookup is a round trip. A failed one
        // holds nothing back: the node's own dial tells.
        let dests: Vec<String> = dests.into_iter().map(str::to_string).collect();
        let Ok(connected) = self.transport.connected(&dests).await else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for l in creating {
            let Some(dest) = l.dest_node.as_deref().filter(|d| !connected.contains(*d)) else {
                continue;
            };
            debug!(link = %l.link_id, %dest, "destination not connected; the link waits");
            out.push(l.link_id.clone());
        }
        out.sort();
        out
    }

    /// Flags the links whose routes `node` refused to remove as stranded
    /// and brings their sources round to re-create them.
    async fn strand(&self, node: &str, links: &[Link], refused: &BTreeSet<String>) {
        for id in refused {
            let Some(link) = links.iter().find(|l| &l.link_id == id) else {
                warn!(%node, link = %id, "a route the node cannot remove is on a link it does not know");
                continue;
            };
            // A source away now drops the link itself when it registers.
            let Ok(source) = self.transport.target(&link.source_node).await else {
                continue;
            };
            if self.stranded.flag(id, source.session()) {
                warn!(
                    %node, link = %id, source = %link.source_node,
                    "the node holds routes it can no longer remove (its control stream \
                     reconnected); the link's source re-creates the link to drop them"
                );
                self.queue.add_urgent(&link.source_node);
            }
        }
    }

    /// After creating flagged links again: counts them, clears their flags
    /// and looks at their other ends at once, whose routes over them went
    /// with the old connection.
    fn recreated(&self, node: &str, answers: &[LinkAnswer], links: &[Link], again: &[String]) {
        for a in answers
            .iter()
            .filter(|a| a.ok && again.contains(&a.link_id))
        {
            let Some(link) = links.iter().find(|l| l.link_id == a.link_id) else {
                continue;
            };
            info!(%node, link = %a.link_id, "link re-created; its routes are set again");
            self.stranded.clear(&a.link_id);
            self.metrics.links_recreated.inc();
            if let Some(dest) = link.dest_node.as_deref().filter(|d| *d != node) {
                self.queue.add_urgent(dest);
            }
        }
    }

    /// Records the node's per-item answers with what was `seen` before
    /// the command, all at once; any failure makes the whole step fail so
    /// the queue retries with backoff.
    async fn record(
        &self,
        node: &str,
        sent: &mut Sent,
        ack: &sb::ConfigurationCommandAck,
    ) -> Result<(), ReconcileError> {
        let mut failures = Vec::new();
        let (answers, acked_gone) = link_answers(&sent.step, ack, &mut failures);
        self.recreated(node, &answers, &sent.links, &sent.again);
        for l in &acked_gone {
            self.stranded.clear(l);
        }
        let mut marks = std::mem::take(&mut sent.seen.marks);
        marks.extend(route_marks(&sent.step, ack, &mut failures));
        let mut gone = std::mem::take(&mut sent.seen.gone);
        gone.extend(acked_gone);
        self.write_record(node, &answers, &marks, &gone, &sent.entries)
            .await?;
        match failures.is_empty() {
            true => Ok(()),
            false => Err(ReconcileError::Refused(failures.join("; "))),
        }
    }

    /// Writes a reconcile's record and, once it is written, applies it to
    /// the view (the routes as the reconcile read them: `entries`).
    async fn write_record(
        &self,
        node: &str,
        answers: &[LinkAnswer],
        marks: &[RouteMark],
        gone: &[String],
        entries: &[Arc<ViewRoute>],
    ) -> Result<(), StoreError> {
        let recorded = self
            .store
            .record_acknowledgement(node, answers, marks, gone)
            .await;
        // Named even when the write failed: its outcome is unknown.
        self.link_writes
            .wrote(answers.iter().map(|a| &a.link_id).chain(gone));
        recorded?;
        self.view.marked(entries, marks);
        self.view.dropped(gone);
        Ok(())
    }
}

/// What a reconcile saw on the node before its command: routes already
/// there, tombstones no longer there.
struct Seen {
    marks: Vec<RouteMark>,
    gone: Vec<String>,
}

/// How the node's part of a reconcile ended.
enum Commanded {
    /// With nothing to record.
    Settled(Outcome),
    /// With answers (or sightings) to record.
    ToRecord(Box<Sent>),
}

/// A reconcile whose node's part is done, to be recorded.
struct Sent {
    step: Step,
    /// The node's answer to the command, if one was sent.
    ack: Option<sb::ConfigurationCommandAck>,
    seen: Seen,
    links: Vec<Link>,
    /// The node's routes as read from the view, to mark there.
    entries: Vec<Arc<ViewRoute>>,
    /// Flagged links the command creates again.
    again: Vec<String>,
    outcome: Outcome,
    looked: Duration,
    commanded: Duration,
}

/// The queue's next action for a step that was carried out: look again
/// soon to re-create dropped links, later for deferred routes.
fn next_outcome(step: &Step) -> Outcome {
    if !step.dropping.is_empty() {
        Outcome::RequeueAfter(RECREATE_AFTER)
    } else if step.deferred > 0 {
        Outcome::RequeueAfter(DEFER)
    } else {
        Outcome::Done
    }
}

/// The mark of a route the node was seen to hold.
fn applied(id: &str) -> RouteMark {
    RouteMark {
        id: id.to_string(),
        status: RouteStatus::Applied,
        message: String::new(),
    }
}

fn outcome_label(o: Outcome) -> &'static str {
    match o {
        Outcome::Done => "converged",
        Outcome::Requeue | Outcome::RequeueAfter(_) => "deferred",
    }
}

fn error_label(e: &ReconcileError) -> &'static str {
    match e {
        ReconcileError::Store(_) => "store_error",
        ReconcileError::Transport(_) => "node_unreachable",
        ReconcileError::Refused(_) => "node_refused",
    }
}

/// The answers to the links the step created, and the deleted links the
/// node no longer holds. A link dropped to be created again is neither.
pub(super) fn link_answers(
    step: &Step,
    ack: &sb::ConfigurationCommandAck,
    failures: &mut Vec<String>,
) -> (Vec<LinkAnswer>, Vec<String>) {
    let (mut answers, mut gone) = (Vec::new(), Vec::new());
    for s in &ack.connections_status {
        let done = s.success || diff::is_not_found(&s.error_msg);
        if step.creating.contains(&s.link_id) {
            answers.push(LinkAnswer {
                link_id: s.link_id.clone(),
                ok: s.success,
                message: s.error_msg.clone(),
            });
            if !s.success {
                failures.push(format!("link {}: {}", s.link_id, s.error_msg));
            }
        } else if [&step.deleting, &step.dropping, &step.disowned]
            .iter()
            .any(|ids| ids.contains(&s.link_id))
        {
            if !done {
                failures.push(format!("delete {}: {}", s.link_id, s.error_msg));
            } else if step.deleting.contains(&s.link_id) {
                gone.push(s.link_id.clone());
            }
        }
    }
    (answers, gone)
}

/// The answers to the routes the step set.
fn route_marks(
    step: &Step,
    ack: &sb::ConfigurationCommandAck,
    failures: &mut Vec<String>,
) -> Vec<RouteMark> {
    let mut marks = Vec::new();
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
            failures.push(format!("route {id}: {}", s.error_msg));
            RouteStatus::Failed
        };
        marks.push(RouteMark {
            id: id.clone(),
            status,
            message: s.error_msg.clone(),
        });
    }
    marks
}
