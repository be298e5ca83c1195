//! The one line each drill prints: what an operator asks of a failover.

use std::time::Duration;

use super::watch::{Seen, Tally};

pub struct Report {
    pub drill: &'static str,
    pub network: &'static str,
    /// From the fault to a new leader agreed on by the database and the
    /// replicas (polled every 50 ms), when the drill changes leaders.
    pub new_leader: Option<Duration>,
    /// Until the fleet was exactly converged again, since `since`.
    pub converged: Duration,
    /// What `converged` counts from: "the fault", "the heal".
    pub since: &'static str,
    /// What the drill saw that the numbers do not say.
    pub note: String,
    pub seen: Seen,
    pub nodes_lost: usize,
    /// Commands the replicas' gates refused for a stale epoch.
    pub fenced: u64,
}

impl Report {
    pub fn line(&self) -> String {
        let leader = self
            .new_leader
            .map_or("n/a".to_string(), |d| format!("{:.2}s", d.as_secs_f64()));
        let (end, worst) = (&self.seen.last, &self.seen.worst);
        format!(
            "DRILL {} [{}]: new leader acts after {leader}; converged {:.2}s after {}; \
             links lost {} duplicated {}; routes lost {} duplicated {}; nodes lost {}; \
             commands refused by fencing {}; in flight at worst: links lost {} \
             duplicated {}, routes lost {} duplicated {} ({} samples){}",
            self.drill,
            self.network,
            self.converged.as_secs_f64(),
            self.since,
            end.links_lost,
            end.links_duplicated,
            end.routes_lost,
            end.routes_duplicated,
            self.nodes_lost,
            self.fenced,
            worst.links_lost,
            worst.links_duplicated,
            worst.routes_lost,
            worst.routes_duplicated,
            self.seen.samples,
            if self.note.is_empty() {
                String::new()
            } else {
                format!("; {}", self.note)
            }
        )
    }

    /// Prints the line (and what changed when), then fails the drill if
    /// the fleet did not end with everything it started with, once.
    pub fn check(&self) {
        println!("{}", self.line());
        eprintln!("{}\n  changes: {:?}", self.line(), self.seen.events);
        assert_eq!(self.seen.last, Tally::default(), "{}", self.drill);
        assert_eq!(self.nodes_lost, 0, "{}", self.drill);
    }
}
