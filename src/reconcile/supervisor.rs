//! Starts leader work when this replica wins a term and stops it, before
//! anything else, when the term ends. Each term starts from scratch: a
//! fresh queue, an empty inbox, a full resync and a reconcile of every
//! node, with every write fenced by the term's epoch and every command
//! checked against the term's lease.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Leader;
use super::node::Reconciler;
use super::queue::{QueueConfig, WorkQueue};
use super::workers::run_workers;
use super::working::{LinkWrites, WorkingState};
use crate::cluster::{Inbox, LeaderToken, Leadership, Role};
use crate::config::{ReconcilerConfig, TopologyConfig};
use crate::ops::Metrics;
use crate::store::Store;
use crate::transport::Transport;

/// How long a term's tasks get to wind down after cancellation (they stop
/// at their next await; this only bounds a stuck one).
const WIND_DOWN: Duration = Duration::from_secs(5);

/// The store a term writes through: fenced by the term's epoch.
pub type FencedStore = Arc<dyn Fn(u64) -> Arc<dyn Store> + Send + Sync>;

/// Extra leader duties of a term (the cluster's wake-up listener and
/// replica expiry), started with the term's token and stopped with it.
pub type Duties = Arc<dyn Fn(&LeaderToken, &CancellationToken) -> TermDuties + Send + Sync>;

/// A term's started duties.
pub struct TermDuties {
    pub tasks: Vec<JoinHandle<()>>,
    /// Fires once the wake-up listener listens: the leader's first full
    /// read waits for it (see [`crate::cluster::wakeups`]).
    pub listening: oneshot::Receiver<()>,
}

/// What leader work is made of.
pub struct Parts {
    pub fenced: FencedStore,
    pub transport: Arc<Transport>,
    pub inbox: Arc<Inbox>,
    pub topology: TopologyConfig,
    pub reconciler: ReconcilerConfig,
    pub duties: Option<Duties>,
    pub metrics: Arc<Metrics>,
}

/// The reconcile queue of the current term, for status and tests.
#[derive(Default)]
pub struct QueueSlot(Mutex<Option<Arc<WorkQueue>>>);

impl QueueSlot {
    pub fn get(&self) -> Option<Arc<WorkQueue>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, queue: Option<Arc<WorkQueue>>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = queue;
    }
}

/// Runs leader work for every term this replica wins, until `cancel`.
pub async fn supervise(
    leadership: Arc<Leadership>,
    parts: Parts,
    slot: Arc<QueueSlot>,
    cancel: CancellationToken,
) {
    let mut roles = leadership.subscribe();
    loop {
        let role = *roles.borrow_and_update();
        let Role::Leader(epoch) = role else {
            tokio::select! {
                () = cancel.cancelled() => return,
                changed = roles.changed() => if changed.is_err() { return },
            }
            continue;
        };
        let Some(token) = leadership.token().filter(|t| t.epoch() == epoch) else {
            continue;
        };
        leadership.set_working(true);
        let term = cancel.child_token();
        let (queue, tasks) = start_term(&parts, &token, &term);
        slot.set(Some(queue.clone()));
        info!(epoch, "leader work started");
        tokio::select! {
            () = cancel.cancelled() => {}
            () = term_ends(&mut roles, epoch) => {}
        }
        term.cancel();
        queue.shutdown();
        stop(tasks).await;
        slot.set(None);
        leadership.set_working(false);
        info!(epoch, "leader work stopped for the term");
        if cancel.is_cancelled() {
            return;
        }
    }
}

async fn term_ends(roles: &mut tokio::sync::watch::Receiver<Role>, epoch: u64) {
    let _ = roles.wait_for(|r| *r != Role::Leader(epoch)).await;
}

fn start_term(
    parts: &Parts,
    token: &LeaderToken,
    term: &CancellationToken,
) -> (Arc<WorkQueue>, Vec<JoinHandle<()>>) {
    parts.inbox.clear();
    let store = (parts.fenced)(token.epoch());
    let queue = Arc::new(WorkQueue::new(QueueConfig::from(&parts.reconciler)));
    let link_writes = Arc::new(LinkWrites::default());
    let mut state = WorkingState::new(link_writes.clone());
    if store.reads_in_process() {
        state = state.without_view();
    }
    let reconciler = Arc::new(Reconciler {
        store: store.clone(),
        link_writes,
        view: state.view(),
        transport: parts.transport.clone(),
        token: token.clone(),
        orphan_detection: parts.reconciler.enable_orphan_detection,
        metrics: parts.metrics.clone(),
        stranded: Arc::default(),
        queue: queue.clone(),
    });
    let mut tasks = run_workers(
        queue.clone(),
        parts.reconciler.workers,
        term.clone(),
        move |node| {
            let r = reconciler.clone();
            async move { r.run(node).await }
        },
    );
    let (extra, listening) = match parts.duties.as_ref().map(|d| d(token, term)) {
        Some(d) => (d.tasks, Some(d.listening)),
        None => (Vec::new(), None),
    };
    let leader = Leader::new(
        store,
        state,
        parts.inbox.clone(),
        queue.clone(),
        parts.topology.clone(),
        parts.reconciler.reconcile_period,
        token.clone(),
    );
    tasks.push(tokio::spawn(leader.run(listening, term.clone())));
    tasks.extend(extra);
    (queue, tasks)
}

async fn stop(tasks: Vec<JoinHandle<()>>) {
    for t in tasks {
        let abort = t.abort_handle();
        if tokio::time::timeout(WIND_DOWN, t).await.is_err() {
            warn!("a leader task did not stop in time; aborted");
            abort.abort();
        }
    }
}
