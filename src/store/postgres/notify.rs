//! Wake-ups for the leader: fact transactions `NOTIFY` the node whose facts
//! changed. Postgres delivers a notification only if its transaction
//! commits, and folds identical ones of one transaction into one.
//!
//! A wake-up is a hint, not a queue (see `cluster::signals`): the leader
//! also resyncs fully when its listener reconnects, on winning and at a
//! periodic floor, so a lost notification costs latency only.

use super::tx::{Db, TxError, execute};

/// The channel the leader listens on.
pub const FACTS_CHANNEL: &str = "slim_cp_facts";

/// The payload asking the leader for a full resync: many nodes changed, or
/// the topology did.
pub const RESYNC: &str = "*";

/// Postgres refuses payloads of 8000 bytes or more; a longer node id asks
/// for a full resync instead (it would never be lost, only slower).
const MAX_PAYLOAD: usize = 7900;

/// Wakes the leader for `node` when the transaction commits.
pub(super) async fn node_changed(db: &Db<'_>, node: &str) -> Result<(), TxError> {
    send(db, payload(node)).await
}

fn payload(node: &str) -> &str {
    if node.len() < MAX_PAYLOAD && node != RESYNC {
        node
    } else {
        RESYNC
    }
}

/// Wakes the leader for each of `nodes` when the transaction commits:
/// one statement for all.
pub(super) async fn nodes_changed(db: &Db<'_>, nodes: &[&str]) -> Result<(), TxError> {
    if nodes.is_empty() {
        return Ok(());
    }
    let payloads: Vec<&str> = nodes.iter().map(|n| payload(n)).collect();
    execute(
        db,
        "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p",
        &[&FACTS_CHANNEL, &payloads],
    )
    .await?;
    Ok(())
}

/// Wakes the leader for a full resync when the transaction commits.
pub(super) async fn resync(db: &Db<'_>) -> Result<(), TxError> {
    send(db, RESYNC).await
}

async fn send(db: &Db<'_>, payload: &str) -> Result<(), TxError> {
    execute(db, "SELECT pg_notify($1, $2)", &[&FACTS_CHANNEL, &payload]).await?;
    Ok(())
}
