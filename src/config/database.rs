//! The `database:` section. The reference control plane offers `in_memory`
//! and `sqlite`; slim-cp has the memory store (under both names) and, later,
//! PostgreSQL. SQLite is refused outright rather than quietly replaced by
//! the memory store, which would lose the state the operator meant to keep.

use std::fmt;

use serde::de::{self, IgnoredAny, Visitor};
use serde::{Deserialize, Deserializer};

use super::ConfigError;

/// The `type` values accepted, for error messages.
const ACCEPTED: &str = "memory, in_memory";

/// Which store holds the control plane's state.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DatabaseConfig {
    /// In-process store for a single replica; state is lost on restart.
    #[default]
    Memory,
}

/// The section as written.
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawDatabase {
    #[serde(rename = "type")]
    kind: Option<DatabaseKind>,
    /// Only meaningful for `sqlite`, which is refused; accepted so that a
    /// stray `path` next to `type: in_memory` is a warning, not an error.
    path: Option<IgnoredAny>,
}

impl RawDatabase {
    pub(super) fn into_config(
        self,
        ignored: &mut Vec<String>,
    ) -> Result<DatabaseConfig, ConfigError> {
        let kind = match (self.kind, self.path.is_some()) {
            (Some(kind), _) => kind,
            (None, false) => DatabaseKind::Memory,
            (None, true) => {
                return Err(ConfigError::invalid(
                    "database.type",
                    format!("missing key (accepted: {ACCEPTED})"),
                ));
            }
        };
        if self.path.is_some() {
            ignored.push("database.path".into());
        }
        match kind {
            DatabaseKind::Memory => Ok(DatabaseConfig::Memory),
        }
    }
}

/// The `type` key, checked while parsing so that errors carry a line.
enum DatabaseKind {
    Memory,
}

impl<'de> Deserialize<'de> for DatabaseKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(KindVisitor)
    }
}

struct KindVisitor;

impl Visitor<'_> for KindVisitor {
    type Value = DatabaseKind;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a database type ({ACCEPTED})")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<DatabaseKind, E> {
        match v {
            "memory" | "in_memory" => Ok(DatabaseKind::Memory),
            "sqlite" => Err(E::custom(
                "slim-cp has no SQLite backend: use `type: memory` for a single replica, \
                 or `type: postgres` for durable or highly available state",
            )),
            other => Err(E::custom(format!(
                "{other:?} is not a database type slim-cp supports (accepted: {ACCEPTED})"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<(DatabaseConfig, Vec<String>), String> {
        let raw: RawDatabase = serde_yaml::from_str(yaml).map_err(|e| e.to_string())?;
        let mut ignored = Vec::new();
        let config = raw.into_config(&mut ignored).map_err(|e| e.to_string())?;
        Ok((config, ignored))
    }

    #[test]
    fn both_memory_names() {
        assert_eq!(parse("type: in_memory").unwrap().0, DatabaseConfig::Memory);
        assert_eq!(parse("type: memory").unwrap().0, DatabaseConfig::Memory);
        assert_eq!(parse("{}").unwrap().0, DatabaseConfig::Memory);
    }

    #[test]
    fn sqlite_refused_with_advice() {
        let err = parse("type: sqlite\npath: /var/lib/slim/cp.db").unwrap_err();
        assert!(err.contains("no SQLite backend"), "{err}");
        assert!(
            err.contains("type: memory") && err.contains("postgres"),
            "{err}"
        );
    }

    #[test]
    fn unknown_type_lists_accepted() {
        let err = parse("type: mysql").unwrap_err();
        assert!(err.contains("\"mysql\"") && err.contains(ACCEPTED), "{err}");
    }

    #[test]
    fn stray_path_is_ignored_but_reported() {
        let (config, ignored) = parse("type: memory\npath: /tmp/x").unwrap();
        assert_eq!(config, DatabaseConfig::Memory);
        assert_eq!(ignored, vec!["database.path"]);
        assert!(parse("path: /tmp/x").unwrap_err().contains("database.type"));
    }
}
