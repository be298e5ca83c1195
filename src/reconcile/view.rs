//! What reconcilers read of the desired state: per node, the links that
//! touch it and the routes it sources, as the leader's working state holds
//! them. A reconcile reads its node's rows here instead of asking the
//! store: at 1,000 nodes on Postgres that read was 99 transactions of a
//! convergence, each the longer half of the wait before a gateway's
//! command (the node's own tables are read beside it).
//!
//! It holds what the store holds, or is silent. Links and routes are
//! written by the leader alone (see [`super::working`]): its derivations,
//! applied here while their write runs, the nodes they touch silent until
//! it has committed, and its reconcilers, which change statuses and drop
//! tombstones, applied here by the reconciler once its record has
//! committed. A reconcile that reads before a write is applied sees what a
//! read of the store before its commit would have seen; the nodes a write
//! changed are reconciled after it has committed. Where the store decides
//! what a write does, the view is silent until the leader has read the
//! outcome back: a retired link (its
//! deletion depends on whether its source came back) leaves its ends
//! unsure, and their reconciles read the store. Until the working state is
//! loaded, and after it is thrown away (a failed write, a resync), the
//! view is silent for every node.
//!
//! A reconcile reads of a link only its ends, its endpoint and whether it
//! is deleted, never its status: the statuses held here are those the
//! leader last wrote or read, and may trail the reconcilers' answers. Of a
//! route it reads its name, link and whether it is applied; a route
//! marked by a reconcile is marked here on its entry as the reconcile read
//! it, so a mark that lost the race with a newer version of the route
//! changes nothing (that version is marked by the next reconcile).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::store::ChangeSet;
use crate::store::model::{Link, Name, Route, RouteMark, RouteStatus};

/// The reconcilers' view; see the module docs.
#[derive(Default)]
pub struct DesiredView(RwLock<Option<Index>>);

/// One route as a reconcile reads it.
#[derive(Debug)]
pub struct ViewRoute {
    id: Arc<str>,
    dest: Arc<str>,
    link: Arc<str>,
    name: Arc<Name>,
    status: AtomicU8,
}

/// A node's desired rows as read from the view: its links and routes, and
/// the route entries to mark once the reconcile's record is written.
#[derive(Debug, Default)]
pub struct NodeRows {
    pub links: Vec<Link>,
    pub routes: Vec<Route>,
    pub entries: Vec<Arc<ViewRoute>>,
}

#[derive(Default)]
struct Index {
    links: HashMap<Arc<str>, Arc<Link>>,
    /// Per node, the ids of the links it is an end of.
    touching: HashMap<Arc<str>, BTreeSet<Arc<str>>>,
    /// Routes by id, each with its source.
    routes: HashMap<Arc<str>, (Arc<str>, Arc<ViewRoute>)>,
    /// Per source node, the ids of its routes.
    sourced: HashMap<Arc<str>, BTreeSet<Arc<str>>>,
    /// Retired links whose outcome is unread, with their ends.
    unsure: HashMap<String, Vec<String>>,
    /// The nodes a derivation's write in flight touches.
    writing: HashSet<String>,
    /// One copy of each node id, link id and name the rows repeat: at
    /// 10,000 nodes the view holds 19,800 routes over 4,950 links and 200
    /// names (kept until the working state is read again in full).
    ids: HashSet<Arc<str>>,
    names: HashSet<Arc<Name>>,
}

impl DesiredView {
    /// `node`'s rows, or `None` when the view cannot tell them.
    pub fn of(&self, node: &str) -> Option<NodeRows> {
        let guard = self.read();
        let index = guard.as_ref()?;
        if index.is_unsure(node) {
            return None;
        }
        let mut out = NodeRows::default();
        for id in index.touching.get(node).into_iter().flatten() {
            if let Some(l) = index.links.get(id) {
                out.links.push(Link::clone(l));
            }
        }
        for id in index.sourced.get(node).into_iter().flatten() {
            if let Some((_, e)) = index.routes.get(id) {
                out.routes.push(e.route(node));
                out.entries.push(e.clone());
            }
        }
        Some(out)
    }

    /// Marks the routes of `entries` (as a reconcile read them) with the
    /// `marks` its record wrote.
    pub fn marked(&self, entries: &[Arc<ViewRoute>], marks: &[RouteMark]) {
        let by_id: HashMap<&str, &Arc<ViewRoute>> = entries.iter().map(|e| (&*e.id, e)).collect();
        for m in marks {
            if let Some(e) = by_id.get(m.id.as_str()) {
                e.status.store(status_code(m.status), Ordering::Relaxed);
            }
        }
    }

    /// Drops the tombstones a reconcile's record deleted.
    pub fn dropped(&self, links: &[String]) {
        if let Some(index) = self.write().as_mut() {
            links.iter().for_each(|id| index.remove_link(id));
        }
    }

    /// Silent for every node until the next [`Self::rebuild`].
    pub(super) fn forget(&self) {
        *self.write() = None;
    }

    /// Holds `links` and `routes`, every row of a full read, and only those.
    pub(super) fn rebuild(&self, links: &[Link], routes: &[Route]) {
        let mut index = Index::default();
        links
            .iter()
            .for_each(|l| index.put_link(Arc::new(l.clone())));
        routes.iter().for_each(|r| index.put_route(r));
        *self.write() = Some(index);
    }

    /// Applies a derivation's change set while its write runs. The nodes
    /// it touches are unsure until [`Self::write_ended`]: until the commit,
    /// their reconciles read the store, as they did before the write.
    pub(super) fn write_begins(&self, changes: &ChangeSet) {
        let mut guard = self.write();
        let Some(index) = guard.as_mut() else {
            return;
        };
        index.writing.clear();
        for l in &changes.put_links {
            index.note_link_ends(&l.link_id);
            index.writing.extend(ends(l));
            index.put_link(Arc::new(l.clone()));
        }
        for id in &changes.delete_links {
            index.note_link_ends(id);
            index.remove_link(id);
        }
        for r in &changes.retire_links {
            let ends = index
                .links
                .get(r.link_id.as_str())
                .map(|l| ends(l))
                .unwrap_or_default();
            index.unsure.insert(r.link_id.clone(), ends);
        }
        for r in &changes.put_routes {
            // A claim's routes are thousands over a few dozen sources.
            if !index.writing.contains(&r.source_node) {
                index.writing.insert(r.source_node.clone());
            }
            index.put_route(r);
        }
        for id in &changes.delete_routes {
            if let Some((source, _)) = index.routes.get(id.as_str()) {
                index.writing.insert(source.to_string());
            }
            index.remove_route(id);
        }
    }

    /// The write [`Self::write_begins`] announced has committed.
    pub(super) fn write_ended(&self) {
        if let Some(index) = self.write().as_mut() {
            index.writing.clear();
        }
    }

    /// Links read back from the store: `fresh` are their rows now; the
    /// others among `ids` are gone. Settles retired links among them.
    pub(super) fn reread(&self, ids: &[String], fresh: &[Link]) {
        let mut guard = self.write();
        let Some(index) = guard.as_mut() else {
            return;
        };
        let found: HashMap<&str, &Link> = fresh.iter().map(|l| (l.link_id.as_str(), l)).collect();
        for id in ids {
            index.unsure.remove(id);
            match found.get(id.as_str()) {
                Some(l) => index.put_link(Arc::new(Link::clone(l))),
                None => index.remove_link(id),
            }
        }
    }

    /// Links whose rows were read back only in part (their status): those
    /// `gone` are removed; retired ones among `ids` are settled.
    pub(super) fn restated(&self, ids: &[String], gone: &[String]) {
        let mut guard = self.write();
        let Some(index) = guard.as_mut() else {
            return;
        };
        ids.iter().for_each(|id| {
            index.unsure.remove(id);
        });
        gone.iter().for_each(|id| index.remove_link(id));
    }

    fn read(&self) -> RwLockReadGuard<'_, Option<Index>> {
        // Every update leaves the index whole before anything can panic.
        self.0.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Option<Index>> {
        self.0.write().unwrap_or_else(|p| p.into_inner())
    }
}

impl Index {
    fn is_unsure(&self, node: &str) -> bool {
        self.writing.contains(node)
            || self
                .unsure
                .values()
                .any(|ends| ends.iter().any(|e| e == node))
    }

    /// Counts the ends of link `id` as it is now among those written.
    fn note_link_ends(&mut self, id: &str) {
        if let Some(old) = self.links.get(id) {
            let ends = ends(old);
            self.writing.extend(ends);
        }
    }

    fn put_link(&mut self, l: Arc<Link>) {
        self.remove_link(&l.link_id);
        let id = self.shared(&l.link_id);
        for end in ends(&l) {
            let end = self.shared(&end);
            self.touching.entry(end).or_default().insert(id.clone());
        }
        self.links.insert(id, l);
    }

    /// The one copy of `s`.
    fn shared(&mut self, s: &str) -> Arc<str> {
        if let Some(held) = self.ids.get(s) {
            return held.clone();
        }
        let held: Arc<str> = Arc::from(s);
        self.ids.insert(held.clone());
        held
    }

    /// The one copy of `name`.
    fn shared_name(&mut self, name: &Name) -> Arc<Name> {
        if let Some(held) = self.names.get(name) {
            return held.clone();
        }
        let held = Arc::new(name.clone());
        self.names.insert(held.clone());
        held
    }

    fn remove_link(&mut self, id: &str) {
        let Some(old) = self.links.remove(id) else {
            return;
        };
        for end in ends(&old) {
            remove_from(&mut self.touching, &end, id);
        }
    }

    fn put_route(&mut self, r: &Route) {
        self.remove_route(&r.id);
        let source = self.shared(&r.source_node);
        let entry = ViewRoute {
            id: Arc::from(r.id.as_str()),
            dest: self.shared(&r.dest_node),
            link: self.shared(&r.link_id),
            name: self.shared_name(&r.name),
            status: AtomicU8::new(status_code(r.status)),
        };
        let id = entry.id.clone();
        self.sourced
            .entry(source.clone())
            .or_default()
            .insert(id.clone());
        self.routes.insert(id, (source, Arc::new(entry)));
    }

    fn remove_route(&mut self, id: &str) {
        if let Some((source, _)) = self.routes.remove(id) {
            remove_from(&mut self.sourced, &source, id);
        }
    }
}

impl ViewRoute {
    fn route(&self, source: &str) -> Route {
        Route {
            id: self.id.to_string(),
            source_node: source.to_string(),
            dest_node: self.dest.to_string(),
            link_id: self.link.to_string(),
            name: Name::clone(&self.name),
            status: status_of(self.status.load(Ordering::Relaxed)),
            status_msg: String::new(),
            updated_at: 0,
        }
    }
}

/// Takes `id` out of `key`'s set, and the set out of `sets` once empty.
fn remove_from(sets: &mut HashMap<Arc<str>, BTreeSet<Arc<str>>>, key: &str, id: &str) {
    if let Some(ids) = sets.get_mut(key) {
        ids.remove(id);
        if ids.is_empty() {
            sets.remove(key);
        }
    }
}

/// The nodes a link touches: its source, and its destination if claimed.
fn ends(l: &Link) -> Vec<String> {
    let mut out = vec![l.source_node.clone()];
    out.extend(l.dest_node.clone());
    out
}

fn status_code(s: RouteStatus) -> u8 {
    match s {
        RouteStatus::Pending => 0,
        RouteStatus::Applied => 1,
        RouteStatus::Failed => 2,
        RouteStatus::Deleted => 3,
    }
}

fn status_of(code: u8) -> RouteStatus {
    match code {
        1 => RouteStatus::Applied,
        2 => RouteStatus::Failed,
        3 => RouteStatus::Deleted,
        _ => RouteStatus::Pending,
    }
}

#[cfg(test)]
#[path = "view_tests.rs"]
mod tests;
