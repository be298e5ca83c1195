//! The petgraph trees against the hand-written breadth-first search they
//! replaced, and against any reordering of their input.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use proptest::prelude::*;

use super::SegmentGraph;

const GROUPS: [&str; 7] = ["a", "b", "c", "d", "e", "f", "g"];

fn mk_graph(edges: &[(&str, &str)]) -> SegmentGraph {
    SegmentGraph::new(
        "s",
        edges.iter().map(|(a, b)| (a.to_string(), b.to_string())),
    )
}

fn tree_of(g: &SegmentGraph, root: &str, active: &[&str]) -> Vec<String> {
    g.shortest_path_tree(root, |x| active.contains(&x))
        .into_iter()
        .map(|(child, parent)| format!("{parent}>{child}"))
        .collect()
}

/// The tree as computed before petgraph: adjacency in name order, each
/// group's parent the one the search first reached it from.
fn reference_tree(
    edges: &BTreeSet<(String, String)>,
    root: &str,
    active: &BTreeSet<&str>,
) -> BTreeMap<String, String> {
    let mut adjacent: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (a, b) in edges {
        if active.contains(a.as_str()) && active.contains(b.as_str()) {
            adjacent.entry(a).or_default().insert(b);
            adjacent.entry(b).or_default().insert(a);
        }
    }
    let mut parent = BTreeMap::new();
    let mut seen = BTreeSet::from([root]);
    let mut queue = VecDeque::from([root]);
    while let Some(g) = queue.pop_front() {
        for &n in adjacent.get(g).into_iter().flatten() {
            if seen.insert(n) {
                parent.insert(n.to_string(), g.to_string());
                queue.push_back(n);
            }
        }
    }
    parent
}

#[test]
fn edges_and_groups_are_sorted_whatever_the_input_order() {
    let g = mk_graph(&[("d", "a"), ("c", "a"), ("a", "b"), ("b", "a"), ("e", "e")]);
    let edges: Vec<_> = g.edges().collect();
    assert_eq!(edges, [("a", "b"), ("a", "c"), ("a", "d")]);
    assert_eq!(g.groups(), ["a", "b", "c", "d"], "self-loops dropped");
    assert!(g.has_edge("c", "a") && g.has_edge("a", "c"));
    assert!(!g.has_edge("b", "c") && !g.has_edge("a", "zz"));
    assert!(g.contains("d") && !g.contains("e"));
    assert_eq!(g, mk_graph(&[("a", "b"), ("a", "c"), ("a", "d")]));
    assert_eq!(mk_graph(&[]).edges().count(), 0);
}

#[test]
fn equal_paths_go_through_the_neighbour_first_in_name_order() {
    // Square a-b-d-c-a: d is two hops from a through b or through c.
    let g = mk_graph(&[("c", "d"), ("a", "c"), ("b", "d"), ("a", "b")]);
    let all = ["a", "b", "c", "d"];
    assert_eq!(tree_of(&g, "a", &all), ["a>b", "a>c", "b>d"]);
    assert_eq!(tree_of(&g, "d", &all), ["b>a", "d>b", "d>c"]);
}

#[test]
fn ties_follow_the_visiting_order_not_only_the_names() {
    // r reaches a before z, so y (under a) is visited before b (under z),
    // and w, next to both, hangs under y although b sorts first.
    let g = mk_graph(&[
        ("r", "a"),
        ("r", "z"),
        ("a", "y"),
        ("z", "b"),
        ("y", "w"),
        ("b", "w"),
    ]);
    let all = ["a", "b", "r", "w", "y", "z"];
    assert_eq!(tree_of(&g, "r", &all), ["r>a", "z>b", "y>w", "a>y", "r>z"]);
}

#[test]
fn inactive_groups_are_routed_around() {
    let g = mk_graph(&[("a", "b"), ("b", "d"), ("a", "c"), ("c", "e"), ("e", "d")]);
    assert_eq!(
        tree_of(&g, "a", &["a", "c", "d", "e"]),
        ["a>c", "e>d", "c>e"]
    );
    assert!(tree_of(&g, "b", &["a", "c", "d", "e"]).is_empty());
    assert!(tree_of(&g, "x", &["a", "x"]).is_empty());
}

/// Edges over GROUPS as index pairs (self-loops and repeats included).
fn edge_list() -> impl Strategy<Value = Vec<(usize, usize)>> {
    prop::collection::vec((0..GROUPS.len(), 0..GROUPS.len()), 0..16)
}

fn named(edges: &[(usize, usize)], flip: &[bool]) -> Vec<(String, String)> {
    edges
        .iter()
        .zip(flip.iter().chain(std::iter::repeat(&false)))
        .map(|(&(a, b), &f)| if f { (b, a) } else { (a, b) })
        .map(|(a, b)| (GROUPS[a].to_string(), GROUPS[b].to_string()))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn trees_match_the_previous_search(
        edges in edge_list(),
        active in prop::collection::btree_set(0..GROUPS.len(), 0..=GROUPS.len()),
        root in 0..GROUPS.len(),
    ) {
        let edges = named(&edges, &[]);
        let graph = SegmentGraph::new("s", edges.clone());
        let normalized: BTreeSet<(String, String)> = graph
            .edges()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        let active: BTreeSet<&str> = active.into_iter().map(|i| GROUPS[i]).collect();
        let ours: BTreeMap<String, String> = graph
            .shortest_path_tree(GROUPS[root], |g| active.contains(g))
            .into_iter()
            .map(|(c, p)| (c.to_string(), p.to_string()))
            .collect();
        prop_assert_eq!(ours, reference_tree(&normalized, GROUPS[root], &active));
    }

    #[test]
    fn shuffled_or_flipped_edges_give_the_same_graph_and_trees(
        (edges, shuffled) in edge_list().prop_flat_map(|e| (Just(e.clone()), Just(e).prop_shuffle())),
        flip in prop::collection::vec(any::<bool>(), 16),
    ) {
        let one = SegmentGraph::new("s", named(&edges, &[]));
        let other = SegmentGraph::new("s", named(&shuffled, &flip));
        prop_assert_eq!(&one, &other);
        for root in GROUPS {
            prop_assert_eq!(
                one.shortest_path_tree(root, |_| true),
                other.shortest_path_tree(root, |_| true)
            );
        }
    }
}
