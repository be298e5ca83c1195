//! A replica that cannot serve its nodes hands them over: without its
//! database it stops listening (a connect is refused, not left hanging)
//! and, when a peer is ready, closes its streams so the nodes move; when
//! the leader's relay cannot reach it, the leader flags it for drain and
//! lifts the flag once the relay answers. In-process replicas on real
//! gRPC over loopback and a real Postgres; the cuts are proxies.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::cut::cuttable_database;
use common::pg::{fresh_pg_database, pg_url_for};
use common::proxy::Proxy;
use common::scenario::{mk_fleet_at, mk_links};
use common::{mk_cluster_config, wait_for};
use slim_cp::config::{ClusterConfig, DrainConfig, ReconcilerConfig};
use slim_cp::proto::cluster as pb;
use slim_cp::server::{self, Options, Running, Sockets};
use slim_cp::sim::{Balancer, SimFleet};
use slim_cp::store::PgStore;

fn mk_options() -> Options {
    Options {
        http: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
        topology: mk_links(&[("*", &["*"])]),
        reconciler: ReconcilerConfig {
            base_retry_delay: Duration::from_millis(50),
            ..ReconcilerConfig::default()
        },
        drain: DrainConfig {
            lb_grace: Duration::from_millis(200),
            batch: 2,
            interval: Duration::from_millis(100),
        },
        ..Options::loopback()
    }
}

/// A replica on the database at `url` with `cluster`.
async fn mk_member_with(url: &str, cluster: ClusterConfig) -> Running {
    let store = PgStore::connect(url, 4).await.expect("connects");
    server::start_clustered(mk_options(), store, cluster)
        .await
        .expect("replica starts")
}

async fn mk_member(url: &str, id: &str) -> Running {
    mk_member_with(url, mk_cluster_config(id)).await
}

/// A replica whose relay its peers reach only through a proxy they can
/// cut; the proxy is returned with it.
async fn mk_member_behind_proxy(url: &str, id: &str) -> (Running, Proxy) {
    let mut cluster = mk_cluster_config(id);
    let opts = mk_options();
    let relay = server::relay_addr(&cluster).expect("relay address");
    let sockets = Sockets::bind(&opts, Some(relay)).expect("binds");
    let proxy = Proxy::start(sockets.relay_addr().expect("relay bound")).await;
    cluster.relay_advertise = Some(proxy.addr.to_string());
    let store = PgStore::connect(url, 4).await.expect("connects");
    let cp = server::start_clustered_on(sockets, opts, store, cluster)
        .await
        .expect("replica starts");
    (cp, proxy)
}

/// Six nodes, each on its own connection, registered through `lb`.
async fn mk_fleet(lb: &Balancer) -> SimFleet {
    mk_fleet_at(&lb.url(), &[("a", 3), ("b", 3)], 1).await
}

/// Waits until a TCP connect to `addr` is refused (`open`: accepted).
async fn wait_listener(addr: SocketAddr, open: bool, what: &str) {
    wait_for(what, || async {
        match (tokio::net::TcpStream::connect(addr).await, open) {
            (Ok(_), true) | (Err(_), false) => Ok(()),
            (r, _) => Err(format!("connect: {:?}", r.map(|_| "accepted"))),
        }
    })
    .await;
}

async fn wait_ready(cp: &Running, ready: bool, what: &str) -> String {
    wait_for(what, || async {
        match (cp.health.ready(), ready) {
            (Ok(()), true) => Ok(String::new()),
            (Err(why), false) => Ok(why.join("; ")),
            (r, _) => Err(format!("{r:?}")),
        }
    })
    .await
}

/// Waits until `from` holds no stream and `to` hold all six.
async fn wait_moved(from: &Running, to: &[&Running], fleet: &SimFleet) {
    wait_for("every node moved", || async {
        let on: usize = to.iter().map(|r| r.registry().len()).sum();
        match (from.registry().len(), on) {
            (0, 6) => Ok(()),
            other => Err(format!("(left, moved): {other:?}, lost {:?}", fleet.lost())),
        }
    })
    .await;
}

/// `slim-cp status` asked of `cp`: its relay inspects every live peer.
async fn status(cp: &Running) -> pb::ClusterStatus {
    let url = format!("http://{}", cp.northbound_addr);
    let mut client = pb::admin_client::AdminClient::connect(url)
        .await
        .expect("northbound");
    client
        .status(pb::StatusRequest {})
        .await
        .expect("status")
        .into_inner()
}

/// Waits until `slim-cp status`, asked of `cp`, shows replica `id`'s
/// drain flag as `want`.
async fn wait_drain_flag(cp: &Running, id: &str, want: bool, what: &str) {
    wait_for(what, || async {
        let s = status(cp).await;
        match s.replicas.iter().find(|r| r.id == id).map(|r| r.drain) {
            Some(flag) if flag == want => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// Scenario: one replica, its nodes connected; the database path is cut:
/// the node listener closes (connects refused) and `/readyz` says why;
/// with no peer to take them, every stream stays open. The database
/// returns: the listener opens again and the replica is ready, no node
/// having registered twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_without_its_database_refuses_connects_until_it_returns() {
    let (path, url) = cuttable_database().await;
    let cp = mk_member(&url, "cp-a").await;
    let lb = Balancer::start(vec![cp.southbound_addr]).await.expect("lb");
    let fleet = mk_fleet(&lb).await;
    wait_ready(&cp, true, "ready").await;

    path.cut();
    wait_listener(cp.southbound_addr, false, "connects refused").await;
    let why = wait_ready(&cp, false, "not ready").await;
    assert!(why.contains("not listening"), "{why}");
    assert!(why.contains("database unreachable"), "{why}");
    path.restore();
    wait_listener(cp.southbound_addr, true, "connects accepted again").await;
    wait_ready(&cp, true, "ready again").await;

    let counts: Vec<u64> = fleet.nodes().iter().map(|n| n.registrations()).collect();
    assert_eq!(
        counts,
        vec![1; 6],
        "no stream was closed: no peer was ready"
    );
    assert_eq!(cp.registry().len(), 6);
    assert_eq!(fleet.lost_count(), 0, "lost: {:?}", fleet.lost());
}

/// Scenario: replica A holds six nodes, B joins behind the same
/// redispatching balancer; A's database path is cut: A stops listening,
/// sees B ready over the relay, and closes its streams: every node moves
/// to B, none lost. The path restored, A listens and is ready again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_from_its_database_hands_its_nodes_to_a_ready_peer() {
    let db = fresh_pg_database().await;
    let direct = pg_url_for(&db);
    let path = Proxy::start(common::cut::pg_addr()).await;
    let via_path = direct.replace(&common::cut::pg_addr().to_string(), &path.addr.to_string());
    let a = mk_member(&via_path, "cp-a").await;
    let lb = Balancer::start(vec![a.southbound_addr]).await.expect("lb");
    let fleet = mk_fleet(&lb).await;
    let b = mk_member(&direct, "cp-b").await;
    lb.set_backends(vec![a.southbound_addr, b.southbound_addr]);
    wait_ready(&b, true, "B ready").await;
    wait_for("A's relay reaches B", || async {
        let s = status(&a).await;
        let live = s
            .replicas
            .iter()
            .any(|r| r.id == "cp-b" && r.live.is_some());
        if live { Ok(()) } else { Err(format!("{s:?}")) }
    })
    .await;

    path.cut();
    wait_listener(a.southbound_addr, false, "A refuses connects").await;
    wait_moved(&a, &[&b], &fleet).await;
    // B holds a stream before its reply reaches the node.
    wait_for("each node registered twice (moved once)", || async {
        let counts: Vec<u64> = fleet.nodes().iter().map(|n| n.registrations()).collect();
        if counts == [2; 6] {
            Ok(())
        } else {
            Err(format!("{counts:?}"))
        }
    })
    .await;
    assert_eq!(fleet.lost_count(), 0, "lost: {:?}", fleet.lost());

    path.restore();
    wait_listener(a.southbound_addr, true, "A accepts connects again").await;
    wait_ready(&a, true, "A ready again").await;
    assert_eq!(fleet.lost_count(), 0, "lost: {:?}", fleet.lost());
}

/// Scenario: A leads, B holds six nodes, C is idle; A's relay calls to B
/// fail (B's relay proxy cut) while B heartbeats: after repeated
/// failures A flags B for drain (C answers A: it is not A that is cut
/// off); B stops listening and moves its nodes to A and C. The relay
/// restored, A lifts the flag and B serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_drains_a_replica_its_relay_cannot_reach_and_lifts_it_after() {
    let url = pg_url_for(&fresh_pg_database().await);
    let a = mk_member(&url, "cp-a").await;
    wait_for("A leads", || async {
        a.leadership
            .token()
            .map(|_| ())
            .ok_or("not yet".to_string())
    })
    .await;
    let (b, relay) = mk_member_behind_proxy(&url, "cp-b").await;
    let c = mk_member(&url, "cp-c").await;
    let lb = Balancer::start(vec![b.southbound_addr]).await.expect("lb");
    let fleet = mk_fleet(&lb).await;
    let all = vec![a.southbound_addr, b.southbound_addr, c.southbound_addr];
    lb.set_backends(all);
    wait_ready(&c, true, "C ready").await;

    relay.cut();
    wait_drain_flag(&a, "cp-b", true, "B flagged for drain").await;
    wait_listener(b.southbound_addr, false, "B refuses connects").await;
    let why = wait_ready(&b, false, "B not ready").await;
    assert!(why.contains("flagged by the leader"), "{why}");
    wait_moved(&b, &[&a, &c], &fleet).await;
    assert_eq!(fleet.lost_count(), 0, "lost: {:?}", fleet.lost());

    relay.restore();
    wait_drain_flag(&a, "cp-b", false, "B's flag lifted").await;
    wait_listener(b.southbound_addr, true, "B accepts connects again").await;
    wait_ready(&b, true, "B ready again").await;
    assert_eq!(fleet.lost_count(), 0, "lost: {:?}", fleet.lost());
}
