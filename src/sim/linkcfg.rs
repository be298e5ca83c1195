//! The parts of a connection's `config_data` that a node acts on, and
//! endpoint normalisation for the simulated network.
//!
//! The real node deserialises `config_data` as its gRPC client
//! configuration (JSON): `endpoint` is required, `link_id` defaults to a
//! fresh UUID, `connection_type` to `edge` (so a control plane that forgets
//! `"connection_type": "remote"` creates a link the node never treats as
//! control-plane managed). Unknown fields are ignored.

use serde::Deserialize;

use crate::proto::sb;

/// The fields of the client configuration the simulator uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkConfig {
    /// Endpoint to dial, as written (`http://host:port`, `host:port`, ...).
    pub endpoint: String,
    /// Link id carried in the configuration, if any.
    pub link_id: Option<String>,
    /// Connection type (`remote`, `peer` or `edge`; default `edge`).
    pub conn_type: sb::ConnectionType,
}

#[derive(Deserialize)]
struct RawConfig {
    endpoint: String,
    #[serde(default)]
    link_id: Option<String>,
    #[serde(default)]
    connection_type: Option<String>,
}

/// Parses `config_data` as the node does (JSON); the error is the parser's
/// message, which the node reports as `Failed to parse config: {error}`.
pub fn parse_config(data: &str) -> Result<LinkConfig, String> {
    let raw: RawConfig = serde_json::from_str(data).map_err(|e| e.to_string())?;
    let conn_type = match raw.connection_type.as_deref() {
        None | Some("edge") => sb::ConnectionType::Edge,
        Some("remote") => sb::ConnectionType::Remote,
        Some("peer") => sb::ConnectionType::Peer,
        Some(other) => {
            return Err(format!(
                "unknown variant `{other}`, expected one of `remote`, `peer`, `edge`"
            ));
        }
    };
    let link_id = raw.link_id.filter(|l| !l.trim().is_empty());
    Ok(LinkConfig {
        endpoint: raw.endpoint,
        link_id,
        conn_type,
    })
}

/// The server requirements a 3.x node reads from the connections of a
/// full-state reconcile (its registration response): `endpoint`,
/// `tls_required` and `auth_method` required, `backoff` a number of
/// milliseconds if present. The link id and type come from the connection
/// (the node makes every such link `remote`).
#[derive(Deserialize)]
struct RawRequirements {
    endpoint: String,
    // Read only to fail as the node fails when they are missing or amiss.
    #[serde(rename = "tls_required")]
    _tls_required: bool,
    #[serde(rename = "auth_method")]
    _auth_method: serde_json::Value,
    #[serde(rename = "backoff", default)]
    _backoff: Option<u32>,
}

/// Parses `config_data` as a 3.x node reads its registration response's
/// connections; the error is the parser's message.
pub fn parse_requirements(data: &str) -> Result<LinkConfig, String> {
    let raw: RawRequirements = serde_json::from_str(data).map_err(|e| e.to_string())?;
    Ok(LinkConfig {
        endpoint: raw.endpoint,
        link_id: None,
        conn_type: sb::ConnectionType::Remote,
    })
}

/// A normalised data-plane address: lower-case host without brackets, port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Addr {
    /// Host name or IP literal.
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl Addr {
    /// Whether the host is a wildcard listen address (`0.0.0.0`, `::`, empty).
    pub fn is_wildcard(&self) -> bool {
        matches!(self.host.as_str(), "" | "0.0.0.0" | "::" | "[::]")
    }

    /// `host:port` (IPv6 hosts bracketed).
    pub fn key(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// Parses `scheme://host:port/path`, `host:port` or `[v6]:port`.
pub fn parse_addr(endpoint: &str) -> Option<Addr> {
    let rest = endpoint.trim();
    let rest = rest.split_once("://").map_or(rest, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or_default();
    let authority = authority.rsplit('@').next().unwrap_or_default();
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        (host, after.strip_prefix(':')?)
    } else {
        authority.rsplit_once(':')?
    };
    let port = port.parse().ok()?;
    Some(Addr {
        host: host.to_ascii_lowercase(),
        port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_node_client_config() {
        let cfg = parse_config(
            r#"{"endpoint":"http://10.0.0.1:46357","link_id":"L1","connection_type":"remote","tls":{"insecure":true}}"#,
        )
        .unwrap();
        assert_eq!(cfg.endpoint, "http://10.0.0.1:46357");
        assert_eq!(cfg.link_id.as_deref(), Some("L1"));
        assert_eq!(cfg.conn_type, sb::ConnectionType::Remote);
        let bare = parse_config(r#"{"endpoint": "h:1"}"#).unwrap();
        assert_eq!(bare.conn_type, sb::ConnectionType::Edge);
        assert_eq!(bare.link_id, None);
    }

    #[test]
    fn rejects_what_the_node_rejects() {
        assert!(parse_config("{invalid-json").is_err());
        assert!(parse_config(r#"{"link_id":"x"}"#).is_err());
        assert_eq!(
            parse_config("endpoint: h:1").unwrap_err(),
            "expected value at line 1 column 1"
        );
        assert!(parse_config(r#"{"endpoint":"h:1","connection_type":"local"}"#).is_err());
    }

    #[test]
    fn normalises_addresses() {
        let a = parse_addr("http://LocalHost:80/x").unwrap();
        assert_eq!(a.key(), "localhost:80");
        let b = parse_addr("[::1]:7").unwrap();
        assert_eq!((b.host.as_str(), b.port), ("::1", 7));
        assert_eq!(b.key(), "[::1]:7");
        assert!(parse_addr("0.0.0.0:9").unwrap().is_wildcard());
        assert!(parse_addr("nohost").is_none());
        assert!(parse_addr("h:notaport").is_none());
    }
}
