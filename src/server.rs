//! Wiring of one replica: listeners, the southbound service, the transport,
//! and (this replica being the leader in memory mode) the leader loop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::reconcile::{Inbox, Leader};
use crate::southbound::auth::{AcceptAll, Authenticator};
use crate::southbound::{self, Southbound};
use crate::store::Store;
use crate::store::model::ReplicaRef;
use crate::transport::{self, Registry, Transport};

/// HTTP/2 pings on node streams: a node whose host vanished (no FIN, no
/// RST) is detected and its session ended within interval + timeout.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// How a replica runs.
#[derive(Clone)]
pub struct Options {
    pub southbound: SocketAddr,
    pub replica: ReplicaRef,
    pub register_timeout: Duration,
    pub request_timeout: Duration,
    pub reconcile_period: Duration,
    pub auth: Arc<dyn Authenticator>,
}

impl Options {
    /// Loopback on an ephemeral port, defaults elsewhere: for tests and demos.
    pub fn loopback() -> Self {
        Self {
            southbound: SocketAddr::from(([127, 0, 0, 1], 0)),
            replica: ReplicaRef {
                id: "local".into(),
                incarnation: 1,
            },
            register_timeout: southbound::REGISTER_TIMEOUT,
            request_timeout: transport::DEFAULT_REQUEST_TIMEOUT,
            reconcile_period: Duration::from_secs(60),
            auth: Arc::new(AcceptAll),
        }
    }
}

/// A running replica.
pub struct Running {
    pub southbound_addr: SocketAddr,
    pub store: Arc<dyn Store>,
    pub transport: Arc<Transport>,
    pub inbox: Arc<Inbox>,
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Stops leader work and listeners and closes every node stream (their
    /// nodes reconnect to another replica), then waits for the tasks.
    pub async fn shutdown(self) {
        self.cancel.cancel();
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
    let southbound = Southbound::new(southbound::Ctx {
        store: store.clone(),
        registry: registry.clone(),
        signals: inbox.clone(),
        replica: opts.replica.clone(),
        auth: opts.auth.clone(),
        register_timeout: opts.register_timeout,
    });
    let listener = TcpListener::bind(opts.southbound).await?;
    let southbound_addr = listener.local_addr()?;
    info!(%southbound_addr, "southbound listening");
    let serve = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .tcp_keepalive(Some(KEEPALIVE_INTERVAL))
        .add_service(southbound.into_server())
        .serve_with_incoming_shutdown(
            TcpListenerStream::new(listener),
            cancel.clone().cancelled_owned(),
        );
    let leader = Leader::new(store.clone(), inbox.clone(), opts.reconcile_period);
    let tasks = vec![
        tokio::spawn(async move {
            if let Err(e) = serve.await {
                tracing::error!(error = %e, "southbound server failed");
            }
        }),
        tokio::spawn(leader.run(cancel.clone())),
    ];
    Ok(Running {
        southbound_addr,
        store,
        transport,
        inbox,
        cancel,
        tasks,
    })
}
