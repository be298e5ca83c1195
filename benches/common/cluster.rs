//! N `slim-cp serve` replicas (`bench-0`, `bench-1`...) on one fresh
//! Postgres database with the default cluster timings, behind a
//! `slim_cp::sim::Balancer` that the fleet dials, as deployments require.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use slim_cp::proto::cluster::admin_client::AdminClient;
use slim_cp::proto::cluster::{ClusterStatus, StatusRequest};
use slim_cp::sim::Balancer;
use tonic::transport::{Channel, Endpoint};

use super::database::{BenchDb, TableRows};
use super::process::{Proc, base_config, free_port};
use super::scrape::{self, OpTotals};

/// Pooled connections per replica: three replicas and their dedicated
/// connections stay well under Postgres' default 100.
const POOL_SIZE: usize = 8;
/// A replica whose admin service does not answer in this long is skipped
/// (a stopped process accepts connections but never answers).
const ASK_BOUND: Duration = Duration::from_secs(4);
/// Bound on one admin call: a step-down may wait up to a lease (5 s) for
/// leader work to wind down.
const CALL_BOUND: Duration = Duration::from_secs(15);
/// How often a wait asks for the cluster's status.
const STATUS_POLL: Duration = Duration::from_millis(100);

pub struct Replica {
    pub id: String,
    pub nb: u16,
    pub sb: u16,
    /// Health and metrics.
    pub http: u16,
    pub proc: Proc,
    config: PathBuf,
}

impl Replica {
    /// Writes `bench-<i>`'s config on fresh ports.
    fn new(bin: &Path, dir: &Path, i: usize, db_url: &str) -> Result<Replica> {
        let id = format!("bench-{i}");
        let (nb, sb, relay, http) = (free_port()?, free_port()?, free_port()?, free_port()?);
        let yaml = format!(
            "{}database:\n  type: postgres\n  url: \"{db_url}\"\n  pool_size: {POOL_SIZE}\n\
             http:\n  endpoint: \"127.0.0.1:{http}\"\n\
             cluster:\n  replica_id: {id}\n  relay:\n    endpoint: \"127.0.0.1:{relay}\"\n",
            base_config(nb, sb)
        );
        let config = dir.join(format!("{id}.yaml"));
        std::fs::write(&config, yaml)?;
        let path = config.display().to_string();
        let args = ["serve", "--no-migrate", "--config", &path];
        let proc = Proc::new(&id, bin, &args, dir);
        Ok(Replica {
            id,
            nb,
            sb,
            http,
            proc,
            config,
        })
    }

    /// Starts (or restarts, on the same ports) and waits until it listens.
    pub fn start(&mut self) -> Result<()> {
        self.proc.start(&[self.nb, self.sb])
    }

    pub fn southbound(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.sb))
    }

    /// A channel to this replica's admin service (on the northbound port).
    pub async fn admin(&self) -> Result<AdminClient<Channel>> {
        let endpoint = Endpoint::from_shared(format!("http://127.0.0.1:{}", self.nb))?;
        let channel = endpoint.connect_timeout(ASK_BOUND).timeout(CALL_BOUND);
        Ok(AdminClient::new(channel.connect().await?))
    }
}

/// Every one of `n` replicas alive and serving, and exactly one leader.
pub fn settled(s: &ClusterStatus, n: usize) -> bool {
    let ready = |r: &&slim_cp::proto::cluster::ReplicaStatus| {
        r.alive && r.live.as_ref().is_some_and(|l| l.ready)
    };
    let leaders = s.replicas.iter().filter(|r| r.leader).count();
    s.replicas.iter().filter(ready).count() == n && leaders == 1
}

pub struct Cluster {
    pub replicas: Vec<Replica>,
    pub lb: Balancer,
    pub db: BenchDb,
}

impl Cluster {
    /// Starts `n` replicas on `db`, and waits until they are settled.
    pub async fn start(bin: &Path, dir: &Path, db: BenchDb, n: usize) -> Result<Cluster> {
        let mut replicas = Vec::new();
        for i in 0..n {
            replicas.push(Replica::new(bin, dir, i, &db.url)?);
        }
        // Once, rather than by replicas racing at start; and by the binary
        // under test, so that builds compared side by side each run on
        // their own schema.
        let first = replicas.first().context("a cluster of no replicas")?;
        migrate(bin, &first.config)?;
        for r in &mut replicas {
            r.start()?;
        }
        let lb = Balancer::start(replicas.iter().map(Replica::southbound).collect()).await?;
        let cluster = Cluster { replicas, lb, db };
        let bound = Duration::from_secs(60);
        cluster
            .wait("replicas alive and one leader", bound, |s| settled(s, n))
            .await?;
        Ok(cluster)
    }

    /// The status as the first replica that answers tells it.
    pub async fn status(&self) -> Result<ClusterStatus> {
        let mut last = None;
        for r in &self.replicas {
            let ask = async { Ok(r.admin().await?.status(StatusRequest {}).await?) };
            match tokio::time::timeout(ASK_BOUND, ask).await {
                Ok(Ok(reply)) => return Ok(reply.into_inner()),
                Ok(Err(e)) => last = Some(e),
                Err(_) => last = Some(anyhow::anyhow!("{} did not answer", r.id)),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("no replicas")))
    }

    /// Polls the status until `ok` holds; fails after `within`.
    pub async fn wait<F>(&self, what: &str, within: Duration, ok: F) -> Result<ClusterStatus>
    where
        F: Fn(&ClusterStatus) -> bool,
    {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let status = self.status().await;
            match status {
                Ok(s) if ok(&s) => return Ok(s),
                _ if tokio::time::Instant::now() > deadline => {
                    let logs = self.replicas.first().map(|r| r.proc.log_path().to_owned());
                    bail!("no {what} after {within:?}: {status:?} (logs beside {logs:?})");
                }
                _ => tokio::time::sleep(STATUS_POLL).await,
            }
        }
    }

    pub fn index_of(&self, id: &str) -> Result<usize> {
        let i = self.replicas.iter().position(|r| r.id == id);
        i.with_context(|| format!("no replica {id:?}"))
    }

    /// The largest peak RSS of any replica, in MB.
    pub fn peak_rss_mb(&self) -> f64 {
        let peaks = self.replicas.iter().filter_map(|r| r.proc.memory_mb().ok());
        peaks.map(|(peak, _)| peak).fold(f64::NAN, f64::max)
    }

    /// The largest RSS of any replica now, in MB.
    pub fn rss_mb(&self) -> f64 {
        let now = self.replicas.iter().filter_map(|r| r.proc.memory_mb().ok());
        now.map(|(_, rss)| rss).fold(f64::NAN, f64::max)
    }

    /// Every replica's store transactions, summed per operation; a
    /// replica that does not answer is left out.
    pub async fn store_ops(&self) -> BTreeMap<String, OpTotals> {
        let mut ops = BTreeMap::new();
        for r in &self.replicas {
            if let Ok(Ok(text)) = tokio::time::timeout(ASK_BOUND, scrape::metrics(r.http)).await {
                scrape::store_ops(&text, &mut ops);
            }
        }
        ops
    }

    /// Stops every replica, then drops the database; returns its size (MB)
    /// and the rows written to each table, as the run left them.
    pub async fn stop(self) -> Result<(f64, Vec<TableRows>)> {
        let Cluster { replicas, lb, db } = self;
        drop(lb);
        drop(replicas);
        let size = db.size_mb().await;
        let rows = db.rows_written().await;
        db.remove().await?;
        Ok((size?, rows?))
    }
}

/// `bin migrate --config config`, waited for.
fn migrate(bin: &Path, config: &Path) -> Result<()> {
    let out = std::process::Command::new(bin)
        .arg("migrate")
        .arg("--config")
        .arg(config)
        .output()
        .with_context(|| format!("running {} migrate", bin.display()))?;
    if !out.status.success() {
        bail!(
            "{} migrate failed: {}",
            bin.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}
