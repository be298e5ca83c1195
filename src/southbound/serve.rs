//! A registered session's message loop: replies go to their waiters, facts
//! go to the session's [`FactWriter`], deregistration is answered before
//! the session ends. It records and signals; derivation is the leader's.

use std::sync::Arc;

use tonic::{Status, Streaming};
use tracing::{debug, info, warn};

use super::Ctx;
use super::facts::{Fact, FactWriter, Refused, log_refusal};
use crate::limits::MAX_ENTRIES;
use crate::names;
use crate::ops::Metrics;
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
    /// the node replays them. Boxed, like the message below: whatever the
    /// loop holds while it waits is part of a task that lives as long as
    /// the node.
    Close(Box<Status>),
    /// Replaced by a newer registration, or the replica is going.
    Closed,
}

/// What woke the loop.
enum Event {
    Message(Box<sb::ControlMessage>),
    Gone,
    Closed,
}

impl Event {
    fn of(next: Result<Option<sb::ControlMessage>, Status>, node: &str) -> Event {
        match next {
            Ok(Some(msg)) => Event::Message(Box::new(msg)),
            Ok(None) => Event::Gone,
            Err(status) => {
                debug!(node, %status, "stream broke");
                Event::Gone
            }
        }
    }
}

pub async fn serve(
    ctx: Arc<Ctx>,
    stream: Arc<NodeStream>,
    pending: Option<Box<Registration>>,
    mut inbound: Streaming<sb::ControlMessage>,
    out: &Outbound,
) {
    let writer = FactWriter::new(ctx.clone(), stream.clone());
    let begun = pending.map_or(Ok(()), |reg| writer.push(Fact::Begun(reg)));
    if begun.and_then(|()| writer.push(Fact::Ready)).is_err() {
        return end(&ctx, &stream, &writer, DepartureKind::Crash);
    }
    loop {
        // No await in the arms: their state would be kept beside the wait.
        let event = tokio::select! {
            () = stream.closed() => Event::Closed,
            next = inbound.message() => Event::of(next, stream.node()),
        };
        let flow = match event {
            Event::Message(msg) => Box::pin(on_message(&ctx.metrics, &stream, &writer, *msg)).await,
            Event::Gone => Flow::Gone,
            Event::Closed => Flow::Closed,
        };
        let close = match flow {
            Flow::Continue => continue,
            Flow::Done => return end(&ctx, &stream, &writer, DepartureKind::Deregistered),
            Flow::Gone => return end(&ctx, &stream, &writer, DepartureKind::Crash),
            Flow::Close(status) => *status,
            Flow::Closed => Status::aborted("control session closed by the control plane"),
        };
        end(&ctx, &stream, &writer, DepartureKind::Crash);
        let _ = Box::pin(out.send(Err(close))).await;
        return;
    }
}

async fn on_message(
    metrics: &Metrics,
    stream: &NodeStream,
    writer: &FactWriter,
    msg: sb::ControlMessage,
) -> Flow {
    match msg.payload {
        Some(Payload::ConfigCommand(cmd)) => queue_facts(metrics, stream, writer, cmd),
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
/// A bad name is dropped and counted: resending it would not cure it.
fn announced(metrics: &Metrics, routes: &[sb::Route], node: &str) -> Vec<Name> {
    let mut bad = 0;
    let mut first_error = None;
    let names = routes
        .iter()
        .filter(|r| r.link_id.as_deref().is_none_or(str::is_empty))
        .filter_map(|r| match r.name.as_ref().map(names::from_wire) {
            Some(Ok(name)) => Some(name),
            Some(Err(e)) => {
                bad += 1;
                first_error.get_or_insert(e);
                None
            }
            None => None,
        })
        .collect();
    if let Some(error) = first_error {
        // One line per command, not per name: a node must not flood the log.
        warn!(node, dropped = bad, %error, "announcements with bad names dropped");
        metrics.drop_entries("bad_name", bad);
    }
    names
}

/// Link ids the node reports receiving; malformed ones are dropped and
/// counted.
fn received(metrics: &Metrics, entries: &[sb::ConnectionEntry], node: &str) -> Vec<String> {
    let (good, bad): (Vec<String>, Vec<String>) = entries
        .iter()
        .filter_map(|e| e.link_id.clone())
        .partition(|l| super::handshake::is_link_id(l));
    if !bad.is_empty() {
        warn!(
            node,
            dropped = bad.len(),
            "claims with malformed link ids dropped"
        );
        metrics.drop_entries("bad_link_id", bad.len());
    }
    good
}

/// Queues announcements, withdrawals and link claims from a node's command.
/// A command with more entries than the limit is dropped whole: no
/// well-formed node sends one, and recording part of it would be a guess.
fn queue_facts(
    metrics: &Metrics,
    stream: &NodeStream,
    writer: &FactWriter,
    cmd: sb::ConfigurationCommand,
) -> Flow {
    let node = stream.node();
    let entries =
        cmd.routes_to_set.len() + cmd.routes_to_delete.len() + cmd.connections_received.len();
    if entries > MAX_ENTRIES {
        warn!(
            node,
            entries,
            max = MAX_ENTRIES,
            "command with too many entries dropped"
        );
        metrics.drop_entries("too_many", entries);
        return Flow::Continue;
    }
    let set = announced(metrics, &cmd.routes_to_set, node);
    let withdrawn = announced(metrics, &cmd.routes_to_delete, node);
    let claims = received(metrics, &cmd.connections_received, node);
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
                Refused::Full => {
                    metrics.drop_entries("outbox_full", 1);
                    Status::resource_exhausted("too many facts pending; reconnect")
                }
                Refused::Stopped => Status::aborted("this control session was replaced"),
            };
            return Flow::Close(Box::new(status));
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
    }
}
