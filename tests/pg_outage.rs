//! Postgres stopped and started under a running replica (its network path
//! cut and restored: every connection reset, new ones refused): the replica
//! recovers without a restart of its own and no node is lost.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::pg::{admin_url, fresh_pg_database, with_database};
use common::proxy::Proxy;
use common::scenario::{mk_fleet, mk_links, wait_links, wait_reachable};
use slim_cp::config::ReconcilerConfig;
use slim_cp::server::{self, Options};
use slim_cp::store::PgStore;

/// The test server's address, from its URL (`...@host:port/...`).
fn pg_addr() -> SocketAddr {
    let url = admin_url();
    let after_at = url.rsplit_once('@').map_or(url.as_str(), |(_, r)| r);
    let host_port = after_at.split('/').next().unwrap_or("127.0.0.1:5432");
    host_port
        .parse()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 5432)))
}

/// Scenario: converged fleet on Postgres; the database goes away for
/// longer than any single retry while a node announces a name and another
/// crashes; the database returns; the replica carries on: the name becomes
/// reachable, the crashed node's link goes, and no node was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_under_a_running_replica() {
    let db = fresh_pg_database().await;
    let path = Proxy::start(pg_addr()).await;
    let via_proxy =
        with_database(&admin_url(), &db).replace(&pg_addr().to_string(), &path.addr.to_string());
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
