//! The `database:` section. The reference control plane offers `in_memory`
//! and `sqlite`; slim-cp has the memory store (under both names) and
//! PostgreSQL. SQLite is refused outright rather than quietly replaced by
//! the memory store, which would lose the state the operator meant to keep.
//!
//! Postgres URLs are secrets (they may hold a password): `Debug` shows them
//! redacted and errors never quote them. A URL missing from the file comes
//! from `SLIM_CP_DATABASE_URL` / `SLIM_CP_DATABASE_DIRECT_URL`, and a URL
//! without a password gets `SLIM_CP_DATABASE_PASSWORD`'s, so the file can
//! be checked in and the password kept in a secret store.

use std::fmt;

use serde::de::{self, IgnoredAny, Visitor};
use serde::{Deserialize, Deserializer};

use super::ConfigError;
use crate::store::postgres::url::{redact_url, with_password};

/// The `type` values accepted, for error messages.
const ACCEPTED: &str = "memory, in_memory, postgres";

/// The URL when the file has none.
pub const URL_ENV: &str = "SLIM_CP_DATABASE_URL";
/// The direct (not pooled through PgBouncer) URL when the file has none.
pub const DIRECT_URL_ENV: &str = "SLIM_CP_DATABASE_DIRECT_URL";
/// The password for URLs that carry none.
pub const PASSWORD_ENV: &str = "SLIM_CP_DATABASE_PASSWORD";

/// Connections per replica unless `pool_size` says otherwise, opened at
/// start; the leader opens as many again for its own work as its term
/// begins (see `PgStore::open_leader_pool`).
pub const DEFAULT_POOL_SIZE: usize = 16;

/// Which store holds the control plane's state.
#[derive(Clone, PartialEq, Eq, Default)]
pub enum DatabaseConfig {
    /// In-process store for a single replica; state is lost on restart.
    #[default]
    Memory,
    /// PostgreSQL, shared by every replica.
    Postgres {
        /// Connection string (URL or `key=value` form), password included
        /// if one was given.
        url: String,
        /// A connection that bypasses a transaction pooler, for leader
        /// election and LISTEN; `url` when absent.
        direct_url: Option<String>,
        /// Pooled connections per replica.
        pool_size: usize,
    },
}

impl fmt::Debug for DatabaseConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DatabaseConfig::Memory => f.write_str("Memory"),
            DatabaseConfig::Postgres {
                url,
                direct_url,
                pool_size,
            } => f
                .debug_struct("Postgres")
                .field("url", &redact_url(url))
                .field("direct_url", &direct_url.as_deref().map(redact_url))
                .field("pool_size", pool_size)
                .finish(),
        }
    }
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
    url: Option<String>,
    direct_url: Option<String>,
    pool_size: Option<usize>,
}

impl RawDatabase {
    /// The section, with URLs and the password the file lacks read from
    /// the environment through `env`.
    pub(super) fn into_config_with(
        self,
        ignored: &mut Vec<String>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<DatabaseConfig, ConfigError> {
        let kind = match (&self.kind, self.path.is_some()) {
            (Some(kind), _) => *kind,
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
            DatabaseKind::Memory => {
                self.ignore_postgres_keys(ignored);
                Ok(DatabaseConfig::Memory)
            }
            DatabaseKind::Postgres => self.postgres(env),
        }
    }

    fn ignore_postgres_keys(&self, ignored: &mut Vec<String>) {
        let present = [
            ("database.url", self.url.is_some()),
            ("database.direct_url", self.direct_url.is_some()),
            ("database.pool_size", self.pool_size.is_some()),
        ];
        ignored.extend(present.iter().filter(|p| p.1).map(|p| p.0.to_string()));
    }

    fn postgres(self, env: &dyn Fn(&str) -> Option<String>) -> Result<DatabaseConfig, ConfigError> {
        let password = env(PASSWORD_ENV).filter(|p| !p.is_empty());
        let url = self.url.or_else(|| env(URL_ENV)).ok_or_else(|| {
            ConfigError::invalid(
                "database.url",
                format!("missing key: set it here or in the environment as {URL_ENV}"),
            )
        })?;
        let url = checked_url("database.url", &url, password.as_deref())?;
        let direct_url = match self.direct_url.or_else(|| env(DIRECT_URL_ENV)) {
            Some(u) => Some(checked_url("database.direct_url", &u, password.as_deref())?),
            None => None,
        };
        let pool_size = self.pool_size.unwrap_or(DEFAULT_POOL_SIZE);
        if pool_size == 0 {
            return Err(ConfigError::invalid(
                "database.pool_size",
                "must be at least 1",
            ));
        }
        Ok(DatabaseConfig::Postgres {
            url,
            direct_url,
            pool_size,
        })
    }
}

/// Parses the connection string (the error never quotes it) and adds
/// `password` if it has none.
fn checked_url(key: &str, url: &str, password: Option<&str>) -> Result<String, ConfigError> {
    let parsed: tokio_postgres::Config = url.parse().map_err(|e: tokio_postgres::Error| {
        ConfigError::invalid(key, format!("not a PostgreSQL connection string: {e}"))
    })?;
    match password {
        Some(p) if parsed.get_password().is_none() => Ok(with_password(url, p)),
        _ => Ok(url.to_string()),
    }
}

/// The `type` key, checked while parsing so that errors carry a line.
#[derive(Clone, Copy)]
enum DatabaseKind {
    Memory,
    Postgres,
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
            "postgres" | "postgresql" => Ok(DatabaseKind::Postgres),
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

    fn parse_env(
        yaml: &str,
        env: &[(&str, &str)],
    ) -> Result<(DatabaseConfig, Vec<String>), String> {
        let raw: RawDatabase = yaml_serde::from_str(yaml).map_err(|e| e.to_string())?;
        let mut ignored = Vec::new();
        let lookup = |name: &str| {
            env.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        };
        let config = raw
            .into_config_with(&mut ignored, &lookup)
            .map_err(|e| e.to_string())?;
        Ok((config, ignored))
    }

    fn parse(yaml: &str) -> Result<(DatabaseConfig, Vec<String>), String> {
        parse_env(yaml, &[])
    }

    fn pg(url: &str, direct_url: Option<&str>, pool_size: usize) -> DatabaseConfig {
        let direct_url = direct_url.map(str::to_string);
        DatabaseConfig::Postgres {
            url: url.into(),
            direct_url,
            pool_size,
        }
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
        let (_, ignored) = parse("type: memory\nurl: postgres://h/db\npool_size: 2").unwrap();
        assert_eq!(ignored, vec!["database.url", "database.pool_size"]);
    }

    #[test]
    fn postgres_from_the_file_with_a_default_pool() {
        let (config, _) = parse("type: postgres\nurl: postgres://cp@db/slim").unwrap();
        assert_eq!(config, pg("postgres://cp@db/slim", None, DEFAULT_POOL_SIZE));
        let yaml = "type: postgresql\nurl: host=db user=cp\ndirect_url: postgres://db:5433/x\npool_size: 4";
        let (config, _) = parse(yaml).unwrap();
        assert_eq!(
            config,
            pg("host=db user=cp", Some("postgres://db:5433/x"), 4)
        );
    }

    #[test]
    fn urls_come_from_the_environment_when_the_file_has_none() {
        let env = [
            (URL_ENV, "postgres://env@db/slim"),
            (DIRECT_URL_ENV, "postgres://env@direct/slim"),
        ];
        let (config, _) = parse_env("type: postgres", &env).unwrap();
        assert_eq!(config, pg(env[0].1, Some(env[1].1), DEFAULT_POOL_SIZE));
        let (config, _) = parse_env("type: postgres\nurl: postgres://file@db/x", &env).unwrap();
        assert_eq!(
            config,
            pg("postgres://file@db/x", Some(env[1].1), DEFAULT_POOL_SIZE)
        );
    }

    #[test]
    fn the_password_variable_fills_urls_without_one() {
        let env = [(PASSWORD_ENV, "p@ss w'rd")];
        let yaml = "type: postgres\nurl: postgres://cp@db/slim?sslmode=disable\ndirect_url: host=db user=cp";
        let (config, _) = parse_env(yaml, &env).unwrap();
        let want = pg(
            "postgres://cp@db/slim?sslmode=disable&password=p%40ss%20w%27rd",
            Some("host=db user=cp password='p@ss w\\'rd'"),
            DEFAULT_POOL_SIZE,
        );
        assert_eq!(config, want);
        let DatabaseConfig::Postgres {
            url, direct_url, ..
        } = config
        else {
            unreachable!()
        };
        for u in [url, direct_url.unwrap_or_default()] {
            let parsed: tokio_postgres::Config = u.parse().unwrap();
            assert_eq!(parsed.get_password(), Some("p@ss w'rd".as_bytes()));
        }
        let yaml = "type: postgres\nurl: postgres://cp:own@db/slim";
        let (config, _) = parse_env(yaml, &env).unwrap();
        assert_eq!(
            config,
            pg("postgres://cp:own@db/slim", None, DEFAULT_POOL_SIZE)
        );
    }

    #[test]
    fn postgres_errors_name_the_key_and_hide_the_url() {
        let err = parse("type: postgres").unwrap_err();
        assert!(
            err.starts_with("database.url") && err.contains(URL_ENV),
            "{err}"
        );
        let err = parse("type: postgres\nurl: postgres://u:hunter2@db:port/x").unwrap_err();
        assert!(
            err.starts_with("database.url") && !err.contains("hunter2"),
            "{err}"
        );
        let err = parse("type: postgres\nurl: postgres://db/x\npool_size: 0").unwrap_err();
        assert!(err.starts_with("database.pool_size"), "{err}");
    }

    #[test]
    fn debug_redacts_every_password() {
        let config = pg(
            "postgres://cp:hunter2@db/slim?password=hunter2&sslmode=disable",
            Some("host=db password='hunter 2' user=cp"),
            4,
        );
        let text = format!("{config:?}");
        assert!(!text.contains("hunter"), "{text}");
        assert!(
            text.contains("cp:***@db/slim?password=***&sslmode=disable"),
            "{text}"
        );
        assert!(text.contains("host=db password=*** user=cp"), "{text}");
    }
}
