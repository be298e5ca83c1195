//! Reading a replica's `/metrics`: where its store time went.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One store operation's transactions and their summed time.
#[derive(Debug, Default, Clone, Copy)]
pub struct OpTotals {
    pub calls: u64,
    pub seconds: f64,
}

/// The `/metrics` text of the HTTP listener on `port`.
pub async fn metrics(port: u16) -> Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await?;
    let ask = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    s.write_all(ask.as_bytes()).await?;
    let mut body = String::new();
    s.read_to_string(&mut body).await?;
    let (_, text) = body.split_once("\r\n\r\n").context("no HTTP body")?;
    Ok(text.to_string())
}

/// Per store operation, its transactions (every outcome) and their time,
/// added into `into`.
pub fn store_ops(text: &str, into: &mut BTreeMap<String, OpTotals>) {
    for line in text.lines() {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(v) = value.parse::<f64>() else {
            continue;
        };
        let Some(op) = label(name, "op") else {
            continue;
        };
        let t = into.entry(op.to_string()).or_default();
        if name.starts_with("slim_cp_store_transactions_total{") {
            // Counters are whole numbers; the cast only drops a ".0".
            t.calls += v as u64;
        } else if name.starts_with("slim_cp_store_transaction_seconds_total{") {
            t.seconds += v;
        }
    }
}

fn label<'a>(name: &'a str, key: &str) -> Option<&'a str> {
    let start = name.find(&format!("{key}=\""))? + key.len() + 2;
    let len = name[start..].find('"')?;
    Some(&name[start..start + len])
}
