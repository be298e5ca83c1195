//! A replica of a cluster sharing Postgres: it joins (id, incarnation),
//! serves the relay, competes for leadership, heartbeats, and runs leader
//! work only while it leads.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rand::distr::{Alphanumeric, SampleString};
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::core::{Core, Extra};
use super::handover::Handover;
use super::{Options, Running, Sockets};
use crate::cluster::admin::Backing;
use crate::cluster::membership::{self, Membership};
use crate::cluster::relay::{Guard, RelayClient, RelayService};
use crate::cluster::{
    ClusterSignals, Election, ElectionHandle, Identity, Inbox, LeaderToken, Leadership, election,
    expiry, hostname, unreachable, wakeups,
};
use crate::config::ClusterConfig;
use crate::ops::{Health, Metrics};
use crate::reconcile::supervisor::{Duties, TermDuties};
use crate::store::{PgStore, Store};
use crate::transport::{Registry, Transport};

/// Binds the listeners, joins the cluster and starts serving.
pub async fn start_clustered(
    opts: Options,
    pg: PgStore,
    cluster: ClusterConfig,
) -> std::io::Result<Running> {
    let sockets = Sockets::bind(&opts, Some(relay_addr(&cluster)?))?;
    start_clustered_on(sockets, opts, pg, cluster).await
}

/// The relay's listening address from the configuration.
pub fn relay_addr(cluster: &ClusterConfig) -> std::io::Result<SocketAddr> {
    resolve(&cluster.relay_endpoint)
}

/// [`start_clustered`] on listeners bound beforehand (see [`Sockets`]),
/// the relay's included.
pub async fn start_clustered_on(
    sockets: Sockets,
    opts: Options,
    pg: PgStore,
    cluster: ClusterConfig,
) -> std::io::Result<Running> {
    let id = replica_id(&cluster)?;
    let bound = sockets
        .relay_addr()
        .ok_or_else(|| std::io::Error::other("a clustered replica needs its relay listener"))?;
    let advertise = advertised(&cluster, bound)?;
    let secret = secret(&pg, &cluster).await?;
    let timings = membership::Timings {
        heartbeat: cluster.heartbeat,
        ttl: cluster.replica_ttl,
    };
    let (membership, identity) = Membership::join(pg.clone(), &id, &advertise, timings)
        .await
        .map_err(std::io::Error::other)?;
    info!(replica = %id, relay = %advertise, "cluster member");
    let relay = Arc::new(RelayClient::new(
        pg.clone(),
        identity.clone(),
        &secret,
        opts.request_timeout,
    ));
    let registry = Arc::new(Registry::new());
    let transport = Arc::new(Transport::clustered(
        registry,
        opts.request_timeout,
        relay.clone(),
    ));
    let leadership = Leadership::follower();
    let timings = election::Timings {
        lease: cluster.lease,
        renew: cluster.renew,
    };
    let (election, handle) = Election::new(
        pg.direct_connector(),
        identity.clone(),
        leadership.clone(),
        transport.clone(),
        timings,
    );
    let core = core(
        &pg, &cluster, identity, transport, leadership, &relay, handle,
    );
    let handover = Handover {
        registry: core.transport.registry().clone(),
        health: core.health.clone(),
        relay: relay.clone(),
        drain: opts.drain.clone(),
        pause: opts.drain.lb_grace.min(cluster.replica_ttl / 2),
        every: cluster.heartbeat,
    };
    let extra = background(&core, membership, election, handover, &secret);
    // A handover waits up to a lease for leader work to stop, plus the
    // term's tasks' own wind-down: give the forwarded call room for both.
    let (handover, ttl) = (
        cluster.lease * 2 + Duration::from_secs(5),
        cluster.replica_ttl,
    );
    let backing = move |_| Backing::Shared {
        store: pg,
        relay,
        ttl,
        handover,
    };
    core.start(sockets, opts, backing, Some(extra)).await
}

/// The replica's parts.
fn core(
    pg: &PgStore,
    cluster: &ClusterConfig,
    identity: Arc<Identity>,
    transport: Arc<Transport>,
    leadership: Arc<Leadership>,
    relay: &Arc<RelayClient>,
    election: ElectionHandle,
) -> Core {
    let inbox = Arc::new(Inbox::new());
    let fenced = {
        let pg = pg.clone();
        Arc::new(move |epoch| {
            // Called once per term, as it begins.
            let leading = pg.clone();
            tokio::spawn(async move { leading.open_leader_pool().await });
            Arc::new(pg.with_fence(epoch)) as Arc<dyn Store>
        })
    };
    Core {
        store: Arc::new(pg.clone()),
        pg: Some(pg.clone()),
        transport,
        inbox: inbox.clone(),
        leadership,
        signals: Arc::new(ClusterSignals {
            identity: identity.clone(),
            relay: relay.clone(),
        }),
        fenced,
        duties: Some(duties(pg, cluster, &identity, relay, inbox)),
        identity,
        election: Some(election),
        health: Health::new(),
        metrics: Metrics::new(),
        seen_generation: Arc::default(),
    }
}

/// The heartbeats, the election and the handover of nodes this replica
/// cannot serve, running from now on, and the relay service to build once
/// the replica exists.
fn background(
    core: &Core,
    membership: Membership,
    election: Election,
    handover: Handover,
    secret: &str,
) -> Extra {
    let cancel = CancellationToken::new();
    let (fail_tx, failure) = watch::channel(None);
    let beat = {
        let (transport, health, cancel) =
            (core.transport.clone(), core.health.clone(), cancel.clone());
        let seen = core.seen_generation.clone();
        tokio::spawn(async move {
            if let Err(e) = membership.run(transport, health, seen, cancel).await {
                warn!(error = %e, "this replica cannot go on");
                fail_tx.send_replace(Some(e.to_string()));
            }
        })
    };
    let elect = tokio::spawn(election.run(cancel.clone()));
    let hand = tokio::spawn(handover.run(cancel.clone()));
    let guard = Guard::new(secret);
    let (service_guard, metrics) = (guard.clone(), core.metrics.clone());
    let relay = move |replica| RelayService::new(replica, service_guard, metrics);
    Extra {
        relay: Box::new(relay),
        guard,
        tasks: vec![beat, elect, hand],
        failure,
        cancel,
    }
}

/// The term's extra duties: the wake-up listener, replica expiry, and
/// the drain flag of peers the relay cannot reach.
fn duties(
    pg: &PgStore,
    cluster: &ClusterConfig,
    identity: &Arc<Identity>,
    relay: &Arc<RelayClient>,
    inbox: Arc<Inbox>,
) -> Duties {
    let (pg, identity, relay) = (pg.clone(), identity.clone(), relay.clone());
    let (ttl, every) = (cluster.replica_ttl, cluster.heartbeat);
    Arc::new(move |token: &LeaderToken, term: &CancellationToken| {
        let (first, listening) = oneshot::channel();
        let listen = wakeups::listen(pg.direct_connector(), inbox.clone(), first, term.clone());
        let fenced = pg.with_fence(token.epoch());
        let expire = expiry::watch(
            fenced.clone(),
            identity.id(),
            ttl,
            every,
            token.clone(),
            term.clone(),
        );
        let unreachable = unreachable::watch(
            fenced,
            relay.clone(),
            identity.id(),
            (ttl, every),
            token.clone(),
            term.clone(),
        );
        TermDuties {
            tasks: vec![
                tokio::spawn(listen),
                tokio::spawn(expire),
                tokio::spawn(unreachable),
            ],
            listening,
        }
    })
}

fn replica_id(cluster: &ClusterConfig) -> std::io::Result<String> {
    if let Some(id) = &cluster.replica_id {
        return Ok(id.clone());
    }
    let id = hostname().ok_or_else(|| {
        std::io::Error::other(
            "no replica id: set cluster.replica_id or SLIM_CP_REPLICA_ID (no hostname either)",
        )
    })?;
    warn!(replica = %id, "no replica id configured; using the hostname");
    Ok(id)
}

fn resolve(endpoint: &str) -> std::io::Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    endpoint.to_socket_addrs()?.next().ok_or_else(|| {
        std::io::Error::other(format!(
            "cluster.relay.endpoint {endpoint:?} resolves to nothing"
        ))
    })
}

/// What peers dial: the configured address, else the listener's own if it
/// names a host, else the hostname with the listener's port.
fn advertised(cluster: &ClusterConfig, bound: SocketAddr) -> std::io::Result<String> {
    if let Some(a) = &cluster.relay_advertise {
        return Ok(a.clone());
    }
    if !bound.ip().is_unspecified() {
        return Ok(bound.to_string());
    }
    let host = hostname().ok_or_else(|| {
        std::io::Error::other(
            "cluster.relay.advertise: the relay listens on every address and there is no \
             hostname to advertise; set cluster.relay.advertise or SLIM_CP_RELAY_ADVERTISE",
        )
    })?;
    warn!(
        host,
        "cluster.relay.advertise not set; peers will dial the hostname"
    );
    Ok(format!("{host}:{}", bound.port()))
}

/// The configured secret, else the one kept in the database (created by
/// the first replica that needs it).
async fn secret(pg: &PgStore, cluster: &ClusterConfig) -> std::io::Result<String> {
    if let Some(s) = &cluster.secret {
        return Ok(s.expose().to_string());
    }
    let candidate = Alphanumeric.sample_string(&mut rand::rng(), 48);
    pg.cluster_secret(&candidate)
        .await
        .map_err(std::io::Error::other)
}
