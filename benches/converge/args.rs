//! Command-line arguments, and the setups (control plane × store ×
//! replicas) they ask for.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::common::database::DEFAULT_ADMIN_URL;

/// Nodes sharing one HTTP/2 connection: 1,000 fit in few descriptors, and
/// the connections still spread over the replicas behind a balancer. Real
/// nodes each have their own; `--nodes-per-connection 1` does that.
const DEFAULT_NODES_PER_CONNECTION: usize = 32;

const DEFAULT_SIZES: [Size; 2] = [Size::new(200, 20, 50), Size::new(1000, 50, 100)];

const USAGE: &str = "\
usage: cargo bench --bench converge -- [options]
  --nodes N --groups N --names N   one fleet size instead of the defaults
                                   (200/20/50 and 1000/50/100)
  --db memory|postgres[:URL],...   stores to run slim-cp on (default memory)
  --replicas N,...                 replicas of each Postgres setup (default 1)
  --only slim-cp|reference         one control plane only
  --build LABEL=PATH               a slim-cp binary to compare (repeatable)
  --nodes-per-connection N         simulated nodes per HTTP/2 connection (32)
  --timeout SECS                   bound on each convergence
  --store-ops                      where each Postgres setup's store time went
  --storm                          kill -9 the busiest follower once converged
  --rounds N                       run every row N times, interleaved, and
                                   summarize each row's times and ratios
  --db-cpus LIST                   the local Postgres server on these CPUs,
                                   everything else on the rest (e.g. 1)
SLIM_CP_BENCH_RUST_LOG sets the control planes' log filter (default: info).
";

/// The two control planes, by the names `--only` takes.
pub const SLIM: &str = "slim-cp";
pub const REFERENCE: &str = "reference";

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Size {
    pub nodes: usize,
    pub groups: usize,
    pub names: usize,
}

impl Size {
    pub const fn new(nodes: usize, groups: usize, names: usize) -> Size {
        Size {
            nodes,
            groups,
            names,
        }
    }

    pub fn pairs(&self) -> usize {
        self.groups * (self.groups - 1) / 2
    }

    /// Node announcing name k: n{k}, of group k % groups, so announcers
    /// are spread over groups and nodes rather than piled on one.
    pub fn announcer(&self, k: usize) -> usize {
        if k < self.nodes { k } else { k % self.groups }
    }
}

/// A slim-cp binary and its label in the table.
pub type Build = (String, PathBuf);

/// One control plane as benchmarked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Setup {
    /// The upstream reference control plane (memory store): its binary,
    /// and whether it is of the 3.x line (its fleet then speaks 3.x).
    Reference { bin: PathBuf, v3: bool },
    /// slim-cp, one replica on the memory store.
    Memory,
    /// slim-cp, `replicas` replicas sharing a fresh database on the server
    /// of `admin_url`.
    Postgres { admin_url: String, replicas: usize },
}

impl Setup {
    /// The table's name for it.
    pub fn label(&self) -> String {
        match self {
            Setup::Reference { v3: false, .. } => REFERENCE.into(),
            Setup::Reference { v3: true, .. } => format!("{REFERENCE} 3.4.6"),
            Setup::Memory => "slim-cp memory".into(),
            Setup::Postgres { replicas, .. } => format!("slim-cp pg x{replicas}"),
        }
    }
}

/// Which store `--db` names.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Db {
    Memory,
    Postgres(String),
}

pub struct Args {
    pub sizes: Vec<Size>,
    pub only: Option<String>,
    pub timeout: Option<Duration>,
    /// slim-cp binaries to compare, each with its label (`--build`); none:
    /// the one cargo built for this bench.
    pub builds: Vec<Build>,
    /// Simulated nodes sharing one HTTP/2 connection.
    pub nodes_per_connection: usize,
    /// Print where each Postgres setup's store time went (`--store-ops`).
    pub store_ops: bool,
    /// Kill the busiest follower of each cluster once converged, and time
    /// the reconnect storm (`--storm`).
    pub storm: bool,
    /// Times each row is run, round after round (`--rounds`).
    pub rounds: usize,
    /// CPUs of the database server's own (`--db-cpus`).
    pub db_cpus: Option<String>,
    dbs: Vec<Db>,
    replicas: Vec<usize>,
}

impl Args {
    /// slim-cp's setups in table order (the reference is added by the
    /// caller when it is installed and wanted).
    pub fn slim_setups(&self) -> Vec<Setup> {
        let mut out = Vec::new();
        for db in &self.dbs {
            match db {
                Db::Memory => out.push(Setup::Memory),
                Db::Postgres(url) => out.extend(self.replicas.iter().map(|&n| Setup::Postgres {
                    admin_url: url.clone(),
                    replicas: n,
                })),
            }
        }
        out
    }

    /// The admin URL of the first Postgres setup.
    pub fn admin_url(&self) -> Option<&str> {
        self.dbs.iter().find_map(|db| match db {
            Db::Postgres(url) => Some(url.as_str()),
            Db::Memory => None,
        })
    }

    pub fn wants(&self, kind: &str) -> bool {
        self.only.as_deref().is_none_or(|o| o == kind)
    }
}

pub fn parse_args() -> Result<Args> {
    let mut a = Args {
        sizes: Vec::new(),
        only: None,
        timeout: None,
        builds: Vec::new(),
        nodes_per_connection: DEFAULT_NODES_PER_CONNECTION,
        store_ops: false,
        storm: false,
        rounds: 1,
        db_cpus: None,
        dbs: vec![Db::Memory],
        replicas: vec![1],
    };
    let mut custom = Size::new(50, 5, 10);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        // cargo bench passes `--bench` to harness = false targets.
        if flag == "--bench" {
            continue;
        }
        if flag == "--store-ops" {
            a.store_ops = true;
            continue;
        }
        if flag == "--storm" {
            a.storm = true;
            continue;
        }
        if flag == "--help" || flag == "-h" {
            print!("{USAGE}");
            std::process::exit(0);
        }
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--nodes" => custom.nodes = value.parse()?,
            "--groups" => custom.groups = value.parse()?,
            "--names" => custom.names = value.parse()?,
            "--timeout" => a.timeout = Some(Duration::from_secs(value.parse()?)),
            "--only" if [SLIM, REFERENCE].contains(&value.as_str()) => a.only = Some(value),
            "--only" => bail!("--only takes {SLIM} or {REFERENCE}"),
            "--db" => a.dbs = list(&value, parse_db)?,
            "--replicas" => a.replicas = list(&value, parse_replicas)?,
            "--build" => a.builds.push(parse_build(&value)?),
            "--nodes-per-connection" => a.nodes_per_connection = value.parse::<usize>()?.max(1),
            "--rounds" => a.rounds = value.parse::<usize>()?.max(1),
            "--db-cpus" => a.db_cpus = Some(value),
            other => bail!("unknown argument {other} (see benches/converge/main.rs)"),
        }
        if matches!(flag.as_str(), "--nodes" | "--groups" | "--names") {
            a.sizes = vec![custom];
        }
    }
    if a.db_cpus.is_some() && a.admin_url().is_none() {
        bail!("--db-cpus needs a Postgres setup (--db postgres or postgres:URL)");
    }
    if a.sizes.is_empty() {
        a.sizes.extend(DEFAULT_SIZES);
    } else if custom.groups < 2 || custom.nodes < custom.groups {
        bail!("need at least 2 groups and one node per group");
    }
    Ok(a)
}

/// A comma-separated list, each item parsed by `item`.
fn list<T>(value: &str, item: fn(&str) -> Result<T>) -> Result<Vec<T>> {
    value.split(',').map(|v| item(v.trim())).collect()
}

/// `memory`, `postgres` or `postgres:URL` (the admin URL fresh databases
/// are created from).
fn parse_db(v: &str) -> Result<Db> {
    match v.split_once(':') {
        _ if v == "memory" => Ok(Db::Memory),
        _ if v == "postgres" => Ok(Db::Postgres(DEFAULT_ADMIN_URL.into())),
        Some(("postgres", url)) if url.contains("://") => Ok(Db::Postgres(url.into())),
        _ => bail!("--db takes memory, postgres or postgres:URL, not {v:?}"),
    }
}

fn parse_replicas(v: &str) -> Result<usize> {
    match v.parse() {
        Ok(n) if n >= 1 => Ok(n),
        _ => bail!("--replicas takes counts of 1 or more, not {v:?}"),
    }
}

/// `LABEL=PATH`: a slim-cp binary to run as well, labelled in the table
/// (e.g. `--build before=/tmp/slim-cp-main --build after=target/release/slim-cp`).
fn parse_build(v: &str) -> Result<Build> {
    match v.split_once('=') {
        Some((label, path)) if !label.is_empty() && Path::new(path).is_file() => {
            Ok((label.to_string(), PathBuf::from(path)))
        }
        _ => bail!("--build takes LABEL=PATH of a slim-cp binary, not {v:?}"),
    }
}
