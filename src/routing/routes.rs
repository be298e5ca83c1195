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
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;

use super::topology::SegmentGraph;
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
fn realized<L: Borrow<Link>>(links: &[L]) -> HashMap<(&str, &str), Realized<'_>> {
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
/// without allocating its id.
fn write_route_id(out: &mut String, source: &str, link_id: &str, name: &Name) {
    let [c0, c1, c2] = &name.components;
    let _ = write!(out, "{source}|{link_id}|{c0}/{c1}/{c2}/");
    match name.id {
        Some(i) => {
            let _ = write!(out, "{i}");
        }
        None => out.push('-'),
    }
}

/// One derived route: on `gateway`, over `link`, towards `announcer`.
struct Found<'a> {
    gateway: &'a str,
    link: &'a Link,
    name: &'a Name,
    announcer: &'a str,
}

impl Found<'_> {
    fn to_route(&self, id: String, now: i64) -> Route {
        Route {
            id,
            source_node: self.gateway.to_string(),
            dest_node: self.announcer.to_string(),
            link_id: self.link.link_id.clone(),
            name: self.name.clone(),
            status: RouteStatus::Pending,
            status_msg: String::new(),
            updated_at: now,
        }
    }
}

/// Only what differs from the stored routes. A derivation finds every
/// route of the fleet, nearly all of them stored already: those cost a
/// lookup, not a route.
struct Compare<'s> {
    stored: &'s HashMap<String, String>,
    kept: HashSet<&'s str>,
    new: BTreeMap<String, Route>,
    id: String,
    now: i64,
}

impl Compare<'_> {
    /// Keeps a find: the first find of an id is the one kept.
    fn found(&mut self, f: Found<'_>) {
        self.id.clear();
        write_route_id(&mut self.id, f.gateway, &f.link.link_id, f.name);
        if let Some((id, _)) = self.stored.get_key_value(self.id.as_str()) {
            self.kept.insert(id.as_str());
        } else if !self.new.contains_key(self.id.as_str()) {
            let id = self.id.clone();
            self.new.insert(id.clone(), f.to_route(id, self.now));
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

struct Expansion<'a, 's> {
    realized: HashMap<(&'a str, &'a str), Realized<'a>>,
    sink: Compare<'s>,
}

impl<'a, 's> Expansion<'a, 's> {
    /// A route on `from`'s gateway towards `to` for `name`, if that tree
    /// edge has a live link.
    fn add(&mut self, from: &str, to: &str, name: &'a Name, announcer: &'a str) {
        let Some(r) = self.realized.get(&edge_ref(from, to)) else {
            return;
        };
        let Some(gateway) = r.gateway_in(from) else {
            return;
        };
        let link = r.link;
        self.sink.found(Found {
            gateway,
            link,
            name,
            announcer,
        });
    }

    /// Routes for `name` along one tree: upward from every group towards
    /// the first announcer's (the root), downward from the root to each
    /// later announcer's group.
    fn along_tree(
        &mut self,
        name: &'a Name,
        parent: &BTreeMap<&str, &str>,
        inside: &[(&'a str, &str)],
    ) {
        let Some(&(first, _)) = inside.first() else {
            return;
        };
        for (child, up) in parent {
            self.add(child, up, name, first);
        }
        for &(node, group) in &inside[1..] {
            let mut child = group;
            while let Some(&up) = parent.get(child) {
                self.add(up, child, name, node);
                child = up;
            }
        }
    }
}

/// Every route the announcements call for, by id. `active_groups` are the
/// groups whose nodes hold links (see [`super::links::active_groups`]): a
/// group whose nodes are only reconnecting keeps its routes.
pub fn expand(
    nodes: &[NodeRecord],
    active_groups: &BTreeSet<String>,
    links: &[impl Borrow<Link>],
    templates: &[Template],
    graphs: &[SegmentGraph],
    now: i64,
) -> BTreeMap<String, Route> {
    let none = HashMap::new();
    let found = changes(nodes, active_groups, links, templates, graphs, &none, now);
    found.put.into_iter().map(|r| (r.id.clone(), r)).collect()
}

/// What [`expand`] would change in `stored` (route id to source node):
/// the same routes, found without building those already stored.
pub fn changes(
    nodes: &[NodeRecord],
    active_groups: &BTreeSet<String>,
    links: &[impl Borrow<Link>],
    templates: &[Template],
    graphs: &[SegmentGraph],
    stored: &HashMap<String, String>,
    now: i64,
) -> RouteChanges {
    let sink = Compare {
        stored,
        kept: HashSet::with_capacity(stored.len()),
        new: BTreeMap::new(),
        id: String::new(),
        now,
    };
    let found = walk(nodes, active_groups, links, templates, graphs, sink);
    let mut gone: Vec<(String, String)> = stored
        .iter()
        .filter(|(id, _)| !found.kept.contains(id.as_str()))
        .map(|(id, source)| (id.clone(), source.clone()))
        .collect();
    gone.sort();
    RouteChanges {
        put: found.new.into_values().collect(),
        gone,
    }
}

/// Finds every route the announcements call for, compared in `sink`.
fn walk<'a, 's>(
    nodes: &'a [NodeRecord],
    active_groups: &'a BTreeSet<String>,
    links: &'a [impl Borrow<Link>],
    templates: &'a [Template],
    graphs: &'a [SegmentGraph],
    sink: Compare<'s>,
) -> Compare<'s> {
    let group_of: HashMap<&str, &str> = nodes
        .iter()
        .filter_map(|n| Some((n.id.as_str(), n.group.as_deref()?)))
        .collect();
    let active: BTreeSet<&str> = active_groups.iter().map(String::as_str).collect();
    let mut by_name: BTreeMap<&Name, Vec<&Template>> = BTreeMap::new();
    for t in templates {
        by_name.entry(&t.name).or_default().push(t);
    }
    let mut ex = Expansion {
        realized: realized(links),
        sink,
    };
    // One tree per domain and root, shared by every name rooted there.
    let mut trees: HashMap<(usize, &str), BTreeMap<&str, &str>> = HashMap::new();
    for (name, mut announcers) in by_name {
        announcers.sort_by(|a, b| a.seq.cmp(&b.seq).then_with(|| a.node.cmp(&b.node)));
        for (i, graph) in graphs.iter().enumerate() {
            let inside: Vec<(&str, &str)> = announcers
                .iter()
                .filter_map(|t| Some((t.node.as_str(), *group_of.get(t.node.as_str())?)))
                .filter(|(_, g)| graph.contains(g))
                .collect();
            let Some(&(_, root)) = inside.first() else {
                continue;
            };
            let parent = trees
                .entry((i, root))
                .or_insert_with(|| graph.shortest_path_tree(root, |g| active.contains(g)));
            ex.along_tree(name, parent, &inside);
        }
    }
    ex.sink
}
