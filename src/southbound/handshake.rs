//! Turning a `RegisterNodeRequest` into registration facts: validation, the
//! effective node id, and wildcard endpoint hosts replaced by the peer's IP.

use std::net::IpAddr;

use crate::limits::{self, LimitError};
use crate::names;
use crate::proto::details::{Form, Revision};
use crate::proto::sb;
use crate::store::model::{ConnectionDetail, Name, Registration, ReportedConnection, SpireMtls};

/// Why a registration is refused for good (a restart of the node would not
/// cure it): answered with `success: false`.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Refusal {
    #[error("node_id is empty")]
    EmptyNodeId,
    #[error("{field} must not contain control characters")]
    ControlCharacters { field: &'static str },
    #[error(transparent)]
    Limit(#[from] LimitError),
    #[error("registration credentials rejected: {0}")]
    Unauthenticated(String),
    /// The store refused the registration for a reason no retry cures.
    #[error("the registration cannot be recorded: {0}")]
    Store(String),
}

impl Refusal {
    /// Its reason, as metrics label it.
    pub fn label(&self) -> &'static str {
        match self {
            Refusal::EmptyNodeId => "empty_node_id",
            Refusal::ControlCharacters { .. } => "control_characters",
            Refusal::Limit(LimitError::TooLong { .. }) => "too_long",
            Refusal::Limit(LimitError::TooMany { .. }) => "too_many",
            Refusal::Unauthenticated(_) => "unauthenticated",
            Refusal::Store(_) => "store_refused",
        }
    }
}

/// A link id worth keeping: not empty, no control characters, no longer
/// than any id the control plane makes.
pub fn is_link_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= limits::MAX_ID_BYTES && !id.chars().any(char::is_control)
}

/// `"{group}/{node_id}"` with a group, the bare id without one.
pub fn effective_id(node_id: &str, group: Option<&str>) -> String {
    match group {
        Some(g) => format!("{g}/{node_id}"),
        None => node_id.to_string(),
    }
}

/// The group, with an empty string meaning none.
pub fn group_of(req: &sb::RegisterNodeRequest) -> Option<&str> {
    req.group_name.as_deref().filter(|g| !g.is_empty())
}

/// Validates the request and builds the registration facts. `peer` is the
/// address the stream came from, if known.
pub fn registration(
    req: &sb::RegisterNodeRequest,
    peer: Option<IpAddr>,
) -> Result<Registration, Refusal> {
    super::validate::check_registration(req)?;
    let group = group_of(req);
    Ok(Registration {
        // Chosen here so the node can be answered even before the store
        // has recorded the session.
        session_id: uuid::Uuid::new_v4(),
        node_id: effective_id(&req.node_id, group),
        group: group.map(str::to_string),
        connection_details: req
            .connection_details
            .iter()
            .map(|d| connection_detail(d, peer))
            .collect(),
        reported_connections: req.connections.iter().filter_map(reported).collect(),
        revision: revision_of(req),
        reported_routes: req
            .routes
            .iter()
            .filter_map(|r| r.name.as_ref())
            .filter_map(|n| names::from_wire(n).ok())
            .collect::<Vec<Name>>(),
        stale_after: None,
    })
}

/// A connection the node holds, if it carries a link id (the control plane
/// manages only those).
fn reported(entry: &sb::ConnectionEntry) -> Option<ReportedConnection> {
    let link_id = entry.link_id.as_deref().filter(|l| is_link_id(l))?;
    Some(ReportedConnection {
        link_id: link_id.to_string(),
        incoming: entry.direction == sb::ConnectionDirection::Incoming as i32,
    })
}

/// 3.x when any listener came in the 3.x form. A 3.x node that sends no
/// 3.x field is indistinguishable from a 2.0.0-alpha.2 one and is served
/// as one (see `routing::linkconfig` for what that costs).
pub fn revision_of(req: &sb::RegisterNodeRequest) -> Revision {
    let v3 = req
        .connection_details
        .iter()
        .any(|d| d.revision() == Revision::V3);
    if v3 { Revision::V3 } else { Revision::V2 }
}

fn connection_detail(d: &sb::ConnectionDetails, peer: Option<IpAddr>) -> ConnectionDetail {
    ConnectionDetail {
        endpoint: rewrite_wildcard_host(&d.endpoint, peer),
        external_endpoint: d.external_endpoint.clone().filter(|e| !e.is_empty()),
        spire_mtls: d.spire_mtls.as_ref().map(|s| SpireMtls {
            socket_path: s.socket_path.clone(),
            trust_domain: s.trust_domain.clone(),
        }),
        metadata: d.metadata.as_ref().map(struct_to_json).unwrap_or_default(),
        tls_required: d.tls_required,
        auth_method: d.auth_method,
        spire_trust_domain: d.spire_trust_domain.clone().filter(|t| !t.is_empty()),
    }
}

/// Replaces a wildcard or empty host (`0.0.0.0`, `::`, `[::]`, ``) with the
/// peer's IP, keeping any scheme and the port. Other hosts are kept as is.
pub fn rewrite_wildcard_host(endpoint: &str, peer: Option<IpAddr>) -> String {
    let Some(ip) = peer else {
        return endpoint.to_string();
    };
    let (scheme, rest) = match endpoint.find("://") {
        Some(i) => endpoint.split_at(i + 3),
        None => ("", endpoint),
    };
    let Some(colon) = rest.rfind(':') else {
        return endpoint.to_string();
    };
    let (host, port) = rest.split_at(colon);
    if !matches!(host, "" | "0.0.0.0" | "::" | "[::]") {
        return endpoint.to_string();
    }
    let ip = match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => format!("[{v6}]"),
        },
    };
    format!("{scheme}{ip}{port}")
}

/// NULs are dropped from keys and strings: no database text can hold one.
fn without_nul(s: &str) -> String {
    s.replace('\0', "")
}

fn struct_to_json(s: &prost_types::Struct) -> serde_json::Map<String, serde_json::Value> {
    s.fields
        .iter()
        .map(|(k, v)| (without_nul(k), value_to_json(v)))
        .collect()
}

fn value_to_json(v: &prost_types::Value) -> serde_json::Value {
    use prost_types::value::Kind;
    use serde_json::Value as J;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => J::Null,
        Some(Kind::NumberValue(n)) => serde_json::Number::from_f64(*n).map_or(J::Null, J::Number),
        Some(Kind::StringValue(s)) => J::String(without_nul(s)),
        Some(Kind::BoolValue(b)) => J::Bool(*b),
        Some(Kind::StructValue(s)) => J::Object(struct_to_json(s)),
        Some(Kind::ListValue(l)) => J::Array(l.values.iter().map(value_to_json).collect()),
    }
}

/// Stored connection details on the wire, written in `form`. A 2.0.0-alpha.2
/// node's SPIRE trust domain also fills the 3.x field, which the common
/// form carries.
pub fn detail_to_wire(d: &ConnectionDetail, form: Form) -> sb::ConnectionDetails {
    let spire_trust_domain = d.spire_trust_domain.clone().or_else(|| {
        let spire = d.spire_mtls.as_ref();
        spire.and_then(|s| s.trust_domain.clone())
    });
    sb::ConnectionDetails {
        endpoint: d.endpoint.clone(),
        external_endpoint: d.external_endpoint.clone(),
        spire_mtls: d
            .spire_mtls
            .as_ref()
            .map(|s| sb::connection_details::SpireMtls {
                socket_path: s.socket_path.clone(),
                trust_domain: s.trust_domain.clone(),
            }),
        metadata: (!d.metadata.is_empty()).then(|| json_to_struct(&d.metadata)),
        tls_required: d.tls_required,
        auth_method: d.auth_method,
        spire_trust_domain,
        form,
    }
}

fn json_to_struct(m: &serde_json::Map<String, serde_json::Value>) -> prost_types::Struct {
    prost_types::Struct {
        fields: m
            .iter()
            .map(|(k, v)| (k.clone(), json_to_value(v)))
            .collect(),
    }
}

fn json_to_value(v: &serde_json::Value) -> prost_types::Value {
    use prost_types::value::Kind;
    use serde_json::Value as J;
    let kind = match v {
        J::Null => Kind::NullValue(0),
        J::Bool(b) => Kind::BoolValue(*b),
        J::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        J::String(s) => Kind::StringValue(s.clone()),
        J::Array(a) => Kind::ListValue(prost_types::ListValue {
            values: a.iter().map(json_to_value).collect(),
        }),
        J::Object(o) => Kind::StructValue(json_to_struct(o)),
    };
    prost_types::Value { kind: Some(kind) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> Option<IpAddr> {
        "10.1.2.3".parse().ok()
    }

    #[test]
    fn wildcard_hosts_take_the_peer_ip() {
        for (given, want) in [
            ("0.0.0.0:46357", "10.1.2.3:46357"),
            ("[::]:46357", "10.1.2.3:46357"),
            (":46357", "10.1.2.3:46357"),
            ("http://0.0.0.0:46357", "http://10.1.2.3:46357"),
            ("node-a.example:46357", "node-a.example:46357"),
            ("127.0.0.1:1", "127.0.0.1:1"),
            ("no-port", "no-port"),
        ] {
            assert_eq!(rewrite_wildcard_host(given, peer()), want, "{given}");
        }
    }

    #[test]
    fn ipv6_peers_are_bracketed() {
        let v6: Option<IpAddr> = "fd00::7".parse().ok();
        assert_eq!(rewrite_wildcard_host("0.0.0.0:9", v6), "[fd00::7]:9");
        let mapped: Option<IpAddr> = "::ffff:10.0.0.9".parse().ok();
        assert_eq!(rewrite_wildcard_host("0.0.0.0:9", mapped), "10.0.0.9:9");
    }

    #[test]
    fn effective_id_prefixes_the_group() {
        let mut req = sb::RegisterNodeRequest {
            node_id: "n1".into(),
            group_name: Some("edge".into()),
            ..Default::default()
        };
        assert_eq!(
            registration(&req, peer()).map(|r| r.node_id),
            Ok("edge/n1".into())
        );
        req.group_name = Some(String::new());
        let reg = registration(&req, peer());
        assert_eq!(reg.as_ref().map(|r| r.node_id.as_str()), Ok("n1"));
        assert_eq!(reg.map(|r| r.group), Ok(None));
    }

    #[test]
    fn empty_or_control_character_ids_are_refused() {
        let mut req = sb::RegisterNodeRequest::default();
        assert_eq!(registration(&req, None), Err(Refusal::EmptyNodeId));
        req.node_id = "a\nb".into();
        assert!(matches!(
            registration(&req, None),
            Err(Refusal::ControlCharacters { .. })
        ));
    }

    #[test]
    fn only_connections_with_link_ids_are_reported() {
        let req = sb::RegisterNodeRequest {
            node_id: "n1".into(),
            connections: vec![
                sb::ConnectionEntry {
                    link_id: Some("l-1".into()),
                    direction: 1,
                    ..Default::default()
                },
                sb::ConnectionEntry {
                    link_id: None,
                    ..Default::default()
                },
                sb::ConnectionEntry {
                    link_id: Some(String::new()),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let reg = registration(&req, None).map(|r| r.reported_connections);
        let want = vec![ReportedConnection {
            link_id: "l-1".into(),
            incoming: true,
        }];
        assert_eq!(reg, Ok(want));
    }

    #[test]
    fn metadata_round_trips_through_json() {
        let mut m = serde_json::Map::new();
        m.insert("region".into(), serde_json::json!("eu"));
        m.insert("tags".into(), serde_json::json!(["a", 1.5, true, null]));
        let d = ConnectionDetail {
            endpoint: "x:1".into(),
            metadata: m.clone(),
            ..Default::default()
        };
        let wire = detail_to_wire(&d, Form::V2);
        assert_eq!(connection_detail(&wire, None).metadata, m);
    }

    #[test]
    fn control_characters_in_endpoints_are_refused_and_nul_dropped_from_metadata() {
        let mut req = sb::RegisterNodeRequest {
            node_id: "n".into(),
            ..Default::default()
        };
        req.connection_details = vec![sb::ConnectionDetails {
            endpoint: "h\0:1".into(),
            ..Default::default()
        }];
        let refused = registration(&req, None);
        let want = Refusal::ControlCharacters {
            field: "connection_details.endpoint",
        };
        assert_eq!(refused, Err(want));
        let mut fields = std::collections::BTreeMap::new();
        let kind = prost_types::value::Kind::StringValue("a\0b".into());
        fields.insert("k\0".to_string(), prost_types::Value { kind: Some(kind) });
        let d = sb::ConnectionDetails {
            metadata: Some(prost_types::Struct { fields }),
            ..Default::default()
        };
        let json = connection_detail(&d, None).metadata;
        assert_eq!(json.get("k"), Some(&serde_json::json!("ab")));
    }
}
