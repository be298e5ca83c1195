//! The listeners. Each accepts through [`incoming`], so on shutdown the
//! listening socket closes at once, before any stream is closed: a node's
//! single reconnect attempt is refused here and goes (through the load
//! balancer) to a replica that is up, instead of landing on one that is
//! going away. The node listener also closes and opens again as
//! [`Health::should_listen`] says ([`gated`]): a replica that cannot serve
//! (its database away, drained) refuses connects instead of taking
//! handshakes it cannot complete.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;

use super::Options;
use std::sync::Arc;

use tonic_health::server::{HealthReporter, health_reporter};

use crate::cluster::admin::AdminService;
use crate::cluster::relay::RelayService;
use crate::northbound::Northbound;
use crate::ops;
use crate::ops::Health;
use crate::ops::http::Endpoint;
use crate::southbound::Southbound;
use crate::tls;

/// HTTP/2 pings on node streams: a node whose host vanished (no FIN, no
/// RST) is detected and its session ended within interval + timeout.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Pings between replicas: a peer cut off is noticed in seconds.
const RELAY_KEEPALIVE: Duration = Duration::from_secs(5);

/// The accept loops, awaited on shutdown before streams close.
#[derive(Default)]
pub struct Listeners {
    pub acceptors: Vec<JoinHandle<()>>,
}

/// The listening sockets, placed where a killed process closes them first.
///
/// Why: when a replica is killed (kill -9, OOM), the kernel releases its
/// sockets one by one, the highest descriptor first (measured: streams
/// were reset several milliseconds before the listener closed). A node
/// whose stream is reset reconnects within a millisecond; while the
/// listener is still open, that reconnect completes its handshake in the
/// dying process's backlog and is reset, and the node gives up for good.
/// So each listener is moved to a descriptor above any a stream can get
/// (near the open-files limit, which is raised to its maximum first): it
/// closes before any stream, the reconnect is refused, and the load
/// balancer sends it to a live replica.
pub struct Sockets {
    pub(super) southbound: TcpListener,
    pub(super) relay: Option<TcpListener>,
    pub(super) northbound: TcpListener,
    pub(super) http: Option<TcpListener>,
}

/// Connections waiting to be accepted: a reconnect storm of thousands of
/// nodes must not overflow it.
const BACKLOG: u32 = 4096;

impl Sockets {
    /// Binds the listeners of `opts`, and the relay's at `relay` if given.
    /// Must run inside the runtime.
    pub fn bind(opts: &Options, relay: Option<SocketAddr>) -> std::io::Result<Sockets> {
        let southbound = listen_on(opts.southbound)?;
        let relay = relay.map(listen_on).transpose()?;
        let northbound = listen_on(opts.northbound)?;
        let http = opts.http.map(listen_on).transpose()?;
        Ok(Sockets {
            southbound,
            relay,
            northbound,
            http,
        })
    }

    pub fn relay_addr(&self) -> Option<SocketAddr> {
        self.relay.as_ref().and_then(|l| l.local_addr().ok())
    }
}

/// A listening socket on `addr` whose backlog holds a storm's connects.
///
/// Why: a short backlog (tokio's `TcpListener::bind` gets 128 here)
/// overflows when hundreds of nodes dial at once while the accepting
/// process is busy; the kernel then answers with SYN cookies, and a node
/// whose handshake ACK was dropped and whose next segment carries data
/// fails the cookie check and is reset: it gives up for good. Anything
/// that accepts node connections (replicas, the simulated balancer, test
/// proxies) listens through this. Must run inside the runtime.
pub fn bind_wide(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

fn listen_on(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let listener = bind_wide(addr)?.into_std()?;
    // The top slots are few: several replicas in one process (tests) can
    // use them all up. A listener left low still works; it only loses the
    // ordering on kill described above.
    let listener = match rustix::io::fcntl_dupfd_cloexec(&listener, top_descriptor()) {
        Ok(high) => std::net::TcpListener::from(high),
        Err(_) => listener,
    };
    listener.set_nonblocking(true)?;
    TcpListener::from_std(listener)
}

/// Descriptors a busy replica's streams will not reach: the top of the
/// open-files limit, raised to its hard maximum (a replica holding
/// thousands of node streams needs it anyway).
fn top_descriptor() -> i32 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        let _ = setrlimit(Resource::Nofile, raised);
    }
    let current = getrlimit(Resource::Nofile).current.unwrap_or(1024);
    // Three listeners below the limit, and room for the runtime's own.
    i32::try_from(current.saturating_sub(16)).unwrap_or(1008)
}

type Served = (SocketAddr, JoinHandle<()>);

/// A public listener at work, and the health service it reports through.
pub struct Public {
    pub addr: SocketAddr,
    pub task: JoinHandle<()>,
    pub health: HealthReporter,
}

/// Node streams. The listener is open while `health` says it should be
/// (see [`gated`]); the streams go on until `cancel`.
pub fn southbound(
    opts: &Options,
    listener: TcpListener,
    service: Southbound,
    health: &Arc<Health>,
    cancel: &CancellationToken,
    listeners: &mut Listeners,
) -> std::io::Result<Public> {
    let addr = listener.local_addr()?;
    let accepted = gated(listener, addr, health.clone(), cancel, listeners);
    let (health, health_service) = health_reporter();
    let serve = tls::apply(Server::builder(), opts.southbound_tls.clone())?
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .tcp_keepalive(Some(KEEPALIVE_INTERVAL))
        .add_service(health_service)
        .add_service(service.into_server())
        .serve_with_incoming_shutdown(accepted, cancel.clone().cancelled_owned());
    let task = tokio::spawn(log_failure("southbound", serve));
    Ok(Public { addr, task, health })
}

/// The upstream operator API and slim-cp's admin service, on one port.
pub fn northbound(
    opts: &Options,
    listener: TcpListener,
    service: Northbound,
    admin: AdminService,
    cancel: &CancellationToken,
    listeners: &mut Listeners,
) -> std::io::Result<Public> {
    let addr = listener.local_addr()?;
    let (health, health_service) = health_reporter();
    let serve = tls::apply(Server::builder(), opts.northbound_tls.clone())?
        .add_service(health_service)
        .add_service(service.into_server())
        .add_service(admin.into_server())
        .serve_with_incoming_shutdown(
            incoming(listener, cancel, cancel, listeners),
            cancel.clone().cancelled_owned(),
        );
    let task = tokio::spawn(log_failure("northbound", serve));
    Ok(Public { addr, task, health })
}

/// The HTTP endpoint (health, readiness, metrics), until `cancel`.
pub fn http(
    listener: TcpListener,
    endpoint: Arc<Endpoint>,
    cancel: &CancellationToken,
) -> std::io::Result<Served> {
    let addr = listener.local_addr()?;
    let task = tokio::spawn(ops::http::serve(listener, endpoint, cancel.clone()));
    Ok((addr, task))
}

/// The relay, on its own listener. Its accept loop is not among the
/// public `listeners`: it outlives them (see `Running::shutdown`).
pub fn relay(
    listener: TcpListener,
    service: RelayService,
    cancel: &CancellationToken,
) -> std::io::Result<Served> {
    let mut own = Listeners::default();
    let listeners = &mut own;
    let addr = listener.local_addr()?;
    let serve = Server::builder()
        .http2_keepalive_interval(Some(RELAY_KEEPALIVE))
        .http2_keepalive_timeout(Some(RELAY_KEEPALIVE))
        .tcp_keepalive(Some(RELAY_KEEPALIVE))
        .add_service(service.into_server())
        .serve_with_incoming_shutdown(
            incoming(listener, cancel, cancel, listeners),
            cancel.clone().cancelled_owned(),
        );
    Ok((addr, tokio::spawn(log_failure("relay", serve))))
}

/// Accepted connections, until `stop`: then the listening socket closes
/// (connects are refused, which a node retries and a load balancer
/// redispatches), while the connections accepted so far go on until
/// `end` (the server's shutdown, which sends them GOAWAY).
fn incoming(
    listener: TcpListener,
    stop: &CancellationToken,
    end: &CancellationToken,
    listeners: &mut Listeners,
) -> ReceiverStream<std::io::Result<TcpStream>> {
    let (tx, rx) = mpsc::channel(64);
    let (stop, end) = (stop.clone(), end.clone());
    let acceptor = tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = stop.cancelled() => break,
                accepted = listener.accept() => accepted.map(|(stream, _)| stream),
            };
            // gRPC writes small frames (acks, list replies, commands): with
            // Nagle's algorithm they wait for the peer's delayed ACK, up to
            // 40 ms each (measured on relayed commands).
            if let Ok(stream) = &accepted {
                let _ = stream.set_nodelay(true);
            }
            if tx.send(accepted).await.is_err() {
                break;
            }
        }
        drop(listener);
        // Ending the stream would shut the server down: wait for that.
        end.cancelled().await;
        drop(tx);
    });
    listeners.acceptors.push(acceptor);
    ReceiverStream::new(rx)
}

/// Accepted connections while `health` says the listener should be open.
/// When it should not, the socket is dropped (connects are refused); when
/// it should again, a new one is bound to the same address. The socket's
/// state goes back to `health`. Connections accepted so far go on until
/// `end`.
fn gated(
    listener: TcpListener,
    addr: SocketAddr,
    health: Arc<Health>,
    end: &CancellationToken,
    listeners: &mut Listeners,
) -> ReceiverStream<std::io::Result<TcpStream>> {
    let (tx, rx) = mpsc::channel(64);
    let end = end.clone();
    let acceptor = tokio::spawn(async move {
        let mut intake = health.should_listen();
        let mut open = Some(listener);
        health.set_listening(true);
        loop {
            let step = match &open {
                None => closed(&mut intake, &end).await,
                Some(listener) => listening(listener, &mut intake, &end).await,
            };
            match step {
                Step::End => break,
                Step::Close => {
                    let waiting = open.take().map(take_backlog).unwrap_or_default();
                    health.set_listening(false);
                    tracing::info!(%addr, waiting = waiting.len(), "stopped listening for nodes");
                    for stream in waiting {
                        if tx.send(Ok(stream)).await.is_err() {
                            break;
                        }
                    }
                }
                Step::Reopen => {
                    open = reopen_at(addr, &end).await;
                    if open.is_some() {
                        health.set_listening(true);
                        tracing::info!(%addr, "listening for nodes again");
                    }
                }
                Step::Accepted(accepted) => {
                    if let Ok(stream) = &accepted {
                        let _ = stream.set_nodelay(true);
                    }
                    if tx.send(accepted).await.is_err() {
                        break;
                    }
                }
            }
        }
        drop(open);
        health.set_listening(false);
        end.cancelled().await;
        drop(tx);
    });
    listeners.acceptors.push(acceptor);
    ReceiverStream::new(rx)
}

/// Closes `listener`, keeping the connections in its backlog.
///
/// Why: closing a listening socket resets every connection the kernel
/// has completed but nobody accepted yet, and a node whose dial meets a
/// reset gives up for good (`spec/protocol-notes.md`); a connect refused
/// after the close is retried instead. So the backlog is accepted first
/// and served like any handshake already under way (answered even with
/// the database away; moved later by closing the registered stream).
/// What arrives between the last accept and the close (microseconds) is
/// still reset.
fn take_backlog(listener: TcpListener) -> Vec<TcpStream> {
    let mut taken = Vec::new();
    let listener = match listener.into_std() {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "cannot take the node listener's backlog");
            return taken;
        }
    };
    loop {
        match listener.accept() {
            Ok((stream, _)) => match adopt(stream) {
                Ok(s) => taken.push(s),
                Err(e) => tracing::debug!(error = %e, "a connection from the backlog is gone"),
            },
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // A peer gone before its accept: the next one may still be there.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionAborted => {}
            Err(e) => {
                tracing::warn!(error = %e, "stopped taking the node listener's backlog");
                break;
            }
        }
    }
    taken
}

/// A connection accepted outside the runtime, ready for the server.
fn adopt(stream: std::net::TcpStream) -> std::io::Result<TcpStream> {
    stream.set_nonblocking(true)?;
    stream.set_nodelay(true)?;
    TcpStream::from_std(stream)
}

/// What the node listener does next.
enum Step {
    End,
    Close,
    Reopen,
    Accepted(std::io::Result<TcpStream>),
}

/// Waits, the socket closed, until it should open again.
async fn closed(intake: &mut watch::Receiver<bool>, end: &CancellationToken) -> Step {
    tokio::select! {
        () = end.cancelled() => Step::End,
        reopen = intake.wait_for(|o| *o) => match reopen {
            Ok(_) => Step::Reopen,
            Err(_) => Step::End,
        },
    }
}

/// The next connection, unless the socket should close first.
async fn listening(
    listener: &TcpListener,
    intake: &mut watch::Receiver<bool>,
    end: &CancellationToken,
) -> Step {
    tokio::select! {
        () = end.cancelled() => Step::End,
        shut = intake.wait_for(|o| !*o) => match shut {
            Ok(_) => Step::Close,
            Err(_) => Step::End,
        },
        accepted = listener.accept() => Step::Accepted(accepted.map(|(stream, _)| stream)),
    }
}

/// A listener on `addr` again; retried every second while the address is
/// taken (by whom, the log says), `None` once `end`.
async fn reopen_at(addr: SocketAddr, end: &CancellationToken) -> Option<TcpListener> {
    loop {
        match listen_on(addr) {
            Ok(l) => return Some(l),
            Err(e) => tracing::warn!(%addr, error = %e, "cannot listen for nodes again; retrying"),
        }
        tokio::select! {
            () = end.cancelled() => return None,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

async fn log_failure(
    what: &'static str,
    serve: impl std::future::Future<Output = Result<(), tonic::transport::Error>>,
) {
    if let Err(e) = serve.await {
        tracing::error!(error = %e, "{what} server failed");
    }
}

#[cfg(test)]
#[path = "listen_tests.rs"]
mod tests;
