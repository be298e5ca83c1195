//! Send a request to a node and await its correlated reply.
//!
//! Every request goes through the [`NodeStream`] of the node's current
//! session on the replica that owns it. Commands pass the stream's epoch gate
//! so a deposed leader's command never lands after a newer leader's. A
//! session that ends fails its waiters at once with [`TransportError::SessionEnded`],
//! never with an empty success.

mod registry;
pub mod stream;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use registry::Registry;
pub use stream::{NodeStream, Reply};

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
    #[error("the node refused the request: {0}")]
    Refused(String),
    #[error("the node answered with an unexpected message")]
    UnexpectedReply,
}

/// Requests to nodes whose streams this replica owns.
pub struct Transport {
    registry: Arc<Registry>,
    timeout: Duration,
    /// Highest leadership epoch this replica has learnt of.
    highest_epoch: AtomicU64,
}

impl Transport {
    pub fn new(registry: Arc<Registry>, timeout: Duration) -> Self {
        Self {
            registry,
            timeout,
            highest_epoch: AtomicU64::new(0),
        }
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Learns of a leadership epoch (from the leadership signal or relay
    /// traffic); commands of lower epochs are refused from now on.
    pub fn observe_epoch(&self, epoch: u64) {
        self.highest_epoch.fetch_max(epoch, Ordering::SeqCst);
    }

    fn stream(&self, node: &str) -> Result<Arc<NodeStream>, TransportError> {
        self.registry
            .get(node)
            .ok_or_else(|| TransportError::NotConnected(node.to_string()))
    }

    /// The node's live connection table.
    pub async fn list_connections(
        &self,
        node: &str,
    ) -> Result<Vec<sb::ConnectionEntry>, TransportError> {
        let payload =
            sb::control_message::Payload::ConnectionListRequest(sb::ConnectionListRequest {});
        match self.stream(node)?.request(payload, self.timeout).await? {
            Reply::Connections(entries) => Ok(entries),
            _ => Err(TransportError::UnexpectedReply),
        }
    }

    /// The node's live route (subscription) table.
    pub async fn list_routes(&self, node: &str) -> Result<Vec<sb::RouteEntry>, TransportError> {
        let payload = sb::control_message::Payload::RouteListRequest(sb::RouteListRequest {});
        match self.stream(node)?.request(payload, self.timeout).await? {
            Reply::Routes(entries) => Ok(entries),
            _ => Err(TransportError::UnexpectedReply),
        }
    }

    /// Sends a command issued under leadership `epoch` and returns the node's
    /// per-item acknowledgement.
    pub async fn send_command(
        &self,
        node: &str,
        command: sb::ConfigurationCommand,
        epoch: u64,
    ) -> Result<sb::ConfigurationCommandAck, TransportError> {
        let highest = self.highest_epoch.load(Ordering::SeqCst);
        if epoch < highest {
            return Err(TransportError::Fenced { epoch, highest });
        }
        let stream = self.stream(node)?;
        match stream.command(command, epoch, self.timeout).await? {
            Reply::CommandAck(ack) => Ok(ack),
            _ => Err(TransportError::UnexpectedReply),
        }
    }
}
