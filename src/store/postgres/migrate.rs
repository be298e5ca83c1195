//! The schema: sqlx migrations from `migrations/`, embedded in the binary.
//! `migrate` applies the missing ones; `check_schema` lets a replica
//! refuse a database it does not understand instead of corrupting it.
//!
//! Both run over tokio-postgres with the connector every other connection
//! uses (TLS included), not over sqlx's driver, but keep sqlx's
//! bookkeeping exactly: the `_sqlx_migrations` table, its rows, and the
//! advisory lock that serialises concurrent migrators, so that databases
//! and migrators of earlier slim-cp versions agree with this one.

use std::time::Instant;

use sqlx::migrate::{Migration, Migrator};
use tokio_postgres::{Client, GenericClient};

use super::SetupError;
use super::pool::pg_config;

static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// As sqlx creates it.
const MIGRATIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS _sqlx_migrations (
    version BIGINT PRIMARY KEY,
    description TEXT NOT NULL,
    installed_on TIMESTAMPTZ NOT NULL DEFAULT now(),
    success BOOLEAN NOT NULL,
    checksum BYTEA NOT NULL,
    execution_time BIGINT NOT NULL
)";

/// Applies every embedded migration the database lacks.
pub(super) async fn run(url: &str) -> Result<(), SetupError> {
    let mut session = Session::open(url).await?;
    let client = &mut session.client;
    // A migration, or the wait for another migrator's lock, may outlast
    // the statement timeout every session gets.
    client
        .batch_execute("SET statement_timeout = 0")
        .await
        .map_err(migrate_error)?;
    let db: String = client
        .query_one("SELECT current_database()", &[])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(migrate_error)?;
    client
        .execute("SELECT pg_advisory_lock($1)", &[&lock_id(&db)])
        .await
        .map_err(migrate_error)?;
    // Ending the session releases the lock whatever happens here.
    apply_missing(client).await
}

/// sqlx's lock key for database `db`.
fn lock_id(db: &str) -> i64 {
    const CRC_32: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);
    0x3d32_ad9e * i64::from(CRC_32.checksum(db.as_bytes()))
}

async fn apply_missing(client: &mut Client) -> Result<(), SetupError> {
    client
        .batch_execute(MIGRATIONS_TABLE)
        .await
        .map_err(migrate_error)?;
    let pending = match compare(&read_applied(client).await?, &known()) {
        Ok(()) => return Ok(()),
        Err(SetupError::SchemaPending(pending)) => pending,
        Err(refused) => return Err(refused),
    };
    for migration in MIGRATOR.iter() {
        if pending.contains(&migration.version) && !migration.migration_type.is_down_migration() {
            apply(client, migration).await?;
        }
    }
    Ok(())
}

/// One migration and its row, in one transaction unless the migration
/// asks for none; the duration is filled in afterwards, as sqlx does.
async fn apply(client: &mut Client, migration: &Migration) -> Result<(), SetupError> {
    let failed = |e: tokio_postgres::Error| {
        SetupError::Migrate(format!("migration {}: {e}", migration.version))
    };
    let started = Instant::now();
    if migration.no_tx {
        execute_and_record(client, migration)
            .await
            .map_err(failed)?;
    } else {
        let tx = client.transaction().await.map_err(failed)?;
        execute_and_record(&tx, migration).await.map_err(failed)?;
        tx.commit().await.map_err(failed)?;
    }
    let nanos = i64::try_from(started.elapsed().as_nanos()).unwrap_or(i64::MAX);
    client
        .execute(
            "UPDATE _sqlx_migrations SET execution_time = $1 WHERE version = $2",
            &[&nanos, &migration.version],
        )
        .await
        .map_err(failed)?;
    Ok(())
}

async fn execute_and_record(
    client: &impl GenericClient,
    migration: &Migration,
) -> Result<(), tokio_postgres::Error> {
    client.batch_execute(&migration.sql).await?;
    client
        .execute(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
             VALUES ($1, $2, TRUE, $3, -1)",
            &[
                &migration.version,
                &&*migration.description,
                &&*migration.checksum,
            ],
        )
        .await?;
    Ok(())
}

fn migrate_error(e: tokio_postgres::Error) -> SetupError {
    SetupError::Migrate(e.to_string())
}

fn connect_error(e: tokio_postgres::Error) -> SetupError {
    SetupError::connect(&e)
}

/// A connection for the migrator; dropping it ends the session.
struct Session {
    client: Client,
    driver: tokio::task::JoinHandle<()>,
}

impl Session {
    async fn open(url: &str) -> Result<Session, SetupError> {
        let (client, connection) = pg_config(url)?.connect().await.map_err(connect_error)?;
        let driver = tokio::spawn(async move {
            // Its errors surface through the client's calls.
            let _ = connection.await;
        });
        Ok(Session { client, driver })
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// A migration the database records as applied.
#[derive(Debug, Clone, PartialEq)]
struct Applied {
    version: i64,
    success: bool,
    checksum: Vec<u8>,
}

/// The embedded migrations: version and checksum.
fn known() -> Vec<(i64, &'static [u8])> {
    MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .map(|m| (m.version, &*m.checksum))
        .collect()
}

/// Refuses a database this binary must not run against: one with a
/// migration it does not know (a newer slim-cp migrated it), a failed or
/// altered migration, or missing migrations.
pub(super) async fn check(url: &str) -> Result<(), SetupError> {
    let session = Session::open(url).await?;
    compare(&read_applied(&session.client).await?, &known())
}

async fn read_applied(client: &Client) -> Result<Vec<Applied>, SetupError> {
    let rows = async {
        let present: bool = client
            .query_one("SELECT to_regclass('_sqlx_migrations') IS NOT NULL", &[])
            .await?
            .try_get(0)?;
        if !present {
            return Ok(Vec::new());
        }
        client
            .query(
                "SELECT version, success, checksum FROM _sqlx_migrations ORDER BY version",
                &[],
            )
            .await
    }
    .await
    .map_err(connect_error)?;
    rows.iter()
        .map(|r| {
            Ok(Applied {
                version: r.try_get(0)?,
                success: r.try_get(1)?,
                checksum: r.try_get(2)?,
            })
        })
        .collect::<Result<_, tokio_postgres::Error>>()
        .map_err(connect_error)
}

fn compare(applied: &[Applied], known: &[(i64, &[u8])]) -> Result<(), SetupError> {
    let latest = known.iter().map(|(v, _)| *v).max().unwrap_or(0);
    for a in applied {
        let Some((_, checksum)) = known.iter().find(|(v, _)| *v == a.version) else {
            return Err(SetupError::SchemaNewer {
                applied: a.version,
                known: latest,
            });
        };
        if !a.success {
            return Err(SetupError::SchemaDirty(a.version));
        }
        if a.checksum != *checksum {
            return Err(SetupError::SchemaModified(a.version));
        }
    }
    let pending: Vec<i64> = known
        .iter()
        .map(|(v, _)| *v)
        .filter(|v| !applied.iter().any(|a| a.version == *v))
        .collect();
    if pending.is_empty() {
        Ok(())
    } else {
        Err(SetupError::SchemaPending(pending))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(version: i64, checksum: &[u8]) -> Applied {
        Applied {
            version,
            success: true,
            checksum: checksum.to_vec(),
        }
    }

    const KNOWN: [(i64, &[u8]); 2] = [(1, b"one"), (2, b"two")];

    #[test]
    fn a_matching_schema_passes() {
        assert!(compare(&[applied(1, b"one"), applied(2, b"two")], &KNOWN).is_ok());
    }

    #[test]
    fn a_newer_migration_is_refused() {
        let err = compare(&[applied(1, b"one"), applied(3, b"x")], &KNOWN).unwrap_err();
        assert!(
            matches!(
                err,
                SetupError::SchemaNewer {
                    applied: 3,
                    known: 2
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("newer"), "{err}");
    }

    #[test]
    fn missing_failed_or_altered_migrations_are_refused() {
        let err = compare(&[applied(1, b"one")], &KNOWN).unwrap_err();
        assert!(
            matches!(err, SetupError::SchemaPending(ref v) if v == &[2]),
            "{err}"
        );
        let mut failed = applied(2, b"two");
        failed.success = false;
        let err = compare(&[applied(1, b"one"), failed], &KNOWN).unwrap_err();
        assert!(matches!(err, SetupError::SchemaDirty(2)), "{err}");
        let err = compare(&[applied(1, b"uno"), applied(2, b"two")], &KNOWN).unwrap_err();
        assert!(matches!(err, SetupError::SchemaModified(1)), "{err}");
    }

    #[test]
    fn the_lock_is_sqlxs() {
        // sqlx 0.8's generate_lock_id: 0x3d32ad9e times the CRC-32
        // (ISO-HDLC, zlib's) of the database name.
        assert_eq!(lock_id("postgres"), 0x3d32_ad9e * 0x156a_8775);
    }

    #[test]
    fn the_embedded_migrations_are_there() {
        assert!(MIGRATOR.iter().count() >= 1);
    }
}
