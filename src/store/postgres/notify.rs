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
    let payload = if node.len() < MAX_PAYLOAD && node != RESYNC {
        node
    } else {
        RESYNC
    };
    send(db, payload).await
}

/// Wakes the leader for a full resync when the transaction commits.
pub(super) async fn resync(db: &Db<'_>) -> Result<(), TxError> {
    send(db, RESYNC).await
}

async fn send(db: &Db<'_>, payload: &str) -> Result<(), TxError> {
    execute(db, "SELECT pg_notify($1, $2)", &[&FACTS_CHANNEL, &payload]).await?;
    Ok(())
}
