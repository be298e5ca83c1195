//! Leader takeover benchmark, run by hand: `cargo bench --bench takeover`
//! (options: `--trials N`, default 20; `--skip-stop` leaves out the SIGSTOP
//! drill, whose trials take about a lease each; `--pg URL`, the admin
//! database fresh ones are created from, default the local server).
//!
//! Three `slim-cp serve` replicas with the default cluster timings (lease
//! 5 s, renew 1 s, heartbeat 1 s, replica TTL 10 s) share a fresh
//! database, dropped afterwards; a small simulated fleet registers through
//! a balancer and announces names, so that leaders have real work. Each
//! drill is timed from just before it until the database shows a new
//! epoch committed, polled every millisecond on a dedicated connection:
//!
//! - kill -9 of the leader (then it is restarted and must come back); also
//!   timed: until its election lock is gone from pg_locks;
//! - a step-down asked of the leader over the Admin service;
//! - SIGSTOP of the leader (then SIGCONT: it must rejoin).
//!
//! After every trial the cluster must settle again (every replica alive
//! and serving, one leader) and every node be registered, none lost.
//! The balancer reports on stderr each connect a dead replica refused
//! (the killed leader's nodes moving over); `2>/dev/null` hides them.

#![forbid(unsafe_code)]

// Shared with the other bench, which uses other parts of it.
#[allow(dead_code)]
#[path = "../common/mod.rs"]
mod common;
mod drill;
mod watch;

use std::time::Duration;

use anyhow::{Context, Result, bail};
use slim_cp::sim::{FleetOptions, SimFleet, SimNodeSpec, SimOptions};

use crate::common::cluster::Cluster;
use crate::common::database::{BenchDb, DEFAULT_ADMIN_URL};
use crate::common::process::slim_cp_bin;
use crate::common::table;
use crate::drill::{Bench, Drill};
use crate::watch::Observer;

const REPLICAS: usize = 3;
const NODES: usize = 30;
const GROUPS: usize = 6;
const NAMES: usize = 12;

struct Args {
    trials: usize,
    skip_stop: bool,
    admin_url: String,
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        trials: 20,
        skip_stop: false,
        admin_url: DEFAULT_ADMIN_URL.into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            // cargo bench passes `--bench` to harness = false targets.
            "--bench" => {}
            "--trials" => a.trials = value()?.parse()?,
            "--skip-stop" => a.skip_stop = true,
            "--pg" => a.admin_url = value()?,
            other => bail!("unknown argument {other} (see benches/takeover/main.rs)"),
        }
    }
    if a.trials == 0 {
        bail!("--trials takes 1 or more");
    }
    Ok(a)
}

/// Node i in group i % groups, each on its own connection so that the
/// nodes spread over the replicas; names announced by the first nodes.
fn start_fleet(url: &str) -> Result<SimFleet> {
    let specs = (0..NODES).map(|i| {
        // Endpoints are only names in the simulated network.
        let ep = format!("10.0.0.{i}:46357");
        let mut spec = SimNodeSpec::new(&format!("n{i}"), Some(&format!("g{}", i % GROUPS)), &ep);
        spec.external_endpoint = Some(ep);
        spec
    });
    let opts = FleetOptions {
        nodes_per_channel: 1,
        node: SimOptions::default(),
    };
    let fleet = SimFleet::start(url, specs.collect(), opts)?;
    for k in 0..NAMES {
        fleet.nodes()[k].announce(["bench", "ns", &format!("name{k}")])?;
    }
    Ok(fleet)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = parse_args()?;
    let (bin, profile) = slim_cp_bin()?;
    println!("slim-cp: {} ({profile})", bin.display());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average at start: {}", load.trim());
    let dir = std::env::temp_dir().join(format!("slim-cp-takeover-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    println!("configs and logs: {}", dir.display());
    let db = BenchDb::create_empty(&args.admin_url, "takeover").await?;
    let observer = Observer::start(&db.url).await?;
    let cluster = Cluster::start(&bin, &dir, db, REPLICAS).await?;
    let fleet = start_fleet(&cluster.lb.url())?;
    if !fleet.wait_all_registered(Duration::from_secs(60)).await {
        bail!("the fleet did not register: lost {:?}", fleet.lost());
    }
    let mut bench = Bench::new(cluster, fleet, observer);
    let mut drills = vec![Drill::Kill, Drill::StepDown];
    if !args.skip_stop {
        drills.push(Drill::Stop);
    }
    let mut rows = Vec::new();
    for drill in drills {
        rows.extend(run(&mut bench, drill, args.trials).await?);
    }
    let Bench { cluster, fleet, .. } = bench;
    drop(fleet);
    cluster.stop().await?;
    println!();
    print_table(&rows);
    Ok(())
}

/// One table row: what was timed, over how many trials.
struct Row {
    what: String,
    trials: usize,
    times: Vec<Duration>,
    back: usize,
}

/// `trials` trials of `drill`; its rows (kill -9 has two).
async fn run(bench: &mut Bench, drill: Drill, trials: usize) -> Result<Vec<Row>> {
    let name = drill.name();
    let row = |what: &str| Row {
        what: format!("{name}: {what}"),
        trials,
        times: Vec::new(),
        back: 0,
    };
    let (mut epoch, mut released) = (row("new epoch"), row("lock released"));
    for n in 1..=trials {
        let trial = bench.trial(drill).await?;
        let back = usize::from(trial.back);
        (epoch.back, released.back) = (epoch.back + back, released.back + back);
        match trial.takeover {
            Ok(t) => {
                let ms = |d: Duration| d.as_secs_f64() * 1e3;
                let (e, r, gap) = (ms(t.epoch), ms(t.released), ms(t.worst_gap));
                let (leader, to, back) = (t.term.leader, t.term.epoch, trial.back);
                println!(
                    "{name} #{n}: epoch {to} ({leader}) at {e:.1} ms, lock released at \
                     {r:.1} ms (polls at most {gap:.1} ms apart); back: {back}"
                );
                epoch.times.push(t.epoch);
                released.times.push(t.released);
            }
            Err(e) => println!("{name} #{n}: NO TAKEOVER: {e:#}"),
        }
    }
    Ok(if drill == Drill::Kill {
        vec![epoch, released]
    } else {
        vec![epoch]
    })
}

fn print_table(rows: &[Row]) {
    let header = [
        "scenario",
        "trials",
        "median ms",
        "p90 ms",
        "max ms",
        "converged back",
    ];
    let cells: Vec<Vec<String>> = rows.iter().map(cells).collect();
    table::print(&header, &cells, &[0, 5]);
}

fn cells(r: &Row) -> Vec<String> {
    let mut ms: Vec<f64> = r.times.iter().map(|t| t.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    // Nearest rank: the smallest time at least `p` of the trials reach.
    let rank = |p: f64| {
        let i = ((p * ms.len() as f64).ceil() as usize).clamp(1, ms.len().max(1)) - 1;
        ms.get(i).map_or("-".into(), |v| format!("{v:.1}"))
    };
    let (ok, n) = (r.times.len(), r.trials);
    let trials = if ok == n {
        n.to_string()
    } else {
        format!("{ok} of {n} took over")
    };
    let back = if r.back == n {
        "yes".into()
    } else {
        format!("NO ({} of {n})", r.back)
    };
    vec![
        r.what.clone(),
        trials,
        rank(0.5),
        rank(0.9),
        rank(1.0),
        back,
    ]
}
