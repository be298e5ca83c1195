//! A TCP proxy for drills, in two roles. In front of replicas it plays the
//! load balancer the deployment docs require: a client's connection is
//! held while the backend is unreachable and the connect retried (HAProxy's
//! `retries` + `redispatch`), so a node's single reconnect attempt lands on
//! whichever replica is up. In front of Postgres it is the network path a
//! drill cuts: `cut()` resets every connection and refuses new ones until
//! `restore()`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// How long a client's connection waits for a backend.
const BACKEND_PATIENCE: Duration = Duration::from_secs(15);

struct State {
    backend: SocketAddr,
    cut: bool,
    conns: Vec<JoinHandle<()>>,
}

pub struct Proxy {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    pub async fn start(backend: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy binds");
        let addr = listener.local_addr().expect("proxy address");
        let state = Arc::new(Mutex::new(State {
            backend,
            cut: false,
            conns: Vec::new(),
        }));
        let accept = tokio::spawn(accept_loop(listener, state.clone()));
        Proxy {
            addr,
            state,
            accept,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends new connections to `backend` from now on.
    pub fn set_backend(&self, backend: SocketAddr) {
        self.lock().backend = backend;
    }

    /// Resets every connection and refuses new ones.
    pub fn cut(&self) {
        let mut st = self.lock();
        st.cut = true;
        for c in st.conns.drain(..) {
            c.abort();
        }
    }

    pub fn restore(&self) {
        self.lock().cut = false;
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<Mutex<State>>) {
    while let Ok((client, _)) = listener.accept().await {
        let lock = || state.lock().unwrap_or_else(|p| p.into_inner());
        if lock().cut {
            drop(client);
            continue;
        }
        let task = tokio::spawn(relay(client, state.clone()));
        let mut st = lock();
        st.conns.retain(|c| !c.is_finished());
        st.conns.push(task);
    }
}

async fn relay(mut client: TcpStream, state: Arc<Mutex<State>>) {
    let deadline = tokio::time::Instant::now() + BACKEND_PATIENCE;
    let mut backend = loop {
        let addr = state.lock().unwrap_or_else(|p| p.into_inner()).backend;
        match TcpStream::connect(addr).await {
            Ok(b) => break b,
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(_) => return,
        }
    };
    let _ = tokio::io::copy_bidirectional(&mut client, &mut backend).await;
}
