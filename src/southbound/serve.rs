//! A registered session's message loop: replies go to their waiters, facts
//! go to the session's [`FactWriter`], deregistration is answered before
//! the session ends. It records and signals; derivation is the leader's.

use std::sync::Arc;

use tonic::{Status, Streaming};
use tracing::{debug, info, warn};

use super::Ctx;
use super::facts::{Fact, FactWriter, Refused, log_refusal};
use crate::names;
use crate::proto::sb;
use crate::proto::sb::control_message::Payload;
use crate::store::model::{DepartureKind, Name, Registration};
use crate::transport::NodeStream;
use crate::transport::stream::Outbound;

/// What the loop does after a message.
enum Flow {
    Continue,
    /// The node deregistered: the stream ends normally.
    Done,
    /// The node closed the stream or it broke: the crash path.
    Gone,
    /// The node sent more facts than the outbox holds: end the stream so
    /// the node replays them.
    Close(Status),
}

pub async fn serve(
    ctx: Arc<Ctx>,
    stream: Arc<NodeStream>,
    pending: Option<Registration>,
    mut inbound: Streaming<sb::ControlMessage>,
    out: &Outbound,
) {
    let writer = FactWriter::spawn(ctx.clone(), stream.clone());
    let begun = pending.map_or(Ok(()), |reg| writer.push(Fact::Begun(Box::new(reg))));
    if begun.and_then(|()| writer.push(Fact::Ready)).is_err() {
        return end(&ctx, &stream, &writer, DepartureKind::Crash);
    }
    loop {
        let next = tokio::select! {
            () = stream.closed() => {
                // Replaced by a newer registration, or the replica is going.
                end(&ctx, &stream, &writer, DepartureKind::Crash);
                let status = Status::aborted("control session closed by the control plane");
                let _ = out.send(Err(status)).await;
                return;
            }
            next = inbound.message() => next,
        };
        let flow = match next {
            Ok(Some(msg)) => on_message(&stream, &writer, msg).await,
            Ok(None) => Flow::Gone,
            Err(status) => {
                debug!(node = stream.node(), %status, "stream broke");
                Flow::Gone
            }
        };
        match flow {
            Flow::Continue => {}
            Flow::Done => return end(&ctx, &stream, &writer, DepartureKind::Deregistered),
            Flow::Gone => return end(&ctx, &stream, &writer, DepartureKind::Crash),
            Flow::Close(status) => {
                end(&ctx, &stream, &writer, DepartureKind::Crash);
                let _ = out.send(Err(status)).await;
                return;
            }
        }
    }
}

async fn on_message(stream: &NodeStream, writer: &FactWriter, msg: sb::ControlMessage) -> Flow {
    match msg.payload {
        Some(Payload::ConfigCommand(cmd)) => queue_facts(stream, writer, cmd),
        Some(Payload::DeregisterNodeRequest(_)) => deregister(stream, msg.message_id).await,
        Some(
            p @ (Payload::ConfigCommandAck(_)
            | Payload::Ack(_)
            | Payload::ConnectionListResponse(_)
            | Payload::RouteListResponse(_)),
        ) => {
            if !stream.deliver(p) {
                debug!(
                    node = stream.node(),
                    "reply to a request not waited for; ignored"
                );
            }
            Flow::Continue
        }
        other => {
            let kind = super::session::payload_kind(&other);
            debug!(node = stream.node(), kind, "unexpected message ignored");
            Flow::Continue
        }
    }
}

/// Names from route entries without a link id (announcements/withdrawals).
fn announced(routes: &[sb::Route], node: &str) -> Vec<Name> {
    routes
        .iter()
        .filter(|r| r.link_id.as_deref().is_none_or(str::is_empty))
        .filter_map(|r| match r.name.as_ref().map(names::from_wire) {
            Some(Ok(name)) => Some(name),
            Some(Err(e)) => {
                warn!(node, error = %e, "announcement with a bad name ignored");
                None
            }
            None => None,
        })
        .collect()
}

fn received(entries: &[sb::ConnectionEntry]) -> Vec<String> {
    entries
        .iter()
        .filter_map(|e| e.link_id.clone())
        .filter(|l| super::handshake::is_link_id(l))
        .collect()
}

/// Queues announcements, withdrawals and link claims from a node's command.
fn queue_facts(stream: &NodeStream, writer: &FactWriter, cmd: sb::ConfigurationCommand) -> Flow {
    let node = stream.node();
    let set = announced(&cmd.routes_to_set, node);
    let withdrawn = announced(&cmd.routes_to_delete, node);
    let claims = received(&cmd.connections_received);
    let mut facts = Vec::new();
    if !set.is_empty() || !withdrawn.is_empty() {
        facts.push(Fact::Announced { set, withdrawn });
    }
    if !claims.is_empty() {
        facts.push(Fact::Received(claims));
    }
    for fact in facts {
        if let Err(why) = writer.push(fact) {
            log_refusal(node, why);
            let status = match why {
                Refused::Full => Status::resource_exhausted("too many facts pending; reconnect"),
                Refused::Stopped => Status::aborted("this control session was replaced"),
            };
            return Flow::Close(status);
        }
    }
    Flow::Continue
}

/// Replies first: the node waits for it. The session ends after.
async fn deregister(stream: &NodeStream, message_id: String) -> Flow {
    let reply = sb::ControlMessage {
        message_id: uuid::Uuid::new_v4().to_string(),
        payload: Some(Payload::DeregisterNodeResponse(
            sb::DeregisterNodeResponse {
                original_message_id: message_id,
                success: true,
            },
        )),
    };
    let replied = stream.send(reply).await;
    info!(node = stream.node(), replied, "node deregistered");
    Flow::Done
}

/// Ends the session on this replica at once, and in the store (if still
/// current) once the facts queued before it are recorded.
pub fn end(ctx: &Arc<Ctx>, stream: &Arc<NodeStream>, writer: &FactWriter, kind: DepartureKind) {
    ctx.registry.remove(stream.node(), stream.session());
    stream.close();
    if let Err(why) = writer.push(Fact::Ended(kind)) {
        log_refusal(stream.node(), why);
        if why == Refused::Full {
            // The end must be recorded even behind a full outbox.
            FactWriter::spawn(ctx.clone(), stream.clone())
                .push(Fact::Ended(kind))
                .ok();
        }
    }
}
