//! Starting and stopping what a setup benchmarks: one process on the
//! memory store (slim-cp or the reference), or slim-cp replicas on a fresh
//! Postgres database behind a balancer.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;

use crate::args::Setup;
use crate::common::cluster::Cluster;
use crate::common::cpu;
use crate::common::database::{BenchDb, TableRows};
use crate::common::process::{Proc, base_config, free_port};
use crate::common::scrape::OpTotals;

pub enum Deployment {
    /// One process on the memory store, and its southbound port.
    Single(Proc, u16),
    Cluster(Cluster),
}

impl Deployment {
    /// Starts `setup` with its configs and logs in `dir`; returns once it
    /// serves (for a cluster: every replica alive and one leader).
    pub async fn start(setup: &Setup, slim_cp: &Path, dir: &Path) -> Result<Deployment> {
        std::fs::create_dir_all(dir)?;
        match setup {
            Setup::Memory => single(slim_cp, &["serve"], dir, false),
            Setup::Reference { bin, v3 } => single(bin, &[], dir, *v3),
            Setup::Postgres {
                admin_url,
                replicas,
            } => {
                let db = BenchDb::create_empty(admin_url, "converge").await?;
                let cluster = Cluster::start(slim_cp, dir, db, *replicas).await?;
                Ok(Deployment::Cluster(cluster))
            }
        }
    }

    /// What the fleet dials: the process, a lone replica (as the memory
    /// setup, so that the two differ by their store alone), or the
    /// balancer.
    pub fn url(&self) -> String {
        match self {
            Deployment::Single(_, sb) => format!("http://127.0.0.1:{sb}"),
            Deployment::Cluster(c) if c.replicas.len() == 1 => {
                format!("http://{}", c.replicas[0].southbound())
            }
            Deployment::Cluster(c) => c.lb.url(),
        }
    }

    /// Where the replicas' store time went (none for one process on
    /// memory).
    pub async fn store_ops(&self) -> BTreeMap<String, OpTotals> {
        match self {
            Deployment::Single(..) => BTreeMap::new(),
            Deployment::Cluster(c) => c.store_ops().await,
        }
    }

    /// The control plane's processes.
    pub fn pids(&self) -> Vec<u32> {
        match self {
            Deployment::Single(p, _) => p.pid().into_iter().collect(),
            Deployment::Cluster(c) => c.replicas.iter().filter_map(|r| r.proc.pid()).collect(),
        }
    }

    /// The postmaster of the database, when it runs on this machine.
    pub async fn postmaster(&self) -> Option<u32> {
        match self {
            Deployment::Single(..) => None,
            Deployment::Cluster(c) => c.db.backend_pid().await.and_then(cpu::postmaster_of),
        }
    }

    /// Peak RSS in MB: the process's, or the largest replica's.
    pub fn peak_rss_mb(&self) -> f64 {
        match self {
            Deployment::Single(p, _) => p.memory_mb().map_or(f64::NAN, |(peak, _)| peak),
            Deployment::Cluster(c) => c.peak_rss_mb(),
        }
    }

    /// RSS now in MB: the process's, or the largest replica's.
    pub fn rss_mb(&self) -> f64 {
        match self {
            Deployment::Single(p, _) => p.memory_mb().map_or(f64::NAN, |(_, now)| now),
            Deployment::Cluster(c) => c.rss_mb(),
        }
    }

    /// Stops it; for Postgres, returns the database's size (MB) and the
    /// rows written to each table before dropping it.
    pub async fn stop(self) -> Result<Option<(f64, Vec<TableRows>)>> {
        match self {
            Deployment::Single(..) => Ok(None),
            Deployment::Cluster(c) => Ok(Some(c.stop().await?)),
        }
    }
}

/// `bin args... --config <dir>/config.yaml` on the memory store; `v3`:
/// written for a 3.x control plane, whose topology entries name their
/// group `domain`.
fn single(bin: &Path, args: &[&str], dir: &Path, v3: bool) -> Result<Deployment> {
    let (nb, sb) = (free_port()?, free_port()?);
    let config = dir.join("config.yaml");
    let mut yaml = format!("{}database:\n  type: in_memory\n", base_config(nb, sb));
    if v3 {
        yaml = yaml.replace("- group:", "- domain:");
    }
    std::fs::write(&config, yaml)?;
    let config = config.display().to_string();
    let mut args = args.to_vec();
    args.extend(["--config", &config]);
    let mut proc = Proc::new("control-plane", bin, &args, dir);
    proc.start(&[nb, sb])?;
    Ok(Deployment::Single(proc, sb))
}
