//! A fresh, migrated Postgres database per test, on the server [`server`]
//! picks: the one `SLIM_CP_TEST_PG` names, else the local server CI
//! provisions (`.ci/run`), else a throwaway cluster the tests start
//! themselves ([`throwaway`]). A missing server fails the test loudly;
//! nothing is ever skipped.
//!
//! Databases are named `slimcp_t_<uuid>` and carry their creation time as
//! a comment. A [`PgTestDb`] drops its database when the test passes and
//! keeps it for inspection when it fails; each process also drops, once,
//! test databases older than an hour (failed or crashed runs, and those of
//! [`fresh_pg_store`], which has no guard).

mod cluster;
mod server;
mod throwaway;
pub mod tls;

use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use slim_cp::store::PgStore;
use slim_cp::store::postgres::url::redact_url;
use tokio_postgres::{Client, NoTls};

/// Test databases older than this are dropped.
const MAX_AGE_SECS: i64 = 3600;

static CLEANED: AtomicBool = AtomicBool::new(false);
/// The advisory lock (on the maintenance database) that keeps the sweep
/// of old databases from taking one between its creation and its
/// comment: creators hold it shared, the sweep's listing exclusively.
const CREATING: i64 = 0x736c_696d_6370_745f; // "slimcp_t_"

/// The maintenance database's URL (the first call per process decides
/// which server; see [`server`]).
pub fn admin_url() -> String {
    server::admin_url()
}

/// The URL of database `db` on the test server: the admin URL with its
/// database name replaced (query parameters kept).
pub fn pg_url_for(db: &str) -> String {
    with_database(&admin_url(), db)
}

/// `url` with its database name replaced by `db`.
pub fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let after_scheme = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[after_scheme..]
        .find('/')
        .map_or(base.len(), |i| after_scheme + i);
    let mut out = format!("{}/{db}", &base[..host_end]);
    if let Some(q) = query {
        out = format!("{out}?{q}");
    }
    out
}

/// Creates `slimcp_t_<uuid>`, migrates it, and returns a store on it.
pub async fn fresh_pg_store() -> Arc<PgStore> {
    let db = fresh_pg_database().await;
    let url = pg_url_for(&db);
    let store = PgStore::connect(&url, 4)
        .await
        .unwrap_or_else(|e| panic!("connecting to test database {db}: {e}"));
    Arc::new(store)
}

/// A store on a fresh database that goes with it.
pub struct PgTestDb {
    store: Arc<PgStore>,
    name: String,
}

impl PgTestDb {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn store(&self) -> Arc<PgStore> {
        self.store.clone()
    }

    /// A plain connection of the test's own to this database, for SQL the
    /// store does not offer (inspection, faults).
    pub async fn client(&self) -> Client {
        let (client, connection) = tokio_postgres::connect(&pg_url_for(&self.name), NoTls)
            .await
            .unwrap_or_else(|e| panic!("connecting to test database {}: {e}", self.name));
        tokio::spawn(connection);
        client
    }
}

impl Deref for PgTestDb {
    type Target = PgStore;

    fn deref(&self) -> &PgStore {
        &self.store
    }
}

impl Drop for PgTestDb {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("test database {} kept for inspection", self.name);
            return;
        }
        // Drop runs inside the test's runtime, which cannot block on a
        // future: a thread with a runtime of its own does the dropping.
        let name = self.name.clone();
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let admin = admin_client().await;
                let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                admin.batch_execute(&sql).await.ok()
            })
        });
        // Best effort: the hourly sweep catches what this misses.
        let _ = dropped.join();
    }
}

/// Like [`fresh_pg_store`], but the database is dropped with the guard.
pub async fn fresh_pg_db() -> PgTestDb {
    let name = fresh_pg_database().await;
    let store = PgStore::connect(&pg_url_for(&name), 4)
        .await
        .unwrap_or_else(|e| panic!("connecting to test database {name}: {e}"));
    PgTestDb {
        store: Arc::new(store),
        name,
    }
}

/// Creates and migrates a fresh database; returns its name.
pub async fn fresh_pg_database() -> String {
    let admin = admin_client().await;
    if !CLEANED.swap(true, Ordering::SeqCst) {
        drop_old_databases(&admin).await;
    }
    let db = format!("slimcp_t_{}", uuid::Uuid::new_v4().simple());
    let now = slim_cp::clock::unix_now();
    // Separate statements: CREATE DATABASE refuses to run inside the
    // implicit transaction of a multi-statement batch. An uncommented
    // database counts as old (its creator died), hence the lock.
    for sql in [
        format!("SELECT pg_advisory_lock_shared({CREATING})"),
        format!("CREATE DATABASE {db}"),
        format!("COMMENT ON DATABASE {db} IS 'slim-cp test, created {now}'"),
        format!("SELECT pg_advisory_unlock_shared({CREATING})"),
    ] {
        admin
            .batch_execute(&sql)
            .await
            .unwrap_or_else(|e| panic!("creating test database {db}: {}", detail(&e)));
    }
    PgStore::migrate(&pg_url_for(&db))
        .await
        .unwrap_or_else(|e| panic!("migrating test database {db}: {e}"));
    db
}

async fn admin_client() -> Client {
    let url = admin_url();
    let (client, connection) = tokio_postgres::connect(&url, NoTls)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the Postgres tests cannot reach {} (SLIM_CP_TEST_PG names the server; \
                 unset, the tests use 127.0.0.1:5432 or start their own): {}",
                redact_url(&url),
                detail(&e)
            )
        });
    tokio::spawn(connection);
    client
}

/// tokio-postgres displays a server error as just "db error", and a
/// connection error without its cause.
fn detail(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return db.message().to_string();
    }
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

/// Best effort: a database another process is using, or already dropped,
/// is simply left alone.
async fn drop_old_databases(admin: &Client) {
    let lock = format!("SELECT pg_advisory_lock({CREATING})");
    if admin.batch_execute(&lock).await.is_err() {
        return;
    }
    let old = admin
        .query(
            "SELECT datname FROM pg_database \
             WHERE datname LIKE 'slimcp\\_t\\_%' \
               AND coalesce(substring(shobj_description(oid, 'pg_database') \
                   FROM 'created ([0-9]+)')::bigint, 0) < $1",
            &[&(slim_cp::clock::unix_now() - MAX_AGE_SECS)],
        )
        .await
        .unwrap_or_default();
    let unlock = format!("SELECT pg_advisory_unlock({CREATING})");
    let _ = admin.batch_execute(&unlock).await;
    for row in old {
        let name: String = row.get(0);
        let _ = admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .await;
    }
}
