//! The `slim-cp` binary: wires configuration, store and servers together.

#![forbid(unsafe_code)]

mod admin;
mod drill;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use slim_cp::auth::sealing::SealKey;
use slim_cp::config::{Config, DatabaseConfig};
use slim_cp::server::{self, Options};
use slim_cp::server::{Running, Sockets};
use slim_cp::store::MemoryStore;
use slim_cp::store::postgres::PgStore;
use tracing::{info, warn};

#[derive(Parser)]
#[command(
    name = "slim-cp",
    version,
    about = "Highly available control plane for SLIM"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one replica.
    Serve {
        /// YAML configuration (default: ./config.yaml if present, else built-in defaults).
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// With Postgres: do not apply migrations at start (a replica still
        /// refuses a schema it does not match).
        #[arg(long)]
        no_migrate: bool,
    },
    /// Apply the database migrations this binary carries, then exit.
    Migrate {
        /// YAML configuration with `database: {type: postgres, ...}`.
        #[arg(short, long)]
        config: Option<PathBuf>,
    },
    /// Show the cluster: replicas, leader and epoch, counts, queue depth.
    Status {
        /// Any replica's northbound address (host:port).
        #[arg(long, default_value = "127.0.0.1:50051")]
        server: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Ask the leader to hand leadership over to a standby now.
    StepDown {
        /// Any replica's northbound address (host:port).
        #[arg(long, default_value = "127.0.0.1:50051")]
        server: String,
    },
    /// Ask the replica at ADDR to move its nodes to the others and stop
    /// (as SIGTERM does).
    Drain {
        /// That replica's own northbound address (host:port), not the
        /// load balancer's.
        #[arg(long)]
        server: String,
    },
    /// Drill a failover on a running cluster: perform one fault, then
    /// report how long the cluster took to recover and what it lost.
    /// Exits 0 when the fleet converged again within --within with
    /// nothing lost or duplicated, 2 when not, 1 when the drill could
    /// not run.
    Drill(drill::DrillArgs),
}

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    // Colours only on a terminal: log files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .init();
}

fn options(config: &Config) -> Result<Options> {
    let mut opts = Options::loopback();
    opts.northbound_tls = slim_cp::tls::server_tls(&config.northbound.tls, "northbound")?;
    opts.southbound_tls = slim_cp::tls::server_tls(&config.southbound.tls, "southbound")?;
    let auth_cfg = config.topology.registration_auth.as_ref();
    opts.domains = slim_cp::auth::domains(auth_cfg, seal_key(config)?);
    opts.auth = slim_cp::auth::authenticator(auth_cfg, opts.domains.clone())?;
    opts.northbound = config.northbound.socket_addr()?;
    opts.southbound = config.southbound.socket_addr()?;
    opts.topology = config.topology.mode.clone();
    opts.reconciler = config.reconciler.clone();
    opts.drain = config.drain.clone();
    let postgres = matches!(config.database, DatabaseConfig::Postgres { .. });
    if config.http.enabled.unwrap_or(postgres) {
        let endpoint = &config.http.endpoint;
        let addr = std::net::ToSocketAddrs::to_socket_addrs(endpoint.as_str())
            .with_context(|| format!("http.endpoint {endpoint:?}"))?
            .next()
            .with_context(|| format!("http.endpoint {endpoint:?} resolves to nothing"))?;
        opts.http = Some(addr);
    }
    Ok(opts)
}

/// Starts the replica on the configured store: alone on memory, as a
/// cluster member on Postgres (migrated unless `no_migrate`, and checked
/// against the schema this binary knows).
async fn start(config: &Config, no_migrate: bool) -> Result<Running> {
    let opts = options(config)?;
    let DatabaseConfig::Postgres {
        url,
        direct_url,
        pool_size,
    } = &config.database
    else {
        let sockets = Sockets::bind(&opts, None).context("binding the listeners")?;
        let running = server::start_on(sockets, opts, Arc::new(MemoryStore::new()));
        return running.await.context("starting the replica");
    };
    // Before any other socket: see `Sockets`.
    let relay = server::relay_addr(&config.cluster).context("cluster.relay.endpoint")?;
    let sockets = Sockets::bind(&opts, Some(relay)).context("binding the listeners")?;
    if !no_migrate {
        PgStore::migrate(url).await.context("applying migrations")?;
    }
    PgStore::check_schema(url)
        .await
        .context("checking the schema")?;
    let store = PgStore::connect_with_direct(url, direct_url.as_deref(), *pool_size)
        .await
        .context("connecting to Postgres")?;
    server::start_clustered_on(sockets, opts, store, config.cluster.clone())
        .await
        .context("starting the replica")
}

/// The key stored domain secrets are sealed with: from the environment,
/// identical on every replica. The memory store, whose domains die with the
/// process, makes one up when none is set; on Postgres, without one,
/// domains can be listed but `AddDomain` is refused.
fn seal_key(config: &Config) -> Result<Option<SealKey>> {
    use slim_cp::auth::sealing::KEY_ENV;
    match std::env::var(KEY_ENV) {
        Ok(text) => Ok(Some(SealKey::from_base64(&text)?)),
        Err(std::env::VarError::NotPresent) => Ok(match config.database {
            DatabaseConfig::Memory => Some(SealKey::random()),
            DatabaseConfig::Postgres { .. } => None,
        }),
        Err(std::env::VarError::NotUnicode(_)) => bail!("{KEY_ENV} is not valid UTF-8"),
    }
}

fn store_name(config: &Config) -> &'static str {
    match config.database {
        DatabaseConfig::Memory => "memory store, single replica",
        DatabaseConfig::Postgres { .. } => "postgres store, clustered",
    }
}

async fn migrate(path: Option<PathBuf>) -> Result<()> {
    let (config, _) = Config::load_or_default(path.as_deref())?;
    init_logging(&config.tracing.log_level);
    let DatabaseConfig::Postgres { url, .. } = &config.database else {
        bail!("database.type: `migrate` needs `type: postgres` (the memory store has no schema)");
    };
    PgStore::migrate(url).await.context("applying migrations")?;
    PgStore::check_schema(url)
        .await
        .context("checking the schema")?;
    info!("schema up to date");
    Ok(())
}

async fn serve(path: Option<PathBuf>, no_migrate: bool) -> Result<()> {
    let (config, file) = Config::load_or_default(path.as_deref())?;
    init_logging(&config.tracing.log_level);
    match &file {
        Some(f) => info!(file = %f.display(), "configuration loaded"),
        None => info!("no configuration file; using defaults"),
    }
    for key in config.ignored_keys() {
        warn!(
            key,
            "configuration key accepted for compatibility but has no effect"
        );
    }
    let running = start(&config, no_migrate).await?;
    info!(
        northbound = %running.northbound_addr,
        southbound = %running.southbound_addr,
        relay = ?running.relay_addr,
        store = store_name(&config),
        "slim-cp serving"
    );
    let failure = tokio::select! {
        () = shutdown_signal() => None,
        () = running.drain_requested() => None,
        why = running.failed() => Some(why),
    };
    // With other replicas to take the nodes, hand them over first; a
    // single replica on the memory store has nowhere to send them.
    let clustered = matches!(config.database, DatabaseConfig::Postgres { .. });
    if failure.is_none() && clustered {
        running.drain().await;
    }
    info!("shutting down");
    running.shutdown().await;
    match failure {
        Some(why) => bail!("{why}"),
        None => Ok(()),
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let outcome = match Cli::parse().command {
        Command::Serve { config, no_migrate } => serve(config, no_migrate).await,
        Command::Migrate { config } => migrate(config).await,
        Command::Status { server, json } => admin::status(&server, json).await,
        Command::StepDown { server } => admin::step_down(&server).await,
        Command::Drain { server } => admin::drain(&server).await,
        Command::Drill(args) => match drill::run(args).await {
            Ok(true) => Ok(()),
            Ok(false) => return std::process::ExitCode::from(2),
            Err(e) => Err(e),
        },
    };
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One readable line with the chain of causes, no backtrace.
            eprintln!("slim-cp: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
