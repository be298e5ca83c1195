//! A simulated fleet over shared HTTP/2 connections: everyone registers,
//! everyone reconnects once when the control plane closes the streams, and
//! everyone is lost when the control plane dies.

mod sim_support;

use std::time::Duration;

use sim_support::ScriptedCp;
use slim_cp::sim::{FleetOptions, SimFleet, SimNodeSpec, SimOptions};

fn specs(n: usize) -> Vec<SimNodeSpec> {
    (0..n)
        .map(|i| {
            let group = format!("group-{}", i % 4);
            SimNodeSpec::new(
                &format!("node-{i}"),
                Some(&group),
                &format!("127.0.0.1:{}", 30000 + i),
            )
        })
        .collect()
}

fn options(per_channel: usize) -> FleetOptions {
    FleetOptions {
        nodes_per_channel: per_channel,
        node: SimOptions {
            connect_retry_interval: Duration::from_millis(50),
            register_timeout: Duration::from_secs(5),
            ..SimOptions::default()
        },
    }
}

async fn reconnect_then_die(per_channel: usize) {
    let mut cp = ScriptedCp::start().await;
    let auto = cp.auto_register();
    let fleet = SimFleet::start(&cp.url(), specs(60), options(per_channel)).unwrap();
    assert!(
        fleet.wait_all_registered(Duration::from_secs(10)).await,
        "{:?}",
        fleet.lost()
    );
    assert!(fleet.node("group-1/node-1").is_some());
    assert!(fleet.node("node-1").is_some());

    auto.end_streams();
    let all_twice = |f: &SimFleet| f.nodes().iter().all(|n| n.registrations() == 2);
    assert!(fleet.wait_until(all_twice, Duration::from_secs(10)).await);
    assert!(fleet.wait_all_registered(Duration::from_secs(10)).await);
    assert_eq!(fleet.lost_count(), 0);
    assert_eq!(auto.count(), 120);

    cp.kill();
    let all_lost = |f: &SimFleet| f.lost_count() == 60;
    assert!(
        fleet.wait_until(all_lost, Duration::from_secs(10)).await,
        "lost {}",
        fleet.lost_count()
    );
    for (id, reason) in fleet.lost() {
        assert!(reason.contains("failed to reconnect"), "{id}: {reason}");
    }
    eprintln!("lost reason: {:?}", fleet.lost().first());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_channels_follow_the_retry_rules() {
    reconnect_then_die(8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_per_node_follows_the_retry_rules() {
    reconnect_then_die(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_waits_for_a_late_control_plane() {
    let addr = sim_support::free_addr();
    let fleet = SimFleet::start(&format!("http://{addr}"), specs(40), options(8)).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(fleet.registered_count(), 0);
    let mut cp = ScriptedCp::start_on(addr).await;
    let _auto = cp.auto_register();
    assert!(
        fleet.wait_all_registered(Duration::from_secs(10)).await,
        "{:?}",
        fleet.lost()
    );
    assert_eq!(fleet.lost_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_nodes_in_one_process() {
    let mut cp = ScriptedCp::start().await;
    let auto = cp.auto_register();
    let started = std::time::Instant::now();
    let fleet = SimFleet::start(&cp.url(), specs(2000), options(32)).unwrap();
    assert!(
        fleet.wait_all_registered(Duration::from_secs(60)).await,
        "{}",
        fleet.registered_count()
    );
    eprintln!("2000 nodes registered in {:?}", started.elapsed());
    assert_eq!(auto.count(), 2000);
    for node in fleet.nodes().iter().step_by(100) {
        node.announce(["org", "ns", node.id()]).unwrap();
    }
    auto.end_streams();
    let all_twice = |f: &SimFleet| f.nodes().iter().all(|n| n.registrations() == 2);
    assert!(fleet.wait_until(all_twice, Duration::from_secs(60)).await);
    eprintln!("2000 nodes re-registered after {:?}", started.elapsed());
    assert_eq!(fleet.lost_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_dates_its_last_change() {
    let mut cp = ScriptedCp::start().await;
    let auto = cp.auto_register();
    let before = std::time::Instant::now();
    let fleet = SimFleet::start(&cp.url(), specs(8), options(4)).unwrap();
    assert!(fleet.wait_all_registered(Duration::from_secs(10)).await);
    let registered = fleet.last_change();
    assert!(
        registered.count >= 8,
        "one change at least per registration, counted {}",
        registered.count
    );
    assert!(registered.at > before && registered.at <= std::time::Instant::now());

    auto.end_streams();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    assert!(fleet.changed_after(registered.count, deadline).await);
    let again = fleet.last_change();
    assert!(again.count > registered.count && again.at > registered.at);
    cp.kill();
}
