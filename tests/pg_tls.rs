//! TLS to Postgres, against real servers: this run's throwaway cluster
//! with `ssl = on` and a certificate for `localhost` only, from a CA the
//! test made, and a plaintext cluster. Each `sslmode` is checked for what
//! it accepts, what it refuses, and, on the server's side
//! (`pg_stat_ssl`), whether the session really is encrypted.

mod common;

use std::path::Path;

use common::pg::tls::{TestServer, plaintext_server, tls_server};
use common::scenario::mk_links;
use common::{mk_cluster_config, wait_for};
use slim_cp::server::{self, Options};
use slim_cp::store::{PgStore, Store as _};
use tokio_postgres::NoTls;

/// `sslmode` and, if any, `sslrootcert` as URL parameters.
fn params(mode: &str, root: Option<&Path>) -> String {
    match root {
        Some(root) => format!("sslmode={mode}&sslrootcert={}", root.display()),
        None => format!("sslmode={mode}"),
    }
}

/// A migrated database on `server`, migrated through `host` with `query`:
/// slim-cp's migrator takes the same path as its store.
async fn mk_database(server: &TestServer, host: &str, query: &str) -> String {
    let db = server.fresh_database().await;
    PgStore::migrate(&server.url(host, &db, query))
        .await
        .unwrap_or_else(|e| panic!("migrating over {query}: {e}"));
    db
}

/// Whether a dedicated connection of `store`'s is encrypted, as the
/// server sees it.
async fn dedicated_session_is_tls(store: &PgStore) -> bool {
    let (client, connection) = store
        .direct_connector()
        .connect()
        .await
        .expect("a dedicated connection opens");
    tokio::spawn(connection);
    client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .expect("pg_stat_ssl answers")
        .get(0)
}

/// A store on `db` through `host` with `query`, checked with a read.
async fn mk_store(server: &TestServer, host: &str, db: &str, query: &str) -> PgStore {
    let store = PgStore::connect(&server.url(host, db, query), 2)
        .await
        .unwrap_or_else(|e| panic!("connecting over {query}: {e}"));
    // Not a whole-table read: its connection would be closed, not pooled.
    store
        .get_node("a/n1")
        .await
        .expect("a read through the pool");
    store
}

/// Why connecting through `host` with `query` fails.
async fn refusal(server: &TestServer, host: &str, db: &str, query: &str) -> String {
    match PgStore::connect(&server.url(host, db, query), 2).await {
        Ok(_) => panic!("connecting through {host} over {query} should fail"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn verify_full_with_the_servers_ca_serves_the_store_over_tls() {
    let server = tls_server();
    let query = params("verify-full", Some(&server.ca()));
    let db = mk_database(&server, "localhost", &query).await;
    let store = mk_store(&server, "localhost", &db, &query).await;
    PgStore::check_schema(&server.url("localhost", &db, &query))
        .await
        .expect("the schema checks out over TLS");
    assert!(dedicated_session_is_tls(&store).await);
    let sessions = sessions_on(&server, &db).await;
    assert!(!sessions.is_empty(), "{sessions:?}");
    assert!(sessions.iter().all(|(_, tls)| *tls), "{sessions:?}");
}

#[tokio::test]
async fn verify_full_refuses_a_server_whose_ca_is_not_trusted() {
    let server = tls_server();
    let db = mk_database(&server, "127.0.0.1", "sslmode=disable").await;
    let query = params("verify-full", Some(&server.other_ca()));
    let why = refusal(&server, "localhost", &db, &query).await;
    assert!(why.contains("UnknownIssuer"), "{why}");
}

#[tokio::test]
async fn verify_full_refuses_a_name_not_in_the_certificate() {
    let server = tls_server();
    let db = mk_database(&server, "127.0.0.1", "sslmode=disable").await;
    // The certificate names `localhost` only, not its address.
    let query = params("verify-full", Some(&server.ca()));
    let why = refusal(&server, "127.0.0.1", &db, &query).await;
    assert!(why.contains("not valid for name \"127.0.0.1\""), "{why}");
}

#[tokio::test]
async fn verify_ca_checks_the_chain_but_not_the_name() {
    let server = tls_server();
    let query = params("verify-ca", Some(&server.ca()));
    let db = mk_database(&server, "127.0.0.1", &query).await;
    let store = mk_store(&server, "127.0.0.1", &db, &query).await;
    assert!(dedicated_session_is_tls(&store).await);
    let untrusted = params("verify-ca", Some(&server.other_ca()));
    let why = refusal(&server, "127.0.0.1", &db, &untrusted).await;
    assert!(why.contains("UnknownIssuer"), "{why}");
}

#[tokio::test]
async fn require_encrypts_without_a_root_and_checks_the_chain_with_one() {
    let server = tls_server();
    let query = params("require", None);
    let db = mk_database(&server, "127.0.0.1", &query).await;
    let store = mk_store(&server, "127.0.0.1", &db, &query).await;
    assert!(dedicated_session_is_tls(&store).await);
    // As in libpq: a root certificate makes `require` a `verify-ca`.
    let untrusted = params("require", Some(&server.other_ca()));
    let why = refusal(&server, "127.0.0.1", &db, &untrusted).await;
    assert!(why.contains("UnknownIssuer"), "{why}");
    let trusted = params("require", Some(&server.ca()));
    mk_store(&server, "127.0.0.1", &db, &trusted).await;
}

#[tokio::test]
async fn prefer_is_the_default_and_uses_tls_when_offered() {
    let server = tls_server();
    let db = mk_database(&server, "localhost", "").await;
    let store = mk_store(&server, "localhost", &db, "").await;
    assert!(dedicated_session_is_tls(&store).await);
    let plain = mk_store(&server, "localhost", &db, "sslmode=disable").await;
    assert!(!dedicated_session_is_tls(&plain).await);
}

#[tokio::test]
async fn a_plaintext_server_serves_disable_and_prefer_and_refuses_require() {
    let server = plaintext_server();
    let db = mk_database(&server, "127.0.0.1", "sslmode=prefer").await;
    for query in ["sslmode=disable", "sslmode=prefer", ""] {
        let store = mk_store(&server, "127.0.0.1", &db, query).await;
        assert!(!dedicated_session_is_tls(&store).await, "{query}");
    }
    let why = refusal(&server, "127.0.0.1", &db, "sslmode=require").await;
    assert!(why.to_lowercase().contains("tls"), "{why}");
}

#[tokio::test]
async fn an_unknown_sslmode_is_refused_at_startup() {
    let server = plaintext_server();
    for url in [
        server.url("127.0.0.1", "postgres", "sslmode=allow"),
        "host=127.0.0.1 sslmode=verify_full".to_string(),
    ] {
        let why = PgStore::connect(&url, 1).await.unwrap_err().to_string();
        assert!(why.contains("sslmode"), "{why}");
        assert!(
            why.contains("disable, prefer, require, verify-ca, verify-full"),
            "{why}"
        );
        let why = PgStore::migrate(&url).await.unwrap_err().to_string();
        assert!(why.contains("sslmode"), "{why}");
    }
}

/// Scenario: a clustered replica on `verify-full` joins, wins the
/// election and listens for wake-ups; every session it holds (the pool's,
/// and the dedicated ones of membership, election and LISTEN) is
/// encrypted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clustered_replica_runs_entirely_over_tls() {
    let server = tls_server();
    let query = params("verify-full", Some(&server.ca()));
    let db = mk_database(&server, "localhost", &query).await;
    let store = mk_store(&server, "localhost", &db, &query).await;
    let opts = Options {
        topology: mk_links(&[("*", &["*"])]),
        ..Options::loopback()
    };
    let replica = server::start_clustered(opts, store, mk_cluster_config("cp-tls"))
        .await
        .expect("the replica starts");
    let sessions = wait_for("the leader's sessions", || async {
        let sessions = sessions_on(&server, &db).await;
        let leading = replica.leadership.role().epoch().is_some();
        // At least one pooled and the three dedicated ones.
        if leading && sessions.len() >= 4 {
            Ok(sessions)
        } else {
            Err(format!("{sessions:?}"))
        }
    })
    .await;
    assert!(sessions.iter().all(|(_, tls)| *tls), "{sessions:?}");
    replica.shutdown().await;
}

/// slim-cp's sessions on `db`: the last query of each and whether it is
/// encrypted.
async fn sessions_on(server: &TestServer, db: &str) -> Vec<(String, bool)> {
    let admin = server.url("127.0.0.1", "postgres", "sslmode=disable");
    let (client, connection) = tokio_postgres::connect(&admin, NoTls)
        .await
        .expect("admin connects");
    tokio::spawn(connection);
    client
        .query(
            "SELECT a.query, s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a ON a.pid = s.pid \
             WHERE a.datname = $1 AND a.application_name = 'slim-cp'",
            &[&db],
        )
        .await
        .expect("pg_stat_activity answers")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

/// The migrator runs on the TLS connector rather than sqlx's driver: two
/// at once on a fresh database still take turns under sqlx's lock, and
/// the schema checks out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrators_over_tls_take_turns() {
    let server = tls_server();
    let db = server.fresh_database().await;
    let url = server.url("localhost", &db, &params("verify-full", Some(&server.ca())));
    let (first, second) = tokio::join!(PgStore::migrate(&url), PgStore::migrate(&url));
    first.expect("the first migrator");
    second.expect("the second migrator");
    PgStore::check_schema(&url)
        .await
        .expect("the schema checks out");
}
