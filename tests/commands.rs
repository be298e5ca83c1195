//! The commands a fleet costs do not depend on the store: the same
//! simulated fleet, converged on memory and on Postgres, gets the same
//! number of commands (issue 12: Postgres once sent seven times as many).
//!
//! Scenario: one replica, full mesh; `NODES` nodes spread over `GROUPS`
//! groups, each with an external endpoint; node k announces name k. The
//! fleet is converged when every pair of groups has exactly one link held
//! by both ends and every name has exactly one route in each group but its
//! own; the commands the nodes received are counted then, and again after
//! a settle period (nothing may churn once converged). They are counted
//! where they arrive, not where their acks do: a node holds what a command
//! made before the replica has read its ack, so an ack count read at
//! convergence can still lack the last one.

mod common;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use common::backend::{self, Backend};
use common::scenario::{fleet_options, mk_cp, mk_links};
use slim_cp::proto::sb::{ConnectionDirection, ConnectionType};
use slim_cp::sim::{SimFleet, SimNodeSpec};

const NODES: usize = 200;
const GROUPS: usize = 20;
const NAMES: usize = 50;
/// Bound on convergence (a debug build on a busy machine).
const CONVERGE_WITHIN: Duration = Duration::from_secs(90);
/// Converged state must hold, without commands, this long.
const SETTLE: Duration = Duration::from_secs(2);

/// What converging the fleet on one backend cost.
#[derive(Debug)]
struct Cost {
    /// Commands the nodes had received when the fleet was first converged.
    at_convergence: u64,
    /// Commands the nodes had received after the settle period.
    settled: u64,
    took: Duration,
}

fn mk_specs() -> Vec<SimNodeSpec> {
    (0..NODES)
        .map(|i| {
            let ep = format!("10.0.{}.{}:46357", i >> 8, i & 255);
            let group = format!("g{}", i % GROUPS);
            let mut spec = SimNodeSpec::new(&format!("n{i}"), Some(&group), &ep);
            spec.external_endpoint = Some(ep);
            spec
        })
        .collect()
}

/// Whether every pair of groups has one live link and every name one route
/// per group but its announcer's; otherwise what is missing.
fn converged(fleet: &SimFleet) -> Result<(), String> {
    if fleet.registered_count() != NODES {
        return Err(format!("{} registered", fleet.registered_count()));
    }
    let mut out: HashMap<String, String> = HashMap::new();
    let mut inc: HashMap<String, Vec<String>> = HashMap::new();
    let mut routes: HashMap<String, Vec<(String, String)>> = HashMap::new();
    for node in fleet.nodes() {
        let group = node.spec().group.clone().unwrap_or_default();
        for c in node.connections() {
            let Some(link) = c.link_id.filter(|_| c.conn_type == ConnectionType::Remote) else {
                continue;
            };
            if c.direction == ConnectionDirection::Outgoing {
                out.insert(link, group.clone());
            } else {
                inc.entry(link).or_default().push(group.clone());
            }
        }
        for r in node.routes() {
            if let Some(link) = r.link_id {
                let [_, _, name] = r.name;
                routes.entry(name).or_default().push((group.clone(), link));
            }
        }
    }
    let mut live = HashSet::new();
    let mut pairs = BTreeSet::new();
    for (link, a) in &out {
        if let Some(b) = inc.get(link).and_then(|gs| gs.iter().find(|b| *b != a)) {
            live.insert(link.as_str());
            pairs.insert(if a < b { (a, b) } else { (b, a) });
        }
    }
    let want = GROUPS * (GROUPS - 1) / 2;
    if out.len() != want || live.len() != want || pairs.len() != want {
        return Err(format!("{} links out, {} live", out.len(), live.len()));
    }
    for k in 0..NAMES {
        let root = format!("g{}", k % GROUPS);
        let held = routes
            .get(&format!("name{k}"))
            .map_or(&[][..], Vec::as_slice);
        let groups: HashSet<&String> = held.iter().map(|(g, _)| g).collect();
        let on_live = held.iter().all(|(_, l)| live.contains(l.as_str()));
        if held.len() != GROUPS - 1
            || groups.len() != GROUPS - 1
            || groups.contains(&root)
            || !on_live
        {
            return Err(format!("name{k}: {held:?}"));
        }
    }
    Ok(())
}

/// Converges the fleet on the running scenario's backend.
async fn converge() -> Cost {
    let cp = mk_cp(mk_links(&[("*", &["*"])])).await;
    let started = Instant::now();
    let url = format!("http://{}", cp.southbound_addr);
    let fleet = SimFleet::start(&url, mk_specs(), fleet_options(8)).expect("fleet starts");
    for k in 0..NAMES {
        fleet.nodes()[k]
            .announce(["test", "ns", &format!("name{k}")])
            .expect("announced");
    }
    let mut last = Err(String::new());
    while started.elapsed() < CONVERGE_WITHIN {
        last = converged(&fleet);
        if last.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        last.is_ok(),
        "not converged in {CONVERGE_WITHIN:?}: {last:?}"
    );
    let (at_convergence, took) = (fleet.commands_received(), started.elapsed());
    tokio::time::sleep(SETTLE).await;
    assert_eq!(converged(&fleet), Ok(()), "no longer converged");
    let cost = Cost {
        at_convergence,
        settled: fleet.commands_received(),
        took,
    };
    let (b, n, took) = (backend::current(), cost.settled, cost.took);
    eprintln!("{b:?}: {n} commands, converged in {took:?}");
    drop(fleet);
    cp.shutdown().await;
    cost
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sends_as_many_commands_as_memory() {
    let mut costs = Vec::new();
    for b in [Backend::Memory, Backend::Postgres] {
        let mut cost = None;
        backend::scoped(b, async { cost = Some(converge().await) }).await;
        costs.extend(cost);
    }
    let (memory, postgres) = (&costs[0], &costs[1]);
    assert!(memory.at_convergence > 0, "{memory:?}");
    let (m, p) = (memory.settled as f64, postgres.settled as f64);
    assert!(
        (p - m).abs() <= 0.05 * m,
        "memory {memory:?}, postgres {postgres:?}"
    );
    for c in &costs {
        assert_eq!(
            c.settled, c.at_convergence,
            "commands after convergence: {c:?}"
        );
    }
}
