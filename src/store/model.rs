//! Domain types held by the store. They are the control plane's own shapes,
//! separate from the wire types in [`crate::proto`]: the southbound and
//! northbound layers convert at their edges.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use crate::revision::Revision;

/// Effective node id: `"{group}/{node_id}"`, or the bare id without a group.
pub type NodeId = String;

/// A replica process: its stable id and the incarnation of this run. A
/// replica restarting under the same id gets a higher incarnation, which ends
/// the sessions its earlier incarnation owned.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReplicaRef {
    pub id: String,
    pub incarnation: u64,
}

/// Where a node's control session stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionState {
    /// Recorded, but `RegisterNodeResponse` is not on the wire yet: the node
    /// ignores commands until it is, so owners hold them.
    Registering,
    /// The node has its registration reply and accepts commands.
    Ready,
}

/// One registration of a node on one stream. A re-registration anywhere
/// replaces it; facts from a replaced session are refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    pub id: Uuid,
    /// Store-wide increasing number: a later registration always has a higher
    /// generation, even after the node's record was deleted and recreated.
    pub generation: u64,
    pub owner: ReplicaRef,
    pub state: SessionState,
}

/// How a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DepartureKind {
    /// The stream broke without a deregistration: the node is expected back.
    Crash,
    /// The node said goodbye: its record goes once the leader has cleaned up.
    Deregistered,
}

/// The end of a node's last session, kept until the leader has derived from
/// it (level-based: the leader compares generations, it needs no event).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Departure {
    pub generation: u64,
    pub kind: DepartureKind,
}

/// SPIRE mTLS settings a node advertises for connections towards it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SpireMtls {
    pub socket_path: String,
    pub trust_domain: Option<String>,
}

/// How other nodes reach a node's data plane.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ConnectionDetail {
    /// As the node reported it, with a wildcard host replaced by the peer IP.
    pub endpoint: String,
    pub external_endpoint: Option<String>,
    pub spire_mtls: Option<SpireMtls>,
    /// The node's free-form metadata (a protobuf `Struct`) as JSON.
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// 3.x: the listener requires TLS.
    #[serde(default)]
    pub tls_required: bool,
    /// 3.x: the `AuthMethod` the listener requires, by number (0 none).
    #[serde(default)]
    pub auth_method: i32,
    /// 3.x: the SPIFFE trust domain of the listener.
    #[serde(default)]
    pub spire_trust_domain: Option<String>,
}

/// A control-plane-managed connection a node reports it holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReportedConnection {
    pub link_id: String,
    pub incoming: bool,
}

/// A subscription name: three string components and an optional 128-bit
/// component id (`None` is the data plane's NULL_COMPONENT). On the wire it
/// also travels hashed (see [`crate::names`]); the strings are the identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Name {
    pub components: [String; 3],
    pub id: Option<u128>,
}

/// What a node says when it registers: the facts its session starts from.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Registration {
    /// The id the owning replica gives the session; nil lets the store
    /// choose. The owner chooses it when it must answer the node before the
    /// registration can be recorded (the store is unreachable).
    pub session_id: Uuid,
    pub node_id: NodeId,
    pub group: Option<String>,
    pub connection_details: Vec<ConnectionDetail>,
    pub reported_connections: Vec<ReportedConnection>,
    /// Routes the node listed in its registration (in practice none).
    pub reported_routes: Vec<Name>,
    /// The southbound revision the node spoke (see [`Revision`]): what
    /// the control plane sends it is written for that revision.
    pub revision: Revision,
    /// For a registration recorded late (answered while the store was
    /// away): the highest generation the owner had seen before it arrived.
    /// A record whose latest generation is above it has a newer
    /// registration of the node, which this one must not replace.
    pub stale_after: Option<u64>,
}

/// A node as the store holds it: its latest registration facts, its current
/// session (none while disconnected) and how its last session ended.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRecord {
    pub id: NodeId,
    pub group: Option<String>,
    pub connection_details: Vec<ConnectionDetail>,
    pub reported_connections: Vec<ReportedConnection>,
    pub reported_routes: Vec<Name>,
    /// The revision of the latest registration.
    pub revision: Revision,
    /// Incoming links the node reported (`connections_received`) during its
    /// current session: the claim facts.
    pub received_links: Vec<String>,
    pub session: Option<Session>,
    /// Generation of the latest session ever started for this record.
    pub generation: u64,
    pub departure: Option<Departure>,
    /// Unix seconds of the last change.
    pub updated_at: i64,
}

impl NodeRecord {
    /// Connected means a session exists, ready or still registering.
    pub fn is_connected(&self) -> bool {
        self.session.is_some()
    }

    /// The links whose incoming end the node says it holds, received
    /// during its session or reported at its registration: its claims.
    pub fn claimed_links(&self) -> impl Iterator<Item = &str> {
        let reported = self.reported_connections.iter().filter(|c| c.incoming);
        let reported = reported.map(|c| c.link_id.as_str());
        let received = self.received_links.iter().map(String::as_str);
        received.chain(reported)
    }

    /// The session, if it is ready for commands.
    pub fn ready_session(&self) -> Option<&Session> {
        self.session
            .as_ref()
            .filter(|s| s.state == SessionState::Ready)
    }
}

/// A name announced by a node: "every reachable node should reach this name
/// at that node". Stored with the session generation it came from so that
/// announcements of an older session can be dropped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Template {
    pub name: Name,
    pub node: NodeId,
    pub generation: u64,
    /// Store-wide creation order: the oldest template roots a name's tree.
    pub seq: u64,
    /// Unix seconds of the latest announcement.
    pub updated_at: i64,
}

/// Link lifecycle, as the northbound API reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LinkStatus {
    Pending,
    Connecting,
    Applied,
    Failed,
}

/// Who a link's destination was when it claimed the link: the session
/// generations of both ends at that moment. A connection lives no longer
/// than the sessions it was negotiated under (a node drops its outgoing
/// connections when it registers again, and a restarted process has none),
/// so once either end has a newer session the claim says nothing about what
/// the nodes hold, and the link needs a fresh claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub source_generation: u64,
    pub dest_generation: u64,
}

/// A desired connection from `source_node` to a node of `dest_group`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Link {
    pub link_id: String,
    pub source_node: NodeId,
    pub source_group: String,
    pub dest_group: String,
    /// Empty until the destination claims the link; kept while a claimed
    /// link waits to be claimed again (see `claim`).
    pub dest_node: Option<NodeId>,
    pub dest_endpoint: String,
    /// The data plane's client configuration (JSON) sent to the source.
    pub config_data: String,
    pub status: LinkStatus,
    pub status_msg: String,
    pub deleted: bool,
    pub updated_at: i64,
    /// The sessions the destination's claim was accepted under; `None`
    /// until claimed, and again while a claimed link whose end registered
    /// anew waits for its destination to claim it again.
    #[serde(default)]
    pub claim: Option<Claim>,
}

/// What a reconciler changes of a link when it records its source's
/// answer: the leader re-reads only this of the links reconcilers wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkState {
    pub link_id: String,
    pub status: LinkStatus,
    pub status_msg: String,
    pub updated_at: i64,
}

impl From<&Link> for LinkState {
    fn from(l: &Link) -> Self {
        LinkState {
            link_id: l.link_id.clone(),
            status: l.status,
            status_msg: l.status_msg.clone(),
            updated_at: l.updated_at,
        }
    }
}

/// Route lifecycle, as the northbound API reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RouteStatus {
    Pending,
    Applied,
    Failed,
    Deleted,
}

/// A desired subscription on `source_node` for `name`, forwarded over `link_id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Route {
    pub id: String,
    pub source_node: NodeId,
    pub dest_node: NodeId,
    pub link_id: String,
    pub name: Name,
    pub status: RouteStatus,
    pub status_msg: String,
    pub updated_at: i64,
}

impl Route {
    pub fn is_deleted(&self) -> bool {
        self.status == RouteStatus::Deleted
    }
}

/// A source's answer to a link creation it was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkAnswer {
    pub link_id: String,
    pub ok: bool,
    pub message: String,
}

/// A node's answer to a route it was sent (or found holding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteMark {
    pub id: String,
    pub status: RouteStatus,
    pub message: String,
}

/// What a node should hold: sent in its registration reply and by reconciles.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DesiredState {
    pub links: Vec<Link>,
    pub routes: Vec<Route>,
}

/// An API-mode topology segment: a routing domain and the group pairs that
/// may link inside it. Edges are undirected, stored as `(a, b)` with `a < b`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    pub name: String,
    pub edges: Vec<(String, String)>,
}

/// The canonical form of an undirected group pair.
pub fn edge(a: &str, b: &str) -> (String, String) {
    let (x, y) = edge_ref(a, b);
    (x.to_string(), y.to_string())
}

/// [`edge`], borrowed: for lookups made once per route.
pub fn edge_ref<'a>(a: &'a str, b: &'a str) -> (&'a str, &'a str) {
    if a <= b { (a, b) } else { (b, a) }
}

/// A registration-auth domain (a group with a secret managed through the
/// API) as stored: the secret only sealed (see `crate::auth::domains`), so
/// that whoever reads the table or a backup cannot register nodes with it.
#[derive(Clone, PartialEq, Eq)]
pub struct Domain {
    pub name: String,
    /// The sealed secret: opaque to the store, never shown to operators.
    pub sealed: Vec<u8>,
}

impl std::fmt::Debug for Domain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Domain")
            .field("name", &self.name)
            .field("sealed", &format_args!("<{} bytes>", self.sealed.len()))
            .finish()
    }
}
