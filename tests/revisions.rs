//! Registrations in the 3.x wire revision, whose `ConnectionDetails`
//! reuse field numbers 3 and 4 with other wire types: a node of that line
//! with TLS or an auth method on its data plane must be read, not refused
//! (a node whose registration fails to decode gives up for good).

mod common;

use common::{RawNode, announce, announced_by, mk_register, wait_for};
use prost_types::{Struct, Value, value::Kind};
use slim_cp::proto::details::Revision;

fn metadata() -> Struct {
    let v = Value {
        kind: Some(Kind::StringValue("blue".into())),
    };
    Struct {
        fields: [("colour".to_string(), v)].into(),
    }
}

on_both_backends! {
    /// Scenario: a 3.x node with TLS required, an auth method, a SPIRE
    /// trust domain and metadata registers; it is answered `success:
    /// true`, its listener and metadata are recorded, and its stream
    /// carries facts afterwards.
    async fn a_3x_node_with_tls_and_auth_registers() {
        let cp = common::mk_replica().await;
        let mut req = mk_register("edge", "n3");
        let d = &mut req.connection_details[0];
        d.revision = Revision::V3;
        d.tls_required = true;
        d.auth_method = 1;
        d.spire_trust_domain = Some("edge.example".into());
        d.metadata = Some(metadata());
        let mut raw = RawNode::open(&cp).await.expect("opens");
        assert!(raw.register(req).await.success, "answered success");
        raw.answer_empty_tables().await;
        let rec = cp.store.get_node("edge/n3").await.expect("reads").expect("recorded");
        let detail = &rec.connection_details[0];
        assert_eq!(detail.external_endpoint.as_deref(), Some("n3.edge.example:46357"));
        assert_eq!(detail.metadata.get("colour").and_then(|v| v.as_str()), Some("blue"));
        raw.send(announce(&["after"])).await;
        wait_for("the announcement recorded", || async {
            match announced_by(&cp, "edge/n3").await? {
                names if names.contains("after") => Ok(()),
                names => Err(format!("{names:?}")),
            }
        })
        .await;
    }
}
