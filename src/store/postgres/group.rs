//! Group commit for facts: calls of one kind that arrive while a batch of
//! them is being written go together into the next batch, one
//! transaction for all. A thousand nodes registering at once then cost
//! a few dozen transactions instead of a thousand queued for the pool,
//! and a lone call is written at once (nothing waits to fill a batch).
//!
//! Each call still gets its own answer. A batch the database refuses as
//! a whole (a statement error, not the database being away) is written
//! again one call at a time, so one bad fact never costs the others.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::store::StoreError;

/// At most this many calls in one transaction.
pub(super) const MAX_BATCH: usize = 256;

/// Each call's own answer, or the whole batch's failure.
pub(super) type Answers<R> = Result<Vec<Result<R, StoreError>>, StoreError>;

pub(super) type WriteFuture<R> = Pin<Box<dyn Future<Output = Answers<R>> + Send>>;

struct Waiting<Q, R> {
    call: Q,
    reply: oneshot::Sender<Result<R, StoreError>>,
}

/// The queues of one kind of call, and the tasks writing them. Cheap to
/// clone.
pub(super) struct Group<Q, R> {
    queues: Arc<[mpsc::UnboundedSender<Waiting<Q, R>>]>,
    /// The node a call is about: one node's calls share a queue, so they
    /// are written in call order.
    key: fn(&Q) -> &str,
}

impl<Q, R> Clone for Group<Q, R> {
    fn clone(&self) -> Self {
        Self {
            queues: self.queues.clone(),
            key: self.key,
        }
    }
}

/// Writers per kind of call: while one batch waits for its commit, the
/// next fills and is written.
pub(super) const WRITERS: usize = 2;

impl<Q, R> Group<Q, R>
where
    Q: Clone + Send + 'static,
    R: Send + 'static,
{
    /// Starts the writing tasks; `write` gets a batch in arrival order and
    /// answers each call in the same order. The tasks end with the last
    /// clone.
    pub(super) fn spawn<W>(write: W, key: fn(&Q) -> &str) -> Self
    where
        W: Fn(Vec<Q>) -> WriteFuture<R> + Send + Sync + 'static,
    {
        let write = Arc::new(write);
        let queues: Vec<_> = (0..WRITERS)
            .map(|_| {
                let (queue, rx) = mpsc::unbounded_channel();
                let write = write.clone();
                tokio::spawn(async move { run(rx, |calls| write(calls)).await });
                queue
            })
            .collect();
        Self {
            queues: queues.into(),
            key,
        }
    }

    /// Writes `call` with whatever else is waiting; its own answer.
    pub(super) async fn call(&self, call: Q) -> Result<R, StoreError> {
        let (reply, answer) = oneshot::channel();
        let gone = || StoreError::Unavailable("the fact writer stopped".into());
        let queue = &self.queues[queue_of((self.key)(&call), self.queues.len())];
        queue.send(Waiting { call, reply }).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

/// The queue of node `key` among `n`.
fn queue_of(key: &str, n: usize) -> usize {
    use std::hash::{BuildHasher, BuildHasherDefault};
    let hash = BuildHasherDefault::<twox_hash::XxHash64>::default().hash_one(key);
    usize::try_from(hash % u64::try_from(n.max(1)).unwrap_or(1)).unwrap_or(0)
}

async fn run<Q, R, W>(mut rx: mpsc::UnboundedReceiver<Waiting<Q, R>>, write: W)
where
    Q: Clone,
    W: Fn(Vec<Q>) -> WriteFuture<R>,
{
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(w) => batch.push(w),
                Err(_) => break,
            }
        }
        write_batch(batch, &write).await;
    }
}

async fn write_batch<Q, R, W>(batch: Vec<Waiting<Q, R>>, write: &W)
where
    Q: Clone,
    W: Fn(Vec<Q>) -> WriteFuture<R>,
{
    let calls: Vec<Q> = batch.iter().map(|w| w.call.clone()).collect();
    let n = calls.len();
    match write(calls).await {
        Ok(answers) if answers.len() == n => {
            for (w, a) in batch.into_iter().zip(answers) {
                let _ = w.reply.send(a);
            }
        }
        Ok(answers) => {
            let e = StoreError::Rejected(format!("{} answers to {n} calls", answers.len()));
            batch.into_iter().for_each(|w| {
                let _ = w.reply.send(Err(e.clone()));
            });
        }
        Err(StoreError::Rejected(_)) if n > 1 => {
            for w in batch {
                let answer = match write(vec![w.call]).await {
                    Ok(mut one) if one.len() == 1 => one.remove(0),
                    Ok(_) => Err(StoreError::Rejected("no answer to a call".into())),
                    Err(e) => Err(e),
                };
                let _ = w.reply.send(answer);
            }
        }
        Err(e) => batch.into_iter().for_each(|w| {
            let _ = w.reply.send(Err(e.clone()));
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// The batches a test group wrote, in order.
    type Log = Arc<Mutex<Vec<Vec<u32>>>>;

    /// Records each batch it writes; refuses a batch holding 13.
    fn recording() -> (Group<u32, u32>, Log) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let group = Group::spawn(
            move |calls: Vec<u32>| {
                let log = log.clone();
                Box::pin(async move {
                    // A little work, so that calls pile up behind a batch.
                    tokio::task::yield_now().await;
                    log.lock().unwrap().push(calls.clone());
                    if calls.contains(&13) {
                        return Err(StoreError::Rejected("13".into()));
                    }
                    Ok(calls.iter().map(|c| Ok(c * 2)).collect())
                }) as WriteFuture<u32>
            },
            parity,
        );
        (group, seen)
    }

    fn parity(c: &u32) -> &str {
        if c % 2 == 0 { "even" } else { "odd" }
    }

    /// Makes every call at once; their answers in call order.
    async fn all(
        group: &Group<u32, u32>,
        calls: impl IntoIterator<Item = u32>,
    ) -> Vec<Result<u32, StoreError>> {
        let tasks: Vec<_> = calls
            .into_iter()
            .map(|i| {
                let g = group.clone();
                tokio::spawn(async move { g.call(i).await })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    }

    #[tokio::test]
    async fn calls_waiting_behind_a_batch_are_written_together() {
        let (group, seen) = recording();
        let answers = all(&group, 100..150).await;
        for (i, a) in (100..150).zip(answers) {
            assert_eq!(a, Ok(i * 2));
        }
        let batches = seen.lock().unwrap().clone();
        assert!(batches.len() < 50, "no call was grouped: {batches:?}");
        assert_eq!(batches.iter().map(Vec::len).sum::<usize>(), 50);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_nodes_calls_are_written_in_call_order() {
        let (group, seen) = recording();
        let mut answers = Vec::new();
        // Sent one after another, so that their order is the call order.
        let calls: Vec<_> = (0..60u32)
            .filter(|c| *c != 13)
            .map(|c| group.call(c))
            .collect();
        for a in calls {
            answers.push(a.await);
        }
        assert!(answers.iter().all(Result::is_ok));
        let written: Vec<u32> = seen.lock().unwrap().iter().flatten().copied().collect();
        for key in ["even", "odd"] {
            let mine: Vec<u32> = written
                .iter()
                .copied()
                .filter(|c| parity(c) == key)
                .collect();
            assert!(mine.windows(2).all(|w| w[0] < w[1]), "{key}: {mine:?}");
        }
    }

    #[tokio::test]
    async fn a_refused_batch_is_written_again_one_call_at_a_time() {
        let (group, seen) = recording();
        let answers = all(&group, [12, 13, 14]).await;
        assert_eq!(answers[0], Ok(24));
        assert!(matches!(answers[1], Err(StoreError::Rejected(_))));
        assert_eq!(answers[2], Ok(28));
        // Whatever the grouping, 13 was finally written alone.
        assert!(seen.lock().unwrap().contains(&vec![13]));
    }
}
