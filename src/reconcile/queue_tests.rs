//! The queue's rules, one test each, on paused time; then the worker pool.
//! Property tests against a model are in `queue_props.rs`.

use std::collections::{HashMap, HashSet};
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use tokio::time::{Instant, advance};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::reconcile::workers::{Run, run_workers};
use tokio::task::JoinHandle;

pub(super) const MS: Duration = Duration::from_millis(1);

pub(super) fn mk_queue() -> WorkQueue {
    WorkQueue::new(QueueConfig::default())
}

pub(super) fn mk_queue_max(max_requeues: u32) -> WorkQueue {
    WorkQueue::new(QueueConfig {
        max_requeues,
        ..QueueConfig::default()
    })
}

/// Polls `get` once: the key due right now, if any, without waiting.
pub(super) async fn poll_get(q: &WorkQueue) -> Option<String> {
    let mut get = pin!(q.get());
    poll_fn(|cx| match get.as_mut().poll(cx) {
        Poll::Ready(key) => Poll::Ready(key),
        Poll::Pending => Poll::Ready(None),
    })
    .await
}

async fn get_all_due(q: &WorkQueue) -> Vec<String> {
    let mut keys = Vec::new();
    while let Some(key) = poll_get(q).await {
        keys.push(key);
    }
    keys
}

#[tokio::test(start_paused = true)]
async fn queue_keeps_one_entry_per_key() {
    let q = mk_queue();
    for key in ["a", "a", "b", "a"] {
        q.add(key);
    }
    assert_eq!(q.len(), 2);
    assert_eq!(get_all_due(&q).await, ["a", "b"]);
}

#[tokio::test(start_paused = true)]
async fn queue_never_runs_one_key_twice_at_once() {
    let q = mk_queue();
    q.add("a");
    assert_eq!(poll_get(&q).await.as_deref(), Some("a"));
    q.add("a");
    assert_eq!(poll_get(&q).await, None, "a is still processing");
    q.done("a");
    assert_eq!(poll_get(&q).await.as_deref(), Some("a"));
}

#[tokio::test(start_paused = true)]
async fn queue_reruns_a_key_added_while_processing_exactly_once() {
    let q = mk_queue();
    q.add("a");
    poll_get(&q).await;
    for _ in 0..3 {
        q.add("a");
    }
    assert_eq!(q.len(), 1);
    q.done("a");
    assert_eq!(get_all_due(&q).await, ["a"]);
    q.done("a");
    assert!(q.is_empty());
}

#[tokio::test(start_paused = true)]
async fn queue_is_fifo_and_a_rerun_goes_to_the_back() {
    let q = mk_queue();
    for key in ["a", "b", "c"] {
        q.add(key);
    }
    assert_eq!(poll_get(&q).await.as_deref(), Some("a"));
    q.add("a");
    q.done("a");
    assert_eq!(get_all_due(&q).await, ["b", "c", "a"]);
}

#[tokio::test(start_paused = true)]
async fn delayed_key_is_due_exactly_at_its_deadline() {
    let q = mk_queue();
    q.add_after("a", 500 * MS);
    assert_eq!(q.len(), 1);
    advance(499 * MS).await;
    assert_eq!(poll_get(&q).await, None);
    advance(MS).await;
    assert_eq!(poll_get(&q).await.as_deref(), Some("a"));
}

#[tokio::test(start_paused = true)]
async fn get_sleeps_until_the_earliest_deadline() {
    let q = mk_queue();
    let start = Instant::now();
    q.add_after("late", Duration::from_secs(5));
    q.add_after("early", Duration::from_secs(2));
    assert_eq!(q.get().await.as_deref(), Some("early"));
    assert_eq!(start.elapsed(), Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn get_wakes_for_a_nearer_deadline_added_while_it_waits() {
    let q = Arc::new(mk_queue());
    let start = Instant::now();
    q.add_after("far", Duration::from_secs(10));
    let getter = tokio::spawn({
        let q = q.clone();
        async move { q.get().await }
    });
    tokio::time::sleep(MS).await;
    q.add_after("near", Duration::from_secs(1));
    assert_eq!(getter.await.ok().flatten().as_deref(), Some("near"));
    assert_eq!(start.elapsed(), Duration::from_secs(1) + MS);
}

#[tokio::test(start_paused = true)]
async fn earlier_deadline_replaces_a_later_one() {
    let q = mk_queue();
    q.add_after("a", Duration::from_secs(5));
    q.add_after("a", Duration::from_secs(1));
    advance(Duration::from_secs(1)).await;
    assert_eq!(poll_get(&q).await.as_deref(), Some("a"));
    q.done("a");
    advance(Duration::from_secs(10)).await;
    assert_eq!(poll_get(&q).await, None, "one entry, so one run");
}

#[tokio::test(start_paused = true)]
async fn later_deadline_never_postpones_an_earlier_one() {
    let q = mk_queue();
    q.add_after("a", Duration::from_secs(1));
    q.add_after("a", Duration::from_secs(5));
    advance(Duration::from_secs(1)).await;
    assert_eq!(poll_get(&q).await.as_deref(), Some("a"));
}

#[tokio::test(start_paused = true)]
async fn immediate_add_beats_a_pending_deadline() {
    let q = mk_queue();
    q.add_after("a", Duration::from_secs(5));
    q.add("a");
    assert_eq!(poll_get(&q).await.as_deref(), Some("a"));
    q.done("a");
    advance(Duration::from_secs(10)).await;
    assert_eq!(poll_get(&q).await, None);
}

#[tokio::test(start_paused = true)]
async fn key_falling_due_while_processing_runs_after_done() {
    let q = mk_queue();
    q.add("a");
    poll_get(&q).await;
    q.add_after("a", Duration::from_secs(1));
    advance(Duration::from_secs(2)).await;
    assert_eq!(poll_get(&q).await, None);
    q.done("a");
    assert_eq!(poll_get(&q).await.as_deref(), Some("a"));
}

#[tokio::test(start_paused = true)]
async fn requeue_backs_off_exponentially_per_key() {
    let q = mk_queue();
    let expected_ms = [200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000];
    for ms in expected_ms {
        assert!(q.requeue("a"));
        advance((ms - 1) * MS).await;
        assert_eq!(poll_get(&q).await, None, "too early for the {ms} ms retry");
        advance(MS).await;
        assert_eq!(poll_get(&q).await.as_deref(), Some("a"));
        q.done("a");
    }
    assert_eq!(q.failures("a"), 9);
    assert_eq!(q.failures("b"), 0, "counts are per key");
}

#[tokio::test(start_paused = true)]
async fn forget_resets_the_backoff() {
    let q = mk_queue();
    q.requeue("a");
    q.requeue("a");
    q.forget("a");
    assert_eq!(q.failures("a"), 0);
    advance(Duration::from_secs(1)).await;
    get_all_due(&q).await;
    q.done("a");
    q.requeue("a");
    advance(200 * MS).await;
    assert_eq!(poll_get(&q).await.as_deref(), Some("a"));
}

#[tokio::test(start_paused = true)]
async fn requeue_drops_a_key_after_max_requeues_and_resets_its_count() {
    let q = mk_queue_max(3);
    for _ in 0..3 {
        assert!(q.requeue("a"));
    }
    assert!(!q.requeue("a"));
    assert_eq!(q.failures("a"), 0);
    assert!(q.requeue("a"), "a new round of retries after the drop");
    assert_eq!(q.counters().drops, 1);
}

#[tokio::test(start_paused = true)]
async fn requeue_after_is_not_a_failure_and_done_forgets() {
    let q = mk_queue();
    q.add("a");
    poll_get(&q).await;
    q.finish("a", Outcome::Requeue);
    assert_eq!(q.failures("a"), 1);
    advance(200 * MS).await;
    poll_get(&q).await;
    q.finish("a", Outcome::RequeueAfter(Duration::from_secs(1)));
    assert_eq!(q.failures("a"), 1);
    advance(Duration::from_secs(1)).await;
    assert_eq!(poll_get(&q).await.as_deref(), Some("a"));
    q.finish("a", Outcome::Done);
    assert_eq!((q.failures("a"), q.len(), q.in_flight()), (0, 0, 0));
}

#[tokio::test(start_paused = true)]
async fn shutdown_makes_get_return_none_and_ignores_adds() {
    let q = mk_queue();
    q.add("a");
    q.shutdown();
    assert!(q.is_shutdown());
    assert_eq!(q.get().await, None, "nothing new starts after shutdown");
    q.add("b");
    q.add_after("c", MS);
    assert!(!q.requeue("d"));
    assert_eq!(q.len(), 1);
    assert_eq!(q.counters().adds, 1);
}

#[tokio::test(start_paused = true)]
async fn shutdown_wakes_every_waiting_get() {
    let q = Arc::new(mk_queue());
    let start = Instant::now();
    q.add_after("a", Duration::from_secs(60));
    let getters: Vec<_> = (0..3)
        .map(|_| {
            tokio::spawn({
                let q = q.clone();
                async move { q.get().await }
            })
        })
        .collect();
    tokio::time::sleep(MS).await;
    q.shutdown();
    for getter in getters {
        assert_eq!(getter.await.ok().flatten(), None);
    }
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "woken, not timed out"
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_with_drain_waits_for_keys_in_flight() {
    let q = Arc::new(mk_queue());
    q.add("a");
    poll_get(&q).await;
    let start = Instant::now();
    tokio::spawn({
        let q = q.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            q.done("a");
        }
    });
    assert!(q.shutdown_with_drain(Duration::from_secs(10)).await);
    assert_eq!(start.elapsed(), Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn shutdown_with_drain_gives_up_after_its_timeout() {
    let q = mk_queue();
    q.add("a");
    poll_get(&q).await;
    assert!(!q.shutdown_with_drain(Duration::from_secs(2)).await);
    assert_eq!(q.in_flight(), 1);
}

#[tokio::test(start_paused = true)]
async fn len_counts_ready_rerun_and_delayed_keys_once_each() {
    let q = mk_queue();
    q.add("running");
    poll_get(&q).await;
    q.add("running");
    q.add("ready");
    q.add_after("later", Duration::from_secs(1));
    q.add_after("ready", Duration::from_secs(1));
    q.add_after("running", Duration::from_secs(1));
    q.add_after("later", Duration::from_secs(2));
    assert_eq!(q.len(), 3);
}

#[tokio::test(start_paused = true)]
async fn counters_track_adds_dedups_requeues_and_drops() {
    let q = mk_queue_max(1);
    q.add("a");
    q.add("a");
    q.add_after("b", MS);
    q.requeue("b");
    q.requeue("b");
    let expected = QueueCounters {
        adds: 3,
        dedups: 2,
        requeues: 1,
        drops: 1,
    };
    assert_eq!(q.counters(), expected);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_get_loses_no_key() {
    let q = Arc::new(mk_queue());
    let waiting = tokio::spawn({
        let q = q.clone();
        async move { q.get().await }
    });
    tokio::time::sleep(MS).await;
    waiting.abort();
    q.add("a");
    let got = tokio::time::timeout(Duration::from_secs(1), q.get()).await;
    assert_eq!(got.ok().flatten().as_deref(), Some("a"));
}

// --- The worker pool --------------------------------------------------------

/// Waits (in real time) until `done` holds; fails the test after 10 s.
async fn wait_until(mut done: impl FnMut() -> bool) {
    let poll = async {
        while !done() {
            tokio::time::sleep(MS).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), poll)
        .await
        .expect("condition not reached in time");
}

async fn join_all(workers: Vec<JoinHandle<()>>) {
    for worker in workers {
        let _ = worker.await;
    }
}

/// Counts handler runs per key and the most handlers ever running at once.
#[derive(Default)]
struct Tally {
    runs: Mutex<HashMap<String, usize>>,
    running: Mutex<HashSet<String>>,
    peak: AtomicUsize,
    overlaps: AtomicUsize,
}

impl Tally {
    fn enter(&self, key: &str) {
        let mut running = self.running.lock().expect("tally");
        if !running.insert(key.to_owned()) {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        self.peak.fetch_max(running.len(), Ordering::SeqCst);
    }

    /// Ends a run of `key`; returns how many runs it has had.
    fn leave(&self, key: &str) -> usize {
        self.running.lock().expect("tally").remove(key);
        let mut runs = self.runs.lock().expect("tally");
        let n = runs.entry(key.to_owned()).or_default();
        *n += 1;
        *n
    }

    fn total(&self) -> usize {
        self.runs.lock().expect("tally").values().sum()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_run_1000_keys_each_once_with_at_most_n_at_a_time() {
    const N: usize = 4;
    let q = Arc::new(mk_queue());
    let tally = Arc::new(Tally::default());
    for i in 0..1000 {
        q.add(&format!("node-{i}"));
    }
    let handler = {
        let tally = tally.clone();
        move |key: String| {
            let tally = tally.clone();
            async move {
                tally.enter(&key);
                tokio::task::yield_now().await;
                tally.leave(&key);
                Outcome::Done
            }
        }
    };
    let cancel = CancellationToken::new();
    let workers = run_workers(q.clone(), N, cancel.clone(), handler);
    wait_until(|| tally.total() == 1000 && q.in_flight() == 0).await;
    cancel.cancel();
    join_all(workers).await;
    let runs = tally.runs.lock().expect("tally");
    assert_eq!(runs.len(), 1000);
    assert!(runs.values().all(|&n| n == 1), "a key ran more than once");
    assert!(tally.peak.load(Ordering::SeqCst) <= N);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_never_run_one_key_twice_at_once() {
    // Each run re-adds its own key until the fifth: always while running,
    // so each key must run exactly five times, never overlapping itself.
    let q = Arc::new(mk_queue());
    let tally = Arc::new(Tally::default());
    let handler = {
        let (q, tally) = (q.clone(), tally.clone());
        move |key: String| {
            let (q, tally) = (q.clone(), tally.clone());
            async move {
                tally.enter(&key);
                let runs_so_far = tally.runs.lock().expect("tally").get(&key).copied();
                if runs_so_far.unwrap_or(0) < 4 {
                    q.add(&key);
                }
                tokio::task::yield_now().await;
                tally.leave(&key);
                Outcome::Done
            }
        }
    };
    for i in 0..10 {
        q.add(&format!("node-{i}"));
    }
    let cancel = CancellationToken::new();
    let workers = run_workers(q.clone(), 8, cancel.clone(), handler);
    wait_until(|| tally.total() == 50 && q.in_flight() == 0).await;
    q.shutdown();
    join_all(workers).await;
    assert_eq!(tally.overlaps.load(Ordering::SeqCst), 0);
    assert!(tally.runs.lock().expect("tally").values().all(|&n| n == 5));
}

#[tokio::test(start_paused = true)]
async fn cancel_stops_workers_and_releases_their_keys() {
    let q = Arc::new(mk_queue());
    q.add("stuck");
    let cancel = CancellationToken::new();
    let handler = |_key: String| std::future::pending::<Outcome>();
    let workers = run_workers(q.clone(), 2, cancel.clone(), handler);
    tokio::time::sleep(MS).await;
    assert_eq!(q.in_flight(), 1);
    cancel.cancel();
    join_all(workers).await;
    assert_eq!(q.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_idle_workers() {
    let q = Arc::new(mk_queue());
    let workers = run_workers(
        q.clone(),
        3,
        CancellationToken::new(),
        |_key: String| async { Outcome::Done },
    );
    tokio::time::sleep(MS).await;
    q.shutdown();
    join_all(workers).await;
}

#[tokio::test(start_paused = true)]
async fn a_panicking_handler_does_not_leave_its_key_stuck() {
    let q = Arc::new(mk_queue());
    let panicked = Arc::new(AtomicBool::new(false));
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (panicked, runs) = (panicked.clone(), runs.clone());
        move |_key: String| {
            let first = !panicked.swap(true, Ordering::SeqCst);
            runs.fetch_add(1, Ordering::SeqCst);
            async move {
                assert!(!first, "handler bug (expected by this test)");
                Outcome::Done
            }
        }
    };
    let workers = run_workers(q.clone(), 2, CancellationToken::new(), handler);
    q.add("a");
    tokio::time::sleep(MS).await;
    assert_eq!(q.in_flight(), 0, "the panicked run released its key");
    q.add("a");
    tokio::time::sleep(MS).await;
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    q.shutdown();
    join_all(workers).await;
}

#[tokio::test(start_paused = true)]
async fn urgent_keys_come_out_before_routine_ones_in_their_own_order() {
    let q = mk_queue();
    for key in ["a", "b"] {
        q.add(key);
    }
    q.add_urgent("c");
    q.add_urgent("b");
    assert_eq!(q.len(), 3, "b moved lanes, it was not added twice");
    assert_eq!(get_all_due(&q).await, ["c", "b", "a"]);
}

#[tokio::test(start_paused = true)]
async fn a_failed_urgent_run_retries_in_the_urgent_lane() {
    let q = mk_queue();
    q.add_urgent("a");
    assert_eq!(poll_get(&q).await.as_deref(), Some("a"));
    q.finish("a", Outcome::RequeueAfter(10 * MS));
    q.add("b");
    advance(10 * MS).await;
    assert_eq!(get_all_due(&q).await, ["a", "b"]);
}

#[tokio::test(start_paused = true)]
async fn a_done_urgent_key_added_again_is_routine() {
    let q = mk_queue();
    q.add_urgent("a");
    assert_eq!(poll_get(&q).await.as_deref(), Some("a"));
    q.finish("a", Outcome::Done);
    q.add("b");
    q.add("a");
    assert_eq!(get_all_due(&q).await, ["b", "a"]);
}

/// One worker whose handler ends the runs of keys named `tail-*` in a
/// tail that waits for a permit of `gate`; every run is counted by key.
struct Tails {
    q: Arc<WorkQueue>,
    gate: Arc<tokio::sync::Semaphore>,
    runs: Arc<Mutex<HashMap<String, usize>>>,
    workers: Vec<JoinHandle<()>>,
}

impl Tails {
    fn start() -> Self {
        let q = Arc::new(mk_queue());
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let runs: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let handler = {
            let (gate, runs) = (gate.clone(), runs.clone());
            move |key: String| {
                *runs.lock().expect("runs").entry(key.clone()).or_default() += 1;
                let gate = gate.clone();
                async move {
                    if !key.starts_with("tail-") {
                        return Run::Done(Outcome::Done);
                    }
                    Run::Tail(Box::pin(async move {
                        let _ = gate.acquire().await.map(|p| p.forget());
                        Outcome::Done
                    }))
                }
            }
        };
        let workers = run_workers(q.clone(), 1, CancellationToken::new(), handler);
        Tails {
            q,
            gate,
            runs,
            workers,
        }
    }

    fn count(&self, key: &str) -> usize {
        self.runs
            .lock()
            .expect("runs")
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    /// Lets `n` waiting tails end.
    fn release(&self, n: usize) {
        self.gate.add_permits(n);
    }

    async fn stop(self) {
        wait_until(|| self.q.in_flight() == 0).await;
        self.q.shutdown();
        join_all(self.workers).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_worker_goes_on_while_a_tail_holds_its_key() {
    let t = Tails::start();
    t.q.add("tail-a");
    t.q.add("b");
    wait_until(|| t.count("b") == 1).await;
    assert_eq!(t.q.in_flight(), 1, "tail-a is still in flight");
    // Added while its tail runs: it waits for the tail, not beside it.
    t.q.add("tail-a");
    assert_eq!(t.count("tail-a"), 1);
    t.release(1);
    wait_until(|| t.count("tail-a") == 2).await;
    t.release(1);
    t.stop().await;
}

#[tokio::test(start_paused = true)]
async fn no_more_tails_run_at_once_than_there_are_workers() {
    let t = Tails::start();
    for key in ["tail-a", "tail-b", "c"] {
        t.q.add(key);
    }
    // tail-b's node part ran; its tail waits for tail-a's slot, and so
    // does the worker: c is not taken.
    wait_until(|| t.count("tail-b") == 1).await;
    tokio::task::yield_now().await;
    assert_eq!(t.count("c"), 0, "the worker waits for a tail slot");
    assert_eq!(t.q.in_flight(), 2);
    t.release(1);
    wait_until(|| t.count("c") == 1).await;
    t.release(1);
    t.stop().await;
}
