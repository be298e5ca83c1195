//! Connections outside the pool, for the election, heartbeats and LISTEN:
//! each lives as long as what it holds (a lock, a listener), and dropping
//! it closes the socket, which releases whatever the session held.

use tokio::task::JoinHandle;
use tokio_postgres::Client;

use crate::store::postgres::PgConnector;

/// A dedicated connection: the client and the task driving its socket.
pub struct PgConn {
    pub client: Client,
    driver: JoinHandle<()>,
}

impl PgConn {
    /// Connects with `target` (keepalives, `tcp_user_timeout`, TLS and the
    /// server-side timeouts are already in it; see
    /// `PgStore::direct_connector`).
    pub async fn open(
        target: &PgConnector,
        purpose: &'static str,
    ) -> Result<PgConn, tokio_postgres::Error> {
        let (client, connection) = target.connect().await?;
        let driver = tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(purpose, error = %e, "dedicated database connection ended");
            }
        });
        Ok(PgConn { client, driver })
    }

    /// Whether the socket is gone.
    pub fn is_closed(&self) -> bool {
        self.client.is_closed() || self.driver.is_finished()
    }
}

impl Drop for PgConn {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// The SQLSTATE of a database error, for logs and decisions.
pub fn sqlstate(e: &tokio_postgres::Error) -> Option<&str> {
    e.code().map(|c| c.code())
}
