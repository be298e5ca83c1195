//! The relay's messages and statuses, to and from the transport's types.
//! One place for both directions, so the sender reads exactly what the
//! owner meant.

use std::time::Duration;

use tonic::{Code, Status};

use crate::proto::cluster as pb;
use crate::proto::cluster::forward_reply::Reply as PbReply;
use crate::proto::cluster::forward_request::Request as PbRequest;
use crate::proto::sb;
use crate::transport::{Forwarded, Location, Reply, TransportError};

/// Prefix of the owner's message when the node itself did not answer.
pub const NODE_TIMEOUT: &str = "the node did not reply";

/// Metadata carrying the highest epoch the owner has seen, on a refusal.
const HIGHEST: &str = "x-slim-cp-highest-epoch";

pub fn forward_request(at: &Location, what: Forwarded) -> pb::ForwardRequest {
    let (epoch, request) = match what {
        Forwarded::ListConnections => (0, PbRequest::ListConnections(sb::ConnectionListRequest {})),
        Forwarded::ListRoutes => (0, PbRequest::ListRoutes(sb::RouteListRequest {})),
        Forwarded::Command { command, epoch } => (epoch, PbRequest::Command(command)),
    };
    pb::ForwardRequest {
        node: at.node.clone(),
        session_id: at.session.to_string(),
        epoch,
        request: Some(request),
    }
}

/// The request an owner received; `None` if it names no request.
pub fn forwarded_from(req: &pb::ForwardRequest) -> Option<Forwarded> {
    Some(match req.request.clone()? {
        PbRequest::ListConnections(_) => Forwarded::ListConnections,
        PbRequest::ListRoutes(_) => Forwarded::ListRoutes,
        PbRequest::Command(command) => Forwarded::Command {
            command,
            epoch: req.epoch,
        },
    })
}

pub fn reply_to_wire(reply: Reply) -> pb::ForwardReply {
    let reply = match reply {
        Reply::CommandAck(ack) => PbReply::Ack(ack),
        Reply::Connections(entries) => PbReply::Connections(sb::ConnectionListResponse {
            original_message_id: String::new(),
            entries,
            done: true,
        }),
        Reply::Routes(entries) => PbReply::Routes(sb::RouteListResponse {
            original_message_id: String::new(),
            entries,
            done: true,
        }),
    };
    pb::ForwardReply { reply: Some(reply) }
}

pub fn reply_from(reply: pb::ForwardReply) -> Result<Reply, TransportError> {
    match reply.reply {
        Some(PbReply::Ack(ack)) => Ok(Reply::CommandAck(ack)),
        Some(PbReply::Connections(r)) => Ok(Reply::Connections(r.entries)),
        Some(PbReply::Routes(r)) => Ok(Reply::Routes(r.entries)),
        None => Err(TransportError::UnexpectedReply),
    }
}

/// The owner's failure as a status the sender maps back (see
/// `client::from_status`).
pub fn status_of(e: TransportError) -> Status {
    match e {
        TransportError::NotConnected(n) => Status::not_found(format!("no session of {n} here")),
        TransportError::SessionEnded => Status::aborted(e.to_string()),
        TransportError::Fenced { highest, .. } => {
            let mut s = Status::failed_precondition(e.to_string());
            if let Ok(v) = highest.to_string().parse() {
                s.metadata_mut().insert(HIGHEST, v);
            }
            s
        }
        TransportError::Refused(m) => Status::invalid_argument(m),
        TransportError::Timeout(d) => Status::deadline_exceeded(format!("{NODE_TIMEOUT} in {d:?}")),
        other => Status::internal(other.to_string()),
    }
}

/// The owner's answer to a request for `node` (of `epoch`, for a
/// command), back in the transport's words: the inverse of [`status_of`].
/// Anything the owner did not say itself is "outcome unknown".
pub fn error_from(node: &str, epoch: u64, s: &Status) -> TransportError {
    match s.code() {
        Code::NotFound => TransportError::NotConnected(node.to_string()),
        Code::Aborted => TransportError::SessionEnded,
        Code::FailedPrecondition => {
            fenced_from(s, epoch).unwrap_or_else(|| TransportError::Relay(s.message().to_string()))
        }
        Code::InvalidArgument => TransportError::Refused(s.message().to_string()),
        Code::DeadlineExceeded if s.message().starts_with(NODE_TIMEOUT) => {
            TransportError::Timeout(Duration::ZERO)
        }
        _ => TransportError::Relay(format!("{:?}: {}", s.code(), s.message())),
    }
}

/// Whether a failed relay call never got the peer's own answer: the
/// connection was refused, reset or timed out (a node's own timeout,
/// reported by the peer, is an answer).
pub fn unreached(s: &Status) -> bool {
    match s.code() {
        Code::Unavailable | Code::Cancelled | Code::Unknown => true,
        Code::DeadlineExceeded => !s.message().starts_with(NODE_TIMEOUT),
        _ => false,
    }
}

/// A refusal of a command of `epoch` as stale, if `s` is one.
fn fenced_from(s: &Status, epoch: u64) -> Option<TransportError> {
    let highest = s.metadata().get(HIGHEST)?.to_str().ok()?.parse().ok()?;
    Some(TransportError::Fenced { epoch, highest })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::model::ReplicaRef;

    #[test]
    fn requests_cross_the_relay_unchanged() {
        let at = Location {
            node: "g/n".into(),
            owner: ReplicaRef {
                id: "cp-1".into(),
                incarnation: 2,
            },
            session: uuid::Uuid::new_v4(),
            local: false,
        };
        let command = sb::ConfigurationCommand {
            connections_to_delete: vec!["l-1".into()],
            ..Default::default()
        };
        for what in [
            Forwarded::ListConnections,
            Forwarded::ListRoutes,
            Forwarded::Command { command, epoch: 7 },
        ] {
            let wire = forward_request(&at, what.clone());
            assert_eq!(wire.session_id, at.session.to_string());
            assert_eq!(forwarded_from(&wire), Some(what));
        }
    }

    #[test]
    fn the_owners_answers_come_back_as_it_meant_them() {
        let fenced = TransportError::Fenced {
            epoch: 3,
            highest: 5,
        };
        for e in [
            TransportError::NotConnected("g/n".into()),
            TransportError::SessionEnded,
            fenced,
            TransportError::Refused("no such link".into()),
        ] {
            assert_eq!(error_from("g/n", 3, &status_of(e.clone())), e);
        }
        let timeout = status_of(TransportError::Timeout(Duration::from_secs(30)));
        assert!(matches!(
            error_from("g/n", 0, &timeout),
            TransportError::Timeout(_)
        ));
        let gone = Status::unavailable("connection refused");
        assert!(matches!(
            error_from("g/n", 0, &gone),
            TransportError::Relay(_)
        ));
        let relay_deadline = Status::deadline_exceeded("relay call timed out");
        assert!(matches!(
            error_from("g/n", 0, &relay_deadline),
            TransportError::Relay(_)
        ));
    }
}
