//! A fresh database reached through a path a drill can cut (see
//! [`super::proxy::Proxy::cut`]): every connection reset, new ones refused.

use std::net::SocketAddr;

use super::pg::{admin_url, fresh_pg_database, with_database};
use super::proxy::Proxy;

/// The test server's address, from its URL (`...@host:port/...`).
pub fn pg_addr() -> SocketAddr {
    let url = admin_url();
    let after_at = url.rsplit_once('@').map_or(url.as_str(), |(_, r)| r);
    let host_port = after_at.split('/').next().unwrap_or("127.0.0.1:5432");
    host_port
        .parse()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 5432)))
}

/// A fresh, migrated database, and the URL that reaches it through `path`.
pub async fn cuttable_database() -> (Proxy, String) {
    let db = fresh_pg_database().await;
    let path = Proxy::start(pg_addr()).await;
    let url =
        with_database(&admin_url(), &db).replace(&pg_addr().to_string(), &path.addr.to_string());
    (path, url)
}
