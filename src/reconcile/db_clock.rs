//! The database's clock as the leader uses it: read now and then, and
//! extrapolated in between with this host's monotonic clock, so that a
//! derivation does not wait a round trip (and a pooled connection) only
//! to learn the time.
//!
//! The estimate is never ahead of the database: the value read is the
//! clock at the start of its transaction, earlier than the moment its
//! answer arrives, and the time added is measured from that arrival. A
//! grace judged on the estimate can therefore end late, never early. How
//! late is bounded by the rate difference of two clocks over
//! [`REREAD_AFTER`] (microseconds), which a reread puts right, as does a
//! resync (a stepped database clock).

use std::time::{Duration, Instant};

use crate::store::{Store, StoreError};

/// How long one reading is extrapolated before the clock is read again.
pub const REREAD_AFTER: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
pub struct DbClock {
    /// The last reading, in Unix milliseconds, and when it arrived.
    read: Option<(i64, Instant)>,
}

impl DbClock {
    /// The database's time in Unix seconds (floored, like its stamps), at
    /// most one round trip old.
    pub async fn now(&mut self, store: &dyn Store) -> Result<i64, StoreError> {
        let fresh = self.read.filter(|(_, at)| at.elapsed() < REREAD_AFTER);
        let (millis, at) = match fresh {
            Some(read) => read,
            None => {
                let read = (store.now_millis().await?, Instant::now());
                self.read = Some(read);
                read
            }
        };
        Ok(estimate(millis, at.elapsed()))
    }

    /// The next call reads the clock again.
    pub fn forget(&mut self) {
        self.read = None;
    }
}

/// `millis` advanced by `since`, in whole seconds, rounded down.
fn estimate(millis: i64, since: Duration) -> i64 {
    let since = i64::try_from(since.as_millis()).unwrap_or(i64::MAX);
    millis.saturating_add(since).div_euclid(1000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    #[test]
    fn the_estimate_rounds_down_to_the_second() {
        assert_eq!(estimate(1_000_999, Duration::ZERO), 1_000);
        assert_eq!(estimate(1_000_999, Duration::from_millis(1)), 1_001);
        assert_eq!(estimate(1_000_000, Duration::from_millis(2_500)), 1_002);
    }

    #[tokio::test]
    async fn the_estimate_is_never_ahead_of_the_store() {
        let store = MemoryStore::new();
        let mut clock = DbClock::default();
        let mut reads = 0;
        // Across several rereads: each estimate is at most the store's
        // own reading taken right after it.
        let until = Instant::now() + REREAD_AFTER * 2 + Duration::from_millis(300);
        while Instant::now() < until {
            let estimate = clock.now(&store).await.unwrap();
            let truth = store.now().await.unwrap();
            assert!(estimate <= truth, "estimate {estimate} ahead of {truth}");
            assert!(
                truth - estimate <= 1,
                "estimate {estimate} far behind {truth}"
            );
            reads += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(reads > 40, "only {reads} readings");
    }

    #[tokio::test]
    async fn a_reading_is_reused_until_it_is_stale() {
        let store = crate::store::faults::FaultyStore::new(std::sync::Arc::new(MemoryStore::new()));
        let mut clock = DbClock::default();
        clock.now(&store).await.unwrap();
        // The store is away, yet the reading still serves ...
        store.set_down(true);
        clock.now(&store).await.unwrap();
        // ... until it is forgotten: then the store is asked again.
        clock.forget();
        assert!(clock.now(&store).await.is_err());
    }
}
