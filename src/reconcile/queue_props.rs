//! Property tests: random operations on the queue, checked step by step
//! against a plain model of its rules.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::{Instant, advance};

use super::tests::{MS, mk_queue, mk_queue_max, poll_get};
use super::{QueueConfig, WorkQueue};
use crate::reconcile::backoff::retry_delay;

const KEYS: [&str; 4] = ["n0", "n1", "n2", "n3"];
const MAX_REQUEUES: u32 = 3;

#[derive(Debug, Clone)]
enum Op {
    Add(usize),
    AddUrgent(usize),
    AddAfter(usize, u32),
    Get,
    Done(usize),
    Requeue(usize),
    Advance(u32),
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS.len();
    prop_oneof![
        2 => key.clone().prop_map(Op::Add),
        1 => key.clone().prop_map(Op::AddUrgent),
        2 => (key.clone(), 0..500u32).prop_map(|(k, ms)| Op::AddAfter(k, ms)),
        3 => Just(Op::Get),
        2 => key.clone().prop_map(Op::Done),
        1 => key.prop_map(Op::Requeue),
        2 => (0..700u32).prop_map(Op::Advance),
    ]
}

/// The rules stated plainly: a pending key has one due time, the earliest
/// asked for; a due key that is not running may be handed out, earliest
/// due first, but urgent keys before the others, each from the later of
/// its due time and when it was made urgent; a key that fell due while
/// running is due again from `done`.
#[derive(Default)]
struct Model {
    due: HashMap<String, Instant>,
    /// Keys whose next run is urgent, and since when.
    urgent: HashMap<String, Instant>,
    processing: HashSet<String>,
    failures: HashMap<String, u32>,
}

impl Model {
    fn schedule(&mut self, key: &str, at: Instant) {
        let due = self.due.entry(key.to_owned()).or_insert(at);
        *due = (*due).min(at);
    }

    fn requeue(&mut self, key: &str, now: Instant) -> bool {
        let failures = self.failures.entry(key.to_owned()).or_default();
        *failures += 1;
        let n = *failures;
        if n > MAX_REQUEUES {
            self.failures.remove(key);
            if !self.due.contains_key(key) {
                self.urgent.remove(key);
            }
            return false;
        }
        self.schedule(
            key,
            now + retry_delay(n, QueueConfig::default().base_retry_delay),
        );
        true
    }

    fn done(&mut self, key: &str, now: Instant) {
        if !self.processing.remove(key) {
            return;
        }
        if let Some(due) = self.due.get_mut(key).filter(|due| **due <= now) {
            *due = now;
        }
    }

    /// When `key`, due at `due`, entered the urgent lane, if it is urgent.
    fn urgent_rank(&self, key: &str, due: Instant) -> Option<Instant> {
        self.urgent.get(key).map(|since| (*since).max(due))
    }

    fn check_get(&mut self, got: Option<String>, now: Instant) -> Result<(), TestCaseError> {
        let ready: Vec<(&String, Instant)> = (self.due.iter())
            .filter(|(key, due)| **due <= now && !self.processing.contains(*key))
            .map(|(key, due)| (key, *due))
            .collect();
        let first_urgent = (ready.iter())
            .filter_map(|(key, due)| self.urgent_rank(key, *due))
            .min();
        let first = ready.iter().map(|(_, due)| *due).min();
        let Some(key) = got else {
            prop_assert!(first.is_none(), "a due key was not handed out");
            return Ok(());
        };
        prop_assert!(
            !self.processing.contains(&key),
            "{} handed out twice at once",
            key
        );
        let due = self.due.remove(&key);
        prop_assert!(
            due.is_some_and(|d| d <= now),
            "{} handed out early or never added",
            key
        );
        match first_urgent {
            Some(rank) => {
                let mine = due.and_then(|d| self.urgent_rank(&key, d));
                prop_assert_eq!(mine, Some(rank), "{} overtook an urgent key", key);
            }
            None => prop_assert_eq!(due, first, "{} overtook a key that fell due earlier", key),
        }
        self.urgent.remove(&key);
        self.processing.insert(key);
        Ok(())
    }
}

async fn apply(q: &WorkQueue, m: &mut Model, op: Op) -> Result<(), TestCaseError> {
    let now = Instant::now();
    match op {
        Op::Add(k) => {
            q.add(KEYS[k]);
            m.schedule(KEYS[k], now);
        }
        Op::AddUrgent(k) => {
            q.add_urgent(KEYS[k]);
            m.schedule(KEYS[k], now);
            m.urgent.entry(KEYS[k].to_owned()).or_insert(now);
        }
        Op::AddAfter(k, ms) => {
            q.add_after(KEYS[k], ms * MS);
            m.schedule(KEYS[k], now + ms * MS);
        }
        Op::Get => m.check_get(poll_get(q).await, now)?,
        Op::Done(k) => {
            q.done(KEYS[k]);
            m.done(KEYS[k], now);
        }
        Op::Requeue(k) => prop_assert_eq!(q.requeue(KEYS[k]), m.requeue(KEYS[k], now)),
        Op::Advance(ms) => advance(ms * MS).await,
    }
    Ok(())
}

/// Runs `ops`, checking after each step, then finishes everything running
/// and lets every deadline pass: each pending key must come out once.
async fn run_against_model(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let q = mk_queue_max(MAX_REQUEUES);
    let mut m = Model::default();
    for op in ops {
        apply(&q, &mut m, op).await?;
        prop_assert_eq!(q.len(), m.due.len(), "len counts each pending key once");
        prop_assert_eq!(q.in_flight(), m.processing.len());
    }
    for key in KEYS {
        q.done(key);
        m.done(key, Instant::now());
    }
    advance(Duration::from_secs(60)).await;
    loop {
        let got = poll_get(&q).await;
        let drained = got.is_none();
        m.check_get(got, Instant::now())?;
        if drained {
            break;
        }
    }
    prop_assert!(q.is_empty() && m.due.is_empty(), "no key lost or left over");
    Ok(())
}

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("test runtime")
}

/// The instant `key` is handed out, stepping 1 ms at a time.
async fn handed_out_after(q: &WorkQueue, key: &str) -> Duration {
    let start = Instant::now();
    while poll_get(q).await.as_deref() != Some(key) {
        advance(MS).await;
    }
    start.elapsed()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn queue_behaves_like_its_model(ops in prop::collection::vec(op(), 1..80)) {
        paused_runtime().block_on(run_against_model(ops))?;
    }

    #[test]
    fn earliest_of_many_deadlines_wins_and_runs_once(
        delays in prop::collection::vec(0..300u32, 1..8),
    ) {
        let earliest = delays.iter().copied().min().map(|ms| ms * MS);
        let (at, len) = paused_runtime().block_on(async {
            let q = mk_queue();
            for ms in &delays {
                q.add_after("a", *ms * MS);
            }
            let len = q.len();
            let at = handed_out_after(&q, "a").await;
            q.done("a");
            advance(Duration::from_secs(1)).await;
            assert_eq!(poll_get(&q).await, None, "one entry, so one run");
            (at, len)
        });
        prop_assert_eq!(len, 1);
        prop_assert_eq!(Some(at), earliest);
    }
}
