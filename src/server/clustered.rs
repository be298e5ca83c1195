//! A replica of a cluster sharing Postgres: it joins (id, incarnation),
//! serves the relay, competes for leadership, heartbeats, and runs leader
//! work only while it leads.

use std::net::SocketAddr;
use std::sync::Arc;

use rand::distr::{Alphanumeric, SampleString};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{Core, Extra, Options, Running, Sockets};
use crate::cluster::admin::Backing;
use crate::cluster::membership::{self, Membership};
use crate::cluster::relay::{Guard, RelayClient, RelayService};
use crate::cluster::{
    ClusterSignals, Election, Identity, Inbox, LeaderToken, Leadership, election, expiry, hostname,
    wakeups,
};
use crate::config::ClusterConfig;
use crate::reconcile::supervisor::Duties;
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
    let (election, handle) = Election::new(
        pg.direct_config(),
        identity.clone(),
        leadership.clone(),
        transport.clone(),
        election::Timings {
            lease: cluster.lease,
            renew: cluster.renew,
        },
    );
    let inbox = Arc::new(Inbox::new());
    let core = Core {
        store: Arc::new(pg.clone()),
        transport: transport.clone(),
        inbox: inbox.clone(),
        leadership,
        identity: identity.clone(),
        signals: Arc::new(ClusterSignals {
            identity: identity.clone(),
            relay: relay.clone(),
        }),
        fenced: {
            let pg = pg.clone();
            Arc::new(move |epoch| Arc::new(pg.with_fence(epoch)) as Arc<dyn Store>)
        },
        duties: Some(duties(&pg, &cluster, &identity, inbox)),
        election: Some(handle),
    };
    let cancel = CancellationToken::new();
    let (fail_tx, failure) = watch::channel(None);
    let beat = {
        let (transport, cancel) = (transport.clone(), cancel.clone());
        tokio::spawn(async move {
            if let Err(e) = membership.run(transport, cancel).await {
                warn!(error = %e, "this replica cannot go on");
                fail_tx.send_replace(Some(e.to_string()));
            }
        })
    };
    let elect = tokio::spawn(election.run(cancel.clone()));
    let guard = Guard::new(&secret);
    let handover = cluster.lease;
    let ttl = cluster.replica_ttl;
    let backing = move |_| Backing::Shared {
        store: pg,
        relay,
        ttl,
        handover,
    };
    let relay_service = move |replica| RelayService::new(replica, guard);
    let extra = Extra {
        relay: Box::new(relay_service),
        tasks: vec![beat, elect],
        failure,
        cancel,
    };
    core.start(sockets, opts, backing, Some(extra)).await
}

/// The term's extra duties: the wake-up listener and replica expiry.
fn duties(
    pg: &PgStore,
    cluster: &ClusterConfig,
    identity: &Arc<Identity>,
    inbox: Arc<Inbox>,
) -> Duties {
    let (pg, identity) = (pg.clone(), identity.clone());
    let (ttl, every) = (cluster.replica_ttl, cluster.heartbeat);
    Arc::new(move |token: &LeaderToken, term: &CancellationToken| {
        let listen = wakeups::listen(pg.direct_config(), inbox.clone(), term.clone());
        let fenced = pg.with_fence(token.epoch());
        let expire = expiry::watch(
            fenced,
            identity.id(),
            ttl,
            every,
            token.clone(),
            term.clone(),
        );
        vec![tokio::spawn(listen), tokio::spawn(expire)]
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
