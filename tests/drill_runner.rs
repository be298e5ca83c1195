//! `slim-cp drill`, the binary an operator points at a running cluster:
//! three `slim-cp serve` processes on a fresh Postgres database with a
//! simulated fleet, drilled by `slim-cp drill kill-leader --fault-cmd
//! 'kill -9 {pid}'` and `slim-cp drill step-down`; their `--json`
//! reports are read back and judged.

mod cluster_support;
mod common;

use cluster_support::{Cluster, MESH};
use serde_json::Value;

const GROUPS: [&str; 4] = ["a", "b", "c", "d"];

/// Runs `slim-cp drill ARGS --json` against the cluster (its database,
/// and the admin API of replica `server`); the exit code and the report.
async fn drill(cluster: &Cluster, server: usize, args: &[&str]) -> (i32, Value) {
    let nb = format!("127.0.0.1:{}", cluster.replicas[server].nb);
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_slim-cp"))
        .arg("drill")
        .args(args)
        .args(["--server", &nb, "--database-url", &cluster.url, "--json"])
        .args(["--within", "60s", "--settle", "60s"])
        .output()
        .await
        .expect("slim-cp drill runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}); exit {:?}\nstdout: {stdout}\nstderr: {stderr}\n{}",
            out.status,
            cluster.log_tails()
        )
    });
    eprintln!("drill {args:?}: {report:#}");
    (out.status.code().unwrap_or(-1), report)
}

/// Everything a passing drill must say; `new_term` when the fault
/// deposes the leader.
fn assert_passed(code: i32, report: &Value, epoch_before: u64, new_term: bool) {
    assert_eq!(report["passed"], true, "{report:#}");
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["converged"], true, "{report:#}");
    assert!(report["converged_after"].is_number(), "{report:#}");
    for lost in [
        "links_lost",
        "links_duplicated",
        "links_replaced",
        "routes_lost",
        "routes_duplicated",
    ] {
        assert_eq!(report[lost], 0, "{lost}: {report:#}");
    }
    assert_eq!(report["nodes_lost"], Value::Array(vec![]), "{report:#}");
    assert_eq!(report["before"]["epoch"], epoch_before, "{report:#}");
    let after = report["after"]["epoch"].as_u64().unwrap_or(0);
    assert_eq!(after > epoch_before, new_term, "{report:#}");
    assert_eq!(report["new_term_after"].is_number(), new_term, "{report:#}");
    assert_eq!(report["before"]["nodes_ready"], 12, "{report:#}");
    assert_eq!(report["after"]["nodes_ready"], 12, "{report:#}");
}

/// Scenario: a converged fleet of twelve nodes over three replicas; the
/// drill kills the leader with `kill -9 {pid}` (the pid the leader
/// reports), then, with the killed replica back, hands leadership over
/// with `step-down`. Each report: a new epoch, converged, nothing lost
/// or duplicated; the simulated nodes agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drill_runner_kills_the_leader_and_steps_down_and_reports_nothing_lost() {
    let mut cluster = Cluster::start(3, MESH).await;
    let (leader, epoch) = cluster.leader().await;
    let fleet = cluster.fleet(&GROUPS, 3).await;
    fleet
        .node("b/n1")
        .expect("node")
        .announce(["org", "ns", "beta"])
        .expect("announced");
    let names = [("beta", "b")];
    let ids = cluster.converged(&fleet, GROUPS.len(), &names).await;

    let follower = (leader + 1) % 3;
    let kill = ["kill-leader", "--fault-cmd", "kill -9 {pid}"];
    let (code, report) = drill(&cluster, follower, &kill).await;
    assert_passed(code, &report, epoch, true);
    assert_eq!(report["target"], cluster.replicas[leader].id.as_str());
    assert_eq!(
        report["fault_cmd"],
        format!("kill -9 {}", cluster.replicas[leader].pid())
    );
    assert!(
        cluster.replicas[leader]
            .wait_exit(cluster_support::PATIENCE)
            .is_some(),
        "the drill killed the leader"
    );
    assert_eq!(cluster.converged(&fleet, GROUPS.len(), &names).await, ids);

    cluster.replicas[leader].spawn();
    let (leader, epoch) = cluster.leader().await;
    let (code, report) = drill(&cluster, (leader + 2) % 3, &["step-down"]).await;
    assert_passed(code, &report, epoch, true);
    assert_eq!(report["fencing"]["writes"], 0, "{report:#}");
    assert_eq!(cluster.converged(&fleet, GROUPS.len(), &names).await, ids);
    assert_eq!(fleet.lost_count(), 0, "lost: {:?}", fleet.lost());
    cluster.assert_fenced().await;
}

/// Scenario: the same fleet; the drill freezes the leader with
/// `kill -STOP {pid}` until a new term is committed (past its 2 s lease)
/// and thaws it with `kill -CONT {pid}`; then it kills the follower
/// holding the most sessions. Each report: converged, nothing lost or
/// duplicated; a new epoch for the first, the same for the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drill_runner_freezes_the_leader_and_kills_a_follower_and_reports_nothing_lost() {
    let cluster = Cluster::start(3, MESH).await;
    let (leader, epoch) = cluster.leader().await;
    let fleet = cluster.fleet(&GROUPS, 3).await;
    let ids = cluster.converged(&fleet, GROUPS.len(), &[]).await;

    let stop = [
        "stop-leader",
        "--fault-cmd",
        "kill -STOP {pid}",
        "--resume-cmd",
        "kill -CONT {pid}",
    ];
    let (code, report) = drill(&cluster, (leader + 1) % 3, &stop).await;
    assert_passed(code, &report, epoch, true);
    assert_eq!(report["target"], cluster.replicas[leader].id.as_str());
    assert_eq!(cluster.converged(&fleet, GROUPS.len(), &[]).await, ids);

    let (leader, epoch) = cluster.leader().await;
    let kill = ["kill-follower", "--fault-cmd", "kill -9 {pid}"];
    let (code, report) = drill(&cluster, leader, &kill).await;
    assert_passed(code, &report, epoch, false);
    assert_ne!(report["target"], cluster.replicas[leader].id.as_str());
    assert_eq!(cluster.converged(&fleet, GROUPS.len(), &[]).await, ids);
    assert_eq!(fleet.lost_count(), 0, "lost: {:?}", fleet.lost());
    cluster.assert_fenced().await;
}

/// Bad input is refused with a message naming it, before anything is done.
#[tokio::test]
async fn the_drill_runner_refuses_bad_input_before_any_fault() {
    for (args, says) in [
        (vec!["kill-leader"], "needs --fault-cmd"),
        (
            vec!["kill-leader", "--fault-cmd", "kill {pdi}"],
            "unknown placeholder {pdi}",
        ),
        (vec!["step-down", "--fault-cmd", "true"], "built in"),
        (
            vec!["stop-leader", "--fault-cmd", "kill -STOP {pid}"],
            "--resume-cmd",
        ),
        (
            vec!["kill-leader", "--fault-cmd", "true", "--within", "soon"],
            "not a duration",
        ),
    ] {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_slim-cp"))
            .arg("drill")
            .args(&args)
            .args(["--database-url", "postgres://nobody@127.0.0.1:1/none"])
            .output()
            .await
            .expect("slim-cp drill runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
