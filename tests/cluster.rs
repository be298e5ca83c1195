//! Three `slim-cp serve` processes on one real Postgres, a simulated fleet
//! spread over them through a redispatching load balancer, and the
//! failures an operator drills: the leader killed or frozen, a follower
//! killed, handovers, a node moving between replicas, strangers on the
//! relay. What the nodes hold is checked, not only what the store says;
//! every write to links and routes is audited for its fencing epoch.

mod cluster_support;
mod common;

use std::time::Duration;

use cluster_support::logs::{epoch_sends_after, rfc3339_now};
use cluster_support::{Cluster, MESH};
use slim_cp::proto::cluster as pb;
use slim_cp::store::Store as _;

const GROUPS: [&str; 4] = ["a", "b", "c", "d"];

async fn announce(fleet: &slim_cp::sim::SimFleet, node: &str, name: &str) {
    fleet
        .node(node)
        .expect("node")
        .announce(["org", "ns", name])
        .expect("announced");
}

/// Scenario: the leader is killed with kill -9 while the fleet converges;
/// another replica takes over, the fleet converges exactly, nothing is
/// lost; killed again once converged, every link keeps its id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_and_nothing_is_lost() {
    let mut cluster = Cluster::start(3, MESH).await;
    let (first, epoch) = cluster.leader().await;
    let fleet = cluster.fleet(&GROUPS, 3).await;
    announce(&fleet, "a/n0", "alpha").await;
    cluster.replicas[first].kill9();
    let (second, epoch2) = cluster.next_leader(epoch).await;
    assert_ne!(second, first);
    announce(&fleet, "c/n1", "gamma").await;
    let names = [("alpha", "a"), ("gamma", "c")];
    let ids = cluster.converged(&fleet, GROUPS.len(), &names).await;

    cluster.replicas[second].kill9();
    cluster.next_leader(epoch2).await;
    let after = cluster.converged(&fleet, GROUPS.len(), &names).await;
    assert_eq!(after, ids, "links whose gateways survived keep their ids");
    assert_eq!(fleet.lost_count(), 0, "lost: {:?}", fleet.lost());
    assert!(
        fleet.nodes().iter().all(|n| n.registrations() <= 3),
        "no node restarted"
    );
    cluster.assert_fenced().await;
}

/// Scenario: a follower holding a third of the sessions is killed; its
/// nodes reconnect once, through the balancer, to the others; the fleet
/// converges with the same links.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_follower_moves_its_nodes_and_keeps_every_link() {
    let mut cluster = Cluster::start(3, MESH).await;
    let (leader, _) = cluster.leader().await;
    let fleet = cluster.fleet(&GROUPS, 3).await;
    announce(&fleet, "b/n2", "beta").await;
    let names = [("beta", "b")];
    let ids = cluster.converged(&fleet, GROUPS.len(), &names).await;
    let victim = (leader + 1) % 3;
    let held = cluster
        .store
        .counts()
        .await
        .expect("counts")
        .sessions
        .get(&cluster.replicas[victim].id)
        .copied()
        .unwrap_or(0);
    assert!(held > 0, "the follower holds sessions");
    cluster.replicas[victim].kill9();
    cluster
        .wait("the dead follower's nodes registered elsewhere", || async {
            let counts = cluster.store.counts().await.map_err(|e| e.to_string())?;
            let left = counts
                .sessions
                .get(&cluster.replicas[victim].id)
                .copied()
                .unwrap_or(0);
            if left == 0 && counts.connected == 12 {
                Ok(())
            } else {
                Err(format!("{counts:?}"))
            }
        })
        .await;
    let after = cluster.converged(&fleet, GROUPS.len(), &names).await;
    assert_eq!(after, ids);
    assert_eq!(fleet.lost_count(), 0, "lost: {:?}", fleet.lost());
    cluster.assert_fenced().await;
}

/// Scenario: fifty step-downs in a row, asked of any replica while a node
/// flaps, then kills of the leader: each time exactly one replica leads,
/// under a higher epoch, holding the election lock; every write carries
/// the standing epoch; no node is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_elections_never_overlap() {
    let mut cluster = Cluster::start(3, MESH).await;
    let fleet = cluster.fleet(&["a", "b"], 2).await;
    let (_, mut epoch) = cluster.leader().await;
    let db = cluster_support::sql(&cluster.url).await;
    for round in 0..53 {
        let (leader, _) = cluster.leader().await;
        let n = fleet.node("b/n1").expect("node");
        if round % 2 == 0 {
            // A registration racing the handover must not fail.
            n.crash();
            n.restart().expect("restarts");
        }
        if round < 50 {
            let mut admin = cluster.replicas[(leader + round) % 3]
                .admin()
                .await
                .expect("admin");
            admin
                .step_down(pb::StepDownRequest {})
                .await
                .expect("step-down");
        } else {
            // A registration cut by a kill is lost for good (the node's
            // rule, not ours): kill only once it is through.
            assert!(n.wait_registered(cluster_support::PATIENCE).await);
            cluster.replicas[leader].kill9();
        }
        let (now, next) = cluster.next_leader(epoch).await;
        assert!(cluster.replicas[now].is_running());
        let rows = db
            .query(
                "SELECT l.leader_pid, k.pid FROM leadership l LEFT JOIN pg_locks k \
                   ON k.locktype = 'advisory' AND k.classid = 1936484717 AND k.objid = 2 \
                   AND k.granted \
                   AND k.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                &[],
            )
            .await
            .expect("lock rows");
        let pids: Vec<(Option<i32>, Option<i32>)> =
            rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        assert!(
            pids.len() == 1 && pids[0].0.is_some() && pids[0].0 == pids[0].1,
            "the leader holds the election lock (round {round}): {pids:?}"
        );
        epoch = next;
        if round >= 50 {
            cluster.replicas[leader].spawn();
        }
    }
    assert!(epoch >= 54, "one term per election: epoch {epoch}");
    cluster.assert_fenced().await;
    assert_eq!(fleet.lost_count(), 0, "lost: {:?}", fleet.lost());
}

/// Scenario: the leader is frozen (SIGSTOP) past its lease while the
/// fleet keeps changing; a standby takes over; after SIGCONT the old
/// leader sends no command and writes nothing under its epoch, and steps
/// down; the fleet converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leader_is_replaced_and_acts_no_more_when_it_wakes() {
    let cluster = Cluster::start(3, MESH).await;
    let fleet = cluster.fleet(&GROUPS, 3).await;
    let (frozen, epoch) = cluster.leader().await;
    announce(&fleet, "a/n0", "alpha").await;
    cluster
        .converged(&fleet, GROUPS.len(), &[("alpha", "a")])
        .await;
    let before: usize = cluster
        .replicas
        .iter()
        .map(|r| epoch_sends_after(&r.log(), epoch, "").len())
        .sum();
    assert!(before > 0, "the leader sent commands before it froze");
    cluster.replicas[frozen].signal("STOP");
    announce(&fleet, "d/n2", "delta").await;
    let (_, epoch2) = cluster.next_leader(epoch).await;
    // Past the frozen replica's TTL too: its sessions end and its nodes'
    // links must not outlive them.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let woke = rfc3339_now();
    cluster.replicas[frozen].signal("CONT");
    cluster.stood_down(frozen).await;
    let names = [("alpha", "a"), ("delta", "d")];
    cluster.converged(&fleet, GROUPS.len(), &names).await;
    for r in &cluster.replicas {
        let late = epoch_sends_after(&r.log(), epoch, &woke);
        assert!(
            late.is_empty(),
            "{} sent for epoch {epoch} after waking: {late:?}",
            r.id
        );
    }
    assert!(cluster.leader().await.1 >= epoch2);
    cluster.assert_fenced().await;
    assert_eq!(fleet.lost_count(), 0, "lost: {:?}", fleet.lost());
}

/// The replicas' own counts of refused commands and relay calls, and
/// whether any logged a failed reconcile.
async fn refusals(cluster: &Cluster) -> Vec<String> {
    let mut out = Vec::new();
    for r in &cluster.replicas {
        if let Some(s) = r.inspect(&cluster.token).await {
            if s.commands_fenced > 0 || !s.relay_refused.is_empty() {
                out.push(format!(
                    "{}: fenced {}, relay {:?}",
                    r.id, s.commands_fenced, s.relay_refused
                ));
            }
        }
        let failed = r
            .log()
            .lines()
            .filter(|l| l.contains("reconcile failed"))
            .count();
        if failed > 0 {
            out.push(format!("{}: {failed} failed reconciles", r.id));
        }
    }
    out
}

/// Scenario: a step-down asked of a follower, then SIGTERM to the new
/// leader, while names are announced: each hands over at once, the fleet
/// converges, no reconcile fails, no command or relay call is refused,
/// and the stopped replica exits cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_down_and_sigterm_hand_over_cleanly() {
    let mut cluster = Cluster::start(3, MESH).await;
    let fleet = cluster.fleet(&GROUPS, 3).await;
    announce(&fleet, "a/n0", "alpha").await;
    cluster
        .converged(&fleet, GROUPS.len(), &[("alpha", "a")])
        .await;
    let (leader, epoch) = cluster.leader().await;
    announce(&fleet, "b/n1", "beta").await;
    let mut admin = cluster.replicas[(leader + 1) % 3]
        .admin()
        .await
        .expect("admin");
    let reply = admin
        .step_down(pb::StepDownRequest {})
        .await
        .expect("step-down")
        .into_inner();
    assert_eq!(
        (reply.replica.as_str(), reply.epoch),
        (cluster.replicas[leader].id.as_str(), epoch)
    );
    let (next, epoch2) = cluster.next_leader(epoch).await;
    announce(&fleet, "c/n2", "gamma").await;
    cluster.replicas[next].signal("TERM");
    let exited = cluster.replicas[next].wait_exit(cluster_support::PATIENCE);
    assert!(
        exited.is_some_and(|s| s.success()),
        "a clean exit: {exited:?}"
    );
    cluster.next_leader(epoch2).await;
    let names = [("alpha", "a"), ("beta", "b"), ("gamma", "c")];
    cluster.converged(&fleet, GROUPS.len(), &names).await;
    assert_eq!(refusals(&cluster).await, Vec::<String>::new());
    assert_eq!(fleet.lost_count(), 0, "lost: {:?}", fleet.lost());
    cluster.assert_fenced().await;
}

/// Scenario: calls to a replica's relay without credentials, with wrong
/// ones, and a command under an epoch older than the replica has seen:
/// all refused, counted by reason, and the node gets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_refuses_strangers_and_stale_epochs() {
    let cluster = Cluster::start(3, MESH).await;
    let fleet = cluster.fleet(&["a", "b"], 3).await;
    let (leader, epoch) = cluster.leader().await;
    let mut admin = cluster.replicas[leader].admin().await.expect("admin");
    admin
        .step_down(pb::StepDownRequest {})
        .await
        .expect("step-down");
    let (_, epoch) = cluster.next_leader(epoch).await;
    cluster.converged(&fleet, 2, &[]).await;
    // A node and the replica owning its session.
    let nodes = cluster.store.list_nodes().await.expect("nodes");
    let (node, owner) = nodes
        .iter()
        .find_map(|n| Some((n.clone(), cluster.index_of(&n.session.as_ref()?.owner.id))))
        .expect("a node on some replica");
    let target = &cluster.replicas[owner];
    cluster
        .wait("the owner learns the epoch", || async {
            let s = target.inspect(&cluster.token).await.ok_or("no answer")?;
            if s.highest_epoch >= epoch {
                Ok(())
            } else {
                Err(format!("{s:?}"))
            }
        })
        .await;
    let session = node.session.as_ref().expect("session").id.to_string();
    let forward = |token: Option<&str>, epoch: u64| {
        let mut req = tonic::Request::new(pb::ForwardRequest {
            node: node.id.clone(),
            session_id: session.clone(),
            epoch,
            request: Some(pb::forward_request::Request::Command(Default::default())),
        });
        if let Some(t) = token {
            req.metadata_mut().insert(
                slim_cp::cluster::relay::auth::HEADER,
                t.parse().expect("ascii"),
            );
        }
        req
    };
    let sim = fleet.node(&node.id).expect("sim node");
    let before = sim.commands_received();
    let mut relay = target.relay_client().await;
    let none = relay
        .forward(forward(None, epoch))
        .await
        .expect_err("refused");
    assert_eq!(none.code(), tonic::Code::Unauthenticated);
    let wrong = slim_cp::cluster::relay::auth::token(&"w".repeat(32));
    let bad = relay
        .forward(forward(Some(&wrong), epoch))
        .await
        .expect_err("refused");
    assert_eq!(bad.code(), tonic::Code::Unauthenticated);
    let stale = relay
        .forward(forward(Some(&cluster.token), epoch - 1))
        .await
        .expect_err("refused");
    assert_eq!(stale.code(), tonic::Code::FailedPrecondition, "{stale:?}");
    let state = target.inspect(&cluster.token).await.expect("inspect");
    for reason in ["no credentials", "bad credentials", "stale epoch"] {
        assert!(
            state.relay_refused.get(reason) >= Some(&1),
            "{reason}: {state:?}"
        );
    }
    assert!(state.commands_fenced >= 1, "{state:?}");
    assert_eq!(sim.commands_received(), before, "the node got nothing");
}

/// Scenario: a node registers on replica A, then again on replica B while
/// its first stream is still open on A (its old connection lingers): the
/// database holds one session, on B; A closes the old stream by itself;
/// when the old stream's end finally reaches A it changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_moving_replicas_ends_with_one_session_on_the_new_one() {
    let cluster = Cluster::start(3, MESH).await;
    let (a, b) = (&cluster.replicas[0], &cluster.replicas[1]);
    let mut first = common::RawNode::open_at(a.southbound())
        .await
        .expect("opens on A");
    assert!(
        first
            .register(common::mk_register("g", "mover"))
            .await
            .success
    );
    let mut second = common::RawNode::open_at(b.southbound())
        .await
        .expect("opens on B");
    assert!(
        second
            .register(common::mk_register("g", "mover"))
            .await
            .success
    );
    // A closes its stream of the replaced session without being asked.
    while let Ok(Some(_)) = first.recv().await {}
    drop(first);
    cluster
        .wait("one session, on B, and none held on A", || async {
            let rec = cluster
                .store
                .get_node("g/mover")
                .await
                .map_err(|e| e.to_string())?;
            let owner = rec.and_then(|r| r.session).map(|s| s.owner.id);
            let on_a = a.inspect(&cluster.token).await.map(|s| s.sessions);
            let on_b = b.inspect(&cluster.token).await.map(|s| s.sessions);
            if owner.as_deref() == Some(b.id.as_str()) && on_a == Some(0) && on_b == Some(1) {
                Ok(())
            } else {
                Err(format!("owner {owner:?}, on A {on_a:?}, on B {on_b:?}"))
            }
        })
        .await;
}

/// Scenario: the leader and every node are killed; the nodes come back on
/// other endpoints; the new leader re-points every link and the fleet
/// converges over the new endpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moved_endpoints_after_a_failover_converge() {
    let mut cluster = Cluster::start(3, MESH).await;
    let mut fleet = cluster.fleet(&GROUPS, 3).await;
    announce(&fleet, "a/n1", "alpha").await;
    cluster
        .converged(&fleet, GROUPS.len(), &[("alpha", "a")])
        .await;
    let (leader, epoch) = cluster.leader().await;
    cluster.replicas[leader].kill9();
    fleet.crash_all();
    let moved = common::scenario::respawn_all_elsewhere(&mut fleet).await;
    announce(&fleet, "a/n1", "alpha").await;
    cluster.next_leader(epoch).await;
    cluster
        .converged(&fleet, GROUPS.len(), &[("alpha", "a")])
        .await;
    let links = cluster.store.list_links().await.expect("links");
    let live: Vec<_> = links.into_iter().filter(|l| !l.deleted).collect();
    common::scenario::assert_links_point_at(&live, &moved);
    cluster.assert_fenced().await;
}

/// Scenario: the operator's calls (slimctl) answered by every replica:
/// node listings from the database, and a node's live connections asked
/// through a replica that does not hold its stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_calls_work_from_any_replica() {
    use slim_cp::proto::nb;
    use slim_cp::proto::nb::control_plane_service_client::ControlPlaneServiceClient;
    let cluster = Cluster::start(3, MESH).await;
    let fleet = cluster.fleet(&["a", "b", "c"], 2).await;
    cluster.converged(&fleet, 3, &[]).await;
    let nodes = cluster.store.list_nodes().await.expect("nodes");
    for r in &cluster.replicas {
        let url = format!("http://127.0.0.1:{}", r.nb);
        let mut client = ControlPlaneServiceClient::connect(url)
            .await
            .expect("northbound");
        let mut listed = client
            .list_nodes(nb::NodeListRequest::default())
            .await
            .expect("list")
            .into_inner();
        let mut count = 0;
        while let Some(entry) = listed.message().await.expect("entry") {
            assert!(nodes.iter().any(|n| n.id == entry.id), "{entry:?}");
            count += 1;
        }
        assert_eq!(count, nodes.len(), "every node, from {}", r.id);
        for n in &nodes {
            let owner = &n.session.as_ref().expect("session").owner.id;
            if *owner == r.id {
                continue;
            }
            let conns = client
                .list_connections(nb::Node { id: n.id.clone() })
                .await
                .expect("connections through the relay")
                .into_inner();
            let held = fleet.node(&n.id).expect("sim").connection_entries().len();
            assert_eq!(conns.entries.len(), held, "{} asked of {}", n.id, r.id);
        }
    }
}

/// Scenario: a deposed leader's fenced transaction stays open on the
/// leadership row (its process frozen, or cut off behind a proxy that
/// keeps its session alive) when the leader dies. The next leader ends
/// that transaction and starts its term within a few leases instead of
/// waiting for Postgres to end it (regression: the partition drill
/// measured a 30 s takeover, the idle-in-transaction timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_transaction_on_the_leadership_row_does_not_stall_a_takeover() {
    let mut cluster = Cluster::start(3, MESH).await;
    let (leader, epoch) = cluster.leader().await;
    let mut config: tokio_postgres::Config = cluster.url.parse().expect("test URL");
    config.application_name("slim-cp");
    let (stale, conn) = config
        .connect(tokio_postgres::NoTls)
        .await
        .expect("database");
    tokio::spawn(conn);
    stale
        .batch_execute("BEGIN; SELECT epoch FROM leadership WHERE singleton FOR SHARE")
        .await
        .expect("row share-locked");
    let killed = std::time::Instant::now();
    cluster.replicas[leader].kill9();
    cluster.next_leader(epoch).await;
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(15), "takeover took {took:?}");
    assert!(
        stale.simple_query("SELECT 1").await.is_err(),
        "the stale transaction was ended"
    );
}
