//! Which PostgreSQL server the tests use, decided once per test process:
//!
//! - `SLIM_CP_TEST_PG=<url>`: that server (a test fails loudly if it does
//!   not answer);
//! - `SLIM_CP_TEST_PG=throwaway`: a throwaway cluster (see [`throwaway`]);
//! - unset: the local server CI provisions,
//!   `postgres://postgres@127.0.0.1:5432/postgres`, if it lets us in;
//!   else a throwaway cluster.
//!
//! Without a server and without `initdb`/`pg_ctl`, every Postgres test
//! fails with one line saying what to install. testcontainers is not
//! used: `initdb` needs only the PostgreSQL package, not a Docker daemon.

use std::sync::OnceLock;
use std::time::Duration;

use tokio_postgres::NoTls;

use super::cluster::Binaries;
use super::throwaway;

const DEFAULT_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
/// What `SLIM_CP_TEST_PG` says to force a throwaway cluster.
const THROWAWAY: &str = "throwaway";
/// How long the default server may take to let us in before the tests
/// start their own.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// The admin URL of the test server; panics, in every test that asks,
/// with one line when there is none.
pub fn admin_url() -> String {
    static RESOLVED: OnceLock<Result<String, String>> = OnceLock::new();
    match RESOLVED.get_or_init(resolve) {
        Ok(url) => url.clone(),
        Err(why) => panic!("{why}"),
    }
}

fn resolve() -> Result<String, String> {
    match std::env::var("SLIM_CP_TEST_PG") {
        Ok(v) if v == THROWAWAY => use_throwaway(&format!("SLIM_CP_TEST_PG={THROWAWAY}")),
        Ok(url) if !url.is_empty() => Ok(url),
        _ => match probe(DEFAULT_ADMIN_URL) {
            Ok(()) => Ok(DEFAULT_ADMIN_URL.to_string()),
            Err(why) => use_throwaway(&format!("no server at 127.0.0.1:5432 ({why})")),
        },
    }
}

/// This run's throwaway cluster; `why` says why the tests need one.
fn use_throwaway(why: &str) -> Result<String, String> {
    let Some(bins) = Binaries::find() else {
        return Err(format!(
            "the Postgres tests need PostgreSQL: {why}, and no initdb/pg_ctl on PATH or under \
             /usr/lib/postgresql/*/bin to start one; install it (apt-get install postgresql) \
             or set SLIM_CP_TEST_PG=postgres://USER@HOST:PORT/DB"
        )
        .replace('\n', " "));
    };
    let url = throwaway::shared_cluster(&bins)
        .map_err(|e| format!("the Postgres tests ({why}) could not start a cluster: {e}"))?;
    // Shown with a failing test's output: which server it was.
    eprintln!("{why}: the Postgres tests use a throwaway cluster at {url}");
    Ok(url)
}

/// Connects to `url` once, in a runtime of its own: this runs inside
/// tests' runtimes, which cannot block on a future.
fn probe(url: &str) -> Result<(), String> {
    let mut config: tokio_postgres::Config = url.parse().map_err(|e| format!("{e}"))?;
    config.connect_timeout(PROBE_TIMEOUT);
    let attempt = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("a runtime for the probe: {e}"))?;
        rt.block_on(async {
            let connected = tokio::time::timeout(PROBE_TIMEOUT, config.connect(NoTls)).await;
            match connected {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(super::detail(&e)),
                Err(_) => Err(format!("no answer in {PROBE_TIMEOUT:?}")),
            }
        })
    });
    attempt
        .join()
        .unwrap_or_else(|_| Err("the probe panicked".into()))
}
