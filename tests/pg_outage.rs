//! Postgres stopped and started under a running replica (its network path
//! cut and restored: every connection reset, new ones refused): the replica
//! recovers without a restart of its own and no node is lost.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::cut::cuttable_database;
use common::scenario::{mk_fleet, mk_links, wait_links, wait_reachable};
use slim_cp::config::ReconcilerConfig;
use slim_cp::server::{self, Options};
use slim_cp::store::PgStore;

/// Scenario: converged fleet on Postgres; the database goes away for
/// longer than any single retry while a node announces a name and another
/// crashes; the database returns; the replica carries on: the name becomes
/// reachable, the crashed node's link goes, and no node was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_under_a_running_replica() {
    let (path, via_proxy) = cuttable_database().await;
    let store = PgStore::connect(&via_proxy, 4)
        .await
        .expect("connects through the proxy");
    let opts = Options {
        topology: mk_links(&[("*", &["*"])]),
        reconciler: ReconcilerConfig {
            base_retry_delay: Duration::from_millis(50),
            reconcile_period: Duration::from_secs(1),
            ..ReconcilerConfig::default()
        },
        ..Options::loopback()
    };
    let cp = server::start(opts, Arc::new(store))
        .await
        .expect("replica starts");
    let fleet = mk_fleet(&cp, &["a", "b", "c"], 1).await;
    wait_links(&cp, &fleet, 3).await;

    path.cut();
    fleet
        .node("b/n0")
        .unwrap()
        .announce(["org", "ns", "late"])
        .unwrap();
    fleet.node("c/n0").unwrap().crash();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let live = ["a/n0", "b/n0"].map(|n| fleet.node(n).unwrap().registrations());
    assert_eq!(
        live,
        [1, 1],
        "no stream was closed while the database was away"
    );
    path.restore();

    wait_links(&cp, &fleet, 1).await;
    wait_reachable(&fleet, "late", &["b"]).await;
    let c = cp.store.get_node("c/n0").await.unwrap().unwrap();
    assert!(
        !c.is_connected(),
        "the crash during the outage was recorded"
    );
    assert_eq!(fleet.lost_count(), 0);
}
