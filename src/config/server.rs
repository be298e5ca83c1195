//! The `northbound:` and `southbound:` listeners.
//!
//! The reference control plane reads these with the data plane's
//! `ServerConfig` (agntcy-slim-config 0.12): `endpoint`, `tls`, plus HTTP/2,
//! keepalive, auth and link-negotiation knobs. slim-cp serves the endpoint
//! with TLS from files; the tuning knobs are accepted and reported so the
//! binary can warn about them. What would weaken security if dropped
//! (server `auth`, TLS material slim-cp cannot load) is refused instead:
//! an operator who asked for authentication must not get an open port.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};

use serde::Deserialize;
use serde::de::{self, IgnoredAny, MapAccess, Visitor};

use super::ConfigError;
use super::tls::{RawTls, TlsServerConfig};

/// One gRPC listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// The section this came from (`northbound`, `southbound`), so that
    /// errors found later can name the key.
    pub section: &'static str,
    /// `host:port` to listen on, e.g. `0.0.0.0:50051` or `[::]:50052`.
    pub endpoint: String,
    /// TLS settings (YAML key `tls`).
    pub tls: TlsServerConfig,
}

impl ServerConfig {
    /// A plaintext listener, as the reference uses when the section is absent.
    pub fn insecure(section: &'static str, endpoint: impl Into<String>) -> Self {
        Self {
            section,
            endpoint: endpoint.into(),
            tls: TlsServerConfig::insecure(),
        }
    }

    /// The address to bind. A host name is resolved (first address wins).
    pub fn socket_addr(&self) -> Result<SocketAddr, ConfigError> {
        let key = format!("{}.endpoint", self.section);
        let (host, port) =
            split_endpoint(&self.endpoint).map_err(|m| ConfigError::invalid(&key, m))?;
        if let Ok(addr) = self.endpoint.parse::<SocketAddr>() {
            return Ok(addr);
        }
        let resolved = (host, port).to_socket_addrs().map_err(|e| {
            ConfigError::invalid(&key, format!("cannot resolve {:?}: {e}", self.endpoint))
        })?;
        resolved.into_iter().next().ok_or_else(|| {
            ConfigError::invalid(&key, format!("{:?} resolves to no address", self.endpoint))
        })
    }

    /// Syntax checks only (no DNS), so a config can be checked anywhere.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let key = format!("{}.endpoint", self.section);
        split_endpoint(&self.endpoint).map_err(|m| ConfigError::invalid(key, m))?;
        self.tls.validate(self.section)
    }
}

/// Splits `host:port`, explaining the schemes the reference's endpoint
/// syntax allows but a control-plane listener cannot use.
pub(crate) fn split_endpoint(endpoint: &str) -> Result<(&str, u16), String> {
    if let Some((scheme, _)) = endpoint.split_once("://") {
        let why = match scheme {
            "unix" => "unix sockets are not supported; listen on host:port",
            "ws" | "wss" => "the control plane serves gRPC, not websockets; use host:port",
            _ => "give host:port without a scheme (TLS is set under `tls`)",
        };
        return Err(format!("{endpoint:?}: {why}"));
    }
    let not_host_port = || format!("{endpoint:?} is not host:port");
    let (host, port) = endpoint.rsplit_once(':').ok_or_else(not_host_port)?;
    let port: u16 = port.parse().map_err(|_| not_host_port())?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let bracketed = endpoint.starts_with('[');
    if host.is_empty() || (host.contains(':') && !bracketed) {
        return Err(not_host_port());
    }
    Ok((host, port))
}

/// The section as written: slim-cp's keys, then every other key of the
/// reference's `ServerConfig`, accepted without effect.
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawServer {
    endpoint: Option<String>,
    tls: Option<RawTls>,
    auth: Option<ServerAuth>,
    http2_only: Option<IgnoredAny>,
    max_frame_size: Option<IgnoredAny>,
    max_concurrent_streams: Option<IgnoredAny>,
    max_header_list_size: Option<IgnoredAny>,
    read_buffer_size: Option<IgnoredAny>,
    write_buffer_size: Option<IgnoredAny>,
    keepalive: Option<IgnoredAny>,
    metadata: Option<IgnoredAny>,
    require_header_mac: Option<IgnoredAny>,
    negotiation_timeout_secs: Option<IgnoredAny>,
    link_hmac_timeout_secs: Option<IgnoredAny>,
    link_hmac_poll_interval_ms: Option<IgnoredAny>,
}

impl RawServer {
    /// `default_endpoint` is used when the key is missing (the reference
    /// requires it; defaulting is harmless and friendlier).
    pub(super) fn into_config(
        self,
        section: &'static str,
        default_endpoint: &str,
        ignored: &mut Vec<String>,
    ) -> Result<ServerConfig, ConfigError> {
        ignored.extend(self.ignored_keys().map(|k| format!("{section}.{k}")));
        // As in the reference: a section without `tls` gets the TLS
        // defaults (insecure: false), not the plaintext of an absent section.
        let tls = self.tls.unwrap_or_default().into_config(section, ignored)?;
        Ok(ServerConfig {
            section,
            endpoint: self
                .endpoint
                .unwrap_or_else(|| default_endpoint.to_string()),
            tls,
        })
    }

    fn ignored_keys(&self) -> impl Iterator<Item = &'static str> {
        macro_rules! present {
            ($($field:ident),*) => {
                [$((stringify!($field), self.$field.is_some())),*]
            };
        }
        let auth_none = matches!(self.auth, Some(ServerAuth::None));
        let fields = present!(
            http2_only,
            max_frame_size,
            max_concurrent_streams,
            max_header_list_size,
            read_buffer_size,
            write_buffer_size,
            keepalive,
            metadata,
            require_header_mac,
            negotiation_timeout_secs,
            link_hmac_timeout_secs,
            link_hmac_poll_interval_ms
        );
        let auth = [("auth", auth_none)];
        fields
            .into_iter()
            .chain(auth)
            .filter(|(_, present)| *present)
            .map(|(key, _)| key)
    }
}

/// The reference's server `auth` (basic, jwt, spire). Only `type: none` is
/// accepted: slim-cp does not implement the others, and serving without
/// the authentication the operator configured would be a silent downgrade.
enum ServerAuth {
    None,
}

impl<'de> Deserialize<'de> for ServerAuth {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(AuthVisitor)
    }
}

struct AuthVisitor;

impl<'de> Visitor<'de> for AuthVisitor {
    type Value = ServerAuth;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping with `type`")
    }

    /// Reads only `type`: the other keys of the refused kinds hold
    /// credentials, which must stay out of error messages. Refusing here,
    /// inside the mapping, makes the error point at it.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ServerAuth, A::Error> {
        let mut kind: Option<String> = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == "type" {
                kind = Some(map.next_value()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        match kind.as_deref() {
            None | Some("none") => Ok(ServerAuth::None),
            Some(kind) => Err(de::Error::custom(format!(
                "server authentication `type: {kind}` is not supported by slim-cp; \
                 remove it (or set `type: none`) and protect this listener with mTLS \
                 (`tls.client_ca`) or an authenticating proxy"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(endpoint: &str) -> ServerConfig {
        ServerConfig::insecure("northbound", endpoint)
    }

    #[test]
    fn socket_addr_forms() {
        assert_eq!(
            server("0.0.0.0:50051").socket_addr().unwrap(),
            "0.0.0.0:50051".parse::<SocketAddr>().unwrap()
        );
        assert!(server("[::]:50052").socket_addr().unwrap().is_ipv6());
        assert!(
            server("localhost:50051")
                .socket_addr()
                .unwrap()
                .ip()
                .is_loopback()
        );
    }

    #[test]
    fn socket_addr_errors_name_the_key() {
        let err = server("foo").socket_addr().unwrap_err().to_string();
        assert_eq!(err, "northbound.endpoint: \"foo\" is not host:port");
        for bad in ["0.0.0.0:99999", ":50051", "::1:50051", "0.0.0.0:"] {
            assert!(server(bad).validate().is_err(), "{bad}");
        }
        let err = server("unix:///tmp/cp.sock")
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("unix sockets are not supported"), "{err}");
        let err = server("http://0.0.0.0:1")
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("without a scheme"), "{err}");
    }

    #[test]
    fn auth_none_accepted_other_kinds_refused_without_echoing_secrets() {
        let raw: RawServer = yaml_serde::from_str("auth: {type: none}").unwrap();
        assert!(raw.ignored_keys().any(|k| k == "auth"));
        let yaml = "auth:\n  type: basic\n  username: admin\n  password: hunter2\n";
        let err = yaml_serde::from_str::<RawServer>(yaml)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("`type: basic` is not supported"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }
}
