//! The leader's working state: every row a derivation reads, kept between
//! batches so that a batch reads what changed rather than every table, and
//! what changed since the last derivation, so that it derives only that
//! (see [`Dirty`]).
//!
//! Coherence rests on who writes what. Node records and templates change
//! through facts, and every fact signals its node (or asks for a full
//! resync): a batch re-reads its own nodes. Links and routes are written
//! by this leader alone (a term's derivations and reconcilers), so the
//! derivation's own writes are applied here as they are made, and a
//! reconciler names the links it wrote in [`LinkWrites`] for the next batch
//! to re-read. A write whose outcome is unknown (an error) and any resync
//! make the next batch read everything again.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use super::db_clock::DbClock;
use super::view::DesiredView;
use crate::routing::fleet::Fleet;
use crate::routing::stored::StoredRoutes;
use crate::routing::templates::{Announcements, judged_again_at};
use crate::routing::topology::SegmentGraph;
use crate::routing::trees::Trees;
use crate::store::model::{Link, LinkState, Name, NodeRecord, Route, Segment, Template, edge};
use crate::store::{ChangeSet, Fresh, Store, StoreError};

/// Links a reconciler wrote (an answer, a forgotten tombstone): the leader
/// re-reads them before its next derivation.
#[derive(Default)]
pub struct LinkWrites(Mutex<BTreeSet<String>>);

impl LinkWrites {
    pub fn wrote<'a>(&self, ids: impl IntoIterator<Item = &'a String>) {
        let mut set = self.0.lock().unwrap_or_else(|p| p.into_inner());
        set.extend(ids.into_iter().cloned());
    }

    fn take(&self) -> Vec<String> {
        let mut set = self.0.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *set).into_iter().collect()
    }
}

/// The rows of one look, indexed as a derivation reads them.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Rows {
    pub nodes: Fleet,
    pub templates: Announcements,
    /// By `link_id`, tombstones included.
    pub links: Vec<Link>,
    pub routes: StoredRoutes,
}

impl Rows {
    /// Every row, read afresh.
    pub async fn load(store: &dyn Store) -> Result<Self, StoreError> {
        Ok(Self::load_with_routes(store).await?.0)
    }

    /// Every row, and the routes whole (the rows keep them compact).
    async fn load_with_routes(store: &dyn Store) -> Result<(Self, Vec<Route>), StoreError> {
        let (nodes, templates, links, routes) = tokio::try_join!(
            store.list_nodes(),
            store.list_templates(),
            store.list_links(),
            store.list_routes()
        )?;
        let rows = Self {
            nodes: Fleet::new(nodes),
            templates: Announcements::new(templates),
            links,
            routes: StoredRoutes::new(&routes),
        };
        Ok((rows, routes))
    }
}

/// What changed since the last derivation, which the next one must look
/// at; a derivation of the rest would change nothing (derivation is
/// idempotent). Nodes and links name what they touch: the groups of a
/// node's old and new record, the names of its old and new announcements,
/// the pair of a link's old and new version.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Dirty {
    /// Everything: the rows were read afresh, or the topology moved.
    pub full: bool,
    pub nodes: BTreeSet<String>,
    pub groups: BTreeSet<String>,
    /// `(a, b)`, `a < b`.
    pub pairs: BTreeSet<(String, String)>,
    pub names: BTreeSet<Name>,
}

impl Dirty {
    /// Nothing changed, not even partly.
    pub fn is_empty(&self) -> bool {
        !self.full
            && self.nodes.is_empty()
            && self.groups.is_empty()
            && self.pairs.is_empty()
            && self.names.is_empty()
    }
}

/// The topology of the last derivation and what it was resolved from.
struct Resolved {
    active: BTreeSet<String>,
    segments: Vec<Segment>,
    graphs: Vec<SegmentGraph>,
    /// The trees grown on them.
    trees: Trees,
}

pub struct WorkingState {
    rows: Option<Rows>,
    /// The database's clock, extrapolated between readings.
    clock: DbClock,
    /// Nodes whose record or templates this leader changed since it read
    /// them (a consumed claim, dropped announcements).
    stale: BTreeSet<String>,
    link_writes: Arc<LinkWrites>,
    /// The rows as reconcilers read them (see [`DesiredView`]), unless
    /// `keep_view` is off (the view then stays silent).
    view: Arc<DesiredView>,
    keep_view: bool,
    dirty: Dirty,
    /// Nodes that time alone will judge anew, by when (see
    /// [`judged_again_at`]); the deadlines up to `derived_at` were taken.
    timed: BTreeSet<(i64, String)>,
    deadline_of: HashMap<String, i64>,
    derived_at: Option<i64>,
    resolved: Option<Resolved>,
}

impl WorkingState {
    pub fn new(link_writes: Arc<LinkWrites>) -> Self {
        Self {
            rows: None,
            clock: DbClock::default(),
            stale: BTreeSet::new(),
            link_writes,
            view: Arc::default(),
            keep_view: true,
            dirty: Dirty::default(),
            timed: BTreeSet::new(),
            deadline_of: HashMap::new(),
            derived_at: None,
            resolved: None,
        }
    }

    /// Keeps no view for reconcilers: they read the store (one that
    /// reads in process, see [`Store::reads_in_process`]).
    pub fn without_view(mut self) -> Self {
        self.keep_view = false;
        self
    }

    /// The rows as reconcilers read them.
    pub fn view(&self) -> Arc<DesiredView> {
        self.view.clone()
    }

    /// The next look reads everything again, the clock included.
    pub fn invalidate(&mut self) {
        self.view.forget();
        self.rows = None;
        self.clock.forget();
        self.stale.clear();
        self.resolved = None;
        self.timed.clear();
        self.deadline_of.clear();
    }

    /// The database's time in Unix seconds, never ahead of it (see
    /// [`DbClock`]) and never behind the last derivation's.
    pub async fn now(&mut self, store: &dyn Store) -> Result<i64, StoreError> {
        let now = self.clock.now(store).await?;
        Ok(self.derived_at.map_or(now, |t| now.max(t)))
    }

    /// The rows, as of the last [`Self::refresh`].
    pub fn rows(&self) -> Option<&Rows> {
        self.rows.as_ref()
    }

    /// What the next derivation must look at.
    pub fn dirty(&self) -> &Dirty {
        &self.dirty
    }

    /// Brings the rows up to date for a batch that signalled `nodes`.
    /// Nothing is kept of a refresh that failed.
    pub async fn refresh(&mut self, store: &dyn Store, nodes: &[String]) -> Result<(), StoreError> {
        let written = self.link_writes.take();
        if self.rows.is_none() {
            self.stale.clear();
            let (rows, routes) = Rows::load_with_routes(store).await?;
            if self.keep_view {
                self.view.rebuild(&rows.links, &routes);
            }
            self.loaded(rows);
            return Ok(());
        }
        let mut ids = std::mem::take(&mut self.stale);
        ids.extend(nodes.iter().filter(|n| !n.is_empty()).cloned());
        if ids.is_empty() && written.is_empty() {
            return Ok(());
        }
        let wanted: Vec<String> = ids.iter().cloned().collect();
        let read = tokio::try_join!(
            store.get_nodes(&wanted),
            store.templates_of(&wanted),
            store.link_states(&written)
        );
        let (mut fresh_nodes, mut fresh_templates, states) = self.unless_failed(read)?;
        let unknown = self.merge_link_states(&written, states);
        if !unknown.is_empty() {
            let read = store.get_links(&unknown).await;
            let links = self.unless_failed(read)?;
            self.merge_links(&unknown, links);
        }
        // A claim is made under the sessions its rows hold, so the source
        // of every claim read must be read in the same snapshot or a later
        // one: a claim fact comes from a connection the source dialed
        // under a session it had registered by then. Claimed under an
        // older generation, the link would look outdated once the source's
        // own signal arrived, with its claim fact already spent. A source
        // read anew can hold claims of its own, so the set grows until it
        // holds every source of its claims, and each round reads the whole
        // set's records at once. Templates say nothing of claims: those
        // of the sources added are read beside their records, each once
        // (a read after the loop was one more wait in every claim's
        // derivation).
        loop {
            let sources = self.claimed_sources(&ids, &fresh_nodes);
            if sources.is_empty() {
                break;
            }
            ids.extend(sources.iter().cloned());
            let wanted: Vec<String> = ids.iter().cloned().collect();
            let read = tokio::try_join!(store.get_nodes(&wanted), store.templates_of(&sources));
            let (nodes, templates) = self.unless_failed(read)?;
            fresh_nodes = nodes;
            fresh_templates.extend(templates);
        }
        let ids: Vec<String> = ids.into_iter().collect();
        self.merge_nodes(&ids, fresh_nodes, fresh_templates);
        Ok(())
    }

    /// `read`'s rows; after an error, the next refresh reads everything.
    fn unless_failed<T>(&mut self, read: Result<T, StoreError>) -> Result<T, StoreError> {
        if read.is_err() {
            self.invalidate();
        }
        read
    }

    /// The sources, other than those `read`, of the links that `fresh`
    /// records claim.
    fn claimed_sources(&self, read: &BTreeSet<String>, fresh: &[NodeRecord]) -> Vec<String> {
        let claimed: BTreeSet<&str> = fresh.iter().flat_map(NodeRecord::claimed_links).collect();
        let Some(rows) = self.rows.as_ref().filter(|_| !claimed.is_empty()) else {
            return Vec::new();
        };
        let sources: BTreeSet<&str> = rows
            .links
            .iter()
            .filter(|l| claimed.contains(l.link_id.as_str()))
            .map(|l| l.source_node.as_str())
            .filter(|s| !read.contains(*s))
            .collect();
        sources.into_iter().map(str::to_string).collect()
    }

    fn loaded(&mut self, rows: Rows) {
        self.timed.clear();
        self.deadline_of.clear();
        let nodes: Vec<String> = rows.nodes.iter().map(|n| n.id.clone()).collect();
        self.rows = Some(rows);
        nodes.iter().for_each(|n| self.judge_time(n));
        self.dirty.full = true;
    }

    /// Replaces the records and templates of `ids` with `fresh` ones.
    fn merge_nodes(&mut self, ids: &[String], fresh: Vec<NodeRecord>, templates: Vec<Template>) {
        let Some(rows) = self.rows.as_mut() else {
            return;
        };
        let mut fresh_templates: HashMap<String, Vec<Template>> = HashMap::new();
        for t in templates {
            fresh_templates.entry(t.node.clone()).or_default().push(t);
        }
        let mut fresh: HashMap<String, _> = fresh.into_iter().map(|n| (n.id.clone(), n)).collect();
        for id in ids {
            let old = rows.nodes.remove(id);
            let new = fresh.remove(id);
            let groups = [&old, &new]
                .into_iter()
                .flatten()
                .filter_map(|n| n.group.clone());
            self.dirty.groups.extend(groups);
            if let Some(n) = new {
                rows.nodes.upsert(n);
            }
            let announced = fresh_templates.remove(id).unwrap_or_default();
            self.dirty
                .names
                .extend(rows.templates.replace(id, announced));
            self.dirty.nodes.insert(id.clone());
        }
        ids.iter().for_each(|id| self.judge_time(id));
    }

    /// Brings the links named in `ids` to their `fresh` states (a link
    /// missing from them is gone). A reconciler changes nothing else of a
    /// link, so the rest of the row is this state's own. Returns the ids
    /// this state does not hold but the store does: they are read whole.
    fn merge_link_states(&mut self, ids: &[String], fresh: Vec<LinkState>) -> Vec<String> {
        let Some(rows) = self.rows.as_mut() else {
            return Vec::new();
        };
        let mut fresh: HashMap<String, LinkState> =
            fresh.into_iter().map(|s| (s.link_id.clone(), s)).collect();
        let gone: Vec<String> = (ids.iter())
            .filter(|id| !fresh.contains_key(*id))
            .cloned()
            .collect();
        self.view.restated(ids, &gone);
        let asked: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
        rows.links.retain_mut(|l| {
            if !asked.contains(l.link_id.as_str()) {
                return true;
            }
            self.dirty
                .pairs
                .insert(edge(&l.source_group, &l.dest_group));
            let Some(state) = fresh.remove(&l.link_id) else {
                return false;
            };
            l.status = state.status;
            l.status_msg = state.status_msg;
            l.updated_at = state.updated_at;
            true
        });
        let mut unknown: Vec<String> = fresh.into_keys().collect();
        unknown.sort();
        unknown
    }

    /// Replaces the links named in `ids` with their `fresh` versions.
    fn merge_links(&mut self, ids: &[String], fresh: Vec<Link>) {
        let Some(rows) = self.rows.as_mut() else {
            return;
        };
        let asked: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
        for l in rows
            .links
            .iter()
            .filter(|l| asked.contains(l.link_id.as_str()))
        {
            self.dirty
                .pairs
                .insert(edge(&l.source_group, &l.dest_group));
        }
        rows.links.retain(|l| !asked.contains(l.link_id.as_str()));
        self.view.reread(ids, &fresh);
        for l in &fresh {
            self.dirty
                .pairs
                .insert(edge(&l.source_group, &l.dest_group));
        }
        upsert_all_by(&mut rows.links, fresh, |x| x.link_id.as_str());
    }

    /// Notes when time alone will judge `node` anew, if it will.
    fn judge_time(&mut self, node: &str) {
        if let Some(at) = self.deadline_of.remove(node) {
            self.timed.remove(&(at, node.to_string()));
        }
        let Some(rows) = self.rows.as_ref() else {
            return;
        };
        let Some(record) = rows.nodes.get(node) else {
            return;
        };
        let generations = rows.templates.of(node).iter().map(|t| t.generation);
        if let Some(at) = judged_again_at(record, generations) {
            self.timed.insert((at, node.to_string()));
            self.deadline_of.insert(node.to_string(), at);
        }
    }

    /// Makes ready for a derivation at `now` on the topology of `mode`
    /// and `segments`: the nodes whose deadlines passed are dirty, and a
    /// topology other than the last one's makes everything dirty. Returns
    /// the topology's graphs.
    pub fn prepare(
        &mut self,
        mode: &crate::config::TopologyConfig,
        segments: Vec<Segment>,
        now: i64,
    ) -> Result<&[SegmentGraph], StoreError> {
        let rows = self.rows.as_ref().ok_or_else(not_loaded)?;
        let due: Vec<(i64, String)> = self
            .timed
            .iter()
            .take_while(|(at, _)| *at <= now)
            .cloned()
            .collect();
        for (at, node) in due {
            self.timed.remove(&(at, node.clone()));
            self.deadline_of.remove(&node);
            let names = rows.templates.of(&node).iter().map(|t| t.name.clone());
            self.dirty.names.extend(names);
            self.dirty
                .groups
                .extend(rows.nodes.get(&node).and_then(|n| n.group.clone()));
            self.dirty.nodes.insert(node);
        }
        let active = rows.nodes.active_groups(now);
        let same = self
            .resolved
            .as_ref()
            .is_some_and(|r| r.active == active && r.segments == segments);
        if !same {
            let groups = &active;
            let graphs = crate::routing::topology::resolve(mode, &segments, groups);
            self.dirty.full |= self
                .resolved
                .as_ref()
                .is_none_or(|r| r.graphs != graphs || r.active != active);
            self.resolved = Some(Resolved {
                active,
                segments,
                graphs,
                trees: Trees::default(),
            });
        }
        Ok(self.resolved.as_ref().map_or(&[], |r| r.graphs.as_slice()))
    }

    /// The active groups the last [`Self::prepare`] found.
    pub fn active(&self) -> Option<&BTreeSet<String>> {
        self.resolved.as_ref().map(|r| &r.active)
    }

    /// The graphs the last [`Self::prepare`] resolved.
    pub fn graphs(&self) -> &[SegmentGraph] {
        self.resolved.as_ref().map_or(&[], |r| r.graphs.as_slice())
    }

    /// The trees grown on the last [`Self::prepare`]'s topology.
    pub fn trees(&self) -> Option<&Trees> {
        self.resolved.as_ref().map(|r| &r.trees)
    }

    /// Seconds from `now` until the first deadline after it.
    pub fn next_deadline(&self, now: i64) -> Option<i64> {
        let next = self
            .timed
            .range((now.saturating_add(1), String::new())..)
            .next();
        next.map(|(at, _)| at - now)
    }

    /// A derivation at `now` was planned and written: nothing is dirty.
    pub fn derived(&mut self, now: i64) {
        self.dirty = Dirty::default();
        self.derived_at = Some(now);
    }

    /// Marks `node` as changed by this leader: re-read at the next refresh.
    pub fn touched(&mut self, node: &str) {
        self.stale.insert(node.to_string());
    }

    /// Writes `changes` and keeps the rows in step. After an error the
    /// rows cannot tell whether the write happened: the next refresh
    /// reads everything again.
    pub async fn write(
        &mut self,
        store: &dyn Store,
        mut changes: ChangeSet,
    ) -> Result<(), StoreError> {
        changes.fresh = self.fresh(&changes);
        let changes = Arc::new(changes);
        // Applied to the rows and the view while the store writes (undone
        // by the reload if the write fails): on Postgres the write of a
        // claim's 4,000 routes used to start 8-14 ms later, after this.
        // Before the write commits a reconcile may read a node's rows as
        // they were, as it could have just before the write; the node is
        // looked at again once the derivation is written. The in-memory
        // store writes as it is called, and is handed the change set once
        // it is the only holder, so that it takes the rows, not copies.
        let written = if store.reads_in_process() {
            self.begin_write(&changes);
            store.apply_shared(changes).await
        } else {
            // Biased: the write is polled first, which starts its task;
            // only then does the leader apply the change set to its copies.
            let write = store.apply_shared(changes.clone());
            let (written, ()) = tokio::join!(biased; write, async { self.begin_write(&changes) });
            written
        };
        match written {
            Ok(()) => self.view.write_ended(),
            Err(_) => self.invalidate(),
        }
        written
    }

    fn begin_write(&mut self, changes: &ChangeSet) {
        self.view.write_begins(changes);
        self.applied(changes);
    }

    /// The puts of rows the working state does not hold; none before it
    /// is loaded.
    fn fresh(&self, changes: &ChangeSet) -> Fresh {
        let Some(rows) = self.rows.as_ref() else {
            return Fresh::default();
        };
        let held = |id: &str| {
            rows.links
                .binary_search_by(|l| l.link_id.as_str().cmp(id))
                .is_ok()
        };
        let links = changes.put_links.iter().map(|l| &l.link_id);
        let routes = changes.put_routes.iter().map(|r| &r.id);
        Fresh {
            links: links.filter(|id| !held(id)).cloned().collect(),
            routes: routes
                .filter(|id| rows.routes.get(id).is_none())
                .cloned()
                .collect(),
        }
    }

    /// Applies a change set the store accepted. Conditional deletions (a
    /// retired link) and consumed claims are re-read rather than judged
    /// here: the store decides them.
    fn applied(&mut self, changes: &ChangeSet) {
        let Some(rows) = self.rows.as_mut() else {
            return;
        };
        upsert_all_by(&mut rows.links, changes.put_links.iter().cloned(), |x| {
            x.link_id.as_str()
        });
        let gone: BTreeSet<&str> = changes.delete_links.iter().map(String::as_str).collect();
        rows.links.retain(|l| !gone.contains(l.link_id.as_str()));
        let retired = changes.retire_links.iter().map(|r| &r.link_id);
        self.link_writes.wrote(retired);
        for r in &changes.put_routes {
            rows.routes.insert(r);
        }
        for id in &changes.delete_routes {
            rows.routes.remove(id);
        }
        for (node, _) in &changes.consume_claims {
            self.stale.insert(node.clone());
        }
    }
}

fn not_loaded() -> StoreError {
    StoreError::Unavailable("the leader's working state was not loaded".into())
}

/// Puts `items` in their places in `sorted` (ordered by `key`), each
/// replacing one with the same key; of two with one key the later wins.
/// The new ones are sorted in once: inserted one by one, the first
/// derivation's 1,225 links shifted the vector's tail at each insert.
fn upsert_all_by<T>(
    sorted: &mut Vec<T>,
    items: impl IntoIterator<Item = T>,
    key: impl Fn(&T) -> &str,
) {
    let held = sorted.len();
    for item in items {
        match sorted[..held].binary_search_by(|x| key(x).cmp(key(&item))) {
            Ok(i) => sorted[i] = item,
            Err(_) => sorted.push(item),
        }
    }
    if sorted.len() == held {
        return;
    }
    // Stable: among new items of one key the last pushed ends last, and
    // `dedup` keeps the first of a run, so the run is reversed first.
    sorted[held..].reverse();
    sorted.sort_by(|a, b| key(a).cmp(key(b)));
    sorted.dedup_by(|a, b| key(a) == key(b));
}

#[cfg(test)]
mod tests {
    use super::upsert_all_by;

    fn upserted(
        held: &[(&'static str, u8)],
        items: &[(&'static str, u8)],
    ) -> Vec<(&'static str, u8)> {
        let mut sorted = held.to_vec();
        upsert_all_by(&mut sorted, items.iter().copied(), |x| x.0);
        sorted
    }

    #[test]
    fn held_keys_are_replaced_in_place_and_new_ones_sorted_in() {
        let out = upserted(&[("b", 1), ("d", 1)], &[("c", 2), ("d", 2), ("a", 2)]);
        assert_eq!(out, [("a", 2), ("b", 1), ("c", 2), ("d", 2)]);
    }

    #[test]
    fn of_two_items_with_one_key_the_later_wins() {
        let out = upserted(
            &[("b", 1)],
            &[("c", 1), ("b", 2), ("c", 2), ("b", 3), ("c", 3)],
        );
        assert_eq!(out, [("b", 3), ("c", 3)]);
        assert_eq!(upserted(&[], &[("a", 1), ("a", 2)]), [("a", 2)]);
    }
}
