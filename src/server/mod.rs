//! Wiring of one replica: listeners, the southbound and northbound
//! services, the transport, leader work under the supervisor, and the
//! operator's endpoints (health, metrics). A single replica on any store
//! ([`start`]) leads forever; replicas sharing Postgres
//! ([`start_clustered`]) elect a leader and relay to each other.

mod clustered;
mod core;
mod handover;
mod listen;
mod running;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tonic::transport::ServerTlsConfig;
use tracing::info;

pub use clustered::{relay_addr, start_clustered, start_clustered_on};
pub use listen::{Sockets, bind_wide};
pub use running::Running;

use self::core::Core;
use crate::auth::Domains;
use crate::cluster::admin::Backing;
use crate::cluster::{Identity, Inbox, Leadership};
use crate::config::{DrainConfig, ReconcilerConfig, TopologyConfig};
use crate::ops::{Health, Metrics};
use crate::southbound::auth::{AcceptAll, Authenticator};
use crate::store::Store;
use crate::store::model::ReplicaRef;
use crate::transport::{self, Registry, Transport};

/// How a replica runs.
#[derive(Clone)]
pub struct Options {
    pub northbound: SocketAddr,
    pub southbound: SocketAddr,
    /// The HTTP endpoint (health, readiness, metrics); `None`: off.
    pub http: Option<SocketAddr>,
    pub topology: TopologyConfig,
    /// The single replica's identity; a clustered replica gets its
    /// incarnation from the database.
    pub replica: ReplicaRef,
    pub register_timeout: Duration,
    pub request_timeout: Duration,
    pub reconciler: ReconcilerConfig,
    pub drain: DrainConfig,
    pub auth: Arc<dyn Authenticator>,
    /// The registration-auth domains managed through the API; `None`
    /// unless registration auth is `shared_secret` (then `auth` accepts
    /// their secrets too).
    pub domains: Option<Arc<Domains>>,
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
            http: None,
            topology: TopologyConfig::Api,
            replica: ReplicaRef {
                id: "local".into(),
                incarnation: 1,
            },
            register_timeout: crate::southbound::REGISTER_TIMEOUT,
            request_timeout: transport::DEFAULT_REQUEST_TIMEOUT,
            reconciler: ReconcilerConfig::default(),
            drain: DrainConfig::default(),
            auth: Arc::new(AcceptAll),
            domains: None,
            northbound_tls: None,
            southbound_tls: None,
        }
    }
}

/// Binds the listeners and starts a single replica that leads forever.
pub async fn start(opts: Options, store: Arc<dyn Store>) -> std::io::Result<Running> {
    let sockets = Sockets::bind(&opts, None)?;
    start_on(sockets, opts, store).await
}

/// [`start`] on listeners bound beforehand (see [`Sockets`]).
pub async fn start_on(
    sockets: Sockets,
    opts: Options,
    store: Arc<dyn Store>,
) -> std::io::Result<Running> {
    let registry = Arc::new(Registry::new());
    let transport = Arc::new(Transport::new(registry, opts.request_timeout));
    transport.observe_epoch(1);
    let identity = Arc::new(Identity::new(opts.replica.clone()));
    // Streams of this replica's previous life are gone with it.
    let ended = store
        .end_earlier_incarnations(&opts.replica)
        .await
        .map_err(std::io::Error::other)?;
    if !ended.is_empty() {
        info!(
            sessions = ended.len(),
            "ended the sessions of this replica's previous run"
        );
    }
    let inbox = Arc::new(Inbox::new());
    let fenced_store = store.clone();
    let core = Core {
        store: store.clone(),
        pg: None,
        transport,
        inbox: inbox.clone(),
        leadership: Leadership::solo(1),
        identity,
        signals: inbox,
        fenced: Arc::new(move |_| fenced_store.clone()),
        duties: None,
        election: None,
        health: Health::new(),
        metrics: Metrics::new(),
        seen_generation: Arc::default(),
    };
    core.start(sockets, opts, |_| Backing::Solo(store), None)
        .await
}
