//! The leader's working state: every row a derivation reads, kept between
//! batches so that a batch reads what changed rather than every table.
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
use crate::store::model::{Link, NodeRecord, Route, Template};
use crate::store::{ChangeSet, Store, StoreError};

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

/// The rows of one look, in the orders the store lists them.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Rows {
    /// By id.
    pub nodes: Vec<NodeRecord>,
    /// By `seq`.
    pub templates: Vec<Template>,
    /// By `link_id`, tombstones included.
    pub links: Vec<Link>,
    /// Route id to its source node: all a derivation needs of a stored
    /// route. Hashed: a derivation looks every desired route up here.
    pub routes: HashMap<String, String>,
}

impl Rows {
    /// Every row, read afresh.
    pub async fn load(store: &dyn Store) -> Result<Self, StoreError> {
        let (nodes, templates, links, routes) = tokio::try_join!(
            store.list_nodes(),
            store.list_templates(),
            store.list_links(),
            store.list_routes()
        )?;
        Ok(Self {
            nodes,
            templates,
            links,
            routes: route_sources(routes),
        })
    }
}

fn route_sources(routes: Vec<Route>) -> HashMap<String, String> {
    routes.into_iter().map(|r| (r.id, r.source_node)).collect()
}

pub struct WorkingState {
    rows: Option<Rows>,
    /// The database's clock, extrapolated between readings.
    clock: DbClock,
    /// Nodes whose record or templates this leader changed since it read
    /// them (a consumed claim, dropped announcements).
    stale: BTreeSet<String>,
    link_writes: Arc<LinkWrites>,
}

impl WorkingState {
    pub fn new(link_writes: Arc<LinkWrites>) -> Self {
        Self {
            rows: None,
            clock: DbClock::default(),
            stale: BTreeSet::new(),
            link_writes,
        }
    }

    /// The next look reads everything again, the clock included.
    pub fn invalidate(&mut self) {
        self.rows = None;
        self.clock.forget();
        self.stale.clear();
    }

    /// The database's time in Unix seconds, never ahead of it (see
    /// [`DbClock`]).
    pub async fn now(&mut self, store: &dyn Store) -> Result<i64, StoreError> {
        self.clock.now(store).await
    }

    /// The rows, as of the last [`Self::refresh`].
    pub fn rows(&self) -> Option<&Rows> {
        self.rows.as_ref()
    }

    /// Brings the rows up to date for a batch that signalled `nodes`.
    /// Nothing is kept of a refresh that failed.
    pub async fn refresh(&mut self, store: &dyn Store, nodes: &[String]) -> Result<(), StoreError> {
        let written = self.link_writes.take();
        let Some(rows) = self.rows.as_mut() else {
            self.stale.clear();
            self.rows = Some(Rows::load(store).await?);
            return Ok(());
        };
        let mut ids = std::mem::take(&mut self.stale);
        ids.extend(nodes.iter().filter(|n| !n.is_empty()).cloned());
        let ids: Vec<String> = ids.into_iter().collect();
        let read = async {
            if ids.is_empty() && written.is_empty() {
                return Ok((Vec::new(), Vec::new(), Vec::new()));
            }
            tokio::try_join!(
                store.get_nodes(&ids),
                store.templates_of(&ids),
                store.get_links(&written)
            )
        };
        match read.await {
            Ok((fresh_nodes, fresh_templates, fresh_links)) => {
                merge_by(&mut rows.nodes, &ids, fresh_nodes, |n| n.id.as_str());
                merge_templates(&mut rows.templates, &ids, fresh_templates);
                merge_by(&mut rows.links, &written, fresh_links, |l| {
                    l.link_id.as_str()
                });
                Ok(())
            }
            Err(e) => {
                self.invalidate();
                Err(e)
            }
        }
    }

    /// Marks `node` as changed by this leader: re-read at the next refresh.
    pub fn touched(&mut self, node: &str) {
        self.stale.insert(node.to_string());
    }

    /// Writes `changes` and keeps the rows in step. After an error the
    /// rows cannot tell whether the write happened: the next refresh
    /// reads everything again.
    pub async fn write(&mut self, store: &dyn Store, changes: ChangeSet) -> Result<(), StoreError> {
        match store.apply(changes.clone()).await {
            Ok(()) => {
                self.applied(&changes);
                Ok(())
            }
            Err(e) => {
                self.invalidate();
                Err(e)
            }
        }
    }

    /// Applies a change set the store accepted. Conditional deletions (a
    /// retired link) and consumed claims are re-read rather than judged
    /// here: the store decides them.
    fn applied(&mut self, changes: &ChangeSet) {
        let Some(rows) = self.rows.as_mut() else {
            return;
        };
        for l in &changes.put_links {
            upsert_by(&mut rows.links, l.clone(), |x| x.link_id.as_str());
        }
        let gone: BTreeSet<&str> = changes.delete_links.iter().map(String::as_str).collect();
        rows.links.retain(|l| !gone.contains(l.link_id.as_str()));
        let retired = changes.retire_links.iter().map(|r| &r.link_id);
        self.link_writes.wrote(retired);
        for r in &changes.put_routes {
            rows.routes.insert(r.id.clone(), r.source_node.clone());
        }
        for id in &changes.delete_routes {
            rows.routes.remove(id);
        }
        for (node, _) in &changes.consume_claims {
            self.stale.insert(node.clone());
        }
    }
}

/// Replaces the rows keyed by `ids` with `fresh` (those of `ids` that
/// exist), keeping `sorted` ordered by `key`.
fn merge_by<T>(sorted: &mut Vec<T>, ids: &[String], fresh: Vec<T>, key: impl Fn(&T) -> &str) {
    if ids.is_empty() {
        return;
    }
    let asked: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    sorted.retain(|x| !asked.contains(key(x)));
    for x in fresh {
        upsert_by(sorted, x, &key);
    }
}

fn merge_templates(templates: &mut Vec<Template>, nodes: &[String], fresh: Vec<Template>) {
    if nodes.is_empty() {
        return;
    }
    let asked: BTreeSet<&str> = nodes.iter().map(String::as_str).collect();
    templates.retain(|t| !asked.contains(t.node.as_str()));
    templates.extend(fresh);
    templates.sort_by_key(|t| t.seq);
}

/// Puts `item` in its place in `sorted` (ordered by `key`), replacing one
/// with the same key.
fn upsert_by<T>(sorted: &mut Vec<T>, item: T, key: impl Fn(&T) -> &str) {
    match sorted.binary_search_by(|x| key(x).cmp(key(&item))) {
        Ok(i) => sorted[i] = item,
        Err(i) => sorted.insert(i, item),
    }
}
