//! `slim-cp drill`: the flags, the database, and the exit status; the
//! drill itself is `slim_cp::drill`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use slim_cp::config::{Config, DatabaseConfig, parse_duration};
use slim_cp::drill::{self, Kind, Options, Template};
use slim_cp::store::postgres::PgStore;

#[derive(Clone, Copy, ValueEnum)]
pub enum DrillKind {
    /// Kill the leader's process with --fault-cmd.
    KillLeader,
    /// Kill a follower's process with --fault-cmd (--replica, else the
    /// follower holding the most sessions).
    KillFollower,
    /// Freeze the leader with --fault-cmd until a new term is committed,
    /// then thaw it with --resume-cmd.
    StopLeader,
    /// Hand leadership over through the admin API.
    StepDown,
}

#[derive(Args)]
pub struct DrillArgs {
    /// The fault.
    #[arg(value_enum)]
    kind: DrillKind,
    /// Any replica's northbound address, or the load balancer's
    /// (host:port): the admin API (replicas, their processes, fencing
    /// counters, step-down).
    #[arg(long, default_value = "127.0.0.1:50051")]
    server: String,
    /// The cluster's configuration; its `database:` is read (as `serve`
    /// and `migrate` do, SLIM_CP_DATABASE_URL filling in a missing URL).
    #[arg(short, long)]
    config: Option<PathBuf>,
    /// The database URL, instead of --config (without either,
    /// SLIM_CP_DATABASE_URL, else ./config.yaml).
    #[arg(long)]
    database_url: Option<String>,
    /// The command that performs the fault, run by `sh -c`, with
    /// {replica}, {pid}, {host}, {incarnation} and {relay} filled in
    /// (e.g. 'kill -9 {pid}', 'docker compose kill -s KILL {replica}').
    #[arg(long)]
    fault_cmd: Option<String>,
    /// stop-leader: the command that thaws the leader (e.g. 'kill -CONT {pid}').
    #[arg(long)]
    resume_cmd: Option<String>,
    /// kill-follower: the replica to kill.
    #[arg(long)]
    replica: Option<String>,
    /// How long the fleet has to converge again after the fault.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    within: Duration,
    /// How long to wait for a settled fleet before the fault.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    settle: Duration,
    /// How often the database is read while waiting.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    poll: Duration,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

impl DrillKind {
    fn kind(self) -> Kind {
        match self {
            DrillKind::KillLeader => Kind::KillLeader,
            DrillKind::KillFollower => Kind::KillFollower,
            DrillKind::StopLeader => Kind::StopLeader,
            DrillKind::StepDown => Kind::StepDown,
        }
    }
}

/// The database URL: --database-url, else --config's, else
/// SLIM_CP_DATABASE_URL, else ./config.yaml's.
fn database_url(args: &DrillArgs) -> Result<String> {
    if args.database_url.is_some() && args.config.is_some() {
        bail!("give --database-url or --config, not both");
    }
    if let Some(url) = &args.database_url {
        return Ok(url.clone());
    }
    if args.config.is_none()
        && let Ok(url) = std::env::var("SLIM_CP_DATABASE_URL")
    {
        return Ok(url);
    }
    let (config, _) = Config::load_or_default(args.config.as_deref())?;
    match config.database {
        DatabaseConfig::Postgres { url, .. } => Ok(url),
        DatabaseConfig::Memory => bail!(
            "a drill needs the cluster's Postgres: give --database-url, or --config with \
             `database: {{type: postgres, ...}}` (a single replica on the memory store has \
             no failover to drill)"
        ),
    }
}

fn options(args: &DrillArgs) -> Result<Options> {
    let template = |flag, text: &Option<String>| -> Result<Option<Template>> {
        Ok(text
            .as_deref()
            .map(|t| Template::parse(flag, t))
            .transpose()?)
    };
    let opts = Options {
        kind: args.kind.kind(),
        server: args.server.clone(),
        fault: template("--fault-cmd", &args.fault_cmd)?,
        resume: template("--resume-cmd", &args.resume_cmd)?,
        replica: args.replica.clone(),
        within: args.within,
        settle: args.settle,
        poll: args.poll,
    };
    opts.check()?;
    Ok(opts)
}

/// Runs the drill; `Ok(false)` when it ran and did not pass.
pub async fn run(args: DrillArgs) -> Result<bool> {
    let opts = options(&args)?;
    let url = database_url(&args)?;
    let store = PgStore::connect(&url, 2)
        .await
        .context("connecting to the cluster's database")?;
    let report = drill::drill(&store, &opts).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else {
        print!("{}", report.render());
    }
    Ok(report.passed())
}
