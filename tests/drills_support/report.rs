//! The one `DRILL` line each real-node drill prints, and the checks that
//! fail it: links lost or duplicated, gateways moved, nodes lost.

use std::time::Duration;

use super::{Across, DURING, Line, MSGS, Settled};

pub struct Report {
    pub drill: &'static str,
    pub line: Line,
    /// From the fault to a new leader of a higher term in the database
    /// (polled every 20 ms), when the drill changes leaders.
    pub new_leader: Option<Duration>,
    /// Until the fleet was settled again (polled), since `since`.
    pub converged: Duration,
    pub since: &'static str,
    /// Messages delivered before the fault, and after reconvergence.
    pub delivered: (u64, u64),
    /// The [`DURING`] messages published across the fault, when measured.
    pub during: Option<Across>,
    pub before: Settled,
    pub after: Settled,
    /// Node processes not running at the end (must be 0).
    pub nodes_lost: usize,
    /// Nodes whose owning replica changed.
    pub moved: usize,
    /// Commands the replicas' epoch gates refused, summed over the
    /// replicas that answer.
    pub fenced: u64,
    /// What the numbers do not say.
    pub note: String,
}

impl Report {
    fn links_lost(&self) -> usize {
        usize::from(self.after.link.id != self.before.link.id)
    }

    pub fn line(&self) -> String {
        let leader = self
            .new_leader
            .map_or("n/a".to_string(), |d| format!("{:.2}s", d.as_secs_f64()));
        let (before, after) = self.delivered;
        let mut line = format!(
            "DRILL {} [slim {}, HAProxy]: new leader acts after {leader}; converged {:.2}s \
             after {}; messages delivered {before}/{MSGS} before the fault and {after}/{MSGS} \
             after reconvergence; {}; link {} kept {} -> {}; links lost {} duplicated 0; \
             nodes lost {} (moved {}); commands refused by fencing {}",
            self.drill,
            self.line.name(),
            self.converged.as_secs_f64(),
            self.since,
            self.during_text(),
            self.after.link.id,
            self.after.link.source,
            self.after.link.dest,
            self.links_lost(),
            self.nodes_lost,
            self.moved,
            self.fenced,
        );
        if !self.note.is_empty() {
            line.push_str("; ");
            line.push_str(&self.note);
        }
        line
    }

    fn during_text(&self) -> String {
        let Some(a) = self.during else {
            return "messages across the fault not measured".to_string();
        };
        let rate = a
            .rate
            .map_or(String::new(), |r| format!(", published at {r} a second"));
        match a.received {
            None => format!("messages across the fault: no count of {DURING}{rate}"),
            Some(n) => format!(
                "messages across the fault {n}/{DURING} ({} lost{rate})",
                DURING.saturating_sub(n)
            ),
        }
    }

    /// Prints the line, then fails the drill if the fleet did not end as
    /// it started: the same link (the settled fleet has exactly one live
    /// link, so none is duplicated; [`super::Stage::assert_same_link`]
    /// checked its gateways before the delivery), every node running,
    /// every message delivered.
    pub fn check(&self) {
        println!("{}", self.line());
        assert_eq!(self.links_lost(), 0, "{}: links lost", self.drill);
        assert_eq!(self.nodes_lost, 0, "{}: nodes lost", self.drill);
        assert_eq!(self.delivered, (MSGS, MSGS), "{}", self.drill);
    }
}

/// Nodes whose owning replica differs between `before` and `after`.
pub fn moved(before: &Settled, after: &Settled) -> usize {
    after
        .owners
        .iter()
        .filter(|(n, o)| before.owners.get(*n) != Some(o))
        .count()
}
