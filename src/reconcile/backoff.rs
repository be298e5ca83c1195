//! Retry delays for failed reconciliations: `base * 2^(n-1)` for the n-th
//! consecutive failure of one key, capped at [`MAX_RETRY_DELAY`]. With the
//! default 200 ms base that is 200 ms, 400 ms, ... 12.8 s, 25.6 s, then 30 s.

use std::time::Duration;

/// No retry waits longer than this: past it, the periodic sweep is the
/// better safety net than an ever-growing delay.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(30);

/// Delay before the retry that follows the `failures`-th consecutive failure
/// (0 is treated as 1).
pub fn retry_delay(failures: u32, base: Duration) -> Duration {
    let mut delay = base.min(MAX_RETRY_DELAY);
    // Doubling step by step (rather than `2^(n-1)` up front) cannot overflow
    // and stops as soon as the cap is reached, whatever `base` is.
    for _ in 1..failures {
        if delay >= MAX_RETRY_DELAY {
            break;
        }
        delay = delay.saturating_mul(2);
    }
    delay.min(MAX_RETRY_DELAY)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const BASE: Duration = Duration::from_millis(200);

    #[test]
    fn retry_delay_starts_at_base_and_doubles() {
        let delays: Vec<u128> = (1..=7).map(|n| retry_delay(n, BASE).as_millis()).collect();
        assert_eq!(delays, [200, 400, 800, 1600, 3200, 6400, 12800]);
    }

    #[test]
    fn retry_delay_is_capped_at_30s() {
        // The formula, not the spec's table ("8+: 30 s"): the 8th delay is
        // 25.6 s, the cap applies from the 9th.
        assert_eq!(retry_delay(8, BASE), Duration::from_millis(25_600));
        assert_eq!(retry_delay(9, BASE), MAX_RETRY_DELAY);
        assert_eq!(retry_delay(u32::MAX, BASE), MAX_RETRY_DELAY);
        assert_eq!(retry_delay(1, Duration::from_secs(90)), MAX_RETRY_DELAY);
    }

    #[test]
    fn retry_delay_treats_zero_failures_as_the_first() {
        assert_eq!(retry_delay(0, BASE), BASE);
    }

    #[test]
    fn retry_delay_is_exact_for_tiny_bases() {
        // 1 ns * 2^34 is still under the cap; a fixed exponent cap would
        // stop doubling too early here.
        let base = Duration::from_nanos(1);
        assert_eq!(retry_delay(35, base), Duration::from_nanos(1 << 34));
        assert_eq!(retry_delay(36, base), MAX_RETRY_DELAY);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn retry_delay_never_shrinks_and_never_exceeds_the_cap(
            base_ms in 1u64..60_000,
            n in 1u32..64,
        ) {
            let base = Duration::from_millis(base_ms);
            let (now, next) = (retry_delay(n, base), retry_delay(n + 1, base));
            prop_assert!(now <= next);
            prop_assert!(next <= MAX_RETRY_DELAY);
            prop_assert!(now >= base.min(MAX_RETRY_DELAY));
        }
    }
}
