//! The schema: sqlx migrations from `migrations/`, embedded in the binary.
//! `migrate` applies the missing ones (sqlx serialises concurrent runs with
//! its own advisory lock); `check_schema` lets a replica refuse a database
//! it does not understand instead of corrupting it.

use sqlx::migrate::Migrator;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};
use tokio_postgres::config::Host;
use tokio_postgres::{Config, NoTls};

use super::SetupError;
use super::pool::pg_config;

static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// Applies every embedded migration the database lacks.
pub(super) async fn run(url: &str) -> Result<(), SetupError> {
    let options = sqlx_options(&pg_config(url)?)?;
    let mut conn = options
        .connect()
        .await
        .map_err(|e| SetupError::Connect(e.to_string()))?;
    let outcome = MIGRATOR
        .run(&mut conn)
        .await
        .map_err(|e| SetupError::Migrate(e.to_string()));
    // Closing politely is a courtesy; the outcome is what matters.
    let _ = conn.close().await;
    outcome
}

/// sqlx takes only URLs; going through the parsed config accepts the
/// `key=value` form too, with one parser for both paths.
fn sqlx_options(config: &Config) -> Result<PgConnectOptions, SetupError> {
    let mut options = PgConnectOptions::new_without_pgpass().application_name("slim-cp-migrate");
    match config.get_hosts().first() {
        Some(Host::Tcp(host)) => options = options.host(host),
        Some(Host::Unix(path)) => options = options.socket(path),
        None => {}
    }
    if let Some(port) = config.get_ports().first() {
        options = options.port(*port);
    }
    if let Some(user) = config.get_user() {
        options = options.username(user);
    }
    if let Some(password) = config.get_password() {
        let password = std::str::from_utf8(password)
            .map_err(|_| SetupError::InvalidUrl("the password is not UTF-8".into()))?;
        options = options.password(password);
    }
    if let Some(db) = config.get_dbname() {
        options = options.database(db);
    }
    Ok(options)
}

/// A migration the database records as applied.
#[derive(Debug, Clone, PartialEq)]
struct Applied {
    version: i64,
    success: bool,
    checksum: Vec<u8>,
}

/// Refuses a database this binary must not run against: one with a
/// migration it does not know (a newer slim-cp migrated it), a failed or
/// altered migration, or missing migrations.
pub(super) async fn check(url: &str) -> Result<(), SetupError> {
    let applied = applied(url).await?;
    let known: Vec<(i64, &[u8])> = MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .map(|m| (m.version, &*m.checksum))
        .collect();
    compare(&applied, &known)
}

async fn applied(url: &str) -> Result<Vec<Applied>, SetupError> {
    let connect_error = |e: tokio_postgres::Error| SetupError::Connect(e.to_string());
    let (client, connection) = pg_config(url)?
        .connect(NoTls)
        .await
        .map_err(connect_error)?;
    let driver = tokio::spawn(connection);
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
    .map_err(connect_error);
    drop(client);
    driver.abort();
    rows?
        .iter()
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
    fn the_embedded_migrations_are_there() {
        assert!(MIGRATOR.iter().count() >= 1);
    }
}
