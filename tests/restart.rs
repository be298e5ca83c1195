//! A single replica on Postgres restarted under a converged fleet, behind
//! a load balancer that retries backend connects: nothing is lost, nothing
//! is re-created, and the restart costs the nodes no command.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::PATIENCE;
use common::pg::{fresh_pg_database, pg_url_for};
use common::proxy::Proxy;
use common::scenario::{
    assert_links_point_at, fleet_options, mk_links, respawn_all_elsewhere, wait_links,
    wait_reachable,
};
use slim_cp::config::ReconcilerConfig;
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

/// Scenario: converged fleet of three groups; the replica stops and a new
/// incarnation starts on the same database; every node reconnects once
/// through the load balancer, the same links stay Applied, names stay
/// reachable, and the nodes receive no command for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_on_postgres_keeps_links_and_routes() {
    let url = pg_url_for(&fresh_pg_database().await);
    let first = mk_replica(&url, 1).await;
    let lb = Proxy::start(first.southbound_addr).await;
    let fleet = mk_fleet(&lb, mk_specs(&["a", "b", "c"], 2)).await;
    fleet
        .node("c/n4")
        .unwrap()
        .announce(["org", "ns", "svc"])
        .unwrap();
    let before = link_ids(&wait_links(&first, &fleet, 3).await);
    wait_reachable(&fleet, "svc", &["c"]).await;
    let routes_before = first.store.list_routes().await.unwrap().len();
    let commands_before = fleet.commands_received();

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
    assert_eq!(
        second.store.list_routes().await.unwrap().len(),
        routes_before
    );
    // Let the new leader's reconciles run, then count.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let sent = fleet.commands_received() - commands_before;
    eprintln!("commands sent to the fleet after the restart: {sent}");
    assert_eq!(
        sent, 0,
        "a restart needs no command: the registration replies restore all"
    );
    assert_eq!(fleet.lost_count(), 0);
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
