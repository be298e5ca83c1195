//! One node's control stream from first message to end: the registration
//! handshake, then the message loop that records facts and hands replies to
//! their waiters. It records and signals; derivation is the leader's.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tonic::{Status, Streaming};
use tracing::{debug, info, warn};

use super::Ctx;
use super::handshake::{self, Refusal};
use crate::names;
use crate::proto::sb;
use crate::proto::sb::control_message::Payload;
use crate::store::model::{DepartureKind, DesiredState, Name, Registration};
use crate::store::{SessionStart, StoreError, retry_unavailable};
use crate::transport::NodeStream;
use crate::transport::stream::Outbound;

/// How long a fact may take to be recorded before the stream is closed so
/// the node reconnects and replays it (it never resends on its own).
const FACT_BUDGET: Duration = Duration::from_secs(5);

/// How long the handshake may wait for the store: the node gives up 10 s
/// after sending its registration.
const HANDSHAKE_BUDGET: Duration = Duration::from_secs(7);

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
    let Some(stream) = handshake(&ctx, peer, message_id, request, &out).await else {
        return;
    };
    serve(&ctx, &stream, inbound, &out).await;
}

fn payload_kind(p: &Option<Payload>) -> &'static str {
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
async fn handshake(
    ctx: &Ctx,
    peer: Option<SocketAddr>,
    message_id: String,
    request: sb::RegisterNodeRequest,
    out: &Outbound,
) -> Option<Arc<NodeStream>> {
    let checked = handshake::registration(&request, peer.map(|p| p.ip())).and_then(|reg| {
        ctx.auth
            .verify(&request)
            .map(|()| reg)
            .map_err(Refusal::Unauthenticated)
    });
    let registration = match checked {
        Ok(reg) => reg,
        Err(why) => {
            refuse(out, message_id, why).await;
            return None;
        }
    };
    let node = registration.node_id.clone();
    let started = begin(ctx, registration, out).await?;
    let session = started.session;
    let stream = Arc::new(NodeStream::new(
        node.clone(),
        session.id,
        session.generation,
        out.clone(),
    ));
    ctx.registry.insert(stream.clone());
    let desired = retry_unavailable(HANDSHAKE_BUDGET, || ctx.store.desired_for_node(&node))
        .await
        .unwrap_or_else(|e| {
            warn!(%node, error = %e, "desired state unavailable; replying with none");
            DesiredState::default()
        });
    if !stream.send(registration_reply(message_id, &desired)).await {
        end(ctx, &stream, DepartureKind::Crash).await;
        return None;
    }
    stream.set_ready();
    let ready = retry_unavailable(FACT_BUDGET, || ctx.store.mark_ready(&node, session.id)).await;
    if !matches!(ready, Ok(true)) {
        debug!(%node, ?ready, "session not current when marked ready");
    }
    ctx.signals.node_changed(&node);
    info!(%node, generation = session.generation, "node registered");
    Some(stream)
}

async fn begin(ctx: &Ctx, registration: Registration, out: &Outbound) -> Option<SessionStart> {
    let owner = ctx.replica.clone();
    let started = retry_unavailable(HANDSHAKE_BUDGET, || {
        ctx.store.begin_session(registration.clone(), owner.clone())
    })
    .await;
    match started {
        Ok(s) => Some(s),
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

/// What the loop does after a message.
enum Flow {
    Continue,
    /// The node deregistered: the stream ends normally.
    Done,
    /// The node closed the stream or it broke: the crash path.
    Gone,
    /// A fact could not be recorded: end the stream so the node replays.
    Close(Status),
}

async fn serve(
    ctx: &Ctx,
    stream: &Arc<NodeStream>,
    mut inbound: Streaming<sb::ControlMessage>,
    out: &Outbound,
) {
    loop {
        let next = tokio::select! {
            () = stream.closed() => {
                // Replaced by a newer registration, or the replica is going.
                end(ctx, stream, DepartureKind::Crash).await;
                let _ = out.send(Err(Status::aborted("control session closed by the control plane"))).await;
                return;
            }
            next = inbound.message() => next,
        };
        let flow = match next {
            Ok(Some(msg)) => on_message(ctx, stream, msg).await,
            Ok(None) => Flow::Gone,
            Err(status) => {
                debug!(node = stream.node(), %status, "stream broke");
                Flow::Gone
            }
        };
        match flow {
            Flow::Continue => {}
            Flow::Done => return,
            Flow::Gone => return end(ctx, stream, DepartureKind::Crash).await,
            Flow::Close(status) => {
                end(ctx, stream, DepartureKind::Crash).await;
                let _ = out.send(Err(status)).await;
                return;
            }
        }
    }
}

async fn on_message(ctx: &Ctx, stream: &NodeStream, msg: sb::ControlMessage) -> Flow {
    match msg.payload {
        Some(Payload::ConfigCommand(cmd)) => record_facts(ctx, stream, cmd).await,
        Some(Payload::DeregisterNodeRequest(_)) => deregister(ctx, stream, msg.message_id).await,
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
            debug!(
                node = stream.node(),
                kind = payload_kind(&other),
                "unexpected message ignored"
            );
            Flow::Continue
        }
    }
}

/// Names from route entries without a link id (announcements/withdrawals).
fn announced(routes: &[sb::Route], node: &str) -> Vec<Name> {
    routes
        .iter()
        .filter(|r| r.link_id.as_deref().is_none_or(str::is_empty))
        .filter_map(|r| {
            let parsed = r.name.as_ref().map(names::from_wire);
            match parsed {
                Some(Ok(name)) => Some(name),
                Some(Err(e)) => {
                    warn!(node, error = %e, "announcement with a bad name ignored");
                    None
                }
                None => None,
            }
        })
        .collect()
}

fn received(entries: &[sb::ConnectionEntry]) -> Vec<String> {
    entries
        .iter()
        .filter_map(|e| e.link_id.clone())
        .filter(|l| !l.is_empty())
        .collect()
}

/// Records announcements, withdrawals and link claims from a node's command.
async fn record_facts(ctx: &Ctx, stream: &NodeStream, cmd: sb::ConfigurationCommand) -> Flow {
    let node = stream.node();
    let set = announced(&cmd.routes_to_set, node);
    let withdraw = announced(&cmd.routes_to_delete, node);
    let claims = received(&cmd.connections_received);
    let session = stream.session();
    let mut result = Ok(());
    if !set.is_empty() || !withdraw.is_empty() {
        result = retry_unavailable(FACT_BUDGET, || {
            ctx.store
                .record_announcements(node, session, &set, &withdraw)
        })
        .await;
    }
    if result.is_ok() && !claims.is_empty() {
        result = retry_unavailable(FACT_BUDGET, || {
            ctx.store.record_received(node, session, &claims)
        })
        .await;
    }
    match result {
        Ok(()) => {
            ctx.signals.node_changed(node);
            Flow::Continue
        }
        Err(StoreError::StaleSession { .. }) => {
            Flow::Close(Status::aborted("this control session was replaced"))
        }
        Err(e) => {
            warn!(node, error = %e, "fact not recorded; closing the stream so the node replays it");
            Flow::Close(Status::unavailable(format!("could not record: {e}")))
        }
    }
}

/// Replies first (the node waits for it), then ends the session.
async fn deregister(ctx: &Ctx, stream: &NodeStream, message_id: String) -> Flow {
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
    end(ctx, stream, DepartureKind::Deregistered).await;
    info!(node = stream.node(), replied, "node deregistered");
    Flow::Done
}

/// Ends the session on this replica and in the store (if still current)
/// and tells the leader.
async fn end(ctx: &Ctx, stream: &NodeStream, kind: DepartureKind) {
    let node = stream.node();
    ctx.registry.remove(node, stream.session());
    stream.close();
    let ended = retry_unavailable(FACT_BUDGET, || {
        ctx.store.end_session(node, stream.session(), kind)
    })
    .await;
    match ended {
        Ok(true) => ctx.signals.node_changed(node),
        Ok(false) => debug!(node, "session already replaced; nothing to end"),
        Err(e) => warn!(node, error = %e, "session end not recorded"),
    }
}
