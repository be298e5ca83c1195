//! The parts both kinds of replica are wired from, and the wiring.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::info;

use super::listen::{self, Public};
use super::running::{Parts as RunningParts, Running};
use super::{Options, Sockets};
use crate::cluster::admin::{AdminService, Backing};
use crate::cluster::relay::{Guard, RelayService};
use crate::cluster::{ElectionHandle, Identity, Inbox, Leadership, Replica, Signals};
use crate::northbound::{self, Northbound};
use crate::ops::http::Endpoint;
use crate::ops::metrics::Live;
use crate::ops::{Health, Metrics, grpc_health};
use crate::reconcile::supervisor::{self, Duties, FencedStore, Parts, QueueSlot};
use crate::southbound::{self, Southbound};
use crate::store::{PgStore, Store};
use crate::transport::Transport;

/// The services on the node listener, as the gRPC health service names them.
const SOUTHBOUND_SERVICE: &str = "controller.proto.v1.ControllerService";
const NORTHBOUND_SERVICE: &str = "controlplane.proto.v1.ControlPlaneService";

pub(super) struct Core {
    pub store: Arc<dyn Store>,
    /// The same store, when it is Postgres (for its metrics).
    pub pg: Option<PgStore>,
    pub transport: Arc<Transport>,
    pub inbox: Arc<Inbox>,
    pub leadership: Arc<Leadership>,
    pub identity: Arc<Identity>,
    pub signals: Arc<dyn Signals>,
    pub fenced: FencedStore,
    pub duties: Option<Duties>,
    pub election: Option<ElectionHandle>,
    pub health: Arc<Health>,
    pub metrics: Arc<Metrics>,
    /// See `southbound::Ctx::seen_generation`.
    pub seen_generation: Arc<std::sync::atomic::AtomicU64>,
}

/// Builds the relay service once the replica's shared state exists.
pub(super) type RelayFactory = Box<dyn FnOnce(Arc<Replica>) -> RelayService + Send>;

/// What a clustered replica adds: its relay, its background tasks (which
/// stop with `cancel`), and how it reports that it cannot go on.
pub(super) struct Extra {
    pub relay: RelayFactory,
    pub guard: Guard,
    pub tasks: Vec<JoinHandle<()>>,
    pub failure: watch::Receiver<Option<String>>,
    pub cancel: CancellationToken,
}

/// Cancellation of a replica's parts, in the order they stop.
struct Tokens {
    cancel: CancellationToken,
    relay: CancellationToken,
}

impl Core {
    pub(super) async fn start(
        self,
        sockets: Sockets,
        opts: Options,
        backing: impl FnOnce(Arc<Replica>) -> Backing,
        extra: Option<Extra>,
    ) -> std::io::Result<Running> {
        let cancel = extra
            .as_ref()
            .map_or_else(CancellationToken::new, |e| e.cancel.clone());
        let tokens = Tokens {
            cancel,
            relay: CancellationToken::new(),
        };
        if opts.topology.is_api_mode() {
            ensure_default_segment(self.store.as_ref()).await?;
        }
        let queues = Arc::new(QueueSlot::default());
        let drain_requested = Arc::new(Notify::new());
        let replica = self.replica(&queues, &drain_requested);
        let writers = TaskTracker::new();
        let admin = AdminService::new(replica.clone(), backing(replica.clone()));
        let mut listeners = listen::Listeners::default();
        let Sockets {
            southbound,
            relay,
            northbound,
            http,
        } = sockets;
        let public = (southbound, northbound, admin);
        let (sb, nb) = self.serve_public(&opts, public, &writers, &tokens, &mut listeners)?;
        let mut tasks = vec![sb.task, nb.task];
        let reporters = vec![sb.health, nb.health];
        let services = vec![SOUTHBOUND_SERVICE, NORTHBOUND_SERVICE];
        tasks.push(grpc_health::follow(
            self.health.clone(),
            reporters,
            services,
            tokens.cancel.clone(),
        ));
        tasks.push(self.health.tick(tokens.cancel.clone()));
        // Config mode: the file is the only source of secrets, as in the
        // reference, which restores stored ones in API mode only.
        let stored_domains = opts
            .domains
            .as_ref()
            .filter(|_| opts.topology.is_api_mode());
        if let Some(domains) = stored_domains {
            let (store, cancel) = (self.store.clone(), tokens.cancel.clone());
            let registry = self.transport.registry().clone();
            let gone = move |group: &str| {
                let closed = registry.close_group(group);
                info!(domain = %group, closed, "domain removed elsewhere; its streams closed");
            };
            tasks.push(domains.clone().spawn_reloader(store, cancel, gone));
        }
        let guard = extra.as_ref().map(|e| e.guard.clone());
        let http_addr = self.serve_http(http, &replica, guard, &tokens, &mut tasks)?;
        let (relay_addr, failure) = attach(extra, relay, replica, &tokens.relay, &mut tasks)?;
        tasks.push(self.supervise(&opts, &queues, &tokens.cancel));
        let parts = RunningParts {
            election: self.election.clone(),
            queues,
            failure,
            drain_requested,
            drain: opts.drain.clone(),
            cancel: tokens.cancel,
            relay_cancel: tokens.relay,
            writers,
            acceptors: listeners.acceptors,
            tasks,
        };
        Ok(Running {
            northbound_addr: nb.addr,
            southbound_addr: sb.addr,
            relay_addr,
            http_addr,
            store: self.store,
            transport: self.transport,
            inbox: self.inbox,
            leadership: self.leadership,
            identity: self.identity,
            health: self.health,
            metrics: self.metrics,
            parts,
        })
    }

    /// Serves the node streams and the operator API (with the admin
    /// service) on their listeners.
    fn serve_public(
        &self,
        opts: &Options,
        (southbound_listener, northbound_listener, admin): (TcpListener, TcpListener, AdminService),
        writers: &TaskTracker,
        tokens: &Tokens,
        listeners: &mut listen::Listeners,
    ) -> std::io::Result<(Public, Public)> {
        let southbound = Southbound::new(southbound::Ctx {
            store: self.store.clone(),
            registry: self.transport.registry().clone(),
            signals: self.signals.clone(),
            identity: self.identity.clone(),
            auth: opts.auth.clone(),
            register_timeout: opts.register_timeout,
            writers: writers.clone(),
            metrics: self.metrics.clone(),
            seen_generation: self.seen_generation.clone(),
        });
        let northbound = Northbound::new(northbound::Ctx {
            store: self.store.clone(),
            transport: self.transport.clone(),
            topology: opts.topology.clone(),
            signals: self.signals.clone(),
            domains: opts.domains.clone(),
        });
        let cancel = &tokens.cancel;
        let sb = listen::southbound(
            opts,
            southbound_listener,
            southbound,
            &self.health,
            cancel,
            listeners,
        )?;
        let nb = listen::northbound(
            opts,
            northbound_listener,
            northbound,
            admin,
            cancel,
            listeners,
        )?;
        info!(southbound_addr = %sb.addr, northbound_addr = %nb.addr, "listening");
        Ok((sb, nb))
    }

    /// The HTTP endpoint, if configured; it answers until the very end
    /// (a draining replica reports itself not ready there).
    fn serve_http(
        &self,
        listener: Option<tokio::net::TcpListener>,
        replica: &Arc<Replica>,
        guard: Option<Guard>,
        tokens: &Tokens,
        tasks: &mut Vec<JoinHandle<()>>,
    ) -> std::io::Result<Option<SocketAddr>> {
        let Some(listener) = listener else {
            return Ok(None);
        };
        let live = Live {
            replica: replica.clone(),
            guard,
            store: self.pg.clone(),
        };
        let endpoint = Arc::new(Endpoint {
            health: self.health.clone(),
            registry: self.metrics.registry(live),
        });
        let (addr, task) = listen::http(listener, endpoint, &tokens.relay)?;
        tasks.push(task);
        info!(%addr, "health and metrics over HTTP");
        Ok(Some(addr))
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
            metrics: self.metrics.clone(),
        };
        let leadership = self.leadership.clone();
        tokio::spawn(supervisor::supervise(
            leadership,
            parts,
            queues.clone(),
            cancel.clone(),
        ))
    }

    fn replica(&self, queues: &Arc<QueueSlot>, drain: &Arc<Notify>) -> Arc<Replica> {
        let (slot, pg) = (queues.clone(), self.pg.clone());
        Arc::new(Replica {
            identity: self.identity.clone(),
            leadership: self.leadership.clone(),
            transport: self.transport.clone(),
            election: self.election.clone(),
            queue_depth: Box::new(move || slot.get().map_or(0, |q| q.len() as u64)),
            fenced_writes: Box::new(move || pg.as_ref().map_or(0, fenced_writes)),
            health: self.health.clone(),
            drain_requested: drain.clone(),
        })
    }
}

/// Leader writes `pg` refused by fencing so far.
fn fenced_writes(pg: &PgStore) -> u64 {
    pg.metrics().ops.values().map(|m| m.fenced).sum()
}

/// Serves a clustered replica's relay and adopts its tasks; returns the
/// relay's address and the failure signal.
fn attach(
    extra: Option<Extra>,
    relay: Option<tokio::net::TcpListener>,
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
