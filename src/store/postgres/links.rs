//! Links: the leader's desired connections, one live link per unordered
//! group pair (a unique partial index). Tombstones (`deleted`) are written
//! before live links, so replacing a pair's link inside one transaction
//! never trips the index.

use std::collections::BTreeSet;

use super::rows::{claim_sql, link_columns, link_from, link_status_from, link_status_sql};
use super::tx::{Db, TxError, WRITE_CHUNK, execute, insert_else, query, query_map};
use crate::store::model::{Link, LinkAnswer, LinkState};
use crate::store::sent_status;

/// The insert of the rows `$1..$13` hold, in their order, without a
/// conflict clause.
macro_rules! insert_sql {
    () => {
        "INSERT INTO links (link_id, source_node, source_group, dest_group, \
           dest_node, dest_endpoint, config_data, status, status_msg, deleted, updated_at, \
           claim_source_generation, claim_dest_generation) \
         SELECT l.id, l.sn, l.sg, l.dg, l.dn, l.ep, l.cfg, l.st, l.msg, l.del, to_timestamp(l.ts), \
           l.cs, l.cd \
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], \
           $7::text[], $8::text[], $9::text[], $10::bool[], $11::int8[], $12::int8[], $13::int8[]) \
           WITH ORDINALITY AS l(id, sn, sg, dg, dn, ep, cfg, st, msg, del, ts, cs, cd, ord) \
         ORDER BY l.ord"
    };
}

const INSERT: &str = insert_sql!();

const UPSERT: &str = concat!(
    insert_sql!(),
    " ON CONFLICT (link_id) DO UPDATE SET source_node = EXCLUDED.source_node, \
       source_group = EXCLUDED.source_group, dest_group = EXCLUDED.dest_group, \
       dest_node = EXCLUDED.dest_node, dest_endpoint = EXCLUDED.dest_endpoint, \
       config_data = EXCLUDED.config_data, status = EXCLUDED.status, \
       status_msg = EXCLUDED.status_msg, deleted = EXCLUDED.deleted, \
       updated_at = EXCLUDED.updated_at, \
       claim_source_generation = EXCLUDED.claim_source_generation, \
       claim_dest_generation = EXCLUDED.claim_dest_generation"
);

/// Writes `links` (distinct ids), tombstones first: those in `fresh` are
/// inserted (see [`Fresh`](crate::store::Fresh)), the others inserted or
/// replaced. A link keeps the `updated_at` it is given: the caller
/// stamped it.
pub(super) async fn put(
    db: &Db<'_>,
    links: &[&Link],
    fresh: &BTreeSet<String>,
) -> Result<(), TxError> {
    let (dead, live): (Vec<&Link>, Vec<&Link>) = links.iter().partition(|l| l.deleted);
    for batch in [dead, live] {
        let (new, old): (Vec<&Link>, Vec<&Link>) =
            batch.iter().partition(|l| fresh.contains(&l.link_id));
        if !new.is_empty() {
            insert_else(db, write(db, INSERT, &new), || write(db, UPSERT, &new)).await?;
        }
        if !old.is_empty() {
            write(db, UPSERT, &old).await?;
        }
    }
    Ok(())
}

async fn write(db: &Db<'_>, sql: &'static str, links: &[&Link]) -> Result<(), TxError> {
    for chunk in links.chunks(WRITE_CHUNK) {
        write_chunk(db, sql, chunk).await?;
    }
    Ok(())
}

async fn write_chunk(db: &Db<'_>, sql: &'static str, links: &[&Link]) -> Result<(), TxError> {
    let col = |f: fn(&Link) -> &str| links.iter().map(|l| f(l)).collect::<Vec<&str>>();
    let dest_node: Vec<Option<&str>> = links.iter().map(|l| l.dest_node.as_deref()).collect();
    let status: Vec<&str> = links.iter().map(|l| link_status_sql(l.status)).collect();
    let deleted: Vec<bool> = links.iter().map(|l| l.deleted).collect();
    let ts: Vec<i64> = links.iter().map(|l| l.updated_at).collect();
    let claims = links
        .iter()
        .map(|l| claim_sql(l.claim))
        .collect::<Result<Vec<_>, _>>()?;
    let (claim_source, claim_dest): (Vec<Option<i64>>, Vec<Option<i64>>) =
        claims.into_iter().unzip();
    execute(
        db,
        sql,
        &[
            &col(|l| &l.link_id),
            &col(|l| &l.source_node),
            &col(|l| &l.source_group),
            &col(|l| &l.dest_group),
            &dest_node,
            &col(|l| &l.dest_endpoint),
            &col(|l| &l.config_data),
            &status,
            &col(|l| &l.status_msg),
            &deleted,
            &ts,
            &claim_source,
            &claim_dest,
        ],
    )
    .await?;
    Ok(())
}

/// Deletes the links for good; returns how many existed.
pub(super) async fn delete(db: &Db<'_>, ids: &[String]) -> Result<u64, TxError> {
    if ids.is_empty() {
        return Ok(0);
    }
    execute(db, "DELETE FROM links WHERE link_id = ANY($1)", &[&ids]).await
}

pub(super) async fn list(db: &Db<'_>) -> Result<Vec<Link>, TxError> {
    const SQL: &str = concat!("SELECT ", link_columns!(), " FROM links ORDER BY link_id");
    query_map(db, SQL, &[], link_from).await
}

pub(super) async fn get_many(db: &Db<'_>, ids: &[String]) -> Result<Vec<Link>, TxError> {
    const SQL: &str = concat!(
        "SELECT ",
        link_columns!(),
        " FROM links WHERE link_id = ANY($1) ORDER BY link_id"
    );
    query_map(db, SQL, &[&ids], link_from).await
}

pub(super) async fn states(db: &Db<'_>, ids: &[String]) -> Result<Vec<LinkState>, TxError> {
    const SQL: &str = "SELECT link_id, status, status_msg, \
         floor(extract(epoch FROM updated_at))::bigint AS updated_ts \
         FROM links WHERE link_id = ANY($1) ORDER BY link_id";
    query_map(db, SQL, &[&ids], |row| {
        Ok(LinkState {
            link_id: row.try_get("link_id")?,
            status: link_status_from(row.try_get("status")?)?,
            status_msg: row.try_get("status_msg")?,
            updated_at: row.try_get("updated_ts")?,
        })
    })
    .await
}

pub(super) async fn touching(db: &Db<'_>, node: &str) -> Result<Vec<Link>, TxError> {
    const SQL: &str = concat!(
        "SELECT ",
        link_columns!(),
        " FROM links WHERE source_node = $1 OR dest_node = $1 ORDER BY link_id"
    );
    query_map(db, SQL, &[&node], link_from).await
}

/// The live links `nodes` are the sources of, ordered by id.
pub(super) async fn live_sourced(db: &Db<'_>, nodes: &[&str]) -> Result<Vec<Link>, TxError> {
    const SQL: &str = concat!(
        "SELECT ",
        link_columns!(),
        " FROM links WHERE source_node = ANY($1) AND NOT deleted ORDER BY link_id"
    );
    query_map(db, SQL, &[&nodes], link_from).await
}

/// Each source's answers: compare-and-set on (live, still sourced at that
/// source), then the shared status rule, judged on the links as they are
/// (one read that locks them all, in id order, then one write of those
/// that change). The last answer for a link wins, as when recorded one
/// by one. Returns how many answered links exist.
pub(super) async fn mark_sent(
    db: &Db<'_>,
    answered: &[(&str, &[LinkAnswer])],
) -> Result<usize, TxError> {
    let ids: BTreeSet<&str> = (answered.iter())
        .flat_map(|(_, answers)| answers.iter().map(|a| a.link_id.as_str()))
        .collect();
    if ids.is_empty() {
        return Ok(0);
    }
    let ids: Vec<&str> = ids.into_iter().collect();
    let rows = query(
        db,
        "SELECT link_id, source_node, status, status_msg FROM links \
         WHERE link_id = ANY($1) AND NOT deleted ORDER BY link_id FOR UPDATE",
        &[&ids],
    )
    .await?;
    let (mut found, mut changed, mut next_status, mut messages) =
        (0, Vec::new(), Vec::new(), Vec::new());
    for row in &rows {
        let id: &str = row.try_get("link_id")?;
        let source: &str = row.try_get("source_node")?;
        let last = (answered.iter().rev())
            .filter(|(s, _)| *s == source)
            .find_map(|(_, answers)| answers.iter().rev().find(|a| a.link_id == id));
        let Some(a) = last else { continue };
        found += 1;
        let status = link_status_from(row.try_get("status")?)?;
        let old_message: &str = row.try_get("status_msg")?;
        let next = sent_status(status, a.ok);
        if next != status || old_message != a.message {
            changed.push(id);
            next_status.push(link_status_sql(next));
            messages.push(a.message.as_str());
        }
    }
    if !changed.is_empty() {
        execute(
            db,
            "UPDATE links l SET status = u.status, status_msg = u.msg, updated_at = now() \
             FROM unnest($1::text[], $2::text[], $3::text[]) AS u(id, status, msg) \
             WHERE l.link_id = u.id",
            &[&changed, &next_status, &messages],
        )
        .await?;
    }
    Ok(found)
}
