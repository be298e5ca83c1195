//! The `reconciler:` section: work-queue retry and sweep tuning. Same keys
//! and defaults as the reference control plane.

use std::time::Duration;

use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer};

use super::ConfigError;
use super::duration;

/// Reconciler tuning.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReconcilerConfig {
    /// Retries per item before it is dropped until the next sweep.
    pub max_requeues: u32,
    /// First retry delay; later ones double, capped at 30 s.
    #[serde(deserialize_with = "duration::deserialize")]
    pub base_retry_delay: Duration,
    /// Interval of the full reconciliation sweep; zero disables the
    /// configured sweep (the HA leader still keeps a floor of its own).
    #[serde(deserialize_with = "duration::deserialize")]
    pub reconcile_period: Duration,
    /// Delete data-plane connections the control plane does not know.
    /// Only safe when the control plane is the sole source of connections.
    pub enable_orphan_detection: bool,
    /// Parallel workers per queue (link and route).
    #[serde(deserialize_with = "deserialize_workers")]
    pub workers: usize,
}

impl Default for ReconcilerConfig {
    fn default() -> Self {
        Self {
            max_requeues: 15,
            base_retry_delay: Duration::from_millis(200),
            reconcile_period: Duration::from_secs(60),
            enable_orphan_detection: false,
            workers: 4,
        }
    }
}

impl ReconcilerConfig {
    /// Checks what the types cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_workers(self.workers).map_err(|m| ConfigError::invalid("reconciler.workers", m))?;
        if self.base_retry_delay.is_zero() {
            // Backoff is base * 2^n: a zero base retries a failing node in
            // a tight loop, which only adds load where things already fail.
            return Err(ConfigError::invalid(
                "reconciler.base_retry_delay",
                "must be greater than 0 (examples: 200ms, 1s)",
            ));
        }
        Ok(())
    }
}

/// The reference clamps 0 to 1 silently; a zero here is a typo worth
/// refusing, since no worker means nothing is ever reconciled.
fn check_workers(workers: usize) -> Result<(), String> {
    if workers == 0 {
        return Err("must be at least 1 (no worker would reconcile anything)".into());
    }
    Ok(())
}

/// Checked inside the visitor so that the error points at the value.
fn deserialize_workers<'de, D: Deserializer<'de>>(deserializer: D) -> Result<usize, D::Error> {
    deserializer.deserialize_u64(WorkersVisitor)
}

struct WorkersVisitor;

impl Visitor<'_> for WorkersVisitor {
    type Value = usize;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a whole number, at least 1")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<usize, E> {
        let workers = usize::try_from(v).map_err(|_| E::custom("too many workers"))?;
        check_workers(workers).map_err(E::custom)?;
        Ok(workers)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<usize, E> {
        match u64::try_from(v) {
            Ok(v) => self.visit_u64(v),
            Err(_) => Err(E::invalid_value(de::Unexpected::Signed(v), &self)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_reference() {
        let c = ReconcilerConfig::default();
        assert_eq!(c.max_requeues, 15);
        assert_eq!(c.base_retry_delay, Duration::from_millis(200));
        assert_eq!(c.reconcile_period, Duration::from_secs(60));
        assert!(!c.enable_orphan_detection);
        assert_eq!(c.workers, 4);
        assert!(c.validate().is_ok());
    }

    #[test]
    fn partial_section_keeps_other_defaults() {
        let c: ReconcilerConfig =
            yaml_serde::from_str("workers: 8\nreconcile_period: 0s\n").unwrap();
        assert_eq!(c.workers, 8);
        assert_eq!(c.reconcile_period, Duration::ZERO);
        assert_eq!(c.max_requeues, 15);
    }

    #[test]
    fn zero_workers_and_zero_base_delay_refused() {
        assert!(yaml_serde::from_str::<ReconcilerConfig>("workers: 0").is_err());
        let c = ReconcilerConfig {
            workers: 0,
            ..ReconcilerConfig::default()
        };
        assert_eq!(c.validate().unwrap_err().key(), Some("reconciler.workers"));
        let c = ReconcilerConfig {
            base_retry_delay: Duration::ZERO,
            ..ReconcilerConfig::default()
        };
        assert_eq!(
            c.validate().unwrap_err().key(),
            Some("reconciler.base_retry_delay")
        );
    }
}
