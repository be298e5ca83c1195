//! Until replicas elect a leader, one replica at a time may act on a
//! database: a second one would derive and reconcile alongside the first.
//! The guard is a session-level advisory lock (a two-int key, so it never
//! meets the migrator's one-int lock) on a dedicated, never-pooled
//! connection with keepalives: a dead holder's lock is released as soon as
//! the database notices its connection is gone.

use tokio::task::JoinHandle;
use tokio_postgres::NoTls;

use super::SetupError;
use super::pool::pg_config;

/// The lock's key: "slim-cp", replica slot 1.
const KEY: (i32, i32) = (0x736c_696d, 1);

/// Holds the lock while alive; dropping it closes the connection, which
/// releases the lock.
pub struct ReplicaGuard {
    _client: tokio_postgres::Client,
    connection: JoinHandle<()>,
}

impl Drop for ReplicaGuard {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

/// Takes the single-replica lock, or says who to ask about the one holding it.
pub async fn single_replica(url: &str) -> Result<ReplicaGuard, SetupError> {
    let (client, connection) = pg_config(url)?
        .connect(NoTls)
        .await
        .map_err(|e| SetupError::Connect(e.to_string()))?;
    let connection = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::error!(error = %e, "the single-replica lock's connection failed");
        }
    });
    let row = client
        .query_one("SELECT pg_try_advisory_lock($1, $2)", &[&KEY.0, &KEY.1])
        .await
        .map_err(|e| SetupError::Connect(e.to_string()))?;
    let held: bool = row
        .try_get(0)
        .map_err(|e| SetupError::Connect(e.to_string()))?;
    if !held {
        return Err(SetupError::Busy);
    }
    Ok(ReplicaGuard {
        _client: client,
        connection,
    })
}
