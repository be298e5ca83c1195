//! What the fleet holds, and watching it until it is converged. No API is
//! asked: a control plane that reports Applied without getting the state
//! onto the nodes has not converged.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use slim_cp::proto::sb::{ConnectionDirection, ConnectionType};
use slim_cp::sim::{Change, SimFleet};

use crate::args::Size;

/// Shortest pause between two inspections of the fleet. The pause grows
/// with the inspection's cost (`IDLE_PER_BUSY` times it) so that watching
/// takes at most a twentieth of a core from the fleet and the control
/// plane under test. Convergence is dated by the fleet's own record of
/// its changes, so inspecting seldom costs the measurement nothing.
const MIN_POLL: Duration = Duration::from_millis(25);
const IDLE_PER_BUSY: u32 = 19;
/// How often progress (the counts over time) is printed while waiting.
const PROGRESS: Duration = Duration::from_secs(10);
/// After convergence the state must stay converged this long (a control
/// plane that converges and then churns links is not done).
pub const SETTLE: Duration = Duration::from_secs(3);

/// What the fleet holds at one instant.
#[derive(Debug, Default, Clone)]
pub struct Counts {
    /// Distinct link ids of outgoing remote connections.
    pub out: usize,
    /// Of those, ones also held as incoming by a node of another group.
    pub live: usize,
    /// Distinct group pairs the live links join.
    pub pairs: usize,
    /// Routes (node, link) held for the announced names.
    pub routes: usize,
    /// Names with exactly one route at each non-root group's gateway.
    pub names_done: usize,
    /// Names with at least one route (on a live link) in every non-root
    /// group, duplicates allowed: what "reachable" needs, not "converged".
    pub names_covered: usize,
    pub registered: usize,
    pub lost: usize,
}

impl Counts {
    pub fn converged(&self, s: Size) -> bool {
        // Every node registered too: links and routes among the groups
        // can be complete while some nodes still wait to register.
        let p = s.pairs();
        self.registered == s.nodes
            && self.out == p
            && self.live == p
            && self.pairs == p
            && self.names_done == s.names
    }

    /// Every pair linked and every name reachable, extra links and routes
    /// allowed (a looser bar, for control planes that leave duplicates).
    pub fn covered(&self, s: Size) -> bool {
        self.registered == s.nodes && self.pairs == s.pairs() && self.names_covered == s.names
    }
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = self;
        write!(f, "registered {}, lost {}; ", c.registered, c.lost)?;
        write!(f, "links out {} live {} pairs {}; ", c.out, c.live, c.pairs)?;
        write!(f, "routes {}, names done {}", c.routes, c.names_done)?;
        write!(f, " (covered {})", c.names_covered)
    }
}

/// Remote connections by link id (outgoing: its group; incoming: the
/// groups holding it), and per name the (group, link) of each route.
#[derive(Default)]
struct Held {
    out: HashMap<String, String>,
    inc: HashMap<String, Vec<String>>,
    routes: HashMap<String, Vec<(String, String)>>,
}

/// Reads every node's tables; adds every link id seen to `seen`.
fn collect(fleet: &SimFleet, seen: &mut HashSet<String>) -> Held {
    let mut h = Held::default();
    for node in fleet.nodes() {
        let group = node.spec().group.clone().unwrap_or_default();
        for c in node.connections() {
            let remote = c.conn_type == ConnectionType::Remote;
            let Some(link) = c.link_id.filter(|_| remote) else {
                continue;
            };
            seen.insert(link.clone());
            if c.direction == ConnectionDirection::Outgoing {
                h.out.insert(link, group.clone());
            } else {
                h.inc.entry(link).or_default().push(group.clone());
            }
        }
        for r in node.routes() {
            let [_, _, name] = r.name;
            if let Some(link) = r.link_id {
                h.routes
                    .entry(name)
                    .or_default()
                    .push((group.clone(), link));
            }
        }
    }
    h
}

/// Inspects every node's tables; adds every link id seen to `seen`.
pub fn observe(fleet: &SimFleet, s: Size, seen: &mut HashSet<String>) -> Counts {
    let h = collect(fleet, seen);
    let mut live = HashSet::new();
    let mut pairs = BTreeSet::new();
    for (link, a) in &h.out {
        if let Some(b) = h.inc.get(link).and_then(|gs| gs.iter().find(|b| *b != a)) {
            live.insert(link.as_str());
            pairs.insert(if a < b { (a, b) } else { (b, a) });
        }
    }
    let mut c = Counts::default();
    for k in 0..s.names {
        let root = format!("g{}", k % s.groups);
        let held = h
            .routes
            .get(&format!("name{k}"))
            .map_or(&[][..], Vec::as_slice);
        let groups: HashSet<&String> = held.iter().map(|(g, _)| g).collect();
        c.routes += held.len();
        let on_live = held.iter().all(|(_, l)| live.contains(l.as_str()));
        let reached = held
            .iter()
            .filter(|(g, l)| *g != root && live.contains(l.as_str()));
        let reached: HashSet<&String> = reached.map(|(g, _)| g).collect();
        c.names_covered += usize::from(reached.len() == s.groups - 1);
        let one_per_group = groups.len() == s.groups - 1 && !groups.contains(&root);
        c.names_done += usize::from(held.len() == s.groups - 1 && one_per_group && on_live);
    }
    (c.registered, c.lost) = (fleet.registered_count(), fleet.lost_count());
    (c.out, c.live, c.pairs) = (h.out.len(), live.len(), pairs.len());
    c
}

/// Up to `limit` names without one route per non-root group, each with
/// the groups holding one for it: what a stuck control plane left undone.
pub fn unfinished(fleet: &SimFleet, s: Size, limit: usize) -> Vec<String> {
    let h = collect(fleet, &mut HashSet::new());
    let mut out = Vec::new();
    for k in 0..s.names {
        let held = h
            .routes
            .get(&format!("name{k}"))
            .map_or(&[][..], Vec::as_slice);
        let mut groups: Vec<&str> = held.iter().map(|(g, _)| g.as_str()).collect();
        groups.sort_unstable();
        if held.len() != s.groups - 1 && out.len() < limit {
            let (root, n) = (k % s.groups, held.len());
            out.push(format!(
                "name{k} (announced in g{root}): {n} routes, in {groups:?}"
            ));
        }
    }
    out
}

/// The fleet as watched from its start until converged or `timeout`.
pub struct Watch {
    pub size: Size,
    /// Every link id ever held (more than the pairs: duplicates).
    pub seen: HashSet<String>,
    /// Time to convergence, or None when it did not converge in time.
    pub converged: Option<Duration>,
    /// Time until first covered (see `Counts::covered`).
    pub covered: Option<Duration>,
    pub last: Counts,
    /// The slowest inspection, which paces later ones.
    pub worst: Duration,
}

impl Watch {
    /// Watches `fleet` (started at `t0`) until converged or `timeout`.
    /// Convergence is dated to the fleet's last change before it, not to
    /// the inspection that found it: an inspection costs more, and comes
    /// later, the busier the machine, which would add to the slower
    /// setup's time. A converged state counts once a second inspection
    /// finds that nothing changed after the first; its date is then that
    /// of the last change the first had seen.
    pub async fn run(fleet: &SimFleet, size: Size, t0: Instant, timeout: Duration) -> Watch {
        let mut w = Watch {
            size,
            seen: HashSet::new(),
            converged: None,
            covered: None,
            last: Counts::default(),
            worst: Duration::ZERO,
        };
        let mut next_progress = PROGRESS;
        let mut candidate: Option<Change> = None;
        loop {
            let started = Instant::now();
            let counted = fleet.last_change().count;
            w.last = observe(fleet, size, &mut w.seen);
            let mark = fleet.last_change();
            let (elapsed, cost) = (t0.elapsed(), started.elapsed());
            w.worst = w.worst.max(cost);
            if w.covered.is_none() && w.last.covered(size) {
                w.covered = Some(elapsed);
            }
            if !w.last.converged(size) {
                candidate = None;
            } else if let Some(c) = candidate.filter(|c| c.count == mark.count) {
                let at = c.at.saturating_duration_since(t0);
                w.converged = Some(at);
                w.covered = w.covered.map(|c| c.min(at));
                return w;
            } else {
                candidate = Some(mark);
            }
            let secs = elapsed.as_secs_f64();
            if elapsed >= timeout {
                println!("  DID NOT CONVERGE in {secs:.0} s: {}", w.last);
                for name in unfinished(fleet, size, 5) {
                    println!("    {name}");
                }
                return w;
            }
            if elapsed >= next_progress {
                let cmds = fleet.commands_received();
                println!("  {secs:>6.1} s  {}; cmds {cmds}", w.last);
                next_progress += PROGRESS;
            }
            tokio::time::sleep(MIN_POLL.max(cost * IDLE_PER_BUSY)).await;
            if candidate.is_none() {
                // Nothing new to look at until the fleet changes again
                // (a change during the inspection counts: it may not
                // have been seen).
                let until = t0 + timeout.min(next_progress);
                fleet.changed_after(counted, until.into()).await;
            }
        }
    }

    /// Keeps watching for [`SETTLE`]; whether it stayed converged.
    pub async fn settle(&mut self, fleet: &SimFleet) -> bool {
        let mut stable = true;
        let end = Instant::now() + SETTLE;
        while Instant::now() < end {
            tokio::time::sleep(MIN_POLL.max(self.worst * IDLE_PER_BUSY)).await;
            self.last = observe(fleet, self.size, &mut self.seen);
            stable &= self.last.converged(self.size);
        }
        stable
    }
}
