//! `--db-cpus LIST`: the Postgres server on CPUs of its own, and this
//! bench (the simulated fleet, the watcher, and every control plane it
//! starts, which inherit it) on the others, for every row alike. On two
//! shared cores the server's work competes with the control plane's and
//! the fleet's for the same CPUs, which no deployment does: there the
//! database has a host, or at least cores, of its own. With the split,
//! the memory and Postgres rows give the control plane and its fleet the
//! same CPUs, and the ratio between them is what the store costs.
//!
//! Affinity is set with `taskset` (util-linux), on the postmaster and its
//! processes (new backends inherit the postmaster's), and put back as it
//! was when the bench ends; the line that announces the split says how to
//! put it back by hand after a bench that was killed.

use std::collections::BTreeSet;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::common::cpu;
use crate::common::database::backend_pid;

/// The pinning in force; dropping it puts the server's CPUs back.
pub struct Pinned {
    postmaster: u32,
    server_before: String,
}

impl Pinned {
    /// Pins the server behind `admin_url` to `db_cpus` and this process
    /// to the CPUs it may use but those.
    pub async fn apply(admin_url: &str, db_cpus: &str) -> Result<Pinned> {
        let postmaster = local_postmaster(admin_url).await?;
        let ours = parse_cpus(&allowed(std::process::id())?)?;
        let db = parse_cpus(db_cpus)?;
        if let Some(cpu) = db.difference(&ours).next() {
            bail!("--db-cpus names CPU {cpu}, which this process may not use");
        }
        let rest: BTreeSet<usize> = ours.difference(&db).copied().collect();
        if rest.is_empty() {
            bail!("--db-cpus {db_cpus} leaves no CPU for the control planes and the fleet");
        }
        let server_before = allowed(postmaster)?;
        let (db, rest) = (format_cpus(&db), format_cpus(&rest));
        pin_tree(postmaster, &db)?;
        taskset(std::process::id(), &rest)?;
        println!(
            "cpus: database server (postmaster {postmaster}) on {db}; control planes, fleet and \
             watcher on {rest} (should this bench be killed: `taskset -a -cp {server_before} PID` \
             for the postmaster and each of its processes puts the server back)"
        );
        Ok(Pinned {
            postmaster,
            server_before,
        })
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if let Err(e) = pin_tree(self.postmaster, &self.server_before) {
            eprintln!(
                "could not put the database server back on CPUs {}: {e:#}; \
                 run `taskset -a -cp {} {}` and the same for its children",
                self.server_before, self.server_before, self.postmaster
            );
        }
    }
}

/// The postmaster of the server `admin_url` reaches, if it runs here.
async fn local_postmaster(admin_url: &str) -> Result<u32> {
    let backend = backend_pid(admin_url)
        .await
        .context("--db-cpus: could not ask the database server for a backend pid")?;
    cpu::postmaster_of(backend).with_context(|| {
        format!("--db-cpus needs the database server on this machine (backend {backend} is not a local Postgres process)")
    })
}

/// The postmaster and every process it started, on `cpus`.
fn pin_tree(postmaster: u32, cpus: &str) -> Result<()> {
    taskset(postmaster, cpus)?;
    for child in cpu::children(postmaster) {
        // A backend may end between the listing and its turn.
        if let Err(e) = taskset(child, cpus)
            && std::path::Path::new(&format!("/proc/{child}")).exists()
        {
            return Err(e);
        }
    }
    Ok(())
}

/// Every thread of `pid` on `cpus`.
fn taskset(pid: u32, cpus: &str) -> Result<()> {
    let out = Command::new("taskset")
        .args(["-a", "-cp", cpus, &pid.to_string()])
        .output()
        .context("running taskset (util-linux)")?;
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr);
        bail!("taskset -a -cp {cpus} {pid}: {}", why.trim());
    }
    Ok(())
}

/// `Cpus_allowed_list` of `pid`, as the kernel writes it (`0-3,6`).
fn allowed(pid: u32) -> Result<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"));
    Ok(line.context("no Cpus_allowed_list")?.trim().to_string())
}

/// A CPU list in the kernel's form: numbers and ranges, comma-separated.
fn parse_cpus(list: &str) -> Result<BTreeSet<usize>> {
    let mut out = BTreeSet::new();
    for part in list.split(',').map(str::trim) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let bad = || format!("{list:?} is not a CPU list (like 1 or 2-3,6)");
        let (a, b): (usize, usize) = (a.parse().with_context(bad)?, b.parse().with_context(bad)?);
        if a > b {
            bail!("{}", bad());
        }
        out.extend(a..=b);
    }
    Ok(out)
}

fn format_cpus(cpus: &BTreeSet<usize>) -> String {
    let list: Vec<String> = cpus.iter().map(usize::to_string).collect();
    list.join(",")
}
