//! One result per (size, setup), and the table they make.

use std::time::Duration;

use crate::args::{Setup, Size};
use crate::common::table;
use crate::observe::Counts;
use crate::storm::Storm;

/// One (fleet size, setup) result.
pub struct Outcome {
    pub size: Size,
    pub setup: Setup,
    /// The slim-cp build's label (empty: the one cargo built).
    pub build: String,
    /// RSS before the fleet started (the largest replica's), MB.
    pub idle_mb: f64,
    /// Time to convergence, or None when it did not converge in time.
    pub converged: Option<Duration>,
    /// Time until first covered (see `Counts::covered`).
    pub covered: Option<Duration>,
    pub commands: u64,
    /// Peak RSS, the largest of the replicas' for a cluster.
    pub peak_mb: f64,
    pub duplicates: usize,
    pub stable: bool,
    /// The database's size after the run (Postgres only).
    pub db_mb: Option<f64>,
    /// The last counts seen (lost nodes included).
    pub last: Counts,
    /// The reconnect storm after it (`--storm`).
    pub storm: Option<Storm>,
    /// Which round it was run in, with `--rounds` above 1.
    pub round: Option<usize>,
}

const HEADER: [&str; 15] = [
    "nodes",
    "groups",
    "names",
    "setup",
    "converge s",
    "covered s",
    "commands",
    "idle RSS MB",
    "peak RSS MB (max replica)",
    "KiB/node",
    "lost",
    "dup links",
    "db MB",
    "time ratio",
    "status",
];

const LEGEND: &str = "time ratio: converge time / that of the `slim-cp pg x1` row of the \
same size, build and round (the reference: / the `slim-cp memory` row's); `cov`: a row that never \
converged, by its covered time; KiB/node: the whole peak RSS (idle RSS included) / nodes";

pub fn print(rows: &[Outcome]) {
    let cells: Vec<Vec<String>> = rows.iter().map(|r| cells(r, baseline(r, rows))).collect();
    table::print(&HEADER, &cells, &[3, 14]);
    println!("{LEGEND}");
    print_storms(rows);
}

const STORM_HEADER: [&str; 6] = [
    "nodes",
    "setup",
    "follower killed, holding",
    "all registered again",
    "converged again",
    "lost",
];

fn print_storms(rows: &[Outcome]) {
    let secs =
        |t: Option<Duration>| t.map_or("never".into(), |t| format!("{:.2} s", t.as_secs_f64()));
    let cells: Vec<Vec<String>> = rows
        .iter()
        .filter_map(|r| Some((r, r.storm.as_ref()?)))
        .map(|(r, st)| {
            vec![
                r.size.nodes.to_string(),
                label(r),
                format!("{} nodes", st.moved),
                secs(st.registered),
                secs(st.converged),
                st.lost.to_string(),
            ]
        })
        .collect();
    if !cells.is_empty() {
        println!();
        table::print(&STORM_HEADER, &cells, &[1]);
    }
}

/// The row `r`'s time is compared with.
fn baseline<'a>(r: &Outcome, rows: &'a [Outcome]) -> Option<&'a Outcome> {
    let base = |o: &&Outcome| match (&r.setup, &o.setup) {
        (Setup::Reference { .. }, Setup::Memory) => true,
        (Setup::Reference { .. }, _) => false,
        (_, Setup::Postgres { replicas, .. }) => *replicas == 1,
        _ => false,
    };
    let same = |o: &&Outcome| {
        o.size == r.size && o.round == r.round && (o.build == r.build || o.build.is_empty())
    };
    rows.iter().filter(same).find(base)
}

fn ratio(r: &Outcome, base: Option<&Outcome>) -> String {
    let secs = |t: Option<Duration>| t.map(|t| t.as_secs_f64());
    let Some(base) = base else {
        return "-".into();
    };
    match (secs(r.converged), secs(base.converged)) {
        (Some(a), Some(b)) => format!("{:.2}x", a / b),
        _ => match (secs(r.covered), secs(base.covered)) {
            (Some(a), Some(b)) => format!("cov {:.2}x", a / b),
            _ => "-".into(),
        },
    }
}

fn cells(r: &Outcome, base: Option<&Outcome>) -> Vec<String> {
    let shown =
        |t: Option<Duration>| t.map_or(">bound".into(), |t| format!("{:.2}", t.as_secs_f64()));
    let status = match (r.converged, r.stable, r.last.lost) {
        (None, _, _) => format!("DID NOT CONVERGE ({})", r.last),
        (_, _, 1..) => "LOST NODES".to_string(),
        (_, false, _) => "UNSTABLE".to_string(),
        _ => "ok".to_string(),
    };
    let Size {
        nodes,
        groups,
        names,
    } = r.size;
    let per_node_kib = r.peak_mb * 1024.0 / nodes as f64;
    vec![
        nodes.to_string(),
        groups.to_string(),
        names.to_string(),
        label(r),
        shown(r.converged),
        shown(r.covered),
        r.commands.to_string(),
        format!("{:.1}", r.idle_mb),
        format!("{:.1}", r.peak_mb),
        format!("{per_node_kib:.0}"),
        r.last.lost.to_string(),
        r.duplicates.to_string(),
        r.db_mb.map_or("-".into(), |m| format!("{m:.1}")),
        ratio(r, base),
        status,
    ]
}

fn label(r: &Outcome) -> String {
    match r.round {
        Some(round) => format!("{} #{}", row_label(r), round + 1),
        None => row_label(r),
    }
}

/// The setup and build, whatever the round.
pub fn row_label(r: &Outcome) -> String {
    match r.build.as_str() {
        "" => r.setup.label(),
        build => format!("{} [{build}]", r.setup.label()),
    }
}
