//! Node records and sessions: the facts the owning replica records. Each
//! transition locks the node's row: with `SELECT ... FOR UPDATE` when the
//! new value is computed here, or with a conditional `UPDATE`/`DELETE`
//! whose `WHERE` is the compare-and-set (it takes the same row lock and is
//! re-checked against the latest committed row under READ COMMITTED).

use tokio_postgres::types::Json;
use uuid::Uuid;

use super::rows::{
    connections_json, departure_kind_sql, details_json, names_json, node_columns, node_from,
    session_from, session_state_sql, to_i64, to_u64,
};
use super::tx::{Db, TxError, execute, query, query_map, query_one, query_opt};
use crate::store::model::{
    DepartureKind, NodeRecord, Registration, ReplicaRef, Session, SessionState,
};
use crate::store::{SessionStart, StoreError};

/// Creates the row if needed and locks it, returning its current session
/// and latest generation.
const LOCK_OR_CREATE: &str = "INSERT INTO nodes (id) VALUES ($1) \
     ON CONFLICT (id) DO UPDATE SET id = EXCLUDED.id \
     RETURNING session_id, session_generation, session_owner, session_incarnation, session_state, \
       generation";

/// The generation comes from the store-wide sequence, drawn after the lock
/// so that one node's sessions get increasing generations in lock order.
const START_SESSION: &str = "WITH g AS (SELECT nextval('generation_seq') AS g) \
     UPDATE nodes SET group_name = $2, connection_details = $3, reported_connections = $4, \
       reported_routes = $5, received_links = '[]', session_id = $6, session_generation = g.g, \
       session_owner = $7, session_incarnation = $8, session_state = $9, generation = g.g, \
       departure_generation = NULL, departure_kind = NULL, revision = $10, updated_at = now() \
     FROM g WHERE id = $1 RETURNING g.g";

pub(super) async fn begin_session(
    db: &Db<'_>,
    reg: &Registration,
    owner: &ReplicaRef,
) -> Result<SessionStart, TxError> {
    let current = query_one(db, LOCK_OR_CREATE, &[&reg.node_id]).await?;
    let latest = to_u64(current.try_get("generation")?)?;
    if reg.stale_after.is_some_and(|g| latest > g) {
        // A newer registration stands; the aborted transaction takes back
        // a row this call may have created.
        return Err(stale(&reg.node_id, reg.session_id));
    }
    let replaced = session_from(&current)?;
    let id = crate::store::chosen_or_new(reg.session_id);
    let state = SessionState::Registering;
    let row = query_one(
        db,
        START_SESSION,
        &[
            &reg.node_id,
            &reg.group,
            &details_json(&reg.connection_details),
            &connections_json(&reg.reported_connections),
            &names_json(&reg.reported_routes),
            &id,
            &owner.id,
            &to_i64(owner.incarnation)?,
            &session_state_sql(state),
            &reg.revision.as_i16(),
        ],
    )
    .await?;
    let session = Session {
        id,
        generation: to_u64(row.try_get(0)?)?,
        owner: owner.clone(),
        state,
    };
    Ok(SessionStart { session, replaced })
}

pub(super) async fn mark_ready(db: &Db<'_>, node: &str, session: Uuid) -> Result<bool, TxError> {
    let n = execute(
        db,
        "UPDATE nodes SET session_state = $3, updated_at = now() \
         WHERE id = $1 AND session_id = $2",
        &[&node, &session, &session_state_sql(SessionState::Ready)],
    )
    .await?;
    Ok(n > 0)
}

pub(super) async fn end_session(
    db: &Db<'_>,
    node: &str,
    session: Uuid,
    kind: DepartureKind,
) -> Result<bool, TxError> {
    // The right-hand sides read the row as it was before this update.
    let n = execute(
        db,
        "UPDATE nodes SET departure_generation = session_generation, departure_kind = $3, \
           session_id = NULL, session_generation = NULL, session_owner = NULL, \
           session_incarnation = NULL, session_state = NULL, received_links = '[]', \
           updated_at = now() \
         WHERE id = $1 AND session_id = $2",
        &[&node, &session, &departure_kind_sql(kind)],
    )
    .await?;
    Ok(n > 0)
}

/// Ends, as crashes, the sessions of `owner`'s earlier incarnations.
pub(super) async fn end_earlier_incarnations(
    db: &Db<'_>,
    owner: &str,
    incarnation: i64,
) -> Result<Vec<String>, TxError> {
    let rows = query(
        db,
        "UPDATE nodes SET departure_generation = session_generation, departure_kind = 'crash', \
           session_id = NULL, session_generation = NULL, session_owner = NULL, \
           session_incarnation = NULL, session_state = NULL, received_links = '[]', \
           updated_at = now() \
         WHERE session_owner = $1 AND session_incarnation < $2 \
         RETURNING id",
        &[&owner, &incarnation],
    )
    .await?;
    let mut ids = rows
        .iter()
        .map(|r| r.try_get::<_, String>("id"))
        .collect::<Result<Vec<_>, _>>()?;
    ids.sort();
    Ok(ids)
}

/// Locks the node's row if `session` is current; returns its generation.
pub(super) async fn lock_current(db: &Db<'_>, node: &str, session: Uuid) -> Result<u64, TxError> {
    let row = query_opt(
        db,
        "SELECT session_generation FROM nodes WHERE id = $1 AND session_id = $2 FOR UPDATE",
        &[&node, &session],
    )
    .await?;
    let row = row.ok_or_else(|| stale(node, session))?;
    to_u64(row.try_get(0)?)
}

fn stale(node: &str, session: Uuid) -> TxError {
    StoreError::StaleSession {
        node: node.to_string(),
        session,
    }
    .into()
}

pub(super) async fn record_received(
    db: &Db<'_>,
    node: &str,
    session: Uuid,
    link_ids: &[String],
) -> Result<(), TxError> {
    let row = query_opt(
        db,
        "SELECT received_links FROM nodes WHERE id = $1 AND session_id = $2 FOR UPDATE",
        &[&node, &session],
    )
    .await?;
    let row = row.ok_or_else(|| stale(node, session))?;
    let Json(mut received): Json<Vec<String>> = row.try_get(0)?;
    for id in link_ids {
        if !received.contains(id) {
            received.push(id.clone());
        }
    }
    execute(
        db,
        "UPDATE nodes SET received_links = $2, updated_at = now() WHERE id = $1",
        &[&node, &Json(&received)],
    )
    .await?;
    Ok(())
}

pub(super) async fn get(db: &Db<'_>, node: &str) -> Result<Option<NodeRecord>, TxError> {
    const SQL: &str = concat!("SELECT ", node_columns!(), " FROM nodes WHERE id = $1");
    query_opt(db, SQL, &[&node])
        .await?
        .map(|row| node_from(&row))
        .transpose()
}

pub(super) async fn list(db: &Db<'_>) -> Result<Vec<NodeRecord>, TxError> {
    const SQL: &str = concat!("SELECT ", node_columns!(), " FROM nodes ORDER BY id");
    query_map(db, SQL, &[], node_from).await
}

pub(super) async fn get_many(db: &Db<'_>, ids: &[String]) -> Result<Vec<NodeRecord>, TxError> {
    const SQL: &str = concat!(
        "SELECT ",
        node_columns!(),
        " FROM nodes WHERE id = ANY($1) ORDER BY id"
    );
    query_map(db, SQL, &[&ids], node_from).await
}

pub(super) async fn forget(db: &Db<'_>, node: &str, generation: u64) -> Result<bool, TxError> {
    let Ok(generation) = i64::try_from(generation) else {
        // No record ever had such a generation.
        return Ok(false);
    };
    let n = execute(
        db,
        "DELETE FROM nodes WHERE id = $1 AND session_id IS NULL AND generation = $2",
        &[&node, &generation],
    )
    .await?;
    Ok(n > 0)
}
