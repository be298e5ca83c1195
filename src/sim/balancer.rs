//! A TCP load balancer for a simulated fleet in front of several replicas,
//! as the deployment docs require one: connections are spread round-robin,
//! and a backend that refuses the connect is skipped for the next one at
//! once (HAProxy's `option redispatch` with `retries`). It holds no client
//! waiting for a backend to come back, which no real balancer does either.
//! For tests, benchmarks and demos; not a production balancer.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Rounds over every backend before a client's connection is dropped.
const ROUNDS: usize = 2;
/// Bound on one backend connect (a black-holed backend).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

struct Shared {
    backends: Mutex<Vec<SocketAddr>>,
    next: AtomicUsize,
}

pub struct Balancer {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Balancer {
    /// Listens on an ephemeral loopback port.
    pub async fn start(backends: Vec<SocketAddr>) -> std::io::Result<Balancer> {
        // A fleet dials it all at once: a short backlog resets nodes.
        let listener = crate::server::bind_wide(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            backends: Mutex::new(backends),
            next: AtomicUsize::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(Balancer {
            addr,
            shared,
            accept,
        })
    }

    /// Replaces the backend list (a replica restarted on another port).
    pub fn set_backends(&self, backends: Vec<SocketAddr>) {
        *self
            .shared
            .backends
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = backends;
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        match listener.accept().await {
            Ok((client, _)) => {
                tokio::spawn(relay(client, shared.clone()));
            }
            // A client gone before its accept, or fds or buffers short for
            // a moment: ending here would reset every connection still in
            // the backlog and refuse the rest, which no balancer does.
            Err(e) => {
                eprintln!("balancer: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// The backends in the order this connection tries them.
fn order(shared: &Shared) -> Vec<SocketAddr> {
    let backends = shared
        .backends
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    if backends.is_empty() {
        return backends;
    }
    let start = shared.next.fetch_add(1, Ordering::Relaxed) % backends.len();
    let mut out = backends[start..].to_vec();
    out.extend_from_slice(&backends[..start]);
    out
}

async fn relay(mut client: TcpStream, shared: Arc<Shared>) {
    let peer = client.peer_addr().ok();
    // As load balancers do: without it every small gRPC frame relayed
    // waits for the peer's delayed ACK (a relayed command took 45-90 ms
    // instead of 2-6).
    let _ = client.set_nodelay(true);
    for _ in 0..ROUNDS {
        for addr in order(&shared) {
            let connect = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr));
            match connect.await {
                Ok(Ok(mut backend)) => {
                    let _ = backend.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut backend).await;
                    return;
                }
                // Shown with a failing test's output: which backend refused when.
                other => eprintln!(
                    "{:?} balancer: {peer:?} -> {addr}: {other:?}",
                    std::time::SystemTime::now()
                ),
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("balancer: {peer:?}: no backend took the connection");
}
