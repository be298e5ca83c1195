//! Which nodes have any desired state: those a link touches (live or a
//! tombstone) or a route starts from, as the leader's working state holds
//! them. A reconcile of any other node would read nothing from the store
//! (see [`Store::reconcile_view`](crate::store::Store::reconcile_view)),
//! so it skips the read. At 1,000 nodes every node is reconciled when it
//! registers and only one in twenty is a gateway: on Postgres that read
//! was most of the statements of a fleet's convergence.
//!
//! It is kept conservative: a node is added before the rows that name it
//! are written (the working state applies a change set before the store
//! does), and it stays until the working state is read again in full,
//! even if its rows go. Links and routes are written by the leader alone
//! (its derivations, which add rows, and its reconcilers, which only
//! change statuses and drop tombstones), so a node missing here has no
//! row. A derivation that adds rows for a node reconciles the node after
//! writing them; a reconcile that ran before found nothing, as a read of
//! the store before the write would have. Until the working state is
//! loaded, and after it is thrown away, nothing is known and every
//! reconcile reads the store.

use std::collections::HashSet;
use std::sync::RwLock;

use super::working::Rows;
use crate::store::ChangeSet;
use crate::store::model::Link;

#[derive(Default)]
pub struct Involved(RwLock<Option<HashSet<String>>>);

impl Involved {
    /// Whether `node` is known to have no link and no route.
    pub fn surely_bare(&self, node: &str) -> bool {
        let known = self.0.read().unwrap_or_else(|p| p.into_inner());
        known.as_ref().is_some_and(|set| !set.contains(node))
    }

    /// Nothing is known until the next [`Self::rebuild`].
    pub(super) fn forget(&self) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The nodes `rows` name, and only those.
    pub(super) fn rebuild(&self, rows: &Rows) {
        let mut set = HashSet::new();
        for n in rows.links.iter().flat_map(ends) {
            insert(&mut set, n);
        }
        for (_, source) in rows.routes.iter() {
            insert(&mut set, source);
        }
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Some(set);
    }

    /// Adds the nodes `changes` writes rows for.
    pub(super) fn extend(&self, changes: &ChangeSet) {
        let links = changes.put_links.iter().flat_map(ends);
        let sources = changes.put_routes.iter().map(|r| r.source_node.as_str());
        self.add(links.chain(sources));
    }

    /// Adds the nodes `links` touch.
    pub(super) fn extend_links(&self, links: &[Link]) {
        self.add(links.iter().flat_map(ends));
    }

    fn add<'a>(&self, nodes: impl Iterator<Item = &'a str>) {
        let mut known = self.0.write().unwrap_or_else(|p| p.into_inner());
        if let Some(set) = known.as_mut() {
            nodes.for_each(|n| insert(set, n));
        }
    }
}

/// The nodes a link touches: its source, and its destination if claimed.
fn ends(l: &Link) -> impl Iterator<Item = &str> {
    std::iter::once(l.source_node.as_str()).chain(l.dest_node.as_deref())
}

/// Adds `node`, allocating only when it is new (a full load names each
/// gateway thousands of times).
fn insert(set: &mut HashSet<String>, node: &str) {
    if !set.contains(node) {
        set.insert(node.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::diff::tests::mk_link;
    use crate::routing::stored::StoredRoutes;
    use crate::store::model::{Name, Route, RouteStatus};

    fn link(id: &str, source: &str, dest: Option<&str>) -> Link {
        Link {
            dest_node: dest.map(str::to_string),
            ..mk_link(id, source, false)
        }
    }

    fn route(id: &str, source: &str) -> Route {
        Route {
            id: id.into(),
            source_node: source.into(),
            dest_node: "b/n1".into(),
            link_id: "l-1".into(),
            name: Name {
                components: ["org".into(), "ns".into(), "app".into()],
                id: None,
            },
            status: RouteStatus::Deleted,
            status_msg: String::new(),
            updated_at: 0,
        }
    }

    #[test]
    fn a_routes_source_is_not_bare() {
        let involved = Involved::default();
        let rows = Rows {
            routes: StoredRoutes::new(&[route("r-1", "a/n1")]),
            ..Rows::default()
        };
        involved.rebuild(&rows);
        assert!(!involved.surely_bare("a/n1"), "even a deleted route's");
        assert!(
            involved.surely_bare("b/n1"),
            "a route's destination has none"
        );
        involved.extend(&ChangeSet {
            put_routes: vec![route("r-2", "c/n1")],
            ..ChangeSet::default()
        });
        assert!(!involved.surely_bare("c/n1"));
    }

    #[test]
    fn nothing_is_bare_until_the_rows_are_known() {
        let involved = Involved::default();
        assert!(!involved.surely_bare("a/n1"));
        let rows = Rows {
            links: vec![link("l-1", "a/n1", Some("b/n1"))],
            ..Rows::default()
        };
        involved.rebuild(&rows);
        assert!(!involved.surely_bare("a/n1"), "a link's source");
        assert!(!involved.surely_bare("b/n1"), "a link's destination");
        assert!(involved.surely_bare("a/n2"));
        involved.extend(&ChangeSet {
            put_links: vec![link("l-2", "a/n2", None)],
            ..ChangeSet::default()
        });
        assert!(!involved.surely_bare("a/n2"), "a link about to be written");
        involved.forget();
        assert!(!involved.surely_bare("c/n1"), "nothing known after forget");
        involved.extend_links(&[link("l-3", "c/n1", None)]);
        assert!(!involved.surely_bare("c/n9"), "still unknown");
    }
}
