//! With `--rounds N`: each row's times over the rounds, and its ratio to
//! the memory row of the same round (the target is a ratio, and on
//! two shared cores single runs of one setup vary by a fifth or more).

use crate::args::Setup;
use crate::common::table;
use crate::table::{Outcome, row_label};

const HEADER: [&str; 6] = [
    "nodes",
    "setup",
    "converged s, each round",
    "median s",
    "vs memory, each round",
    "median vs memory",
];

/// Prints the summary when the rows came from several rounds.
pub fn print(rows: &[Outcome]) {
    if rows.iter().all(|r| r.round.is_none()) {
        return;
    }
    let mut keys: Vec<(usize, String)> = Vec::new();
    for r in rows {
        let key = (r.size.nodes, row_label(r));
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    let cells: Vec<Vec<String>> = keys.iter().map(|key| summary(rows, key)).collect();
    println!();
    table::print(&HEADER, &cells, &[1]);
    println!("vs memory: the converge time / that of the memory row of the same round and build");
}

fn summary(rows: &[Outcome], (nodes, label): &(usize, String)) -> Vec<String> {
    let runs: Vec<&Outcome> = (rows.iter())
        .filter(|r| r.size.nodes == *nodes && row_label(r) == *label)
        .collect();
    let times: Vec<Option<f64>> = runs.iter().map(|r| secs(r)).collect();
    let ratios: Vec<Option<f64>> = (runs.iter())
        .map(|r| Some(secs(r)? / secs(memory_of(r, rows)?)?))
        .collect();
    vec![
        nodes.to_string(),
        label.clone(),
        joined(&times, |t| format!("{t:.2}")),
        median(&times).map_or("-".into(), |t| format!("{t:.2}")),
        joined(&ratios, |x| format!("{x:.2}x")),
        median(&ratios).map_or("-".into(), |x| format!("{x:.2}x")),
    ]
}

fn secs(r: &Outcome) -> Option<f64> {
    r.converged.map(|t| t.as_secs_f64())
}

/// The memory row run in the same round as `r`, for its size and build.
fn memory_of<'a>(r: &Outcome, rows: &'a [Outcome]) -> Option<&'a Outcome> {
    rows.iter().find(|o| {
        matches!(o.setup, Setup::Memory)
            && o.size == r.size
            && o.round == r.round
            && (o.build == r.build || matches!(r.setup, Setup::Reference { .. }))
    })
}

fn joined(values: &[Option<f64>], show: impl Fn(f64) -> String) -> String {
    let shown: Vec<String> = (values.iter())
        .map(|v| v.map_or("-".into(), &show))
        .collect();
    shown.join(" ")
}

/// The median of the values present (the mean of the middle two for an
/// even count); `None` if none is.
fn median(values: &[Option<f64>]) -> Option<f64> {
    let mut present: Vec<f64> = values.iter().flatten().copied().collect();
    if present.is_empty() {
        return None;
    }
    present.sort_by(f64::total_cmp);
    let mid = present.len() / 2;
    Some(match present.len() % 2 {
        1 => present[mid],
        _ => (present[mid - 1] + present[mid]) / 2.0,
    })
}
