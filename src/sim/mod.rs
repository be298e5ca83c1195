//! A simulated SLIM data-plane node and fleet.
//!
//! Integration tests and benchmarks drive thousands of these against the
//! control plane over real gRPC, so each one behaves like an upstream
//! `slim` 2.0.0-alpha.2 node on the southbound stream (registration, the
//! single reconnect attempt, full-state reconcile, acks and list replies,
//! announcements and link claims) and keeps tables faithful enough to check
//! what a real node would hold. The data plane itself is simulated: nodes
//! of one [`SimNetwork`] "connect" to each other by endpoint, in memory.
//!
//! Every simulated process is one tokio task; its tables live in the
//! network's single lock so that link setup and teardown between two nodes
//! are atomic without lock ordering.

mod balancer;
mod commands;
mod fleet;
mod linkcfg;
pub mod names;
mod network;
mod node;
mod process;
pub mod raw;
mod session;
mod tables;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::time::Duration;

use crate::revision::Revision;
pub use balancer::Balancer;
pub use fleet::{FleetOptions, SimFleet};
pub use linkcfg::{Addr, LinkConfig, parse_addr, parse_config, parse_requirements};
pub use network::{Change, SimNetwork};
pub use node::SimNode;
pub use tables::{LIST_CHUNK, SimConnection, SimRoute, Tables, chunk_list};

/// What a simulated node is started with (its configuration file, in effect).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimNodeSpec {
    /// Node id as configured (sent bare; the control plane prefixes the group).
    pub node_id: String,
    /// Group name, if any.
    pub group: Option<String>,
    /// Data-plane listen address, `host:port` (the host may be `0.0.0.0`).
    pub endpoint: String,
    /// Address other groups should dial, when the node has one.
    pub external_endpoint: Option<String>,
    /// Registration credentials (empty without auth).
    pub credentials: String,
    /// The southbound revision the node speaks: its listener details on
    /// the wire, and how it reads the connections of its registration
    /// response (3.x: as server requirements).
    pub revision: Revision,
    /// Listener metadata. A 3.x node sends it in a field of that revision
    /// only, so with metadata its revision can be told; without, a 3.x
    /// registration reads exactly like a 2.0.0-alpha.2 one.
    pub metadata: BTreeMap<String, String>,
}

impl SimNodeSpec {
    /// A spec with no external endpoint and no credentials.
    pub fn new(node_id: &str, group: Option<&str>, endpoint: &str) -> SimNodeSpec {
        SimNodeSpec {
            node_id: node_id.to_string(),
            group: group.map(str::to_string),
            endpoint: endpoint.to_string(),
            external_endpoint: None,
            credentials: String::new(),
            revision: Revision::V2,
            metadata: BTreeMap::new(),
        }
    }

    /// The same node speaking the 3.x revision.
    pub fn v3(mut self) -> SimNodeSpec {
        self.revision = Revision::V3;
        self
    }

    /// The same node with one more metadata entry on its listener.
    pub fn with_metadata(mut self, key: &str, value: &str) -> SimNodeSpec {
        self.metadata.insert(key.to_string(), value.to_string());
        self
    }

    /// The id the control plane files the node under: `group/node` or bare.
    pub fn effective_id(&self) -> String {
        match &self.group {
            Some(g) if !g.is_empty() => format!("{g}/{}", self.node_id),
            _ => self.node_id.clone(),
        }
    }
}

/// Knobs of a simulated node.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// Pause between TCP connection attempts while nothing listens at start.
    pub connect_retry_interval: Duration,
    /// How long to wait for response headers and then `RegisterNodeResponse`
    /// (the real node waits 10 s for the response).
    pub register_timeout: Duration,
    /// How long `deregister` waits for `DeregisterNodeResponse`.
    pub request_timeout: Duration,
    /// When a connection with routes dies, the real node's data path tells
    /// its controller the names were unsubscribed, and the controller sends
    /// the control plane `routes_to_delete` without link id for each (which
    /// reads like a local withdrawal). On by default, as upstream does.
    pub emit_lost_route_withdrawals: bool,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            connect_retry_interval: Duration::from_millis(200),
            register_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
            emit_lost_route_withdrawals: true,
        }
    }
}

/// Lifecycle of a simulated node's process and control-plane session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeState {
    /// Not started yet, dialling, or (re)registering.
    Starting,
    /// Registered on a live stream.
    Registered,
    /// The process ended: deregistered, crashed, or shut down.
    Stopped,
    /// The node gave up on the control plane (it stays up without one).
    Lost {
        /// Why, in the real node's words where it has some.
        reason: String,
    },
}

/// Errors of the simulator's API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// The control-plane URL does not parse.
    #[error("invalid control plane url {0}: {1}")]
    InvalidUrl(String, String),
    /// `start` on a node whose process runs.
    #[error("node {0} is already running")]
    AlreadyRunning(String),
    /// The node has no running process.
    #[error("node {0} is not running")]
    NotRunning(String),
    /// The node has no registered stream.
    #[error("node {0} is not registered")]
    NotRegistered(String),
    /// No reply in time.
    #[error("timed out waiting for {0}")]
    Timeout(String),
    /// The stream ended before the reply.
    #[error("stream closed: {0}")]
    StreamClosed(String),
    /// Two nodes with one effective id in a network.
    #[error("node {0} is already in the network")]
    DuplicateNode(String),
    /// Called outside a tokio runtime.
    #[error("no tokio runtime")]
    NoRuntime,
    /// A name without its encoded form.
    #[error("invalid name: {0}")]
    InvalidName(String),
}
