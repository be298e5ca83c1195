//! Registrations written with group commit (see [`super::group`]): the
//! sessions of a batch start with a handful of statements, whatever its
//! size: in a first registration burst, one insert and one read. The
//! rules are [`super::nodes::begin_session`]'s: a node's generation is
//! drawn after any other start of it that may commit first (under its
//! row's lock, or before the insert that others then wait for), rows are
//! locked in id order, and each session starts with the node's desired
//! state. A node named twice in one batch starts twice, in call order.
//! A late registration (`stale_after`) is never grouped: its refusal
//! takes back the row it may have created, which needs its own
//! transaction.

use std::collections::{BTreeMap, BTreeSet};

use tokio_postgres::types::{Json, ToSql};

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

/// The columns of a round's registrations, `$1..$9`, each with a
/// generation drawn from the store-wide sequence, in node id order.
macro_rules! round_rows {
    () => {
        "(SELECT u.*, nextval('generation_seq') AS g \
           FROM unnest($1::text[], $2::text[], $3::jsonb[], $4::jsonb[], $5::jsonb[], \
                       $6::uuid[], $7::text[], $8::int8[], $9::int2[]) \
             AS u(id, grp, details, conns, names, sid, owner, inc, rev) \
           ORDER BY u.id)"
    };
}

/// Starts the sessions of the round's new nodes, inserting their rows
/// whole, and locks the rows of the others, in id order, returning their
/// sessions as they were (`started` false). A new row's generation is
/// drawn before its insert: a concurrent start of the same node waits for
/// that insert and draws its own after, under the row's lock. A generation
/// drawn for a row that exists goes unused (gaps are allowed). A row
/// inserted here has no `xmax`; one the conflict clause locked carries
/// the locker's.
const START_NEW_LOCK_OTHERS: &str = concat!(
    "INSERT INTO nodes (id, group_name, connection_details, reported_connections, \
       reported_routes, session_id, session_generation, session_owner, session_incarnation, \
       session_state, generation, revision) \
     SELECT t.id, t.grp, t.details, t.conns, t.names, t.sid, t.g, t.owner, t.inc, $10, t.g, t.rev \
     FROM ",
    round_rows!(),
    " AS t \
     ON CONFLICT (id) DO UPDATE SET id = EXCLUDED.id \
     RETURNING id, session_id, session_generation, session_owner, session_incarnation, \
       session_state, xmax = 0 AS started"
);

/// Starts the sessions of the round's nodes whose rows existed, locked
/// before; each one's generation is drawn after its lock.
const START_SESSIONS: &str = concat!(
    "WITH t AS MATERIALIZED ",
    round_rows!(),
    " UPDATE nodes SET group_name = t.grp, connection_details = t.details, \
       reported_connections = t.conns, reported_routes = t.names, received_links = '[]', \
       session_id = t.sid, session_generation = t.g, session_owner = t.owner, \
       session_incarnation = t.inc, session_state = $10, generation = t.g, \
       departure_generation = NULL, departure_kind = NULL, revision = t.rev, updated_at = now() \
     FROM t WHERE nodes.id = t.id RETURNING nodes.id, t.g"
);

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
    super::notify::nodes_changed(db, &replacing(calls, &started)).await?;
    Ok(started
        .into_iter()
        .map(|s| s.ok_or_else(|| StoreError::Unavailable("a session did not start".into())))
        .collect())
}

/// The nodes whose new session replaced one: only for them can the
/// leader learn something from the start (a ready session it saw ended
/// without a goodbye). A node with no session before has nothing for the
/// leader until it is ready, which wakes it, and an ended session woke it
/// when it ended. Saving the others' wake-ups saves the leader a read of
/// every registering node's row in a registration burst.
fn replacing<'c>(calls: &'c [Begin], started: &[Option<SessionStart>]) -> Vec<&'c str> {
    let nodes: BTreeSet<&str> = (calls.iter().zip(started))
        .filter(|(_, s)| s.as_ref().is_some_and(|s| s.replaced.is_some()))
        .map(|((r, _), _)| r.node_id.as_str())
        .collect();
    nodes.into_iter().collect()
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
    let sessions: Vec<uuid::Uuid> = (round.iter())
        .map(|&i| chosen_or_new(calls[i].0.session_id))
        .collect();
    let columns = Columns::of(calls, round, &sessions)?;
    let state = session_state_sql(SessionState::Registering);
    let mut generations = BTreeMap::new();
    let mut replaced = BTreeMap::new();
    for row in query(db, START_NEW_LOCK_OTHERS, &columns.params(&state)).await? {
        let id: String = row.try_get("id")?;
        if row.try_get("started")? {
            generations.insert(id, to_u64(row.try_get("session_generation")?)?);
        } else {
            replaced.insert(id, session_from(&row)?);
        }
    }
    if !replaced.is_empty() {
        let (existing, their_sessions): (Vec<usize>, Vec<uuid::Uuid>) =
            (round.iter().zip(&sessions))
                .filter(|(i, _)| replaced.contains_key(&calls[**i].0.node_id))
                .unzip();
        let existing = Columns::of(calls, &existing, &their_sessions)?;
        for row in query(db, START_SESSIONS, &existing.params(&state)).await? {
            generations.insert(row.try_get::<_, String>(0)?, to_u64(row.try_get(1)?)?);
        }
    }
    let mut desired = desired(db, &columns.ids).await?;
    for (k, &i) in round.iter().enumerate() {
        let (reg, owner) = &calls[i];
        let generation = generations.get(&reg.node_id).copied();
        let generation = generation.ok_or_else(|| missing(&reg.node_id))?;
        started[i] = Some(SessionStart {
            session: Session {
                id: sessions[k],
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
    ids: Vec<&'c str>,
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
    /// The calls of `round`, the sessions they start in `sessions`.
    fn of(calls: &'c [Begin], round: &[usize], sessions: &[uuid::Uuid]) -> Result<Self, TxError> {
        let mut c = Columns {
            ids: Vec::new(),
            groups: Vec::new(),
            details: Vec::new(),
            connections: Vec::new(),
            names: Vec::new(),
            sessions: Vec::new(),
            owners: Vec::new(),
            incarnations: Vec::new(),
            revisions: Vec::new(),
        };
        for (&i, &session) in round.iter().zip(sessions) {
            let (reg, owner) = &calls[i];
            c.ids.push(&reg.node_id);
            c.groups.push(reg.group.as_deref());
            c.details.push(details_json(&reg.connection_details));
            c.connections
                .push(connections_json(&reg.reported_connections));
            c.names.push(names_json(&reg.reported_routes));
            c.sessions.push(session);
            c.owners.push(&owner.id);
            c.incarnations.push(to_i64(owner.incarnation)?);
            c.revisions.push(reg.revision.as_i16());
        }
        Ok(c)
    }

    /// `$1..$10` of [`START_NEW_LOCK_OTHERS`] and [`START_SESSIONS`].
    fn params<'p>(&'p self, state: &'p &'static str) -> [&'p (dyn ToSql + Sync); 10] {
        [
            &self.ids,
            &self.groups,
            &self.details,
            &self.connections,
            &self.names,
            &self.sessions,
            &self.owners,
            &self.incarnations,
            &self.revisions,
            state,
        ]
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
