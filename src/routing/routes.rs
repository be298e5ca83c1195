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

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::topology::SegmentGraph;
use crate::store::model::{Link, Name, NodeRecord, Route, RouteStatus, Template, edge};

/// An established link seen from both groups: who is the gateway on each side.
struct Realized<'a> {
    link: &'a Link,
    gateways: [(&'a str, &'a str); 2],
}

impl Realized<'_> {
    fn gateway_in(&self, group: &str) -> Option<&str> {
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
fn realized(links: &[Link]) -> HashMap<(String, String), Realized<'_>> {
    links
        .iter()
        .filter(|l| !l.deleted)
        .filter_map(|l| {
            let dest = l.dest_node.as_deref()?;
            let gateways = [
                (l.source_group.as_str(), l.source_node.as_str()),
                (l.dest_group.as_str(), dest),
            ];
            Some((
                edge(&l.source_group, &l.dest_group),
                Realized { link: l, gateways },
            ))
        })
        .collect()
}

/// The route id: one route per (source node, link, name), whoever asks.
pub fn route_id(source: &str, link_id: &str, name: &Name) -> String {
    let [c0, c1, c2] = &name.components;
    let id = name.id.map_or_else(|| "-".to_string(), |i| i.to_string());
    format!("{source}|{link_id}|{c0}/{c1}/{c2}/{id}")
}

struct Expansion<'a> {
    realized: HashMap<(String, String), Realized<'a>>,
    out: BTreeMap<String, Route>,
    now: i64,
}

impl Expansion<'_> {
    /// A route on `from`'s gateway towards `to` for `name`, if that tree
    /// edge has a live link.
    fn add(&mut self, from: &str, to: &str, name: &Name, announcer: &str) {
        let Some(r) = self.realized.get(&edge(from, to)) else {
            return;
        };
        let Some(gw) = r.gateway_in(from) else {
            return;
        };
        let id = route_id(gw, &r.link.link_id, name);
        self.out.entry(id.clone()).or_insert_with(|| Route {
            id,
            source_node: gw.to_string(),
            dest_node: announcer.to_string(),
            link_id: r.link.link_id.clone(),
            name: name.clone(),
            status: RouteStatus::Pending,
            status_msg: String::new(),
            updated_at: self.now,
        });
    }

    /// Routes for `name` along one tree: upward from every group towards
    /// the first announcer's (the root), downward from the root to each
    /// later announcer's group.
    fn along_tree(&mut self, name: &Name, parent: &BTreeMap<&str, &str>, inside: &[(&str, &str)]) {
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
    links: &[Link],
    templates: &[Template],
    graphs: &[SegmentGraph],
    now: i64,
) -> BTreeMap<String, Route> {
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
        out: BTreeMap::new(),
        now,
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
    ex.out
}
