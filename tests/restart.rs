//! A single replica on Postgres restarted under a converged fleet, behind
//! a load balancer that retries backend connects: nothing is lost, no link
//! is re-planned, and only the far ends of the links the nodes dial again
//! get a command.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use common::pg::{fresh_pg_database, pg_url_for};
use common::proxy::Proxy;
use common::scenario::{
    assert_links_point_at, fleet_options, mk_links, respawn_all_elsewhere, wait_links,
    wait_reachable,
};
use common::{PATIENCE, wait_for};
use slim_cp::config::ReconcilerConfig;
use slim_cp::proto::sb::ConnectionDirection;
use slim_cp::server::{self, Options, Running};
use slim_cp::sim::{SimFleet, SimNodeSpec};
use slim_cp::store::PgStore;
use slim_cp::store::model::ReplicaRef;

async fn mk_replica(url: &str, incarnation: u64) -> Running {
    let store = PgStore::connect(url, 4).await.expect("connects");
    let opts = Options {
        topology: mk_links(&[("*", &["*"])]),
        replica: ReplicaRef {
            id: "solo".into(),
            incarnation,
        },
        reconciler: ReconcilerConfig {
            base_retry_delay: Duration::from_millis(50),
            ..ReconcilerConfig::default()
        },
        ..Options::loopback()
    };
    server::start(opts, Arc::new(store))
        .await
        .expect("replica starts")
}

/// `per_group` nodes in each group, numbered across the fleet (`a/n0`,
/// `a/n1`, `b/n2`, ...).
fn mk_specs(groups: &[&str], per_group: usize) -> Vec<SimNodeSpec> {
    let mut specs = Vec::new();
    for g in groups {
        for _ in 0..per_group {
            let i = specs.len();
            let endpoint = format!("127.0.0.1:{}", 31000 + i);
            let mut spec = SimNodeSpec::new(&format!("n{i}"), Some(g), &endpoint);
            spec.external_endpoint = Some(endpoint);
            specs.push(spec);
        }
    }
    specs
}

/// A fleet of `specs` reaching the replicas through `lb`, each node on its
/// own TCP connection like a real one, all registered.
async fn mk_fleet(lb: &Proxy, specs: Vec<SimNodeSpec>) -> SimFleet {
    let opts = fleet_options(1);
    let fleet = SimFleet::start(&format!("http://{}", lb.addr), specs, opts).unwrap();
    assert!(fleet.wait_all_registered(PATIENCE).await);
    fleet
}

fn link_ids(links: &[slim_cp::store::model::Link]) -> BTreeSet<String> {
    links.iter().map(|l| l.link_id.clone()).collect()
}

/// The nodes holding a route over an incoming connection: what a restart
/// may cost a command. A source drops its outgoing links when it reconnects
/// (a real node does, before it redials) and its registration reply creates
/// them again, so the far end's routes over the old connection go with it
/// and come back by command once the new one is claimed.
fn incoming_route_holders(fleet: &SimFleet) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for n in fleet.nodes() {
        let incoming: BTreeSet<u64> = (n.connections().into_iter())
            .filter(|c| c.direction == ConnectionDirection::Incoming)
            .map(|c| c.id)
            .collect();
        if n.routes().iter().any(|r| incoming.contains(&r.conn_id)) {
            out.insert(n.effective_id().to_string());
        }
    }
    out
}

/// Each node's commands so far.
fn commands_by_node(fleet: &SimFleet) -> BTreeMap<String, u64> {
    (fleet.nodes().iter())
        .map(|n| (n.effective_id().to_string(), n.commands_received()))
        .collect()
}

/// Scenario: converged fleet of three groups with a name in the first and
/// one in the last; the replica stops and a new incarnation starts on the
/// same database; every node reconnects once through the load balancer,
/// the same links stay Applied, both names stay reachable, and the nodes
/// commanded are exactly those that held routes over incoming links: a
/// node's registration reply restores what it sources.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_on_postgres_keeps_links_and_routes() {
    let url = pg_url_for(&fresh_pg_database().await);
    let first = mk_replica(&url, 1).await;
    let lb = Proxy::start(first.southbound_addr).await;
    let fleet = mk_fleet(&lb, mk_specs(&["a", "b", "c"], 2)).await;
    let announce = |node: &str, name: &str| {
        let n = fleet.node(node).unwrap();
        n.announce(["org", "ns", name]).unwrap()
    };
    announce("a/n0", "alpha");
    announce("c/n4", "svc");
    let before = link_ids(&wait_links(&first, &fleet, 3).await);
    wait_reachable(&fleet, "svc", &["c"]).await;
    wait_reachable(&fleet, "alpha", &["a"]).await;
    let routes_before = first.store.list_routes().await.unwrap().len();
    let holders = incoming_route_holders(&fleet);
    let commands_before = commands_by_node(&fleet);

    first.shutdown().await;
    let second = mk_replica(&url, 2).await;
    lb.set_backend(second.southbound_addr);

    let reconnected = fleet
        .wait_until(
            |f| f.nodes().iter().all(|n| n.registrations() == 2),
            PATIENCE,
        )
        .await;
    assert!(reconnected, "lost: {:?}", fleet.lost());
    let after = link_ids(&wait_links(&second, &fleet, 3).await);
    assert_eq!(after, before, "the same links, none re-created");
    wait_reachable(&fleet, "svc", &["c"]).await;
    wait_reachable(&fleet, "alpha", &["a"]).await;
    assert_eq!(
        second.store.list_routes().await.unwrap().len(),
        routes_before
    );
    wait_all_reconciled(&second, fleet.nodes().len()).await;
    let commanded: BTreeSet<String> = commands_by_node(&fleet)
        .into_iter()
        .filter(|(n, c)| commands_before.get(n) != Some(c))
        .map(|(n, _)| n)
        .collect();
    eprintln!("commanded after the restart: {commanded:?}; holders: {holders:?}");
    assert_eq!(
        commanded, holders,
        "the far ends of the re-dialled links, and only they, get their routes back by command"
    );
    assert_eq!(fleet.lost_count(), 0);
}

/// Waits until the new leader has reconciled at least `n` nodes to the end
/// and has nothing queued: every registration's reconcile has run.
async fn wait_all_reconciled(cp: &Running, n: usize) {
    let converged = || {
        let c = cp
            .metrics
            .reconciles
            .get_or_create(&[("outcome", "converged")]);
        usize::try_from(c.get()).unwrap_or(usize::MAX)
    };
    wait_for("every node reconciled and the queue idle", || async {
        let queued = cp.queue().map_or(usize::MAX, |q| q.len());
        match (converged(), queued) {
            (done, 0) if done >= n => Ok(()),
            (done, queued) => Err(format!("{done} reconciled, {queued} queued")),
        }
    })
    .await;
}

/// Scenario: the replica and every node die together; a new incarnation
/// starts on the same database and every node comes back on another
/// endpoint, as after a failover to a fresh leader that remembers nothing.
/// The stored links point at endpoints nobody serves and were claimed
/// under sessions that are gone: they are re-pointed and claimed again,
/// and the name is reachable again over what the nodes hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_with_moved_endpoints() {
    let url = pg_url_for(&fresh_pg_database().await);
    let first = mk_replica(&url, 1).await;
    let lb = Proxy::start(first.southbound_addr).await;
    let mut fleet = mk_fleet(&lb, mk_specs(&["a", "b", "c", "d"], 3)).await;
    let name = ["org", "ns", "svc"];
    let announcer = "d/n10";
    fleet.node(announcer).unwrap().announce(name).unwrap();
    wait_links(&first, &fleet, 6).await;
    wait_reachable(&fleet, "svc", &["d"]).await;

    first.shutdown().await;
    fleet.crash_all();
    let second = mk_replica(&url, 2).await;
    lb.set_backend(second.southbound_addr);
    let moved = respawn_all_elsewhere(&mut fleet).await;
    fleet.node(announcer).unwrap().announce(name).unwrap();

    let links = wait_links(&second, &fleet, 6).await;
    assert_links_point_at(&links, &moved);
    wait_reachable(&fleet, "svc", &["d"]).await;
    assert_eq!(fleet.lost_count(), 0);
}
