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
use super::tx::{Db, TxError, custom_plans, execute, query, query_map, query_one, query_opt};
use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::store::model::{
    DepartureKind, DesiredState, NodeRecord, Registration, ReplicaRef, Session, SessionState,
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
    let replaced = session_from(&current)?;
    let own = replaced.as_ref().filter(|s| s.id == reg.session_id);
    if let Some(own) = own.filter(|_| reg.stale_after.is_some()) {
        // An earlier attempt of this late registration was recorded after
        // all (its answer was lost): it stands, and nothing new starts.
        let mut desired = desired(db, &[&reg.node_id]).await?;
        return Ok(SessionStart {
            session: own.clone(),
            replaced: None,
            desired: desired.remove(reg.node_id.as_str()).unwrap_or_default(),
        });
    }
    if reg.stale_after.is_some_and(|g| latest > g) {
        // A newer registration stands; the aborted transaction takes back
        // a row this call may have created.
        return Err(stale(&reg.node_id, reg.session_id));
    }
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
    let mut desired = desired(db, &[&reg.node_id]).await?;
    let desired = desired.remove(reg.node_id.as_str()).unwrap_or_default();
    Ok(SessionStart {
        session,
        replaced,
        desired,
    })
}

/// The desired states of those of `nodes` that have any, by node. Its
/// two statements may see different commits (READ COMMITTED, in a
/// registration's transaction): routes are kept only over the links the
/// first one saw. Both run on custom plans (see [`custom_plans`]).
pub(super) async fn desired<'n>(
    db: &Db<'_>,
    nodes: &[&'n str],
) -> Result<BTreeMap<&'n str, DesiredState>, TxError> {
    let (links, routes) = custom_plans(db, async {
        let links = super::links::live_sourced(db, nodes).await?;
        Ok((links, super::routes::desired(db, nodes).await?))
    })
    .await?;
    let mut out: BTreeMap<&str, DesiredState> = BTreeMap::new();
    let asked: BTreeSet<&'n str> = nodes.iter().copied().collect();
    let owner = |source: &str| asked.get(source).copied();
    for l in links {
        if let Some(n) = owner(&l.source_node) {
            out.entry(n).or_default().links.push(l);
        }
    }
    for r in routes {
        let Some(n) = owner(&r.source_node) else {
            continue;
        };
        let Some(d) = out.get_mut(n) else { continue };
        if d.links.iter().any(|l| l.link_id == r.link_id) {
            d.routes.push(r);
        }
    }
    Ok(out)
}

/// Marks each `(node, session)` ready if the session is still the node's;
/// says which were, in call order. Rows are locked in id order first, as
/// every multi-node writer locks them.
pub(super) async fn mark_ready_all(
    db: &Db<'_>,
    calls: &[(String, Uuid)],
) -> Result<Vec<bool>, TxError> {
    let ids: Vec<&str> = calls.iter().map(|(n, _)| n.as_str()).collect();
    let sessions: Vec<Uuid> = calls.iter().map(|(_, s)| *s).collect();
    execute(
        db,
        "SELECT 1 FROM nodes WHERE id = ANY($1) ORDER BY id FOR UPDATE",
        &[&ids],
    )
    .await?;
    let rows = query(
        db,
        "UPDATE nodes SET session_state = $3, updated_at = now() \
         FROM unnest($1::text[], $2::uuid[]) AS t(id, sid) \
         WHERE nodes.id = ANY($1) AND nodes.id = t.id AND nodes.session_id = t.sid \
         RETURNING nodes.id, nodes.session_id",
        &[&ids, &sessions, &session_state_sql(SessionState::Ready)],
    )
    .await?;
    let mut marked = BTreeSet::new();
    for row in &rows {
        marked.insert((row.try_get::<_, String>(0)?, row.try_get::<_, Uuid>(1)?));
    }
    Ok(calls.iter().map(|c| marked.contains(c)).collect())
}

/// Adds each call's link ids to its node's received links, if its session
/// is still the node's; each call's outcome, in call order.
pub(super) async fn record_received_all(
    db: &Db<'_>,
    calls: &[(String, Uuid, Vec<String>)],
) -> Result<Vec<Result<(), StoreError>>, TxError> {
    let ids: Vec<&str> = calls.iter().map(|(n, _, _)| n.as_str()).collect();
    let rows = query(
        db,
        "SELECT id, session_id, received_links FROM nodes \
         WHERE id = ANY($1) ORDER BY id FOR UPDATE",
        &[&ids],
    )
    .await?;
    let mut held: BTreeMap<String, (Option<Uuid>, Vec<String>)> = BTreeMap::new();
    for row in &rows {
        let Json(received): Json<Vec<String>> = row.try_get(2)?;
        held.insert(row.try_get(0)?, (row.try_get(1)?, received));
    }
    let mut changed = BTreeSet::new();
    let answers = calls
        .iter()
        .map(|(node, session, links)| {
            let Some((Some(current), received)) = held.get_mut(node) else {
                return Err(stale_session(node, *session));
            };
            if current != session {
                return Err(stale_session(node, *session));
            }
            for id in links {
                if !received.contains(id) {
                    received.push(id.clone());
                }
            }
            changed.insert(node.as_str());
            Ok(())
        })
        .collect();
    let ids: Vec<&str> = changed.iter().copied().collect();
    let lists: Vec<Json<&Vec<String>>> = ids.iter().map(|n| Json(&held[*n].1)).collect();
    execute(
        db,
        "UPDATE nodes SET received_links = t.r, updated_at = now() \
         FROM unnest($1::text[], $2::jsonb[]) AS t(id, r) \
         WHERE nodes.id = ANY($1) AND nodes.id = t.id",
        &[&ids, &lists],
    )
    .await?;
    Ok(answers)
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
/// The current session and generation of each of `nodes` that has one,
/// their rows locked (in id order, so two callers cannot deadlock).
pub(super) async fn lock_sessions(
    db: &Db<'_>,
    nodes: &[&str],
) -> Result<HashMap<String, (Uuid, u64)>, TxError> {
    let rows = query(
        db,
        "SELECT id, session_id, session_generation FROM nodes \
         WHERE id = ANY($1) AND session_id IS NOT NULL ORDER BY id FOR UPDATE",
        &[&nodes],
    )
    .await?;
    let mut out = HashMap::with_capacity(rows.len());
    for row in &rows {
        out.insert(row.try_get(0)?, (row.try_get(1)?, to_u64(row.try_get(2)?)?));
    }
    Ok(out)
}

fn stale(node: &str, session: Uuid) -> TxError {
    stale_session(node, session).into()
}

pub(super) fn stale_session(node: &str, session: Uuid) -> StoreError {
    StoreError::StaleSession {
        node: node.to_string(),
        session,
    }
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

pub(super) async fn sessions_of(
    db: &Db<'_>,
    ids: &[String],
) -> Result<Vec<(String, Session)>, TxError> {
    const SQL: &str = "SELECT id, session_id, session_generation, session_owner, \
         session_incarnation, session_state FROM nodes \
         WHERE id = ANY($1) AND session_id IS NOT NULL ORDER BY id";
    let rows = query(db, SQL, &[&ids]).await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        if let Some(session) = session_from(row)? {
            out.push((row.try_get("id")?, session));
        }
    }
    Ok(out)
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
