//! The per-session fact writer: facts a node sends are recorded in order,
//! off the stream's read loop, and retried while the store is unreachable.
//!
//! A node never resends a fact, so a fact must not be dropped: while the
//! store is down the writer keeps it (and those after it) and retries; the
//! stream stays open, so a database restart loses no node. The queue is
//! bounded by count and by bytes (see [`super::outbox`]): a node that sends
//! more than it can hold has its stream closed, and replays everything
//! when it registers again. A fact refused because the session was
//! replaced ends the writer and the stream; a fact the store rejects as
//! such (retrying would not help) is dropped and counted.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tracing::{debug, info, warn};
use uuid::Uuid;

use super::Ctx;
use super::outbox::SessionBytes;
use crate::store::StoreError;
use crate::store::model::{DepartureKind, Name, Registration};
use crate::transport::NodeStream;

/// Facts queued per session before the stream is closed.
pub const OUTBOX_CAPACITY: usize = 1024;

/// Longest pause between two attempts while the store is unreachable.
const MAX_PAUSE: Duration = Duration::from_secs(2);

/// One fact from a node's session.
#[derive(Debug, Clone, PartialEq)]
pub enum Fact {
    /// The registration, answered before the store could record it.
    Begun(Box<Registration>),
    /// The registration reply is on the wire: the session is ready.
    Ready,
    Announced {
        set: Vec<Name>,
        withdrawn: Vec<Name>,
    },
    Received(Vec<String>),
    /// The session ended; the last fact of a session.
    Ended(DepartureKind),
}

impl Fact {
    /// Its name, as metrics label it.
    pub fn kind(&self) -> &'static str {
        match self {
            Fact::Begun(_) => "registration",
            Fact::Ready => "ready",
            Fact::Announced { .. } => "announcement",
            Fact::Received(_) => "claim",
            Fact::Ended(_) => "end",
        }
    }
}

/// Why a fact was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The outbox is full: close the stream so the node replays.
    Full,
    /// The writer stopped (session replaced or ended).
    Stopped,
}

/// The sending half, held by the stream's read loop. Facts wait in the
/// session's outbox, and a task records them while there are some: an idle
/// session holds no task and no buffer, only its outbox's bookkeeping (a
/// task and a channel per session were 1.4 KB a node, idle or not).
pub struct FactWriter(Arc<Outbox>);

struct Outbox {
    ctx: Arc<Ctx>,
    stream: Arc<NodeStream>,
    bytes: SessionBytes,
    queue: std::sync::Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    /// Facts not recorded yet, and the outbox bytes each holds.
    facts: VecDeque<(Fact, usize)>,
    /// A task is recording them.
    draining: bool,
    /// Nothing more is taken: the session's end was recorded, or a fact
    /// refused for good.
    stopped: bool,
}

impl FactWriter {
    /// The writer of `stream`'s session.
    pub fn new(ctx: Arc<Ctx>, stream: Arc<NodeStream>) -> FactWriter {
        let bytes = SessionBytes::new(ctx.metrics.outbox_bytes.clone());
        FactWriter(Arc::new(Outbox {
            ctx,
            stream,
            bytes,
            queue: Default::default(),
        }))
    }

    /// Queues `fact`. The session's end is always taken (while the writer
    /// runs): it must be recorded even behind a full outbox.
    pub fn push(&self, fact: Fact) -> Result<(), Refused> {
        let outbox = &self.0;
        let (n, last) = (fact.bytes(), matches!(fact, Fact::Ended(_)));
        let mut q = outbox.lock();
        if q.stopped {
            return Err(Refused::Stopped);
        }
        if q.facts.len() >= OUTBOX_CAPACITY && !last || !outbox.bytes.take(n, last) {
            return Err(Refused::Full);
        }
        q.facts.push_back((fact, n));
        outbox.ctx.metrics.outbox.inc();
        if !q.draining {
            q.draining = true;
            let ctx = &outbox.ctx;
            ctx.writers.spawn(drain(outbox.clone()));
        }
        Ok(())
    }
}

impl Outbox {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next fact; `None` (and the drain ends) when there is none.
    /// Claims queued one after another are taken as one: a gateway's peers
    /// dial it in a burst, and recorded one by one, each waiting for the
    /// store, its claims would reach the leader over seconds.
    fn next(&self) -> Option<(Fact, usize)> {
        let mut q = self.lock();
        let mut next = q.facts.pop_front();
        let mut taken = usize::from(next.is_some());
        if let Some((Fact::Received(links), bytes)) = &mut next {
            while let Some((Fact::Received(more), n)) = q.facts.front_mut() {
                links.append(more);
                *bytes += *n;
                q.facts.pop_front();
                taken += 1;
            }
        }
        if q.facts.is_empty() {
            // Its buffer goes with the burst that filled it.
            q.facts = VecDeque::new();
        }
        q.draining = next.is_some();
        self.ctx.metrics.outbox.dec_by(taken as i64);
        next
    }

    /// Takes nothing more, and forgets what is queued, keeping the outbox
    /// gauges true.
    fn stop(&self) {
        let mut q = self.lock();
        q.stopped = true;
        q.draining = false;
        for (_, n) in std::mem::take(&mut q.facts) {
            self.ctx.metrics.outbox.dec();
            self.bytes.give(n);
        }
    }
}

/// Records the queued facts in order until none is left; stops the writer
/// after the session's end or a refusal.
async fn drain(outbox: Arc<Outbox>) {
    let (ctx, stream) = (&outbox.ctx, &outbox.stream);
    while let Some((fact, n)) = outbox.next() {
        let last = matches!(fact, Fact::Ended(_));
        // Boxed: most of a drain's life is this wait.
        let outcome = Box::pin(record(ctx, stream, &fact)).await;
        // Held until recorded: the bound is on what the store has not taken.
        outbox.bytes.give(n);
        match outcome {
            Ok(()) => {
                let kind = [("kind", fact.kind())];
                ctx.metrics.facts.get_or_create(&kind).inc();
                ctx.signals.node_changed(stream.node());
            }
            Err(None) => {
                // Answered before it was recorded, closed before the store
                // came back: the session never existed for the store, so
                // nothing of it is recorded (its node registers again).
                debug!(
                    node = stream.node(),
                    "unrecorded session closed; its facts dropped"
                );
                return outbox.stop();
            }
            Err(Some(StoreError::Rejected(why))) if !matches!(fact, Fact::Begun(_)) => {
                // Validated at the door, so this is rare; a retry would be
                // refused the same way, and the facts after it still count.
                warn!(node = stream.node(), kind = fact.kind(), %why, "fact rejected by the store; dropped");
                let reason = [("reason", "store_rejected")];
                ctx.metrics.dropped.get_or_create(&reason).inc();
            }
            Err(Some(e)) => {
                // A replaced session stops the writer: its facts are no
                // longer the node's. So does a registration the store
                // rejects: nothing after it can be recorded. The stream
                // goes with it.
                info!(node = stream.node(), error = %e, "fact refused; closing the stream");
                stream.close();
                return outbox.stop();
            }
        }
        if last {
            return outbox.stop();
        }
    }
}

/// Records one fact, retrying for as long as the store is unreachable.
/// `Err(None)`: an unrecorded session's stream closed meanwhile.
async fn record(ctx: &Ctx, stream: &NodeStream, fact: &Fact) -> Result<(), Option<StoreError>> {
    let mut pause = Duration::from_millis(50);
    loop {
        if matches!(fact, Fact::Begun(_)) && stream.is_closed() {
            return Err(None);
        }
        match record_once(ctx, stream.node(), stream.session(), fact).await {
            Err(StoreError::Unavailable(why)) => {
                debug!(node = stream.node(), %why, ?pause, "store unavailable; fact kept");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_PAUSE);
            }
            other => return other.map_err(Some),
        }
    }
}

async fn record_once(ctx: &Ctx, node: &str, session: Uuid, fact: &Fact) -> Result<(), StoreError> {
    let store = &ctx.store;
    match fact {
        Fact::Begun(registration) => {
            let owner = ctx.identity.current();
            // A compare-and-set (see `Registration::stale_after`): a newer
            // registration of the node refuses it, and the stream closes.
            let started = store.begin_session((**registration).clone(), owner).await?;
            let generation = started.session.generation;
            ctx.seen_generation.fetch_max(generation, Ordering::Relaxed);
            if let Some(old) = &started.replaced {
                ctx.signals.session_replaced(node, old);
            }
            Ok(())
        }
        Fact::Ready => {
            if !store.mark_ready(node, session).await? {
                return Err(StoreError::StaleSession {
                    node: node.to_string(),
                    session,
                });
            }
            Ok(())
        }
        Fact::Announced { set, withdrawn } => {
            store
                .record_announcements(node, session, set, withdrawn)
                .await
        }
        Fact::Received(links) => store.record_received(node, session, links).await,
        Fact::Ended(kind) => {
            if !store.end_session(node, session, *kind).await? {
                debug!(node, "session already replaced; nothing to end");
            }
            Ok(())
        }
    }
}

/// Logs a refused push; the caller decides what to do with the stream.
pub fn log_refusal(node: &str, why: Refused) {
    match why {
        Refused::Full => warn!(
            node,
            "fact outbox full; closing the stream so the node replays"
        ),
        Refused::Stopped => debug!(node, "fact writer stopped"),
    }
}
