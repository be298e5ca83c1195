//! YAML configuration.
//!
//! A file written for the reference control plane loads unchanged: the same
//! sections (`tracing`, `northbound`, `southbound`, `database`, `topology`,
//! `reconciler`), the same keys and defaults, and the same `${env:NAME}` /
//! `${file:PATH}` references. Keys the reference accepts but slim-cp does
//! not implement (HTTP/2 tuning, keepalive, OpenTelemetry...) are accepted
//! and listed by [`Config::ignored_keys`] so the binary can warn about each.
//!
//! Unlike the reference, unknown keys are errors (the reference ignores
//! most of them): a misspelt key silently falling back to its default is
//! the kind of mistake an operator only finds in an outage. Errors name the
//! key as a dotted path and, when known, the line.
//!
//! An empty file, or no file ([`Config::default`]), is a valid single-replica
//! configuration: plaintext listeners on 50051/50052, memory store, API mode.

mod cluster;
mod database;
mod duration;
mod error;
mod logging;
mod ops;
mod reconciler;
mod resolve;
mod secret;
mod server;
mod tls;
mod topology;

use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use cluster::ClusterConfig;
pub use database::DatabaseConfig;
pub use duration::parse_duration;
pub use error::ConfigError;
pub use logging::TracingConfig;
pub use ops::{DrainConfig, HttpConfig};
pub use reconciler::ReconcilerConfig;
pub use secret::SharedSecret;
pub use server::ServerConfig;
pub use tls::TlsServerConfig;
pub use topology::{
    AdjacencyEntry, RegistrationAuthConfig, SegmentConfig, SpireBundleSource, TopologyConfig,
    TopologySettings,
};

/// Operator API listener when the section or its endpoint is absent.
pub const DEFAULT_NORTHBOUND_ENDPOINT: &str = "0.0.0.0:50051";
/// Node stream listener when the section or its endpoint is absent.
pub const DEFAULT_SOUTHBOUND_ENDPOINT: &str = "0.0.0.0:50052";
/// The file the reference looks for when no path is given.
pub const DEFAULT_CONFIG_FILE: &str = "config.yaml";

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Logging.
    pub tracing: TracingConfig,
    /// Operator API (slimctl) listener.
    pub northbound: ServerConfig,
    /// Data-plane node listener.
    pub southbound: ServerConfig,
    /// Where state is kept.
    pub database: DatabaseConfig,
    /// Topology mode and registration authentication.
    pub topology: TopologySettings,
    /// Reconciler tuning.
    pub reconciler: ReconcilerConfig,
    /// How replicas on one Postgres database work together.
    pub cluster: ClusterConfig,
    /// Health, readiness and metrics over HTTP.
    pub http: HttpConfig,
    /// How the replica hands its nodes over before it stops.
    pub drain: DrainConfig,
    /// Keys accepted for compatibility but without effect (dotted paths).
    ignored: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            tracing: TracingConfig::default(),
            northbound: ServerConfig::insecure("northbound", DEFAULT_NORTHBOUND_ENDPOINT),
            southbound: ServerConfig::insecure("southbound", DEFAULT_SOUTHBOUND_ENDPOINT),
            database: DatabaseConfig::default(),
            topology: TopologySettings::default(),
            reconciler: ReconcilerConfig::default(),
            cluster: ClusterConfig::default(),
            http: HttpConfig::default(),
            drain: DrainConfig::default(),
            ignored: Vec::new(),
        }
    }
}

impl Config {
    /// Parses and validates a configuration document, with the process's
    /// environment for `${env:NAME}` and the keys it may set.
    pub fn from_yaml_str(text: &str) -> Result<Config, ConfigError> {
        Config::from_yaml_str_with_env(text, &|name| std::env::var(name).ok())
    }

    /// As [`Config::from_yaml_str`], reading the environment through `env`:
    /// checks of a deployment's files load them with the environment its
    /// containers would get, without touching this process's.
    pub fn from_yaml_str_with_env(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let mut tree: yaml_serde::Value =
            yaml_serde::from_str(text).map_err(|e| ConfigError::from_syntax(&e))?;
        if tree.is_null() {
            // Empty, or only comments.
            return Ok(Config::default());
        }
        if !tree.is_mapping() {
            return Err(ConfigError::invalid(
                "(top level)",
                "the configuration must be a mapping of sections (tracing, northbound, \
                 southbound, database, topology, reconciler)",
            ));
        }
        // Parse the text itself when nothing was expanded, so that errors
        // carry line numbers; after expansion only the tree is right.
        let raw: RawConfig = if resolve::expand_references(&mut tree, env)? {
            serde_path_to_error::deserialize(tree)
        } else {
            serde_path_to_error::deserialize(yaml_serde::Deserializer::from_str(text))
        }
        .map_err(ConfigError::from_typed)?;
        let config = raw.into_config(env)?;
        config.validate()?;
        Ok(config)
    }

    /// Reads, parses and validates `path`. Errors name the file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Io {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        Config::from_yaml_str(&text).map_err(|e| e.in_file(path.to_path_buf()))
    }

    /// The reference's lookup: an explicit path must load; without one,
    /// `config.yaml` in the working directory is used if it exists, and
    /// the defaults otherwise. Returns the file actually read, if any.
    pub fn load_or_default(
        explicit: Option<&Path>,
    ) -> Result<(Config, Option<PathBuf>), ConfigError> {
        let path = match explicit {
            Some(path) => path.to_path_buf(),
            None => {
                let fallback = PathBuf::from(DEFAULT_CONFIG_FILE);
                if !fallback.exists() {
                    return Ok((Config::default(), None));
                }
                fallback
            }
        };
        Ok((Config::load(&path)?, Some(path)))
    }

    /// Checks the whole configuration; [`Config::from_yaml_str`] runs it,
    /// and code that builds or edits a `Config` should too.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.tracing.validate()?;
        self.northbound.validate()?;
        self.southbound.validate()?;
        if self.northbound.endpoint == self.southbound.endpoint {
            return Err(ConfigError::invalid(
                "southbound.endpoint",
                format!(
                    "{:?} is also northbound.endpoint; the two APIs need separate ports",
                    self.southbound.endpoint
                ),
            ));
        }
        self.reconciler.validate()?;
        self.cluster.validate()?;
        self.http.validate()?;
        self.drain.validate()?;
        self.topology.validate()
    }

    /// Keys present in the file that slim-cp accepts for compatibility with
    /// the reference but does not act on, as dotted paths
    /// (`northbound.keepalive`). The binary logs a warning for each.
    pub fn ignored_keys(&self) -> Vec<String> {
        self.ignored.clone()
    }
}

/// The document as written; each section converts itself, recording keys
/// it ignores.
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawConfig {
    tracing: Option<logging::RawTracing>,
    northbound: Option<server::RawServer>,
    southbound: Option<server::RawServer>,
    database: Option<database::RawDatabase>,
    topology: Option<topology::RawTopology>,
    reconciler: Option<ReconcilerConfig>,
    cluster: Option<cluster::RawCluster>,
    http: Option<HttpConfig>,
    drain: Option<DrainConfig>,
}

impl RawConfig {
    fn into_config(self, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let mut ignored = Vec::new();
        let tracing = match self.tracing {
            Some(raw) => raw.into_config(&mut ignored),
            None => TracingConfig::default(),
        };
        let northbound = listener(
            self.northbound,
            "northbound",
            DEFAULT_NORTHBOUND_ENDPOINT,
            &mut ignored,
        )?;
        let southbound = listener(
            self.southbound,
            "southbound",
            DEFAULT_SOUTHBOUND_ENDPOINT,
            &mut ignored,
        )?;
        let database = match self.database {
            Some(raw) => raw.into_config_with(&mut ignored, env)?,
            None => DatabaseConfig::default(),
        };
        let topology = match self.topology {
            Some(raw) => raw.into_config(&mut ignored)?,
            None => TopologySettings::default(),
        };
        if self.cluster.is_some() && database == DatabaseConfig::Memory {
            // One replica: nothing to elect, relay or time.
            ignored.push("cluster".into());
        }
        // Without a section too: Kubernetes sets the per-pod keys in the
        // environment of a shared file.
        let cluster = self.cluster.unwrap_or_default().into_config(env)?;
        Ok(Config {
            tracing,
            northbound,
            southbound,
            database,
            topology,
            reconciler: self.reconciler.unwrap_or_default(),
            cluster,
            http: self.http.unwrap_or_default(),
            drain: self.drain.unwrap_or_default(),
            ignored,
        })
    }
}

/// An absent section is the reference's plaintext default listener.
fn listener(
    raw: Option<server::RawServer>,
    section: &'static str,
    endpoint: &str,
    ignored: &mut Vec<String>,
) -> Result<ServerConfig, ConfigError> {
    match raw {
        Some(raw) => raw.into_config(section, endpoint, ignored),
        None => Ok(ServerConfig::insecure(section, endpoint)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_comment_only_documents_are_defaults() {
        for text in ["", "\n", "# nothing here\n", "~\n", "---\n"] {
            assert_eq!(
                Config::from_yaml_str(text).unwrap(),
                Config::default(),
                "{text:?}"
            );
        }
        assert!(Config::default().validate().is_ok());
    }

    #[test]
    fn null_sections_are_defaults() {
        let config =
            Config::from_yaml_str("tracing:\nnorthbound:\ntopology:\nreconciler:\n").unwrap();
        assert_eq!(config, Config::default());
    }

    #[test]
    fn non_mapping_document_refused() {
        let err = Config::from_yaml_str("- a\n- b\n").unwrap_err();
        assert_eq!(err.key(), Some("(top level)"));
    }

    #[test]
    fn same_port_for_both_apis_refused() {
        let yaml = "northbound: {endpoint: '0.0.0.0:7000', tls: {insecure: true}}\n\
                    southbound: {endpoint: '0.0.0.0:7000', tls: {insecure: true}}\n";
        let err = Config::from_yaml_str(yaml).unwrap_err();
        assert_eq!(err.key(), Some("southbound.endpoint"));
    }

    #[test]
    fn load_or_default_requires_an_explicit_file() {
        let missing = Path::new("/nonexistent/slim-cp/config.yaml");
        let err = Config::load_or_default(Some(missing)).unwrap_err();
        assert!(matches!(err, ConfigError::Io { .. }), "{err}");
    }
}
