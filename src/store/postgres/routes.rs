//! Routes: desired subscriptions on a source node over one of its links.

use super::rows::{name_id_sql, route_columns, route_from, route_status_sql};
use super::tx::{Db, TxError, execute, execute_by_ids, in_chunks, insert_else, query_map};
use std::collections::{BTreeMap, BTreeSet};

use crate::store::model::{Route, RouteMark};

/// The insert of the rows `$1..$11` hold, without a conflict clause.
macro_rules! insert_sql {
    () => {
        "INSERT INTO routes (id, source_node, dest_node, link_id, component0, \
           component1, component2, name_id, status, status_msg, updated_at) \
         SELECT r.id, r.sn, r.dn, r.link, r.c0, r.c1, r.c2, r.nid, r.st, r.msg, to_timestamp(r.ts) \
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], \
           $7::text[], $8::text[], $9::text[], $10::text[], $11::int8[]) \
           AS r(id, sn, dn, link, c0, c1, c2, nid, st, msg, ts)"
    };
}

const INSERT: &str = insert_sql!();

const UPSERT: &str = concat!(
    insert_sql!(),
    " ON CONFLICT (id) DO UPDATE SET source_node = EXCLUDED.source_node, \
       dest_node = EXCLUDED.dest_node, link_id = EXCLUDED.link_id, \
       component0 = EXCLUDED.component0, component1 = EXCLUDED.component1, \
       component2 = EXCLUDED.component2, name_id = EXCLUDED.name_id, \
       status = EXCLUDED.status, status_msg = EXCLUDED.status_msg, \
       updated_at = EXCLUDED.updated_at"
);

/// Writes `routes` (distinct ids): those in `fresh` are inserted (see
/// [`Fresh`](crate::store::Fresh)), the others inserted or replaced. A
/// route keeps the `updated_at` it is given: the caller stamped it.
pub(super) async fn put(
    db: &Db<'_>,
    routes: &[&Route],
    fresh: &BTreeSet<String>,
) -> Result<(), TxError> {
    let (new, old): (Vec<&Route>, Vec<&Route>) = routes.iter().partition(|r| fresh.contains(&r.id));
    if !new.is_empty() {
        insert_else(db, write(db, INSERT, &new), || write(db, UPSERT, &new)).await?;
    }
    write(db, UPSERT, &old).await
}

async fn write(db: &Db<'_>, sql: &'static str, routes: &[&Route]) -> Result<(), TxError> {
    in_chunks(routes, |chunk| write_chunk(db, sql, chunk)).await?;
    Ok(())
}

async fn write_chunk(db: &Db<'_>, sql: &'static str, routes: &[&Route]) -> Result<u64, TxError> {
    let col = |f: fn(&Route) -> &str| routes.iter().map(|r| f(r)).collect::<Vec<&str>>();
    let name_id: Vec<Option<String>> = routes.iter().map(|r| name_id_sql(r.name.id)).collect();
    let status: Vec<&str> = routes.iter().map(|r| route_status_sql(r.status)).collect();
    let ts: Vec<i64> = routes.iter().map(|r| r.updated_at).collect();
    execute(
        db,
        sql,
        &[
            &col(|r| &r.id),
            &col(|r| &r.source_node),
            &col(|r| &r.dest_node),
            &col(|r| &r.link_id),
            &col(|r| &r.name.components[0]),
            &col(|r| &r.name.components[1]),
            &col(|r| &r.name.components[2]),
            &name_id,
            &status,
            &col(|r| &r.status_msg),
            &ts,
        ],
    )
    .await
}

/// Deletes the routes for good; returns how many existed.
pub(super) async fn delete(db: &Db<'_>, ids: &[String]) -> Result<u64, TxError> {
    if ids.is_empty() {
        return Ok(0);
    }
    execute_by_ids(db, "DELETE FROM routes WHERE id = ANY($1)", ids).await
}

pub(super) async fn list(db: &Db<'_>) -> Result<Vec<Route>, TxError> {
    const SQL: &str = concat!("SELECT ", route_columns!(), " FROM routes ORDER BY id");
    query_map(db, SQL, &[], route_from).await
}

pub(super) async fn sourced(db: &Db<'_>, node: &str) -> Result<Vec<Route>, TxError> {
    const SQL: &str = concat!(
        "SELECT ",
        route_columns!(),
        " FROM routes WHERE source_node = $1 ORDER BY id"
    );
    query_map(db, SQL, &[&node], route_from).await
}

/// The routes of `nodes` that are not deleted and ride one of their
/// sources' live links.
pub(super) async fn desired(db: &Db<'_>, nodes: &[&str]) -> Result<Vec<Route>, TxError> {
    const SQL: &str = concat!(
        "SELECT ",
        route_columns!(),
        " FROM routes WHERE source_node = ANY($1) AND status <> 'deleted' \
           AND link_id IN (SELECT link_id FROM links WHERE source_node = ANY($1) AND NOT deleted) \
         ORDER BY id"
    );
    query_map(db, SQL, &[&nodes], route_from).await
}

/// Sets status and message if the route exists; the timestamp moves only
/// when one of them changes (the right-hand sides read the old row).
/// Marks every route at once; returns how many existed. A route marked
/// twice takes its last mark, as when marked one by one.
pub(super) async fn mark<'m>(
    db: &Db<'_>,
    marks: impl IntoIterator<Item = &'m RouteMark>,
) -> Result<usize, TxError> {
    let mut last: BTreeMap<&str, &RouteMark> = BTreeMap::new();
    for m in marks {
        last.insert(m.id.as_str(), m);
    }
    if last.is_empty() {
        return Ok(0);
    }
    let ids: Vec<&str> = last.keys().copied().collect();
    let status: Vec<&str> = last.values().map(|m| route_status_sql(m.status)).collect();
    let messages: Vec<&str> = last.values().map(|m| m.message.as_str()).collect();
    let n = execute(
        db,
        "UPDATE routes r SET updated_at = CASE WHEN r.status <> u.status OR r.status_msg <> u.msg \
           THEN now() ELSE r.updated_at END, status = u.status, status_msg = u.msg \
         FROM unnest($1::text[], $2::text[], $3::text[]) AS u(id, status, msg) \
         WHERE r.id = ANY($1) AND r.id = u.id",
        &[&ids, &status, &messages],
    )
    .await?;
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}
