//! The in-memory backend: one replica, state lost on restart (like the
//! reference control plane's default). All state sits behind one mutex held
//! only for the few map operations of a call, never across an await.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use uuid::Uuid;

use super::indexed::{ByNode, Indexed};
use super::model::{
    Departure, DepartureKind, DesiredState, Domain, Link, LinkAnswer, LinkStatus, Name, NodeRecord,
    Registration, ReplicaRef, Route, RouteMark, Segment, Session, SessionState, Template, edge,
};
use super::{ChangeSet, SessionStart, Store, StoreError};
use crate::clock::unix_now;

#[derive(Default)]
struct State {
    nodes: BTreeMap<String, NodeRecord>,
    /// Keyed by (node, name) so a node's templates are one range.
    templates: BTreeMap<(String, Name), Template>,
    links: Indexed<Link>,
    routes: Indexed<Route>,
    segments: BTreeMap<String, BTreeSet<(String, String)>>,
    /// Domain name to sealed secret.
    domains: BTreeMap<String, Vec<u8>>,
    /// Last generation and template sequence issued.
    generation: u64,
    seq: u64,
}

impl State {
    /// The node's record if `session` is its current session.
    fn current(&mut self, node: &str, session: Uuid) -> Result<&mut NodeRecord, StoreError> {
        match self.nodes.get_mut(node) {
            Some(rec) if rec.session.as_ref().is_some_and(|s| s.id == session) => Ok(rec),
            _ => Err(StoreError::StaleSession {
                node: node.to_string(),
                session,
            }),
        }
    }

    fn segment(&mut self, name: &str) -> Result<&mut BTreeSet<(String, String)>, StoreError> {
        self.segments
            .get_mut(name)
            .ok_or_else(|| StoreError::SegmentNotFound(name.to_string()))
    }
}

/// The memory store. Cheap to share behind an `Arc`.
/// The live links `node` is the source of, and its routes over them.
fn desired_of(st: &State, node: &str) -> DesiredState {
    let links: Vec<Link> = st
        .links
        .of_node(node)
        .filter(|l| l.source_node == node && !l.deleted)
        .cloned()
        .collect();
    let routes = st
        .routes
        .of_node(node)
        .filter(|r| r.source_node == node && !r.is_deleted())
        .filter(|r| links.iter().any(|l| l.link_id == r.link_id))
        .cloned()
        .collect();
    DesiredState { links, routes }
}

/// A late registration whose own session is the node's current one: an
/// earlier attempt of it was recorded after all (its answer was lost), so
/// it is recorded and starts nothing new.
fn already_started(st: &State, registration: &Registration) -> Option<SessionStart> {
    registration.stale_after?;
    let rec = st.nodes.get(&registration.node_id)?;
    let session = rec.session.clone()?;
    (session.id == registration.session_id).then(|| SessionStart {
        session,
        replaced: None,
        desired: desired_of(st, &registration.node_id),
    })
}

#[derive(Default)]
pub struct MemoryStore {
    state: Mutex<State>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied change:
        // every method validates before it mutates. Keep serving.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn new_record(registration: &Registration) -> NodeRecord {
    NodeRecord {
        id: registration.node_id.clone(),
        group: None,
        connection_details: Vec::new(),
        reported_connections: Vec::new(),
        reported_routes: Vec::new(),
        revision: registration.revision,
        received_links: Vec::new(),
        session: None,
        generation: 0,
        departure: None,
        updated_at: 0,
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn reads_in_process(&self) -> bool {
        true
    }

    async fn begin_session(
        &self,
        registration: Registration,
        owner: ReplicaRef,
    ) -> Result<SessionStart, StoreError> {
        let mut st = self.lock();
        let latest = st
            .nodes
            .get(&registration.node_id)
            .map_or(0, |r| r.generation);
        if let Some(started) = already_started(&st, &registration) {
            return Ok(started);
        }
        if registration.stale_after.is_some_and(|g| latest > g) {
            return Err(StoreError::StaleSession {
                node: registration.node_id,
                session: registration.session_id,
            });
        }
        st.generation += 1;
        let generation = st.generation;
        let rec = st
            .nodes
            .entry(registration.node_id.clone())
            .or_insert_with(|| new_record(&registration));
        let session = Session {
            id: chosen_or_new(registration.session_id),
            generation,
            owner,
            state: SessionState::Registering,
        };
        let replaced = rec.session.replace(session.clone());
        rec.group = registration.group;
        rec.connection_details = registration.connection_details;
        rec.reported_connections = registration.reported_connections;
        rec.reported_routes = registration.reported_routes;
        rec.revision = registration.revision;
        rec.received_links.clear();
        rec.generation = generation;
        rec.departure = None;
        rec.updated_at = unix_now();
        let desired = desired_of(&st, &registration.node_id);
        Ok(SessionStart {
            session,
            replaced,
            desired,
        })
    }

    async fn mark_ready(&self, node: &str, session: Uuid) -> Result<bool, StoreError> {
        let mut st = self.lock();
        let Ok(rec) = st.current(node, session) else {
            return Ok(false);
        };
        if let Some(s) = rec.session.as_mut() {
            s.state = SessionState::Ready;
        }
        rec.updated_at = unix_now();
        Ok(true)
    }

    async fn end_session(
        &self,
        node: &str,
        session: Uuid,
        kind: DepartureKind,
    ) -> Result<bool, StoreError> {
        let mut st = self.lock();
        let Ok(rec) = st.current(node, session) else {
            return Ok(false);
        };
        let generation = rec.session.take().map_or(rec.generation, |s| s.generation);
        rec.departure = Some(Departure { generation, kind });
        rec.received_links.clear();
        rec.updated_at = unix_now();
        Ok(true)
    }

    async fn record_announcements(
        &self,
        node: &str,
        session: Uuid,
        set: &[Name],
        withdraw: &[Name],
    ) -> Result<(), StoreError> {
        let mut st = self.lock();
        let generation = st.current(node, session)?.generation;
        for name in withdraw {
            st.templates.remove(&(node.to_string(), name.clone()));
        }
        for name in set {
            let key = (node.to_string(), name.clone());
            if let Some(t) = st.templates.get_mut(&key) {
                t.generation = generation;
                t.updated_at = unix_now();
                continue;
            }
            st.seq += 1;
            let template = Template {
                name: name.clone(),
                node: node.to_string(),
                generation,
                seq: st.seq,
                updated_at: unix_now(),
            };
            st.templates.insert(key, template);
        }
        Ok(())
    }

    async fn record_received(
        &self,
        node: &str,
        session: Uuid,
        link_ids: &[String],
    ) -> Result<(), StoreError> {
        let mut st = self.lock();
        let rec = st.current(node, session)?;
        for id in link_ids {
            if !rec.received_links.contains(id) {
                rec.received_links.push(id.clone());
            }
        }
        rec.updated_at = unix_now();
        Ok(())
    }

    async fn now(&self) -> Result<i64, StoreError> {
        // One process: its clock is the one every stamp here was taken with.
        Ok(unix_now())
    }

    async fn now_millis(&self) -> Result<i64, StoreError> {
        Ok(crate::clock::unix_now_millis())
    }

    async fn get_node(&self, node: &str) -> Result<Option<NodeRecord>, StoreError> {
        Ok(self.lock().nodes.get(node).cloned())
    }

    async fn list_nodes(&self) -> Result<Vec<NodeRecord>, StoreError> {
        Ok(self.lock().nodes.values().cloned().collect())
    }

    async fn get_nodes(&self, ids: &[String]) -> Result<Vec<NodeRecord>, StoreError> {
        let st = self.lock();
        Ok(picked(ids, |id| st.nodes.get(id)))
    }

    async fn forget_node(&self, node: &str, generation: u64) -> Result<bool, StoreError> {
        let mut st = self.lock();
        let forgettable = st
            .nodes
            .get(node)
            .is_some_and(|r| r.session.is_none() && r.generation == generation);
        if forgettable {
            st.nodes.remove(node);
        }
        Ok(forgettable)
    }

    async fn list_templates(&self) -> Result<Vec<Template>, StoreError> {
        let mut all: Vec<Template> = self.lock().templates.values().cloned().collect();
        all.sort_by_key(|t| t.seq);
        Ok(all)
    }

    async fn templates_of(&self, nodes: &[String]) -> Result<Vec<Template>, StoreError> {
        let wanted: BTreeSet<&str> = nodes.iter().map(String::as_str).collect();
        let mut some: Vec<Template> = self
            .lock()
            .templates
            .values()
            .filter(|t| wanted.contains(t.node.as_str()))
            .cloned()
            .collect();
        some.sort_by_key(|t| t.seq);
        Ok(some)
    }

    async fn drop_templates_before(
        &self,
        node: &str,
        generation: u64,
    ) -> Result<usize, StoreError> {
        let mut st = self.lock();
        let before = st.templates.len();
        st.templates
            .retain(|(n, _), t| n != node || t.generation >= generation);
        Ok(before - st.templates.len())
    }

    async fn put_link(&self, link: Link) -> Result<(), StoreError> {
        (self.lock().links).change_checked(vec![link], &[], one_live_link_per_pair)
    }

    async fn delete_link(&self, link_id: &str) -> Result<bool, StoreError> {
        Ok(self.lock().links.remove(link_id).is_some())
    }

    async fn list_links(&self) -> Result<Vec<Link>, StoreError> {
        Ok(self.lock().links.values().cloned().collect())
    }

    async fn get_links(&self, ids: &[String]) -> Result<Vec<Link>, StoreError> {
        let st = self.lock();
        Ok(picked(ids, |id| st.links.get(id)))
    }

    async fn put_route(&self, route: Route) -> Result<(), StoreError> {
        self.lock().routes.insert(route);
        Ok(())
    }

    async fn delete_route(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self.lock().routes.remove(id).is_some())
    }

    async fn list_routes(&self) -> Result<Vec<Route>, StoreError> {
        Ok(self.lock().routes.values().cloned().collect())
    }

    async fn desired_for_node(&self, node: &str) -> Result<DesiredState, StoreError> {
        Ok(desired_of(&self.lock(), node))
    }

    async fn list_segments(&self) -> Result<Vec<Segment>, StoreError> {
        let st = self.lock();
        Ok(st
            .segments
            .iter()
            .map(|(name, edges)| Segment {
                name: name.clone(),
                edges: edges.iter().cloned().collect(),
            })
            .collect())
    }

    async fn add_segment(&self, name: &str) -> Result<bool, StoreError> {
        let mut st = self.lock();
        if st.segments.contains_key(name) {
            return Ok(false);
        }
        st.segments.insert(name.to_string(), BTreeSet::new());
        Ok(true)
    }

    async fn remove_segment(&self, name: &str) -> Result<bool, StoreError> {
        Ok(self.lock().segments.remove(name).is_some())
    }

    async fn add_segment_edge(&self, segment: &str, a: &str, b: &str) -> Result<bool, StoreError> {
        Ok(self.lock().segment(segment)?.insert(edge(a, b)))
    }

    async fn remove_segment_edge(
        &self,
        segment: &str,
        a: &str,
        b: &str,
    ) -> Result<bool, StoreError> {
        Ok(self.lock().segment(segment)?.remove(&edge(a, b)))
    }

    async fn list_domains(&self) -> Result<Vec<Domain>, StoreError> {
        let st = self.lock();
        Ok(st
            .domains
            .iter()
            .map(|(name, sealed)| Domain {
                name: name.clone(),
                sealed: sealed.clone(),
            })
            .collect())
    }

    async fn put_domain(&self, domain: Domain) -> Result<bool, StoreError> {
        let mut st = self.lock();
        Ok(st.domains.insert(domain.name, domain.sealed).is_none())
    }

    async fn remove_domain(&self, name: &str) -> Result<bool, StoreError> {
        Ok(self.lock().domains.remove(name).is_some())
    }

    async fn apply_shared(&self, changes: Arc<ChangeSet>) -> Result<(), StoreError> {
        let changes = Arc::unwrap_or_clone(changes);
        let mut guard = self.lock();
        let st = &mut *guard;
        // Links first: a batch that breaks the pair rule must leave
        // everything as it was.
        let mut removes = changes.delete_links;
        removes.extend(
            (changes.retire_links.iter())
                .filter(|r| still_away(st.nodes.get(&r.source), r.source_generation))
                .map(|r| r.link_id.clone()),
        );
        (st.links).change_checked(changes.put_links, &removes, one_live_link_per_pair)?;
        for r in changes.put_routes {
            st.routes.insert(r);
        }
        for id in &changes.delete_routes {
            st.routes.remove(id);
        }
        for (node, link_id) in &changes.consume_claims {
            if let Some(rec) = st.nodes.get_mut(node) {
                rec.received_links.retain(|l| l != link_id);
                rec.reported_connections
                    .retain(|c| !(c.incoming && &c.link_id == link_id));
            }
        }
        Ok(())
    }

    async fn links_touching(&self, node: &str) -> Result<Vec<Link>, StoreError> {
        let st = self.lock();
        Ok(st
            .links
            .of_node(node)
            .filter(|l| l.source_node == node || l.dest_node.as_deref() == Some(node))
            .cloned()
            .collect())
    }

    async fn routes_sourced(&self, node: &str) -> Result<Vec<Route>, StoreError> {
        let st = self.lock();
        Ok(st
            .routes
            .of_node(node)
            .filter(|r| r.source_node == node)
            .cloned()
            .collect())
    }

    async fn mark_links_sent(
        &self,
        source: &str,
        answers: &[LinkAnswer],
    ) -> Result<usize, StoreError> {
        let mut st = self.lock();
        let mut found = BTreeSet::new();
        for a in answers {
            let answered = st.links.update(&a.link_id, |l| {
                if l.deleted || l.source_node != source {
                    return false;
                }
                let next = sent_status(l.status, a.ok);
                if next != l.status || l.status_msg != a.message {
                    l.status = next;
                    l.status_msg.clone_from(&a.message);
                    l.updated_at = unix_now();
                }
                true
            });
            if answered == Some(true) {
                found.insert(a.link_id.as_str());
            }
        }
        Ok(found.len())
    }

    async fn mark_routes(&self, marks: &[RouteMark]) -> Result<usize, StoreError> {
        let mut st = self.lock();
        let mut found = BTreeSet::new();
        for m in marks {
            let marked = st.routes.update(&m.id, |r| {
                if r.status != m.status || r.status_msg != m.message {
                    r.status = m.status;
                    r.status_msg.clone_from(&m.message);
                    r.updated_at = unix_now();
                }
            });
            if marked.is_some() {
                found.insert(m.id.as_str());
            }
        }
        Ok(found.len())
    }

    async fn end_earlier_incarnations(
        &self,
        replica: &ReplicaRef,
    ) -> Result<Vec<String>, StoreError> {
        let mut st = self.lock();
        let mut ended = Vec::new();
        for rec in st.nodes.values_mut() {
            let stale = rec.session.as_ref().is_some_and(|s| {
                s.owner.id == replica.id && s.owner.incarnation < replica.incarnation
            });
            if let Some(s) = rec.session.take_if(|_| stale) {
                rec.departure = Some(Departure {
                    generation: s.generation,
                    kind: DepartureKind::Crash,
                });
                rec.received_links.clear();
                rec.updated_at = unix_now();
                ended.push(rec.id.clone());
            }
        }
        Ok(ended)
    }
}

/// Whether a retired link's source is still away (see `Store::apply`).
pub fn still_away(source: Option<&NodeRecord>, generation: u64) -> bool {
    source.is_none_or(|n| n.session.is_none() && n.generation <= generation)
}

/// The session id the owner chose, or a fresh one.
pub fn chosen_or_new(id: Uuid) -> Uuid {
    if id.is_nil() { Uuid::new_v4() } else { id }
}

/// The rows `get` finds for `ids`, in id order, each once.
fn picked<'a, T: Clone + 'a>(ids: &[String], get: impl Fn(&str) -> Option<&'a T>) -> Vec<T> {
    let wanted: BTreeSet<&String> = ids.iter().collect();
    wanted
        .into_iter()
        .filter_map(|id| get(id).cloned())
        .collect()
}

/// At most one live link per unordered group pair.
fn one_live_link_per_pair(links: &Indexed<Link>) -> Result<(), StoreError> {
    let mut seen = BTreeSet::new();
    for l in links.values().filter(|l| !l.deleted) {
        if !seen.insert(edge(&l.source_group, &l.dest_group)) {
            return Err(StoreError::Conflict(format!(
                "a live link between {} and {} already exists",
                l.source_group, l.dest_group
            )));
        }
    }
    Ok(())
}

/// The link status after the source answered a creation (see
/// [`Store::mark_link_sent`]); shared by every backend.
pub fn sent_status(current: LinkStatus, ok: bool) -> LinkStatus {
    match (current, ok) {
        (LinkStatus::Applied, _) => LinkStatus::Applied,
        (LinkStatus::Pending | LinkStatus::Failed, true) => LinkStatus::Connecting,
        (LinkStatus::Connecting, true) => LinkStatus::Connecting,
        (_, false) => LinkStatus::Failed,
    }
}

impl ByNode for Link {
    fn id(&self) -> &str {
        &self.link_id
    }

    fn nodes(&self) -> [Option<&str>; 2] {
        [Some(self.source_node.as_str()), self.dest_node.as_deref()]
    }
}

impl ByNode for Route {
    fn id(&self) -> &str {
        &self.id
    }

    fn nodes(&self) -> [Option<&str>; 2] {
        [Some(self.source_node.as_str()), None]
    }
}
