//! One routing domain's graph and its shortest-path trees, on petgraph.
//!
//! Groups are the nodes, numbered in name order; the group pairs that may
//! link are the undirected, unweighted edges. The graph is a petgraph
//! [`Csr`] (a sparse adjacency matrix), which keeps each node's neighbours
//! sorted by index, hence by name, and a breadth-first search visits them in
//! that order. Ties between equally short paths therefore break the same
//! way on any leader, whatever order the configuration or the store listed
//! the edges in.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use petgraph::Undirected;
use petgraph::csr::Csr;
use petgraph::visit::{Bfs, IntoNeighbors, NodeFiltered};

/// Node `i` is the `i`-th group in name order.
type Graph = Csr<(), (), Undirected, usize>;

/// One routing domain: its name and the group pairs that may link.
#[derive(Clone)]
pub struct SegmentGraph {
    pub name: String,
    /// Node names, sorted and unique: node `i` is `groups[i]`.
    groups: Vec<String>,
    graph: Graph,
}

impl SegmentGraph {
    /// The domain `name` with undirected `edges`, given in any order and
    /// either way round; repeats and self-loops are dropped.
    pub fn new(name: impl Into<String>, edges: impl IntoIterator<Item = (String, String)>) -> Self {
        let pairs: BTreeSet<(String, String)> = edges
            .into_iter()
            .filter(|(a, b)| a != b)
            .map(|(a, b)| if a <= b { (a, b) } else { (b, a) })
            .collect();
        let names: BTreeSet<&String> = pairs.iter().flat_map(|(a, b)| [a, b]).collect();
        let groups: Vec<String> = names.into_iter().cloned().collect();
        let at = |g: &str| groups.binary_search_by(|x| x.as_str().cmp(g));
        let mut arcs: Vec<(usize, usize)> = pairs
            .iter()
            .filter_map(|(a, b)| Some((at(a).ok()?, at(b).ok()?)))
            .flat_map(|(i, j)| [(i, j), (j, i)])
            .collect();
        arcs.sort_unstable();
        let graph = Graph::from_sorted_edges(&arcs).expect("arcs are sorted and unique");
        SegmentGraph {
            name: name.into(),
            groups,
            graph,
        }
    }

    /// Groups on at least one edge, sorted.
    pub fn groups(&self) -> Vec<String> {
        self.groups.clone()
    }

    /// Whether `group` is on at least one edge.
    pub fn contains(&self, group: &str) -> bool {
        self.index(group).is_some()
    }

    /// The edges as `(a, b)` with `a < b`, sorted.
    pub fn edges(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        (0..self.groups.len()).flat_map(move |i| {
            self.graph
                .neighbors_slice(i)
                .iter()
                .filter(move |&&j| j > i)
                .map(move |&j| (self.groups[i].as_str(), self.groups[j].as_str()))
        })
    }

    pub fn has_edge(&self, a: &str, b: &str) -> bool {
        match (self.index(a), self.index(b)) {
            (Some(i), Some(j)) => self.graph.contains_edge(i, j),
            _ => false,
        }
    }

    /// The breadth-first tree from `root` over the groups that `include`
    /// accepts, as each reached group's parent: a shortest path (unit
    /// weights) whose ties go to the neighbour visited first, in name
    /// order. Empty when `root` is not in the graph or not accepted.
    pub fn shortest_path_tree(
        &self,
        root: &str,
        include: impl Fn(&str) -> bool,
    ) -> BTreeMap<&str, &str> {
        let mut parent = BTreeMap::new();
        // Judged once per group, not once per edge the search crosses.
        let accepted: Vec<bool> = self.groups.iter().map(|g| include(g)).collect();
        let Some(start) = self.index(root).filter(|&i| accepted[i]) else {
            return parent;
        };
        let view = NodeFiltered::from_fn(&self.graph, |i: usize| accepted[i]);
        let mut bfs = Bfs::new(&view, start);
        let mut reached_from: Vec<Option<usize>> = vec![None; self.groups.len()];
        // Groups come out in visiting order, so the first one seen next to
        // a group is the one the search reached it from.
        while let Some(u) = bfs.next(&view) {
            for v in view.neighbors(u).filter(|&v| v != start) {
                reached_from[v].get_or_insert(u);
            }
        }
        for (v, u) in reached_from.into_iter().enumerate() {
            if let Some(u) = u {
                parent.insert(self.groups[v].as_str(), self.groups[u].as_str());
            }
        }
        parent
    }

    fn index(&self, group: &str) -> Option<usize> {
        self.groups.binary_search_by(|x| x.as_str().cmp(group)).ok()
    }
}

impl PartialEq for SegmentGraph {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.edges().eq(other.edges())
    }
}

impl Eq for SegmentGraph {}

impl fmt::Debug for SegmentGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SegmentGraph")
            .field("name", &self.name)
            .field("edges", &self.edges().collect::<Vec<_>>())
            .finish()
    }
}

#[cfg(test)]
#[path = "graph_tests.rs"]
mod tests;
