//! Replica liveness, on a dedicated connection so a busy pool never delays
//! it.
//!
//! - Joining: a session-level advisory lock on the replica id (two live
//!   processes with one id are refused, never left to share sessions),
//!   then a new incarnation from the database, which ends whatever
//!   sessions an earlier run of this id still owned.
//! - Heartbeat: a compare-and-set on `(id, incarnation)` every
//!   `heartbeat`, in database time. When it fails, the leader declared this
//!   replica dead (it was frozen or cut off): its sessions ended in the
//!   database, so it rejoins under a new incarnation and closes every
//!   stream it held, and the nodes register again.
//! - Drain flag: each heartbeat reads the flag the leader sets when its
//!   relay cannot reach this replica, and hands it to [`Health`] (not
//!   ready, not listening; the node streams move in
//!   `server::handover`). The leader lifts it once the relay answers.
//! - Audit: every few beats, streams whose session the database no longer
//!   gives this replica (replaced on another replica, the relay's close
//!   lost) are closed.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::{Instant, sleep, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use uuid::Uuid;

use super::Identity;
use super::pgconn::PgConn;
use crate::ops::Health;
use crate::store::PgStore;
use crate::store::postgres::PgConnector;
use crate::transport::Transport;

/// Key space of the replica-id locks: "slid" and the id's hash.
const ID_KEY: i32 = 0x736c_6964;

/// Audit the streams every this many beats.
const AUDIT_EVERY: u32 = 5;

/// Why this replica cannot be a member.
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    #[error(
        "replica id {0:?} is in use by another running slim-cp replica: give each replica its \
         own id (cluster.replica_id or SLIM_CP_REPLICA_ID)"
    )]
    IdInUse(String),
    #[error("cannot join the cluster: {0}")]
    Database(String),
}

/// Liveness timings.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    pub heartbeat: Duration,
    /// How long an old run's session may keep the id lock after it died.
    pub ttl: Duration,
}

/// This replica's membership.
pub struct Membership {
    config: PgConnector,
    store: PgStore,
    identity: Arc<Identity>,
    advertise: String,
    timings: Timings,
    conn: PgConn,
    /// The server process of `conn`, holding the id lock (see `claim_id`).
    backend: i32,
}

/// A membership at work: what the heartbeat loop also needs.
struct Beating {
    membership: Membership,
    transport: Arc<Transport>,
    health: Arc<Health>,
    /// The newest session generation recorded in the cluster, as of the
    /// last heartbeat (see `southbound::Ctx::seen_generation`).
    seen_generation: Arc<AtomicU64>,
    /// Since when heartbeats have failed (the database is unreachable).
    silent_since: Option<Instant>,
}

impl Membership {
    /// Takes the id and joins under a new incarnation.
    pub async fn join(
        store: PgStore,
        id: &str,
        advertise: &str,
        timings: Timings,
    ) -> Result<(Membership, Arc<Identity>), MembershipError> {
        let config = store.direct_connector();
        let (conn, backend) = claim_id(&config, id, timings.ttl, None).await?;
        let (me, ended) = store
            .join_replica(id, advertise)
            .await
            .map_err(|e| MembershipError::Database(e.to_string()))?;
        info!(replica = %me.id, incarnation = me.incarnation, ended = ended.len(), "joined the cluster");
        let identity = Arc::new(Identity::new(me));
        let membership = Membership {
            config,
            store,
            identity: identity.clone(),
            advertise: advertise.to_string(),
            timings,
            conn,
            backend,
        };
        Ok((membership, identity))
    }

    /// Heartbeats until `cancel`, teaching `transport` the epoch and
    /// closing its streams when they are no longer ours. Fails only when
    /// another process took this replica's id while the connection was
    /// down.
    pub async fn run(
        self,
        transport: Arc<Transport>,
        health: Arc<Health>,
        seen_generation: Arc<AtomicU64>,
        cancel: CancellationToken,
    ) -> Result<(), MembershipError> {
        Beating {
            membership: self,
            transport,
            health,
            seen_generation,
            silent_since: None,
        }
        .run(cancel)
        .await
    }
}

impl std::ops::Deref for Beating {
    type Target = Membership;

    fn deref(&self) -> &Membership {
        &self.membership
    }
}

impl Beating {
    async fn run(mut self, cancel: CancellationToken) -> Result<(), MembershipError> {
        let mut beats = 0u32;
        loop {
            tokio::select! {
                () = cancel.cancelled() => return Ok(()),
                () = sleep(self.timings.heartbeat) => {}
            }
            if self.conn.is_closed() {
                self.reconnect(&cancel).await?;
            }
            let beat = timeout(self.timings.heartbeat, self.beat()).await;
            match beat {
                Ok(Ok(Some(drain))) => {
                    self.flagged(drain);
                    self.reached(Ok(()));
                }
                // Rejoined before it reads as ready again: no node
                // registers under the run that was declared dead.
                Ok(Ok(None)) => {
                    let rejoined = self.declared_dead().await;
                    self.flagged(false);
                    self.reached(rejoined);
                }
                Ok(Err(e)) => self.reached(Err(e.to_string())),
                Err(_) => self.reached(Err("no answer to the heartbeat".into())),
            }
            beats = beats.wrapping_add(1);
            if beats % AUDIT_EVERY == 0 {
                if let Err(e) = self.audit().await {
                    debug!(error = %e, "stream audit failed");
                }
            }
        }
    }

    /// Readiness follows the database: unreachable once heartbeats have
    /// failed for two intervals (one slow beat is not an outage).
    fn reached(&mut self, answer: Result<(), String>) {
        match answer {
            Ok(()) => {
                self.silent_since = None;
                self.health.set_database(Ok(()));
            }
            Err(why) => {
                debug!(%why, "heartbeat failed");
                let since = *self.silent_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= self.timings.heartbeat * 2 {
                    self.health.set_database(Err(why));
                }
            }
        }
    }

    /// The leader's drain flag as this heartbeat read it.
    fn flagged(&self, drain: bool) {
        if !self.health.set_drain_flag(drain) {
            return;
        }
        if drain {
            warn!(
                "the leader flagged this replica for drain (its relay calls here fail): \
                 not ready, not listening, moving its nodes to the others"
            );
        } else {
            info!("the leader lifted this replica's drain flag: serving again");
        }
    }

    /// One heartbeat: this replica's drain flag, `None` when this run was
    /// declared dead.
    async fn beat(&self) -> Result<Option<bool>, tokio_postgres::Error> {
        let me = self.identity.current();
        let incarnation = i64::try_from(me.incarnation).unwrap_or(i64::MAX);
        let row = self
            .conn
            .client
            .query_opt(
                "UPDATE replicas SET heartbeat_at = now() \
                 WHERE id = $1 AND incarnation = $2 AND NOT expired \
                 RETURNING (SELECT epoch FROM leadership WHERE singleton), \
                   (SELECT last_value FROM generation_seq), drain",
                &[&me.id, &incarnation],
            )
            .await?;
        let Some(row) = row else { return Ok(None) };
        let epoch: i64 = row.try_get(0)?;
        self.transport
            .observe_epoch(u64::try_from(epoch).unwrap_or(0));
        let generation: i64 = row.try_get(1)?;
        let generation = u64::try_from(generation).unwrap_or(0);
        self.seen_generation
            .fetch_max(generation, Ordering::Relaxed);
        Ok(Some(row.try_get(2)?))
    }

    /// The leader ended this run's sessions: rejoin, then close the
    /// streams of the old run so their nodes register again.
    /// `Err` (with why) when the rejoin failed: the replica then stays
    /// not ready and not listening until a heartbeat rejoins it.
    async fn declared_dead(&self) -> Result<(), String> {
        let old = self.transport.registry().snapshot();
        warn!(
            streams = old.len(),
            "this replica was declared dead; rejoining and closing its streams"
        );
        let id = self.identity.id();
        let rejoined = match self.store.join_replica(&id, &self.advertise).await {
            Ok((me, _)) => {
                self.identity.set_incarnation(me.incarnation);
                Ok(())
            }
            Err(e) => {
                warn!(error = %e, "rejoin failed; retrying at the next heartbeat");
                Err(format!("rejoin failed: {e}"))
            }
        };
        for s in old {
            self.transport.registry().remove(s.node(), s.session());
        }
        rejoined
    }

    /// Closes streams whose recorded session the database gives to
    /// someone else. A stream answered before its registration could be
    /// recorded (generation 0) is the outbox's to settle, not ours.
    async fn audit(&self) -> Result<(), tokio_postgres::Error> {
        let streams = self.transport.registry().snapshot();
        let me = self.identity.current();
        let incarnation = i64::try_from(me.incarnation).unwrap_or(i64::MAX);
        let rows = self
            .conn
            .client
            .query(
                "SELECT id, session_id FROM nodes \
                 WHERE session_owner = $1 AND session_incarnation = $2",
                &[&me.id, &incarnation],
            )
            .await?;
        let mut held = HashSet::new();
        for r in rows {
            held.insert((r.try_get::<_, String>(0)?, r.try_get::<_, Uuid>(1)?));
        }
        for s in streams.iter().filter(|s| s.generation() > 0) {
            if !held.contains(&(s.node().to_string(), s.session())) {
                info!(
                    node = s.node(),
                    "closing a stream whose session is no longer ours"
                );
                self.transport.registry().remove(s.node(), s.session());
            }
        }
        Ok(())
    }

    async fn reconnect(&mut self, cancel: &CancellationToken) -> Result<(), MembershipError> {
        let id = self.identity.id();
        loop {
            let stale = Some(self.backend);
            match claim_id(&self.config, &id, self.timings.ttl, stale).await {
                Ok((conn, backend)) => {
                    self.membership.conn = conn;
                    self.membership.backend = backend;
                    return Ok(());
                }
                Err(e @ MembershipError::IdInUse(_)) => return Err(e),
                Err(e) => self.reached(Err(e.to_string())),
            }
            tokio::select! {
                () = cancel.cancelled() => return Ok(()),
                () = sleep(self.timings.heartbeat) => {}
            }
        }
    }
}

/// A connection holding the lock on `id`, and its server process. A run
/// that just died may hold it until its backend notices: try for up to
/// `patience`. `stale`: this run's own previous backend, when it lost
/// its connection: a backend behind a proxy, or whose client vanished
/// while packets were dropped, keeps the lock for as long as nothing
/// tells it its client is gone (the proxy keeps its side open), so it is
/// ended, and only if it still holds a lock of this key space: a pid the
/// server gave to someone else since is left alone.
async fn claim_id(
    config: &PgConnector,
    id: &str,
    patience: Duration,
    stale: Option<i32>,
) -> Result<(PgConn, i32), MembershipError> {
    let db = |e: tokio_postgres::Error| MembershipError::Database(e.to_string());
    let conn = PgConn::open(config, "membership").await.map_err(db)?;
    let deadline = Instant::now() + patience;
    loop {
        let row = conn
            .client
            .query_one(
                "SELECT pg_try_advisory_lock($1, hashtext($2))",
                &[&ID_KEY, &id],
            )
            .await
            .map_err(db)?;
        if row.try_get::<_, bool>(0).map_err(db)? {
            let pid = conn.client.query_one("SELECT pg_backend_pid()", &[]).await;
            let pid: i32 = pid.and_then(|r| r.try_get(0)).map_err(db)?;
            return Ok((conn, pid));
        }
        if let Some(old) = stale {
            end_stale_backend(&conn, old).await.map_err(db)?;
        }
        if Instant::now() >= deadline {
            return Err(MembershipError::IdInUse(id.to_string()));
        }
        sleep(Duration::from_millis(200)).await;
    }
}

/// Ends this run's previous membership backend `pid` if it still holds a
/// lock of the replica-id key space.
async fn end_stale_backend(conn: &PgConn, pid: i32) -> Result<(), tokio_postgres::Error> {
    let ended = conn
        .client
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_locks \
             WHERE pid = $1 AND locktype = 'advisory' AND granted AND classid::bigint = $2",
            &[&pid, &i64::from(ID_KEY)],
        )
        .await?;
    if !ended.is_empty() {
        info!(
            pid,
            "ended this replica's previous membership session, which kept its id"
        );
    }
    Ok(())
}
