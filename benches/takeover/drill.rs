//! The drills: kill -9 of the leader, a step-down, SIGSTOP of the leader.
//! Each starts from a settled cluster and fleet, times the takeover as the
//! database shows it, undoes the damage (restart, SIGCONT), and checks
//! that the cluster and the fleet came back.

use std::time::{Duration, Instant};

use anyhow::Result;
use rustix::process::Signal;
use slim_cp::proto::cluster::{ClusterStatus, StepDownRequest};
use slim_cp::sim::SimFleet;

use crate::common::cluster::{Cluster, settled};
use crate::watch::{Observer, Takeover, Term};

/// A takeover not seen in this long failed (SIGSTOP's is lease-bound:
/// about 5-6 s with the default timings).
const TAKEOVER_BOUND: Duration = Duration::from_secs(30);
/// How long the cluster and the fleet get to come back after a drill.
const BACK_BOUND: Duration = Duration::from_secs(60);
/// A replica that stepped down stays out of the election a whole lease
/// (5 s). Step-downs closer together than this would leave fewer
/// standbys competing, a pace no operator keeps.
const SIT_OUT: Duration = Duration::from_secs(6);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drill {
    Kill,
    StepDown,
    Stop,
}

impl Drill {
    pub fn name(self) -> &'static str {
        match self {
            Drill::Kill => "kill -9",
            Drill::StepDown => "step-down",
            Drill::Stop => "SIGSTOP",
        }
    }
}

/// One trial: the takeover (or why none was seen), and whether the
/// cluster and the fleet came back afterwards.
pub struct Trial {
    pub takeover: Result<Takeover>,
    pub back: bool,
}

pub struct Bench {
    pub cluster: Cluster,
    pub fleet: SimFleet,
    pub observer: Observer,
    last_step_down: Option<Instant>,
}

impl Bench {
    pub fn new(cluster: Cluster, fleet: SimFleet, observer: Observer) -> Bench {
        Bench {
            cluster,
            fleet,
            observer,
            last_step_down: None,
        }
    }

    pub async fn trial(&mut self, drill: Drill) -> Result<Trial> {
        if drill == Drill::StepDown {
            let since = self.last_step_down.map_or(SIT_OUT, |t| t.elapsed());
            tokio::time::sleep(SIT_OUT.saturating_sub(since)).await;
        }
        let (old, i, incarnation) = self.before().await?;
        let takeover = match drill {
            Drill::Kill => self.kill(&old, i).await,
            Drill::StepDown => self.step_down(&old, i).await,
            Drill::Stop => self.stop(&old, i).await,
        };
        self.undo(drill, i)?;
        // A killed leader is back once it runs again, as a new incarnation.
        let id = self.cluster.replicas[i].id.clone();
        let restarted = move |s: &ClusterStatus| {
            let me = s.replicas.iter().find(|r| r.id == id);
            drill != Drill::Kill || me.is_some_and(|r| r.incarnation > incarnation)
        };
        let back = self.back(restarted).await;
        Ok(Trial { takeover, back })
    }

    /// Waits for a settled cluster (and fleet, as far as it can come
    /// back); the standing term, the leader's index and incarnation.
    async fn before(&self) -> Result<(Term, usize, u64)> {
        let n = self.cluster.replicas.len();
        let ok = |s: &ClusterStatus| settled(s, n);
        self.cluster
            .wait("a settled cluster", BACK_BOUND, ok)
            .await?;
        self.fleet_back().await;
        let term = self.observer.term().await?;
        let i = self.cluster.index_of(&term.leader)?;
        let status = self.cluster.status().await?;
        let me = status.replicas.iter().find(|r| r.id == term.leader);
        Ok((term, i, me.map_or(0, |r| r.incarnation)))
    }

    /// kill -9 of the leader (reaped afterwards: waiting for the kernel
    /// to tear the process down would delay the first observation).
    async fn kill(&mut self, old: &Term, i: usize) -> Result<Takeover> {
        let t0 = Instant::now();
        self.cluster.replicas[i].proc.signal(Signal::KILL)?;
        self.observer.takeover(old, t0, TAKEOVER_BOUND).await
    }

    /// A step-down asked of the leader itself, on a channel opened before
    /// the clock starts (what is timed is the handover, not a connect).
    async fn step_down(&mut self, old: &Term, i: usize) -> Result<Takeover> {
        let mut admin = self.cluster.replicas[i].admin().await?;
        let t0 = Instant::now();
        // The reply comes once the lock is released: poll meanwhile.
        let call = tokio::spawn(async move { admin.step_down(StepDownRequest {}).await });
        let took = self.observer.takeover(old, t0, TAKEOVER_BOUND).await;
        call.await??;
        self.last_step_down = Some(Instant::now());
        took
    }

    /// SIGSTOP of the leader: a frozen process whose kernel still answers.
    async fn stop(&mut self, old: &Term, i: usize) -> Result<Takeover> {
        let t0 = Instant::now();
        self.cluster.replicas[i].proc.signal(Signal::STOP)?;
        self.observer.takeover(old, t0, TAKEOVER_BOUND).await
    }

    /// Undoes a drill, whether or not a takeover was seen: restarts a
    /// killed replica (same id and ports, as a supervisor would), continues
    /// a stopped one (it must notice and rejoin as a standby).
    fn undo(&mut self, drill: Drill, i: usize) -> Result<()> {
        let r = &mut self.cluster.replicas[i];
        match drill {
            // Starting blocks until the ports listen: off the fleet's workers.
            Drill::Kill => tokio::task::block_in_place(|| r.proc.reap().and_then(|()| r.start())),
            Drill::Stop => r.proc.signal(Signal::CONT),
            Drill::StepDown => Ok(()),
        }
    }

    /// Whether, within [`BACK_BOUND`], every replica is alive and serving
    /// with one leader (and `also` holds), and every node is registered
    /// with none lost.
    async fn back<F: Fn(&ClusterStatus) -> bool>(&self, also: F) -> bool {
        let n = self.cluster.replicas.len();
        let ok = |s: &ClusterStatus| settled(s, n) && also(s);
        if let Err(e) = self.cluster.wait("a settled cluster", BACK_BOUND, ok).await {
            println!("  NOT BACK: {e:#}");
            return false;
        }
        self.fleet_back().await
    }

    /// Whether every node registers again within [`BACK_BOUND`] (a lost
    /// node never does: it is not waited for).
    async fn fleet_back(&self) -> bool {
        let (fleet, nodes) = (&self.fleet, self.fleet.nodes().len());
        let deadline = Instant::now() + BACK_BOUND;
        while fleet.registered_count() + fleet.lost_count() < nodes && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (registered, lost) = (fleet.registered_count(), fleet.lost());
        if registered < nodes || !lost.is_empty() {
            println!("  FLEET NOT BACK: {registered} of {nodes} registered, lost {lost:?}");
            return false;
        }
        true
    }
}
