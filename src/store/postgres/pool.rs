//! Connections. A partitioned or frozen database must never hang a replica:
//! every connection has TCP keepalives and `tcp_user_timeout` on our side,
//! the same keepalive settings on the server's side of the socket, a
//! server-side `statement_timeout`, and the pool waits a bounded time for a
//! free connection.
//!
//! The server-side settings travel in the startup `options`. A transaction
//! pooler (PgBouncer in transaction mode) refuses that parameter unless it
//! is listed in its `ignore_startup_parameters`; then set the timeouts on
//! the database role instead (`ALTER ROLE ... SET statement_timeout`).
//!
//! TLS follows the string's `sslmode` and `sslrootcert` (see `tls`), the
//! same for pooled and dedicated connections.

use std::fmt;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, QueueMode, RecyclingMethod, Runtime};
use tokio_postgres::{Client, Config, Connection, Socket};

use super::SetupError;
use super::tls::{MakeRustls, RustlsStream, TlsSettings, connector};
use super::url::take_params;

/// The keys slim-cp reads itself: tokio-postgres knows `sslmode` only in
/// part and `sslrootcert` not at all.
const TLS_KEYS: [&str; 2] = ["sslmode", "sslrootcert"];

/// Idle time before the first keepalive probe.
pub(super) const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
pub(super) const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
pub(super) const KEEPALIVE_RETRIES: u32 = 3;
/// Unacknowledged data for this long closes the socket (a partition).
pub(super) const TCP_USER_TIMEOUT: Duration = Duration::from_secs(15);
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The server cancels any statement running longer.
pub(super) const STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);
/// The server ends a session idle inside a transaction this long (a replica
/// that froze holding row locks).
pub(super) const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(30);
/// A caller waits at most this long for a free pooled connection.
pub(super) const POOL_WAIT: Duration = Duration::from_secs(5);

/// How to reach the database: the parsed settings and the TLS connector.
#[derive(Clone)]
pub struct PgConnector {
    config: Config,
    tls: MakeRustls,
}

impl fmt::Debug for PgConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Deliberately no connection details: they may hold a password.
        f.debug_struct("PgConnector").finish_non_exhaustive()
    }
}

impl PgConnector {
    /// Opens a connection; the caller drives the returned `Connection`.
    pub async fn connect(
        &self,
    ) -> Result<(Client, Connection<Socket, RustlsStream<Socket>>), tokio_postgres::Error> {
        self.config.connect(self.tls.clone()).await
    }

    pub fn config(&self) -> &Config {
        &self.config
    }
}

/// Parses `url` (URL or `key=value` form) and adds the settings above. A
/// `connect_timeout` or `application_name` in the URL wins; the server
/// options in the URL are appended after ours, so they win too.
pub(super) fn pg_config(url: &str) -> Result<PgConnector, SetupError> {
    let (url, tls_params) = take_params(url, &TLS_KEYS);
    let tls = TlsSettings::from_params(&tls_params)?;
    // The parser's errors name the offending option, never the URL itself.
    let mut config: Config = url
        .parse()
        .map_err(|e: tokio_postgres::Error| SetupError::InvalidUrl(e.to_string()))?;
    config.ssl_mode(tls.mode.negotiation());
    config
        .keepalives(true)
        .keepalives_idle(KEEPALIVE_IDLE)
        .keepalives_interval(KEEPALIVE_INTERVAL)
        .keepalives_retries(KEEPALIVE_RETRIES)
        .tcp_user_timeout(TCP_USER_TIMEOUT);
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_application_name().is_none() {
        config.application_name("slim-cp");
    }
    let options = server_options(config.get_options());
    config.options(options);
    Ok(PgConnector {
        config,
        tls: connector(&tls)?,
    })
}

/// The startup `options`: our server-side settings, then the URL's own.
fn server_options(from_url: Option<&str>) -> String {
    let settings = [
        ("statement_timeout", STATEMENT_TIMEOUT.as_millis()),
        (
            "idle_in_transaction_session_timeout",
            IDLE_IN_TRANSACTION_TIMEOUT.as_millis(),
        ),
        ("tcp_keepalives_idle", u128::from(KEEPALIVE_IDLE.as_secs())),
        (
            "tcp_keepalives_interval",
            u128::from(KEEPALIVE_INTERVAL.as_secs()),
        ),
        ("tcp_keepalives_count", u128::from(KEEPALIVE_RETRIES)),
        ("tcp_user_timeout", TCP_USER_TIMEOUT.as_millis()),
    ];
    let mut out: Vec<String> = settings
        .iter()
        .map(|(k, v)| format!("-c {k}={v}"))
        .collect();
    out.extend(from_url.map(str::to_string));
    out.join(" ")
}

/// A pool of at most `size` connections (at least one).
pub(super) fn build_pool(target: PgConnector, size: usize) -> Result<Pool, SetupError> {
    let manager = Manager::from_config(
        target.config,
        target.tls,
        ManagerConfig {
            // A broken connection shows as closed; a silent one is caught by
            // the keepalives and the helper's attempt timeout.
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size.max(1))
        // The most recently used connection first: a quiet spell keeps
        // reusing the few that already prepared its statements (each
        // connection prepares each statement once; a 1,000-node run
        // parsed 188 statements instead of 276).
        .queue_mode(QueueMode::Lifo)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(POOL_WAIT))
        .create_timeout(Some(CONNECT_TIMEOUT))
        .recycle_timeout(Some(CONNECT_TIMEOUT))
        .build()
        .map_err(|e| SetupError::Pool(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_connection_gets_the_timeouts() {
        let target = pg_config("postgres://u:secret@db.example:5433/cp").unwrap();
        let config = target.config();
        assert!(config.get_keepalives());
        assert_eq!(config.get_keepalives_idle(), KEEPALIVE_IDLE);
        assert_eq!(config.get_keepalives_interval(), Some(KEEPALIVE_INTERVAL));
        assert_eq!(config.get_keepalives_retries(), Some(KEEPALIVE_RETRIES));
        assert_eq!(config.get_tcp_user_timeout(), Some(&TCP_USER_TIMEOUT));
        assert_eq!(config.get_connect_timeout(), Some(&CONNECT_TIMEOUT));
        let options = config.get_options().unwrap_or_default();
        assert!(options.contains("-c statement_timeout=10000"), "{options}");
        assert!(options.contains("-c tcp_keepalives_idle=10"), "{options}");
    }

    #[test]
    fn the_urls_own_settings_win() {
        let url = "host=db user=u connect_timeout=2 options='-c statement_timeout=1'";
        let target = pg_config(url).unwrap();
        let config = target.config();
        assert_eq!(config.get_connect_timeout(), Some(&Duration::from_secs(2)));
        let options = config.get_options().unwrap_or_default();
        assert!(options.ends_with("-c statement_timeout=1"), "{options}");
    }

    #[test]
    fn the_tls_keys_are_read_here_and_hidden_from_tokio_postgres() {
        use tokio_postgres::config::SslMode;
        let mode = |url: &str| pg_config(url).map(|t| t.config().get_ssl_mode());
        assert_eq!(mode("postgres://db/cp").unwrap(), SslMode::Prefer);
        assert_eq!(mode("host=db sslmode=disable").unwrap(), SslMode::Disable);
        assert_eq!(
            mode("postgres://db/cp?sslmode=require").unwrap(),
            SslMode::Require
        );
        let err = mode("postgres://db/cp?sslmode=allow").unwrap_err();
        assert!(err.to_string().contains("sslmode"), "{err}");
    }

    #[test]
    fn parse_errors_do_not_echo_the_url() {
        let err = pg_config("postgres://u:hunter2@db:notaport/cp").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }
}
