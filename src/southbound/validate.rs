//! A registration checked at the door (see [`crate::limits`]): what breaks
//! a rule is refused with `success: false` and says which field and why,
//! since a restart of the node would send the same request again.

use super::handshake::{Refusal, effective_id, group_of};
use crate::limits::{self, LimitError, check_count, check_len};
use crate::proto::sb;

/// Every rule a registration must meet before anything is recorded.
pub fn check_registration(req: &sb::RegisterNodeRequest) -> Result<(), Refusal> {
    if req.node_id.trim().is_empty() {
        return Err(Refusal::EmptyNodeId);
    }
    check_text("node_id", &req.node_id)?;
    let group = group_of(req);
    check_text("group_name", group.unwrap_or_default())?;
    check_len(
        "group_name",
        group.unwrap_or_default(),
        limits::MAX_ID_BYTES,
    )?;
    check_len(
        "node_id (with its group)",
        &effective_id(&req.node_id, group),
        limits::MAX_ID_BYTES,
    )?;
    check_count(
        "connection_details",
        req.connection_details.len(),
        limits::MAX_CONNECTION_DETAILS,
    )?;
    for d in &req.connection_details {
        check_detail(d)?;
    }
    check_count("connections", req.connections.len(), limits::MAX_ENTRIES)?;
    check_count("routes", req.routes.len(), limits::MAX_ENTRIES)?;
    Ok(())
}

fn check_detail(d: &sb::ConnectionDetails) -> Result<(), Refusal> {
    let external = d.external_endpoint.as_deref().unwrap_or_default();
    check_text("connection_details.endpoint", &d.endpoint)?;
    check_text("connection_details.external_endpoint", external)?;
    let max = limits::MAX_ENDPOINT_BYTES;
    check_len("connection_details.endpoint", &d.endpoint, max)?;
    check_len("connection_details.external_endpoint", external, max)?;
    // 3.x only; stored as text, so held to an endpoint's rules.
    let trust_domain = d.spire_trust_domain.as_deref().unwrap_or_default();
    check_text("connection_details.spire_trust_domain", trust_domain)?;
    check_len("connection_details.spire_trust_domain", trust_domain, max)?;
    if let Some(m) = &d.metadata {
        use prost::Message;
        // The encoded size is a close, cheap bound of the stored JSON's.
        let len = m.encoded_len();
        if len > limits::MAX_METADATA_BYTES {
            return Err(Refusal::Limit(LimitError::TooLong {
                field: "connection_details.metadata",
                len,
                max: limits::MAX_METADATA_BYTES,
            }));
        }
    }
    Ok(())
}

fn check_text(field: &'static str, value: &str) -> Result<(), Refusal> {
    if value.chars().any(char::is_control) {
        return Err(Refusal::ControlCharacters { field });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(node_id: &str) -> sb::RegisterNodeRequest {
        sb::RegisterNodeRequest {
            node_id: node_id.into(),
            group_name: Some("edge".into()),
            ..Default::default()
        }
    }

    fn refused_field(req: &sb::RegisterNodeRequest) -> Option<&'static str> {
        match check_registration(req) {
            Err(Refusal::Limit(LimitError::TooLong { field, .. }))
            | Err(Refusal::Limit(LimitError::TooMany { field, .. }))
            | Err(Refusal::ControlCharacters { field }) => Some(field),
            _ => None,
        }
    }

    #[test]
    fn ids_count_their_group_prefix() {
        // "edge/" + 251 bytes is exactly the limit.
        assert_eq!(check_registration(&request(&"n".repeat(251))), Ok(()));
        let too_long = request(&"n".repeat(252));
        assert_eq!(refused_field(&too_long), Some("node_id (with its group)"));
        let mut long_group = request("n");
        long_group.group_name = Some("g".repeat(limits::MAX_ID_BYTES + 1));
        assert_eq!(refused_field(&long_group), Some("group_name"));
    }

    #[test]
    fn endpoints_metadata_and_counts_are_bounded() {
        let mut req = request("n");
        req.connection_details = vec![sb::ConnectionDetails {
            endpoint: format!("{}:1", "h".repeat(limits::MAX_ENDPOINT_BYTES)),
            ..Default::default()
        }];
        assert_eq!(refused_field(&req), Some("connection_details.endpoint"));
        let mut fields = std::collections::BTreeMap::new();
        let big = prost_types::value::Kind::StringValue("x".repeat(limits::MAX_METADATA_BYTES));
        fields.insert("k".to_string(), prost_types::Value { kind: Some(big) });
        req.connection_details = vec![sb::ConnectionDetails {
            endpoint: "h:1".into(),
            metadata: Some(prost_types::Struct { fields }),
            ..Default::default()
        }];
        assert_eq!(refused_field(&req), Some("connection_details.metadata"));
        req.connection_details = vec![sb::ConnectionDetails::default(); 65];
        assert_eq!(refused_field(&req), Some("connection_details"));
        req.connection_details.clear();
        req.routes = vec![sb::Route::default(); limits::MAX_ENTRIES + 1];
        assert_eq!(refused_field(&req), Some("routes"));
    }

    #[test]
    fn the_refusal_names_the_field_and_the_limit() {
        let shown = check_registration(&request(&"n".repeat(300)))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert_eq!(
            shown,
            "node_id (with its group) is 305 bytes long; at most 256 are accepted"
        );
    }
}
