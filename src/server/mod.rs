//! Wiring of one replica: listeners, the southbound and northbound
//! services, the transport, and leader work under the supervisor. A single
//! replica on any store ([`start`]) leads forever; replicas sharing
//! Postgres ([`start_clustered`]) elect a leader and relay to each other.

mod clustered;
mod listen;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::ServerTlsConfig;
use tracing::info;

pub use clustered::{relay_addr, start_clustered, start_clustered_on};
pub use listen::Sockets;

use crate::cluster::admin::{AdminService, Backing};
use crate::cluster::{ElectionHandle, Identity, Inbox, Leadership, Replica, Signals};
use crate::config::{ReconcilerConfig, TopologyConfig};
use crate::northbound::{self, Northbound};
use crate::reconcile::queue::WorkQueue;
use crate::reconcile::supervisor::{self, Duties, FencedStore, Parts, QueueSlot};
use crate::southbound::auth::{AcceptAll, Authenticator};
use crate::southbound::{self, Southbound};
use crate::store::Store;
use crate::store::model::ReplicaRef;
use crate::transport::{self, Registry, Transport};

/// How a replica runs.
#[derive(Clone)]
pub struct Options {
    pub northbound: SocketAddr,
    pub southbound: SocketAddr,
    pub topology: TopologyConfig,
    /// The single replica's identity; a clustered replica gets its
    /// incarnation from the database.
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
    /// The relay listener of a clustered replica.
    pub relay_addr: Option<SocketAddr>,
    pub store: Arc<dyn Store>,
    pub transport: Arc<Transport>,
    pub inbox: Arc<Inbox>,
    pub leadership: Arc<Leadership>,
    pub identity: Arc<Identity>,
    election: Option<ElectionHandle>,
    queues: Arc<QueueSlot>,
    /// Set when the replica can no longer run (its id was taken).
    failure: watch::Receiver<Option<String>>,
    cancel: CancellationToken,
    /// Stops the relay, last: peers reach this replica's streams until the
    /// streams' ends are recorded.
    relay_cancel: CancellationToken,
    writers: TaskTracker,
    acceptors: Vec<JoinHandle<()>>,
    tasks: Vec<JoinHandle<()>>,
}

/// How long a replica going away waits for its streams' ends to be recorded.
const WRITERS_GRACE: Duration = Duration::from_secs(5);

impl Running {
    /// Hands leadership over (if leading), stops listening, closes every
    /// node stream (their nodes reconnect to another replica), waits until
    /// the streams' ends are recorded, then stops the relay and the tasks.
    /// The order lets the new leader hand over cleanly: until the ends are
    /// recorded, its requests for these nodes still reach this replica and
    /// are answered (the session is gone), instead of failing to connect.
    pub async fn shutdown(self) {
        if let Some(election) = &self.election {
            election.resign().await;
        }
        self.cancel.cancel();
        // Listening stops before any stream closes (see `listen`).
        for a in self.acceptors {
            let _ = a.await;
        }
        self.transport.registry().close_all();
        self.writers.close();
        if tokio::time::timeout(WRITERS_GRACE, self.writers.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                "some stream ends were not recorded in time; the cluster will expire them"
            );
        }
        self.relay_cancel.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
    }

    /// Hands leadership over if this replica leads; returns the epoch left.
    pub async fn step_down(&self) -> Option<u64> {
        self.election.as_ref()?.resign().await
    }

    pub fn registry(&self) -> &Arc<Registry> {
        self.transport.registry()
    }

    /// The current term's reconcile queue (`None` while not leading).
    pub fn queue(&self) -> Option<Arc<WorkQueue>> {
        self.queues.get()
    }

    /// Resolves with the reason once the replica cannot go on; never for
    /// a replica that has nothing that could fail so (a single one).
    pub async fn failed(&self) -> String {
        let mut rx = self.failure.clone();
        match rx.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone().unwrap_or_default(),
            Err(_) => std::future::pending().await,
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
        transport,
        inbox: inbox.clone(),
        leadership: Leadership::solo(1),
        identity,
        signals: inbox,
        fenced: Arc::new(move |_| fenced_store.clone()),
        duties: None,
        election: None,
    };
    core.start(sockets, opts, |_| Backing::Solo(store), None)
        .await
}

/// The parts both kinds of replica are wired from.
struct Core {
    store: Arc<dyn Store>,
    transport: Arc<Transport>,
    inbox: Arc<Inbox>,
    leadership: Arc<Leadership>,
    identity: Arc<Identity>,
    signals: Arc<dyn Signals>,
    fenced: FencedStore,
    duties: Option<Duties>,
    election: Option<ElectionHandle>,
}

/// Builds the relay service once the replica's shared state exists.
type RelayFactory = Box<dyn FnOnce(Arc<Replica>) -> crate::cluster::relay::RelayService + Send>;

/// What a clustered replica adds: its relay, its background tasks (which
/// stop with `cancel`), and how it reports that it cannot go on.
struct Extra {
    relay: RelayFactory,
    tasks: Vec<JoinHandle<()>>,
    failure: watch::Receiver<Option<String>>,
    cancel: CancellationToken,
}

impl Core {
    async fn start(
        self,
        sockets: Sockets,
        opts: Options,
        backing: impl FnOnce(Arc<Replica>) -> Backing,
        extra: Option<Extra>,
    ) -> std::io::Result<Running> {
        let cancel = extra
            .as_ref()
            .map_or_else(CancellationToken::new, |e| e.cancel.clone());
        if opts.topology.is_api_mode() {
            ensure_default_segment(self.store.as_ref()).await?;
        }
        let queues = Arc::new(QueueSlot::default());
        let replica = self.replica(&queues);
        let writers = TaskTracker::new();
        let relay_cancel = CancellationToken::new();
        let admin = AdminService::new(replica.clone(), backing(replica.clone()));
        let mut listeners = listen::Listeners::default();
        let public = self.serve_public(&opts, sockets, admin, &writers, &cancel, &mut listeners)?;
        let mut tasks = public.tasks;
        let (relay_addr, failure) =
            attach(extra, public.relay, replica, &relay_cancel, &mut tasks)?;
        tasks.push(self.supervise(&opts, &queues, &cancel));
        Ok(Running {
            northbound_addr: public.northbound,
            southbound_addr: public.southbound,
            relay_addr,
            store: self.store,
            transport: self.transport,
            inbox: self.inbox,
            leadership: self.leadership,
            identity: self.identity,
            election: self.election,
            queues,
            failure,
            cancel,
            relay_cancel,
            writers,
            acceptors: listeners.acceptors,
            tasks,
        })
    }

    /// Serves the node streams and the operator API (with the admin
    /// service) on their listeners; hands back the relay's, unused.
    fn serve_public(
        &self,
        opts: &Options,
        sockets: Sockets,
        admin: AdminService,
        writers: &TaskTracker,
        cancel: &CancellationToken,
        listeners: &mut listen::Listeners,
    ) -> std::io::Result<Public> {
        let southbound = Southbound::new(southbound::Ctx {
            store: self.store.clone(),
            registry: self.transport.registry().clone(),
            signals: self.signals.clone(),
            identity: self.identity.clone(),
            auth: opts.auth.clone(),
            register_timeout: opts.register_timeout,
            writers: writers.clone(),
        });
        let northbound = Northbound::new(northbound::Ctx {
            store: self.store.clone(),
            transport: self.transport.clone(),
            topology: opts.topology.clone(),
            signals: self.signals.clone(),
        });
        let (sb_addr, sb) =
            listen::southbound(opts, sockets.southbound, southbound, cancel, listeners)?;
        let (nb_addr, nb) = listen::northbound(
            opts,
            sockets.northbound,
            northbound,
            admin,
            cancel,
            listeners,
        )?;
        info!(southbound_addr = %sb_addr, northbound_addr = %nb_addr, "listening");
        Ok(Public {
            southbound: sb_addr,
            northbound: nb_addr,
            relay: sockets.relay,
            tasks: vec![sb, nb],
        })
    }

    /// Leader work, started and stopped with this replica's terms.
    fn supervise(
        &self,
        opts: &Options,
        queues: &Arc<QueueSlot>,
        cancel: &CancellationToken,
    ) -> JoinHandle<()> {
        let parts = Parts {
            fenced: self.fenced.clone(),
            transport: self.transport.clone(),
            inbox: self.inbox.clone(),
            topology: opts.topology.clone(),
            reconciler: opts.reconciler.clone(),
            duties: self.duties.clone(),
        };
        let leadership = self.leadership.clone();
        tokio::spawn(supervisor::supervise(
            leadership,
            parts,
            queues.clone(),
            cancel.clone(),
        ))
    }

    fn replica(&self, queues: &Arc<QueueSlot>) -> Arc<Replica> {
        let slot = queues.clone();
        Arc::new(Replica {
            identity: self.identity.clone(),
            leadership: self.leadership.clone(),
            transport: self.transport.clone(),
            election: self.election.clone(),
            queue_depth: Box::new(move || slot.get().map_or(0, |q| q.len() as u64)),
        })
    }
}

/// The public listeners at work, and the relay's listener still unused.
struct Public {
    southbound: SocketAddr,
    northbound: SocketAddr,
    relay: Option<TcpListener>,
    tasks: Vec<JoinHandle<()>>,
}

/// Serves a clustered replica's relay and adopts its tasks; returns the
/// relay's address and the failure signal.
fn attach(
    extra: Option<Extra>,
    relay: Option<TcpListener>,
    replica: Arc<Replica>,
    relay_cancel: &CancellationToken,
    tasks: &mut Vec<JoinHandle<()>>,
) -> std::io::Result<(Option<SocketAddr>, watch::Receiver<Option<String>>)> {
    let (Some(extra), Some(listener)) = (extra, relay) else {
        return Ok((None, watch::channel(None).1));
    };
    let service = (extra.relay)(replica);
    let (addr, serve) = listen::relay(listener, service, relay_cancel)?;
    tasks.extend(extra.tasks);
    tasks.push(serve);
    Ok((Some(addr), extra.failure))
}

/// API mode always has the `default` segment.
async fn ensure_default_segment(store: &dyn Store) -> std::io::Result<()> {
    store
        .add_segment(northbound::DEFAULT_SEGMENT)
        .await
        .map(|_| ())
        .map_err(std::io::Error::other)
}
