//! Garbage and out-of-order input on the southbound stream: never a panic,
//! never lost state, and the replica keeps serving everyone else.

mod common;

use common::{RawNode, mk_register, mk_replica, wait_for};
use prost::Message;
use slim_cp::proto::sb;
use slim_cp::proto::sb::control_message::Payload;
use tokio::sync::mpsc;
use tonic::transport::Channel;

/// Opens the control channel with raw framing; returns the sender of raw
/// messages and the inbound stream.
async fn open_raw(
    addr: std::net::SocketAddr,
) -> (mpsc::Sender<Vec<u8>>, tonic::Streaming<Vec<u8>>) {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(16);
    let inbound = slim_cp::sim::raw::open_raw(channel, rx).await.unwrap();
    (tx, inbound)
}

fn encode(payload: Payload) -> Vec<u8> {
    sb::ControlMessage {
        message_id: "m".into(),
        payload: Some(payload),
    }
    .encode_to_vec()
}

/// Scenario: bytes that are not a ControlMessage, before and after
/// registration, end only that stream; a registered node's session takes
/// the crash path; other nodes are untouched.
#[tokio::test]
async fn garbage_bytes_end_only_their_stream() {
    let cp = mk_replica().await;
    let bystander = RawNode::connect(&cp, "edge", "bystander").await;

    let (tx, mut rx) = open_raw(cp.southbound_addr).await;
    tx.send(vec![0xff, 0xff, 0xff, 0x0f, 0x12]).await.unwrap();
    assert!(
        matches!(rx.message().await, Err(_) | Ok(None)),
        "stream ended"
    );

    let (tx, mut rx) = open_raw(cp.southbound_addr).await;
    tx.send(encode(Payload::RegisterNodeRequest(mk_register(
        "edge", "victim",
    ))))
    .await
    .unwrap();
    let first = rx.message().await.unwrap().unwrap();
    let reply = sb::ControlMessage::decode(first.as_slice()).unwrap();
    assert!(matches!(reply.payload, Some(Payload::RegisterNodeResponse(r)) if r.success));
    // Field 2 (a message) sent as a varint: a wire-type error for the decoder.
    tx.send(vec![0x10, 0x01]).await.unwrap();
    wait_for("victim's crash recorded", || async {
        let rec = cp
            .store
            .get_node("edge/victim")
            .await
            .map_err(|e| e.to_string())?;
        match rec {
            Some(r) if !r.is_connected() => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let rec = cp.store.get_node("edge/bystander").await.unwrap().unwrap();
    assert!(rec.ready_session().is_some());
    let late = RawNode::connect(&cp, "edge", "late").await;
    drop((bystander, late));
}

/// Scenario: every payload a node should never send, and odd ones it
/// might, arrive after registration; the session stays ready and still
/// answers requests.
#[tokio::test]
async fn out_of_order_payloads_are_tolerated() {
    let cp = mk_replica().await;
    let mut raw = RawNode::connect(&cp, "edge", "n1").await;
    let nameless = sb::ConfigurationCommand {
        routes_to_set: vec![sb::Route::default()],
        routes_to_delete: vec![sb::Route {
            name: Some(slim_cp::proto::dp::Name::default()),
            ..Default::default()
        }],
        connections_received: vec![sb::ConnectionEntry::default()],
        ..Default::default()
    };
    let strays = vec![
        Payload::RegisterNodeResponse(sb::RegisterNodeResponse::default()),
        Payload::DeregisterNodeResponse(sb::DeregisterNodeResponse::default()),
        Payload::ConnectionListRequest(sb::ConnectionListRequest {}),
        Payload::RouteListRequest(sb::RouteListRequest {}),
        Payload::RegisterNodeRequest(mk_register("other", "n2")),
        Payload::ConfigCommand(nameless),
        Payload::Ack(sb::Ack {
            original_message_id: "nope".into(),
            success: false,
            messages: vec!["?".into()],
        }),
        Payload::RouteListResponse(sb::RouteListResponse {
            original_message_id: "nope".into(),
            done: true,
            ..Default::default()
        }),
    ];
    for p in strays {
        raw.send(p).await;
    }
    raw.tx
        .send(sb::ControlMessage {
            message_id: String::new(),
            payload: None,
        })
        .await
        .unwrap();
    let transport = cp.transport.clone();
    let call = tokio::spawn(async move { transport.list_routes("edge/n1").await });
    let request = raw.recv().await.unwrap().unwrap();
    assert!(matches!(
        request.payload,
        Some(Payload::RouteListRequest(_))
    ));
    let done = sb::RouteListResponse {
        original_message_id: request.message_id,
        done: true,
        ..Default::default()
    };
    raw.send(Payload::RouteListResponse(done)).await;
    assert_eq!(call.await.unwrap(), Ok(vec![]));
    let rec = cp.store.get_node("edge/n1").await.unwrap().unwrap();
    assert!(rec.ready_session().is_some());
    assert!(
        cp.store.get_node("other/n2").await.unwrap().is_none(),
        "no second registration"
    );
    assert!(
        cp.store.list_templates().await.unwrap().is_empty(),
        "nameless routes ignored"
    );
    assert!(
        rec.received_links.is_empty(),
        "claims without link ids ignored"
    );
}
