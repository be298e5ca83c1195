//! The cluster's rows: replicas (liveness, relay address, incarnation), the
//! leadership term, the relay secret, and the counts `slim-cp status`
//! shows. Heartbeats and the lease are renewed on dedicated connections by
//! `cluster`; what runs through the pool is here.
//!
//! Every time is the database's `now()`: replicas' clocks never decide who
//! is alive.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio_postgres::Row;

use super::PgStore;
use super::nodes;
use super::notify;
use super::rows::to_u64;
use super::store_impl::{read, statement, write};
use super::tx::{Db, TxError, execute, query, query_one, query_opt};
use crate::store::StoreError;
use crate::store::model::ReplicaRef;

/// A replica as the database sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaInfo {
    pub id: String,
    pub incarnation: u64,
    /// Where peers reach its relay.
    pub endpoint: String,
    /// Its heartbeat is recent and it was not declared dead.
    pub alive: bool,
    pub heartbeat_age: Duration,
    pub drain: bool,
    /// Unix seconds of its current incarnation's start.
    pub started_at: i64,
}

/// The leadership term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeadershipInfo {
    pub epoch: u64,
    pub leader: Option<ReplicaRef>,
    /// Unix seconds of the term's start.
    pub since: Option<i64>,
    /// How long ago the leader last renewed its lease.
    pub renewed_age: Option<Duration>,
}

/// A replica the leader declared dead, and the sessions that ended with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredReplica {
    pub id: String,
    /// The incarnation it was bumped to: the dead run's was lower.
    pub incarnation: u64,
    pub ended: Vec<String>,
}

/// What the cluster holds, by status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    pub nodes: u64,
    pub connected: u64,
    /// Sessions per owning replica id.
    pub sessions: BTreeMap<String, u64>,
    /// Live links per status word; deleted ones under `deleted`.
    pub links: BTreeMap<String, u64>,
    pub routes: BTreeMap<String, u64>,
}

/// Expired replica rows are kept this long for `status`, then dropped (a
/// Kubernetes Deployment's pods come back under new names).
const FORGET_AFTER: Duration = Duration::from_secs(3600);

impl PgStore {
    /// Registers a run of replica `id` reachable at `endpoint`: a new
    /// incarnation, higher than any before for this id, and the end (as
    /// crashes) of every session an earlier run still owned.
    pub async fn join_replica(
        &self,
        id: &str,
        endpoint: &str,
    ) -> Result<(ReplicaRef, Vec<String>), StoreError> {
        self.tx
            .run(write("join_replica"), (id, endpoint), |db, (id, ep)| {
                Box::pin(join(db, id, ep))
            })
            .await
    }

    /// Every replica row, ordered by id; alive means a heartbeat within
    /// `ttl` and not declared dead.
    pub async fn list_replicas(&self, ttl: Duration) -> Result<Vec<ReplicaInfo>, StoreError> {
        self.tx
            .run(statement("list_replicas"), ttl, |db, ttl| {
                Box::pin(list(db, *ttl))
            })
            .await
    }

    /// The current leadership term.
    pub async fn leadership(&self) -> Result<LeadershipInfo, StoreError> {
        self.tx
            .run(statement("leadership"), (), |db, _| {
                Box::pin(leadership(db))
            })
            .await
    }

    /// The leader's duty: declares dead every other replica whose heartbeat
    /// is older than `ttl` (bumping its incarnation, so its own heartbeat
    /// fails and it learns), ends the sessions it owned as crashes, and
    /// drops rows dead for an hour. Fenced by this store's epoch.
    pub async fn expire_replicas(
        &self,
        me: &str,
        ttl: Duration,
    ) -> Result<Vec<ExpiredReplica>, StoreError> {
        let op = self.derive("expire_replicas");
        self.tx
            .run(op, (me, ttl), |db, (me, ttl)| {
                Box::pin(expire(db, me, *ttl))
            })
            .await
    }

    /// The leader's duty: sets (or lifts) the drain flag of run
    /// `incarnation` of replica `id`, which learns it at its next
    /// heartbeat. `false` when that run is gone (restarted or declared
    /// dead: a new run starts undrained anyway). Fenced by this store's
    /// epoch.
    pub async fn set_drain(
        &self,
        id: &str,
        incarnation: u64,
        drain: bool,
    ) -> Result<bool, StoreError> {
        let op = self.derive("set_drain");
        let incarnation = i64::try_from(incarnation).unwrap_or(i64::MAX);
        self.tx
            .run(op, (id, incarnation, drain), |db, (id, inc, drain)| {
                Box::pin(async move {
                    let n = execute(
                        db,
                        "UPDATE replicas SET drain = $3 \
                         WHERE id = $1 AND incarnation = $2 AND NOT expired",
                        &[id, inc, drain],
                    )
                    .await?;
                    Ok(n == 1)
                })
            })
            .await
    }

    /// The relay secret every replica shares: `candidate` if none was
    /// stored yet, else the stored one.
    pub async fn cluster_secret(&self, candidate: &str) -> Result<String, StoreError> {
        self.tx
            .run(write("cluster_secret"), candidate, |db, c| {
                Box::pin(secret(db, c))
            })
            .await
    }

    /// Nodes, sessions, links and routes by status.
    pub async fn counts(&self) -> Result<Counts, StoreError> {
        self.tx
            .run(read("counts"), (), |db, _| Box::pin(counts(db)))
            .await
    }
}

async fn join(db: &Db<'_>, id: &str, endpoint: &str) -> Result<(ReplicaRef, Vec<String>), TxError> {
    let row = query_one(
        db,
        "INSERT INTO replicas (id, incarnation, internal_endpoint) VALUES ($1, 1, $2) \
         ON CONFLICT (id) DO UPDATE SET incarnation = replicas.incarnation + 1, \
           internal_endpoint = EXCLUDED.internal_endpoint, heartbeat_at = now(), \
           expired = false, drain = false, started_at = now() \
         RETURNING incarnation",
        &[&id, &endpoint],
    )
    .await?;
    let incarnation: i64 = row.try_get(0)?;
    let ended = nodes::end_earlier_incarnations(db, id, incarnation).await?;
    if !ended.is_empty() {
        notify::resync(db).await?;
    }
    let me = ReplicaRef {
        id: id.to_string(),
        incarnation: to_u64(incarnation)?,
    };
    Ok((me, ended))
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn age(v: Option<i64>) -> Option<Duration> {
    v.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}

async fn list(db: &Db<'_>, ttl: Duration) -> Result<Vec<ReplicaInfo>, TxError> {
    let rows = query(
        db,
        "SELECT id, incarnation, internal_endpoint, drain, expired, \
           (extract(epoch FROM now() - heartbeat_at) * 1000)::bigint AS age_ms, \
           extract(epoch FROM started_at)::bigint AS started \
         FROM replicas ORDER BY id",
        &[],
    )
    .await?;
    rows.iter().map(|r| replica_from(r, ttl)).collect()
}

fn replica_from(r: &Row, ttl: Duration) -> Result<ReplicaInfo, TxError> {
    let heartbeat_age = age(r.try_get("age_ms")?).unwrap_or_default();
    let expired: bool = r.try_get("expired")?;
    Ok(ReplicaInfo {
        id: r.try_get("id")?,
        incarnation: to_u64(r.try_get("incarnation")?)?,
        endpoint: r.try_get("internal_endpoint")?,
        alive: !expired && heartbeat_age < ttl,
        heartbeat_age,
        drain: r.try_get("drain")?,
        started_at: r.try_get("started")?,
    })
}

async fn leadership(db: &Db<'_>) -> Result<LeadershipInfo, TxError> {
    let r = query_one(
        db,
        "SELECT epoch, leader, leader_incarnation, extract(epoch FROM since)::bigint AS since, \
           (extract(epoch FROM now() - renewed_at) * 1000)::bigint AS renewed_ms \
         FROM leadership WHERE singleton",
        &[],
    )
    .await?;
    let leader: Option<String> = r.try_get("leader")?;
    let incarnation: Option<i64> = r.try_get("leader_incarnation")?;
    let leader = match (leader, incarnation) {
        (Some(id), Some(i)) => Some(ReplicaRef {
            id,
            incarnation: to_u64(i)?,
        }),
        _ => None,
    };
    Ok(LeadershipInfo {
        epoch: to_u64(r.try_get("epoch")?)?,
        leader,
        since: r.try_get("since")?,
        renewed_age: age(r.try_get("renewed_ms")?),
    })
}

async fn expire(db: &Db<'_>, me: &str, ttl: Duration) -> Result<Vec<ExpiredReplica>, TxError> {
    let rows = query(
        db,
        "UPDATE replicas SET incarnation = incarnation + 1, expired = true \
         WHERE NOT expired AND id <> $1 \
           AND heartbeat_at < now() - make_interval(secs => $2::bigint / 1000.0) \
         RETURNING id, incarnation",
        &[&me, &millis(ttl)],
    )
    .await?;
    let mut out = Vec::new();
    for r in rows {
        let id: String = r.try_get(0)?;
        let incarnation: i64 = r.try_get(1)?;
        let ended = nodes::end_earlier_incarnations(db, &id, incarnation).await?;
        out.push(ExpiredReplica {
            id,
            incarnation: to_u64(incarnation)?,
            ended,
        });
    }
    if out.iter().any(|e| !e.ended.is_empty()) {
        notify::resync(db).await?;
    }
    execute(
        db,
        "DELETE FROM replicas WHERE expired \
           AND heartbeat_at < now() - make_interval(secs => $1::bigint / 1000.0)",
        &[&millis(FORGET_AFTER)],
    )
    .await?;
    Ok(out)
}

async fn secret(db: &Db<'_>, candidate: &str) -> Result<String, TxError> {
    execute(
        db,
        "INSERT INTO cluster_secret (singleton, secret) VALUES (true, $1) ON CONFLICT DO NOTHING",
        &[&candidate],
    )
    .await?;
    let row = query_opt(db, "SELECT secret FROM cluster_secret WHERE singleton", &[]).await?;
    let row = row.ok_or_else(|| TxError::Decode("the cluster secret row is missing".into()))?;
    Ok(row.try_get(0)?)
}

async fn counts(db: &Db<'_>) -> Result<Counts, TxError> {
    let mut out = Counts::default();
    let totals = query_one(db, "SELECT count(*), count(session_id) FROM nodes", &[]).await?;
    out.nodes = to_u64(totals.try_get(0)?)?;
    out.connected = to_u64(totals.try_get(1)?)?;
    let grouped = [
        (
            "SELECT session_owner, count(*) FROM nodes WHERE session_id IS NOT NULL GROUP BY 1",
            &mut out.sessions,
        ),
        (
            "SELECT CASE WHEN deleted THEN 'deleted' ELSE status END, count(*) FROM links GROUP BY 1",
            &mut out.links,
        ),
        (
            "SELECT status, count(*) FROM routes GROUP BY 1",
            &mut out.routes,
        ),
    ];
    for (sql, into) in grouped {
        for r in query(db, sql, &[]).await? {
            into.insert(r.try_get(0)?, to_u64(r.try_get(1)?)?);
        }
    }
    Ok(out)
}

/// Makes a replica's heartbeat look `age` old, as if it had stopped then:
/// for tests and drills of the expiry, without waiting out the TTL.
pub async fn age_heartbeat(store: &PgStore, id: &str, age: Duration) -> Result<(), StoreError> {
    store
        .tx
        .run(write("age_heartbeat"), (id, age), |db, (id, age)| {
            Box::pin(async move {
                execute(
                    db,
                    "UPDATE replicas SET heartbeat_at = now() - make_interval(secs => $2::bigint / 1000.0) \
                     WHERE id = $1",
                    &[id, &millis(*age)],
                )
                .await?;
                Ok(())
            })
        })
        .await
}
