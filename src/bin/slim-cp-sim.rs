//! `slim-cp-sim`: runs a simulated SLIM data-plane fleet against a control
//! plane, for demos, soak tests and benchmarks by hand.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use slim_cp::sim::{FleetOptions, NodeState, SimFleet, SimNodeSpec, SimOptions};

/// Simulated SLIM data-plane fleet.
#[derive(Debug, Parser)]
#[command(
    name = "slim-cp-sim",
    version,
    about = "Simulated SLIM data-plane fleet for slim-cp"
)]
struct Args {
    /// Control plane southbound URL.
    #[arg(long, default_value = "http://127.0.0.1:50052")]
    control_plane: String,
    /// Number of nodes (ids node-0 ... node-N-1).
    #[arg(long, default_value_t = 100)]
    nodes: usize,
    /// Number of groups (group-0 ... group-M-1); 0 means no groups.
    #[arg(long, default_value_t = 10)]
    groups: usize,
    /// How many nodes announce a name (org/ns/svc-K), spread over the fleet.
    #[arg(long, default_value_t = 5)]
    names: usize,
    /// Nodes sharing one HTTP/2 connection (1: one per node, like real nodes).
    #[arg(long, default_value_t = 32)]
    nodes_per_channel: usize,
    /// First fake data-plane port; node N listens on base + N.
    #[arg(long, default_value_t = 20000)]
    base_port: u16,
    /// Seconds between status lines.
    #[arg(long, default_value_t = 5)]
    status_every: u64,
}

fn specs(args: &Args) -> anyhow::Result<Vec<SimNodeSpec>> {
    (0..args.nodes)
        .map(|i| {
            let offset = u16::try_from(i).context("too many nodes for the port range")?;
            let port = args
                .base_port
                .checked_add(offset)
                .context("port range overflows")?;
            let group = (args.groups > 0).then(|| format!("group-{}", i % args.groups));
            let endpoint = format!("127.0.0.1:{port}");
            let mut spec = SimNodeSpec::new(&format!("node-{i}"), group.as_deref(), &endpoint);
            spec.external_endpoint = Some(endpoint);
            Ok(spec)
        })
        .collect()
}

fn status_line(fleet: &SimFleet) -> String {
    let (mut conns, mut routes, mut starting) = (0, 0, 0);
    for node in fleet.nodes() {
        conns += node.connections().len();
        routes += node.routes().len();
        if node.state() == NodeState::Starting {
            starting += 1;
        }
    }
    format!(
        "registered {}/{} starting {} lost {} connections {} routes {}",
        fleet.registered_count(),
        fleet.nodes().len(),
        starting,
        fleet.lost_count(),
        conns,
        routes
    )
}

/// Announces org/ns/svc-K on K evenly spread nodes once they registered.
async fn announce(fleet: Arc<SimFleet>, names: usize) {
    let total = fleet.nodes().len();
    if total == 0 || names == 0 {
        return;
    }
    let step = (total / names).max(1);
    for k in 0..names.min(total) {
        let Some(node) = fleet.nodes().get(k * step) else {
            continue;
        };
        if !node.wait_registered(Duration::from_secs(30)).await {
            tracing::warn!(
                node = node.effective_id(),
                "not registered; announcing anyway"
            );
        }
        let svc = format!("svc-{k}");
        match node.announce(["org", "ns", &svc]) {
            Ok(_) => tracing::info!(node = node.effective_id(), name = %svc, "announced"),
            Err(e) => tracing::warn!(node = node.effective_id(), error = %e, "announce failed"),
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let options = FleetOptions {
        nodes_per_channel: args.nodes_per_channel,
        node: SimOptions::default(),
    };
    let fleet = SimFleet::start(&args.control_plane, specs(&args)?, options)
        .context("starting the fleet")?;
    let fleet = Arc::new(fleet);
    println!(
        "started {} nodes against {}",
        fleet.nodes().len(),
        args.control_plane
    );
    let announcer = tokio::spawn(announce(fleet.clone(), args.names));
    let mut ticker = tokio::time::interval(Duration::from_secs(args.status_every.max(1)));
    loop {
        tokio::select! {
            _ = ticker.tick() => println!("{}", status_line(&fleet)),
            res = tokio::signal::ctrl_c() => {
                res.context("waiting for Ctrl-C")?;
                break;
            }
        }
    }
    announcer.abort();
    println!("summary: {}", status_line(&fleet));
    for (id, reason) in fleet.lost() {
        println!("lost {id}: {reason}");
    }
    fleet.crash_all();
    Ok(())
}
