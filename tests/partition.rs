//! Partition drills: three `slim-cp serve` processes, each in its own
//! network namespace, on one Postgres, twelve simulated nodes in four
//! fully meshed groups behind a redispatching balancer; real cuts that
//! drop packets (see `netns_support`). Each drill waits on what it can
//! observe, prints one `DRILL` line (time until a new leader acts, until
//! the fleet converged, links and routes lost or duplicated at any moment,
//! nodes lost, commands refused by fencing) and fails on any loss.

mod cluster_support;
mod common;
mod netns_support;

use std::time::{Duration, Instant};

use cluster_support::logs::rfc3339_now;
use netns_support::drill::{Drill, NAMES};

/// Scenario: the leader is cut off from everything (database, peers,
/// balancer). A standby takes over; the old leader stops by itself when
/// its lease runs out and is declared dead; a name is announced meanwhile.
/// Healed, the old leader's nodes come back through the others, nothing
/// it sends under its old epoch lands, and the fleet converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_everything_is_replaced_and_rejoins() {
    let mut d = Drill::stage().await;
    let (old, epoch) = d.cluster.leader().await;
    let node = d.node_not_on(old).await;
    let cut = Instant::now();
    d.fabric.cut_all(old);
    let takeover = d.cluster.takeover(epoch, cut).await;
    d.cluster.next_leader(epoch).await;
    d.announce(&node, "delta");
    d.cluster.stood_down(old).await;
    d.declared_dead(old).await;
    let healed = rfc3339_now();
    let heal = Instant::now();
    d.fabric.heal();
    let names = [NAMES[0], NAMES[1], ("delta", group_of(&node))];
    d.converged(&names).await;
    let (converged, after_heal) = (cut.elapsed(), heal.elapsed());
    d.silent_since(epoch, &healed);
    d.cluster.assert_fenced().await;
    let name = "leader cut off from everything";
    let span = (converged, "the fault");
    let note = format!("{:.2}s after the heal", after_heal.as_secs_f64());
    d.report(name, Some(takeover), span, note).await;
}

/// Scenario: a follower holding sessions loses Postgres (packets
/// dropped) past the time the leader declares it dead; its nodes either
/// move to the others or keep their streams; healed, it serves again and
/// the fleet converges over the same links, nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_cut_off_from_postgres_loses_nothing() {
    follower_cut_off_from_postgres(false).await;
}

/// As above, held to the design: the cut follower stops listening and,
/// its peers being ready, closes its streams; its nodes move to the
/// others while it is cut, and the fleet converges before the heal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_cut_off_from_postgres_hands_its_nodes_over() {
    follower_cut_off_from_postgres(true).await;
}

async fn follower_cut_off_from_postgres(strict: bool) {
    let mut d = Drill::stage().await;
    let (leader, _) = d.cluster.leader().await;
    let f = follower_with_sessions(&d, leader).await;
    let held = d.sessions_on(f).await.expect("counts").0;
    let cut = Instant::now();
    d.fabric.cut_db(f);
    let mut moved = String::new();
    if strict {
        d.moved_off(f).await;
        let at = cut.elapsed();
        assert_eq!(d.converged(&NAMES).await, d.links);
        moved = moved_note(at, cut.elapsed());
    }
    d.declared_dead(f).await;
    let connected = d.sessions_on(f).await.expect("counts").1;
    let healed = Instant::now();
    d.fabric.heal();
    d.cluster.ready(f).await;
    let ids = d.converged(&NAMES).await;
    let converged = healed.elapsed();
    assert_eq!(ids, d.links, "every link keeps its id");
    d.cluster.assert_fenced().await;
    let note = format!(
        "{} of its {held} nodes moved while it was cut{moved}",
        connected.saturating_sub(12 - held)
    );
    let name = "follower cut off from Postgres";
    d.report(name, None, (converged, "the heal"), note).await;
}

/// Scenario: the leader loses Postgres only (its peers and nodes still
/// reach it). It stops leading when its lease runs out and a standby
/// takes over; healed, nothing it sends under its old epoch lands and
/// the fleet converges with the same links.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_postgres_is_replaced() {
    leader_cut_off_from_postgres(false).await;
}

/// As above, held to the design: the old leader's nodes move while it is
/// cut, and the fleet converges before the heal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_postgres_hands_its_nodes_over() {
    leader_cut_off_from_postgres(true).await;
}

async fn leader_cut_off_from_postgres(strict: bool) {
    let mut d = Drill::stage().await;
    let (old, epoch) = d.cluster.leader().await;
    let cut = Instant::now();
    d.fabric.cut_db(old);
    let takeover = d.cluster.takeover(epoch, cut).await;
    d.cluster.stood_down(old).await;
    let mut moved = String::new();
    if strict {
        d.moved_off(old).await;
        let at = cut.elapsed();
        assert_eq!(d.converged(&NAMES).await, d.links);
        moved = moved_note(at, cut.elapsed())
            .trim_start_matches("; ")
            .to_string();
    }
    d.declared_dead(old).await;
    let healed_at = rfc3339_now();
    let healed = Instant::now();
    d.fabric.heal();
    d.cluster.ready(old).await;
    let ids = d.converged(&NAMES).await;
    let converged = healed.elapsed();
    assert_eq!(ids, d.links, "every link keeps its id");
    d.silent_since(epoch, &healed_at);
    d.cluster.assert_fenced().await;
    let name = "leader cut off from Postgres";
    let span = (converged, "the heal");
    d.report(name, Some(takeover), span, moved).await;
}

/// Scenario: the leader and one follower cannot reach each other's relay
/// (both still reach Postgres and their nodes). Names announced on both
/// sides need commands to nodes on the far side; the leader's calls fail
/// (seen in its log); healed, the fleet converges with nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_one_followers_relay_loses_nothing() {
    leader_cut_off_from_a_relay(false).await;
}

/// As above, held to the design: the fleet converges while the cut
/// lasts (the leader drains the follower it cannot reach, so its nodes
/// move); healed, the leader lifts the flag and the follower is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_one_followers_relay_still_converges() {
    leader_cut_off_from_a_relay(true).await;
}

async fn leader_cut_off_from_a_relay(strict: bool) {
    let mut d = Drill::stage().await;
    let (leader, _) = d.cluster.leader().await;
    let f = follower_with_sessions(&d, leader).await;
    let far = node_on(&d, f).await;
    let near = d.node_not_on(f).await;
    let cut = Instant::now();
    d.fabric.cut_between(leader, f);
    d.announce(&far, "delta");
    d.announce(&near, "epsilon");
    let names = [
        NAMES[0],
        NAMES[1],
        ("delta", group_of(&far)),
        ("epsilon", group_of(&near)),
    ];
    let mut moved = String::new();
    if strict {
        d.moved_off(f).await;
        let at = cut.elapsed();
        d.converged(&names).await;
        moved = moved_note(at, cut.elapsed());
    }
    d.relay_failed(leader).await;
    let failed = cut.elapsed();
    let healed = Instant::now();
    d.fabric.heal();
    if strict {
        d.cluster.ready(f).await;
    }
    d.converged(&names).await;
    let converged = healed.elapsed();
    d.cluster.assert_fenced().await;
    let note = format!(
        "the leader's first failed relay call {:.2}s after the cut{moved}",
        failed.as_secs_f64()
    );
    let name = "leader cut off from one follower's relay";
    d.report(name, None, (converged, "the heal"), note).await;
}

/// Scenario: every replica in turn is drained (SIGTERM), restarted, and
/// waited for on `/readyz` before the next; the leader's handover is
/// timed. The fleet ends converged over the same links.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_loses_nothing() {
    let mut d = Drill::stage().await;
    let start = Instant::now();
    let takeover = d.cluster.restart_each().await;
    let ids = d.converged(&NAMES).await;
    let converged = start.elapsed();
    assert_eq!(ids, d.links, "every link keeps its id");
    d.cluster.assert_fenced().await;
    let span = (converged, "the first SIGTERM");
    let note = "new leader: the slowest of the handovers".to_string();
    d.report("rolling restart", Some(takeover), span, note)
        .await;
}

/// The note of a strict drill: when the nodes had moved and when the
/// fleet converged, both since the cut.
fn moved_note(moved: Duration, converged: Duration) -> String {
    format!(
        "; its nodes moved {:.2}s and the fleet converged {:.2}s after the cut",
        moved.as_secs_f64(),
        converged.as_secs_f64()
    )
}

fn group_of(node: &str) -> &str {
    node.split('/').next().unwrap_or(node)
}

/// The follower after `leader` that owns sessions (one of the two does).
async fn follower_with_sessions(d: &Drill, leader: usize) -> usize {
    for f in [(leader + 1) % 3, (leader + 2) % 3] {
        if d.sessions_on(f).await.expect("counts").0 > 0 {
            return f;
        }
    }
    panic!("no follower owns a session")
}

/// A node whose session replica `i` owns.
async fn node_on(d: &Drill, i: usize) -> String {
    use slim_cp::store::Store as _;
    let id = &d.cluster.replicas[i].id;
    let nodes = d.cluster.store.list_nodes().await.expect("nodes");
    nodes
        .into_iter()
        .find(|n| n.session.as_ref().is_some_and(|s| s.owner.id == *id))
        .map(|n| n.id)
        .expect("a node on the replica")
}
