//! The southbound stream over real gRPC on loopback, message by message, as
//! a `slim` node drives it (shared/spec/protocol-notes.md).

mod common;

use slim_cp::cluster::LeaderToken;

use std::time::Duration;

use common::{RawNode, announce, mk_register, mk_replica, start_replica, wait_count, wait_for};
use slim_cp::proto::sb;
use slim_cp::proto::sb::control_message::Payload;
use slim_cp::server::Options;
use slim_cp::store::model::{DepartureKind, SessionState};
use slim_cp::transport::TransportError;

/// Scenario: the node waits for response headers before it registers, so
/// they must come while the control plane has read nothing.
#[tokio::test]
async fn response_headers_arrive_before_registration() {
    let cp = mk_replica().await;
    let raw = RawNode::open(&cp).await;
    assert!(
        raw.is_ok(),
        "headers came without any message sent: {:?}",
        raw.err()
    );
}

/// Scenario: a registration gets `success: true` naming the request, and
/// the node is recorded under `group/node` with a ready session and its
/// wildcard endpoint host replaced by the peer IP.
#[tokio::test]
async fn registration_records_a_ready_session() {
    let cp = mk_replica().await;
    let mut raw = RawNode::open(&cp).await.unwrap();
    let resp = raw.register(mk_register("edge", "n1")).await;
    assert!(resp.success);
    assert!(resp.connections.is_empty() && resp.routes.is_empty());
    let rec = wait_for("ready session", || async {
        let rec = cp
            .store
            .get_node("edge/n1")
            .await
            .map_err(|e| e.to_string())?;
        match rec {
            Some(r) if r.ready_session().is_some() => Ok(r),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(rec.group.as_deref(), Some("edge"));
    assert_eq!(rec.connection_details[0].endpoint, "127.0.0.1:46357");
    assert_eq!(
        rec.connection_details[0].external_endpoint.as_deref(),
        Some("n1.edge.example:46357")
    );
    assert!(cp.registry().get("edge/n1").is_some());
}

/// Scenario: a stream that sends nothing within the registration window
/// is closed with DEADLINE_EXCEEDED (shortened here; the default is 15 s).
#[tokio::test]
async fn silent_stream_is_closed_after_the_registration_window() {
    let cp = start_replica(Options {
        register_timeout: Duration::from_millis(300),
        ..Options::loopback()
    })
    .await;
    let mut raw = RawNode::open(&cp).await.unwrap();
    raw.expect_end(tonic::Code::DeadlineExceeded, "RegisterNodeRequest")
        .await;
    assert!(cp.store.list_nodes().await.unwrap().is_empty());
}

/// Scenario: the default registration window is the spec's 15 s.
#[tokio::test]
async fn default_registration_window_is_fifteen_seconds() {
    let cp = mk_replica().await;
    let started = tokio::time::Instant::now();
    let mut raw = RawNode::open(&cp).await.unwrap();
    raw.expect_end(tonic::Code::DeadlineExceeded, "15s").await;
    assert!(started.elapsed() >= Duration::from_secs(15));
}

/// Scenario: a first message other than `RegisterNodeRequest` is refused
/// with INVALID_ARGUMENT naming what came.
#[tokio::test]
async fn non_registration_first_message_is_refused() {
    let cp = mk_replica().await;
    let mut raw = RawNode::open(&cp).await.unwrap();
    raw.send(announce(&["x"])).await;
    raw.expect_end(tonic::Code::InvalidArgument, "ConfigurationCommand")
        .await;
    assert!(cp.store.list_nodes().await.unwrap().is_empty());
}

/// Scenario: an empty node id is refused with `success: false`, then the
/// stream ends with a status that says why; nothing is recorded.
#[tokio::test]
async fn empty_node_id_gets_success_false() {
    let cp = mk_replica().await;
    let mut raw = RawNode::open(&cp).await.unwrap();
    let resp = raw.register(mk_register("edge", "")).await;
    assert!(!resp.success);
    raw.expect_end(tonic::Code::InvalidArgument, "node_id")
        .await;
    assert!(cp.store.list_nodes().await.unwrap().is_empty());
}

/// Scenario: the same node registers on a second stream; the second
/// session replaces the first, whose stream is closed; the late close of
/// the first changes nothing.
#[tokio::test]
async fn duplicate_registration_replaces_the_session() {
    let cp = mk_replica().await;
    let mut first = RawNode::connect(&cp, "edge", "n1").await;
    let old = cp
        .store
        .get_node("edge/n1")
        .await
        .unwrap()
        .unwrap()
        .session
        .unwrap();
    let second = RawNode::connect(&cp, "edge", "n1").await;
    let status = first.recv().await.expect_err("old stream closed");
    assert_eq!(status.code(), tonic::Code::Aborted);
    drop(first);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let rec = cp.store.get_node("edge/n1").await.unwrap().unwrap();
    let current = rec.session.expect("still connected");
    assert_ne!(current.id, old.id);
    assert!(current.generation > old.generation);
    assert_eq!(current.state, SessionState::Ready);
    assert_eq!(rec.departure, None, "the stale close recorded no departure");
    assert_eq!(
        cp.registry().get("edge/n1").map(|s| s.session()),
        Some(current.id)
    );
    drop(second);
}

/// Scenario: deregistration is answered before the session is cleaned up;
/// then the stream ends cleanly and the leader forgets the node.
#[tokio::test]
async fn deregistration_is_answered_before_cleanup() {
    let cp = mk_replica().await;
    let mut raw = RawNode::connect(&cp, "edge", "n1").await;
    let req = sb::DeregisterNodeRequest {
        node: Some(sb::Node {
            id: "someone-else".into(),
        }),
    };
    let id = raw.send(Payload::DeregisterNodeRequest(req)).await;
    match raw.recv().await {
        Ok(Some(sb::ControlMessage {
            payload: Some(Payload::DeregisterNodeResponse(r)),
            ..
        })) => assert!(r.success && r.original_message_id == id),
        other => panic!("expected DeregisterNodeResponse, got {other:?}"),
    }
    assert!(matches!(raw.recv().await, Ok(None)), "then a clean end");
    wait_for("node forgotten", || async {
        match cp
            .store
            .get_node("edge/n1")
            .await
            .map_err(|e| e.to_string())?
        {
            None => Ok(()),
            Some(r) => Err(format!("{r:?}")),
        }
    })
    .await;
    assert!(cp.registry().get("edge/n1").is_none());
}

/// Scenario: a node that vanishes without a goodbye keeps its record, is
/// no longer connected, and its announcements are removed.
#[tokio::test]
async fn crash_keeps_the_record_and_drops_announcements() {
    let cp = mk_replica().await;
    let raw = RawNode::connect(&cp, "edge", "n1").await;
    raw.send(announce(&["app"])).await;
    wait_count("template recorded", 1, || async {
        cp.store.list_templates().await.map(|v| v.len())
    })
    .await;
    drop(raw);
    let rec = wait_for("crash recorded", || async {
        let rec = cp
            .store
            .get_node("edge/n1")
            .await
            .map_err(|e| e.to_string())?;
        match rec {
            Some(r) if r.departure.is_some() => Ok(r),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(!rec.is_connected());
    assert_eq!(rec.departure.map(|d| d.kind), Some(DepartureKind::Crash));
    wait_count("templates dropped", 0, || async {
        cp.store.list_templates().await.map(|v| v.len())
    })
    .await;
}

/// Scenario: a request to a node that disconnects while the control plane
/// waits fails at once with `SessionEnded`, not after the timeout and not
/// with an empty success (regression: the reference answered a dropped
/// waiter with an empty success).
#[tokio::test]
async fn request_fails_at_once_when_the_node_disconnects() {
    let cp = start_replica(Options {
        request_timeout: Duration::from_secs(600),
        ..Options::loopback()
    })
    .await;
    let mut raw = RawNode::connect(&cp, "edge", "n1").await;
    let transport = cp.transport.clone();
    let call = tokio::spawn(async move { transport.list_connections("edge/n1").await });
    match raw.recv().await {
        Ok(Some(sb::ControlMessage {
            payload: Some(Payload::ConnectionListRequest(_)),
            ..
        })) => {}
        other => panic!("expected ConnectionListRequest, got {other:?}"),
    }
    drop(raw);
    let result = tokio::time::timeout(common::PATIENCE, call).await;
    assert_eq!(
        result.ok().and_then(|r| r.ok()),
        Some(Err(TransportError::SessionEnded))
    );
}

/// Scenario: list replies spanning several messages are gathered until
/// `done`; a command gets its per-item ack; acks for ids never issued are
/// tolerated.
#[tokio::test]
async fn replies_are_correlated_and_strays_tolerated() {
    let cp = mk_replica().await;
    let mut raw = RawNode::connect(&cp, "edge", "n1").await;
    let stray = sb::ConfigurationCommandAck {
        original_message_id: "never-issued".into(),
        ..Default::default()
    };
    raw.send(Payload::ConfigCommandAck(stray)).await;
    let transport = cp.transport.clone();
    let call = tokio::spawn(async move { transport.list_connections("edge/n1").await });
    let request_id = match raw.recv().await {
        Ok(Some(m)) => m.message_id,
        other => panic!("expected a request, got {other:?}"),
    };
    for (i, done) in [(1, false), (2, false), (3, true)] {
        let part = sb::ConnectionListResponse {
            original_message_id: request_id.clone(),
            entries: vec![sb::ConnectionEntry {
                id: i,
                ..Default::default()
            }],
            done,
        };
        raw.send(Payload::ConnectionListResponse(part)).await;
    }
    let entries = call.await.unwrap().expect("list gathered");
    assert_eq!(entries.iter().map(|e| e.id).collect::<Vec<_>>(), [1, 2, 3]);

    let transport = cp.transport.clone();
    let cmd = sb::ConfigurationCommand::default();
    let token = LeaderToken::solo(1);
    let call = tokio::spawn(async move { transport.send_command("edge/n1", cmd, &token).await });
    let request_id = raw.recv().await.unwrap().unwrap().message_id;
    let ack = sb::ConfigurationCommandAck {
        original_message_id: request_id.clone(),
        connections_status: vec![sb::ConnectionAck {
            link_id: "l-1".into(),
            success: true,
            error_msg: String::new(),
        }],
        ..Default::default()
    };
    raw.send(Payload::ConfigCommandAck(ack)).await;
    let got = call.await.unwrap().expect("ack delivered");
    assert_eq!(got.original_message_id, request_id);
    assert_eq!(got.connections_status.len(), 1);
}

/// Scenario: a command of an older epoch than one already seen is refused
/// by the gate and never reaches the node.
#[tokio::test]
async fn commands_of_a_stale_epoch_are_fenced() {
    let cp = mk_replica().await;
    let _raw = RawNode::connect(&cp, "edge", "n1").await;
    cp.transport.observe_epoch(5);
    let err = cp
        .transport
        .send_command(
            "edge/n1",
            sb::ConfigurationCommand::default(),
            &LeaderToken::solo(4),
        )
        .await;
    assert_eq!(
        err,
        Err(TransportError::Fenced {
            epoch: 4,
            highest: 5
        })
    );
}

/// Scenario: a request to a node with no session here says so.
#[tokio::test]
async fn request_to_an_unknown_node_is_not_connected() {
    let cp = mk_replica().await;
    let err = cp.transport.list_routes("edge/nobody").await;
    assert_eq!(err, Err(TransportError::NotConnected("edge/nobody".into())));
}
