//! Per-operation counters of the transaction helper: how often each store
//! operation ran, how long it took, how often it failed or was retried.
//! Plain atomics, read as a snapshot; exporting them is the caller's job.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Live counters, shared by every clone of a store.
#[derive(Default)]
pub(super) struct Metrics {
    ops: RwLock<BTreeMap<&'static str, Arc<Counters>>>,
}

#[derive(Default)]
struct Counters {
    calls: AtomicU64,
    errors: AtomicU64,
    unavailable: AtomicU64,
    fenced: AtomicU64,
    retries: AtomicU64,
    total_micros: AtomicU64,
    max_micros: AtomicU64,
}

/// How a finished call ended, as the counters see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    Ok,
    /// A refusal the contract describes (stale session, missing segment,
    /// fenced): the database worked.
    Refused,
    /// The database could not be used: `StoreError::Unavailable`.
    Unavailable,
    /// A leader's write refused because another leader took over.
    Fenced,
}

/// A copy of one operation's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpMetrics {
    /// Finished calls, whatever their outcome.
    pub calls: u64,
    /// Calls that returned an error (refusals and unavailability).
    pub errors: u64,
    /// Calls that returned `StoreError::Unavailable`.
    pub unavailable: u64,
    /// Leader writes refused by the fence (`StoreError::Fenced`).
    pub fenced: u64,
    /// Attempts rerun after a serialization failure or deadlock.
    pub retries: u64,
    /// Summed wall time of finished calls, retries and pauses included.
    pub total_latency: Duration,
    /// The slowest finished call.
    pub max_latency: Duration,
}

/// A copy of every operation's counters, keyed by operation name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PgMetrics {
    pub ops: BTreeMap<&'static str, OpMetrics>,
}

impl Metrics {
    fn counters(&self, op: &'static str) -> Arc<Counters> {
        // A poisoned lock only means a panic elsewhere while inserting: the
        // map itself is still whole.
        if let Some(c) = self.ops.read().unwrap_or_else(|p| p.into_inner()).get(op) {
            return c.clone();
        }
        let mut ops = self.ops.write().unwrap_or_else(|p| p.into_inner());
        ops.entry(op).or_default().clone()
    }

    pub(super) fn retried(&self, op: &'static str) {
        self.counters(op).retries.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn finished(&self, op: &'static str, took: Duration, outcome: Outcome) {
        let c = self.counters(op);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        c.calls.fetch_add(1, Ordering::Relaxed);
        c.total_micros.fetch_add(micros, Ordering::Relaxed);
        c.max_micros.fetch_max(micros, Ordering::Relaxed);
        if outcome != Outcome::Ok {
            c.errors.fetch_add(1, Ordering::Relaxed);
        }
        if outcome == Outcome::Unavailable {
            c.unavailable.fetch_add(1, Ordering::Relaxed);
        }
        if outcome == Outcome::Fenced {
            c.fenced.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(super) fn snapshot(&self) -> PgMetrics {
        let ops = self.ops.read().unwrap_or_else(|p| p.into_inner());
        let ops = ops.iter().map(|(name, c)| (*name, c.snapshot())).collect();
        PgMetrics { ops }
    }
}

impl Counters {
    fn snapshot(&self) -> OpMetrics {
        OpMetrics {
            calls: self.calls.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            unavailable: self.unavailable.load(Ordering::Relaxed),
            fenced: self.fenced.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            total_latency: Duration::from_micros(self.total_micros.load(Ordering::Relaxed)),
            max_latency: Duration::from_micros(self.max_micros.load(Ordering::Relaxed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_counted_per_operation() {
        let m = Metrics::default();
        m.finished("get_node", Duration::from_millis(2), Outcome::Ok);
        m.finished("get_node", Duration::from_millis(5), Outcome::Unavailable);
        m.retried("apply");
        m.finished("apply", Duration::from_millis(1), Outcome::Refused);
        m.finished("apply", Duration::from_millis(1), Outcome::Fenced);
        let snap = m.snapshot();
        let get = &snap.ops["get_node"];
        assert_eq!((get.calls, get.errors, get.unavailable), (2, 1, 1));
        assert_eq!(get.total_latency, Duration::from_millis(7));
        assert_eq!(get.max_latency, Duration::from_millis(5));
        let apply = &snap.ops["apply"];
        assert_eq!((apply.calls, apply.errors, apply.retries), (2, 2, 1));
        assert_eq!((apply.unavailable, apply.fenced), (0, 1));
    }
}
