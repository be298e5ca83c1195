//! The store: durable facts about nodes and the desired state derived from
//! them. One interface, two backends (memory for a single replica, Postgres
//! for HA), one conformance suite ([`conformance`]) that both must pass.
//!
//! Writers fall in two roles. The replica that owns a node's stream records
//! *facts* (registration, announcements, claims, session end), each guarded by
//! the session id so a replaced session cannot write. The leader writes
//! *derivations* (links, routes, cleanup). Every method documents its contract;
//! the conformance suite checks each clause.

pub mod conformance;
pub mod faults;
mod indexed;
mod memory;
pub mod model;
pub mod postgres;
mod retry;

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use uuid::Uuid;

pub use memory::{MemoryStore, chosen_or_new, sent_status, still_away};
use model::{
    DepartureKind, DesiredState, Domain, Link, Name, NodeRecord, Registration, ReplicaRef, Route,
    Segment, Session, Template,
};
pub use postgres::{PgStore, SetupError};
pub use retry::retry_until;

/// Why a store call failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    /// The session named is no longer the node's current one: the fact
    /// belongs to a replaced or ended session and was not recorded.
    #[error("session {session} of node {node} is not current")]
    StaleSession { node: String, session: Uuid },
    /// No segment of that name.
    #[error("segment {0} not found")]
    SegmentNotFound(String),
    /// The change would break an invariant the store keeps (at most one
    /// live link per unordered group pair); nothing was written.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The backend could not be reached or failed; the call may be retried.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The backend refused the statement itself (a value it cannot hold, a
    /// constraint other than the contract's, an unreadable row): the same
    /// call would fail again, so it must not be retried.
    #[error("store refused the write: {0}")]
    Rejected(String),
    /// A leader's write was refused because another leader has taken over
    /// since (the leadership epoch is no longer `epoch`). The writer must
    /// stop all leader work; retrying cannot succeed.
    #[error("leadership epoch {epoch} was superseded by epoch {current}")]
    Fenced { epoch: u64, current: u64 },
}

/// The result of starting a session.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionStart {
    pub session: Session,
    /// The session this one replaced, if the node was still connected: its
    /// owner must close that stream.
    pub replaced: Option<Session>,
    /// The node's desired state as the session began (what
    /// [`Store::desired_for_node`] would say): the registration's reply,
    /// read in the same transaction so that a registration costs one.
    pub desired: DesiredState,
}

/// A link the leader deletes because its source left, unless the source
/// registered again since the leader looked: that registration's reply may
/// be handing the link to the node at this very moment, and a link deleted
/// under it would leave the node a connection nobody manages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retire {
    pub link_id: String,
    pub source: String,
    /// The source's latest generation when the leader looked (0: no record).
    pub source_generation: u64,
}

/// A batch of derived changes the leader writes at once: links and routes
/// to write or delete, and claim facts it consumed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChangeSet {
    pub put_links: Vec<Link>,
    pub delete_links: Vec<String>,
    /// Deleted only while their source is still away (see [`Retire`]).
    pub retire_links: Vec<Retire>,
    pub put_routes: Vec<Route>,
    pub delete_routes: Vec<String>,
    /// `(node, link_id)`: removed from the node's `received_links` and from
    /// its reported incoming connections.
    pub consume_claims: Vec<(String, String)>,
    /// Which puts the writer believes are of new rows.
    pub fresh: Fresh,
}

/// Ids among a change set's puts that no row held when the writer last
/// looked: a store may insert them without looking for a row to replace
/// (on Postgres a plain insert costs a third less than an upsert). A
/// wrong hint costs time, never the result.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fresh {
    pub links: BTreeSet<String>,
    pub routes: BTreeSet<String>,
}

impl ChangeSet {
    pub fn is_empty(&self) -> bool {
        self.put_links.is_empty()
            && self.delete_links.is_empty()
            && self.retire_links.is_empty()
            && self.put_routes.is_empty()
            && self.delete_routes.is_empty()
            && self.consume_claims.is_empty()
    }
}

/// Storage for nodes, sessions, facts and desired state.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Whether a read costs no more than a look at rows the caller holds
    /// (the in-memory store): the leader then keeps no copy of the links
    /// and routes for its reconcilers (see `reconcile::view`), which would
    /// be a third one in the process.
    fn reads_in_process(&self) -> bool {
        false
    }

    /// Records a registration and starts a new session for it, in state
    /// `Registering`, owned by `owner`, with the registration's
    /// `session_id` (a fresh one if nil). Creates the node record if needed,
    /// otherwise replaces its registration facts. The new session gets a
    /// generation higher than any issued before (store-wide), clears the
    /// node's `received_links` and `departure`, and replaces any current
    /// session, which is returned in `replaced`. With `stale_after: Some(g)`
    /// it is a compare-and-set: if the record's latest generation is above
    /// `g` (the node registered again meanwhile), nothing changes and it
    /// fails with `StaleSession`, unless the node's current session is
    /// this registration's own (an earlier attempt was recorded though its
    /// answer was lost): then that session is returned as it stands, with
    /// nothing replaced.
    async fn begin_session(
        &self,
        registration: Registration,
        owner: ReplicaRef,
    ) -> Result<SessionStart, StoreError>;

    /// Moves `session` to `Ready` if it is still the node's current session.
    /// Returns whether it was current. Idempotent.
    async fn mark_ready(&self, node: &str, session: Uuid) -> Result<bool, StoreError>;

    /// Ends `session` if it is still the node's current session: the node has
    /// no session afterwards and its `departure` records the session's
    /// generation and `kind`. Returns whether it was current; a late end of a
    /// replaced session changes nothing and returns `false`.
    async fn end_session(
        &self,
        node: &str,
        session: Uuid,
        kind: DepartureKind,
    ) -> Result<bool, StoreError>;

    /// Records names the node announced (`set`) and withdrew (`withdraw`) as
    /// templates `* -> node`, tagged with the session's generation. Setting an
    /// announced name again keeps its original `seq`; withdrawing an unknown
    /// name is not an error. Fails with `StaleSession` unless `session` is
    /// current, recording nothing.
    async fn record_announcements(
        &self,
        node: &str,
        session: Uuid,
        set: &[Name],
        withdraw: &[Name],
    ) -> Result<(), StoreError>;

    /// Adds link ids the node reported as received (`connections_received`)
    /// to its `received_links`, without duplicates. Fails with `StaleSession`
    /// unless `session` is current, recording nothing.
    async fn record_received(
        &self,
        node: &str,
        session: Uuid,
        link_ids: &[String],
    ) -> Result<(), StoreError>;

    /// The store's clock, in Unix seconds: the clock its own stamps (a
    /// node's `updated_at`) are written with, so a stamp written before the
    /// call is never later than the result. Decisions about liveness and
    /// grace compare stamps with this, never with a replica's wall clock,
    /// which may be skewed against the database and the other replicas.
    async fn now(&self) -> Result<i64, StoreError>;

    /// The same clock in Unix milliseconds, never later than the moment
    /// the call returns (see [`crate::reconcile::db_clock`], which
    /// extrapolates from it). Floored to the second unless the store
    /// knows better.
    async fn now_millis(&self) -> Result<i64, StoreError> {
        Ok(self.now().await?.saturating_mul(1000))
    }

    /// The node's record, if any.
    async fn get_node(&self, node: &str) -> Result<Option<NodeRecord>, StoreError>;

    /// Every node record, ordered by id.
    async fn list_nodes(&self) -> Result<Vec<NodeRecord>, StoreError>;

    /// The records of the nodes named in `ids` that exist, ordered by id
    /// (each once, whatever `ids` repeats).
    async fn get_nodes(&self, ids: &[String]) -> Result<Vec<NodeRecord>, StoreError>;

    /// The current sessions of the nodes named in `ids` that have one, by
    /// node id in id order: where each is connected, without the rest of
    /// its record (every reconcile in a cluster asks this first).
    async fn sessions_of(&self, ids: &[String]) -> Result<Vec<(String, Session)>, StoreError> {
        let records = self.get_nodes(ids).await?;
        Ok(records
            .into_iter()
            .filter_map(|r| Some((r.id, r.session?)))
            .collect())
    }

    /// Deletes the node's record if it has no session and its latest
    /// generation is still `generation` (nobody re-registered meanwhile).
    /// Templates, links and routes are not touched. Returns whether it deleted.
    async fn forget_node(&self, node: &str, generation: u64) -> Result<bool, StoreError>;

    /// Every template, ordered by `seq` (oldest first).
    async fn list_templates(&self) -> Result<Vec<Template>, StoreError>;

    /// The templates of the nodes named in `nodes`, ordered by `seq`.
    async fn templates_of(&self, nodes: &[String]) -> Result<Vec<Template>, StoreError>;

    /// Deletes the node's templates whose generation is lower than
    /// `generation` (`u64::MAX` deletes them all). Returns how many went.
    async fn drop_templates_before(&self, node: &str, generation: u64)
    -> Result<usize, StoreError>;

    /// Inserts or replaces the link with the same `link_id`. At most one
    /// live (not deleted) link exists per unordered group pair: a put that
    /// would make a second fails with `Conflict`.
    async fn put_link(&self, link: Link) -> Result<(), StoreError>;

    /// Deletes the link for good. Returns whether it existed.
    async fn delete_link(&self, link_id: &str) -> Result<bool, StoreError>;

    /// Every link, deleted ones included, ordered by `link_id`.
    async fn list_links(&self) -> Result<Vec<Link>, StoreError>;

    /// The links named in `ids` that exist, deleted ones included, ordered
    /// by `link_id` (each once).
    async fn get_links(&self, ids: &[String]) -> Result<Vec<Link>, StoreError>;

    /// The status part ([`model::LinkState`]) of the links named in `ids`
    /// that exist, ordered by `link_id` (each once): what a reconciler's
    /// write can have changed, without the configuration.
    async fn link_states(&self, ids: &[String]) -> Result<Vec<model::LinkState>, StoreError> {
        let links = self.get_links(ids).await?;
        Ok(links.iter().map(model::LinkState::from).collect())
    }

    /// Inserts or replaces the route with the same `id`.
    async fn put_route(&self, route: Route) -> Result<(), StoreError>;

    /// Deletes the route for good. Returns whether it existed.
    async fn delete_route(&self, id: &str) -> Result<bool, StoreError>;

    /// Every route, ordered by `id`.
    async fn list_routes(&self) -> Result<Vec<Route>, StoreError>;

    /// What the node should hold: the links it sources that are not deleted,
    /// and the routes it sources that are not deleted and whose link is among
    /// those links.
    async fn desired_for_node(&self, node: &str) -> Result<DesiredState, StoreError>;

    /// Every API-mode segment with its edges, ordered by name (edges sorted).
    async fn list_segments(&self) -> Result<Vec<Segment>, StoreError>;

    /// Creates an empty segment. Returns false if it already existed (its
    /// edges are kept).
    async fn add_segment(&self, name: &str) -> Result<bool, StoreError>;

    /// Deletes a segment and its edges. Returns whether it existed.
    async fn remove_segment(&self, name: &str) -> Result<bool, StoreError>;

    /// Adds the undirected edge `a`–`b` to a segment (`b`–`a` is the same
    /// edge). Returns false if it was already there. Fails with
    /// `SegmentNotFound` if the segment does not exist.
    async fn add_segment_edge(&self, segment: &str, a: &str, b: &str) -> Result<bool, StoreError>;

    /// Removes the undirected edge `a`–`b`. Returns whether it was there.
    /// Fails with `SegmentNotFound` if the segment does not exist.
    async fn remove_segment_edge(
        &self,
        segment: &str,
        a: &str,
        b: &str,
    ) -> Result<bool, StoreError>;

    /// Every registration-auth domain with its sealed secret, ordered by
    /// name (byte order). The sealed bytes are for the authenticator only.
    async fn list_domains(&self) -> Result<Vec<Domain>, StoreError>;

    /// Stores `domain`, replacing the sealed secret of one of that name
    /// (the reference's `AddDomain` is an upsert: it rotates a secret).
    /// Returns true if the domain is new.
    async fn put_domain(&self, domain: Domain) -> Result<bool, StoreError>;

    /// Deletes the domain. Returns whether it existed.
    async fn remove_domain(&self, name: &str) -> Result<bool, StoreError>;

    /// Applies every change of the batch, all or nothing. Deleting what does
    /// not exist, or consuming a claim a node does not hold, is no error.
    /// A retired link is deleted only if its source has no record, or has
    /// no session and a generation not above the one retired with; else it
    /// is left as it is. A batch whose result has two live links for one
    /// group pair fails with `Conflict` and changes nothing.
    async fn apply(&self, changes: ChangeSet) -> Result<(), StoreError> {
        self.apply_shared(Arc::new(changes)).await
    }

    /// [`Self::apply`], of a change set the caller goes on reading while
    /// it is written. A store that writes elsewhere (Postgres) writes on a
    /// task of its own, so the leader applies the change set to its own
    /// copies meanwhile; the in-memory store takes the rows themselves
    /// when it holds the last reference.
    async fn apply_shared(&self, changes: Arc<ChangeSet>) -> Result<(), StoreError>;

    /// Links the node is the source or the claimed destination of, deleted
    /// ones (tombstones) included, ordered by `link_id`.
    async fn links_touching(&self, node: &str) -> Result<Vec<Link>, StoreError>;

    /// Routes sourced at the node, ordered by `id`.
    async fn routes_sourced(&self, node: &str) -> Result<Vec<Route>, StoreError>;

    /// [`links_touching`](Store::links_touching) and
    /// [`routes_sourced`](Store::routes_sourced) of the node at once: what
    /// a reconcile compares the node's tables with. Two reads, not one
    /// snapshot, as if called one after the other.
    async fn reconcile_view(&self, node: &str) -> Result<(Vec<Link>, Vec<Route>), StoreError> {
        tokio::try_join!(self.links_touching(node), self.routes_sourced(node))
    }

    /// Records the source's answers to link creations, each if the link is not
    /// deleted and `source` is still its source: success moves Pending or
    /// Failed to Connecting; failure moves Pending or Connecting to Failed.
    /// An Applied (claimed) link keeps its status. All answers of one
    /// command are recorded at once (a link answered twice takes its last
    /// answer); returns how many distinct links were found as described.
    async fn mark_links_sent(
        &self,
        source: &str,
        answers: &[model::LinkAnswer],
    ) -> Result<usize, StoreError>;

    /// Sets each route's status and message, if the route exists, at once
    /// (a route marked twice takes its last mark). Returns how many distinct
    /// routes existed.
    async fn mark_routes(&self, marks: &[model::RouteMark]) -> Result<usize, StoreError>;

    /// Everything a command's acknowledgement tells, recorded as one: the
    /// source's link answers ([`Store::mark_links_sent`]), the route marks
    /// ([`Store::mark_routes`]) and the deleted links the node no longer
    /// holds (tombstones dropped). A store with transactions writes them
    /// in one, so a reconcile costs one round of writes.
    async fn record_acknowledgement(
        &self,
        source: &str,
        answers: &[model::LinkAnswer],
        marks: &[model::RouteMark],
        forgotten: &[String],
    ) -> Result<(), StoreError> {
        self.mark_links_sent(source, answers).await?;
        self.mark_routes(marks).await?;
        if !forgotten.is_empty() {
            let changes = ChangeSet {
                delete_links: forgotten.to_vec(),
                ..ChangeSet::default()
            };
            self.apply(changes).await?;
        }
        Ok(())
    }

    /// Ends, as crashes, the sessions owned by an earlier incarnation of
    /// `replica` (same id, lower incarnation): a restarted replica owns no
    /// stream of its previous life. Returns the nodes whose session ended,
    /// ordered by id.
    async fn end_earlier_incarnations(
        &self,
        replica: &ReplicaRef,
    ) -> Result<Vec<String>, StoreError>;
}
