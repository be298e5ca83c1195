//! The PostgreSQL backend: the store shared by every replica of a cluster.
//!
//! Durable here is everything the [`Store`](super::Store) holds: node records with their
//! sessions and facts, templates, links, routes and segments, plus the
//! replica and leadership rows of the HA layer. A replica's restart never
//! wipes any of it; a leader taking over derives from exactly what the last
//! one left. Timestamps the store sets itself (a node's `updated_at`, a
//! link's or route's on a status change) are the database's `now()`, so
//! replicas' clocks never disagree about them; a link or route written
//! whole keeps the `updated_at` its writer gave it, as in the memory store.
//!
//! Every query runs through the one transaction helper in `tx`. Facts are
//! written from any replica; derivations (links, routes, claim consumption,
//! cleanup) are the leader's and are fenced when the store is obtained
//! through [`PgStore::with_fence`].
//!
//! A statement that updates rows from `unnest` arrays also filters the
//! table by `key = ANY($1)`, so that a plan may look the keys up rather
//! than join the arrays with the whole table; the status writes of a
//! reconcile's record make every plan do so (see `tx::relaxed`).

mod changes;
mod domains;
mod fact_groups;
mod group;
mod links;
mod metrics;
mod migrate;
mod nodes;
mod notify;
mod pool;
mod records;
mod registrations;
mod replicas;
mod routes;
mod rows;
mod store_impl;
mod templates;
mod tls;
mod topology;
mod tx;
pub mod url;

use std::fmt;
use std::sync::Arc;

use fact_groups::FactGroups;
use group::Group;
pub use metrics::{OpMetrics, PgMetrics};
pub use notify::{FACTS_CHANNEL, RESYNC, SEPARATOR};
pub use pool::PgConnector;
use records::Record;
pub use replicas::{Counts, ExpiredReplica, LeadershipInfo, ReplicaInfo, age_heartbeat};
pub use tls::RustlsStream;
use tx::Tx;

/// Why the store could not be set up (connecting, migrating, checking the
/// schema). Messages never contain the URL or the password.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("invalid database URL: {0}")]
    InvalidUrl(String),
    #[error("database TLS: {0}")]
    Tls(String),
    #[error("cannot build the connection pool: {0}")]
    Pool(String),
    #[error("cannot connect to the database: {0}")]
    Connect(String),
    #[error("migrating the database failed: {0}")]
    Migrate(String),
    #[error(
        "the database has migration {applied}, newer than this slim-cp knows (latest {known}): \
         run the slim-cp version that migrated it, or a later one"
    )]
    SchemaNewer { applied: i64, known: i64 },
    #[error("the database lacks migrations {0:?}: run `slim-cp migrate` first")]
    SchemaPending(Vec<i64>),
    #[error("migration {0} failed part-way; repair it by hand before starting slim-cp")]
    SchemaDirty(i64),
    #[error("migration {0} in the database differs from this slim-cp's copy")]
    SchemaModified(i64),
}

impl SetupError {
    /// A failed connection, with its causes: tokio-postgres says only
    /// "error performing TLS handshake", and the reason (an unknown
    /// issuer, a name not in the certificate) is in its source.
    pub(crate) fn connect(e: &dyn std::error::Error) -> SetupError {
        let mut text = e.to_string();
        let mut source = e.source();
        while let Some(cause) = source {
            let more = cause.to_string();
            if !text.contains(&more) {
                text = format!("{text}: {more}");
            }
            source = cause.source();
        }
        SetupError::Connect(text)
    }
}

/// The Postgres store. Clones share the pools and the metrics.
#[derive(Clone)]
pub struct PgStore {
    tx: Tx,
    /// The leader's own pool, as large as the shared one and empty until
    /// this replica leads: its derivations and reconciles never queue
    /// behind a burst of facts (a thousand registrations hold every
    /// shared connection for a second), and the facts never wait for it.
    leader_tx: Tx,
    /// Facts written with group commit.
    facts: FactGroups,
    /// Reconciles' records, written with group commit on the leader's
    /// pool.
    records: Group<Record, ()>,
    /// The leader's epoch its derivation writes are fenced with.
    fence: Option<u64>,
    /// Settings for connections outside the pool (election, heartbeats,
    /// LISTEN): they must reach Postgres itself, never a transaction pooler.
    direct: Arc<PgConnector>,
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Deliberately no connection details: they may hold a password.
        f.debug_struct("PgStore")
            .field("fence", &self.fence)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// A pool of `pool_size` connections to `url` (URL or `key=value`
    /// form), checked with one round trip so that a wrong URL or an absent
    /// database fails here rather than on the first fact.
    pub async fn connect(url: &str, pool_size: usize) -> Result<Self, SetupError> {
        Self::connect_with_direct(url, None, pool_size).await
    }

    /// As [`PgStore::connect`]; connections outside the pool use
    /// `direct_url` when given (a pooler in front of `url` breaks advisory
    /// locks and LISTEN).
    pub async fn connect_with_direct(
        url: &str,
        direct_url: Option<&str>,
        pool_size: usize,
    ) -> Result<Self, SetupError> {
        let direct = Arc::new(pool::pg_config(direct_url.unwrap_or(url))?);
        let pool = pool::build_pool(pool::pg_config(url)?, pool_size)?;
        let leader_pool = pool::build_pool(pool::pg_config(url)?, pool_size)?;
        let client = pool.get().await.map_err(|e| SetupError::connect(&e))?;
        client
            .simple_query("SELECT 1")
            .await
            .map_err(|e| SetupError::connect(&e))?;
        drop(client);
        let tx = Tx::new(pool);
        tx.fill().await;
        let leader_tx = tx.with_pool(leader_pool);
        Ok(Self {
            records: records::spawn(leader_tx.clone()),
            leader_tx,
            facts: FactGroups::spawn(&tx),
            tx,
            fence: None,
            direct,
        })
    }

    /// Applies the embedded migrations the database lacks.
    pub async fn migrate(url: &str) -> Result<(), SetupError> {
        migrate::run(url).await
    }

    /// Refuses a database whose schema this binary does not match: a newer
    /// migration than it knows, a failed or altered one, or missing ones.
    pub async fn check_schema(url: &str) -> Result<(), SetupError> {
        migrate::check(url).await
    }

    /// Per-operation call, error, retry and latency counters.
    pub fn metrics(&self) -> PgMetrics {
        self.tx.metrics().snapshot()
    }

    /// The same store for the leader of term `epoch`, on the leader's own
    /// pool, with every derivation write (links, routes, claim
    /// consumption, node and template cleanup) fenced by `epoch`: such a
    /// write fails with [`StoreError::Fenced`](super::StoreError::Fenced) once another leader has
    /// bumped the epoch. Facts, operator writes and reads are not fenced.
    pub fn with_fence(&self, epoch: u64) -> PgStore {
        PgStore {
            tx: self.leader_tx.clone(),
            leader_tx: self.leader_tx.clone(),
            facts: self.facts.clone(),
            records: self.records.clone(),
            fence: Some(epoch),
            direct: self.direct.clone(),
        }
    }

    /// Opens the leader's pool in full (see `Tx::fill`): once per term,
    /// as it begins; a follower's stays empty.
    pub async fn open_leader_pool(&self) {
        self.leader_tx.fill().await;
    }

    /// How to open a dedicated connection (keepalives, timeouts, TLS and
    /// the direct URL included): for the election, heartbeats and LISTEN.
    pub fn direct_connector(&self) -> PgConnector {
        (*self.direct).clone()
    }
}
