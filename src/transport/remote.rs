//! Requests to nodes whose streams other replicas own. The cluster layer
//! implements [`Remote`] with the relay; the transport only asks where a
//! session is and hands the request over.

use async_trait::async_trait;
use uuid::Uuid;

use super::{Reply, TransportError};
use crate::proto::sb;
use crate::proto::sb::control_message::Payload;
use crate::store::model::ReplicaRef;

/// Where a node's current session is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub node: String,
    pub owner: ReplicaRef,
    pub session: Uuid,
    /// The owner is this very replica.
    pub local: bool,
}

/// A request for a node, as it travels between replicas.
#[derive(Debug, Clone, PartialEq)]
pub enum Forwarded {
    ListConnections,
    ListRoutes,
    Command {
        command: sb::ConfigurationCommand,
        epoch: u64,
    },
}

impl Forwarded {
    /// The message the owner sends the node.
    pub fn payload(self) -> Payload {
        match self {
            Forwarded::ListConnections => {
                Payload::ConnectionListRequest(sb::ConnectionListRequest {})
            }
            Forwarded::ListRoutes => Payload::RouteListRequest(sb::RouteListRequest {}),
            Forwarded::Command { command, .. } => Payload::ConfigCommand(command),
        }
    }
}

/// Finds sessions and forwards requests to their owners.
#[async_trait]
pub trait Remote: Send + Sync + 'static {
    /// Where the current sessions of `nodes` are, in one lookup; a node
    /// without one is left out.
    async fn locate_all(&self, nodes: &[String]) -> Result<Vec<Location>, TransportError>;

    /// Where `node`'s current session is; `None` without one.
    async fn locate(&self, node: &str) -> Result<Option<Location>, TransportError> {
        let found = self.locate_all(&[node.to_string()]).await?;
        Ok(found.into_iter().next())
    }

    /// Hands `what` to the owner of the session at `at`. An error other
    /// than the owner's own answer (no such session, fenced, the node's
    /// refusal) is [`TransportError::Relay`]: outcome unknown.
    async fn forward(&self, at: &Location, what: Forwarded) -> Result<Reply, TransportError>;
}
