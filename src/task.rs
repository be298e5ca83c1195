//! Spawned tasks whose lives end with their owner's.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::task::{JoinError, JoinHandle};

/// A spawned task, aborted when this handle is dropped: the work it does
/// for its owner (a connection's driver, a write) is never left running
/// once nobody waits for it. Awaited, it is the task's outcome.
pub struct Owned<T>(JoinHandle<T>);

impl<T: Send + 'static> Owned<T> {
    pub fn spawn(work: impl Future<Output = T> + Send + 'static) -> Self {
        Owned(tokio::spawn(work))
    }
}

impl<T> Future for Owned<T> {
    type Output = Result<T, JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx)
    }
}

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::sync::oneshot;

    #[tokio::test]
    async fn awaited_it_is_the_tasks_outcome() {
        let task = Owned::spawn(async { 41 + 1 });
        assert_eq!(task.await.expect("finished"), 42);
    }

    #[tokio::test]
    async fn dropped_it_stops_the_task() {
        let finished = Arc::new(AtomicBool::new(false));
        let (started_tx, started) = oneshot::channel();
        let (release_tx, release) = oneshot::channel::<()>();
        let (gone_tx, gone) = oneshot::channel::<()>();
        let flag = finished.clone();
        let task = Owned::spawn(async move {
            // Dropped with the task's future when it is aborted.
            let _gone = gone_tx;
            let _ = started_tx.send(());
            let _ = release.await;
            flag.store(true, Ordering::SeqCst);
        });
        started.await.expect("the task ran");
        drop(task);
        // Released now, a task still running would set the flag before
        // its future, and the sender it holds, went away.
        drop(release_tx);
        assert!(gone.await.is_err());
        assert!(!finished.load(Ordering::SeqCst));
    }
}
