//! One node's control stream from first message to end: the registration
//! handshake, then the message loop that records facts and hands replies to
//! their waiters. It records and signals; derivation is the leader's.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tonic::{Status, Streaming};
use tracing::{debug, info, warn};

use super::facts::FactWriter;
use super::handshake::{self, Refusal};
use super::{Ctx, serve};
use crate::names;
use crate::proto::sb;
use crate::proto::sb::control_message::Payload;
use crate::store::model::{DepartureKind, DesiredState, Registration};
use crate::store::{SessionStart, StoreError, retry_unavailable};
use crate::transport::NodeStream;
use crate::transport::stream::Outbound;

/// How long each of the handshake's two store calls may wait: the node
/// gives up 10 s after sending its registration.
const STORE_BUDGET: Duration = Duration::from_secs(3);

/// Drives a freshly opened stream to its end.
pub async fn drive(
    ctx: Arc<Ctx>,
    peer: Option<SocketAddr>,
    mut inbound: Streaming<sb::ControlMessage>,
    out: Outbound,
) {
    let Some((message_id, request)) = first_message(&ctx, &mut inbound, &out).await else {
        return;
    };
    let Some((stream, pending)) = handshake(&ctx, peer, message_id, request, &out).await else {
        return;
    };
    serve::serve(ctx, stream, pending, inbound, &out).await;
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

fn count_registration(ctx: &Ctx, outcome: &'static str) {
    ctx.metrics
        .registrations
        .get_or_create(&[("outcome", outcome)])
        .inc();
}

/// Answers `success: false` and ends the stream with the reason.
async fn refuse(out: &Outbound, message_id: String, why: Refusal) {
    warn!(reason = %why, "registration refused");
    let reply = sb::ControlMessage {
        message_id: uuid::Uuid::new_v4().to_string(),
        payload: Some(Payload::RegisterNodeResponse(sb::RegisterNodeResponse {
            original_message_id: message_id,
            success: false,
            ..Default::default()
        })),
    };
    let status = match why {
        Refusal::Unauthenticated(_) => Status::unauthenticated(why.to_string()),
        _ => Status::invalid_argument(why.to_string()),
    };
    if out.send(Ok(reply)).await.is_ok() {
        let _ = out.send(Err(status)).await;
    }
}

/// Validates, records the session, replies with the node's desired state
/// and marks the session ready. `None` if the stream ended on the way.
///
/// If the store cannot record the registration in time, the node is
/// answered anyway (it gives up for good on an error or after 10 s): with
/// nothing desired, which changes nothing it holds; the registration is
/// returned as pending, for the session's fact writer to record when the
/// store is back.
async fn handshake(
    ctx: &Arc<Ctx>,
    peer: Option<SocketAddr>,
    message_id: String,
    request: sb::RegisterNodeRequest,
    out: &Outbound,
) -> Option<(Arc<NodeStream>, Option<Registration>)> {
    let checked = handshake::registration(&request, peer.map(|p| p.ip())).and_then(|reg| {
        ctx.auth
            .verify(&request)
            .map(|()| reg)
            .map_err(Refusal::Unauthenticated)
    });
    let registration = match checked {
        Ok(reg) => reg,
        Err(why) => {
            count_registration(ctx, "refused");
            let reason = [("reason", why.label())];
            ctx.metrics.refusals.get_or_create(&reason).inc();
            refuse(out, message_id, why).await;
            return None;
        }
    };
    let node = registration.node_id.clone();
    let (generation, pending) = match begin(ctx, &registration, out).await? {
        Some(started) => {
            count_registration(ctx, "recorded");
            if let Some(old) = &started.replaced {
                ctx.signals.session_replaced(&node, old);
            }
            (started.session.generation, None)
        }
        None => {
            count_registration(ctx, "answered_unrecorded");
            (0, Some(registration.clone()))
        }
    };
    let stream = Arc::new(NodeStream::new(
        node.clone(),
        registration.session_id,
        generation,
        out.clone(),
        ctx.registry.gate(&node),
    ));
    ctx.registry.insert(stream.clone());
    let desired = match pending {
        Some(_) => DesiredState::default(),
        None => retry_unavailable(STORE_BUDGET, || ctx.store.desired_for_node(&node))
            .await
            .unwrap_or_else(|e| {
                warn!(%node, error = %e, "desired state unavailable; replying with none");
                DesiredState::default()
            }),
    };
    if !stream.send(registration_reply(message_id, &desired)).await {
        let writer = FactWriter::spawn(ctx.clone(), stream.clone());
        serve::end(ctx, &stream, &writer, DepartureKind::Crash);
        return None;
    }
    stream.set_ready();
    info!(%node, generation, recorded = pending.is_none(), "node registered");
    Some((stream, pending))
}

/// Records the registration: `Some(Some(start))` when recorded,
/// `Some(None)` when the store stayed unreachable (answer anyway), `None`
/// when the store refused it for good (the stream has ended).
async fn begin(
    ctx: &Ctx,
    registration: &Registration,
    out: &Outbound,
) -> Option<Option<SessionStart>> {
    let owner = ctx.identity.current();
    let started = retry_unavailable(STORE_BUDGET, || {
        ctx.store.begin_session(registration.clone(), owner.clone())
    })
    .await;
    match started {
        Ok(s) => Some(Some(s)),
        Err(StoreError::Unavailable(why)) => {
            warn!(node = %registration.node_id, %why, "store unreachable; registration kept to record later");
            Some(None)
        }
        Err(e) => {
            warn!(node = %registration.node_id, error = %e, "could not record registration");
            let _ = out.send(Err(Status::unavailable(e.to_string()))).await;
            None
        }
    }
}

fn registration_reply(message_id: String, desired: &DesiredState) -> sb::ControlMessage {
    let connections = desired
        .links
        .iter()
        .map(|l| sb::Connection {
            link_id: l.link_id.clone(),
            config_data: l.config_data.clone(),
        })
        .collect();
    let routes = desired
        .routes
        .iter()
        .map(|r| sb::Route {
            name: Some(names::to_wire(&r.name)),
            link_id: Some(r.link_id.clone()),
            direction: None,
        })
        .collect();
    sb::ControlMessage {
        message_id: uuid::Uuid::new_v4().to_string(),
        payload: Some(Payload::RegisterNodeResponse(sb::RegisterNodeResponse {
            original_message_id: message_id,
            success: true,
            connections,
            routes,
        })),
    }
}
