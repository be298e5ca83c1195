//! Simulated fleets against a real replica over loopback gRPC. The
//! simulator follows the real node's retry rule, so a node the control
//! plane mishandles is counted as lost instead of quietly retried.

mod common;

use std::time::Duration;

use common::{PATIENCE, mk_replica, wait_for};
use slim_cp::sim::{FleetOptions, SimFleet, SimNodeSpec, SimOptions};

fn mk_specs(n: usize, groups: usize) -> Vec<SimNodeSpec> {
    (0..n)
        .map(|i| {
            let group = format!("group-{}", i % groups);
            let mut spec = SimNodeSpec::new(
                &format!("node-{i}"),
                Some(&group),
                &format!("127.0.0.1:{}", 20000 + i),
            );
            spec.external_endpoint = Some(format!("127.0.0.1:{}", 20000 + i));
            spec
        })
        .collect()
}

fn mk_options() -> FleetOptions {
    FleetOptions {
        nodes_per_channel: 32,
        node: SimOptions {
            connect_retry_interval: Duration::from_millis(50),
            ..SimOptions::default()
        },
    }
}

/// Scenario: 2,000 simulated nodes register against one replica; each
/// has a ready session in the store and a stream in the registry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_nodes_register_with_ready_sessions() {
    let cp = mk_replica().await;
    let url = format!("http://{}", cp.southbound_addr);
    let fleet = SimFleet::start(&url, mk_specs(2000, 50), mk_options()).unwrap();
    assert!(
        fleet.wait_all_registered(Duration::from_secs(120)).await,
        "registered {} of 2000, lost {:?}",
        fleet.registered_count(),
        fleet.lost().into_iter().take(5).collect::<Vec<_>>()
    );
    let nodes = wait_for("2000 ready sessions", || async {
        let nodes = cp.store.list_nodes().await.map_err(|e| e.to_string())?;
        let ready = nodes.iter().filter(|n| n.ready_session().is_some()).count();
        if ready == 2000 {
            Ok(nodes)
        } else {
            Err(format!("{ready} ready"))
        }
    })
    .await;
    assert_eq!(nodes.len(), 2000);
    assert_eq!(cp.registry().len(), 2000);
    assert_eq!(fleet.lost_count(), 0);
    let groups: std::collections::BTreeSet<_> =
        nodes.iter().filter_map(|n| n.group.clone()).collect();
    assert_eq!(groups.len(), 50);
}

/// Scenario: the replica closes every registered stream (as a drain
/// does); each node makes its one reconnect, registers again with a newer
/// generation, and none is lost.
#[tokio::test]
async fn closed_streams_reregister_with_newer_generations() {
    let cp = mk_replica().await;
    let url = format!("http://{}", cp.southbound_addr);
    let fleet = SimFleet::start(&url, mk_specs(40, 4), mk_options()).unwrap();
    assert!(fleet.wait_all_registered(PATIENCE).await);
    let before = wait_for("40 ready", || async {
        let nodes = cp.store.list_nodes().await.map_err(|e| e.to_string())?;
        let ready: Vec<_> = nodes
            .iter()
            .filter_map(|n| n.ready_session().map(|s| s.generation))
            .collect();
        if ready.len() == 40 {
            Ok(nodes)
        } else {
            Err(format!("{} ready", ready.len()))
        }
    })
    .await;
    cp.registry().close_all();
    let ok = fleet
        .wait_until(
            |f| f.nodes().iter().all(|n| n.registrations() == 2),
            PATIENCE,
        )
        .await;
    assert!(ok, "lost: {:?}", fleet.lost());
    wait_for("newer ready generations", || async {
        let nodes = cp.store.list_nodes().await.map_err(|e| e.to_string())?;
        let newer = nodes
            .iter()
            .zip(&before)
            .filter(|(now, was)| {
                let g =
                    |r: &slim_cp::store::model::NodeRecord| r.ready_session().map(|s| s.generation);
                g(now) > g(was)
            })
            .count();
        if newer == 40 {
            Ok(())
        } else {
            Err(format!("{newer} re-registered"))
        }
    })
    .await;
    assert_eq!(fleet.lost_count(), 0);
}

/// Scenario: a simulated node deregisters and one crashes: the first is
/// forgotten, the second kept as disconnected; the rest are untouched.
#[tokio::test]
async fn deregistered_and_crashed_nodes_leave_as_they_should() {
    let cp = mk_replica().await;
    let url = format!("http://{}", cp.southbound_addr);
    let fleet = SimFleet::start(&url, mk_specs(6, 2), mk_options()).unwrap();
    assert!(fleet.wait_all_registered(PATIENCE).await);
    let leaving = fleet.node("group-0/node-0").unwrap();
    let resp = leaving.deregister().await.expect("deregistered");
    assert!(resp.success);
    fleet.node("group-1/node-1").unwrap().crash();
    wait_for("departures derived", || async {
        let nodes = cp.store.list_nodes().await.map_err(|e| e.to_string())?;
        let ids: Vec<_> = nodes
            .iter()
            .map(|n| (n.id.as_str(), n.is_connected()))
            .collect();
        let gone = !ids.iter().any(|(id, _)| *id == "group-0/node-0");
        let crashed = ids.contains(&("group-1/node-1", false));
        let others = ids.iter().filter(|(_, c)| *c).count() == 4;
        if gone && crashed && others {
            Ok(())
        } else {
            Err(format!("{ids:?}"))
        }
    })
    .await;
}
