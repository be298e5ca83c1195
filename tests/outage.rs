//! The store unreachable under a running replica (failpoint): streams stay
//! open, no node is lost, and facts sent meanwhile are recorded once the
//! store is back.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::scenario::{mk_fleet, mk_links, wait_links, wait_reachable};
use common::wait_for;
use slim_cp::config::ReconcilerConfig;
use slim_cp::server::{self, Options, Running};
use slim_cp::store::MemoryStore;
use slim_cp::store::faults::FaultyStore;

async fn mk_faulty_cp() -> (Running, Arc<FaultyStore>) {
    let faulty = Arc::new(FaultyStore::new(Arc::new(MemoryStore::new())));
    let opts = Options {
        topology: mk_links(&[("*", &["*"])]),
        reconciler: ReconcilerConfig {
            base_retry_delay: Duration::from_millis(50),
            reconcile_period: Duration::from_secs(1),
            ..ReconcilerConfig::default()
        },
        ..Options::loopback()
    };
    let cp = server::start(opts, faulty.clone())
        .await
        .expect("replica starts");
    (cp, faulty)
}

/// Scenario: while the store is down for seconds a node announces a name; its stream
/// stays open (the node is not lost, it never reconnects), and once the
/// store is back the name is recorded and reachable from the other group.
#[tokio::test]
async fn facts_sent_during_an_outage_are_recorded_after_it() {
    let (cp, store) = mk_faulty_cp().await;
    let fleet = mk_fleet(&cp, &["a", "b"], 1).await;
    wait_links(&cp, &fleet, 1).await;
    store.set_down(true);
    fleet
        .node("b/n0")
        .unwrap()
        .announce(["org", "ns", "late"])
        .unwrap();
    wait_for("the store refused calls", || async {
        let n = store.refused();
        if n > 5 {
            Ok(())
        } else {
            Err(format!("{n} refused"))
        }
    })
    .await;
    // Longer than any bounded retry of a single fact: the outbox must hold.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(
        fleet.nodes().iter().all(|n| n.registrations() == 1),
        "no stream was closed"
    );
    store.set_down(false);
    wait_reachable(&fleet, "late", &["b"]).await;
    assert_eq!(fleet.lost_count(), 0);
}

/// Scenario: a node crashes while the store is down; its departure is
/// recorded when the store returns, and its link goes.
#[tokio::test]
async fn a_departure_during_an_outage_is_recorded_after_it() {
    let (cp, store) = mk_faulty_cp().await;
    let fleet = mk_fleet(&cp, &["a", "b"], 1).await;
    wait_links(&cp, &fleet, 1).await;
    store.set_down(true);
    fleet.node("b/n0").unwrap().crash();
    tokio::time::sleep(Duration::from_millis(300)).await;
    store.set_down(false);
    wait_for("departure recorded and link gone", || async {
        let rec = cp.store.get_node("b/n0").await.map_err(|e| e.to_string())?;
        let links = cp.store.list_links().await.map_err(|e| e.to_string())?;
        match rec {
            Some(r) if !r.is_connected() && links.is_empty() => Ok(()),
            other => Err(format!("{other:?} {links:?}")),
        }
    })
    .await;
    assert!(fleet.node("a/n0").unwrap().connections().is_empty());
}

/// Scenario: a node registers while the store is down; it is answered in
/// time (a node that meets an error or waits 10 s gives up for good), and
/// once the store is back its session is recorded and its link made.
#[tokio::test]
async fn a_registration_during_an_outage_is_answered_and_recorded_after_it() {
    let (cp, store) = mk_faulty_cp().await;
    let mut fleet = mk_fleet(&cp, &["a"], 1).await;
    store.set_down(true);
    let late = common::scenario::spawn_node(&mut fleet, "b", "n0").await;
    assert_eq!(late, 1, "registered once, not lost");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        cp.store.list_nodes().await.is_err(),
        "the store is still down"
    );
    store.set_down(false);
    wait_links(&cp, &fleet, 1).await;
    let rec = cp.store.get_node("b/n0").await.unwrap().unwrap();
    assert!(rec.ready_session().is_some());
    assert_eq!(fleet.lost_count(), 0);
}
