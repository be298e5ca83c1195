//! The leader's loop: it takes signalled nodes from the inbox, acts on
//! their lifecycle transitions (level-based, see [`super::lifecycle`]),
//! derives the desired links and routes once per batch (see
//! [`super::derive`]) and queues the affected nodes for reconciliation.
//! Only the leader runs it; in memory mode the single replica is the leader.

use std::collections::{BTreeSet, HashMap};

use crate::store::model::NodeRecord;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::arrivals::Arrivals;
use super::derive::derive;
use super::lifecycle::{Seen, Transition, transitions};
use super::pacing::{Affected, Pacing};
use super::queue::WorkQueue;
use super::working::WorkingState;
use crate::cluster::{Batch, Inbox, LeaderToken, Signals};
use crate::config::TopologyConfig;
use crate::store::model::DepartureKind;
use crate::store::{Store, StoreError};

/// A floor for the full resync, whatever `reconcile_period` says: a missed
/// signal must never leave a node underived for long.
pub const RESYNC_FLOOR: Duration = Duration::from_secs(60);

/// How long the first full read waits for the wake-up listener; past it,
/// the listener asks for a resync once it listens.
const LISTENING_WAIT: Duration = Duration::from_secs(2);

/// How long to wait before retrying after a failed derivation.
const RETRY_DELAY: Duration = Duration::from_millis(500);

pub struct Leader {
    store: Arc<dyn Store>,
    state: WorkingState,
    inbox: Arc<Inbox>,
    queue: Arc<WorkQueue>,
    topology: TopologyConfig,
    seen: HashMap<String, Seen>,
    resync_every: Duration,
    /// `reconcile_period` of "0s" disables the periodic reconcile of every
    /// node, though derivation still resyncs at the floor.
    sweep: bool,
    token: LeaderToken,
    affected: Affected,
    pacing: Pacing,
    arrivals: Arrivals,
}

impl Leader {
    pub fn new(
        store: Arc<dyn Store>,
        state: WorkingState,
        inbox: Arc<Inbox>,
        queue: Arc<WorkQueue>,
        topology: TopologyConfig,
        reconcile_period: Duration,
        token: LeaderToken,
    ) -> Self {
        let sweep = !reconcile_period.is_zero();
        let resync_every = if sweep {
            reconcile_period.min(RESYNC_FLOOR)
        } else {
            RESYNC_FLOOR
        };
        Self {
            store,
            state,
            inbox,
            queue,
            topology,
            seen: HashMap::new(),
            resync_every,
            sweep,
            token,
            affected: Affected::default(),
            pacing: Pacing::default(),
            arrivals: Arrivals::default(),
        }
    }

    /// Runs until `cancel` fires or a write is fenced. Starts with a full
    /// resync and a reconcile of every node: a new leader assumes nothing
    /// an earlier one did. That first read waits for `listening`, if given:
    /// a read before the wake-up listener listens could miss a fact
    /// signalled in between.
    pub async fn run(
        mut self,
        listening: Option<oneshot::Receiver<()>>,
        cancel: CancellationToken,
    ) {
        if let Some(listening) = listening {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = tokio::time::timeout(LISTENING_WAIT, listening) => {}
            }
        }
        if let Err(e) = self.resync(true).await {
            self.token.depose(&e.to_string());
            return;
        }
        let mut tick = tokio::time::interval(self.resync_every);
        tick.tick().await;
        loop {
            let due = self
                .affected
                .due()
                .into_iter()
                .chain(self.pacing.due())
                .chain(self.arrivals.due())
                .min();
            let done = tokio::select! {
                _ = cancel.cancelled() => break,
                // Urgent: the periodic sweep must not hold them back.
                _ = sleep_until(due) => {
                    self.release_affected();
                    Ok(())
                }
                _ = tick.tick() => self.resync(self.sweep).await,
                batch = self.inbox.next_batch() => self.take(batch).await,
            };
            if let Err(e) = done {
                self.token.depose(&e.to_string());
                break;
            }
            // In a burst the next batch is always ready, and on the memory
            // store nothing here waits: without a yield this task would
            // never let its thread go. The workers it wakes wait on that
            // thread (a task woken by a task runs on its thread, where no
            // other thread may take it), so a 10,000-node registration
            // burst kept every reconcile back until it ended (1-2.5 s).
            tokio::task::yield_now().await;
        }
        info!("leader work stopped");
    }

    /// A batch of signals; `Err` only when another leader took over.
    async fn take(&mut self, batch: Batch) -> Result<(), StoreError> {
        if batch.resync {
            self.resync(false).await?;
        }
        if batch.nodes.is_empty() {
            return Ok(());
        }
        self.handle(batch.nodes).await
    }

    /// Reads every row again at once and judges every node it holds or has
    /// seen; with `sweep`, queues every ready node too. Read here rather
    /// than at the next signal: a fleet registering as a term begins waited
    /// for that read behind its first node (40-60 ms of a 1,000-node burst
    /// on Postgres), and a list of the nodes to signal first was a second
    /// read of every node. A fact committed since signals its node again.
    /// If the read fails, the nodes seen are signalled and the next batch
    /// reads everything. `Err` only when another leader took over.
    async fn resync(&mut self, sweep: bool) -> Result<(), StoreError> {
        self.state.invalidate();
        if let Err(e) = self.state.refresh(self.store.as_ref(), &[]).await {
            warn!(error = %e, "full resync could not read the rows; the next batch reads again");
            self.seen.keys().for_each(|n| self.inbox.node_changed(n));
            return Ok(());
        }
        let mut nodes: BTreeSet<String> = self.seen.keys().cloned().collect();
        for n in self.state.rows().into_iter().flat_map(|r| r.nodes.iter()) {
            if sweep && n.ready_session().is_some() {
                self.queue.add(&n.id);
            }
            nodes.insert(n.id.clone());
        }
        self.judge(nodes.into_iter().collect(), Instant::now())
            .await
    }

    /// The working state, refreshed for the batch's nodes, serves both
    /// their lifecycle and the derivation: a batch reads what changed.
    async fn handle(&mut self, batch: Vec<String>) -> Result<(), StoreError> {
        let started = Instant::now();
        if let Err(e) = self.state.refresh(self.store.as_ref(), &batch).await {
            batch.iter().for_each(|n| self.retry_later(n, &e));
            return Ok(());
        }
        self.judge(batch, started).await
    }

    /// The lifecycle of the batch's nodes and the derivation, on the rows
    /// as they are (refreshed for the batch, begun at `started`).
    async fn judge(&mut self, batch: Vec<String>, started: Instant) -> Result<(), StoreError> {
        let size = batch.len();
        let records = self.records_of(&batch);
        let mut arrived = BTreeSet::new();
        let mut changed = false;
        for (node, record) in batch.into_iter().zip(records) {
            match self.observe(&node, record.as_ref()).await {
                Ok(o) => {
                    if o.wrote {
                        self.state.touched(&node);
                        changed = true;
                    }
                    if o.arrived {
                        arrived.insert(node);
                    }
                }
                Err(e @ StoreError::Fenced { .. }) => return Err(e),
                Err(e) => {
                    self.state.touched(&node);
                    changed = true;
                    self.retry_later(&node, &e);
                }
            }
        }
        if changed && let Err(e) = self.state.refresh(self.store.as_ref(), &[]).await {
            self.retry_later("", &e);
            return Ok(());
        }
        let refreshed = started.elapsed();
        match derive(
            self.store.as_ref(),
            &self.topology,
            &arrived,
            &mut self.state,
        )
        .await
        {
            Ok(d) => {
                debug!(
                    batch = size,
                    refreshed = ?refreshed,
                    changes = d.changes,
                    affected = d.affected.len(),
                    full = d.full,
                    planned = ?d.planned,
                    written = ?d.written,
                    "derived"
                );
                self.affected.add(&d.affected, &arrived);
                if let Some(after) = d.recheck_in {
                    self.derive_again(after);
                }
            }
            Err(e @ StoreError::Fenced { .. }) => return Err(e),
            Err(e) => {
                warn!(error = %e, "derivation failed; retrying");
                arrived.iter().for_each(|n| self.retry_later(n, &e));
                self.retry_later("", &e);
            }
        }
        Ok(())
    }

    /// Queues the nodes that are due: those whose desired state changed in
    /// the urgent lane, unless [`Pacing`] holds them (for their claims, or
    /// while facts wait in the inbox); and the looks at
    /// nodes that only arrived in the routine lane, once the leader is not
    /// busy (see [`super::arrivals`]), so that a registration burst's
    /// looks at nodes with nothing to send do not hold back the gateways'
    /// commands. Claims still on their way count as busy: between a
    /// gateway's link command and the routes its claims open, nothing
    /// else is, and on Postgres a third of the looks ran there, beside
    /// the derivation the route commands wait for.
    fn release_affected(&mut self) {
        let now = Instant::now();
        let (changed, arrived) = self.affected.take(now);
        self.arrivals.remove(&changed);
        self.arrivals.add(arrived, now);
        let facts_waiting = !self.inbox.is_empty();
        let go = self
            .pacing
            .release(self.state.rows(), changed, now, facts_waiting);
        go.iter().for_each(|n| self.queue.add_urgent(n));
        let busy = !self.affected.is_empty()
            || self.pacing.holding()
            || self.pacing.awaiting_claims(self.state.rows())
            || self.queue.urgent_busy();
        let looks = self.arrivals.take(busy, now);
        if !looks.is_empty() {
            debug!(looks = looks.len(), busy, "looks at arrived nodes queued");
        }
        looks.iter().for_each(|n| self.queue.add(n));
    }

    /// The batch's node records as the working state holds them.
    fn records_of(&self, batch: &[String]) -> Vec<Option<NodeRecord>> {
        let rows = self.state.rows();
        batch
            .iter()
            .map(|id| rows.and_then(|r| r.nodes.get(id)).cloned())
            .collect()
    }

    fn retry_later(&self, node: &str, e: &StoreError) {
        if let StoreError::Rejected(_) = e {
            // The store logged the statement it refused; the same look
            // would be refused again. The next fact or resync tries anew.
            warn!(node, error = %e, "not retried");
            return;
        }
        debug!(node, error = %e, "node will be looked at again");
        self.signal_after(node, RETRY_DELAY);
    }

    /// Runs a derivation after `after` even if no node signals: the empty
    /// key stands for "no node, just derive".
    fn derive_again(&self, after: Duration) {
        self.signal_after("", after);
    }

    fn signal_after(&self, node: &str, after: Duration) {
        let inbox = self.inbox.clone();
        let node = node.to_string();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            inbox.node_changed(&node);
        });
    }

    /// Applies the node's lifecycle transitions, judged on `record` (its
    /// record in this batch's look).
    async fn observe(
        &mut self,
        node: &str,
        record: Option<&NodeRecord>,
    ) -> Result<Observed, StoreError> {
        let mut out = Observed::default();
        if node.is_empty() {
            return Ok(out);
        }
        let seen = self.seen.get(node).copied();
        let (todo, next) = transitions(seen, record);
        let mut forgotten = false;
        for t in todo {
            out.arrived |= matches!(t, Transition::Arrived { .. });
            let (wrote, gone) = self.apply(node, t).await?;
            out.wrote |= wrote;
            forgotten |= gone;
        }
        match next.filter(|_| !forgotten) {
            Some(s) => self.seen.insert(node.to_string(), s),
            None => self.seen.remove(node),
        };
        Ok(out)
    }

    /// Acts on one transition; returns whether it wrote to the store and
    /// whether the node's record is gone.
    async fn apply(&self, node: &str, t: Transition) -> Result<(bool, bool), StoreError> {
        debug!(node, ?t, "lifecycle transition");
        match t {
            // Announcements of a crashed or returning node are judged by the
            // derivation, after the departure grace (see routing::templates).
            Transition::Arrived { .. } => Ok((false, false)),
            Transition::Departed { generation, kind } => {
                if kind != DepartureKind::Deregistered {
                    return Ok((false, false));
                }
                let upto = generation.saturating_add(1);
                self.store.drop_templates_before(node, upto).await?;
                let forgotten = self.store.forget_node(node, generation).await?;
                if forgotten {
                    info!(node, "deregistered node forgotten");
                }
                Ok((true, forgotten))
            }
        }
    }
}

/// Sleeps until `at`; never wakes without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// What observing one node found.
#[derive(Debug, Default)]
struct Observed {
    arrived: bool,
    /// A transition changed the store (the batch's look is stale).
    wrote: bool,
}

#[cfg(test)]
#[path = "leader_tests.rs"]
mod tests;
