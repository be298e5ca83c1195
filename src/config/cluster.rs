//! The `cluster:` section: how replicas sharing one Postgres database find,
//! trust and time each other. Only meaningful with `database.type:
//! postgres`; the memory store is a single replica and ignores it.
//!
//! ```yaml
//! cluster:
//!   replica_id: cp-0               # or SLIM_CP_REPLICA_ID; else the hostname
//!   relay:
//!     endpoint: 0.0.0.0:50053      # replica-to-replica listener
//!     advertise: cp-0.cp:50053     # or SLIM_CP_RELAY_ADVERTISE: what peers dial
//!     secret: ${env:RELAY_SECRET}  # or SLIM_CP_CLUSTER_SECRET; else kept in the database
//!   lease: 5s                      # a silent leader is replaced after this
//!   renew: 1s
//!   heartbeat: 1s
//!   replica_ttl: 10s               # a silent replica's sessions end after this
//! ```
//!
//! Per-pod values come from the environment in Kubernetes, so the
//! environment overrides the file for the replica id, the advertised
//! address and the secret.

use std::time::Duration;

use serde::Deserialize;

use super::server::split_endpoint;
use super::{ConfigError, SharedSecret, duration};

/// The replica id, over the file's.
pub const REPLICA_ID_ENV: &str = "SLIM_CP_REPLICA_ID";
/// The relay address peers dial, over the file's.
pub const ADVERTISE_ENV: &str = "SLIM_CP_RELAY_ADVERTISE";
/// The relay secret, over the file's.
pub const SECRET_ENV: &str = "SLIM_CP_CLUSTER_SECRET";

/// The relay listener unless `relay.endpoint` says otherwise.
pub const DEFAULT_RELAY_ENDPOINT: &str = "0.0.0.0:50053";

/// Replica ids become Postgres keys and log fields: keep them plain.
const MAX_ID_LEN: usize = 128;

/// How replicas of one cluster work together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// This replica's stable id; `None`: the hostname, resolved at start.
    pub replica_id: Option<String>,
    /// `host:port` the relay listens on.
    pub relay_endpoint: String,
    /// `host:port` peers dial to reach this replica's relay; `None`: the
    /// listener's own host if it names one, else the hostname.
    pub relay_advertise: Option<String>,
    /// Relay authentication; `None`: a secret generated once and kept in
    /// the database (every replica that can read the database shares it).
    pub secret: Option<SharedSecret>,
    /// A leader whose renewals stop is replaced after this long.
    pub lease: Duration,
    /// How often the leader renews its lease.
    pub renew: Duration,
    /// How often each replica proves it is alive.
    pub heartbeat: Duration,
    /// A replica silent for this long is declared dead and its sessions end.
    pub replica_ttl: Duration,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            replica_id: None,
            relay_endpoint: DEFAULT_RELAY_ENDPOINT.into(),
            relay_advertise: None,
            secret: None,
            lease: Duration::from_secs(5),
            renew: Duration::from_secs(1),
            heartbeat: Duration::from_secs(1),
            replica_ttl: Duration::from_secs(10),
        }
    }
}

impl ClusterConfig {
    /// Checks what the types cannot express. The timings must leave the
    /// leader at least two renewals per lease and a replica two heartbeats
    /// per TTL, so one slow round trip never costs leadership or sessions.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(id) = &self.replica_id {
            check_id(id).map_err(|m| ConfigError::invalid("cluster.replica_id", m))?;
        }
        split_endpoint(&self.relay_endpoint)
            .map_err(|m| ConfigError::invalid("cluster.relay.endpoint", m))?;
        if let Some(a) = &self.relay_advertise {
            split_endpoint(a).map_err(|m| ConfigError::invalid("cluster.relay.advertise", m))?;
        }
        let at_least_twice = |key: &str, short: Duration, long: Duration, what: &str| {
            if short.is_zero() || short * 2 > long {
                return Err(ConfigError::invalid(
                    key,
                    format!("must be greater than 0 and at most half of {what}"),
                ));
            }
            Ok(())
        };
        at_least_twice("cluster.renew", self.renew, self.lease, "cluster.lease")?;
        at_least_twice(
            "cluster.heartbeat",
            self.heartbeat,
            self.replica_ttl,
            "cluster.replica_ttl",
        )
    }
}

fn check_id(id: &str) -> Result<(), String> {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_.:".contains(c);
    if id.is_empty() || id.len() > MAX_ID_LEN || !id.chars().all(plain) {
        return Err(format!(
            "{id:?} is not a replica id: 1 to {MAX_ID_LEN} letters, digits, '-', '_', '.' or ':'"
        ));
    }
    Ok(())
}

/// The section as written; absent keys take [`ClusterConfig::default`]'s.
#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawCluster {
    replica_id: Option<String>,
    relay: Option<RawRelay>,
    #[serde(deserialize_with = "duration::deserialize")]
    lease: Duration,
    #[serde(deserialize_with = "duration::deserialize")]
    renew: Duration,
    #[serde(deserialize_with = "duration::deserialize")]
    heartbeat: Duration,
    #[serde(deserialize_with = "duration::deserialize")]
    replica_ttl: Duration,
}

impl Default for RawCluster {
    fn default() -> Self {
        let d = ClusterConfig::default();
        Self {
            replica_id: None,
            relay: None,
            lease: d.lease,
            renew: d.renew,
            heartbeat: d.heartbeat,
            replica_ttl: d.replica_ttl,
        }
    }
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawRelay {
    endpoint: Option<String>,
    advertise: Option<String>,
    secret: Option<SharedSecret>,
}

impl RawCluster {
    /// The configuration, with the environment (read through `env`) over
    /// the file for the per-pod keys.
    pub(super) fn into_config(
        self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ClusterConfig, ConfigError> {
        let relay = self.relay.unwrap_or_default();
        let secret = match env(SECRET_ENV).filter(|s| !s.is_empty()) {
            Some(s) => Some(SharedSecret::new(s).map_err(|m| {
                ConfigError::invalid("cluster.relay.secret", format!("{SECRET_ENV}: {m}"))
            })?),
            None => relay.secret,
        };
        let set = |v: Option<String>| v.filter(|s| !s.is_empty());
        Ok(ClusterConfig {
            replica_id: set(env(REPLICA_ID_ENV)).or(self.replica_id),
            relay_endpoint: relay
                .endpoint
                .unwrap_or_else(|| DEFAULT_RELAY_ENDPOINT.into()),
            relay_advertise: set(env(ADVERTISE_ENV)).or(relay.advertise),
            secret,
            lease: self.lease,
            renew: self.renew,
            heartbeat: self.heartbeat,
            replica_ttl: self.replica_ttl,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str, env: &[(&str, &str)]) -> Result<ClusterConfig, ConfigError> {
        let raw: RawCluster = yaml_serde::from_str(yaml).expect("yaml");
        let env = |k: &str| {
            env.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        };
        let config = raw.into_config(&env)?;
        config.validate()?;
        Ok(config)
    }

    #[test]
    fn an_empty_section_has_safe_defaults() {
        let c = parse("{}", &[]).unwrap();
        assert_eq!(c, ClusterConfig::default());
        assert!(c.renew * 2 <= c.lease && c.heartbeat * 2 <= c.replica_ttl);
    }

    #[test]
    fn the_environment_overrides_the_per_pod_keys() {
        let yaml = "replica_id: from-file\nrelay: {advertise: 'file:1'}\n";
        let secret = "s".repeat(32);
        let env = [
            (REPLICA_ID_ENV, "cp-2"),
            (ADVERTISE_ENV, "10.0.0.7:50053"),
            (SECRET_ENV, secret.as_str()),
        ];
        let c = parse(yaml, &env).unwrap();
        assert_eq!(c.replica_id.as_deref(), Some("cp-2"));
        assert_eq!(c.relay_advertise.as_deref(), Some("10.0.0.7:50053"));
        assert_eq!(c.secret.map(|s| s.expose().len()), Some(32));
    }

    #[test]
    fn timings_that_leave_no_margin_are_refused() {
        let err = parse("lease: 2s\nrenew: 1500ms\n", &[]).unwrap_err();
        assert_eq!(err.key(), Some("cluster.renew"));
        let err = parse("heartbeat: 0s\n", &[]).unwrap_err();
        assert_eq!(err.key(), Some("cluster.heartbeat"));
    }

    #[test]
    fn odd_ids_and_addresses_are_refused() {
        let err = parse("replica_id: 'a b'\n", &[]).unwrap_err();
        assert_eq!(err.key(), Some("cluster.replica_id"));
        let err = parse("relay: {advertise: 'http://x:1'}\n", &[]).unwrap_err();
        assert_eq!(err.key(), Some("cluster.relay.advertise"));
        let short = parse("{}", &[(SECRET_ENV, "short")]).unwrap_err();
        assert_eq!(short.key(), Some("cluster.relay.secret"));
        assert!(!short.to_string().contains("short\""), "{short}");
    }
}
