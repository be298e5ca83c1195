//! One node's control stream from first message to end: the registration
//! handshake, then the message loop that records facts and hands replies to
//! their waiters. It records and signals; derivation is the leader's.

use std::net::SocketAddr;
use std::sync::Arc;

use tonic::{Status, Streaming};
use tracing::{debug, info};

use super::register::{HANDSHAKE_BUDGET, handshake};
use super::{Ctx, serve};
use crate::proto::sb;
use crate::proto::sb::control_message::Payload;
use crate::transport::stream::Outbound;

/// Drives a freshly opened stream to its end.
///
/// This task lives as long as the node, and a task is as large as the
/// largest state of its future, with room for every local any state
/// keeps: so each stage is boxed, and this future holds little more than
/// pointers to them (3.1 KB a node unboxed, against 1.1 KB for the
/// message loop alone).
pub async fn drive(
    ctx: Arc<Ctx>,
    peer: Option<SocketAddr>,
    inbound: Streaming<sb::ControlMessage>,
    out: Outbound,
) {
    let registered = Box::pin(register(&ctx, peer, inbound, &out)).await;
    let Some((stream, pending, inbound)) = registered else {
        return;
    };
    Box::pin(serve::serve(ctx, stream, pending, inbound, &out)).await;
}

/// The registration's stream, any registration kept to record later (the
/// rare one answered before the store could record it), and the inbound
/// stream for the loop; `None` when the stream ended before.
type Registered = (
    Arc<crate::transport::NodeStream>,
    Option<Box<crate::store::model::Registration>>,
    Streaming<sb::ControlMessage>,
);

/// Waits for the registration and answers it.
async fn register(
    ctx: &Arc<Ctx>,
    peer: Option<SocketAddr>,
    mut inbound: Streaming<sb::ControlMessage>,
    out: &Outbound,
) -> Option<Registered> {
    let (message_id, request) = first_message(ctx, &mut inbound, out).await?;
    // The node gives up 10 s after sending its registration: everything
    // up to the reply runs against one deadline, from its arrival.
    let deadline = tokio::time::Instant::now() + HANDSHAKE_BUDGET;
    let (stream, pending) = handshake(ctx, peer, message_id, request, out, deadline).await?;
    Some((stream, pending.map(Box::new), inbound))
}

pub(super) fn payload_kind(p: &Option<Payload>) -> &'static str {
    match p {
        None => "an empty message",
        Some(Payload::ConfigCommand(_)) => "ConfigurationCommand",
        Some(Payload::Ack(_)) => "Ack",
        Some(Payload::RouteListRequest(_)) => "RouteListRequest",
        Some(Payload::RouteListResponse(_)) => "RouteListResponse",
        Some(Payload::ConnectionListRequest(_)) => "ConnectionListRequest",
        Some(Payload::ConnectionListResponse(_)) => "ConnectionListResponse",
        Some(Payload::RegisterNodeRequest(_)) => "RegisterNodeRequest",
        Some(Payload::RegisterNodeResponse(_)) => "RegisterNodeResponse",
        Some(Payload::DeregisterNodeRequest(_)) => "DeregisterNodeRequest",
        Some(Payload::DeregisterNodeResponse(_)) => "DeregisterNodeResponse",
        Some(Payload::ConfigCommandAck(_)) => "ConfigurationCommandAck",
    }
}

/// Waits for the first message, which must be a `RegisterNodeRequest`.
async fn first_message(
    ctx: &Ctx,
    inbound: &mut Streaming<sb::ControlMessage>,
    out: &Outbound,
) -> Option<(String, sb::RegisterNodeRequest)> {
    let refusal = match tokio::time::timeout(ctx.register_timeout, inbound.message()).await {
        Err(_) => Status::deadline_exceeded(format!(
            "no RegisterNodeRequest within {:?} of opening the stream",
            ctx.register_timeout
        )),
        Ok(Ok(Some(sb::ControlMessage {
            message_id,
            payload: Some(Payload::RegisterNodeRequest(req)),
        }))) => return Some((message_id, req)),
        Ok(Ok(Some(other))) => Status::invalid_argument(format!(
            "the first message must be RegisterNodeRequest, got {}",
            payload_kind(&other.payload)
        )),
        Ok(Ok(None)) => return None,
        Ok(Err(status)) => {
            debug!(%status, "stream failed before registration");
            return None;
        }
    };
    info!(
        reason = refusal.message(),
        "closing stream before registration"
    );
    let _ = out.send(Err(refusal)).await;
    None
}
