//! The operator API over real gRPC: listings, live node tables, topology
//! mutations, and an error code for each kind of bad call.

mod common;

use common::{RawNode, mk_replica, start_replica, wait_for};
use slim_cp::config::{AdjacencyEntry, TopologyConfig};
use slim_cp::proto::nb;
use slim_cp::proto::nb::control_plane_service_client::ControlPlaneServiceClient;
use slim_cp::proto::sb;
use slim_cp::proto::sb::control_message::Payload;
use slim_cp::server::{Options, Running};
use tonic::Code;
use tonic::transport::Channel;

async fn mk_client(cp: &Running) -> ControlPlaneServiceClient<Channel> {
    ControlPlaneServiceClient::connect(format!("http://{}", cp.northbound_addr))
        .await
        .expect("northbound reachable")
}

async fn mk_config_mode() -> Running {
    let star = vec![AdjacencyEntry {
        group: "cloud".into(),
        neighbors: vec!["*".into()],
    }];
    start_replica(Options {
        topology: TopologyConfig::Links(star),
        ..Options::loopback()
    })
    .await
}

async fn nodes(client: &mut ControlPlaneServiceClient<Channel>) -> Vec<nb::NodeEntry> {
    let mut stream = client
        .list_nodes(nb::NodeListRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while let Some(n) = stream.message().await.unwrap() {
        out.push(n);
    }
    out
}

async fn segments(client: &mut ControlPlaneServiceClient<Channel>) -> Vec<nb::SegmentEntry> {
    client
        .list_segments(nb::SegmentListRequest {})
        .await
        .unwrap()
        .into_inner()
        .segments
}

fn code<T>(r: Result<T, tonic::Status>) -> Code {
    r.err().map_or(Code::Ok, |s| s.code())
}

/// Scenario: a connected node lists CONNECTED with its group; after a
/// crash it lists NOT_CONNECTED, never unspecified.
#[tokio::test]
async fn node_status_follows_the_session() {
    let cp = mk_replica().await;
    let mut client = mk_client(&cp).await;
    let raw = RawNode::connect(&cp, "edge", "n1").await;
    let listed = nodes(&mut client).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].id.as_str(), listed[0].group.as_str()),
        ("edge/n1", "edge")
    );
    assert_eq!(listed[0].status, nb::NodeStatus::Connected as i32);
    assert_eq!(listed[0].connections[0].endpoint, "127.0.0.1:46357");
    drop(raw);
    wait_for("NOT_CONNECTED", || {
        let mut client = client.clone();
        async move {
            let listed = nodes(&mut client).await;
            let want = nb::NodeStatus::NotConnected as i32;
            if listed[0].status == want {
                Ok(())
            } else {
                Err(format!("{listed:?}"))
            }
        }
    })
    .await;
}

/// Scenario: live tables come from the node itself; unknown, empty and
/// disconnected nodes each get their own code.
#[tokio::test]
async fn live_tables_and_their_errors() {
    let cp = mk_replica().await;
    let mut client = mk_client(&cp).await;
    let mut raw = RawNode::connect(&cp, "edge", "n1").await;
    let answer = tokio::spawn(async move {
        let req = raw.recv().await.unwrap().unwrap();
        let part = sb::ConnectionListResponse {
            original_message_id: req.message_id,
            entries: vec![sb::ConnectionEntry {
                id: 7,
                ..Default::default()
            }],
            done: true,
        };
        raw.send(Payload::ConnectionListResponse(part)).await;
        raw
    });
    let got = client
        .list_connections(nb::Node {
            id: "edge/n1".into(),
        })
        .await
        .unwrap();
    assert_eq!(got.get_ref().entries[0].id, 7);
    assert!(got.get_ref().done);
    let raw = answer.await.unwrap();

    let unknown = client
        .list_connections(nb::Node {
            id: "edge/ghost".into(),
        })
        .await;
    assert_eq!(code(unknown), Code::NotFound);
    let empty = client
        .list_node_routes(nb::Node { id: String::new() })
        .await;
    assert_eq!(code(empty), Code::InvalidArgument);
    drop(raw);
    wait_for("disconnected", || async {
        let r = cp
            .store
            .get_node("edge/n1")
            .await
            .map_err(|e| e.to_string())?;
        if r.is_some_and(|r| !r.is_connected()) {
            Ok(())
        } else {
            Err("connected".into())
        }
    })
    .await;
    let gone = client
        .list_node_routes(nb::Node {
            id: "edge/n1".into(),
        })
        .await;
    assert_eq!(code(gone), Code::Unavailable);
}

/// Scenario: API mode has an irremovable `default` segment; segments and
/// links are added and removed; bad arguments are INVALID_ARGUMENT and
/// missing things NOT_FOUND.
#[tokio::test]
async fn api_mode_segments_and_links() {
    let cp = mk_replica().await;
    let mut client = mk_client(&cp).await;
    let names: Vec<String> = segments(&mut client)
        .await
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["default"]);
    let rm_default = client
        .remove_segment(nb::RemoveSegmentRequest {
            name: "default".into(),
        })
        .await;
    assert_eq!(code(rm_default), Code::FailedPrecondition);
    let empty = client
        .add_segment(nb::AddSegmentRequest {
            name: String::new(),
        })
        .await;
    assert_eq!(code(empty), Code::InvalidArgument);
    client
        .add_segment(nb::AddSegmentRequest {
            name: "blue".into(),
        })
        .await
        .unwrap();
    client
        .add_segment(nb::AddSegmentRequest {
            name: "blue".into(),
        })
        .await
        .expect("idempotent");

    let _raw = RawNode::connect(&cp, "g1", "n1").await;
    let add = |a: &str, b: &str, s: &str| nb::AddTopologyLinkRequest {
        group_a: a.into(),
        group_b: b.into(),
        segment: s.into(),
    };
    let resp = client
        .add_topology_link(add("g1", "g2", "blue"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        resp.warnings.len(),
        1,
        "only g2 has no nodes: {:?}",
        resp.warnings
    );
    assert!(resp.warnings[0].contains("g2"));
    client
        .add_topology_link(add("g2", "g1", "blue"))
        .await
        .expect("existing link is fine");
    client
        .add_topology_link(add("g1", "g3", ""))
        .await
        .expect("empty segment means default");
    assert_eq!(
        code(client.add_topology_link(add("g1", "g1", "")).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(client.add_topology_link(add("", "g1", "")).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(client.add_topology_link(add("g1", "g2", "nope")).await),
        Code::NotFound
    );

    let listed = segments(&mut client).await;
    let blue = listed.iter().find(|s| s.name == "blue").unwrap();
    assert_eq!(blue.groups, ["g1", "g2"]);
    assert_eq!(
        (
            blue.edges[0].group_a.as_str(),
            blue.edges[0].group_b.as_str()
        ),
        ("g1", "g2")
    );

    let mut links = client
        .list_links(nb::LinkListRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut pending = Vec::new();
    while let Some(l) = links.message().await.unwrap() {
        pending.push((l.source_node_id, l.dest_node_id, l.status));
    }
    let p = nb::LinkStatus::Pending as i32;
    assert_eq!(
        pending,
        [("g1".into(), "g2".into(), p), ("g1".into(), "g3".into(), p)]
    );

    let rm = |a: &str, b: &str, s: &str| nb::RemoveTopologyLinkRequest {
        group_a: a.into(),
        group_b: b.into(),
        segment: s.into(),
    };
    client
        .remove_topology_link(rm("g2", "g1", "blue"))
        .await
        .expect("undirected");
    assert_eq!(
        code(client.remove_topology_link(rm("g1", "g2", "blue")).await),
        Code::NotFound
    );
    client
        .remove_segment(nb::RemoveSegmentRequest {
            name: "blue".into(),
        })
        .await
        .unwrap();
    let again = client
        .remove_segment(nb::RemoveSegmentRequest {
            name: "blue".into(),
        })
        .await;
    assert_eq!(code(again), Code::NotFound);
}

/// Scenario: config mode refuses every mutation with FAILED_PRECONDITION
/// and lists the file's topology expanded over the registered groups.
#[tokio::test]
async fn config_mode_refuses_mutations_and_lists_the_file() {
    let cp = mk_config_mode().await;
    let mut client = mk_client(&cp).await;
    let calls = [
        code(
            client
                .add_segment(nb::AddSegmentRequest { name: "x".into() })
                .await,
        ),
        code(
            client
                .remove_segment(nb::RemoveSegmentRequest { name: "x".into() })
                .await,
        ),
        code(
            client
                .add_topology_link(nb::AddTopologyLinkRequest::default())
                .await,
        ),
        code(
            client
                .remove_topology_link(nb::RemoveTopologyLinkRequest::default())
                .await,
        ),
    ];
    assert_eq!(calls, [Code::FailedPrecondition; 4]);
    let _a = RawNode::connect(&cp, "cloud", "n1").await;
    let _b = RawNode::connect(&cp, "edge", "n1").await;
    let listed = segments(&mut client).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].groups, ["cloud", "edge"]);
}

/// Scenario: announced names list as wildcard routes `* -> node`.
#[tokio::test]
async fn announcements_list_as_wildcard_routes() {
    let cp = mk_replica().await;
    let mut client = mk_client(&cp).await;
    let raw = RawNode::connect(&cp, "edge", "n1").await;
    raw.send(common::announce(&["app"])).await;
    let routes = wait_for("wildcard route", || {
        let mut client = client.clone();
        async move {
            let mut s = client
                .list_routes(nb::RouteListRequest::default())
                .await
                .map_err(|e| e.to_string())?
                .into_inner();
            let mut out = Vec::new();
            while let Some(r) = s.message().await.map_err(|e| e.to_string())? {
                out.push(r);
            }
            if out.is_empty() {
                Err("none".into())
            } else {
                Ok(out)
            }
        }
    })
    .await;
    assert_eq!(routes[0].source_node_id, "*");
    assert_eq!(routes[0].dest_node_id, "edge/n1");
    let name = routes[0]
        .name
        .as_ref()
        .and_then(|n| n.str_name.as_ref())
        .unwrap();
    assert_eq!(name.str_component_2, "app");
    let filtered = client
        .list_routes(nb::RouteListRequest {
            src_node_id: "nobody".into(),
            dest_node_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .message()
        .await
        .unwrap();
    assert!(filtered.is_none());
    let _ = client.clone();
}
