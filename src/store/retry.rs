//! Bounded retry of store calls that failed for a transient reason.

use std::future::Future;

use tokio::time::Instant;

use super::StoreError;

/// Runs `op` until it succeeds, fails for a non-transient reason, or the
/// `deadline` passes. Only [`StoreError::Unavailable`] is retried, with
/// doubling pauses from 25 ms. Each call is itself cut off at the
/// deadline: one attempt against a database that went silent can take
/// far longer than any caller's budget (pool wait, connect, statement).
pub async fn retry_until<T, F, Fut>(deadline: Instant, mut op: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut pause = std::time::Duration::from_millis(25);
    loop {
        let attempt = tokio::time::timeout_at(deadline, op()).await;
        match attempt {
            Err(_) => {
                return Err(StoreError::Unavailable(
                    "no answer from the store before the deadline".into(),
                ));
            }
            Ok(Err(StoreError::Unavailable(why))) if Instant::now() + pause < deadline => {
                tracing::debug!(%why, ?pause, "store unavailable; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_secs(1));
            }
            Ok(other) => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn transient_failures_are_retried_until_success() {
        let calls = AtomicU32::new(0);
        let out = retry_until(Instant::now() + Duration::from_secs(5), || async {
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
        let stale = retry_until(Instant::now() + Duration::from_secs(5), || async {
            Err::<(), _>(StoreError::SegmentNotFound("s".into()))
        })
        .await;
        assert_eq!(stale, Err(StoreError::SegmentNotFound("s".into())));
        let calls = AtomicU32::new(0);
        let down = retry_until(Instant::now() + Duration::from_millis(200), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(StoreError::Unavailable("down".into()))
        })
        .await;
        assert!(matches!(down, Err(StoreError::Unavailable(_))));
        assert!(calls.load(Ordering::SeqCst) < 10);
    }

    /// Regression: a call that hangs (a black-holed database) was bounded
    /// only by the store's own 15 s attempt timeout, past the node's 10 s.
    #[tokio::test(start_paused = true)]
    async fn a_hanging_call_is_cut_off_at_the_deadline() {
        let start = Instant::now();
        let hung = retry_until(start + Duration::from_secs(7), || async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<(), StoreError>(())
        })
        .await;
        assert!(matches!(hung, Err(StoreError::Unavailable(_))));
        assert_eq!(start.elapsed(), Duration::from_secs(7));
    }
}
