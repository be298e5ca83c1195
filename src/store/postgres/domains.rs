//! Registration-auth domains: a name and its sealed secret. Nothing here
//! derives from them, so writes wake no leader; each replica's
//! authenticator reloads the table on its own (see `crate::auth::domains`).

use super::tx::{Db, TxError, execute, query};
use crate::store::model::Domain;

pub(super) async fn list(db: &Db<'_>) -> Result<Vec<Domain>, TxError> {
    let rows = query(db, "SELECT name, sealed FROM domains ORDER BY name", &[]).await?;
    rows.iter()
        .map(|row| {
            Ok(Domain {
                name: row.try_get(0)?,
                sealed: row.try_get(1)?,
            })
        })
        .collect()
}

/// True if the domain is new. `xmax = 0` tells an insert from an update
/// in one statement, so a concurrent add cannot slip between two.
pub(super) async fn put(db: &Db<'_>, domain: &Domain) -> Result<bool, TxError> {
    let rows = query(
        db,
        "INSERT INTO domains (name, sealed) VALUES ($1, $2) \
         ON CONFLICT (name) DO UPDATE SET sealed = EXCLUDED.sealed, updated_at = now() \
         RETURNING (xmax = 0)",
        &[&domain.name, &domain.sealed],
    )
    .await?;
    match rows.first() {
        Some(row) => Ok(row.try_get(0)?),
        None => Ok(false),
    }
}

pub(super) async fn remove(db: &Db<'_>, name: &str) -> Result<bool, TxError> {
    let n = execute(db, "DELETE FROM domains WHERE name = $1", &[&name]).await?;
    Ok(n > 0)
}
