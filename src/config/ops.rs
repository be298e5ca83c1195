//! The `http:` and `drain:` sections: the endpoint load balancers,
//! orchestrators and Prometheus use, and how a replica hands its nodes
//! over before it stops.
//!
//! ```yaml
//! http:
//!   endpoint: 0.0.0.0:9090   # /healthz, /readyz, /metrics
//!   enabled: true            # default: on with Postgres, off on memory
//! drain:
//!   lb_grace: 3s             # not-ready and not listening, before streams close
//!   batch: 100               # streams closed at a time
//!   interval: 1s             # between batches
//! ```

use std::time::Duration;

use serde::Deserialize;

use super::server::split_endpoint;
use super::{ConfigError, duration};

/// The HTTP endpoint unless `http.endpoint` says otherwise.
pub const DEFAULT_HTTP_ENDPOINT: &str = "0.0.0.0:9090";

/// The HTTP endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    pub endpoint: String,
    /// `None`: on with Postgres, off on the memory store.
    pub enabled: Option<bool>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            endpoint: DEFAULT_HTTP_ENDPOINT.into(),
            enabled: None,
        }
    }
}

impl HttpConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        split_endpoint(&self.endpoint)
            .map(|_| ())
            .map_err(|m| ConfigError::invalid("http.endpoint", m))
    }
}

/// How a replica hands its nodes over before it stops.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DrainConfig {
    /// How long the replica stays not-ready and not listening before it
    /// closes streams: long enough for the load balancer to take it out.
    #[serde(deserialize_with = "duration::deserialize")]
    pub lb_grace: Duration,
    /// Streams closed at a time, so their nodes re-register elsewhere
    /// without a storm.
    pub batch: usize,
    /// Pause between batches.
    #[serde(deserialize_with = "duration::deserialize")]
    pub interval: Duration,
}

impl Default for DrainConfig {
    fn default() -> Self {
        Self {
            lb_grace: Duration::from_secs(3),
            batch: 100,
            interval: Duration::from_secs(1),
        }
    }
}

impl DrainConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.batch == 0 {
            return Err(ConfigError::invalid(
                "drain.batch",
                "must be at least 1 (no stream would ever close)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_checks() {
        assert!(HttpConfig::default().validate().is_ok());
        let bad = HttpConfig {
            endpoint: "nowhere".into(),
            ..HttpConfig::default()
        };
        assert_eq!(bad.validate().unwrap_err().key(), Some("http.endpoint"));
        let zero = DrainConfig {
            batch: 0,
            ..DrainConfig::default()
        };
        assert_eq!(zero.validate().unwrap_err().key(), Some("drain.batch"));
    }
}
