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
/// their ids packed into as few notifications as fit (see [`pack`]), in
/// one statement. A batch of facts then queues a few notifications, not
/// one per node: every notifying commit takes the queue's lock.
pub(super) async fn nodes_changed(db: &Db<'_>, nodes: &[&str]) -> Result<(), TxError> {
    if nodes.is_empty() {
        return Ok(());
    }
    let payloads = pack(nodes);
    execute(
        db,
        "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p",
        &[&FACTS_CHANNEL, &payloads],
    )
    .await?;
    Ok(())
}

/// Node ids joined by newlines (never part of an id: control characters
/// are refused at registration) into payloads under [`MAX_PAYLOAD`].
fn pack(nodes: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for id in nodes.iter().map(|n| payload(n)) {
        match out.last_mut() {
            Some(p) if p != RESYNC && id != RESYNC && p.len() + 1 + id.len() < MAX_PAYLOAD => {
                p.push(SEPARATOR);
                p.push_str(id);
            }
            _ => out.push(id.to_string()),
        }
    }
    out
}

/// Separates the node ids of one payload.
pub const SEPARATOR: char = '\n';

/// Wakes the leader for a full resync when the transaction commits.
pub(super) async fn resync(db: &Db<'_>) -> Result<(), TxError> {
    send(db, RESYNC).await
}

async fn send(db: &Db<'_>, payload: &str) -> Result<(), TxError> {
    execute(db, "SELECT pg_notify($1, $2)", &[&FACTS_CHANNEL, &payload]).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_packed_under_the_payload_limit() {
        let long = "n".repeat(3000);
        let ids = ["a/n1", "b/n2", long.as_str(), long.as_str(), long.as_str()];
        let packed = pack(&ids);
        assert!(packed.iter().all(|p| p.len() < MAX_PAYLOAD));
        let back: Vec<&str> = packed.iter().flat_map(|p| p.split(SEPARATOR)).collect();
        assert_eq!(back, ids);
        assert_eq!(packed.len(), 2);
    }

    #[test]
    fn a_resync_stays_alone() {
        let too_long = "x".repeat(MAX_PAYLOAD);
        let packed = pack(&["a", too_long.as_str(), "b"]);
        assert_eq!(packed, ["a", RESYNC, "b"]);
    }
}
