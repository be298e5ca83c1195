//! CPU time spent by the processes of a run, read from `/proc`: wall time
//! on two shared cores mixes what each party costs with how the scheduler
//! interleaved them, while CPU seconds add up the same way run after run.
//! Postgres is counted whole (the postmaster and every backend, those that
//! ended included: a reaped child's time moves to its parent's `cutime`),
//! so a database on another machine is not counted at all.

use std::path::Path;

/// Clock ticks per second of `/proc/<pid>/stat` times: 100 on every Linux
/// this runs on (`getconf CLK_TCK`).
const TICKS: f64 = 100.0;

/// The fields of `/proc/<pid>/stat` after the command name (which may hold
/// spaces and parentheses, so the split is at the last `)`).
fn stat_fields(pid: u32) -> Option<Vec<u64>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    // State (a letter) first; every later field is a number.
    Some(
        rest.split_whitespace()
            .skip(1)
            .map(|f| f.parse().unwrap_or(0))
            .collect(),
    )
}

/// Field `n` of `/proc/<pid>/stat`, numbered as in proc(5) (14 is utime).
fn field(fields: &[u64], n: usize) -> u64 {
    // proc(5) numbers the pid 1, the name 2 and the state 3.
    fields.get(n - 4).copied().unwrap_or(0)
}

/// User and system seconds of `pid` itself (all its threads).
pub fn own_seconds(pid: u32) -> Option<f64> {
    let f = stat_fields(pid)?;
    Some((field(&f, 14) + field(&f, 15)) as f64 / TICKS)
}

/// Seconds of `pid`, its children reaped so far, and its live children.
pub fn tree_seconds(pid: u32) -> Option<f64> {
    let f = stat_fields(pid)?;
    let reaped = (field(&f, 14) + field(&f, 15) + field(&f, 16) + field(&f, 17)) as f64 / TICKS;
    let live: f64 = children(pid).into_iter().filter_map(own_seconds).sum();
    Some(reaped + live)
}

/// Whether `pid` runs Postgres (`postgres` or `postmaster`).
fn is_postgres(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .is_ok_and(|c| c.starts_with("postgres") || c.starts_with("postmaster"))
}

/// The postmaster, when `backend` is a Postgres process on this machine.
pub fn postmaster_of(backend: u32) -> Option<u32> {
    let parent = parent(backend).filter(|p| is_postgres(*p))?;
    is_postgres(backend).then_some(parent)
}

/// The parent of `pid`.
fn parent(pid: u32) -> Option<u32> {
    let f = stat_fields(pid)?;
    u32::try_from(field(&f, 4)).ok()
}

/// The live processes whose parent is `pid`.
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(Path::new("/proc")) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| parent(*p) == Some(pid))
        .collect()
}

/// CPU seconds of the parties of a run, at one instant.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    pub control_plane: f64,
    /// `None` when the database's processes are not on this machine.
    pub database: Option<f64>,
    /// This process: the simulated fleet and the watcher.
    pub fleet: f64,
}

impl Sample {
    /// What was spent from `earlier` to `self`.
    pub fn since(&self, earlier: &Sample) -> Sample {
        Sample {
            control_plane: self.control_plane - earlier.control_plane,
            database: self.database.zip(earlier.database).map(|(a, b)| a - b),
            fleet: self.fleet - earlier.fleet,
        }
    }

    /// The table line of what was spent until `when`.
    pub fn line(&self, when: &str) -> String {
        let db = self
            .database
            .map_or_else(|| "-".to_string(), |s| format!("{s:.2} s"));
        format!(
            "  CPU until {when}: control plane {:.2} s, database {db}, fleet and watcher {:.2} s",
            self.control_plane, self.fleet
        )
    }
}

/// Seconds of `control_plane` processes, the Postgres server whose
/// postmaster is `postmaster`, and this process.
pub fn sample(control_plane: &[u32], postmaster: Option<u32>) -> Sample {
    Sample {
        control_plane: control_plane.iter().filter_map(|p| own_seconds(*p)).sum(),
        database: postmaster.and_then(tree_seconds),
        fleet: own_seconds(std::process::id()).unwrap_or(0.0),
    }
}
