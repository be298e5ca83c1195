//! Failover drills with real nodes and real apps behind a real load
//! balancer: three `slim-cp serve` replicas on Postgres behind HAProxy
//! (the shipped `deploy/haproxy/haproxy.cfg` on loopback), four upstream
//! `slim` nodes in two groups dialling HAProxy, `slimctl bench sub` on a
//! node of one group and `slimctl bench pub` on the other group's gateway
//! (see `drills_support` for the stage).
//!
//! Each drill delivers before the fault, makes the fault, waits for a new
//! leader where there is one and for the fleet to settle again (the same
//! link Applied in the database and held by both gateways in their own
//! tables, no node on a dead replica, no node restarted), then a fresh
//! publish must deliver every message. The two kills also publish 60,000
//! messages across the fault (fire and forget, started just before it)
//! and report how many arrived. Each prints one `DRILL` line.
//!
//! The rolling restart does not: every node's control stream moves, and a
//! node whose stream reconnects drops the links it dialed itself (both
//! upstream lines do, expecting the control plane to create them again,
//! which slim-cp does from the registration); `bench pub`'s session over
//! such a link fails ("error sending session internal message to session
//! controller") and it stops publishing.
//!
//! The follower's kill once left the publisher's gateway unable to remove
//! the subscriber's route (its control stream reconnected, and it refused
//! every removal with "subscription id not found"); slim-cp now has the
//! link's source re-create the link (see `reconcile::stranded`), and the
//! drill checks that the fleet settles quiet after the publish.
//!
//! Every drill runs with each upstream line: 2.0.0-alpha.2
//! (`scripts/install-upstream.sh slim slimctl`) and 3.4.6
//! (`scripts/install-upstream.sh --line 3 slim slimctl`), and needs
//! `haproxy`. Without a binary a case prints one skip line, and fails
//! with CI=true.

#[macro_use]
mod interop_support;
mod cluster_support;
mod common;
mod drills_support;
mod haproxy_support;
#[path = "haproxy_support/lb.rs"]
mod lb;

use std::path::Path;
use std::time::{Duration, Instant};

use drills_support::report::{Report, moved};
use drills_support::{Line, SUB_GROUP, Stage};
use interop_support::Running;

/// One test per upstream line for `$drill(line, haproxy)`: module
/// `$drill`, cases `with_slim_2_0` and `with_slim_3_4_6`.
macro_rules! on_both_lines {
    ($drill:ident) => {
        mod $drill {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn with_slim_2_0() {
                require_upstream!("slim", "slimctl");
                if let Some(haproxy) = haproxy_support::haproxy() {
                    super::$drill(Line::V2, &haproxy).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn with_slim_3_4_6() {
                require_upstream_v3!("slim", "slimctl");
                if let Some(haproxy) = haproxy_support::haproxy() {
                    super::$drill(Line::V3, &haproxy).await;
                }
            }
        }
    };
}

on_both_lines!(kill_the_leader);
on_both_lines!(kill_the_follower_holding_the_apps);
on_both_lines!(rolling_restart);

/// Scenario: messages flow; the leader replica is killed (kill -9); a
/// new leader takes over, the leader's nodes re-register through HAProxy
/// on the survivors, the fleet settles on the same link, and a fresh
/// publish delivers every message.
async fn kill_the_leader(line: Line, haproxy: &Path) {
    let name = format!("drill-leader-{}", line.tag());
    let mut stage = Stage::start(&name, line, haproxy).await;
    let first = stage.deliver_all(&stage.before.link, "before the fault");
    let (leader, epoch) = stage.cluster.leader().await;
    let mut publishing = stage.start_publishing();
    stage.cluster.replicas[leader].kill9();
    let at = Instant::now();
    assert!(
        publishing.publishing(),
        "the publish ended before the fault"
    );
    let new_leader = stage.cluster.takeover(epoch, at).await;
    stage.cluster.next_leader(epoch).await;
    let note = format!("killed {}", stage.cluster.replicas[leader].id);
    let fault = Fault::new("kill -9 the leader", at, "the kill");
    let fault = fault.new_leader(new_leader).dead(leader).across(publishing);
    after_the_fault(&mut stage, first, fault, note).await;
}

/// Scenario: messages flow, and go on being published across the fault;
/// the follower replica holding the apps' nodes' control streams (the
/// publisher's gateway's, and the subscriber's when both are on one
/// follower) is killed (kill -9); the leader stays, the nodes re-register
/// through HAProxy on the survivors, the fleet settles on the same link,
/// and a fresh publish delivers every message.
async fn kill_the_follower_holding_the_apps(line: Line, haproxy: &Path) {
    let name = format!("drill-follower-{}", line.tag());
    let mut stage = Stage::start(&name, line, haproxy).await;
    let (leader, epoch) = stage.cluster.leader().await;
    let victim = put_the_apps_on_a_follower(&mut stage, leader);
    let victim_id = stage.cluster.replicas[victim].id.clone();
    let on_it: Vec<String> = [stage.publisher(), stage.sub.clone()]
        .into_iter()
        .filter(|n| stage.before.owners.get(n) == Some(&victim_id))
        .collect();
    let first = stage.deliver_all(&stage.before.link, "before the fault");
    let mut publishing = stage.start_publishing();
    stage.cluster.replicas[victim].kill9();
    let at = Instant::now();
    assert!(
        publishing.publishing(),
        "the publish ended before the fault"
    );
    let note = format!("killed {victim_id}, which held the apps' nodes {on_it:?}");
    let fault = Fault::new(
        "kill -9 the follower holding the apps' nodes",
        at,
        "the kill",
    );
    let fault = fault.dead(victim).across(publishing);
    after_the_fault(&mut stage, first, fault, note).await;
    assert_eq!(
        stage.cluster.leader().await,
        (leader, epoch),
        "the leader was not touched and keeps its term"
    );
}

/// The follower to kill: the one owning the publisher's node (`g2`'s
/// gateway) when that is not the leader, with the subscriber moved onto a
/// `g1` node of the same follower when there is one; otherwise the
/// follower owning a `g1` node, which then runs the subscriber.
fn put_the_apps_on_a_follower(stage: &mut Stage, leader: usize) -> usize {
    let leader_id = stage.cluster.replicas[leader].id.clone();
    let owner = |n: &str| stage.before.owners.get(n).cloned().unwrap_or_default();
    // The default subscriber's node first, then `g1`'s gateway.
    let g1 = [
        stage.sub.clone(),
        stage.before.link.end_in(SUB_GROUP).to_string(),
    ];
    let pub_owner = owner(&stage.publisher());
    let (victim, sub) = if pub_owner != leader_id {
        let sub = g1
            .iter()
            .find(|n| owner(n) == pub_owner)
            .unwrap_or(&g1[0])
            .clone();
        (pub_owner, sub)
    } else {
        let sub = g1
            .iter()
            .find(|n| owner(n) != leader_id)
            .unwrap_or_else(|| panic!("every app node is on the leader: {:?}", stage.before))
            .clone();
        (owner(&sub), sub)
    };
    stage.sub = sub;
    stage.cluster.index_of(&victim)
}

/// Scenario: messages flow; each replica in turn is drained (SIGTERM),
/// started again and waited for on `/readyz` before the next; the leader's
/// handover is timed. The nodes move off each replica through HAProxy
/// without a restart, the fleet settles on the same link, and a fresh
/// publish delivers every message.
async fn rolling_restart(line: Line, haproxy: &Path) {
    let name = format!("drill-rolling-{}", line.tag());
    let mut stage = Stage::start(&name, line, haproxy).await;
    let first = stage.deliver_all(&stage.before.link, "before the restarts");
    let at = Instant::now();
    let takeover = stage.cluster.restart_each().await;
    let note = format!(
        "new leader: the slowest handover; the last replica was ready again {:.2}s after \
         the first SIGTERM",
        at.elapsed().as_secs_f64()
    );
    let fault = Fault::new(
        "rolling restart of all three replicas",
        at,
        "the first SIGTERM",
    );
    after_the_fault(&mut stage, first, fault.new_leader(takeover), note).await;
}

/// What a drill did, for [`after_the_fault`].
struct Fault {
    drill: &'static str,
    /// When it began, and what began then.
    at: Instant,
    since: &'static str,
    new_leader: Option<Duration>,
    /// Replicas (indices) that stay down.
    dead: Vec<usize>,
    /// Messages published across the fault, still in flight.
    publishing: Option<Running>,
}

impl Fault {
    fn new(drill: &'static str, at: Instant, since: &'static str) -> Fault {
        Fault {
            drill,
            at,
            since,
            new_leader: None,
            dead: Vec::new(),
            publishing: None,
        }
    }

    fn across(mut self, publishing: Running) -> Fault {
        self.publishing = Some(publishing);
        self
    }

    fn new_leader(mut self, took: Duration) -> Fault {
        self.new_leader = Some(took);
        self
    }

    fn dead(mut self, replica: usize) -> Fault {
        self.dead.push(replica);
        self
    }
}

/// The second half of every drill: waits until the fleet is settled on
/// the link it started with (timed from the fault), delivers every
/// message again, checks the fencing audit, prints the `DRILL` line and
/// fails the drill on anything lost.
async fn after_the_fault(stage: &mut Stage, first: u64, fault: Fault, note: String) {
    let after = stage.wait_settled(&fault.dead).await;
    let converged = fault.at.elapsed();
    stage.assert_same_link(&after, fault.drill);
    let during = fault
        .publishing
        .map(|p| stage.finish_publishing(p, &after.link));
    let then = stage.deliver_all(&after.link, "after reconvergence");
    stage.cluster.assert_fenced().await;
    let report = Report {
        drill: fault.drill,
        line: stage.line,
        new_leader: fault.new_leader,
        converged,
        since: fault.since,
        delivered: (first, then),
        during,
        moved: moved(&stage.before, &after),
        before: stage.before.clone(),
        after,
        nodes_lost: stage.nodes.len() - stage.nodes_running(),
        fenced: stage.cluster.fenced().await,
        note,
    };
    report.check();
}
