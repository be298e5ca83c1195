//! Route expansion over shortest-path trees.
//!
//! For each announced name and each routing domain holding its announcers,
//! one tree is rooted at the group of the oldest announcement. Every other
//! group of the tree gets an upward route (on its gateway, over the link
//! towards its parent); each later announcer gets downward routes on every
//! group from the root down to it. Trees follow the topology graph (unit
//! weights, neighbours visited in name order, so ties break the same way on
//! any leader: see [`SegmentGraph::shortest_path_tree`]); a route appears once the link of its tree edge is live and
//! claimed by a gateway on each side.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;

use super::fleet::Fleet;
use super::stored::StoredRoutes;
use super::templates::Announcements;
use super::topology::SegmentGraph;
use super::trees::{Tree, Trees};
use super::{FastMap, FastSet};
use crate::store::model::{Link, Name, NodeRecord, Route, RouteStatus, Template, edge_ref};

/// An established link seen from both groups: who is the gateway on each side.
struct Realized<'a> {
    link: &'a Link,
    gateways: [(&'a str, &'a str); 2],
}

impl<'a> Realized<'a> {
    fn gateway_in(&self, group: &str) -> Option<&'a str> {
        self.gateways
            .iter()
            .find(|(g, _)| *g == group)
            .map(|(_, n)| *n)
    }
}

/// Links with a gateway at both ends: live and claimed at least once by
/// their destination. The status does not matter: a claimed link whose end
/// registered again is Connecting (or Failed) until it is claimed again,
/// and dropping its routes meanwhile would delete and re-add them on every
/// reconnect.
fn realized<L: Borrow<Link>>(links: &[L]) -> FastMap<(&str, &str), Realized<'_>> {
    links
        .iter()
        .map(Borrow::borrow)
        .filter(|l| !l.deleted)
        .filter_map(|l| {
            let dest = l.dest_node.as_deref()?;
            let gateways = [
                (l.source_group.as_str(), l.source_node.as_str()),
                (l.dest_group.as_str(), dest),
            ];
            Some((
                edge_ref(&l.source_group, &l.dest_group),
                Realized { link: l, gateways },
            ))
        })
        .collect()
}

/// The route id: one route per (source node, link, name), whoever asks.
pub fn route_id(source: &str, link_id: &str, name: &Name) -> String {
    let mut id = String::new();
    write_route_id(&mut id, source, link_id, name);
    id
}

/// Appends [`route_id`] to `out`, so a derivation can look a route up
/// without allocating its id. Pieces pushed rather than formatted: a
/// derivation writes thousands.
fn write_route_id(out: &mut String, source: &str, link_id: &str, name: &Name) {
    let [c0, c1, c2] = &name.components;
    for piece in [source, "|", link_id, "|", c0, "/", c1, "/", c2, "/"] {
        out.push_str(piece);
    }
    match name.id {
        Some(i) => {
            let _ = write!(out, "{i}");
        }
        None => out.push('-'),
    }
}

/// One derived route: on `gateway`, over `link`, towards `announcer`.
#[derive(Clone, Copy)]
struct Found<'a> {
    gateway: &'a str,
    link: &'a Link,
    announcer: &'a str,
}

impl Found<'_> {
    fn to_route(self, id: String, name: &Name, now: i64) -> Route {
        Route {
            id,
            source_node: self.gateway.to_string(),
            dest_node: self.announcer.to_string(),
            link_id: self.link.link_id.clone(),
            name: name.clone(),
            status: RouteStatus::Pending,
            status_msg: String::new(),
            updated_at: now,
        }
    }
}

/// Only what differs from the stored routes, name by name. A derivation
/// finds every route of the names it looks at, nearly all of them stored
/// already: those cost a lookup, not a route.
struct Compare<'s> {
    stored: &'s StoredRoutes,
    new: BTreeMap<String, Route>,
    gone: Vec<(String, String)>,
    id: String,
    now: i64,
}

impl Compare<'_> {
    /// Compares the routes found for `name` with its stored ones: the
    /// first find of an id is the one kept.
    fn name(&mut self, name: &Name, finds: &[Found<'_>]) {
        let stored = self.stored;
        let mut kept: FastSet<&str> = FastSet::default();
        for f in finds {
            self.id.clear();
            write_route_id(&mut self.id, f.gateway, &f.link.link_id, name);
            if let Some(id) = stored.has(name, &self.id) {
                kept.insert(id);
            } else if !self.new.contains_key(self.id.as_str()) {
                let id = self.id.clone();
                self.new.insert(id.clone(), f.to_route(id, name, self.now));
            }
        }
        for id in stored.ids_of(name).filter(|id| !kept.contains(id)) {
            let source = stored.source_of(id).unwrap_or_default();
            self.gone.push((id.to_string(), source.to_string()));
        }
    }
}

/// How the desired routes differ from the stored ones.
#[derive(Debug, Default, PartialEq)]
pub struct RouteChanges {
    /// Routes to add, by id.
    pub put: Vec<Route>,
    /// `(id, source node)` of stored routes no longer desired, by id.
    pub gone: Vec<(String, String)>,
}

/// Which names an expansion looks at; the routes of the others stay as
/// they are stored.
#[derive(Debug, Clone, Copy)]
pub enum NameScope<'a> {
    All,
    Some(&'a BTreeSet<Name>),
}

/// What routes are expanded from.
#[derive(Clone, Copy)]
pub struct RouteFacts<'a> {
    pub fleet: &'a Fleet,
    /// The groups whose nodes hold links (see [`Fleet::active_groups`]): a
    /// group whose nodes are only reconnecting keeps its routes.
    pub active: &'a BTreeSet<String>,
    pub announcements: &'a Announcements,
    /// Whether an announcement of the node, from the session of that
    /// generation, counts (see [`super::templates::counts`]).
    pub counts: &'a dyn Fn(&NodeRecord, u64) -> bool,
    pub graphs: &'a [SegmentGraph],
    /// The trees grown on these graphs and active groups so far.
    pub trees: &'a Trees,
}

/// One derivation's route expansion: the live links seen from both ends,
/// and, per tree, its upward routes' gateways and links.
pub struct Router<'a, L> {
    facts: RouteFacts<'a>,
    links: &'a [L],
    /// Seen when a name's routes are first looked for.
    realized: Option<FastMap<(&'a str, &'a str), Realized<'a>>>,
    /// Per tree, its edges that have a live link: every name rooted there
    /// has a route on each.
    upward: FastMap<(usize, &'a str), Vec<(&'a str, &'a Link)>>,
}

impl<'a, L: Borrow<Link>> Router<'a, L> {
    pub fn new(facts: RouteFacts<'a>, links: &'a [L]) -> Self {
        Router {
            facts,
            links,
            realized: None,
            upward: FastMap::default(),
        }
    }

    /// How the routes of the names in `scope` differ from `stored`.
    pub fn changes(
        &mut self,
        stored: &StoredRoutes,
        scope: NameScope<'_>,
        now: i64,
    ) -> RouteChanges {
        let mut sink = Compare {
            stored,
            new: BTreeMap::new(),
            gone: Vec::new(),
            id: String::new(),
            now,
        };
        let every: BTreeSet<&Name>;
        let names: Box<dyn Iterator<Item = &Name>> = match scope {
            NameScope::All => {
                every = self
                    .facts
                    .announcements
                    .names()
                    .chain(stored.names())
                    .collect();
                Box::new(every.into_iter())
            }
            NameScope::Some(names) => Box::new(names.iter()),
        };
        for name in names {
            let finds = self.routes_of(name);
            sink.name(name, &finds);
        }
        sink.gone.sort();
        RouteChanges {
            put: sink.new.into_values().collect(),
            gone: sink.gone,
        }
    }

    /// The names whose trees cross one of `edges` (`(a, b)`, `a < b`):
    /// their routes ride those links.
    pub fn names_over(&mut self, edges: &BTreeSet<(String, String)>) -> BTreeSet<Name> {
        let mut out = BTreeSet::new();
        if edges.is_empty() {
            return out;
        }
        let edges: FastSet<(&str, &str)> = edges
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        // Judged once per tree: many names share a root.
        let mut crossing: FastMap<(usize, &'a str), bool> = FastMap::default();
        for name in self.facts.announcements.names() {
            let announcers = self.announcers(name);
            for i in 0..self.facts.graphs.len() {
                let Some(root) = self.root_in(i, &announcers) else {
                    continue;
                };
                let crosses = *crossing.entry((i, root)).or_insert_with(|| {
                    let tree = self.tree(i, root);
                    let on = |(child, up): (&String, &String)| edges.contains(&edge_ref(child, up));
                    tree.iter().any(on)
                });
                if crosses {
                    out.insert(name.clone());
                    break;
                }
            }
        }
        out
    }

    /// The announcers of `name` that count, with their groups, by `seq`.
    fn announcers(&self, name: &Name) -> Vec<(&'a str, &'a str)> {
        let facts = self.facts;
        facts
            .announcements
            .announcers(name)
            .filter_map(|(node, generation)| {
                let n = facts.fleet.get(node)?;
                let group = n.group.as_deref()?;
                (facts.counts)(n, generation).then_some((n.id.as_str(), group))
            })
            .collect()
    }

    /// The root of domain `i`'s tree for these announcers: the first
    /// one's group inside the domain; `None` if none is inside.
    fn root_in(&self, i: usize, announcers: &[(&'a str, &'a str)]) -> Option<&'a str> {
        let graph = &self.facts.graphs[i];
        announcers
            .iter()
            .find(|(_, g)| graph.contains(g))
            .map(|(_, g)| *g)
    }

    fn tree(&self, i: usize, root: &str) -> Arc<Tree> {
        let facts = self.facts;
        facts.trees.get(facts.graphs, i, root, facts.active)
    }

    /// The routes of `name` along each domain's tree: upward from every
    /// group towards the first announcer's (the root), downward from the
    /// root to each later announcer's group.
    fn routes_of(&mut self, name: &Name) -> Vec<Found<'a>> {
        let announcers = self.announcers(name);
        let mut out = Vec::new();
        for (i, graph) in self.facts.graphs.iter().enumerate() {
            let inside: Vec<(&'a str, &'a str)> = announcers
                .iter()
                .filter(|(_, g)| graph.contains(g))
                .copied()
                .collect();
            let Some(&(first, root)) = inside.first() else {
                continue;
            };
            let tree = self.tree(i, root);
            let links = self.links;
            let realized = &*self.realized.get_or_insert_with(|| realized(links));
            let upward = self.upward.entry((i, root)).or_insert_with(|| {
                let up = tree.iter().filter_map(|(child, up)| {
                    let r = realized.get(&edge_ref(child, up))?;
                    Some((r.gateway_in(child)?, r.link))
                });
                up.collect()
            });
            out.extend(upward.iter().map(|&(gateway, link)| Found {
                gateway,
                link,
                announcer: first,
            }));
            for &(node, group) in &inside[1..] {
                let mut child = group;
                while let Some(up) = tree.get(child) {
                    let r = realized.get(&edge_ref(up, child));
                    if let Some((gateway, r)) = r.and_then(|r| Some((r.gateway_in(up)?, r))) {
                        out.push(Found {
                            gateway,
                            link: r.link,
                            announcer: node,
                        });
                    }
                    child = up;
                }
            }
        }
        out
    }
}

/// The group pairs whose link changed, as route expansion sees links
/// (see [`realized`]): present on one side only, or with another id or
/// other gateways.
pub fn realized_changes<A: Borrow<Link>, B: Borrow<Link>>(
    before: &[A],
    after: &[B],
) -> BTreeSet<(String, String)> {
    fn key<'x>(r: &Realized<'x>) -> (&'x str, [(&'x str, &'x str); 2]) {
        (r.link.link_id.as_str(), r.gateways)
    }
    let (old, new) = (realized(before), realized(after));
    let mut out = BTreeSet::new();
    for (pair, r) in &old {
        if new.get(pair).map(key) != Some(key(r)) {
            out.insert((pair.0.to_string(), pair.1.to_string()));
        }
    }
    for pair in new.keys().filter(|p| !old.contains_key(*p)) {
        out.insert((pair.0.to_string(), pair.1.to_string()));
    }
    out
}

/// Every route the announcements call for, by id. `active_groups` are the
/// groups whose nodes hold links (see [`super::links::active_groups`]).
pub fn expand(
    nodes: &[NodeRecord],
    active_groups: &BTreeSet<String>,
    links: &[impl Borrow<Link>],
    templates: &[Template],
    graphs: &[SegmentGraph],
    now: i64,
) -> BTreeMap<String, Route> {
    let none = StoredRoutes::default();
    let found = changes(nodes, active_groups, links, templates, graphs, &none, now);
    found.put.into_iter().map(|r| (r.id.clone(), r)).collect()
}

/// What [`expand`] would change in `stored`, every announcement in
/// `templates` counting: the same routes, found without building those
/// already stored.
pub fn changes(
    nodes: &[NodeRecord],
    active_groups: &BTreeSet<String>,
    links: &[impl Borrow<Link>],
    templates: &[Template],
    graphs: &[SegmentGraph],
    stored: &StoredRoutes,
    now: i64,
) -> RouteChanges {
    let fleet = Fleet::new(nodes.iter().cloned());
    let announcements = Announcements::new(templates.iter().cloned());
    let trees = Trees::default();
    let facts = RouteFacts {
        fleet: &fleet,
        active: active_groups,
        announcements: &announcements,
        counts: &|_, _| true,
        graphs,
        trees: &trees,
    };
    Router::new(facts, links).changes(stored, NameScope::All, now)
}
