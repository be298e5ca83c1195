//! What the fleet holds, sampled all through a drill: a failover that
//! converges in the end may still have dropped a link or a route on the
//! way, and that is what an operator's traffic feels. The baseline is the
//! converged state before the drill; a baseline link (held by both ends)
//! or route missing from any sample counts as lost, a group pair held
//! over two links or a name routed twice from one node as duplicated.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use slim_cp::proto::sb::ConnectionDirection;
use slim_cp::sim::SimFleet;
use tokio::sync::watch;
use tokio::task::JoinHandle;

const EVERY: Duration = Duration::from_millis(50);

/// Shortfalls and excess against the baseline at one moment: group pairs
/// not linked (held at both ends), pairs linked twice, (group, name)
/// routes the baseline had and no node of the group holds, and routes
/// held twice in one group.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub links_lost: usize,
    pub links_duplicated: usize,
    pub routes_lost: usize,
    pub routes_duplicated: usize,
}

impl Tally {
    fn worst(self, o: Tally) -> Tally {
        Tally {
            links_lost: self.links_lost.max(o.links_lost),
            links_duplicated: self.links_duplicated.max(o.links_duplicated),
            routes_lost: self.routes_lost.max(o.routes_lost),
            routes_duplicated: self.routes_duplicated.max(o.routes_duplicated),
        }
    }
}

#[derive(Debug, Default, Clone)]
pub struct Seen {
    /// The worst moment of the drill.
    pub worst: Tally,
    /// The last sample, taken when the watch finished.
    pub last: Tally,
    pub samples: u64,
    /// The first changes seen, with the time since the watch started, to
    /// line up with the replicas' logs.
    pub events: Vec<String>,
}

impl Seen {
    fn event(&mut self, since: std::time::Instant, what: String) {
        if self.events.len() < 20 {
            let at = since.elapsed().as_secs_f64();
            self.events.push(format!("{at:.2}s {what}"));
        }
    }
}

pub struct Watch {
    stop: watch::Sender<bool>,
    /// The latest sample's tally.
    pub latest: watch::Receiver<Tally>,
    task: JoinHandle<Seen>,
}

/// What the fleet holds now: per group pair the links held at both ends,
/// and per (group, name) the routes its nodes hold, as (node, link).
struct Held {
    pairs: BTreeMap<(String, String), BTreeSet<String>>,
    routes: BTreeMap<(String, String), BTreeSet<(String, String)>>,
}

fn group_of(node: &str) -> String {
    node.split('/').next().unwrap_or(node).to_string()
}

fn held(fleet: &SimFleet) -> Held {
    // Per link: the node holding its outgoing end, and the incoming one.
    let mut ends: BTreeMap<String, (Option<String>, Option<String>)> = BTreeMap::new();
    let mut routes: BTreeMap<(String, String), BTreeSet<(String, String)>> = BTreeMap::new();
    for n in fleet.nodes() {
        let me = n.effective_id().to_string();
        for c in n.connections() {
            let Some(link) = c.link_id.clone() else {
                continue;
            };
            let e = ends.entry(link).or_default();
            match c.direction {
                ConnectionDirection::Outgoing => e.0 = Some(me.clone()),
                ConnectionDirection::Incoming => e.1 = Some(me.clone()),
            }
        }
        // Routes over a link; a node's own subscriptions are not routes.
        for r in n.routes() {
            let Some(link) = r.link_id else {
                continue;
            };
            let key = (group_of(&me), r.name[2].clone());
            routes.entry(key).or_default().insert((me.clone(), link));
        }
    }
    let mut pairs: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for (link, (out, inc)) in ends {
        let (Some(out), Some(inc)) = (out, inc) else {
            continue;
        };
        let (a, b) = (group_of(&out), group_of(&inc));
        let key = if a <= b { (a, b) } else { (b, a) };
        pairs.entry(key).or_default().insert(link);
    }
    Held { pairs, routes }
}

impl Watch {
    /// Takes the baseline now and samples until [`Watch::finish`].
    pub fn start(fleet: Arc<SimFleet>) -> Watch {
        let (stop, mut stopped) = watch::channel(false);
        let (publish, latest) = watch::channel(Tally::default());
        let base = held(&fleet);
        let task = tokio::spawn(async move {
            let mut seen = Seen::default();
            let since = std::time::Instant::now();
            loop {
                record(&base, &held(&fleet), &mut seen, since);
                publish.send_replace(seen.last);
                tokio::select! {
                    _ = stopped.changed() => return seen,
                    () = tokio::time::sleep(EVERY) => {}
                }
            }
        });
        Watch { stop, latest, task }
    }

    /// Stops sampling (after one last sample) and says what was seen.
    pub async fn finish(self) -> Seen {
        let _ = self.stop.send(true);
        self.task.await.expect("the watch ran")
    }
}

fn tally(base: &Held, now: &Held) -> Tally {
    let mut t = Tally::default();
    for pair in base.pairs.keys() {
        t.links_lost += usize::from(!now.pairs.contains_key(pair));
    }
    for key in base.routes.keys() {
        t.routes_lost += usize::from(!now.routes.contains_key(key));
    }
    t.links_duplicated = now.pairs.values().map(|l| l.len().saturating_sub(1)).sum();
    t.routes_duplicated = now.routes.values().map(|r| r.len().saturating_sub(1)).sum();
    t
}

fn record(base: &Held, now: &Held, seen: &mut Seen, since: std::time::Instant) {
    seen.samples += 1;
    let t = tally(base, now);
    if t != seen.last {
        let gone: Vec<_> = base
            .routes
            .iter()
            .filter(|(k, _)| !now.routes.contains_key(*k))
            .collect();
        seen.event(since, format!("{t:?}; routes gone: {gone:?}"));
    }
    seen.last = t;
    seen.worst = seen.worst.worst(t);
}
