//! End-to-end behaviour of one simulated node against a scripted control
//! plane over real gRPC: registration, commands and lists, the retry rules.

mod sim_support;

use std::time::Duration;

use sim_support::{ScriptedCp, WAIT, free_addr, link};
use slim_cp::proto::sb;
use slim_cp::proto::sb::control_message::Payload;
use slim_cp::sim::names::{NULL_ID, make_name};
use slim_cp::sim::{NodeState, SimNetwork, SimNode, SimNodeSpec, SimOptions};

fn options() -> SimOptions {
    SimOptions {
        connect_retry_interval: Duration::from_millis(50),
        register_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(2),
        ..SimOptions::default()
    }
}

fn spec(id: &str, port: u16) -> SimNodeSpec {
    let mut spec = SimNodeSpec::new(id, Some("g"), &format!("0.0.0.0:{port}"));
    spec.external_endpoint = Some(format!("127.0.0.1:{port}"));
    spec.credentials = "secret".to_string();
    spec
}

fn node(cp: &ScriptedCp, id: &str, port: u16, net: &std::sync::Arc<SimNetwork>) -> SimNode {
    let node = SimNode::new(spec(id, port), &cp.url(), net.clone(), options()).unwrap();
    node.start().unwrap();
    node
}

#[tokio::test]
async fn registers_and_answers_commands_and_lists() {
    let mut cp = ScriptedCp::start().await;
    let n = node(&cp, "n1", 7001, &SimNetwork::new());
    let mut s = cp.next_stream().await;
    let (id, req) = s.register().await;
    assert_eq!(
        (req.node_id.as_str(), req.group_name.as_deref()),
        ("n1", Some("g"))
    );
    assert_eq!(req.credentials, "secret");
    let details = &req.connection_details[0];
    assert_eq!(details.endpoint, "0.0.0.0:7001");
    assert_eq!(details.external_endpoint.as_deref(), Some("127.0.0.1:7001"));
    assert_eq!(
        req.connections.len(),
        1,
        "the controller's own local connection"
    );
    assert_eq!(
        req.connections[0].connection_type,
        sb::ConnectionType::Remote as i32
    );
    assert!(req.routes.is_empty());
    s.respond_register(&id, true, vec![], vec![]).await;
    assert!(n.wait_registered(WAIT).await);
    assert_eq!(n.registrations(), 1);

    let cmd = sb::ConfigurationCommand {
        connections_to_delete: vec!["ghost".into()],
        ..Default::default()
    };
    let cmd_id = s.send(Payload::ConfigCommand(cmd)).await;
    let ack = s.ack().await;
    assert_eq!(
        ack.original_message_id, cmd_id,
        "no ack was sent for an empty registration"
    );
    assert!(!ack.connections_status[0].success);
    assert!(ack.connections_status[0].error_msg.contains("not found"));

    let list_id = s
        .send(Payload::ConnectionListRequest(sb::ConnectionListRequest {}))
        .await;
    match s.recv().await.payload {
        Some(Payload::ConnectionListResponse(r)) => {
            assert_eq!(r.original_message_id, list_id);
            assert!(r.done);
            assert_eq!(r.entries.len(), 1);
        }
        other => panic!("unexpected {other:?}"),
    }
    let list_id = s
        .send(Payload::RouteListRequest(sb::RouteListRequest {}))
        .await;
    match s.recv().await.payload {
        Some(Payload::RouteListResponse(r)) => {
            assert_eq!(
                (r.original_message_id, r.done, r.entries.len()),
                (list_id, true, 0)
            );
        }
        other => panic!("unexpected {other:?}"),
    }
    n.set_silent(true);
    s.send(Payload::RouteListRequest(sb::RouteListRequest {}))
        .await;
    assert!(s.recv_within(Duration::from_millis(300)).await.is_none());
}

#[tokio::test]
async fn registration_state_is_reconciled_and_the_link_claimed() {
    let mut cp = ScriptedCp::start().await;
    let net = SimNetwork::new();
    let b = node(&cp, "b", 7102, &net);
    let mut sb_ = cp.next_stream().await;
    let (id, _) = sb_.register().await;
    sb_.respond_register(&id, true, vec![], vec![]).await;
    assert!(b.wait_registered(WAIT).await);

    let a = node(&cp, "a", 7101, &net);
    let mut sa = cp.next_stream().await;
    let (id, _) = sa.register().await;
    let route = sb::Route {
        name: Some(make_name(["org", "ns", "svc"], NULL_ID)),
        link_id: Some("L1".into()),
        direction: None,
    };
    sa.respond_register(&id, true, vec![link("L1", "127.0.0.1:7102")], vec![route])
        .await;
    let ack = sa.ack().await;
    assert_ne!(ack.original_message_id, id);
    assert!(ack.connections_status.iter().all(|c| c.success));
    assert!(ack.routes_status.iter().all(|r| r.success));
    let claim = sb_.command().await;
    assert_eq!(claim.connections_received[0].link_id.as_deref(), Some("L1"));
    assert_eq!(
        claim.connections_received[0].direction,
        sb::ConnectionDirection::Incoming as i32
    );
    assert_eq!(a.routes()[0].link_id.as_deref(), Some("L1"));
    let incoming = b.connections();
    assert_eq!(incoming[0].remote_node.as_deref(), Some("a"));
    assert_eq!(incoming[0].direction, sb::ConnectionDirection::Incoming);

    b.crash();
    assert!(a.wait_until(|n| n.connections().is_empty(), WAIT).await);
    let lost = sa.command().await;
    assert_eq!(
        lost.routes_to_delete.len(),
        1,
        "the route's loss is reported"
    );
}

#[tokio::test]
async fn start_retries_until_something_listens() {
    let addr = free_addr();
    let n = SimNode::new(
        spec("late", 7201),
        &format!("http://{addr}"),
        SimNetwork::new(),
        options(),
    )
    .unwrap();
    n.start().unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(n.state(), NodeState::Starting);
    let mut cp = ScriptedCp::start_on(addr).await;
    let mut s = cp.next_stream().await;
    let (id, _) = s.register().await;
    s.respond_register(&id, true, vec![], vec![]).await;
    assert!(n.wait_registered(WAIT).await);
}

#[tokio::test]
async fn one_reconnect_per_break_then_lost_when_it_fails() {
    let mut cp = ScriptedCp::start().await;
    let n = node(&cp, "r", 7301, &SimNetwork::new());
    n.announce(["org", "ns", "app"]).unwrap();
    for round in 1..=3u64 {
        let mut s = cp.next_stream().await;
        let (id, _) = s.register().await;
        s.respond_register(&id, true, vec![], vec![]).await;
        let replay = s.command().await;
        assert_eq!(
            replay.routes_to_set.len(),
            1,
            "local subscriptions replayed"
        );
        assert!(replay.routes_to_set[0].link_id.is_none());
        assert!(n.wait_until(|n| n.registrations() == round, WAIT).await);
        drop(s); // the control plane closes the stream
    }
    let mut s = cp.next_stream().await;
    let (id, _) = s.register().await;
    s.respond_register(&id, true, vec![], vec![]).await;
    assert!(n.wait_until(|n| n.registrations() == 4, WAIT).await);
    cp.kill();
    assert!(n.wait_until(|n| n.is_lost(), WAIT).await);
    let NodeState::Lost { reason } = n.state() else {
        unreachable!()
    };
    assert!(reason.contains("failed to reconnect"), "{reason}");
    let mut again = ScriptedCp::start_on(cp.addr).await;
    assert!(
        again
            .stream_within(Duration::from_millis(500))
            .await
            .is_none(),
        "a lost node never dials again"
    );
}

#[tokio::test]
async fn failures_before_registration_lose_the_node() {
    let mut cp = ScriptedCp::start().await;
    let net = SimNetwork::new();
    let rejected = node(&cp, "rej", 7401, &net);
    let mut s = cp.next_stream().await;
    let (id, _) = s.register().await;
    s.respond_register(&id, false, vec![], vec![]).await;
    assert!(rejected.wait_until(|n| n.is_lost(), WAIT).await);

    let mut opts = options();
    opts.register_timeout = Duration::from_millis(300);
    let slow = SimNode::new(spec("slow", 7402), &cp.url(), net.clone(), opts).unwrap();
    slow.start().unwrap();
    let mut s = cp.next_stream().await;
    let _ = s.register().await;
    assert!(slow.wait_until(|n| n.is_lost(), WAIT).await);
    let NodeState::Lost { reason } = slow.state() else {
        unreachable!()
    };
    assert!(reason.contains("timed out"), "{reason}");

    cp.reject_open
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let refused = node(&cp, "grpc", 7403, &net);
    assert!(refused.wait_until(|n| n.is_lost(), WAIT).await);
    assert_eq!(net.resolve("127.0.0.1:7403"), None, "the process exited");
}

#[tokio::test]
async fn deregister_crash_and_restart() {
    let mut cp = ScriptedCp::start().await;
    let net = SimNetwork::new();
    let n = node(&cp, "d", 7501, &net);
    let mut s = cp.next_stream().await;
    let (id, _) = s.register().await;
    s.respond_register(&id, true, vec![], vec![]).await;
    assert!(n.wait_registered(WAIT).await);
    assert_eq!(net.resolve("127.0.0.1:7501").as_deref(), Some("g/d"));

    let pending = tokio::spawn({
        let n = n.clone();
        async move { n.deregister().await }
    });
    let msg = s.recv().await;
    let Some(Payload::DeregisterNodeRequest(req)) = msg.payload else {
        panic!("{msg:?}")
    };
    assert_eq!(req.node.map(|n| n.id).as_deref(), Some("d"));
    let resp = sb::DeregisterNodeResponse {
        original_message_id: msg.message_id,
        success: true,
    };
    s.send(Payload::DeregisterNodeResponse(resp)).await;
    assert!(pending.await.unwrap().unwrap().success);
    assert_eq!(n.state(), NodeState::Stopped);
    assert_eq!(net.resolve("127.0.0.1:7501"), None);

    n.restart().unwrap();
    let mut s = cp.next_stream().await;
    let (id, req) = s.register().await;
    assert_eq!(req.connections.len(), 1);
    s.respond_register(&id, true, vec![], vec![]).await;
    assert!(n.wait_registered(WAIT).await);
    n.crash();
    assert_eq!(n.state(), NodeState::Stopped);
    assert!(
        s.recv_within(WAIT).await.is_none(),
        "the stream dies with the process"
    );
    assert!(
        cp.stream_within(Duration::from_millis(300)).await.is_none(),
        "a crashed node does not reconnect"
    );
}

#[tokio::test]
async fn reconnect_drops_outgoing_links_and_reports_their_routes() {
    let mut cp = ScriptedCp::start().await;
    let net = SimNetwork::new();
    let b = node(&cp, "b", 7602, &net);
    let mut sb_ = cp.next_stream().await;
    let (id, _) = sb_.register().await;
    sb_.respond_register(&id, true, vec![], vec![]).await;
    assert!(b.wait_registered(WAIT).await);
    let a = node(&cp, "a", 7601, &net);
    let mut sa = cp.next_stream().await;
    let (id, _) = sa.register().await;
    let route = sb::Route {
        name: Some(make_name(["org", "ns", "far"], NULL_ID)),
        link_id: Some("L".into()),
        direction: None,
    };
    sa.respond_register(&id, true, vec![link("L", "127.0.0.1:7602")], vec![route])
        .await;
    assert!(sa.ack().await.connections_status[0].success);
    assert!(a.wait_registered(WAIT).await);
    assert_eq!(b.connections().len(), 1);

    drop(sa);
    let mut sa = cp.next_stream().await;
    let (id, req) = sa.register().await;
    assert_eq!(
        req.connections.len(),
        1,
        "only the local connection is left"
    );
    let queued = sa.command().await;
    assert_eq!(
        queued.routes_to_delete.len(),
        1,
        "lost route reported after the request"
    );
    assert!(b.connections().is_empty(), "the far end saw the link close");
    sa.respond_register(&id, true, vec![], vec![]).await;
    assert!(a.wait_until(|n| n.registrations() == 2, WAIT).await);
    assert!(a.routes().is_empty());
}
