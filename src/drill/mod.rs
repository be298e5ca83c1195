//! `slim-cp drill`: a failover drill an operator points at a running
//! cluster. It reads the fleet from the shared database, waits until it
//! is settled, performs one fault (through the operator's own command, or
//! built in for a step-down), and reports how long the cluster took to
//! commit a new leader's term and to converge again, what was lost or
//! duplicated, and what fencing refused.
//!
//! - [`view`]: what "converged", "lost" and "duplicated" mean (pure);
//! - [`snapshot`]: reading the database and the admin API;
//! - [`fault`]: the operator's command templates;
//! - [`run`]: the drill's steps; [`report`]: its table and JSON.

pub mod fault;
pub mod report;
pub mod run;
pub mod snapshot;
pub mod view;

use std::time::Duration;

pub use fault::{Target, Template};
pub use report::Report;
pub use run::drill;

/// The faults a drill performs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The leader's process killed (`--fault-cmd`, e.g. `kill -9 {pid}`).
    KillLeader,
    /// A follower's process killed: `--replica`, else the one holding the
    /// most sessions.
    KillFollower,
    /// The leader frozen (`--fault-cmd`, e.g. `kill -STOP {pid}`) until a
    /// new term is committed, then thawed (`--resume-cmd`).
    StopLeader,
    /// A graceful handover through the admin API; no command.
    StepDown,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::KillLeader => "kill-leader",
            Kind::KillFollower => "kill-follower",
            Kind::StopLeader => "stop-leader",
            Kind::StepDown => "step-down",
        }
    }

    /// Whether the fault ends the leader's term.
    pub fn deposes(self) -> bool {
        self != Kind::KillFollower
    }

    /// Whether the target's process is gone after the fault.
    fn kills(self) -> bool {
        matches!(self, Kind::KillLeader | Kind::KillFollower)
    }
}

/// What the operator asked for.
#[derive(Debug, Clone)]
pub struct Options {
    pub kind: Kind,
    /// Any replica's northbound address (or the load balancer's).
    pub server: String,
    pub fault: Option<Template>,
    pub resume: Option<Template>,
    /// The follower to kill (`kill-follower` only).
    pub replica: Option<String>,
    /// How long the cluster has to converge after the fault.
    pub within: Duration,
    /// How long to wait for a settled fleet before the fault.
    pub settle: Duration,
    /// How often the database is read while waiting.
    pub poll: Duration,
}

impl Options {
    /// Refuses combinations that make no drill.
    pub fn check(&self) -> Result<(), DrillError> {
        let name = self.kind.name();
        let bad = |why: &str| Err(DrillError::Input(format!("drill {name}: {why}")));
        match self.kind {
            Kind::StepDown if self.fault.is_some() || self.resume.is_some() => {
                return bad("a step-down is built in: give no --fault-cmd or --resume-cmd");
            }
            Kind::KillLeader | Kind::KillFollower | Kind::StopLeader if self.fault.is_none() => {
                return bad(
                    "needs --fault-cmd, the command that performs the fault on the target \
                     (e.g. 'kill -9 {pid}' or 'docker compose kill -s KILL {replica}')",
                );
            }
            Kind::StopLeader if self.resume.is_none() => {
                return bad("needs --resume-cmd, which thaws the leader (e.g. 'kill -CONT {pid}')");
            }
            Kind::KillLeader | Kind::KillFollower if self.resume.is_some() => {
                return bad("--resume-cmd is for stop-leader only");
            }
            _ => {}
        }
        if self.replica.is_some() && self.kind != Kind::KillFollower {
            return bad(
                "--replica chooses the follower of kill-follower; the others target the leader",
            );
        }
        if self.within.is_zero() || self.poll.is_zero() {
            return bad("--within and the poll interval must be above zero");
        }
        Ok(())
    }
}

/// Why a drill could not be run (a drill that ran and found losses is a
/// [`Report`], not an error).
#[derive(Debug, thiserror::Error)]
pub enum DrillError {
    #[error("{0}")]
    Input(String),
    #[error("reading the database: {0}")]
    Database(String),
    #[error("the admin API: {0}")]
    Admin(String),
    #[error(
        "the fleet did not settle within {1:?} ({0}); nothing was done: \
         a drill from a fleet still converging measures nothing"
    )]
    Unsettled(String, Duration),
    #[error("no target: {0}")]
    NoTarget(String),
    #[error("the fault command: {0}")]
    Fault(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_options(kind: Kind) -> Options {
        let t = |s: &str| Template::parse("--fault-cmd", s).ok();
        Options {
            kind,
            server: "127.0.0.1:50051".into(),
            fault: t("kill -9 {pid}"),
            resume: None,
            replica: None,
            within: Duration::from_secs(60),
            settle: Duration::from_secs(30),
            poll: Duration::from_millis(100),
        }
    }

    #[test]
    fn each_kind_takes_the_commands_it_needs_and_no_others() {
        assert!(mk_options(Kind::KillLeader).check().is_ok());
        assert!(mk_options(Kind::StepDown).check().is_err());
        assert!(mk_options(Kind::StopLeader).check().is_err());
        let mut o = mk_options(Kind::KillFollower);
        o.fault = None;
        assert!(o.check().is_err());
        let mut o = mk_options(Kind::StepDown);
        o.fault = None;
        assert!(o.check().is_ok());
        o.replica = Some("cp-1".into());
        assert!(o.check().is_err());
    }
}
