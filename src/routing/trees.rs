//! Shortest-path trees kept for as long as the topology they were grown
//! on: a tree depends on its domain's graph, its root and which groups are
//! active, none of which changes between most derivations, so a leader
//! grows each one once rather than once per derivation.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use super::topology::SegmentGraph;

/// Each reached group's parent (see [`SegmentGraph::shortest_path_tree`]).
pub type Tree = BTreeMap<String, String>;

/// The trees of one topology (its graphs and active groups), by domain
/// index and root. Drop it when the topology changes.
#[derive(Default)]
pub struct Trees(Mutex<HashMap<(usize, String), Arc<Tree>>>);

impl Trees {
    /// Domain `i`'s tree from `root` over the `active` groups.
    pub fn get(
        &self,
        graphs: &[SegmentGraph],
        i: usize,
        root: &str,
        active: &BTreeSet<String>,
    ) -> Arc<Tree> {
        let mut trees = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = trees.get(&(i, root.to_string())) {
            return t.clone();
        }
        let tree = match graphs.get(i) {
            Some(g) => g.shortest_path_tree(root, |g| active.contains(g)),
            None => BTreeMap::new(),
        };
        let owned: Tree = tree
            .into_iter()
            .map(|(c, p)| (c.to_string(), p.to_string()))
            .collect();
        let owned = Arc::new(owned);
        trees.insert((i, root.to_string()), owned.clone());
        owned
    }
}

impl std::fmt::Debug for Trees {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0.lock().map_or(0, |t| t.len());
        write!(f, "Trees({n})")
    }
}
