//! API-mode topology segments and their undirected group edges, stored in
//! canonical order (`a <= b`, byte order as in [`edge`]).

use super::tx::{Db, TxError, execute, query, query_opt};
use crate::store::StoreError;
use crate::store::model::{Segment, edge};

pub(super) async fn list(db: &Db<'_>) -> Result<Vec<Segment>, TxError> {
    let rows = query(
        db,
        "SELECT s.name, e.a, e.b FROM segments s \
         LEFT JOIN segment_edges e ON e.segment = s.name \
         ORDER BY s.name, e.a, e.b",
        &[],
    )
    .await?;
    let mut out: Vec<Segment> = Vec::new();
    for row in rows {
        let name: String = row.try_get(0)?;
        if out.last().is_none_or(|s| s.name != name) {
            out.push(Segment {
                name,
                edges: Vec::new(),
            });
        }
        let a: Option<String> = row.try_get(1)?;
        let b: Option<String> = row.try_get(2)?;
        if let (Some(a), Some(b), Some(seg)) = (a, b, out.last_mut()) {
            seg.edges.push((a, b));
        }
    }
    Ok(out)
}

pub(super) async fn add(db: &Db<'_>, name: &str) -> Result<bool, TxError> {
    let n = execute(
        db,
        "INSERT INTO segments (name) VALUES ($1) ON CONFLICT DO NOTHING",
        &[&name],
    )
    .await?;
    Ok(n > 0)
}

pub(super) async fn remove(db: &Db<'_>, name: &str) -> Result<bool, TxError> {
    let n = execute(db, "DELETE FROM segments WHERE name = $1", &[&name]).await?;
    Ok(n > 0)
}

/// Holds the segment (FOR SHARE: a concurrent removal waits) or fails with
/// `SegmentNotFound`.
async fn hold(db: &Db<'_>, name: &str) -> Result<(), TxError> {
    let row = query_opt(
        db,
        "SELECT 1 FROM segments WHERE name = $1 FOR SHARE",
        &[&name],
    )
    .await?;
    match row {
        Some(_) => Ok(()),
        None => Err(StoreError::SegmentNotFound(name.to_string()).into()),
    }
}

pub(super) async fn add_edge(
    db: &Db<'_>,
    segment: &str,
    a: &str,
    b: &str,
) -> Result<bool, TxError> {
    const SQL: &str =
        "INSERT INTO segment_edges (segment, a, b) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING";
    edit_edge(db, SQL, segment, a, b).await
}

pub(super) async fn remove_edge(
    db: &Db<'_>,
    segment: &str,
    a: &str,
    b: &str,
) -> Result<bool, TxError> {
    const SQL: &str = "DELETE FROM segment_edges WHERE segment = $1 AND a = $2 AND b = $3";
    edit_edge(db, SQL, segment, a, b).await
}

/// Runs `sql` on the canonical form of the edge `a`–`b` of an existing
/// segment (held against a concurrent removal); true if a row changed.
async fn edit_edge(
    db: &Db<'_>,
    sql: &str,
    segment: &str,
    a: &str,
    b: &str,
) -> Result<bool, TxError> {
    hold(db, segment).await?;
    let (a, b) = edge(a, b);
    Ok(execute(db, sql, &[&segment, &a, &b]).await? > 0)
}
