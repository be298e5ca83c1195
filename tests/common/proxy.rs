//! A TCP proxy for drills, in two roles. In front of replicas it plays the
//! load balancer the deployment docs require: a client's connection is
//! held while the backend is unreachable and the connect retried (HAProxy's
//! `retries` + `redispatch`), so a node's single reconnect attempt lands on
//! whichever replica is up. In front of Postgres it is the network path a
//! drill cuts: `cut()` resets every connection and refuses new ones until
//! `restore()`; `blackhole()` drops every byte instead (connections stay
//! open and silent, new ones are accepted and never answered), as a
//! partition does, until `restore()` closes them.

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
    /// While `true`, nothing is forwarded and nothing is closed.
    blackholed: tokio::sync::watch::Sender<bool>,
}

pub struct Proxy {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    pub async fn start(backend: SocketAddr) -> Proxy {
        Proxy::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), backend).await
    }

    /// Listens on `bind` (port 0: any free one).
    pub async fn start_on(bind: SocketAddr, backend: SocketAddr) -> Proxy {
        let listener = slim_cp::server::bind_wide(bind).expect("proxy binds");
        let addr = listener.local_addr().expect("proxy address");
        let state = Arc::new(Mutex::new(State {
            backend,
            cut: false,
            conns: Vec::new(),
            blackholed: tokio::sync::watch::Sender::new(false),
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

    /// Closes every connection and keeps accepting new ones: each client
    /// sees its stream end and may dial again at once.
    pub fn reset(&self) {
        for c in self.lock().conns.drain(..) {
            c.abort();
        }
    }

    /// Forwards nothing more, closes nothing: a partition.
    pub fn blackhole(&self) {
        self.lock().blackholed.send_replace(true);
    }

    pub fn restore(&self) {
        let mut st = self.lock();
        st.cut = false;
        st.blackholed.send_replace(false);
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

async fn relay(client: TcpStream, state: Arc<Mutex<State>>) {
    let holes = state
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .blackholed
        .subscribe();
    let blackholed = *holes.borrow();
    if blackholed {
        // Accepted, never answered, closed once the path is back.
        restored(holes).await;
        return;
    }
    let deadline = tokio::time::Instant::now() + BACKEND_PATIENCE;
    let backend = loop {
        let addr = state.lock().unwrap_or_else(|p| p.into_inner()).backend;
        match TcpStream::connect(addr).await {
            Ok(b) => break b,
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(_) => return,
        }
    };
    let (client_r, client_w) = client.into_split();
    let (backend_r, backend_w) = backend.into_split();
    tokio::join!(
        pump(client_r, backend_w, holes.clone()),
        pump(backend_r, client_w, holes)
    );
}

/// Copies `from` to `to` until either closes; in a black hole, drops
/// every byte and keeps both open until the path is restored.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    holes: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    let mut watch = holes.clone();
    loop {
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            () = async { let _ = watch.wait_for(|b| *b).await; } => {
                restored(holes).await;
                return;
            }
        };
        let blackholed = *holes.borrow();
        if blackholed {
            restored(holes).await;
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

async fn restored(mut holes: tokio::sync::watch::Receiver<bool>) {
    let _ = holes.wait_for(|b| !*b).await;
}
