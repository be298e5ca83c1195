//! Wiring of one replica: listeners, the southbound service, the transport,
//! and (this replica being the leader in memory mode) the leader loop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Server, ServerTlsConfig};
use tracing::info;

use crate::config::{ReconcilerConfig, TopologyConfig};
use crate::northbound::{self, Northbound};
use crate::reconcile::node::Reconciler;
use crate::reconcile::queue::{QueueConfig, WorkQueue, run_workers};
use crate::reconcile::{Inbox, Leader};
use crate::southbound::auth::{AcceptAll, Authenticator};
use crate::southbound::{self, Southbound};
use crate::store::Store;
use crate::store::model::ReplicaRef;
use crate::tls;
use crate::transport::{self, Registry, Transport};

/// HTTP/2 pings on node streams: a node whose host vanished (no FIN, no
/// RST) is detected and its session ended within interval + timeout.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// How a replica runs.
#[derive(Clone)]
pub struct Options {
    pub northbound: SocketAddr,
    pub southbound: SocketAddr,
    pub topology: TopologyConfig,
    pub replica: ReplicaRef,
    pub register_timeout: Duration,
    pub request_timeout: Duration,
    pub reconciler: ReconcilerConfig,
    pub auth: Arc<dyn Authenticator>,
    /// TLS for the operator API; `None` serves plaintext.
    pub northbound_tls: Option<ServerTlsConfig>,
    /// TLS for node streams; `None` serves plaintext.
    pub southbound_tls: Option<ServerTlsConfig>,
}

impl Options {
    /// Loopback on an ephemeral port, defaults elsewhere: for tests and demos.
    pub fn loopback() -> Self {
        Self {
            northbound: SocketAddr::from(([127, 0, 0, 1], 0)),
            southbound: SocketAddr::from(([127, 0, 0, 1], 0)),
            topology: TopologyConfig::Api,
            replica: ReplicaRef {
                id: "local".into(),
                incarnation: 1,
            },
            register_timeout: southbound::REGISTER_TIMEOUT,
            request_timeout: transport::DEFAULT_REQUEST_TIMEOUT,
            reconciler: ReconcilerConfig::default(),
            auth: Arc::new(AcceptAll),
            northbound_tls: None,
            southbound_tls: None,
        }
    }
}

/// A running replica.
pub struct Running {
    pub northbound_addr: SocketAddr,
    pub southbound_addr: SocketAddr,
    pub store: Arc<dyn Store>,
    pub transport: Arc<Transport>,
    pub inbox: Arc<Inbox>,
    /// The reconcile queue (its counters are the reconcilers' metrics).
    pub queue: Arc<WorkQueue>,
    cancel: CancellationToken,
    acceptors: Vec<JoinHandle<()>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Stops leader work and listeners and closes every node stream (their
    /// nodes reconnect to another replica), then waits for the tasks.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        // Listening stops before any stream closes (see `incoming`).
        for a in self.acceptors {
            let _ = a.await;
        }
        self.transport.registry().close_all();
        for t in self.tasks {
            let _ = t.await;
        }
    }

    pub fn registry(&self) -> &Arc<Registry> {
        self.transport.registry()
    }
}

/// Binds the listeners and starts serving.
pub async fn start(opts: Options, store: Arc<dyn Store>) -> std::io::Result<Running> {
    let cancel = CancellationToken::new();
    let registry = Arc::new(Registry::new());
    let transport = Arc::new(Transport::new(registry.clone(), opts.request_timeout));
    transport.observe_epoch(1);
    let inbox = Arc::new(Inbox::new());
    if opts.topology.is_api_mode() {
        ensure_default_segment(store.as_ref()).await?;
    }
    // Streams of this replica's previous life are gone with it.
    let ended = store
        .end_earlier_incarnations(&opts.replica)
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    if !ended.is_empty() {
        info!(
            sessions = ended.len(),
            "ended the sessions of this replica's previous run"
        );
    }
    let southbound = Southbound::new(southbound::Ctx {
        store: store.clone(),
        registry: registry.clone(),
        signals: inbox.clone(),
        replica: opts.replica.clone(),
        auth: opts.auth.clone(),
        register_timeout: opts.register_timeout,
    });
    let northbound = Northbound::new(northbound::Ctx {
        store: store.clone(),
        transport: transport.clone(),
        topology: opts.topology.clone(),
        signals: inbox.clone(),
    });
    let sb_listener = TcpListener::bind(opts.southbound).await?;
    let nb_listener = TcpListener::bind(opts.northbound).await?;
    let southbound_addr = sb_listener.local_addr()?;
    let northbound_addr = nb_listener.local_addr()?;
    info!(%southbound_addr, %northbound_addr, "listening");
    let shutdown = || cancel.clone().cancelled_owned();
    let mut acceptors = Vec::new();
    let sb_serve = tls::apply(Server::builder(), opts.southbound_tls.clone())?
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .tcp_keepalive(Some(KEEPALIVE_INTERVAL))
        .add_service(southbound.into_server())
        .serve_with_incoming_shutdown(incoming(sb_listener, &cancel, &mut acceptors), shutdown());
    let nb_serve = tls::apply(Server::builder(), opts.northbound_tls.clone())?
        .add_service(northbound.into_server())
        .serve_with_incoming_shutdown(incoming(nb_listener, &cancel, &mut acceptors), shutdown());
    let queue = Arc::new(WorkQueue::new(QueueConfig::from(&opts.reconciler)));
    let (leader, mut workers) = leader_work(&opts, &store, &transport, &inbox, &queue, &cancel);
    let mut tasks = vec![
        tokio::spawn(log_failure("southbound", sb_serve)),
        tokio::spawn(log_failure("northbound", nb_serve)),
        tokio::spawn(leader.run(cancel.clone())),
    ];
    tasks.append(&mut workers);
    Ok(Running {
        northbound_addr,
        southbound_addr,
        store,
        transport,
        inbox,
        queue,
        cancel,
        acceptors,
        tasks,
    })
}

/// The leader loop and its reconcile workers (this replica is the leader:
/// memory mode has one replica).
fn leader_work(
    opts: &Options,
    store: &Arc<dyn Store>,
    transport: &Arc<Transport>,
    inbox: &Arc<Inbox>,
    queue: &Arc<WorkQueue>,
    cancel: &CancellationToken,
) -> (Leader, Vec<JoinHandle<()>>) {
    let reconciler = Arc::new(Reconciler {
        store: store.clone(),
        transport: transport.clone(),
        epoch: 1,
        orphan_detection: opts.reconciler.enable_orphan_detection,
    });
    let workers = run_workers(
        queue.clone(),
        opts.reconciler.workers,
        cancel.clone(),
        move |node| {
            let r = reconciler.clone();
            async move { r.run(&node).await }
        },
    );
    let leader = Leader::new(
        store.clone(),
        inbox.clone(),
        queue.clone(),
        opts.topology.clone(),
        opts.reconciler.reconcile_period,
    );
    (leader, workers)
}

/// Accepted connections, until `cancel`: then the listening socket closes
/// at once, before any stream is closed, so a node's single reconnect
/// attempt is refused here and goes (through the load balancer) to a
/// replica that is up, instead of landing on one that is going away.
fn incoming(
    listener: TcpListener,
    cancel: &CancellationToken,
    acceptors: &mut Vec<JoinHandle<()>>,
) -> ReceiverStream<std::io::Result<TcpStream>> {
    let (tx, rx) = mpsc::channel(64);
    let cancel = cancel.clone();
    let acceptor = tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = cancel.cancelled() => break,
                accepted = listener.accept() => accepted.map(|(stream, _)| stream),
            };
            if tx.send(accepted).await.is_err() {
                break;
            }
        }
        drop(listener);
    });
    acceptors.push(acceptor);
    ReceiverStream::new(rx)
}

async fn log_failure(
    what: &'static str,
    serve: impl std::future::Future<Output = Result<(), tonic::transport::Error>>,
) {
    if let Err(e) = serve.await {
        tracing::error!(error = %e, "{what} server failed");
    }
}

/// API mode always has the `default` segment.
async fn ensure_default_segment(store: &dyn Store) -> std::io::Result<()> {
    store
        .add_segment(northbound::DEFAULT_SEGMENT)
        .await
        .map(|_| ())
        .map_err(|e| std::io::Error::other(e.to_string()))
}
