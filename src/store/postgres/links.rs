//! Links: the leader's desired connections, one live link per unordered
//! group pair (a unique partial index). Tombstones (`deleted`) are written
//! before live links, so replacing a pair's link inside one transaction
//! never trips the index.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

use super::rows::{
    LINK_STATUSES, claim_sql, link_columns, link_from, link_status_from, link_status_sql,
};
use super::tx::{Db, TxError, execute, execute_by_ids, in_chunks, insert_else, query_map};
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
    in_chunks(links, |chunk| write_chunk(db, sql, chunk)).await?;
    Ok(())
}

async fn write_chunk(db: &Db<'_>, sql: &'static str, links: &[&Link]) -> Result<u64, TxError> {
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
    .await
}

/// Deletes the links for good; returns how many existed.
pub(super) async fn delete(db: &Db<'_>, ids: &[String]) -> Result<u64, TxError> {
    if ids.is_empty() {
        return Ok(0);
    }
    execute_by_ids(db, "DELETE FROM links WHERE link_id = ANY($1)", ids).await
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

/// The answers' update: the shared status rule ([`sent_status`]) rendered
/// into a `CASE` over every status ([`LINK_STATUSES`]), so that the rule stays in Rust and a
/// record takes one statement instead of a locking read and a write.
/// `updated_at` moves only when status or message change (the right-hand
/// sides read the old row).
static MARK_SENT: LazyLock<String> = LazyLock::new(|| {
    let rule = |ok: bool| -> String {
        let arms: String = (LINK_STATUSES.iter())
            .map(|s| {
                let (from, to) = (link_status_sql(*s), link_status_sql(sent_status(*s, ok)));
                format!(" WHEN '{from}' THEN '{to}'")
            })
            .collect();
        format!("CASE l.status{arms} END")
    };
    let next = format!(
        "CASE WHEN u.ok THEN {} ELSE {} END",
        rule(true),
        rule(false)
    );
    format!(
        "UPDATE links l SET status = {next}, status_msg = u.msg, \
           updated_at = CASE WHEN {next} <> l.status OR u.msg <> l.status_msg \
             THEN now() ELSE l.updated_at END \
         FROM unnest($1::text[], $2::text[], $3::bool[], $4::text[]) AS u(id, source, ok, msg) \
         WHERE l.link_id = ANY($1) AND l.link_id = u.id AND l.source_node = u.source \
           AND NOT l.deleted"
    )
});

/// Each source's answers, judged by the status rule on the links as they
/// are (compare-and-set on live and still sourced at that source), in one
/// statement. The last answer of a source for a link wins, as when
/// recorded one by one. Returns how many answered links exist.
pub(super) async fn mark_sent(
    db: &Db<'_>,
    answered: &[(&str, &[LinkAnswer])],
) -> Result<usize, TxError> {
    let mut last: BTreeMap<(&str, &str), &LinkAnswer> = BTreeMap::new();
    for (source, answers) in answered {
        for a in *answers {
            last.insert((a.link_id.as_str(), source), a);
        }
    }
    if last.is_empty() {
        return Ok(0);
    }
    let ids: Vec<&str> = last.keys().map(|(id, _)| *id).collect();
    let sources: Vec<&str> = last.keys().map(|(_, source)| *source).collect();
    let ok: Vec<bool> = last.values().map(|a| a.ok).collect();
    let messages: Vec<&str> = last.values().map(|a| a.message.as_str()).collect();
    let n = execute(db, &MARK_SENT, &[&ids, &sources, &ok, &messages]).await?;
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}
