//! The reconnect storm (`--storm`): once a cluster's fleet has converged,
//! kill -9 the follower holding the most sessions (a third of the fleet
//! with three replicas) and time how long its nodes take to register
//! again on the others, and the fleet to converge again.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rustix::process::Signal;
use slim_cp::sim::SimFleet;

use crate::args::Size;
use crate::common::cluster::Cluster;
use crate::observe::observe;

/// How often the fleet and the cluster are looked at.
const POLL: Duration = Duration::from_millis(50);

/// What one storm cost.
#[derive(Debug, Clone)]
pub struct Storm {
    pub victim: String,
    /// Sessions the victim held when it was killed.
    pub moved: u64,
    /// Until every one of its nodes registered again.
    pub registered: Option<Duration>,
    /// Until the fleet was converged again and the database had every
    /// node on a live replica.
    pub converged: Option<Duration>,
    /// Nodes the fleet lost for good meanwhile.
    pub lost: usize,
}

/// Kills the busiest follower and watches for up to `within`.
pub async fn storm(
    cluster: &mut Cluster,
    fleet: &SimFleet,
    s: Size,
    within: Duration,
) -> Result<Storm> {
    let status = cluster.status().await?;
    let victim = status
        .replicas
        .iter()
        .filter(|r| r.alive && !r.leader)
        .max_by_key(|r| r.sessions)
        .context("no follower to kill")?;
    let (id, moved) = (victim.id.clone(), victim.sessions);
    let i = cluster.index_of(&id)?;
    let before: Vec<u64> = fleet.nodes().iter().map(|n| n.registrations()).collect();
    let lost_before = fleet.lost_count();
    let t0 = Instant::now();
    cluster.replicas[i].proc.signal(Signal::KILL)?;
    let mut out = Storm {
        victim: id.clone(),
        moved,
        registered: None,
        converged: None,
        lost: 0,
    };
    let mut seen = HashSet::new();
    while t0.elapsed() < within {
        tokio::time::sleep(POLL).await;
        let again = fleet
            .nodes()
            .iter()
            .zip(&before)
            .filter(|(n, b)| n.registrations() > **b);
        if out.registered.is_none() && again.count() as u64 >= moved {
            out.registered = Some(t0.elapsed());
        }
        if out.registered.is_none() || !observe(fleet, s, &mut seen).converged(s) {
            continue;
        }
        let elapsed = t0.elapsed();
        if all_on_live_replicas(cluster, &id, s.nodes).await {
            out.converged = Some(elapsed);
            break;
        }
    }
    out.lost = fleet.lost_count().saturating_sub(lost_before);
    cluster.replicas[i].proc.reap()?;
    Ok(out)
}

/// Whether the database has every node connected, none on `dead`.
async fn all_on_live_replicas(cluster: &Cluster, dead: &str, nodes: usize) -> bool {
    let Ok(status) = cluster.status().await else {
        return false;
    };
    let on_dead = status
        .replicas
        .iter()
        .any(|r| r.id == dead && r.sessions > 0);
    status.nodes_connected as usize == nodes && !on_dead
}

impl Storm {
    /// The line printed under the run.
    pub fn line(&self) -> String {
        let secs =
            |t: Option<Duration>| t.map_or("never".into(), |t| format!("{:.2} s", t.as_secs_f64()));
        format!(
            "  storm: killed {} holding {} nodes; all registered again after {}, converged after {}; lost {}",
            self.victim,
            self.moved,
            secs(self.registered),
            secs(self.converged),
            self.lost
        )
    }
}
