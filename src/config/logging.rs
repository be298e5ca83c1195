//! The `tracing:` section. The reference reads it with slim-tracing's
//! `TracingConfiguration`, which rejects unknown keys; slim-cp does the
//! same, honours `log_level`, and reports the reference's other keys
//! (thread names/ids, filters, OpenTelemetry export) as ignored.

use std::fmt;

use serde::de::{self, IgnoredAny, Visitor};
use serde::{Deserialize, Deserializer};

use super::ConfigError;

/// Accepted levels, lowest first.
const LEVELS: [&str; 5] = ["trace", "debug", "info", "warn", "error"];

/// Logging settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracingConfig {
    /// One of trace, debug, info, warn, error (lower case once loaded).
    pub log_level: String,
}

impl Default for TracingConfig {
    fn default() -> Self {
        Self {
            log_level: "info".to_string(),
        }
    }
}

impl TracingConfig {
    /// Refuses a level the logger would not understand.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_level(&self.log_level).map_err(|m| ConfigError::invalid("tracing.log_level", m))?;
        Ok(())
    }
}

/// The reference lower-cases the level and falls back to `info` for
/// anything else; a misspelt level is better refused than silently changed.
fn check_level(level: &str) -> Result<String, String> {
    let lower = level.to_ascii_lowercase();
    if LEVELS.contains(&lower.as_str()) {
        return Ok(lower);
    }
    Err(format!(
        "{level:?} is not a log level (accepted: {})",
        LEVELS.join(", ")
    ))
}

/// Checked inside the visitor so that the error points at the value.
fn deserialize_level<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<String>, D::Error> {
    deserializer.deserialize_str(LevelVisitor).map(Some)
}

struct LevelVisitor;

impl Visitor<'_> for LevelVisitor {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a log level ({})", LEVELS.join(", "))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        check_level(v).map_err(E::custom)
    }
}

/// The section as written.
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawTracing {
    #[serde(deserialize_with = "deserialize_level")]
    log_level: Option<String>,
    display_thread_names: Option<IgnoredAny>,
    display_thread_ids: Option<IgnoredAny>,
    filters: Option<IgnoredAny>,
    opentelemetry: Option<IgnoredAny>,
}

impl RawTracing {
    pub(super) fn into_config(self, ignored: &mut Vec<String>) -> TracingConfig {
        let present = [
            ("display_thread_names", self.display_thread_names.is_some()),
            ("display_thread_ids", self.display_thread_ids.is_some()),
            ("filters", self.filters.is_some()),
            ("opentelemetry", self.opentelemetry.is_some()),
        ];
        for (key, _) in present.iter().filter(|(_, p)| *p) {
            ignored.push(format!("tracing.{key}"));
        }
        TracingConfig {
            log_level: self
                .log_level
                .unwrap_or_else(|| TracingConfig::default().log_level),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_case_insensitive_and_checked() {
        assert_eq!(check_level("WARN").unwrap(), "warn");
        assert!(check_level("verbose").unwrap_err().contains("trace, debug"));
        let raw: RawTracing = yaml_serde::from_str("log_level: Debug\nfilters: [a]").unwrap();
        let mut ignored = Vec::new();
        assert_eq!(raw.into_config(&mut ignored).log_level, "debug");
        assert_eq!(ignored, vec!["tracing.filters"]);
        assert!(yaml_serde::from_str::<RawTracing>("log_level: loud").is_err());
        assert!(yaml_serde::from_str::<RawTracing>("colour: true").is_err());
    }
}
