//! Registrations in the 3.x wire revision, whose `ConnectionDetails`
//! reuse field numbers 3 and 4 with other wire types: a node of that line
//! with TLS or an auth method on its data plane must be read, not refused
//! (a node whose registration fails to decode gives up for good).

mod common;

use common::{RawNode, announce, announced_by, mk_register, wait_for};
use prost_types::{Struct, Value, value::Kind};
use slim_cp::proto::details::Form;

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
        d.form = Form::V3;
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

/// `ListNodes` as each slimctl revision's generated client decodes it
/// (field numbers and types from this repository's `proto/` and from
/// agntcy-slim-proto 0.8.8's `controlplane.proto` and `controller.proto`).
mod strict {
    use prost_types::Struct;
    use slim_cp::proto::details::connection_details::SpireMtls;

    /// Field 1 (`endpoint`, the same in both) is left to be skipped.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DetailsV2 {
        #[prost(string, optional, tag = "2")]
        pub external_endpoint: Option<String>,
        #[prost(message, optional, tag = "3")]
        pub spire_mtls: Option<SpireMtls>,
        #[prost(message, optional, tag = "4")]
        pub metadata: Option<Struct>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DetailsV3 {
        #[prost(string, optional, tag = "2")]
        pub external_endpoint: Option<String>,
        #[prost(bool, tag = "3")]
        pub tls_required: bool,
        #[prost(int32, tag = "4")]
        pub auth_method: i32,
        #[prost(string, optional, tag = "5")]
        pub spire_trust_domain: Option<String>,
        #[prost(message, optional, tag = "6")]
        pub metadata: Option<Struct>,
    }

    /// `NodeEntry` of either revision (field 5 is `group` in
    /// 2.0.0-alpha.2, `domain` in 3.x), its listeners kept as bytes for
    /// [`DetailsV2`] or [`DetailsV3`] to decode.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NodeEntry {
        #[prost(string, tag = "1")]
        pub id: String,
        #[prost(bytes = "vec", repeated, tag = "2")]
        pub connections: Vec<Vec<u8>>,
        #[prost(int32, tag = "4")]
        pub status: i32,
        #[prost(string, tag = "5")]
        pub group: String,
    }
}

/// Each node's first listener, decoded by `D`: the first decode error
/// fails the whole listing, as it does in a generated client.
fn first_listeners<D: prost::Message + Default>(
    entries: &[strict::NodeEntry],
) -> Result<Vec<D>, prost::DecodeError> {
    entries
        .iter()
        .map(|e| D::decode(e.connections.first().map_or(&[][..], |c| c.as_slice())))
        .collect()
}

/// Lists the nodes with a client whose `NodeEntry` decoder is `E`'s.
async fn list_as<E>(cp: &slim_cp::server::Running) -> Result<Vec<E>, tonic::Status>
where
    E: prost::Message + Default + Send + 'static,
{
    use tokio_stream::StreamExt;
    let url = format!("http://{}", cp.northbound_addr);
    let channel = tonic::transport::Endpoint::from_shared(url)
        .expect("url")
        .connect()
        .await
        .expect("northbound reachable");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let codec = tonic_prost::ProstCodec::<slim_cp::proto::nb::NodeListRequest, E>::default();
    let path = "/controlplane.proto.v1.ControlPlaneService/ListNodes";
    let req = tonic::Request::new(slim_cp::proto::nb::NodeListRequest {});
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
    let mut stream = grpc.server_streaming(req, path, codec).await?.into_inner();
    let mut out = Vec::new();
    while let Some(entry) = stream.next().await {
        out.push(entry?);
    }
    Ok(out)
}

on_both_backends! {
    /// Scenario: a 2.0.0-alpha.2 node with SPIRE mTLS and metadata and a
    /// 3.x node with TLS, an auth method, a trust domain and metadata are
    /// listed to a 2.0.0-alpha.2 client and to a 3.x client. Neither
    /// client's decoder fails (each would refuse a listener written in the
    /// other revision's form); both read every node's endpoints; the 3.x
    /// client also reads trust domains and metadata.
    async fn clients_of_both_revisions_list_nodes_of_both() {
        use slim_cp::proto::details::connection_details::SpireMtls;
        let cp = common::mk_replica().await;
        let mut v2 = mk_register("old", "n2");
        v2.connection_details[0].spire_mtls = Some(SpireMtls {
            socket_path: "/run/spire.sock".into(),
            trust_domain: Some("old.example".into()),
        });
        v2.connection_details[0].metadata = Some(metadata());
        let mut v3 = mk_register("edge", "n3");
        let d = &mut v3.connection_details[0];
        d.form = Form::V3;
        d.tls_required = true;
        d.auth_method = 1;
        d.spire_trust_domain = Some("edge.example".into());
        d.metadata = Some(metadata());
        let mut nodes = Vec::new();
        for req in [v2, v3] {
            let mut raw = RawNode::open(&cp).await.expect("opens");
            assert!(raw.register(req).await.success);
            raw.answer_empty_tables().await;
            nodes.push(raw);
        }
        let entries = list_as::<strict::NodeEntry>(&cp).await.expect("lists");
        let old = first_listeners::<strict::DetailsV2>(&entries).expect("2.0 decodes");
        let new = first_listeners::<strict::DetailsV3>(&entries).expect("3.x decodes");
        let want = ["n3.edge.example:46357", "n2.old.example:46357"].map(|e| Some(e.to_string()));
        let got_old: Vec<_> = old.iter().map(|d| d.external_endpoint.clone()).collect();
        let got_new: Vec<_> = new.iter().map(|d| d.external_endpoint.clone()).collect();
        assert_eq!((got_old, got_new), (want.to_vec(), want.to_vec()));
        let domains: Vec<_> = new.iter().map(|d| d.spire_trust_domain.clone()).collect();
        assert_eq!(domains, [Some("edge.example".into()), Some("old.example".into())]);
        assert!(new.iter().all(|d| d.metadata == Some(metadata())));
        assert!(new.iter().all(|d| !d.tls_required), "not in the common form");
        assert!(old.iter().all(|d| d.spire_mtls.is_none()), "not in the common form");
        let rec = cp.store.get_node("edge/n3").await.expect("reads").expect("recorded");
        assert_eq!(rec.revision, slim_cp::revision::Revision::V3);
        assert!(rec.connection_details[0].tls_required, "kept though not listed");
        drop(nodes);
    }
}

/// Why the listing uses the common form: each revision's decoder refuses
/// a listener written in the other's.
#[test]
fn each_revision_refuses_the_other_revisions_listener() {
    use prost::Message;
    let mut d = mk_register("g", "n").connection_details.remove(0);
    d.metadata = Some(metadata());
    d.tls_required = true;
    d.form = Form::V2;
    assert!(strict::DetailsV3::decode(d.encode_to_vec().as_slice()).is_err());
    d.form = Form::V3;
    assert!(strict::DetailsV2::decode(d.encode_to_vec().as_slice()).is_err());
    d.form = Form::Common;
    let common = d.encode_to_vec();
    assert!(strict::DetailsV2::decode(common.as_slice()).is_ok());
    assert!(strict::DetailsV3::decode(common.as_slice()).is_ok());
}
