//! The reconcilers' work queue: node ids waiting to be reconciled, shared by
//! N parallel workers (`get` → work → `done`). Its rules:
//!
//! 1. One entry per key: adding a key that is already waiting does nothing.
//! 2. A key never runs twice at once: added while it is processing, it runs
//!    once more after the current run is `done`.
//! 3. Fair: ready keys come out first-in first-out; a re-added key goes to
//!    the back. Urgent keys (`add_urgent`: the key's desired state changed)
//!    come out before routine ones (an arrival check, the periodic sweep),
//!    first-in first-out among themselves: a sweep of the whole fleet must
//!    not hold back the nodes a change is waiting for. A retry keeps the
//!    lane of the run that failed.
//! 4. Earliest deadline wins: `add_after` never postpones an earlier (or
//!    immediate) entry, and an earlier deadline replaces a later one.
//! 5. Failures back off per key (`requeue`, see [`super::backoff`]); after
//!    `max_requeues` failures a key is dropped until the periodic sweep adds
//!    it again. `forget` after a success resets the count.
//! 6. After `shutdown`, `get` returns `None` and adds are ignored: work
//!    must not start once its owner (the leader) is stopping.
//!
//! Waiting costs nothing: `get` sleeps on a [`Notify`] and at most one timer
//! (the earliest deadline); delays spawn no tasks.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::pin::pin;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::backoff::retry_delay;
use crate::config::ReconcilerConfig;

/// Longer delays are clamped: `Instant` arithmetic panics on overflow, and
/// nothing here needs to wait anywhere near this long.
const MAX_DELAY: Duration = Duration::from_secs(365 * 24 * 3600);

/// Retry tuning of one queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    /// Delay before the first retry; later ones double, capped at 30 s.
    pub base_retry_delay: Duration,
    /// Failures of one key tolerated before `requeue` drops it.
    pub max_requeues: u32,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self::from(&ReconcilerConfig::default())
    }
}

impl From<&ReconcilerConfig> for QueueConfig {
    fn from(c: &ReconcilerConfig) -> Self {
        Self {
            base_retry_delay: c.base_retry_delay,
            max_requeues: c.max_requeues,
        }
    }
}

/// What a handler asks for once it has finished with a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Converged: the key's failure count is forgotten.
    Done,
    /// Failed: retry after the key's backoff, or drop it after too many.
    Requeue,
    /// Look again after this long. Not a failure: the count is untouched.
    RequeueAfter(Duration),
}

/// Running totals for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueCounters {
    /// `add` and `add_after` calls made before shutdown.
    pub adds: u64,
    /// Adds and requeues merged into the key's existing entry.
    pub dedups: u64,
    /// Failed keys scheduled for a retry.
    pub requeues: u64,
    /// Failed keys given up after `max_requeues` failures.
    pub drops: u64,
}

/// Keys waiting for a deadline, one entry per key. Equal deadlines come out
/// in insertion order, hence the sequence number in the ordering key.
#[derive(Default)]
struct Delayed {
    by_key: HashMap<String, (Instant, u64)>,
    by_time: BTreeMap<(Instant, u64), String>,
    next_seq: u64,
}

impl Delayed {
    /// Schedules `key` at `at` unless its entry is already due no later.
    /// Returns whether the key had no entry before.
    fn schedule(&mut self, key: &str, at: Instant) -> bool {
        let old = self.by_key.get(key).copied();
        if old.is_some_and(|(due, _)| due <= at) {
            return false;
        }
        if let Some(slot) = old {
            self.by_time.remove(&slot);
        }
        self.next_seq += 1;
        let slot = (at, self.next_seq);
        self.by_key.insert(key.to_owned(), slot);
        self.by_time.insert(slot, key.to_owned());
        old.is_none()
    }

    fn remove(&mut self, key: &str) -> bool {
        let slot = self.by_key.remove(key);
        slot.is_some_and(|slot| self.by_time.remove(&slot).is_some())
    }

    fn pop_due(&mut self, now: Instant) -> Option<String> {
        let entry = self.by_time.first_entry().filter(|e| e.key().0 <= now)?;
        let key = entry.remove();
        self.by_key.remove(&key);
        Some(key)
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.by_time.keys().next().map(|&(at, _)| at)
    }
}

/// Whom to wake after a change.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wake {
    Nobody,
    /// A key became ready: one waiter can take it.
    One,
    /// The earliest deadline moved closer: every waiter must shorten its
    /// timer, since any of them may be the next to take a key.
    All,
}

enum Take {
    Key { key: String, more: bool },
    Wait(Option<Instant>),
    Closed,
}

/// Which of the two ready lanes a key waits in (rule 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    Urgent = 0,
    Routine = 1,
}

/// A key has at most one pending entry: in `queued` (ready), in `dirty`
/// (due, but waiting for its current run) or in `delayed`.
#[derive(Default)]
struct State {
    /// Keys due now, per lane, in the order they became due. An entry
    /// stands only while `queued` holds the key with the same lane and
    /// sequence number: a key moved to the urgent lane leaves a stale
    /// entry behind, skipped when it comes out.
    ready: [VecDeque<(u64, String)>; 2],
    /// The keys in `ready`, with their lane and entry.
    queued: HashMap<String, (Lane, u64)>,
    next_entry: u64,
    /// Keys whose next run is urgent, wherever they wait.
    urgent: HashSet<String>,
    /// Keys handed out by `get` and not yet `done`, with their lane.
    processing: HashMap<String, Lane>,
    /// Processing keys that became due again; `done` queues them.
    dirty: HashSet<String>,
    delayed: Delayed,
    failures: HashMap<String, u32>,
    counters: QueueCounters,
    shutdown: bool,
}

impl State {
    /// Gives `key` an entry due at `at`, or moves its entry earlier.
    fn schedule(&mut self, key: &str, at: Instant, now: Instant) -> Wake {
        self.promote(now);
        if self.queued.contains_key(key) || self.dirty.contains(key) {
            self.counters.dedups += 1; // already due: nothing is earlier
            self.upgrade(key);
            return Wake::Nobody;
        }
        if at <= now {
            if self.delayed.remove(key) {
                self.counters.dedups += 1;
            }
            return self.make_due(key.to_owned());
        }
        let earliest = self.delayed.next_deadline();
        if !self.delayed.schedule(key, at) {
            self.counters.dedups += 1;
        }
        if earliest.is_none_or(|e| at < e) {
            Wake::All
        } else {
            Wake::Nobody
        }
    }

    /// A key whose time has come. A running key is only marked dirty, so
    /// that it never runs twice at once; `done` queues it.
    fn make_due(&mut self, key: String) -> Wake {
        if self.processing.contains_key(&key) {
            self.dirty.insert(key);
            return Wake::Nobody;
        }
        if !self.queued.contains_key(&key) {
            let lane = self.lane_of(&key);
            self.enter(key, lane);
        }
        Wake::One
    }

    fn lane_of(&self, key: &str) -> Lane {
        match self.urgent.contains(key) {
            true => Lane::Urgent,
            false => Lane::Routine,
        }
    }

    fn enter(&mut self, key: String, lane: Lane) {
        self.next_entry += 1;
        self.queued.insert(key.clone(), (lane, self.next_entry));
        self.ready[lane as usize].push_back((self.next_entry, key));
    }

    /// A ready routine key that turned urgent moves to the urgent lane.
    fn upgrade(&mut self, key: &str) {
        let routine = self
            .queued
            .get(key)
            .is_some_and(|(l, _)| *l == Lane::Routine);
        if routine && self.urgent.contains(key) {
            self.enter(key.to_owned(), Lane::Urgent);
        }
    }

    /// The next ready key, urgent lane first; stale entries are dropped.
    fn pop_ready(&mut self) -> Option<(String, Lane)> {
        for lane in [Lane::Urgent, Lane::Routine] {
            while let Some((entry, key)) = self.ready[lane as usize].pop_front() {
                if self.queued.get(&key) == Some(&(lane, entry)) {
                    self.queued.remove(&key);
                    return Some((key, lane));
                }
            }
        }
        None
    }

    /// Moves keys whose deadline has passed to `ready`, earliest first.
    /// Done before every change, not only in `get`, so that the ready
    /// order is the order in which keys fell due (rule 3).
    fn promote(&mut self, now: Instant) {
        while let Some(key) = self.delayed.pop_due(now) {
            self.make_due(key);
        }
    }

    fn take(&mut self, now: Instant) -> Take {
        if self.shutdown {
            return Take::Closed;
        }
        self.promote(now);
        let Some((key, lane)) = self.pop_ready() else {
            return Take::Wait(self.delayed.next_deadline());
        };
        self.urgent.remove(&key);
        self.processing.insert(key.clone(), lane);
        let more = !self.queued.is_empty();
        Take::Key { key, more }
    }

    /// Counts a failure of `key`: the retry delay, or the failure count
    /// (and a reset) once it exceeds `max_requeues`.
    fn next_retry(&mut self, key: &str, config: &QueueConfig) -> Result<Duration, u32> {
        let failures = self.failures.entry(key.to_owned()).or_default();
        *failures = failures.saturating_add(1);
        let n = *failures;
        if n > config.max_requeues {
            self.failures.remove(key);
            // The mark belongs to a pending entry; a dropped retry has none.
            if !self.pending(key) {
                self.urgent.remove(key);
            }
            self.counters.drops += 1;
            return Err(n);
        }
        self.counters.requeues += 1;
        Ok(retry_delay(n, config.base_retry_delay))
    }

    fn pending(&self, key: &str) -> bool {
        self.queued.contains_key(key)
            || self.dirty.contains(key)
            || self.delayed.by_key.contains_key(key)
    }

    fn len(&self) -> usize {
        self.queued.len() + self.dirty.len() + self.delayed.by_key.len()
    }
}

/// A fair, deduplicating work queue of node ids; see the module docs.
pub struct WorkQueue {
    config: QueueConfig,
    state: Mutex<State>,
    /// Wakes `get` callers.
    wake: Notify,
    /// Wakes `shutdown_with_drain` when nothing is processing.
    idle: Notify,
}

impl WorkQueue {
    pub fn new(config: QueueConfig) -> Self {
        Self {
            config,
            state: Mutex::default(),
            wake: Notify::new(),
            idle: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update leaves the state consistent before anything can
        // panic, so a poisoned lock still guards valid data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn notify(&self, wake: Wake) {
        match wake {
            Wake::Nobody => {}
            Wake::One => self.wake.notify_one(),
            Wake::All => self.wake.notify_waiters(),
        }
    }

    /// Makes `key` due now (rules 1, 2 and 4). Ignored after shutdown.
    pub fn add(&self, key: &str) {
        self.add_with(key, Duration::ZERO, false);
    }

    /// Makes `key` due now in the urgent lane (rule 3), or moves it there.
    pub fn add_urgent(&self, key: &str) {
        self.add_with(key, Duration::ZERO, true);
    }

    /// Makes `key` due after `delay`, unless it is due earlier already.
    pub fn add_after(&self, key: &str, delay: Duration) {
        self.add_with(key, delay, false);
    }

    fn add_with(&self, key: &str, delay: Duration, urgent: bool) {
        let now = Instant::now();
        let wake = {
            let mut s = self.lock();
            if s.shutdown {
                return;
            }
            s.counters.adds += 1;
            if urgent {
                s.urgent.insert(key.to_owned());
            }
            s.schedule(key, now + delay.min(MAX_DELAY), now)
        };
        self.notify(wake);
    }

    /// Schedules a retry of a failed `key` after its backoff. Returns
    /// `false` if the key was dropped instead (too many failures, or the
    /// queue is shut down); the periodic sweep will add it again.
    pub fn requeue(&self, key: &str) -> bool {
        let now = Instant::now();
        let mut s = self.lock();
        if s.shutdown {
            return false;
        }
        match s.next_retry(key, &self.config) {
            Ok(delay) => {
                let wake = s.schedule(key, now + delay, now);
                drop(s);
                self.notify(wake);
                debug!(key, ?delay, "work queue: retrying after backoff");
                true
            }
            Err(failures) => {
                drop(s);
                warn!(key, failures, "work queue: dropped until the next sweep");
                false
            }
        }
    }

    /// Resets `key`'s failure count; call after a success.
    pub fn forget(&self, key: &str) {
        self.lock().failures.remove(key);
    }

    /// Consecutive failures of `key` since it was last forgotten or dropped.
    pub fn failures(&self, key: &str) -> u32 {
        self.lock().failures.get(key).copied().unwrap_or(0)
    }

    /// Waits for the next due key and marks it processing; `None` once the
    /// queue is shut down. Cancel-safe: a key is taken only in the poll
    /// that returns it, so dropping this future loses nothing.
    pub async fn get(&self) -> Option<String> {
        loop {
            let mut woken = pin!(self.wake.notified());
            // Registered before looking, so a change made right after the
            // look still wakes this caller.
            woken.as_mut().enable();
            let next = self.lock().take(Instant::now());
            match next {
                Take::Key { key, more } => {
                    if more {
                        self.wake.notify_one(); // pass the baton
                    }
                    return Some(key);
                }
                Take::Closed => return None,
                Take::Wait(None) => woken.await,
                Take::Wait(Some(at)) => tokio::select! {
                    () = woken => {}
                    () = tokio::time::sleep_until(at) => {}
                },
            }
        }
    }

    /// Ends the processing of `key`; if it was added meanwhile, it is queued
    /// again (at the back). Does nothing for a key that is not processing.
    pub fn done(&self, key: &str) {
        let (wake, idle) = {
            let mut s = self.lock();
            if !s.processing.contains_key(key) {
                return;
            }
            // Promoted while still processing, the key turns dirty and so
            // queues behind keys that fell due during its run.
            s.promote(Instant::now());
            s.processing.remove(key);
            let rerun = s.dirty.remove(key) && !s.shutdown;
            let wake = if rerun {
                s.make_due(key.to_owned())
            } else {
                Wake::Nobody
            };
            (wake, s.processing.is_empty())
        };
        self.notify(wake);
        if idle {
            self.idle.notify_waiters();
        }
    }

    /// Applies a handler's `outcome` to `key`, then `done`.
    pub fn finish(&self, key: &str, outcome: Outcome) {
        self.settle(key, outcome);
        self.done(key);
    }

    pub(super) fn settle(&self, key: &str, outcome: Outcome) {
        if outcome != Outcome::Done {
            let mut s = self.lock();
            if s.processing.get(key) == Some(&Lane::Urgent) {
                s.urgent.insert(key.to_owned());
            }
        }
        match outcome {
            Outcome::Done => self.forget(key),
            Outcome::Requeue => {
                self.requeue(key);
            }
            Outcome::RequeueAfter(delay) => self.add_after(key, delay),
        }
    }

    /// Stops the queue: `get` returns `None` from now on, even with keys
    /// waiting (the next leader's sweep re-adds them), and adds are ignored.
    /// Keys in flight may still be `done`.
    pub fn shutdown(&self) {
        self.lock().shutdown = true;
        self.wake.notify_waiters();
    }

    /// Shuts down, then waits up to `timeout` for the keys in flight to be
    /// `done`. Returns whether they all were.
    pub async fn shutdown_with_drain(&self, timeout: Duration) -> bool {
        self.shutdown();
        tokio::time::timeout(timeout, self.drained()).await.is_ok()
    }

    async fn drained(&self) {
        loop {
            let mut idle = pin!(self.idle.notified());
            idle.as_mut().enable();
            if self.lock().processing.is_empty() {
                return;
            }
            idle.await;
        }
    }

    pub fn is_shutdown(&self) -> bool {
        self.lock().shutdown
    }

    /// Keys waiting to run: ready, due after their current run, or delayed.
    /// Each key counts once.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether an urgent key is ready or running (a delayed retry is not).
    pub fn urgent_busy(&self) -> bool {
        let s = self.lock();
        s.queued.values().any(|(lane, _)| *lane == Lane::Urgent)
            || s.processing.values().any(|lane| *lane == Lane::Urgent)
    }

    /// Keys handed out and not yet `done`.
    pub fn in_flight(&self) -> usize {
        self.lock().processing.len()
    }

    pub fn counters(&self) -> QueueCounters {
        self.lock().counters
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "queue_props.rs"]
mod props;
