//! Announced names (`* -> node`), tagged with the session generation they
//! came from and ordered by a store-wide sequence.

use std::collections::BTreeSet;

use uuid::Uuid;

use tokio_postgres::types::ToSql;

use super::nodes::{lock_sessions, stale_session};
use super::rows::{TEMPLATE_COLUMNS, name_id_sql, template_from, to_i64};
use super::tx::{Db, TxError, execute, query_map};
use crate::store::StoreError;
use crate::store::model::{Name, Template};

/// Names as four parallel arrays for `unnest`; the null id as `''` so that
/// it compares equal (the unique index reads `coalesce(name_id, '')`).
#[derive(Default)]
struct NameArrays {
    c0: Vec<String>,
    c1: Vec<String>,
    c2: Vec<String>,
    id: Vec<String>,
}

impl NameArrays {
    fn push(&mut self, n: &Name) {
        let [c0, c1, c2] = n.components.clone();
        self.c0.push(c0);
        self.c1.push(c1);
        self.c2.push(c2);
        self.id.push(name_id_sql(n.id).unwrap_or_default());
    }
}

/// New names take the next sequence numbers in the order given; a name
/// already there keeps its `seq` and takes the new generation. (`nextval`
/// runs after the `ORDER BY`, as Postgres evaluates volatile output
/// expressions after sorting.)
const SET: &str = "INSERT INTO templates \
       (seq, node, component0, component1, component2, name_id, generation) \
     SELECT nextval('template_seq'), s.node, s.c0, s.c1, s.c2, nullif(s.id, ''), s.gen \
     FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[]) \
       WITH ORDINALITY AS s(node, c0, c1, c2, id, gen, ord) \
     ORDER BY s.ord \
     ON CONFLICT (node, component0, component1, component2, (coalesce(name_id, ''))) \
     DO UPDATE SET generation = EXCLUDED.generation, updated_at = now()";

const WITHDRAW: &str = "DELETE FROM templates t \
     USING unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) \
       AS w(node, c0, c1, c2, id) \
     WHERE t.node = ANY($1) AND t.node = w.node AND t.component0 = w.c0 AND t.component1 = w.c1 \
       AND t.component2 = w.c2 AND coalesce(t.name_id, '') = w.id";

/// One node's announcement: `(node, session, set, withdrawn)`.
pub(super) type Announced = (String, Uuid, Vec<Name>, Vec<Name>);

/// Announcements of several nodes, in call order, each checked against
/// its node's current session (locked): a stale one is refused alone.
/// Written in rounds that hold each node at most once, a withdrawal and
/// an insert per round, since one statement may not touch a row twice.
pub(super) async fn record_announcements_all(
    db: &Db<'_>,
    calls: &[Announced],
) -> Result<Vec<Result<(), StoreError>>, TxError> {
    let ids: Vec<&str> = calls.iter().map(|(n, ..)| n.as_str()).collect();
    let current = lock_sessions(db, &ids).await?;
    let mut answers = Vec::with_capacity(calls.len());
    let mut rounds: Vec<Round> = Vec::new();
    for (node, session, set, withdraw) in calls {
        let Some(&(_, generation)) = current.get(node).filter(|(s, _)| s == session) else {
            answers.push(Err(stale_session(node, *session)));
            continue;
        };
        answers.push(Ok(()));
        let free = rounds.iter().position(|r| !r.nodes.contains(node.as_str()));
        let i = free.unwrap_or_else(|| {
            rounds.push(Round::default());
            rounds.len() - 1
        });
        rounds[i].add(node, to_i64(generation)?, set, withdraw);
    }
    for r in &rounds {
        r.write(db).await?;
    }
    Ok(answers)
}

/// Calls of distinct nodes, written by two statements.
#[derive(Default)]
struct Round<'a> {
    nodes: BTreeSet<&'a str>,
    set: (Vec<&'a str>, Vec<i64>, NameArrays),
    withdraw: (Vec<&'a str>, NameArrays),
}

impl<'a> Round<'a> {
    fn add(&mut self, node: &'a str, generation: i64, set: &'a [Name], withdraw: &'a [Name]) {
        self.nodes.insert(node);
        // Keep each name's first place: a name twice would touch one row twice.
        let mut seen = BTreeSet::new();
        for n in set.iter().filter(|n| seen.insert(*n)) {
            self.set.0.push(node);
            self.set.1.push(generation);
            self.set.2.push(n);
        }
        for n in withdraw {
            self.withdraw.0.push(node);
            self.withdraw.1.push(n);
        }
    }

    async fn write(&self, db: &Db<'_>) -> Result<(), TxError> {
        let (nodes, w) = &self.withdraw;
        if !nodes.is_empty() {
            execute(db, WITHDRAW, &[nodes, &w.c0, &w.c1, &w.c2, &w.id]).await?;
        }
        let (nodes, generations, s) = &self.set;
        if !nodes.is_empty() {
            let params: [&(dyn ToSql + Sync); 6] = [nodes, &s.c0, &s.c1, &s.c2, &s.id, generations];
            execute(db, SET, &params).await?;
        }
        Ok(())
    }
}

pub(super) async fn list(db: &Db<'_>) -> Result<Vec<Template>, TxError> {
    let sql = format!("SELECT {TEMPLATE_COLUMNS} FROM templates ORDER BY seq");
    query_map(db, &sql, &[], template_from).await
}

pub(super) async fn of_nodes(db: &Db<'_>, nodes: &[String]) -> Result<Vec<Template>, TxError> {
    let sql = format!("SELECT {TEMPLATE_COLUMNS} FROM templates WHERE node = ANY($1) ORDER BY seq");
    query_map(db, &sql, &[&nodes], template_from).await
}

pub(super) async fn drop_before(
    db: &Db<'_>,
    node: &str,
    generation: u64,
) -> Result<usize, TxError> {
    // Beyond bigint every stored generation is lower: drop them all.
    let bound = i64::try_from(generation).ok();
    let n = execute(
        db,
        "DELETE FROM templates WHERE node = $1 AND ($2::bigint IS NULL OR generation < $2)",
        &[&node, &bound],
    )
    .await?;
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}
