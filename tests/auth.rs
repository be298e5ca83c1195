//! Registration authentication over real gRPC: a node with a good token
//! registers; every bad token is answered `success: false`, the stream ends
//! UNAUTHENTICATED, and nothing about the node is recorded or listed.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{RawNode, mk_register, start_replica, stored_node_ids};
use slim_cp::auth::{SharedSecretAuth, mint_token};
use slim_cp::config::SharedSecret;
use slim_cp::proto::nb::control_plane_service_client::ControlPlaneServiceClient;
use slim_cp::proto::{nb, sb};
use slim_cp::server::{Options, Running};
use slim_cp::sim::{NodeState, SimNetwork, SimNode, SimNodeSpec, SimOptions};
use tonic::Code;

const SECRET_A: &str = "secret-of-group-a-0123456789abcdef";
const SECRET_B: &str = "secret-of-group-b-0123456789abcdef";

async fn mk_auth_replica() -> Running {
    let secrets = [("a", SECRET_A), ("b", SECRET_B)]
        .into_iter()
        .map(|(g, s)| (g.to_string(), SharedSecret::new(s).unwrap()))
        .collect();
    start_replica(Options {
        auth: Arc::new(SharedSecretAuth::new(secrets)),
        ..Options::loopback()
    })
    .await
}

fn now() -> u64 {
    u64::try_from(slim_cp::clock::unix_now()).unwrap()
}

fn request(group: Option<&str>, node: &str, credentials: String) -> sb::RegisterNodeRequest {
    sb::RegisterNodeRequest {
        group_name: group.map(str::to_string),
        credentials,
        ..mk_register(group.unwrap_or_default(), node)
    }
}

/// Node ids with their status, from the store and from the northbound
/// `ListNodes`, which must agree.
async fn listed(cp: &Running) -> Vec<(String, i32)> {
    let mut client = ControlPlaneServiceClient::connect(format!("http://{}", cp.northbound_addr))
        .await
        .expect("northbound reachable");
    let mut stream = client
        .list_nodes(nb::NodeListRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut from_api = Vec::new();
    while let Some(n) = stream.message().await.unwrap() {
        from_api.push((n.id, n.status));
    }
    from_api.sort();
    let from_store = stored_node_ids(cp).await;
    let api_ids: Vec<&String> = from_api.iter().map(|(id, _)| id).collect();
    assert_eq!(api_ids, from_store.iter().collect::<Vec<_>>());
    from_api
}

/// Registers with `req` and expects the refusal, with `reason` in the
/// status that ends the stream.
async fn expect_refused(cp: &Running, req: sb::RegisterNodeRequest, reason: &str) {
    let mut node = RawNode::open(cp).await.expect("stream opens");
    let resp = node.register(req).await;
    assert!(!resp.success, "refused with success: false");
    node.expect_end(Code::Unauthenticated, reason).await;
}

#[tokio::test]
async fn a_good_token_registers_and_is_listed() {
    let cp = mk_auth_replica().await;
    let token = mint_token("a", "n1", SECRET_A, now());
    let mut node = RawNode::open(&cp).await.unwrap();
    let resp = node.register(request(Some("a"), "n1", token)).await;
    assert!(resp.success);
    let connected = nb::NodeStatus::Connected as i32;
    assert_eq!(listed(&cp).await, vec![("a/n1".to_string(), connected)]);
}

#[tokio::test]
async fn bad_credentials_are_refused_and_never_recorded() {
    let cp = mk_auth_replica().await;
    let now = now();
    let cases = [
        (Some("a"), "n1", String::new(), "no credentials"),
        (
            Some("a"),
            "n1",
            mint_token("a", "n1", SECRET_B, now),
            "signature",
        ),
        (
            Some("a"),
            "n1",
            mint_token("b", "n1", SECRET_B, now),
            "signature",
        ),
        (
            Some("a"),
            "n1",
            mint_token("a", "n2", SECRET_A, now),
            "identity",
        ),
        (
            Some("a"),
            "n1",
            mint_token("a", "n10", SECRET_A, now),
            "identity",
        ),
        (
            Some("a"),
            "n1",
            mint_token("a", "n1", SECRET_A, now - 7200),
            "expired",
        ),
        (
            Some("a"),
            "n1",
            mint_token("a", "n1", SECRET_A, now + 600),
            "future",
        ),
        (Some("a"), "n1", "a:b:c".to_string(), "malformed"),
        (Some("a"), "n1", "a/n1:soon:x::y".to_string(), "malformed"),
        (
            Some("c"),
            "n1",
            mint_token("c", "n1", SECRET_A, now),
            "no shared secret",
        ),
        (
            None,
            "n1",
            mint_token("a", "n1", SECRET_A, now),
            "no group name",
        ),
        (
            Some(""),
            "n1",
            mint_token("a", "n1", SECRET_A, now),
            "no group name",
        ),
    ];
    for (group, node, credentials, reason) in cases {
        expect_refused(&cp, request(group, node, credentials), reason).await;
    }
    assert_eq!(listed(&cp).await, vec![]);
}

#[tokio::test]
async fn the_refusal_never_echoes_the_secret_or_the_token() {
    let cp = mk_auth_replica().await;
    let token = mint_token("a", "n1", SECRET_B, now());
    let mut node = RawNode::open(&cp).await.unwrap();
    assert!(
        !node
            .register(request(Some("a"), "n1", token.clone()))
            .await
            .success
    );
    let status = node.recv().await.expect_err("the stream ends");
    let mac = token.rsplit_once(':').unwrap().1;
    for secret in [SECRET_A, SECRET_B, token.as_str(), mac] {
        assert!(!status.message().contains(secret), "{}", status.message());
    }
}

/// An impostor refused for a node id that is registered must not displace
/// the real node's session.
#[tokio::test]
async fn an_impostor_does_not_displace_the_registered_node() {
    let cp = mk_auth_replica().await;
    let mut real = RawNode::open(&cp).await.unwrap();
    let good = mint_token("a", "n1", SECRET_A, now());
    assert!(real.register(request(Some("a"), "n1", good)).await.success);
    let session = || async {
        let record = cp.store.get_node("a/n1").await.unwrap().unwrap();
        record.session.map(|s| (s.id, s.generation))
    };
    let before = session().await;
    assert!(before.is_some());
    let forged = mint_token("a", "n1", SECRET_B, now());
    expect_refused(&cp, request(Some("a"), "n1", forged), "signature").await;
    assert_eq!(session().await, before, "the session is untouched");
    let connected = nb::NodeStatus::Connected as i32;
    assert_eq!(listed(&cp).await, vec![("a/n1".to_string(), connected)]);
    // Commands may flow (the leader queries new nodes); the stream must not end.
    let watch_until = tokio::time::Instant::now() + Duration::from_millis(500);
    while let Ok(next) = tokio::time::timeout_at(watch_until, real.rx.message()).await {
        assert!(
            matches!(next, Ok(Some(_))),
            "the real node's stream ended: {next:?}"
        );
    }
}

fn sim_options() -> SimOptions {
    SimOptions {
        connect_retry_interval: Duration::from_millis(50),
        register_timeout: Duration::from_secs(5),
        ..SimOptions::default()
    }
}

/// A simulated node `a/{node}` listening (in memory) on `port`.
fn sim_node(
    cp: &Running,
    net: &Arc<SimNetwork>,
    (node, port): (&str, u16),
    credentials: String,
) -> SimNode {
    let mut spec = SimNodeSpec::new(node, Some("a"), &format!("127.0.0.1:{port}"));
    spec.credentials = credentials;
    let url = format!("http://{}", cp.southbound_addr);
    let sim = SimNode::new(spec, &url, net.clone(), sim_options()).unwrap();
    sim.start().unwrap();
    sim
}

/// A simulated node with a minted token registers; one with a bad token is
/// refused and, like a real node, gives up for good.
#[tokio::test]
async fn simulated_nodes_with_good_and_bad_tokens() {
    let cp = mk_auth_replica().await;
    let net = SimNetwork::new();
    let good = sim_node(
        &cp,
        &net,
        ("good", 7101),
        mint_token("a", "good", SECRET_A, now()),
    );
    let bad = sim_node(
        &cp,
        &net,
        ("bad", 7102),
        mint_token("a", "bad", SECRET_B, now()),
    );
    assert!(good.wait_registered(Duration::from_secs(10)).await);
    let lost = |n: &SimNode| matches!(n.state(), NodeState::Lost { .. });
    assert!(
        bad.wait_until(lost, Duration::from_secs(10)).await,
        "{:?}",
        bad.state()
    );
    assert_eq!(bad.registrations(), 0);
    let NodeState::Lost { reason } = bad.state() else {
        unreachable!()
    };
    assert!(reason.contains("rejected"), "{reason}");
    let connected = nb::NodeStatus::Connected as i32;
    assert_eq!(listed(&cp).await, vec![("a/good".to_string(), connected)]);
}
