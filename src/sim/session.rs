//! One control-plane stream as the node drives it: open, register, apply
//! the registration's state, replay local subscriptions, then answer
//! commands and list requests until the stream ends or the node leaves.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

use super::SimError;
use super::commands::{ack_msg, apply, control, replay_msg};
use super::process::Proc;
use super::tables::{LIST_CHUNK, chunk_list};
use crate::proto::sb;
use crate::proto::sb::control_message::Payload;
use crate::proto::sb::controller_service_client::ControllerServiceClient;

/// The outbound queue of the real node's stream holds 128 messages.
const OUTBOUND_QUEUE: usize = 128;

/// How a node reaches the control plane.
#[derive(Debug, Clone)]
pub(crate) enum Dialer {
    /// A channel (one HTTP/2 connection, reconnecting) shared by several nodes.
    Shared(Channel),
    /// A fresh TCP connection per attempt, like the real node.
    PerAttempt(Box<Endpoint>),
}

/// An open control stream.
pub(crate) struct Stream {
    pub inbound: tonic::Streaming<sb::ControlMessage>,
    pub tx: mpsc::Sender<sb::ControlMessage>,
    _channel: Channel,
}

/// Why opening failed.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// No TCP connection (nothing listening, reset while connecting).
    Connect(String),
    /// A gRPC error from the server (or on an established connection).
    Grpc(String),
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Connect(e) | OpenError::Grpc(e) => write!(f, "{e}"),
        }
    }
}

/// What hyper says of a request made on a shared connection while that
/// connection is being replaced.
const NOT_READY: &str = "connection was not ready";

/// Opens `OpenControlChannel` and waits for the response headers.
///
/// A shared connection that broke reconnects by itself, and a request made
/// meanwhile fails at once, before anything reached a control plane: for
/// the nodes sharing it, that reconnect is the fresh dial a real node's
/// one attempt makes, so the request waits for it rather than count as
/// the attempt (bounded by the caller).
pub(crate) async fn open(dialer: &Dialer) -> Result<Stream, OpenError> {
    loop {
        match open_once(dialer).await {
            Err(OpenError::Grpc(e))
                if matches!(dialer, Dialer::Shared(_)) && e.contains(NOT_READY) =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            other => return other,
        }
    }
}

async fn open_once(dialer: &Dialer) -> Result<Stream, OpenError> {
    let channel = match dialer {
        Dialer::Shared(c) => c.clone(),
        Dialer::PerAttempt(ep) => ep.connect().await.map_err(|e| {
            OpenError::Connect(error_chain(e.to_string(), std::error::Error::source(&e)))
        })?,
    };
    let mut client = ControllerServiceClient::new(channel.clone());
    let (tx, rx) = mpsc::channel(OUTBOUND_QUEUE);
    match client.open_control_channel(ReceiverStream::new(rx)).await {
        Ok(resp) => Ok(Stream {
            inbound: resp.into_inner(),
            tx,
            _channel: channel,
        }),
        Err(status) if is_connect_error(&status) => Err(OpenError::Connect(status_text(&status))),
        Err(status) => Err(OpenError::Grpc(grpc_text(&status))),
    }
}

/// An error and its sources on one line, each distinct text once.
fn error_chain(top: String, source: Option<&(dyn std::error::Error + 'static)>) -> String {
    let mut text = top;
    let mut source = source;
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

/// `Code: message: sources`.
fn grpc_text(status: &tonic::Status) -> String {
    format!("{:?}: {}", status.code(), status_text(status))
}

fn status_text(status: &tonic::Status) -> String {
    use std::error::Error;
    error_chain(status.message().to_string(), status.source())
}

/// Whether a failed call never got a connection (as opposed to a gRPC
/// answer or a connection that broke later): the node retries those at
/// process start.
fn is_connect_error(status: &tonic::Status) -> bool {
    if status.code() != tonic::Code::Unavailable {
        return false;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(status);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            return matches!(
                io.kind(),
                ConnectionRefused
                    | ConnectionReset
                    | ConnectionAborted
                    | TimedOut
                    | NotConnected
                    | AddrNotAvailable
            );
        }
        if err.to_string().contains("tcp connect error") {
            return true;
        }
        source = err.source();
    }
    false
}

/// Sends `RegisterNodeRequest` first, then queued notifications, waits for
/// `RegisterNodeResponse` (ignoring anything else), applies its state as a
/// full-state reconcile (acked under a fresh id the control plane never
/// issued, and only when the response carried some state, as upstream
/// does), and replays local subscriptions.
pub(crate) async fn handshake(p: &Proc, s: &mut Stream) -> Result<(), String> {
    let register = p.registration().ok_or("node stopped")?;
    s.tx.send(register)
        .await
        .map_err(|_| "failed to send register request")?;
    for msg in p.attach(&s.tx) {
        let _ = s.tx.send(msg).await;
    }
    let waited = tokio::time::timeout(p.shared.options.register_timeout, wait_response(s)).await;
    let resp = match waited {
        Ok(Ok(resp)) => resp,
        Ok(Err(e)) => return Err(format!("registration handshake failed: {e}")),
        Err(_) => return Err("registration handshake timed out".to_string()),
    };
    if !resp.connections.is_empty() || !resp.routes.is_empty() {
        let cmd = sb::ConfigurationCommand {
            connections_to_create: resp.connections,
            routes_to_set: resp.routes,
            reconcile: true,
            ..Default::default()
        };
        let fresh = uuid::Uuid::new_v4().to_string();
        answer_command(p, s, &fresh, &cmd).await;
    }
    let local = p.local_names();
    if !local.is_empty() {
        p.notify(vec![replay_msg(local)]);
    }
    // Observers see `Registered` only once the response's state is in the
    // tables, so a test can check tables right after `wait_registered`.
    p.registered();
    Ok(())
}

async fn wait_response(s: &mut Stream) -> Result<sb::RegisterNodeResponse, String> {
    loop {
        let msg = match s.inbound.message().await {
            Ok(Some(msg)) => msg,
            Ok(None) => return Err("stream closed before registration response".to_string()),
            Err(_) => return Err("stream error waiting for registration response".to_string()),
        };
        if let Some(Payload::RegisterNodeResponse(resp)) = msg.payload {
            if resp.success {
                return Ok(resp);
            }
            return Err("registration rejected by control plane".to_string());
        }
    }
}

/// Applies a command and acks it; withdrawals it caused follow the ack.
async fn answer_command(p: &Proc, s: &Stream, id: &str, cmd: &sb::ConfigurationCommand) {
    let faults = p.faults();
    let applied = {
        let mut net = p.shared.network.lock();
        let who = (p.shared.key.as_str(), p.incarnation, p.revision());
        apply(&mut net, who, cmd, &faults)
    };
    let Some(mut applied) = applied else {
        return;
    };
    let owed = std::mem::take(&mut applied.owed);
    p.shared
        .failed_dials
        .fetch_add(applied.failed_dials, std::sync::atomic::Ordering::Relaxed);
    let failed = applied.connections.iter().filter(|a| !a.success).count();
    p.shared
        .failed_links
        .fetch_add(failed as u64, std::sync::atomic::Ordering::Relaxed);
    let _ = s.tx.send(ack_msg(id, applied)).await;
    p.notify(owed);
}

/// A request to the running session.
pub(crate) enum Ctl {
    Deregister(oneshot::Sender<Result<sb::DeregisterNodeResponse, SimError>>),
}

/// How a registered session ended.
pub(crate) enum End {
    /// The stream ended or failed: reconnect once.
    Broken(String),
    /// The node deregistered (or tried to): the process stops.
    Deregistered,
}

type DeregWaiter = (
    oneshot::Sender<Result<sb::DeregisterNodeResponse, SimError>>,
    Instant,
);

/// Serves a registered stream until it ends or the node deregisters.
pub(crate) async fn serve(p: &Proc, s: &mut Stream, ctl: &mut mpsc::UnboundedReceiver<Ctl>) -> End {
    let mut dereg: Option<DeregWaiter> = None;
    let mut ctl_open = true;
    loop {
        let deadline = dereg.as_ref().map_or_else(far_future, |d| d.1);
        tokio::select! {
            next = s.inbound.message() => {
                let msg = match next {
                    Ok(Some(msg)) => msg,
                    Ok(None) => return ended(dereg, "end of stream".to_string()),
                    Err(status) => return ended(dereg, grpc_text(&status)),
                };
                if let Some(resp) = handle(p, s, msg).await {
                    if let Some((reply, _)) = dereg.take() {
                        let _ = reply.send(Ok(resp));
                        return End::Deregistered;
                    }
                }
            }
            req = ctl.recv(), if ctl_open => match req {
                Some(Ctl::Deregister(reply)) => {
                    let _ = s.tx.send(deregister_msg(p)).await;
                    dereg = Some((reply, Instant::now() + p.shared.options.request_timeout));
                }
                None => ctl_open = false,
            },
            _ = tokio::time::sleep_until(deadline), if dereg.is_some() => {
                if let Some((reply, _)) = dereg.take() {
                    let _ = reply.send(Err(SimError::Timeout("DeregisterNodeResponse".into())));
                }
                return End::Deregistered;
            }
        }
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400)
}

fn ended(dereg: Option<DeregWaiter>, why: String) -> End {
    match dereg {
        Some((reply, _)) => {
            let _ = reply.send(Err(SimError::StreamClosed(why)));
            End::Deregistered
        }
        None => End::Broken(why),
    }
}

fn deregister_msg(p: &Proc) -> sb::ControlMessage {
    control(Payload::DeregisterNodeRequest(sb::DeregisterNodeRequest {
        node: Some(sb::Node {
            id: p.shared.spec.node_id.clone(),
        }),
    }))
}

/// Handles one message; returns a `DeregisterNodeResponse` when one came.
async fn handle(
    p: &Proc,
    s: &Stream,
    msg: sb::ControlMessage,
) -> Option<sb::DeregisterNodeResponse> {
    let Some(payload) = msg.payload else {
        tracing::debug!(node = %p.shared.key, "sim: control message without payload");
        return None;
    };
    if let Payload::DeregisterNodeResponse(resp) = payload {
        return Some(resp);
    }
    if matches!(payload, Payload::ConfigCommand(_)) {
        p.count_command();
    }
    if p.silent() {
        return None;
    }
    match payload {
        Payload::ConfigCommand(cmd) => {
            tracing::debug!(node = %p.shared.key, ?cmd, "sim: command");
            answer_command(p, s, &msg.message_id, &cmd).await
        }
        Payload::RouteListRequest(_) => {
            let entries = p.with_tables(|t| t.route_entries()).unwrap_or_default();
            for (chunk, done) in chunk_list(&entries, LIST_CHUNK) {
                let reply = Payload::RouteListResponse(sb::RouteListResponse {
                    original_message_id: msg.message_id.clone(),
                    entries: chunk,
                    done,
                });
                let _ = s.tx.send(control(reply)).await;
            }
        }
        Payload::ConnectionListRequest(_) => {
            let entries = p
                .with_tables(|t| t.connection_entries())
                .unwrap_or_default();
            for (chunk, done) in chunk_list(&entries, LIST_CHUNK) {
                let reply = Payload::ConnectionListResponse(sb::ConnectionListResponse {
                    original_message_id: msg.message_id.clone(),
                    entries: chunk,
                    done,
                });
                let _ = s.tx.send(control(reply)).await;
            }
        }
        other => {
            tracing::debug!(node = %p.shared.key, payload = ?std::mem::discriminant(&other), "sim: ignoring message");
        }
    }
    None
}
