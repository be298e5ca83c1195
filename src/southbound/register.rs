//! The registration handshake, answered within the node's window.
//!
//! A 2.0.0-alpha.2 node gives up for good if it gets no
//! `RegisterNodeResponse` within 10 s, or gets an error first. So every
//! store call of the handshake runs against one deadline, 7 s after the
//! request arrived; when the store cannot answer by then, the node is
//! answered anyway, with exactly the connections and routes it reported
//! (it applies the reply as its full state: anything else would change
//! what it holds), and the registration waits in the session's outbox
//! until the store is back.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use super::facts::FactWriter;
use super::handshake::{self, Refusal};
use super::{Ctx, serve};
use crate::names;
use crate::proto::sb;
use crate::proto::sb::control_message::Payload;
use crate::revision::Revision;
use crate::routing::linkconfig;
use crate::store::model::{DepartureKind, DesiredState, Link, Registration};
use crate::store::{SessionStart, StoreError, retry_until};
use crate::transport::NodeStream;
use crate::transport::stream::Outbound;

/// From the registration's arrival to the reply, at most: the node waits
/// 10 s, and the reply must also cross the network.
pub const HANDSHAKE_BUDGET: Duration = Duration::from_secs(7);

/// How the registration went with the store.
enum Recorded {
    Yes(SessionStart),
    /// The store did not answer in time: answered, kept to record later.
    Later,
    /// The store refused it for good.
    Refused(StoreError),
}

/// Validates, records the session, replies and marks the session ready.
/// `None` if the stream ended on the way (or the node was refused);
/// otherwise the stream and, if the store did not record it in time, the
/// registration for the session's fact writer to record later.
pub(super) async fn handshake(
    ctx: &Arc<Ctx>,
    peer: Option<SocketAddr>,
    message_id: String,
    request: sb::RegisterNodeRequest,
    out: &Outbound,
    deadline: Instant,
) -> Option<(Arc<NodeStream>, Option<Registration>)> {
    let registration = match check(ctx, &request, peer) {
        Ok(reg) => reg,
        Err(why) => {
            refused(ctx, out, message_id, why).await;
            return None;
        }
    };
    let node = registration.node_id.clone();
    let (generation, pending, reply) = match begin(ctx, &registration, deadline).await {
        Recorded::Yes(started) => {
            count(ctx, "recorded");
            ctx.seen_generation
                .fetch_max(started.session.generation, Ordering::Relaxed);
            if let Some(old) = &started.replaced {
                ctx.signals.session_replaced(&node, old);
            }
            let reply = from_desired(&started.desired, registration.revision);
            (started.session.generation, None, reply)
        }
        Recorded::Later => {
            count(ctx, "answered_unrecorded");
            let mut later = registration.clone();
            later.stale_after = Some(ctx.seen_generation.load(Ordering::Relaxed));
            (0, Some(later), echo(&request))
        }
        Recorded::Refused(e) => {
            refused(ctx, out, message_id, Refusal::Store(e.to_string())).await;
            return None;
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
    if !stream.send(envelope(message_id, reply)).await {
        let writer = FactWriter::new(ctx.clone(), stream.clone());
        serve::end(ctx, &stream, &writer, DepartureKind::Crash);
        return None;
    }
    stream.set_ready();
    info!(%node, generation, recorded = pending.is_none(), "node registered");
    Some((stream, pending))
}

/// The registration facts, if the request is acceptable and authentic.
fn check(
    ctx: &Ctx,
    request: &sb::RegisterNodeRequest,
    peer: Option<SocketAddr>,
) -> Result<Registration, Refusal> {
    let reg = handshake::registration(request, peer.map(|p| p.ip()))?;
    ctx.auth.verify(request).map_err(Refusal::Unauthenticated)?;
    // Routes with names the store could not keep were left out.
    let named = request.routes.iter().filter(|r| r.name.is_some()).count();
    ctx.metrics
        .drop_entries("bad_name", named.saturating_sub(reg.reported_routes.len()));
    Ok(reg)
}

fn count(ctx: &Ctx, outcome: &'static str) {
    let labels = [("outcome", outcome)];
    ctx.metrics.registrations.get_or_create(&labels).inc();
}

/// Counts the refusal, answers `success: false` and ends the stream.
async fn refused(ctx: &Ctx, out: &Outbound, message_id: String, why: Refusal) {
    count(ctx, "refused");
    let reason = [("reason", why.label())];
    ctx.metrics.refusals.get_or_create(&reason).inc();
    warn!(reason = %why, "registration refused");
    let reply = sb::RegisterNodeResponse {
        original_message_id: message_id,
        success: false,
        ..Default::default()
    };
    let status = match why {
        Refusal::Unauthenticated(_) => tonic::Status::unauthenticated(why.to_string()),
        _ => tonic::Status::invalid_argument(why.to_string()),
    };
    if out
        .send(Ok(Box::new(message(Payload::RegisterNodeResponse(reply)))))
        .await
        .is_ok()
    {
        let _ = out.send(Err(status)).await;
    }
}

/// Records the registration before the deadline, if the store lets it.
async fn begin(ctx: &Ctx, registration: &Registration, deadline: Instant) -> Recorded {
    let owner = ctx.identity.current();
    let started = retry_until(deadline, || {
        ctx.store.begin_session(registration.clone(), owner.clone())
    })
    .await;
    match started {
        Ok(s) => Recorded::Yes(s),
        Err(StoreError::Unavailable(why)) => {
            warn!(node = %registration.node_id, %why, "store unreachable; registration kept to record later");
            Recorded::Later
        }
        Err(e) => Recorded::Refused(e),
    }
}

/// The desired state as a node of `revision` applies it on registration:
/// a 3.x node reads each link's configuration as server requirements (see
/// `routing::linkconfig`).
fn from_desired(
    desired: &DesiredState,
    revision: Revision,
) -> (Vec<sb::Connection>, Vec<sb::Route>) {
    let config = |l: &Link| match revision {
        Revision::V2 => l.config_data.clone(),
        Revision::V3 => linkconfig::requirements(&l.dest_endpoint, &l.link_id),
    };
    let connections = desired
        .links
        .iter()
        .map(|l| sb::Connection {
            link_id: l.link_id.clone(),
            config_data: config(l),
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
    (connections, routes)
}

/// Exactly the managed connections and routes the node reported: its
/// outgoing connections with a link id (with their configuration) and its
/// routes over a link. Applied as the node's full state, it changes
/// nothing it holds.
pub fn echo(request: &sb::RegisterNodeRequest) -> (Vec<sb::Connection>, Vec<sb::Route>) {
    let outgoing = sb::ConnectionDirection::Outgoing as i32;
    let connections = request
        .connections
        .iter()
        .filter(|c| c.direction == outgoing)
        .filter_map(|c| {
            let link_id = c.link_id.clone().filter(|l| handshake::is_link_id(l))?;
            Some(sb::Connection {
                link_id,
                config_data: c.config_data.clone(),
            })
        })
        .collect();
    let routes = request
        .routes
        .iter()
        .filter(|r| r.link_id.as_deref().is_some_and(handshake::is_link_id))
        .cloned()
        .collect();
    (connections, routes)
}

fn message(payload: Payload) -> sb::ControlMessage {
    sb::ControlMessage {
        message_id: uuid::Uuid::new_v4().to_string(),
        payload: Some(payload),
    }
}

fn envelope(
    message_id: String,
    (connections, routes): (Vec<sb::Connection>, Vec<sb::Route>),
) -> sb::ControlMessage {
    message(Payload::RegisterNodeResponse(sb::RegisterNodeResponse {
        original_message_id: message_id,
        success: true,
        connections,
        routes,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_echo_keeps_exactly_what_the_node_manages() {
        let entry = |link: Option<&str>, dir: sb::ConnectionDirection| sb::ConnectionEntry {
            link_id: link.map(str::to_string),
            direction: dir as i32,
            config_data: format!("cfg-{link:?}"),
            ..Default::default()
        };
        let request = sb::RegisterNodeRequest {
            node_id: "n".into(),
            connections: vec![
                entry(Some("l-out"), sb::ConnectionDirection::Outgoing),
                entry(Some("l-in"), sb::ConnectionDirection::Incoming),
                entry(None, sb::ConnectionDirection::Outgoing),
            ],
            routes: vec![
                sb::Route {
                    link_id: Some("l-out".into()),
                    ..Default::default()
                },
                sb::Route::default(),
            ],
            ..Default::default()
        };
        let (connections, routes) = echo(&request);
        let ids: Vec<_> = connections.iter().map(|c| c.link_id.as_str()).collect();
        assert_eq!(ids, ["l-out"], "only outgoing managed connections");
        assert_eq!(connections[0].config_data, "cfg-Some(\"l-out\")");
        assert_eq!(routes.len(), 1, "only routes over a link");
    }
}
