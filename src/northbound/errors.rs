//! The one place where internal errors become gRPC statuses for operators.

use tonic::Status;

use crate::store::StoreError;
use crate::transport::TransportError;

pub fn from_store(e: StoreError) -> Status {
    match e {
        StoreError::SegmentNotFound(s) => Status::not_found(format!("segment '{s}' not found")),
        StoreError::StaleSession { .. } | StoreError::Conflict(_) => Status::aborted(e.to_string()),
        StoreError::Unavailable(why) => {
            tracing::warn!(%why, "store unavailable for an operator call");
            Status::unavailable("the control plane's store is unavailable; retry shortly")
        }
        // The replica lost leadership mid-call; another one leads now.
        StoreError::Fenced { .. } => Status::unavailable(format!("{e}; retry shortly")),
        // Retrying the same request would fail the same way.
        StoreError::Rejected(why) => {
            Status::invalid_argument(format!("the store refused this request: {why}"))
        }
    }
}

pub fn from_transport(node: &str, e: TransportError) -> Status {
    match e {
        TransportError::NotConnected(_) | TransportError::SessionEnded => {
            Status::unavailable(format!("node {node} is not connected"))
        }
        TransportError::Timeout(t) => {
            Status::deadline_exceeded(format!("node {node} did not answer within {t:?}"))
        }
        TransportError::Refused(why) => Status::aborted(format!("node {node} refused: {why}")),
        TransportError::Relay(why) => Status::unavailable(format!(
            "the replica holding node {node}'s session did not answer ({why}); retry shortly"
        )),
        TransportError::OwnerDrained(replica) => Status::unavailable(format!(
            "the replica holding node {node}'s session, {replica}, is being drained; retry shortly"
        )),
        TransportError::Fenced { .. }
        | TransportError::NotLeader(_)
        | TransportError::UnexpectedReply => {
            Status::internal(format!("request to node {node} failed: {e}"))
        }
    }
}
