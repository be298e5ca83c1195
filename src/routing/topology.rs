//! Which group pairs may link, per routing domain (segment).
//!
//! Config mode: an adjacency list (one `default` domain) or named segments,
//! where `*` means every registered group and a segment using `$group` is
//! instantiated once per registered group not named explicitly in it. API
//! mode: the segments and edges kept in the store. Edges are undirected.

use std::collections::{BTreeMap, BTreeSet};

pub use super::graph::SegmentGraph;
use crate::config::{AdjacencyEntry, SegmentConfig, TopologyConfig};
use crate::store::model::{Segment, edge};

/// The domain an adjacency list without segments forms.
pub const DEFAULT_SEGMENT: &str = "default";

const ANY: &str = "*";
const TEMPLATE: &str = "$group";

/// The routing domains in force, given the registered groups.
pub fn resolve(
    mode: &TopologyConfig,
    api_segments: &[Segment],
    groups: &BTreeSet<String>,
) -> Vec<SegmentGraph> {
    match mode {
        TopologyConfig::Api => api_segments
            .iter()
            .map(|s| SegmentGraph::new(s.name.clone(), s.edges.iter().cloned()))
            .collect(),
        TopologyConfig::Links(links) => {
            vec![SegmentGraph::new(DEFAULT_SEGMENT, expand(links, groups))]
        }
        TopologyConfig::Segments(segments) => segments
            .iter()
            .flat_map(|s| instantiate(s, groups))
            .collect(),
    }
}

/// Whether nodes of `a` and `b` may hold a link: some domain has the edge.
pub fn may_link(graphs: &[SegmentGraph], a: &str, b: &str) -> bool {
    a != b && graphs.iter().any(|g| g.has_edge(a, b))
}

fn uses_template(s: &SegmentConfig) -> bool {
    s.name.contains(TEMPLATE)
        || s.links
            .iter()
            .any(|l| l.group == TEMPLATE || l.neighbors.iter().any(|n| n == TEMPLATE))
}

/// A plain segment as is; a `$group` segment once per registered group that
/// the segment does not already name. Instances with the same name merge.
fn instantiate(s: &SegmentConfig, groups: &BTreeSet<String>) -> Vec<SegmentGraph> {
    if !uses_template(s) {
        return vec![SegmentGraph::new(s.name.clone(), expand(&s.links, groups))];
    }
    let named: BTreeSet<&str> = s
        .links
        .iter()
        .flat_map(|l| std::iter::once(&l.group).chain(&l.neighbors))
        .map(String::as_str)
        .filter(|g| *g != TEMPLATE && *g != ANY)
        .collect();
    let mut merged: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    for g in groups.iter().filter(|g| !named.contains(g.as_str())) {
        let subst = |x: &String| if x == TEMPLATE { g.clone() } else { x.clone() };
        let links: Vec<AdjacencyEntry> = s
            .links
            .iter()
            .map(|l| AdjacencyEntry {
                group: subst(&l.group),
                neighbors: l.neighbors.iter().map(subst).collect(),
            })
            .collect();
        let name = s.name.replace(TEMPLATE, g);
        merged
            .entry(name)
            .or_default()
            .extend(expand(&links, groups));
    }
    merged
        .into_iter()
        .map(|(name, edges)| SegmentGraph::new(name, edges))
        .collect()
}

/// The edges of an adjacency list, `*` standing for every registered group.
fn expand(links: &[AdjacencyEntry], groups: &BTreeSet<String>) -> BTreeSet<(String, String)> {
    let each = |g: &String| -> Vec<String> {
        if g == ANY {
            groups.iter().cloned().collect()
        } else {
            vec![g.clone()]
        }
    };
    let mut edges = BTreeSet::new();
    for l in links {
        for a in each(&l.group) {
            for b in l.neighbors.iter().flat_map(each) {
                if a != b {
                    edges.insert(edge(&a, &b));
                }
            }
        }
    }
    edges
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_entry(group: &str, neighbors: &[&str]) -> AdjacencyEntry {
        AdjacencyEntry {
            group: group.into(),
            neighbors: neighbors.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn mk_groups(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn edges_of(g: &SegmentGraph) -> Vec<String> {
        g.edges().map(|(a, b)| format!("{a}-{b}")).collect()
    }

    #[test]
    fn full_mesh_links_every_registered_pair() {
        let mode = TopologyConfig::Links(vec![mk_entry("*", &["*"])]);
        let graphs = resolve(&mode, &[], &mk_groups(&["a", "b", "c"]));
        assert_eq!(graphs.len(), 1);
        assert_eq!(graphs[0].name, "default");
        assert_eq!(edges_of(&graphs[0]), ["a-b", "a-c", "b-c"]);
    }

    #[test]
    fn star_links_spokes_only_to_the_hub() {
        let mode = TopologyConfig::Links(vec![mk_entry("cloud", &["*"])]);
        let graphs = resolve(&mode, &[], &mk_groups(&["cloud", "x", "y"]));
        assert_eq!(edges_of(&graphs[0]), ["cloud-x", "cloud-y"]);
        assert!(!may_link(&graphs, "x", "y"));
        assert!(may_link(&graphs, "y", "cloud"));
    }

    #[test]
    fn explicit_pairs_hold_even_before_groups_register() {
        let mode = TopologyConfig::Links(vec![mk_entry("cloud", &["customer-a", "customer-b"])]);
        let graphs = resolve(&mode, &[], &BTreeSet::new());
        assert_eq!(
            edges_of(&graphs[0]),
            ["cloud-customer-a", "cloud-customer-b"]
        );
        assert!(!may_link(&graphs, "customer-a", "customer-b"));
    }

    #[test]
    fn group_template_isolates_each_customer() {
        let mode = TopologyConfig::Segments(vec![SegmentConfig {
            name: "segment-$group".into(),
            links: vec![mk_entry("cloud", &["$group"])],
        }]);
        let graphs = resolve(
            &mode,
            &[],
            &mk_groups(&["cloud", "customer-a", "customer-b"]),
        );
        let names: Vec<_> = graphs.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(
            names,
            ["segment-customer-a", "segment-customer-b"],
            "cloud is named, so not instantiated"
        );
        assert_eq!(edges_of(&graphs[0]), ["cloud-customer-a"]);
        assert!(!may_link(&graphs, "customer-a", "customer-b"));
    }

    #[test]
    fn named_segments_keep_their_own_edges() {
        let mode = TopologyConfig::Segments(vec![
            SegmentConfig {
                name: "customer-1".into(),
                links: vec![mk_entry("cloud", &["cluster-a"])],
            },
            SegmentConfig {
                name: "customer-2".into(),
                links: vec![mk_entry("cloud", &["cluster-b", "cluster-c"])],
            },
        ]);
        let graphs = resolve(&mode, &[], &BTreeSet::new());
        assert_eq!(edges_of(&graphs[1]), ["cloud-cluster-b", "cloud-cluster-c"]);
        assert_eq!(graphs[0].groups(), ["cloud", "cluster-a"]);
    }

    /// Trees of each graph from every root, by graph name.
    fn trees(graphs: &[SegmentGraph]) -> BTreeMap<String, Vec<BTreeMap<&str, &str>>> {
        graphs
            .iter()
            .map(|g| {
                let roots = g.groups();
                let trees = roots
                    .iter()
                    .map(|r| g.shortest_path_tree(r, |_| true))
                    .collect();
                (g.name.clone(), trees)
            })
            .collect()
    }

    #[test]
    fn input_order_changes_neither_graphs_nor_trees() {
        let links = vec![
            mk_entry("hub", &["*"]),
            mk_entry("a", &["b", "c"]),
            mk_entry("d", &["c", "a"]),
        ];
        let templated = SegmentConfig {
            name: "t-$group".into(),
            links: vec![
                mk_entry("hub", &["$group", "a"]),
                mk_entry("$group", &["d"]),
            ],
        };
        let plain = SegmentConfig {
            name: "plain".into(),
            links: links.clone(),
        };
        let reversed = |l: &[AdjacencyEntry]| -> Vec<AdjacencyEntry> {
            let names = |n: &[String]| n.iter().rev().cloned().collect::<Vec<_>>();
            l.iter()
                .rev()
                .map(|e| AdjacencyEntry {
                    group: e.group.clone(),
                    neighbors: names(&e.neighbors),
                })
                .collect()
        };
        let groups = mk_groups(&["a", "b", "c", "d", "e", "hub"]);
        let forward = TopologyConfig::Segments(vec![plain.clone(), templated.clone()]);
        let backward = TopologyConfig::Segments(vec![
            SegmentConfig {
                links: reversed(&templated.links),
                ..templated
            },
            SegmentConfig {
                links: reversed(&plain.links),
                ..plain
            },
        ]);
        let one = resolve(&forward, &[], &groups);
        let other = resolve(&backward, &[], &groups);
        assert_eq!(trees(&one), trees(&other));
        assert_eq!(one.len(), 4, "plain, t-b, t-c, t-e");
        let one = resolve(&TopologyConfig::Links(links.clone()), &[], &groups);
        let other = resolve(&TopologyConfig::Links(reversed(&links)), &[], &groups);
        assert_eq!((&one, trees(&one)), (&other, trees(&other)));
        let stored = |edges: Vec<(String, String)>| Segment {
            name: "default".into(),
            edges,
        };
        let edges: Vec<(String, String)> = one[0]
            .edges()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        let flipped = edges.iter().rev().map(|(a, b)| (b.clone(), a.clone()));
        let api = resolve(&TopologyConfig::Api, &[stored(edges.clone())], &groups);
        let api_flipped = resolve(&TopologyConfig::Api, &[stored(flipped.collect())], &groups);
        assert_eq!(trees(&api), trees(&api_flipped));
        assert_eq!(trees(&api), trees(&one));
    }

    #[test]
    fn api_mode_uses_stored_segments() {
        let stored = vec![Segment {
            name: "default".into(),
            edges: vec![edge("b", "a")],
        }];
        let graphs = resolve(&TopologyConfig::Api, &stored, &BTreeSet::new());
        assert!(may_link(&graphs, "a", "b") && may_link(&graphs, "b", "a"));
        assert!(!may_link(&graphs, "a", "a"));
    }
}
