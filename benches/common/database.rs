//! A fresh, migrated Postgres database per benchmark run, named
//! `slimcp_bench_<what>_<uuid>`, dropped at the end: a run never sees an
//! earlier run's rows, and never leaves its own behind.

use anyhow::{Context, Result};
use slim_cp::store::PgStore;
use tokio_postgres::{Client, NoTls};

/// The maintenance database the fresh ones are created from.
pub const DEFAULT_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// A plain connection of its own (never pooled: the takeover drill times
/// its polls, and its session must not be shared).
pub async fn connect(url: &str) -> Result<Client> {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .with_context(|| format!("connecting to {url}"))?;
    tokio::spawn(conn);
    Ok(client)
}

/// `url` with its database name replaced by `db` (query parameters kept).
pub fn with_database(url: &str, db: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let after_scheme = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[after_scheme..]
        .find('/')
        .map_or(base.len(), |i| after_scheme + i);
    let url = format!("{}/{db}", &base[..host_end]);
    query.map_or_else(|| url.clone(), |q| format!("{url}?{q}"))
}

/// The pid of the backend serving a connection to `url`: with it, the
/// server's processes can be found when it runs on this machine.
pub async fn backend_pid(url: &str) -> Option<u32> {
    let client = connect(url).await.ok()?;
    let row = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .ok()?;
    u32::try_from(row.get::<_, i32>(0)).ok()
}

/// What one table had written to it during a run.
pub struct TableRows {
    pub table: String,
    pub inserted: i64,
    /// Updates, `hot` of them heap-only (no index touched).
    pub updated: i64,
    pub hot: i64,
    pub deleted: i64,
}

impl TableRows {
    /// `links +1225 ~2450 (hot 2100)`: inserts, updates, deletes if any.
    pub fn summary(rows: &[TableRows]) -> String {
        let one = |t: &TableRows| {
            let mut s = format!("{} +{} ~{} (hot {})", t.table, t.inserted, t.updated, t.hot);
            if t.deleted > 0 {
                s.push_str(&format!(" -{}", t.deleted));
            }
            s
        };
        rows.iter().map(one).collect::<Vec<_>>().join(", ")
    }
}

pub struct BenchDb {
    admin_url: String,
    pub name: String,
    /// The URL replicas and observers use.
    pub url: String,
    dropped: bool,
}

impl BenchDb {
    /// Creates and migrates `slimcp_bench_<what>_<uuid>` (with this
    /// crate's migrations).
    pub async fn create(admin_url: &str, what: &str) -> Result<BenchDb> {
        let db = Self::create_empty(admin_url, what).await?;
        PgStore::migrate(&db.url).await.context("migrating")?;
        Ok(db)
    }

    /// Creates `slimcp_bench_<what>_<uuid>`, with no schema: for a
    /// [`Cluster`](super::cluster::Cluster), which migrates it with the
    /// binary it runs.
    pub async fn create_empty(admin_url: &str, what: &str) -> Result<BenchDb> {
        let name = format!("slimcp_bench_{what}_{}", uuid::Uuid::new_v4().simple());
        let admin = connect(admin_url).await?;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .with_context(|| format!("creating {name}"))?;
        let db = BenchDb {
            admin_url: admin_url.to_string(),
            url: with_database(admin_url, &name),
            name,
            dropped: false,
        };
        Ok(db)
    }

    /// The pid of a server process serving a connection of ours.
    pub async fn backend_pid(&self) -> Option<u32> {
        backend_pid(&self.admin_url).await
    }

    /// `pg_database_size`, in MB.
    pub async fn size_mb(&self) -> Result<f64> {
        let admin = connect(&self.admin_url).await?;
        let row = admin
            .query_one("SELECT pg_database_size($1)", &[&self.name])
            .await?;
        Ok(row.get::<_, i64>(0) as f64 / 1e6)
    }

    /// The rows each table had written to it, from the server's own
    /// counters: unlike times, the same fleet gives the same counts on a
    /// busy machine and a quiet one, so a change in the writes a
    /// convergence costs shows at once. Read once the replicas are gone
    /// (a backend reports its counts as it exits).
    pub async fn rows_written(&self) -> Result<Vec<TableRows>> {
        let client = connect(&self.url).await?;
        let rows = client
            .query(
                "SELECT relname::text, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del \
                 FROM pg_stat_user_tables WHERE n_tup_ins + n_tup_upd + n_tup_del > 0 \
                 ORDER BY relname",
                &[],
            )
            .await?;
        let table = |r: &tokio_postgres::Row| -> Result<TableRows> {
            Ok(TableRows {
                table: r.try_get(0)?,
                inserted: r.try_get(1)?,
                updated: r.try_get(2)?,
                hot: r.try_get(3)?,
                deleted: r.try_get(4)?,
            })
        };
        rows.iter().map(table).collect()
    }

    /// Drops the database (disconnecting whoever is still on it).
    pub async fn remove(mut self) -> Result<()> {
        self.dropped = true;
        drop_database(&self.admin_url, &self.name).await
    }
}

async fn drop_database(admin_url: &str, name: &str) -> Result<()> {
    let admin = connect(admin_url).await?;
    let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
    admin.batch_execute(&sql).await?;
    Ok(())
}

impl Drop for BenchDb {
    /// A run that failed half-way still drops its database. Drop cannot
    /// await inside the bench's runtime: a thread with its own does it.
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        let (admin_url, name) = (self.admin_url.clone(), self.name.clone());
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(drop_database(&admin_url, &name))
        });
        if let Ok(Err(e)) = dropped.join() {
            eprintln!("could not drop database {}: {e:#}", self.name);
        }
    }
}
