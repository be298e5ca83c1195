//! The one transaction helper: every query of the Postgres store runs inside
//! [`Tx::run`]. It sets the isolation, applies the leader's fence, retries
//! serialization failures and deadlocks a bounded number of times, bounds
//! each attempt in time, maps connection trouble to
//! [`StoreError::Unavailable`] (so callers' `retry_until` applies) and
//! records per-operation metrics.
//!
//! Isolation: writes run READ COMMITTED. Every read-modify-write of a node
//! locks that node's row first (`SELECT ... FOR UPDATE`, or a conditional
//! `UPDATE` that takes the same lock), so its decision is made on the latest
//! committed row, and several rows are always locked in id order. Derived
//! state has one writer (the fenced leader). SERIALIZABLE would buy no
//! invariant on top of that and would abort facts under contention, which
//! costs a node its stream. Multi-statement reads run REPEATABLE READ READ
//! ONLY: one snapshot, and such transactions never fail to serialize.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deadpool_postgres::{Object, Pool, PoolError, StatementCache, Timeouts};
use futures_util::future::try_join_all;
use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row, Statement};

use super::metrics::{Metrics, Outcome};
use super::pool::CONNECT_TIMEOUT;
use crate::store::StoreError;

/// Where an operation's body runs its statements: the connection of its
/// transaction, or for a read of independent statements
/// ([`Mode::Statement`]) the bare connection, where each statement is its
/// own snapshot and BEGIN and COMMIT are saved.
pub(super) struct Db<'a> {
    client: &'a Client,
    statements: &'a StatementCache,
}

impl<'a> Db<'a> {
    fn bare(client: &'a deadpool_postgres::ClientWrapper) -> Self {
        Db {
            client,
            statements: &client.statement_cache,
        }
    }

    async fn prepare(&self, sql: &str) -> Result<Statement, tokio_postgres::Error> {
        self.statements.prepare(self.client, sql).await
    }
}

/// What an operation's body returns.
pub(super) type TxFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, TxError>> + Send + 'a>>;

/// Rows per statement of a large write. A statement's parameters are
/// encoded whole, twice over (the statement's buffer, the connection's),
/// and a connection keeps its buffers at the largest size they grew to:
/// the first derivation at 10,000 nodes wrote 19,800 routes as 4.3 MB.
/// Statements of this many rows keep both near 0.1 MB, so a connection
/// that wrote a large change set goes back to the pool. Closing it
/// instead cost a replacement (a backend, a TLS handshake, every
/// statement planned anew) three times in a 1,000-node convergence.
/// Statements of 500 rows and of 1,000 cost the server alike (10,000
/// nodes, three rounds side by side: 1.28-1.55 s of its CPU against
/// 1.30-1.52 s).
pub(super) const WRITE_CHUNK: usize = 500;

/// A get that takes a free connection or opens one, and never waits for
/// a busy one.
const FREE_NOW: Timeouts = Timeouts {
    wait: Some(Duration::ZERO),
    create: Some(CONNECT_TIMEOUT),
    recycle: Some(CONNECT_TIMEOUT),
};

/// Attempts per call when the database asks for a rerun (40001, 40P01).
const MAX_ATTEMPTS: u32 = 5;
/// First pause before a rerun; doubled each time, jittered by ±50 %.
const FIRST_PAUSE: Duration = Duration::from_millis(10);
/// One attempt's bound, on top of the server's `statement_timeout`: a frozen
/// server whose kernel still acknowledges packets trips neither that nor the
/// TCP timeouts.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(15);

/// Why an operation's body or the helper failed.
#[derive(Debug)]
pub(super) enum TxError {
    Db(tokio_postgres::Error),
    Pool(PoolError),
    TimedOut,
    /// A row this binary cannot read (a value outside what the schema allows).
    Decode(String),
    /// A refusal the store contract describes.
    Store(StoreError),
}

impl From<tokio_postgres::Error> for TxError {
    fn from(e: tokio_postgres::Error) -> Self {
        TxError::Db(e)
    }
}

impl From<StoreError> for TxError {
    fn from(e: StoreError) -> Self {
        TxError::Store(e)
    }
}

/// How an operation uses the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Reads only, from one snapshot.
    Read,
    /// A read whose body runs one statement, or several that need no
    /// common snapshot: on the bare connection, no transaction around it
    /// (each statement is its own snapshot).
    Statement,
    /// Facts and operator writes, from any replica.
    Write,
    /// The leader's derivations: with `Some(epoch)`, the transaction first
    /// reads the leadership row FOR SHARE and aborts with
    /// [`StoreError::Fenced`] unless the epoch still stands. The share lock
    /// makes a takeover's epoch bump wait for this transaction, so no
    /// deposed leader's write commits after it.
    Derive(Option<u64>),
}

/// A named operation and how it runs.
#[derive(Debug, Clone, Copy)]
pub(super) struct Op {
    pub name: &'static str,
    pub mode: Mode,
    /// Its answer is as large as the fleet (a whole table): the connection
    /// is closed afterwards rather than pooled, so that the buffers that
    /// grew to hold the answer go with it.
    pub bulk: bool,
}

impl Op {
    /// An operation whose answer fits a pooled connection.
    pub(super) fn new(name: &'static str, mode: Mode) -> Op {
        Op {
            name,
            mode,
            bulk: false,
        }
    }
}

/// The pool plus the metrics every call records into. Cheap to clone.
#[derive(Clone)]
pub(super) struct Tx {
    pool: Pool,
    metrics: Arc<Metrics>,
}

impl Tx {
    pub(super) fn new(pool: Pool) -> Self {
        Self {
            pool,
            metrics: Arc::default(),
        }
    }

    /// The same helper on another pool, counting into the same metrics.
    pub(super) fn with_pool(&self, pool: Pool) -> Self {
        Self {
            pool,
            metrics: self.metrics.clone(),
        }
    }

    pub(super) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Opens the pool's missing connections at once and leaves them idle:
    /// a burst then finds them ready rather than paying, in the middle
    /// of it, for a dial, a TLS handshake and a backend's start each. A
    /// connection that cannot be opened now is left to its first caller.
    /// For a pool nobody uses yet (at start, as a term begins): it holds
    /// the idle connections too while the others open.
    pub(super) async fn fill(&self) {
        // One get per slot: the idle connections are among those taken,
        // so every missing one is opened. None waits for a busy one (or
        // for another fill's), so a fill never holds what it took while
        // waiting on another caller.
        let mut opening = tokio::task::JoinSet::new();
        for _ in 0..self.pool.status().max_size {
            let pool = self.pool.clone();
            opening.spawn(async move { pool.timeout_get(&FREE_NOW).await.ok() });
        }
        drop(opening.join_all().await);
    }

    /// After a connection was closed on purpose: opens its successor now,
    /// off the caller's path, when no idle connection is waiting. With one
    /// idle, the next caller takes that, and opening a new one would mean
    /// holding the idle ones meanwhile.
    fn replace_closed(&self) {
        if self.pool.status().available > 0 {
            return;
        }
        let pool = self.pool.clone();
        tokio::spawn(async move { drop(pool.timeout_get(&FREE_NOW).await) });
    }

    /// Runs `body` in a transaction for `op`, with `args` lent to every
    /// attempt (the body may run more than once). Commits if it returns `Ok`.
    pub(super) async fn run<A, T, F>(&self, op: Op, args: A, body: F) -> Result<T, StoreError>
    where
        A: Send + Sync,
        T: Send,
        F: for<'a> Fn(&'a Db<'_>, &'a A) -> TxFuture<'a, T> + Send + Sync,
    {
        let started = Instant::now();
        let mut attempt = 1;
        let result = loop {
            match self.attempt(op, &args, &body).await {
                Err(TxError::Db(e)) if must_rerun(&e) && attempt < MAX_ATTEMPTS => {
                    self.metrics.retried(op.name);
                    tokio::time::sleep(pause(attempt)).await;
                    attempt += 1;
                }
                other => break other,
            }
        };
        let result = result.map_err(|e| to_store_error(op.name, e));
        self.metrics
            .finished(op.name, started.elapsed(), outcome(&result));
        result
    }

    async fn attempt<A, T, F>(&self, op: Op, args: &A, body: &F) -> Result<T, TxError>
    where
        F: for<'a> Fn(&'a Db<'_>, &'a A) -> TxFuture<'a, T>,
    {
        let pooled = self.pool.get().await.map_err(TxError::Pool)?;
        let conn = Checkout::new(pooled);
        let work = async {
            let db = Db::bare(conn.client());
            match op.mode {
                Mode::Statement => body(&db, args).await,
                _ => conn.transaction(op.mode, &db, body(&db, args)).await,
            }
        };
        match tokio::time::timeout(ATTEMPT_TIMEOUT, work).await {
            Ok(result) => {
                if op.bulk {
                    conn.discard();
                    self.replace_closed();
                }
                result
            }
            Err(_) => {
                // The connection is mid-conversation with a server that went
                // silent: never hand it to another caller.
                conn.discard();
                Err(TxError::TimedOut)
            }
        }
    }
}

/// A pooled connection that goes back to the pool only outside a
/// transaction. One given up inside a transaction (its caller's future
/// was dropped) is rolled back first, off the caller's task, and closed
/// if that fails: a connection left inside a transaction would hold its
/// locks, and its next caller's work would join it. It is not simply
/// closed: callers give up while the database is unreachable, and a
/// connection that lives through the outage is back at once with the
/// path, where a new one waits on its dial's retries.
struct Checkout {
    client: Option<Object>,
    in_transaction: AtomicBool,
}

impl Checkout {
    fn new(client: Object) -> Self {
        Self {
            client: Some(client),
            in_transaction: AtomicBool::new(false),
        }
    }

    fn client(&self) -> &deadpool_postgres::ClientWrapper {
        self.client
            .as_deref()
            .expect("a checkout holds its client until dropped")
    }

    /// Closes the connection rather than pooling it.
    fn discard(mut self) {
        if let Some(client) = self.client.take() {
            drop(Object::take(client));
        }
    }

    /// Runs `body` in a transaction of `mode`. For the leader's work and
    /// reads BEGIN is not waited for: it goes out with the body's first
    /// statements, which the server runs after it (a round trip saved on
    /// each of a reconcile's records and a derivation's writes). Facts
    /// and operator writes wait for it: pipelined, the facts a node flood
    /// had queued while the database path was black-holed drained 20 s
    /// after the path came back instead of 7 (`tests/bounded.rs`), for a
    /// reason not found yet. Whatever fails, the transaction is rolled
    /// back before the connection is pooled again.
    async fn transaction<T>(
        &self,
        mode: Mode,
        db: &Db<'_>,
        body: TxFuture<'_, T>,
    ) -> Result<T, TxError> {
        let client = self.client();
        self.in_transaction.store(true, Ordering::Relaxed);
        let begin = async { Ok(client.batch_execute(mode.begin()).await?) };
        let run = async {
            match mode {
                Mode::Derive(Some(epoch)) => fenced(db, epoch, body).await,
                _ => body.await,
            }
        };
        let outcome = match mode {
            Mode::Write => match begin.await {
                Ok(()) => run.await.map(|v| ((), v)),
                Err(e) => Err(e),
            },
            _ => tokio::try_join!(biased; begin, run),
        };
        let end = if outcome.is_ok() {
            "COMMIT"
        } else {
            "ROLLBACK"
        };
        let ended = client.batch_execute(end).await;
        // A failed COMMIT ends the transaction too; a failed ROLLBACK
        // leaves the connection in doubt, and it is closed.
        if ended.is_ok() || end == "COMMIT" {
            self.in_transaction.store(false, Ordering::Relaxed);
        }
        let ((), value) = outcome?;
        ended?;
        Ok(value)
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        if !self.in_transaction.load(Ordering::Relaxed) {
            return;
        }
        let Some(client) = self.client.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            drop(Object::take(client));
            return;
        };
        runtime.spawn(async move {
            let rollback = client.batch_execute("ROLLBACK");
            if !matches!(
                tokio::time::timeout(ATTEMPT_TIMEOUT, rollback).await,
                Ok(Ok(()))
            ) {
                drop(Object::take(client));
            }
        });
    }
}

impl Mode {
    /// The statement that opens a transaction of this mode. Writes run
    /// READ COMMITTED, reads REPEATABLE READ READ ONLY (see above).
    fn begin(self) -> &'static str {
        match self {
            Mode::Read | Mode::Statement => "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
            Mode::Write | Mode::Derive(_) => "BEGIN ISOLATION LEVEL READ COMMITTED",
        }
    }
}

const FENCE: &str = "SELECT epoch, set_config('slim_cp.epoch', $1, true) \
     FROM leadership WHERE singleton FOR SHARE";

/// Runs `body` behind the fence of `epoch`: aborts unless the epoch
/// stands, and names it in `slim_cp.epoch` (transaction-local) so that
/// audits and triggers can tell which term wrote what. If the fence
/// fails, the body's work goes with the transaction.
async fn fenced<'a, T>(db: &'a Db<'_>, epoch: u64, body: TxFuture<'a, T>) -> Result<T, TxError> {
    let epoch_text = epoch.to_string();
    let (row, value) = ahead_of(db, FENCE, &[&epoch_text], body).await?;
    let current: i64 = row.try_get(0)?;
    if i64::try_from(epoch).ok() == Some(current) {
        return Ok(value);
    }
    Err(StoreError::Fenced {
        epoch,
        current: u64::try_from(current).unwrap_or(0),
    }
    .into())
}

/// Runs `work` in a transaction whose commit returns before its WAL is
/// on disk (about 3 ms of a fsync here, per commit). Only for what a
/// reconcile observes on a node and records: a database crash may lose
/// the last moments of such writes (never tear them), and the next look
/// at the node records them again.
///
/// Its statements also run on generic plans. They update a node's rows
/// by id from arrays of at most a command's items; a custom plan sees the
/// arrays' true length and, on a table of a few thousand rows, joined
/// them by scanning the whole table (1.0-1.3 ms for a gateway's 98 route
/// marks among 4,900 routes, against 0.44 ms by the primary key). A
/// generic plan assumes a short array, but a connection keeps the one it
/// made first, costed on the table as it was then: made while a fresh
/// fleet's routes were a few hundred, it hashed the marks against the
/// whole table, and at 10,000 nodes every mark read 19,800 routes (a
/// second of the server's time in a convergence). With sequential scans
/// off for the transaction, every plan looks the ids up by key.
pub(super) async fn relaxed<T>(
    db: &Db<'_>,
    work: impl Future<Output = Result<T, TxError>>,
) -> Result<T, TxError> {
    const SQL: &str = "SELECT set_config('synchronous_commit', 'off', true), \
         set_config('plan_cache_mode', 'force_generic_plan', true), \
         set_config('enable_seqscan', 'off', true)";
    Ok(ahead_of(db, SQL, &[], work).await?.1)
}

/// Runs `work` on custom plans, for the rest of the transaction: for
/// reads by arrays of node ids that run during a registration burst. A
/// statement prepared while the fleet's tables were nearly empty (a fresh
/// database: autovacuum looks about once a minute) kept a generic plan
/// that scanned every link and compared it with each of a few hundred ids
/// (16-136 ms a statement, 0.2-1.1 s of server time in a 10,000-node
/// burst). A custom plan sees the array: it looks the ids up, or compares
/// each row with a hash of them.
pub(super) async fn custom_plans<T>(
    db: &Db<'_>,
    work: impl Future<Output = Result<T, TxError>>,
) -> Result<T, TxError> {
    const SQL: &str = "SELECT set_config('plan_cache_mode', 'force_custom_plan', true)";
    Ok(ahead_of(db, SQL, &[], work).await?.1)
}

/// Runs the one-row statement `sql` before `work`'s statements without
/// waiting for its answer (a round trip saved): the server runs a
/// connection's statements in the order they arrive, and `sql` is sent
/// first because it is prepared beforehand (cached after its first use)
/// and the join polls it first, which sends it.
async fn ahead_of<T>(
    db: &Db<'_>,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
    work: impl Future<Output = Result<T, TxError>>,
) -> Result<(Row, T), TxError> {
    let first = db.prepare(sql).await?;
    let first = async { Ok(db.client.query_one(&first, params).await?) };
    tokio::try_join!(biased; first, work)
}

/// The database asks for the transaction to be run again.
fn must_rerun(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
    )
}

fn pause(attempt: u32) -> Duration {
    use rand::Rng;
    let base = FIRST_PAUSE * 2u32.saturating_pow(attempt.saturating_sub(1));
    // Jitter so that two transactions that collided do not collide again.
    base.mul_f64(rand::rng().random_range(0.5..1.5))
}

fn outcome<T>(result: &Result<T, StoreError>) -> Outcome {
    match result {
        Ok(_) => Outcome::Ok,
        Err(StoreError::Unavailable(_)) => Outcome::Unavailable,
        Err(StoreError::Fenced { .. }) => Outcome::Fenced,
        Err(_) => Outcome::Refused,
    }
}

/// A contract refusal passes through; the database being away (no
/// connection, a timeout, a rerun it kept asking for) is `Unavailable`, so
/// callers may retry; a statement the database refused is `Rejected`,
/// logged with its SQLSTATE, and never retried: it would fail the same way.
fn to_store_error(op: &str, e: TxError) -> StoreError {
    match e {
        TxError::Store(e) => e,
        TxError::Db(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
            StoreError::Conflict(describe_db_error(op, &e))
        }
        TxError::Db(e) if e.as_db_error().is_some_and(|db| !is_away(db.code())) => {
            let why = describe_db_error(op, &e);
            tracing::error!(op, error = %why, "database refused a statement");
            StoreError::Rejected(why)
        }
        TxError::Db(e) => StoreError::Unavailable(describe_db_error(op, &e)),
        TxError::Pool(e) => StoreError::Unavailable(format!("{op}: no database connection: {e}")),
        TxError::TimedOut => StoreError::Unavailable(format!(
            "{op}: no answer from the database in {ATTEMPT_TIMEOUT:?}"
        )),
        TxError::Decode(m) => {
            tracing::error!(op, %m, "unreadable row");
            StoreError::Rejected(format!("{op}: unreadable row: {m}"))
        }
    }
}

/// Codes that say the database is away or asks for a rerun, not that it
/// refused the statement: connection exceptions (08), insufficient
/// resources (53: too many connections, disk or memory full), operator
/// intervention (57: statement timeout, shutdown), rerun requests (40:
/// serialization failure, deadlock), a lock wait given up (55P03), a
/// standby that cannot write (25006) and I/O trouble on the server (58).
fn is_away(code: &SqlState) -> bool {
    let c = code.code();
    ["08", "53", "57", "40", "58"]
        .iter()
        .any(|class| c.starts_with(class))
        || *code == SqlState::READ_ONLY_SQL_TRANSACTION
        || *code == SqlState::LOCK_NOT_AVAILABLE
}

/// The operation, the server's message, its SQLSTATE and constraint.
fn describe_db_error(op: &str, e: &tokio_postgres::Error) -> String {
    let Some(db) = e.as_db_error() else {
        return format!("{op}: {e}");
    };
    let code = db.code().code();
    match db.constraint() {
        Some(c) => format!("{op}: {} (SQLSTATE {code}, {c})", db.message()),
        None => format!("{op}: {} (SQLSTATE {code})", db.message()),
    }
}

/// A query's rows, each converted by `convert`.
pub(super) async fn query_map<T>(
    db: &Db<'_>,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
    convert: fn(&Row) -> Result<T, TxError>,
) -> Result<Vec<T>, TxError> {
    query(db, sql, params).await?.iter().map(convert).collect()
}

/// A prepared (and per-connection cached) statement's rows.
pub(super) async fn query(
    db: &Db<'_>,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>, TxError> {
    let stmt = db.prepare(sql).await?;
    Ok(db.client.query(&stmt, params).await?)
}

pub(super) async fn query_opt(
    db: &Db<'_>,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Option<Row>, TxError> {
    let stmt = db.prepare(sql).await?;
    Ok(db.client.query_opt(&stmt, params).await?)
}

pub(super) async fn query_one(
    db: &Db<'_>,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Row, TxError> {
    let stmt = db.prepare(sql).await?;
    Ok(db.client.query_one(&stmt, params).await?)
}

/// Rows affected.
pub(super) async fn execute(
    db: &Db<'_>,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<u64, TxError> {
    let stmt = db.prepare(sql).await?;
    Ok(db.client.execute(&stmt, params).await?)
}

/// Runs `sql`, whose one parameter is an array of ids, over `ids` in
/// statements of at most [`WRITE_CHUNK`] ids; returns the rows affected.
pub(super) async fn execute_by_ids(db: &Db<'_>, sql: &str, ids: &[String]) -> Result<u64, TxError> {
    in_chunks(
        ids,
        |chunk| async move { execute(db, sql, &[&chunk]).await },
    )
    .await
}

/// Runs `write` over `items` in chunks of at most [`WRITE_CHUNK`], sent
/// one after another without waiting for answers (the connection
/// pipelines them; the server runs them in order); returns the sum of
/// what they return. Waiting for each answer before sending the next
/// chunk left the server idle while the client encoded the next, and
/// cost a wake-up on each side per chunk: a 4,400-row change set is nine
/// chunks. A failed chunk fails the transaction, so the first error is
/// the one returned.
pub(super) async fn in_chunks<'i, T, F, Fut>(items: &'i [T], write: F) -> Result<u64, TxError>
where
    F: Fn(&'i [T]) -> Fut,
    Fut: Future<Output = Result<u64, TxError>>,
{
    let sent = items.chunks(WRITE_CHUNK).map(write);
    Ok(try_join_all(sent).await?.into_iter().sum())
}

/// Runs `insert` under a savepoint and, if it met a row it would have
/// replaced (a unique violation), undoes it and runs `otherwise`: a
/// caller that believed its rows new inserts them at an insert's cost,
/// and a wrong belief still ends as an upsert would. Inside a transaction.
///
/// The savepoint goes out with the insert, not a round trip ahead of it,
/// and is not released: the commit ends it, and a later one of the same
/// name hides it, so `ROLLBACK TO` always finds the latest. A derivation's
/// write saves four round trips (links and routes).
pub(super) async fn insert_else<F, G>(
    db: &Db<'_>,
    insert: impl Future<Output = Result<(), TxError>>,
    otherwise: F,
) -> Result<(), TxError>
where
    F: FnOnce() -> G,
    G: Future<Output = Result<(), TxError>>,
{
    let savepoint = async { Ok(db.client.batch_execute("SAVEPOINT insert_else").await?) };
    match tokio::try_join!(biased; savepoint, insert) {
        Ok(((), ())) => Ok(()),
        Err(TxError::Db(e)) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
            db.client
                .batch_execute("ROLLBACK TO SAVEPOINT insert_else")
                .await?;
            otherwise().await
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_grow_and_stay_jittered() {
        for attempt in 1..MAX_ATTEMPTS {
            let base = FIRST_PAUSE * 2u32.pow(attempt - 1);
            let p = pause(attempt);
            assert!(p >= base / 2 && p <= base * 3 / 2, "{attempt}: {p:?}");
        }
    }

    #[test]
    fn only_an_away_database_is_worth_a_retry() {
        for away in [
            SqlState::CONNECTION_FAILURE,
            SqlState::ADMIN_SHUTDOWN,
            SqlState::QUERY_CANCELED,
            SqlState::TOO_MANY_CONNECTIONS,
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::T_R_DEADLOCK_DETECTED,
            SqlState::READ_ONLY_SQL_TRANSACTION,
            SqlState::LOCK_NOT_AVAILABLE,
        ] {
            assert!(is_away(&away), "{}", away.code());
        }
        for refused in [
            SqlState::PROGRAM_LIMIT_EXCEEDED,
            SqlState::STRING_DATA_RIGHT_TRUNCATION,
            SqlState::CHARACTER_NOT_IN_REPERTOIRE,
            SqlState::FOREIGN_KEY_VIOLATION,
            SqlState::CHECK_VIOLATION,
            SqlState::UNDEFINED_TABLE,
            SqlState::SYNTAX_ERROR,
        ] {
            assert!(!is_away(&refused), "{}", refused.code());
        }
    }

    #[test]
    fn unreadable_rows_are_rejected_not_retried() {
        let e = to_store_error("list_nodes", TxError::Decode("bad kind".into()));
        assert!(
            matches!(&e, StoreError::Rejected(m) if m.contains("bad kind")),
            "{e:?}"
        );
    }

    #[test]
    fn refusals_pass_through_and_the_rest_is_unavailable() {
        let stale = StoreError::SegmentNotFound("s".into());
        assert_eq!(to_store_error("op", TxError::Store(stale.clone())), stale);
        let timed_out = to_store_error("get_node", TxError::TimedOut);
        assert!(
            matches!(&timed_out, StoreError::Unavailable(m) if m.starts_with("get_node")),
            "{timed_out:?}"
        );
        assert_eq!(outcome(&Ok::<(), StoreError>(())), Outcome::Ok);
        assert_eq!(outcome::<()>(&Err(timed_out)), Outcome::Unavailable);
    }
}
