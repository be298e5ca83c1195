//! The leader's change sets, applied in one transaction. The order of the
//! statements is chosen for the database, the result is the memory store's:
//!
//! 1. with links to retire, lock the rows of their sources and of the
//!    nodes whose claims are consumed, in id order (the order every
//!    multi-node writer uses, so two never deadlock); a source's
//!    registration waits for the lock, so its reply is read after a
//!    retirement commits or the retirement sees the source back;
//! 2. delete links (retired ones whose source is still away), then write
//!    tombstones, then live links: the unique one-live-link-per-pair index
//!    never sees two live links at once;
//! 3. delete routes, then write routes;
//! 4. consume the claims on the locked rows. With nothing to retire (the
//!    common case) the claimants' rows are locked only now, in one
//!    statement, so that the claims those nodes report meanwhile wait
//!    for the commit alone, not for the whole write (they waited 30-50 ms
//!    behind the routes a claim opens).
//!
//! An id both put and deleted ends deleted (the memory store puts, then
//! deletes); an id put twice ends as its last put.

use std::collections::{BTreeMap, BTreeSet};

use tokio_postgres::types::Json;

use super::rows::{ConnectionRow, connections_from, connections_json, to_u64};
use super::tx::{Db, TxError, execute, query};
use super::{links, routes};
use crate::store::model::{Link, Route};
use crate::store::{ChangeSet, Retire};

pub(super) async fn apply(db: &Db<'_>, changes: &ChangeSet) -> Result<(), TxError> {
    let claims = claims_by_node(&changes.consume_claims);
    let retiring = !changes.retire_links.is_empty();
    let mut early = Vec::new();
    if retiring {
        let mut to_lock: BTreeSet<&str> = claims.keys().copied().collect();
        to_lock.extend(changes.retire_links.iter().map(|r| r.source.as_str()));
        early = lock_nodes(db, to_lock.into_iter().collect()).await?;
    }
    let mut deletes = changes.delete_links.clone();
    deletes.extend(retired(&changes.retire_links, &early));
    links::delete(db, &deletes).await?;
    let put_links = last_puts(&changes.put_links, &deletes, |l: &Link| &l.link_id);
    links::put(db, &put_links, &changes.fresh.links).await?;
    routes::delete(db, &changes.delete_routes).await?;
    let put_routes = last_puts(&changes.put_routes, &changes.delete_routes, |r: &Route| {
        &r.id
    });
    routes::put(db, &put_routes, &changes.fresh.routes).await?;
    let held = match retiring {
        true => early,
        false => lock_nodes(db, claims.keys().copied().collect()).await?,
    };
    let consumed: Vec<Consumed> = held
        .into_iter()
        .filter_map(|node| {
            let ids = claims.get(node.id.as_str())?;
            consume(node, ids)
        })
        .collect();
    write_consumed(db, &consumed).await
}

/// The retired links whose source is still away, judged on the locked rows.
fn retired(retire: &[Retire], held: &[HeldNode]) -> Vec<String> {
    let rows: BTreeMap<&str, &HeldNode> = held.iter().map(|n| (n.id.as_str(), n)).collect();
    retire
        .iter()
        .filter(|r| {
            rows.get(r.source.as_str())
                .is_none_or(|n| !n.connected && n.generation <= r.source_generation)
        })
        .map(|r| r.link_id.clone())
        .collect()
}

/// The consumed link ids per node, nodes in id order.
fn claims_by_node(claims: &[(String, String)]) -> BTreeMap<&str, BTreeSet<&str>> {
    let mut out: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (node, link) in claims {
        out.entry(node).or_default().insert(link);
    }
    out
}

/// Each id's last put, in the order of those last puts, leaving out
/// deleted ids.
fn last_puts<'c, T>(puts: &'c [T], deletes: &[String], id: fn(&T) -> &String) -> Vec<&'c T> {
    let deleted: BTreeSet<&String> = deletes.iter().collect();
    let mut last: BTreeMap<&String, usize> = BTreeMap::new();
    for (i, p) in puts.iter().enumerate() {
        last.insert(id(p), i);
    }
    puts.iter()
        .enumerate()
        .filter(|(i, p)| last.get(id(p)) == Some(i) && !deleted.contains(id(p)))
        .map(|(_, p)| p)
        .collect()
}

/// A locked node's claim facts and session.
struct HeldNode {
    id: String,
    received: Vec<String>,
    reported: Vec<ConnectionRow>,
    connected: bool,
    generation: u64,
}

/// Locks the existing rows among `ids` in id order (`ORDER BY` sorts before
/// the rows are locked). Missing nodes are skipped: no error.
async fn lock_nodes(db: &Db<'_>, ids: Vec<&str>) -> Result<Vec<HeldNode>, TxError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let rows = query(
        db,
        "SELECT id, received_links, reported_connections, \
           session_id IS NOT NULL AS connected, generation FROM nodes \
         WHERE id = ANY($1) ORDER BY id FOR UPDATE",
        &[&ids],
    )
    .await?;
    rows.iter()
        .map(|row| {
            let Json(received) = row.try_get("received_links")?;
            let Json(reported) = row.try_get("reported_connections")?;
            Ok(HeldNode {
                id: row.try_get("id")?,
                received,
                reported,
                connected: row.try_get("connected")?,
                generation: to_u64(row.try_get("generation")?)?,
            })
        })
        .collect()
}

/// A node's claim facts once consumed claims are dropped.
struct Consumed {
    id: String,
    received: Json<Vec<String>>,
    reported: Json<Vec<ConnectionRow>>,
}

/// Drops the link ids from the node's received links and its reported
/// incoming connections; `None` if neither held any of them.
fn consume(node: HeldNode, ids: &BTreeSet<&str>) -> Option<Consumed> {
    let mut reported = connections_from(node.reported);
    let before = (node.received.len(), reported.len());
    let received: Vec<String> = node
        .received
        .into_iter()
        .filter(|l| !ids.contains(l.as_str()))
        .collect();
    reported.retain(|c| !(c.incoming && ids.contains(c.link_id.as_str())));
    if before == (received.len(), reported.len()) {
        return None;
    }
    Some(Consumed {
        id: node.id,
        received: Json(received),
        reported: connections_json(&reported),
    })
}

/// One statement for every node whose claims were consumed. `updated_at`
/// stays: consuming a claim is not the node's doing, and departure grace
/// is measured from it.
async fn write_consumed(db: &Db<'_>, consumed: &[Consumed]) -> Result<(), TxError> {
    if consumed.is_empty() {
        return Ok(());
    }
    let ids: Vec<&str> = consumed.iter().map(|c| c.id.as_str()).collect();
    let received: Vec<&Json<Vec<String>>> = consumed.iter().map(|c| &c.received).collect();
    let reported: Vec<&Json<Vec<ConnectionRow>>> = consumed.iter().map(|c| &c.reported).collect();
    execute(
        db,
        "UPDATE nodes n SET received_links = u.received, reported_connections = u.reported \
         FROM unnest($1::text[], $2::jsonb[], $3::jsonb[]) AS u(id, received, reported) \
         WHERE n.id = ANY($1) AND n.id = u.id",
        &[&ids, &received, &reported],
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_put_wins_and_deletes_beat_puts() {
        let puts: Vec<(String, u8)> = [("a", 1), ("b", 1), ("a", 2), ("c", 1)]
            .map(|(id, v)| (id.to_string(), v))
            .to_vec();
        let kept = last_puts(&puts, &["c".to_string()], |p| &p.0);
        assert_eq!(kept, [&puts[1], &puts[2]]);
    }

    #[test]
    fn claims_group_by_node_in_id_order() {
        let claims = [("b", "l-1"), ("a", "l-2"), ("b", "l-1"), ("b", "l-3")]
            .map(|(n, l)| (n.to_string(), l.to_string()));
        let by_node = claims_by_node(&claims);
        let nodes: Vec<_> = by_node.keys().copied().collect();
        assert_eq!(nodes, ["a", "b"]);
        assert_eq!(by_node["b"].len(), 2);
    }
}
