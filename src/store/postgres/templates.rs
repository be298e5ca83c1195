//! Announced names (`* -> node`), tagged with the session generation they
//! came from and ordered by a store-wide sequence.

use std::collections::BTreeSet;

use uuid::Uuid;

use super::nodes::lock_current;
use super::rows::{TEMPLATE_COLUMNS, name_id_sql, template_from, to_i64};
use super::tx::{Db, TxError, execute, query_map};
use crate::store::model::{Name, Template};

/// Names as four parallel arrays for `unnest`; the null id as `''` so that
/// it compares equal (the unique index reads `coalesce(name_id, '')`).
struct NameArrays {
    c0: Vec<String>,
    c1: Vec<String>,
    c2: Vec<String>,
    id: Vec<String>,
}

impl NameArrays {
    fn new<'n>(names: impl Iterator<Item = &'n Name>) -> Self {
        let mut a = NameArrays {
            c0: Vec::new(),
            c1: Vec::new(),
            c2: Vec::new(),
            id: Vec::new(),
        };
        for n in names {
            let [c0, c1, c2] = n.components.clone();
            a.c0.push(c0);
            a.c1.push(c1);
            a.c2.push(c2);
            a.id.push(name_id_sql(n.id).unwrap_or_default());
        }
        a
    }
}

/// New names take the next sequence numbers in the order given; a name
/// already there keeps its `seq` and takes the new generation. (`nextval`
/// runs after the `ORDER BY`, as Postgres evaluates volatile output
/// expressions after sorting.)
const SET: &str = "INSERT INTO templates \
       (seq, node, component0, component1, component2, name_id, generation) \
     SELECT nextval('template_seq'), $1, s.c0, s.c1, s.c2, nullif(s.id, ''), $6 \
     FROM unnest($2::text[], $3::text[], $4::text[], $5::text[]) \
       WITH ORDINALITY AS s(c0, c1, c2, id, ord) \
     ORDER BY s.ord \
     ON CONFLICT (node, component0, component1, component2, (coalesce(name_id, ''))) \
     DO UPDATE SET generation = EXCLUDED.generation, updated_at = now()";

const WITHDRAW: &str = "DELETE FROM templates t \
     USING unnest($2::text[], $3::text[], $4::text[], $5::text[]) AS w(c0, c1, c2, id) \
     WHERE t.node = $1 AND t.component0 = w.c0 AND t.component1 = w.c1 \
       AND t.component2 = w.c2 AND coalesce(t.name_id, '') = w.id";

pub(super) async fn record_announcements(
    db: &Db<'_>,
    node: &str,
    session: Uuid,
    set: &[Name],
    withdraw: &[Name],
) -> Result<(), TxError> {
    let generation = to_i64(lock_current(db, node, session).await?)?;
    if !withdraw.is_empty() {
        let w = NameArrays::new(withdraw.iter());
        execute(db, WITHDRAW, &[&node, &w.c0, &w.c1, &w.c2, &w.id]).await?;
    }
    // One statement may not touch a row twice: keep each name's first place.
    let mut seen = BTreeSet::new();
    let fresh: Vec<&Name> = set.iter().filter(|n| seen.insert(*n)).collect();
    if !fresh.is_empty() {
        let s = NameArrays::new(fresh.into_iter());
        execute(db, SET, &[&node, &s.c0, &s.c1, &s.c2, &s.id, &generation]).await?;
    }
    Ok(())
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
