//! Send a request to a node and await its correlated reply.
//!
//! Every request goes through the [`NodeStream`] of the node's current
//! session on the replica that owns it: directly when that is this replica,
//! over the relay otherwise (see [`Remote`]). Commands pass one epoch gate
//! per node, at the owner, so a deposed leader's command never lands after
//! a newer leader's. A session that ends fails its waiters at once with
//! [`TransportError::SessionEnded`], never with an empty success.

mod registry;
mod remote;
pub mod stream;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use registry::Registry;
pub use remote::{Forwarded, Location, Remote};
pub use stream::{NodeStream, Reply};
use uuid::Uuid;

use crate::cluster::LeaderToken;
use crate::proto::sb;

/// Default wait for a node's reply (the reference waits 90 s; a healthy node
/// answers in milliseconds, and a reconcile retried sooner converges sooner).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a request to a node did not get its reply.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum TransportError {
    #[error("node {0} has no session on this replica")]
    NotConnected(String),
    #[error("the node's session ended before it replied")]
    SessionEnded,
    #[error("no reply from the node within {0:?}")]
    Timeout(Duration),
    #[error("command of epoch {epoch} refused: epoch {highest} already seen")]
    Fenced { epoch: u64, highest: u64 },
    /// The sender's leadership lapsed (lease or term) before it could send.
    #[error("not sent: leadership of epoch {0} lapsed")]
    NotLeader(u64),
    #[error("the node refused the request: {0}")]
    Refused(String),
    #[error("the node answered with an unexpected message")]
    UnexpectedReply,
    /// The relay to the owning replica failed: the request may or may not
    /// have reached the node. Query again before acting on it.
    #[error("relay to the owning replica failed (outcome unknown): {0}")]
    Relay(String),
    /// The replica owning the session is flagged for drain (this leader
    /// cannot reach its relay): its nodes are moving to other replicas.
    /// Outcome unknown, like [`TransportError::Relay`]; retry once the
    /// node has registered elsewhere.
    #[error(
        "replica {0}, owning the session, is flagged for drain (its relay is unreachable); retry once the node has moved"
    )]
    OwnerDrained(String),
}

/// Where a node's session is, for one request or several.
pub enum Target {
    Local(Arc<NodeStream>),
    Remote(Location),
}

impl Target {
    /// The session it reaches.
    pub fn session(&self) -> uuid::Uuid {
        match self {
            Target::Local(stream) => stream.session(),
            Target::Remote(at) => at.session,
        }
    }
}

/// Commands this replica handled, for status and metrics: sent ones were
/// either acked or failed (no reply, a refusal); fenced ones never left.
#[derive(Debug, Default)]
pub struct Counters {
    pub acked: AtomicU64,
    pub failed: AtomicU64,
    pub fenced: AtomicU64,
}

impl Counters {
    /// Commands that went out, answered or not.
    pub fn sent(&self) -> u64 {
        self.acked.load(Ordering::Relaxed) + self.failed.load(Ordering::Relaxed)
    }
}

/// Requests to nodes, wherever their streams are.
pub struct Transport {
    registry: Arc<Registry>,
    timeout: Duration,
    /// Highest leadership epoch this replica has learnt of.
    highest_epoch: AtomicU64,
    /// The relay to other replicas; `None` for a single replica.
    remote: Option<Arc<dyn Remote>>,
    counters: Counters,
}

impl Transport {
    /// Requests to streams of this replica only (a single replica).
    pub fn new(registry: Arc<Registry>, timeout: Duration) -> Self {
        Self {
            registry,
            timeout,
            highest_epoch: AtomicU64::new(0),
            remote: None,
            counters: Counters::default(),
        }
    }

    /// Requests to streams anywhere in the cluster, through `remote`.
    pub fn clustered(registry: Arc<Registry>, timeout: Duration, remote: Arc<dyn Remote>) -> Self {
        Self {
            remote: Some(remote),
            ..Self::new(registry, timeout)
        }
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Learns of a leadership epoch (from the leadership row or relay
    /// traffic); commands of lower epochs are refused from now on.
    pub fn observe_epoch(&self, epoch: u64) {
        self.highest_epoch.fetch_max(epoch, Ordering::SeqCst);
    }

    pub fn highest_epoch(&self) -> u64 {
        self.highest_epoch.load(Ordering::SeqCst)
    }

    /// Where `node`'s current session is.
    pub async fn target(&self, node: &str) -> Result<Target, TransportError> {
        let Some(remote) = &self.remote else {
            return self.local(node, None).map(Target::Local);
        };
        if let Some(stream) = self.own(node) {
            return Ok(Target::Local(stream));
        }
        match remote.locate(node).await? {
            None => Err(TransportError::NotConnected(node.to_string())),
            Some(at) => self.reach(at),
        }
    }

    /// Which of `nodes` have a current session, on this replica or on
    /// another, found in one lookup.
    pub async fn connected(&self, nodes: &[String]) -> Result<BTreeSet<String>, TransportError> {
        let Some(remote) = &self.remote else {
            let here = nodes.iter().filter(|n| self.local(n, None).is_ok());
            return Ok(here.cloned().collect());
        };
        let (mut here, mut elsewhere) = (BTreeSet::new(), Vec::new());
        for n in nodes {
            if self.own(n).is_some() {
                here.insert(n.clone());
            } else {
                elsewhere.push(n.clone());
            }
        }
        if elsewhere.is_empty() {
            return Ok(here);
        }
        let found = remote.locate_all(&elsewhere).await?;
        let reachable = found.into_iter().filter_map(|at| {
            let node = at.node.clone();
            self.reach(at).is_ok().then_some(node)
        });
        here.extend(reachable);
        Ok(here)
    }

    /// This replica's open stream of `node`, if its session was recorded:
    /// the store is not asked where a session is that this replica holds.
    /// Should the node have registered elsewhere since, the stream is
    /// closed when the new owner asks (or when the node's old connection
    /// ends); a request in between fails, and is retried, as when a
    /// session ends under it.
    fn own(&self, node: &str) -> Option<Arc<NodeStream>> {
        let recorded = |s: &Arc<NodeStream>| s.generation() > 0 && !s.is_closed();
        self.registry.get(node).filter(recorded)
    }

    /// The target of a located session: this replica's stream of it, or
    /// its owner.
    fn reach(&self, at: Location) -> Result<Target, TransportError> {
        match at.local {
            true => self.local(&at.node, Some(at.session)).map(Target::Local),
            false => Ok(Target::Remote(at)),
        }
    }

    /// This replica's stream of `node`, of `session` if given.
    fn local(&self, node: &str, session: Option<Uuid>) -> Result<Arc<NodeStream>, TransportError> {
        self.registry
            .get(node)
            .filter(|s| session.is_none_or(|id| s.session() == id))
            .ok_or_else(|| TransportError::NotConnected(node.to_string()))
    }

    /// The node's live connection table.
    pub async fn list_connections(
        &self,
        node: &str,
    ) -> Result<Vec<sb::ConnectionEntry>, TransportError> {
        self.list_connections_at(&self.target(node).await?).await
    }

    /// The node's live route (subscription) table.
    pub async fn list_routes(&self, node: &str) -> Result<Vec<sb::RouteEntry>, TransportError> {
        self.list_routes_at(&self.target(node).await?).await
    }

    /// Sends a command of the term `token` leads and returns the node's
    /// per-item acknowledgement.
    pub async fn send_command(
        &self,
        node: &str,
        command: sb::ConfigurationCommand,
        token: &LeaderToken,
    ) -> Result<sb::ConfigurationCommandAck, TransportError> {
        let target = self.target(node).await?;
        self.command_at(&target, command, token).await
    }

    pub async fn list_connections_at(
        &self,
        target: &Target,
    ) -> Result<Vec<sb::ConnectionEntry>, TransportError> {
        match self.request_at(target, Forwarded::ListConnections).await? {
            Reply::Connections(entries) => Ok(entries),
            _ => Err(TransportError::UnexpectedReply),
        }
    }

    pub async fn list_routes_at(
        &self,
        target: &Target,
    ) -> Result<Vec<sb::RouteEntry>, TransportError> {
        match self.request_at(target, Forwarded::ListRoutes).await? {
            Reply::Routes(entries) => Ok(entries),
            _ => Err(TransportError::UnexpectedReply),
        }
    }

    /// Sends a command to `target`. Locally, the token is checked inside
    /// the node's gate, right before the command leaves; over the relay,
    /// right before the relay call (the owner's gate does the rest).
    pub async fn command_at(
        &self,
        target: &Target,
        command: sb::ConfigurationCommand,
        token: &LeaderToken,
    ) -> Result<sb::ConfigurationCommandAck, TransportError> {
        let epoch = token.epoch();
        let reply = match target {
            Target::Local(stream) => {
                self.gate(epoch)?;
                let valid = || token.is_valid();
                self.counted(stream.command(command, epoch, self.timeout, &valid).await)?
            }
            Target::Remote(at) => {
                if !token.is_valid() {
                    return Err(TransportError::NotLeader(epoch));
                }
                let forwarded = Forwarded::Command { command, epoch };
                self.counted(self.forward(at, forwarded).await)?
            }
        };
        match reply {
            Reply::CommandAck(ack) => Ok(ack),
            _ => Err(TransportError::UnexpectedReply),
        }
    }

    async fn request_at(&self, target: &Target, what: Forwarded) -> Result<Reply, TransportError> {
        match target {
            Target::Local(stream) => stream.request(what.payload(), self.timeout).await,
            Target::Remote(at) => self.forward(at, what).await,
        }
    }

    async fn forward(&self, at: &Location, what: Forwarded) -> Result<Reply, TransportError> {
        let remote = self
            .remote
            .as_ref()
            .ok_or(TransportError::UnexpectedReply)?;
        remote.forward(at, what).await
    }

    /// Refuses an epoch lower than one this replica has seen.
    fn gate(&self, epoch: u64) -> Result<(), TransportError> {
        let highest = self.highest_epoch();
        if epoch < highest {
            self.counters.fenced.fetch_add(1, Ordering::Relaxed);
            return Err(TransportError::Fenced { epoch, highest });
        }
        Ok(())
    }

    fn counted(&self, r: Result<Reply, TransportError>) -> Result<Reply, TransportError> {
        match &r {
            Ok(_) => self.counters.acked.fetch_add(1, Ordering::Relaxed),
            Err(TransportError::Fenced { .. }) => {
                self.counters.fenced.fetch_add(1, Ordering::Relaxed)
            }
            // Never sent: the sender's leadership lapsed first.
            Err(TransportError::NotLeader(_)) => 0,
            Err(_) => self.counters.failed.fetch_add(1, Ordering::Relaxed),
        };
        r
    }

    /// Serves a request relayed by another replica to this replica's
    /// stream of `node` in `session`: commands pass the replica's and the
    /// node's epoch gates (and teach this replica the epoch).
    pub async fn serve_forwarded(
        &self,
        node: &str,
        session: Uuid,
        what: Forwarded,
    ) -> Result<Reply, TransportError> {
        let stream = self.local(node, Some(session))?;
        match what {
            Forwarded::Command { command, epoch } => {
                self.gate(epoch)?;
                self.observe_epoch(epoch);
                let result = stream.command(command, epoch, self.timeout, &|| true).await;
                if let Err(TransportError::Fenced { .. }) = &result {
                    self.counters.fenced.fetch_add(1, Ordering::Relaxed);
                }
                result
            }
            read => stream.request(read.payload(), self.timeout).await,
        }
    }
}

#[cfg(test)]
mod locate_tests;
