//! A drill's findings: a table for the operator, JSON for scripts.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::view::{Verdict, View};

/// The fleet at one moment, counted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub epoch: u64,
    pub leader: Option<String>,
    pub nodes_ready: usize,
    pub links: usize,
    pub routes: usize,
}

impl From<&View> for Counts {
    fn from(v: &View) -> Counts {
        Counts {
            epoch: v.epoch,
            leader: v.leader.as_ref().map(|l| l.id.clone()),
            nodes_ready: v.nodes.values().filter(|n| n.ready).count(),
            links: v.links.len(),
            routes: v.routes.len(),
        }
    }
}

/// What fencing refused during the drill, over the replicas that answered
/// before and after (a killed process's counters die with it; it refused
/// nothing after its death).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Fencing {
    /// Leader writes the database refused for a stale epoch.
    pub writes: u64,
    /// Commands a node's epoch gate refused.
    pub commands: u64,
}

impl Fencing {
    /// The counters' growth per replica (process id, writes, commands); a
    /// replica whose process changed counts from zero.
    pub fn between(
        before: &BTreeMap<String, (u32, u64, u64)>,
        after: &BTreeMap<String, (u32, u64, u64)>,
    ) -> Fencing {
        let mut f = Fencing::default();
        for (id, (pid, writes, commands)) in after {
            let (w0, c0) = match before.get(id) {
                Some((p, w, c)) if p == pid => (*w, *c),
                _ => (0, 0),
            };
            f.writes += writes.saturating_sub(w0);
            f.commands += commands.saturating_sub(c0);
        }
        f
    }
}

/// One drill, as run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub kind: &'static str,
    pub target: String,
    pub target_incarnation: u64,
    pub fault_cmd: Option<String>,
    pub resume_cmd: Option<String>,
    pub before: Counts,
    pub after: Counts,
    /// Seconds from the fault until a new term was committed.
    pub new_term_after: Option<f64>,
    /// Seconds from the fault until the fleet converged again.
    pub converged_after: Option<f64>,
    pub within: f64,
    /// `None` when no replica's admin API answered after the drill.
    pub fencing: Option<Fencing>,
    #[serde(flatten)]
    pub verdict: Verdict,
}

impl Report {
    /// Converged in time, nothing lost, nothing duplicated.
    pub fn passed(&self) -> bool {
        self.verdict.converged && self.verdict.intact()
    }

    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(map) = v.as_object_mut() {
            map.insert("passed".into(), self.passed().into());
        }
        v
    }

    /// The table for a terminal.
    pub fn render(&self) -> String {
        let mut out = format!("drill {}: replica {}", self.kind, self.target);
        let _ = write!(out, " (incarnation {})", self.target_incarnation);
        if let Some(cmd) = &self.fault_cmd {
            let _ = write!(out, ", `{cmd}`");
        }
        out.push('\n');
        let (b, a) = (&self.before, &self.after);
        let none = || "none".to_string();
        let rows = [
            ("", "BEFORE".to_string(), "AFTER".to_string()),
            ("epoch", b.epoch.to_string(), a.epoch.to_string()),
            (
                "leader",
                b.leader.clone().unwrap_or_else(none),
                a.leader.clone().unwrap_or_else(none),
            ),
            (
                "nodes ready",
                b.nodes_ready.to_string(),
                a.nodes_ready.to_string(),
            ),
            ("links", b.links.to_string(), a.links.to_string()),
            ("routes", b.routes.to_string(), a.routes.to_string()),
        ];
        for (what, x, y) in rows {
            let _ = writeln!(out, "  {what:<30} {x:>12} {y:>12}");
        }
        for (what, value) in self.findings() {
            let _ = writeln!(out, "  {what:<30} {value}");
        }
        out
    }

    fn findings(&self) -> Vec<(&'static str, String)> {
        let v = &self.verdict;
        let secs = |s: Option<f64>, none: &str| s.map_or(none.to_string(), |s| format!("{s:.3} s"));
        let fenced = |f: fn(&Fencing) -> u64| {
            self.fencing
                .as_ref()
                .map_or("?".into(), |x| f(x).to_string())
        };
        let converged = match self.converged_after {
            Some(s) => format!("{s:.3} s after the fault"),
            None => format!("not within {} s: {}", self.within, v.pending.join("; ")),
        };
        vec![
            ("new term committed", secs(self.new_term_after, "-")),
            ("converged", converged),
            ("nodes lost", v.nodes_lost.len().to_string()),
            (
                "links lost / duplicated",
                format!(
                    "{} / {} ({} replaced)",
                    v.links_lost, v.links_duplicated, v.links_replaced
                ),
            ),
            (
                "routes lost / duplicated",
                format!("{} / {}", v.routes_lost, v.routes_duplicated),
            ),
            ("writes refused by fencing", fenced(|f| f.writes)),
            ("commands refused by fencing", fenced(|f| f.commands)),
            ("result", if self.passed() { "PASS" } else { "FAIL" }.into()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_report(converged_after: Option<f64>) -> Report {
        let counts = Counts {
            epoch: 3,
            leader: Some("cp-0".into()),
            nodes_ready: 12,
            links: 6,
            routes: 3,
        };
        Report {
            kind: "kill-leader",
            target: "cp-0".into(),
            target_incarnation: 1,
            fault_cmd: Some("kill -9 42".into()),
            resume_cmd: None,
            before: counts.clone(),
            after: Counts { epoch: 4, ..counts },
            new_term_after: Some(0.05),
            converged_after,
            within: 60.0,
            fencing: Some(Fencing::default()),
            verdict: Verdict {
                converged: converged_after.is_some(),
                pending: vec!["2 links not applied under current sessions".into()],
                ..Verdict::default()
            },
        }
    }

    #[test]
    fn the_table_says_what_an_operator_asks() {
        let table = mk_report(Some(0.2)).render();
        for said in [
            "`kill -9 42`",
            "new term committed",
            "0.050 s",
            "0.200 s after the fault",
            "PASS",
        ] {
            assert!(table.contains(said), "{said:?} in\n{table}");
        }
        let table = mk_report(None).render();
        assert!(
            table.contains("not within 60 s: 2 links not applied"),
            "{table}"
        );
        assert!(table.contains("FAIL"), "{table}");
        assert_eq!(mk_report(None).to_json()["passed"], false);
    }

    #[test]
    fn fencing_counts_growth_and_a_new_process_from_zero() {
        let before = BTreeMap::from([("a".to_string(), (10, 2, 1)), ("b".to_string(), (20, 5, 0))]);
        let after = BTreeMap::from([("a".to_string(), (10, 3, 1)), ("b".to_string(), (21, 1, 2))]);
        assert_eq!(
            Fencing::between(&before, &after),
            Fencing {
                writes: 2,
                commands: 2
            }
        );
    }
}
