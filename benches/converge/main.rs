//! Convergence benchmark, run by hand: `cargo bench --bench converge`
//! (quick: `cargo bench --bench converge -- --nodes 50 --groups 5 --names 10
//! --only slim-cp`). Cargo builds `slim-cp` in the bench profile first
//! (`cargo build --release --bins --benches` gives the same one).
//!
//! `-- --help` lists the options; what some of them mean in more words:
//! `--only reference` runs the reference of each installed line
//! (2.0.0-alpha.2, and 3.4.6 with a fleet speaking 3.x); the URL of
//! `--db postgres:URL` is the admin database fresh ones are created from;
//! `--db memory,postgres --replicas 1,3` runs slim-cp on memory, on
//! Postgres with one replica and with three, and the reference.
//!
//! `--store-ops` prints, for each Postgres setup, the store operations
//! that took the most time (from the replicas' `/metrics`).
//!
//! `--storm` kills -9, once a cluster's fleet has converged and settled,
//! the follower holding the most sessions, and times until its nodes have
//! registered again elsewhere and the fleet is converged again (a table of
//! its own, after the main one).
//!
//! `--rounds N` runs every row N times, round after round, and adds a
//! table of each row's times, its ratio to the memory row of the same
//! round and the medians of both: the way to compare stores or builds on
//! a machine whose load varies between runs.
//!
//! `--db-cpus LIST` runs the local Postgres server on those CPUs and
//! everything else (the fleet, the watcher, every control plane) on the
//! rest, for every row: see `pin.rs`.
//!
//! `--nodes-per-connection N` (default 32) sets how many simulated nodes
//! share one HTTP/2 connection (real nodes have one each: `1`, within the
//! open-files limit of both processes). `--build LABEL=PATH`, repeated,
//! runs each slim-cp setup with each binary, side by side in one table
//! (e.g. before and after a change: copy the binaries out of `target/`).
//!
//! Each control plane runs as separate processes (so their memory can be
//! read from /proc) on generated configs (full mesh, free loopback ports).
//! A Postgres setup gets a fresh database, dropped afterwards; the fleet
//! dials a lone replica directly (as on memory) and several through a
//! balancer. A simulated fleet in
//! this process registers, announces names, and is watched until what the
//! nodes HOLD is converged: one live link per group pair and, per name,
//! one route at each non-root group's gateway.

#![forbid(unsafe_code)]

mod args;
// Shared with the other bench, which uses other parts of it.
#[allow(dead_code)]
#[path = "../common/mod.rs"]
mod common;
mod deploy;
mod observe;
mod pin;
mod rounds;
mod storm;
mod table;

/// Store operations `--store-ops` lists.
const STORE_OPS_SHOWN: usize = 14;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Result;
use slim_cp::sim::{FleetOptions, SimFleet, SimNodeSpec, SimOptions};

use crate::args::{Args, Build, REFERENCE, SLIM, Setup, Size, parse_args};
use crate::common::cpu;
use crate::common::database::TableRows;
use crate::common::process::{proc_field, slim_cp_bin};
use crate::common::scrape::OpTotals;
use crate::deploy::Deployment;
use crate::observe::{SETTLE, Watch};
use crate::table::Outcome;

#[tokio::main]
async fn main() -> Result<()> {
    let args = parse_args()?;
    println!("{}", machine());
    let dir = std::env::temp_dir().join(format!("slim-cp-converge-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (builds, setups) = setups(&args)?;
    let _pinned = match (&args.db_cpus, args.admin_url()) {
        (Some(cpus), Some(url)) => Some(pin::Pinned::apply(url, cpus).await?),
        _ => None,
    };
    println!("configs and logs (log level info): {}", dir.display());
    let mut rows = Vec::new();
    for s in &args.sizes {
        // Rounds interleave the rows, so that a spell of load on the
        // machine falls on all of them alike.
        for round in 0..args.rounds {
            for setup in &setups {
                // The reference is one binary; slim-cp's setups run per build.
                let n = if matches!(setup, Setup::Reference { .. }) {
                    1
                } else {
                    builds.len()
                };
                for build in &builds[..n] {
                    let mut outcome = run(setup, build, *s, &dir, &args).await?;
                    outcome.round = (args.rounds > 1).then_some(round);
                    rows.push(outcome);
                }
            }
        }
    }
    println!();
    table::print(&rows);
    rounds::print(&rows);
    Ok(())
}

/// slim-cp's binaries (labelled) and the setups to run, in table order.
fn setups(args: &Args) -> Result<(Vec<Build>, Vec<Setup>)> {
    let builds = if args.builds.is_empty() {
        let (slim_cp, profile) = slim_cp_bin()?;
        println!("slim-cp:   {} ({profile})", slim_cp.display());
        vec![(String::new(), slim_cp)]
    } else {
        for (label, bin) in &args.builds {
            println!("slim-cp [{label}]: {}", bin.display());
        }
        args.builds.clone()
    };
    let mut setups = Vec::new();
    if args.wants(SLIM) {
        setups = args.slim_setups();
    }
    if args.wants(REFERENCE) {
        for (folder, v3) in [("bin", false), ("3.4.6/bin", true)] {
            match reference_bin(folder) {
                Some(bin) => {
                    println!("reference ({folder}): {}", bin.display());
                    setups.push(Setup::Reference { bin, v3 });
                }
                None => println!("reference ({folder}): slim-control-plane not installed; skipped"),
            }
        }
    }
    Ok((builds, setups))
}

/// The fleet of size `s`: node i in group i % groups, `per_connection`
/// nodes to an HTTP/2 connection.
fn start_fleet(url: &str, s: Size, per_connection: usize, v3: bool) -> Result<SimFleet> {
    let specs = (0..s.nodes).map(|i| {
        // Endpoints are only names in the simulated network.
        let ep = format!("10.{}.{}.{}:46357", i >> 16, (i >> 8) & 255, i & 255);
        let mut spec = SimNodeSpec::new(&format!("n{i}"), Some(&format!("g{}", i % s.groups)), &ep);
        spec.external_endpoint = Some(ep);
        if v3 { spec.v3() } else { spec }
    });
    let opts = FleetOptions {
        nodes_per_channel: per_connection,
        node: SimOptions::default(),
    };
    let fleet = SimFleet::start(url, specs.collect(), opts)?;
    // Apps subscribe at boot; each node announces once registered.
    for k in 0..s.names {
        fleet.nodes()[s.announcer(k)].announce(["bench", "ns", &format!("name{k}")])?;
    }
    Ok(fleet)
}

async fn run(
    setup: &Setup,
    (build, slim_cp): &Build,
    s: Size,
    dir: &Path,
    args: &Args,
) -> Result<Outcome> {
    let timeout = announce(setup, build, s, args);
    let tag = format!("{}{build}-{}n", setup.label().replace(' ', "-"), s.nodes);
    let mut deployment = Deployment::start(setup, slim_cp, &dir.join(tag)).await?;
    // What the process holds before any node: the per-node figure is over
    // the whole peak, this included (see the README's performance section).
    let idle_mb = deployment.rss_mb();
    let (pids, postmaster) = (deployment.pids(), deployment.postmaster().await);
    let cpu_before = cpu::sample(&pids, postmaster);
    let t0 = Instant::now();
    let v3 = matches!(setup, Setup::Reference { v3: true, .. });
    let fleet = start_fleet(&deployment.url(), s, args.nodes_per_connection, v3)?;
    let mut w = Watch::run(&fleet, s, t0, timeout).await;
    // Right after convergence, before the settle period adds anything.
    let (peak_mb, commands) = (deployment.peak_rss_mb(), fleet.commands_received());
    let cpu = cpu::sample(&pids, postmaster).since(&cpu_before);
    println!("{}", cpu.line("converged"));
    let stable = match w.converged {
        Some(t) => settle(&mut w, &fleet, t, commands).await,
        None => true,
    };
    println!("  slowest fleet inspection {} ms", w.worst.as_millis());
    let settled = cpu::sample(&pids, postmaster).since(&cpu_before);
    println!("{}", settled.line("settled"));
    let storm = match &mut deployment {
        Deployment::Cluster(c) if args.storm && c.replicas.len() > 1 && stable => {
            let st = storm::storm(c, &fleet, s, timeout).await?;
            println!("{}", st.line());
            Some(st)
        }
        _ => None,
    };
    if args.store_ops {
        print_store_ops(&deployment.store_ops().await);
    }
    for (node, why) in fleet.lost().into_iter().take(5) {
        println!("  LOST {node}: {why}");
    }
    drop(fleet);
    let db = deployment.stop().await?;
    if let Some((mb, rows)) = &db {
        println!("  database size after the run: {mb:.1} MB");
        println!("  rows written: {}", TableRows::summary(rows));
    }
    let db_mb = db.map(|(mb, _)| mb);
    Ok(Outcome {
        size: s,
        setup: setup.clone(),
        build: build.clone(),
        idle_mb,
        converged: w.converged,
        covered: w.covered,
        commands,
        peak_mb,
        duplicates: w.seen.len().saturating_sub(s.pairs()),
        stable,
        db_mb,
        last: w.last,
        storm,
        round: None,
    })
}

/// The store operations that took the most time, summed over replicas.
fn print_store_ops(ops: &BTreeMap<String, OpTotals>) {
    let mut ops: Vec<_> = ops.iter().filter(|(_, t)| t.calls > 0).collect();
    ops.sort_by(|a, b| b.1.seconds.total_cmp(&a.1.seconds));
    println!("  store transactions (by time): op calls total-s mean-ms");
    for (op, t) in ops.into_iter().take(STORE_OPS_SHOWN) {
        let mean = t.seconds * 1e3 / t.calls as f64;
        println!("    {op:<28} {:>7} {:>8.2} {mean:>8.2}", t.calls, t.seconds);
    }
}

/// Prints what is about to run, and how busy the machine is (other work
/// skews timings); returns the bound on convergence.
fn announce(setup: &Setup, build: &str, s: Size, args: &Args) -> Duration {
    let bound = if matches!(setup, Setup::Reference { .. }) {
        400
    } else {
        300
    };
    let timeout = args.timeout.unwrap_or(Duration::from_secs(bound));
    let (label, n, g, k, secs) = (setup.label(), s.nodes, s.groups, s.names, timeout.as_secs());
    let per = args.nodes_per_connection;
    println!(
        "--- {label} {build}: {n} nodes ({per} per connection), {g} groups, {k} names (bound {secs} s) ---"
    );
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("  load average at start: {}", load.trim());
    timeout
}

/// Prints the convergence, watches the settle period, and says whether
/// the fleet stayed converged.
async fn settle(w: &mut Watch, fleet: &SimFleet, t: Duration, commands: u64) -> bool {
    let t = t.as_secs_f64();
    println!("  converged at {t:.2} s: {}; cmds {commands}", w.last);
    let stable = w.settle(fleet).await;
    let verdict = if stable { "still" } else { "NO LONGER" };
    let (more, wait) = (fleet.commands_received(), SETTLE.as_secs());
    println!(
        "  {wait} s later: {verdict} converged ({}); cmds {more}",
        w.last
    );
    stable
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpu.lines().find(|l| l.starts_with("model name"));
    let model = model.and_then(|l| l.split(':').nth(1)).unwrap_or("?");
    let mem = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let gib = proc_field(&mem, "MemTotal:") / 1024.0 / 1024.0;
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = model.trim();
    format!("machine: nproc {nproc}, {model}, {gib:.1} GiB memory")
}

/// The reference binary in `folder` (`bin` or `3.4.6/bin`) of the
/// upstream cache `scripts/install-upstream.sh` fills.
fn reference_bin(folder: &str) -> Option<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("SLIM_UPSTREAM_DIR").filter(|d| !d.is_empty()) {
        dirs.push(PathBuf::from(d).join(folder));
    }
    if let Some(h) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        dirs.push(
            PathBuf::from(h)
                .join(".cache/slim-cp/upstream")
                .join(folder),
        );
    }
    let bins = dirs.into_iter().map(|d| d.join("slim-control-plane"));
    bins.into_iter().find(|p| p.is_file())
}
