//! Registrations written with group commit (see [`super::group`]): the
//! sessions of a batch start with a handful of statements, whatever its
//! size. The rules are [`super::nodes::begin_session`]'s: each node's row
//! is locked (created if new) before its generation is drawn, rows are
//! locked in id order, and each session starts with the node's desired
//! state. A node named twice in one batch starts twice, in call order.
//! A late registration (`stale_after`) is never grouped: its refusal
//! takes back the row it may have created, which needs its own
//! transaction.

use std::collections::{BTreeMap, BTreeSet};

use tokio_postgres::types::Json;

use super::nodes::desired;
use super::rows::{
    ConnectionRow, DetailRow, NameRow, connections_json, details_json, names_json, session_from,
    session_state_sql, to_i64, to_u64,
};
use super::tx::{Db, TxError, query};
use crate::store::model::{Registration, ReplicaRef, Session, SessionState};
use crate::store::{SessionStart, StoreError, chosen_or_new};

/// One registration and the replica recording it.
pub(super) type Begin = (Registration, ReplicaRef);

/// Locks (creating where new) the rows of a round's nodes, in id order.
const LOCK_OR_CREATE: &str = "INSERT INTO nodes (id) \
     SELECT id FROM unnest($1::text[]) AS id ORDER BY id \
     ON CONFLICT (id) DO UPDATE SET id = EXCLUDED.id \
     RETURNING id, session_id, session_generation, session_owner, session_incarnation, \
       session_state";

/// Starts every session of a round; each row's generation is drawn after
/// its lock, from the store-wide sequence.
const START_SESSIONS: &str = "WITH t AS MATERIALIZED ( \
       SELECT u.*, nextval('generation_seq') AS g \
       FROM unnest($1::text[], $2::text[], $3::jsonb[], $4::jsonb[], $5::jsonb[], $6::uuid[], \
                   $7::text[], $8::int8[], $9::int2[]) \
         AS u(id, grp, details, conns, names, sid, owner, inc, rev)) \
     UPDATE nodes SET group_name = t.grp, connection_details = t.details, \
       reported_connections = t.conns, reported_routes = t.names, received_links = '[]', \
       session_id = t.sid, session_generation = t.g, session_owner = t.owner, \
       session_incarnation = t.inc, session_state = $10, generation = t.g, \
       departure_generation = NULL, departure_kind = NULL, revision = t.rev, updated_at = now() \
     FROM t WHERE nodes.id = t.id RETURNING nodes.id, t.g";

/// Starts the sessions of `calls`, none of them late; each one's start,
/// in call order.
pub(super) async fn begin_all(
    db: &Db<'_>,
    calls: &[Begin],
) -> Result<Vec<Result<SessionStart, StoreError>>, TxError> {
    let mut started: Vec<Option<SessionStart>> = vec![None; calls.len()];
    for round in rounds(calls) {
        begin_round(db, calls, &round, &mut started).await?;
    }
    let nodes: BTreeSet<&str> = calls.iter().map(|(r, _)| r.node_id.as_str()).collect();
    super::notify::nodes_changed(db, &nodes.into_iter().collect::<Vec<_>>()).await?;
    Ok(started
        .into_iter()
        .map(|s| s.ok_or_else(|| StoreError::Unavailable("a session did not start".into())))
        .collect())
}

/// The calls' indexes in rounds where no node appears twice, each round
/// in node id order, a node's calls in call order across rounds.
fn rounds(calls: &[Begin]) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, (reg, _)) in calls.iter().enumerate() {
        let times = seen.entry(reg.node_id.as_str()).or_default();
        if out.len() <= *times {
            out.push(Vec::new());
        }
        out[*times].push(i);
        *times += 1;
    }
    for round in &mut out {
        round.sort_by(|a, b| calls[*a].0.node_id.cmp(&calls[*b].0.node_id));
    }
    out
}

async fn begin_round(
    db: &Db<'_>,
    calls: &[Begin],
    round: &[usize],
    started: &mut [Option<SessionStart>],
) -> Result<(), TxError> {
    let ids: Vec<&str> = round.iter().map(|&i| calls[i].0.node_id.as_str()).collect();
    let mut replaced = BTreeMap::new();
    for row in query(db, LOCK_OR_CREATE, &[&ids]).await? {
        replaced.insert(row.try_get::<_, String>("id")?, session_from(&row)?);
    }
    let columns = Columns::of(calls, round)?;
    let rows = query(
        db,
        START_SESSIONS,
        &[
            &ids,
            &columns.groups,
            &columns.details,
            &columns.connections,
            &columns.names,
            &columns.sessions,
            &columns.owners,
            &columns.incarnations,
            &columns.revisions,
            &session_state_sql(SessionState::Registering),
        ],
    )
    .await?;
    let mut generations = BTreeMap::new();
    for row in &rows {
        generations.insert(row.try_get::<_, String>(0)?, to_u64(row.try_get(1)?)?);
    }
    let mut desired = desired(db, &ids).await?;
    for (k, &i) in round.iter().enumerate() {
        let (reg, owner) = &calls[i];
        let generation = generations.get(&reg.node_id).copied();
        let generation = generation.ok_or_else(|| missing(&reg.node_id))?;
        started[i] = Some(SessionStart {
            session: Session {
                id: columns.sessions[k],
                generation,
                owner: owner.clone(),
                state: SessionState::Registering,
            },
            replaced: replaced.remove(&reg.node_id).flatten(),
            desired: desired.remove(reg.node_id.as_str()).unwrap_or_default(),
        });
    }
    Ok(())
}

fn missing(node: &str) -> TxError {
    TxError::Decode(format!("no row for registering node {node}"))
}

/// A round's values, column by column, in the round's order.
struct Columns<'c> {
    groups: Vec<Option<&'c str>>,
    details: Vec<Json<Vec<DetailRow>>>,
    connections: Vec<Json<Vec<ConnectionRow>>>,
    names: Vec<Json<Vec<NameRow>>>,
    sessions: Vec<uuid::Uuid>,
    owners: Vec<&'c str>,
    incarnations: Vec<i64>,
    revisions: Vec<i16>,
}

impl<'c> Columns<'c> {
    fn of(calls: &'c [Begin], round: &[usize]) -> Result<Self, TxError> {
        let mut c = Columns {
            groups: Vec::new(),
            details: Vec::new(),
            connections: Vec::new(),
            names: Vec::new(),
            sessions: Vec::new(),
            owners: Vec::new(),
            incarnations: Vec::new(),
            revisions: Vec::new(),
        };
        for &i in round {
            let (reg, owner) = &calls[i];
            c.groups.push(reg.group.as_deref());
            c.details.push(details_json(&reg.connection_details));
            c.connections
                .push(connections_json(&reg.reported_connections));
            c.names.push(names_json(&reg.reported_routes));
            c.sessions.push(chosen_or_new(reg.session_id));
            c.owners.push(&owner.id);
            c.incarnations.push(to_i64(owner.incarnation)?);
            c.revisions.push(reg.revision.as_i16());
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(node: &str) -> Begin {
        let reg = Registration {
            node_id: node.into(),
            ..Registration::default()
        };
        let owner = ReplicaRef {
            id: "r".into(),
            incarnation: 1,
        };
        (reg, owner)
    }

    #[test]
    fn a_node_named_twice_starts_in_a_later_round() {
        let calls: Vec<Begin> = ["b/n1", "a/n1", "b/n1", "c/n1", "b/n1"]
            .into_iter()
            .map(call)
            .collect();
        // Each round in id order; b/n1's calls in call order across rounds.
        assert_eq!(rounds(&calls), vec![vec![1, 0, 3], vec![2], vec![4]]);
        assert!(rounds(&[]).is_empty());
    }
}
