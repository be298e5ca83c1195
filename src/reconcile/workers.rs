//! The reconcilers' worker pool: `workers` tasks, each looping `get` →
//! handler → `settle` on a [`WorkQueue`].
//!
//! A handler may end its run in two parts ([`Run::Tail`]): what needs the
//! node (its tables, the command) and what only records the answer. The
//! worker goes on to the next key as soon as the first part is done; the
//! tail runs on, still holding its key, so the key never runs twice at
//! once and the queue counts it in flight until its record is written.
//! At most `workers` tails run at once: a worker waits for a free one
//! before taking the next key. On Postgres a record is a transaction
//! (2-10 ms on a loaded two-core machine), as long as the node's part of
//! a reconcile: with the workers waiting for it, a wave of 50 gateways'
//! link commands took 200 ms where memory took 75.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::queue::{Outcome, WorkQueue};

/// The rest of a run, holding its key until it ends.
pub type Tail = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// How a handler's run for a key ended.
pub enum Run {
    /// Wholly: the outcome.
    Done(Outcome),
    /// Its node's part is done; this finishes it.
    Tail(Tail),
}

impl From<Outcome> for Run {
    fn from(outcome: Outcome) -> Self {
        Run::Done(outcome)
    }
}

/// Spawns `workers` tasks, each looping `get` → `handler` → `settle` until
/// the queue shuts down or `cancel` fires. On `cancel`, a running handler
/// or tail is dropped at its next await point: leader work must stop when
/// leadership is lost. Whatever way a run ends (even a panic), its key is
/// `done`.
pub fn run_workers<H, Fut>(
    queue: Arc<WorkQueue>,
    workers: usize,
    cancel: CancellationToken,
    handler: H,
) -> Vec<JoinHandle<()>>
where
    H: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future + Send + 'static,
    Fut::Output: Into<Run>,
{
    let handler = Arc::new(handler);
    let tails = Arc::new(Semaphore::new(workers.max(1)));
    (0..workers)
        .map(|_| {
            let pool = Pool {
                queue: queue.clone(),
                cancel: cancel.clone(),
                tails: tails.clone(),
            };
            tokio::spawn(pool.work(handler.clone()))
        })
        .collect()
}

/// What each worker shares with the others.
struct Pool {
    queue: Arc<WorkQueue>,
    cancel: CancellationToken,
    tails: Arc<Semaphore>,
}

impl Pool {
    async fn work<H, Fut>(self, handler: Arc<H>)
    where
        H: Fn(String) -> Fut,
        Fut: Future,
        Fut::Output: Into<Run>,
    {
        while let Some(key) = self.next_key().await {
            let claim = Claim {
                queue: self.queue.clone(),
                key,
            };
            let run = tokio::select! {
                biased;
                () = self.cancel.cancelled() => return,
                run = handler(claim.key.clone()) => run.into(),
            };
            match run {
                Run::Done(outcome) => self.queue.settle(&claim.key, outcome),
                Run::Tail(tail) => {
                    if !self.finish_later(claim, tail).await {
                        return;
                    }
                }
            }
        }
    }

    /// Runs `tail` on its own once a tail slot is free; false if the pool
    /// was cancelled while waiting.
    async fn finish_later(&self, claim: Claim, tail: Tail) -> bool {
        let permit = tokio::select! {
            biased;
            () = self.cancel.cancelled() => return false,
            permit = self.tails.clone().acquire_owned() => permit,
        };
        let Ok(permit) = permit else {
            return false;
        };
        let cancel = self.cancel.clone();
        tokio::spawn(async move {
            let _slot = permit;
            tokio::select! {
                biased;
                () = cancel.cancelled() => {}
                outcome = tail => claim.queue.settle(&claim.key, outcome),
            }
        });
        true
    }

    async fn next_key(&self) -> Option<String> {
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => None,
            key = self.queue.get() => key,
        }
    }
}

/// A key held by a run. Dropping it calls `done`, so no exit path (a
/// cancelled or panicking handler or tail included) leaves the key
/// processing forever, which would block it for good.
struct Claim {
    queue: Arc<WorkQueue>,
    key: String,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.queue.done(&self.key);
    }
}
