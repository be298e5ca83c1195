//! A partition drill's stage: three replicas on a [`Fabric`], twelve
//! simulated nodes in four fully meshed groups with two announced names,
//! converged before the fault, and the waits the drills share.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use slim_cp::sim::SimFleet;
use slim_cp::store::Store as _;

use super::Fabric;
use super::report::Report;
use super::watch::{Tally, Watch};
use crate::cluster_support::logs::epoch_sends_after;
use crate::cluster_support::{Cluster, MESH};

pub const GROUPS: [&str; 4] = ["a", "b", "c", "d"];
/// The names every drill starts with: (last component, announcing group).
pub const NAMES: [(&str, &str); 2] = [("alpha", "a"), ("gamma", "c")];

/// Fields drop in order: the replicas die before their namespaces go.
pub struct Drill {
    pub cluster: Cluster,
    pub fabric: Fabric,
    pub fleet: Arc<SimFleet>,
    /// The converged links' ids before the fault.
    pub links: BTreeSet<String>,
    pub watch: Option<Watch>,
}

impl Drill {
    pub async fn stage() -> Drill {
        let fabric = Fabric::new(3).await;
        eprintln!("partition drill network: {}", fabric.kind());
        let cluster = Cluster::start_placed(3, MESH, |i, url| fabric.place(i, url)).await;
        let fleet = Arc::new(cluster.fleet(&GROUPS, 3).await);
        for (node, name) in [("a/n0", "alpha"), ("c/n1", "gamma")] {
            fleet
                .node(node)
                .expect("node")
                .announce(["org", "ns", name])
                .expect("announced");
        }
        let links = cluster.converged(&fleet, GROUPS.len(), &NAMES).await;
        let watch = Some(Watch::start(fleet.clone()));
        Drill {
            cluster,
            fabric,
            fleet,
            links,
            watch,
        }
    }

    /// Waits until every node has a session and the fleet is exactly
    /// converged on `names`.
    /// The fleet must also hold every link and route it started with, as
    /// the watch sees it: the store can look converged for a moment before
    /// a healed replica's nodes register again and redial.
    pub async fn converged(&self, names: &[(&str, &str)]) -> BTreeSet<String> {
        self.all_connected().await;
        self.cluster
            .converged(&self.fleet, GROUPS.len(), names)
            .await;
        if let Some(w) = &self.watch {
            let mut latest = w.latest.clone();
            let settled = latest.wait_for(|t| *t == Tally::default());
            let waited = tokio::time::timeout(crate::cluster_support::PATIENCE, settled).await;
            let last = *w.latest.borrow();
            assert!(
                waited.is_ok(),
                "the fleet never got back what it held: {last:?}"
            );
        }
        self.all_connected().await;
        self.cluster
            .converged(&self.fleet, GROUPS.len(), names)
            .await
    }

    /// Sessions the database says replica `i` owns.
    pub async fn sessions_on(&self, i: usize) -> Result<(usize, usize), String> {
        let counts = self
            .cluster
            .store
            .counts()
            .await
            .map_err(|e| e.to_string())?;
        let id = &self.cluster.replicas[i].id;
        let on = counts.sessions.get(id).copied().unwrap_or(0);
        Ok((on as usize, counts.connected as usize))
    }

    /// Waits until replica `i` owns no session and all twelve nodes are
    /// connected elsewhere.
    pub async fn moved_off(&self, i: usize) {
        self.cluster
            .wait("the nodes moved off the replica", || async {
                match self.sessions_on(i).await? {
                    (0, 12) => Ok(()),
                    other => Err(format!("(on it, connected): {other:?}")),
                }
            })
            .await;
    }

    /// Waits until every node has a session again: after a heal, the
    /// fleet is settled only once the replica that was cut has learnt it
    /// was declared dead and its nodes registered again (until then it
    /// can look converged with stale sessions).
    pub async fn all_connected(&self) {
        self.cluster
            .wait("every node connected", || async {
                match self.sessions_on(0).await? {
                    (_, 12) => Ok(()),
                    (_, n) => Err(format!("{n} connected")),
                }
            })
            .await;
    }

    /// Waits until the leader has declared replica `i` dead: it owns no
    /// session any more (its nodes are not connected yet).
    pub async fn declared_dead(&self, i: usize) {
        self.cluster
            .wait("the replica declared dead", || async {
                match self.sessions_on(i).await? {
                    (0, _) => Ok(()),
                    other => Err(format!("(on it, connected): {other:?}")),
                }
            })
            .await;
    }

    /// A node whose session replica `i` does not own, to act through
    /// while `i` is cut off.
    pub async fn node_not_on(&self, i: usize) -> String {
        let nodes = self.cluster.store.list_nodes().await.expect("nodes");
        let id = &self.cluster.replicas[i].id;
        nodes
            .into_iter()
            .find(|n| n.session.as_ref().is_some_and(|s| s.owner.id != *id))
            .map(|n| n.id)
            .expect("a node on another replica")
    }

    /// Waits until replica `i` logs a failed relay call.
    pub async fn relay_failed(&self, i: usize) {
        let r = &self.cluster.replicas[i];
        self.cluster
            .wait("a failed relay call", || async {
                let log = r.log();
                // At the relay's deadline, or at once when the leader
                // flags the replica it cannot reach for drain.
                let failed = log.contains("relay to the owning replica failed")
                    || log.contains("owning the session, is flagged for drain");
                if failed {
                    Ok(())
                } else {
                    Err("none logged yet".into())
                }
            })
            .await;
    }

    /// No replica sent a command under `epoch` after `since` (RFC 3339).
    pub fn silent_since(&self, epoch: u64, since: &str) {
        for r in &self.cluster.replicas {
            let late = epoch_sends_after(&r.log(), epoch, since);
            assert!(late.is_empty(), "{} sent under {epoch}: {late:?}", r.id);
        }
    }

    pub fn announce(&self, node: &str, name: &str) {
        self.fleet
            .node(node)
            .expect("node")
            .announce(["org", "ns", name])
            .expect("announced");
    }

    /// Stops watching and reports, failing on anything lost.
    pub async fn report(
        &mut self,
        drill: &'static str,
        new_leader: Option<Duration>,
        (converged, since): (Duration, &'static str),
        note: String,
    ) {
        let seen = self.watch.take().expect("watching").finish().await;
        let report = Report {
            drill,
            network: self.fabric.kind(),
            new_leader,
            converged,
            since,
            note,
            seen,
            nodes_lost: self.fleet.lost_count(),
            fenced: self.cluster.fenced().await,
        };
        report.check();
    }
}
