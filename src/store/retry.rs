//! Bounded retry of store calls that failed for a transient reason.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use super::StoreError;

/// Runs `op` until it succeeds, fails for a non-transient reason, or
/// `budget` is spent. Only [`StoreError::Unavailable`] is retried, with
/// doubling pauses from 25 ms.
pub async fn retry_unavailable<T, F, Fut>(budget: Duration, mut op: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let deadline = Instant::now() + budget;
    let mut pause = Duration::from_millis(25);
    loop {
        match op().await {
            Err(StoreError::Unavailable(why)) if Instant::now() + pause < deadline => {
                tracing::debug!(%why, ?pause, "store unavailable; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test(start_paused = true)]
    async fn transient_failures_are_retried_until_success() {
        let calls = AtomicU32::new(0);
        let out = retry_unavailable(Duration::from_secs(5), || async {
            match calls.fetch_add(1, Ordering::SeqCst) {
                0..=2 => Err(StoreError::Unavailable("down".into())),
                n => Ok(n),
            }
        })
        .await;
        assert_eq!(out, Ok(3));
    }

    #[tokio::test(start_paused = true)]
    async fn other_errors_and_spent_budgets_are_returned() {
        let stale = retry_unavailable(Duration::from_secs(5), || async {
            Err::<(), _>(StoreError::SegmentNotFound("s".into()))
        })
        .await;
        assert_eq!(stale, Err(StoreError::SegmentNotFound("s".into())));
        let calls = AtomicU32::new(0);
        let down = retry_unavailable(Duration::from_millis(200), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(StoreError::Unavailable("down".into()))
        })
        .await;
        assert!(matches!(down, Err(StoreError::Unavailable(_))));
        assert!(calls.load(Ordering::SeqCst) < 10);
    }
}
