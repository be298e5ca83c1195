//! Servers for the database TLS tests, whatever server the other tests
//! use: this run's throwaway cluster with `ssl = on` (see
//! [`Flavour::Tls`]), and its plaintext one.

use std::path::PathBuf;

use tokio_postgres::NoTls;

use super::cluster::{Binaries, Flavour};
use super::{detail, throwaway};

/// A throwaway cluster of this run.
pub struct TestServer {
    port: u16,
    dir: PathBuf,
}

/// The cluster serving TLS, started if need be.
pub fn tls_server() -> TestServer {
    server(Flavour::Tls)
}

/// The plaintext cluster (`ssl = off`), started if need be.
pub fn plaintext_server() -> TestServer {
    server(Flavour::Plaintext)
}

fn server(flavour: Flavour) -> TestServer {
    let bins = Binaries::find()
        .unwrap_or_else(|| panic!("the database TLS tests need initdb and pg_ctl (PostgreSQL)"));
    let (port, dir) = throwaway::shared_cluster_of(&bins, flavour)
        .unwrap_or_else(|e| panic!("starting a {flavour:?} cluster: {e}"));
    TestServer { port, dir }
}

impl TestServer {
    /// The CA that signed the server's certificate (TLS cluster only).
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A CA that signed nothing the server shows.
    pub fn other_ca(&self) -> PathBuf {
        self.dir.join("other-ca.pem")
    }

    /// The URL of database `db` through `host`, with query `params`.
    pub fn url(&self, host: &str, db: &str, params: &str) -> String {
        format!("postgres://postgres@{host}:{}/{db}?{params}", self.port)
    }

    /// Creates a database (not migrated) and returns its name. The
    /// cluster goes with the run, so nothing drops it.
    pub async fn fresh_database(&self) -> String {
        let admin = self.url("127.0.0.1", "postgres", "sslmode=disable");
        let (client, connection) = tokio_postgres::connect(&admin, NoTls)
            .await
            .unwrap_or_else(|e| panic!("connecting to the test cluster: {}", detail(&e)));
        tokio::spawn(connection);
        let db = format!("slimcp_t_{}", uuid::Uuid::new_v4().simple());
        client
            .batch_execute(&format!("CREATE DATABASE {db}"))
            .await
            .unwrap_or_else(|e| panic!("creating {db}: {}", detail(&e)));
        db
    }
}
