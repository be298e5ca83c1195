//! Rows to domain types and back. The JSON columns have row types of their
//! own, so a change to a domain type's serde shape can never silently change
//! what is on disk; 128-bit name ids travel as decimal text (a JSON number
//! that large does not survive `serde_json::Value`).

use serde::{Deserialize, Serialize};
use tokio_postgres::Row;
use tokio_postgres::types::Json;

use super::tx::TxError;
use crate::store::model::{
    Claim, ConnectionDetail, Departure, DepartureKind, Link, LinkStatus, Name, NodeRecord,
    ReportedConnection, Revision, Route, RouteStatus, Session, SessionState, SpireMtls, Template,
};

/// Text values of the enum columns (the schema's CHECK constraints list the
/// same words).
macro_rules! sql_enum {
    // With `$all`, also every value, in the order listed (the list is
    // exhaustive: `$to`'s match would not compile otherwise).
    ($ty:ident, $to:ident, $from:ident, $all:ident { $($variant:ident => $text:literal),* $(,)? }) => {
        sql_enum!($ty, $to, $from { $($variant => $text),* });

        pub(super) const $all: &[$ty] = &[$($ty::$variant),*];
    };
    ($ty:ident, $to:ident, $from:ident { $($variant:ident => $text:literal),* $(,)? }) => {
        pub(super) fn $to(v: $ty) -> &'static str {
            match v { $($ty::$variant => $text),* }
        }

        pub(super) fn $from(s: &str) -> Result<$ty, TxError> {
            match s {
                $($text => Ok($ty::$variant),)*
                other => Err(TxError::Decode(format!(
                    concat!("unknown ", stringify!($ty), " {:?}"), other
                ))),
            }
        }
    };
}

sql_enum!(SessionState, session_state_sql, session_state_from {
    Registering => "registering",
    Ready => "ready",
});
sql_enum!(DepartureKind, departure_kind_sql, departure_kind_from {
    Crash => "crash",
    Deregistered => "deregistered",
});
sql_enum!(LinkStatus, link_status_sql, link_status_from, LINK_STATUSES {
    Pending => "pending",
    Connecting => "connecting",
    Applied => "applied",
    Failed => "failed",
});
sql_enum!(RouteStatus, route_status_sql, route_status_from {
    Pending => "pending",
    Applied => "applied",
    Failed => "failed",
    Deleted => "deleted",
});

/// A database integer as the domain's unsigned one.
pub(super) fn to_u64(v: i64) -> Result<u64, TxError> {
    u64::try_from(v).map_err(|_| TxError::Decode(format!("negative counter {v}")))
}

/// The `revision` column: the major version of the node's southbound.
pub(super) fn revision_from(n: i16) -> Result<Revision, TxError> {
    Revision::from_i16(n).ok_or_else(|| TxError::Decode(format!("revision {n}")))
}

/// A domain integer for a bigint column. Generations and incarnations come
/// from sequences and clocks and stay far below `i64::MAX`.
pub(super) fn to_i64(v: u64) -> Result<i64, TxError> {
    i64::try_from(v).map_err(|_| TxError::Decode(format!("counter {v} exceeds bigint")))
}

/// A name id as stored: decimal text, `None` for the null component.
pub(super) fn name_id_sql(id: Option<u128>) -> Option<String> {
    id.map(|v| v.to_string())
}

fn name_id_from(text: Option<&str>) -> Result<Option<u128>, TxError> {
    text.map(|t| {
        t.parse()
            .map_err(|_| TxError::Decode(format!("name id {t:?}")))
    })
    .transpose()
}

/// The name in the `component0..2, name_id` columns.
fn name_from(row: &Row) -> Result<Name, TxError> {
    Ok(Name {
        components: [
            row.try_get("component0")?,
            row.try_get("component1")?,
            row.try_get("component2")?,
        ],
        id: name_id_from(row.try_get("name_id")?)?,
    })
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct NameRow {
    components: [String; 3],
    id: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct ConnectionRow {
    link_id: String,
    incoming: bool,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct SpireRow {
    socket_path: String,
    trust_domain: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct DetailRow {
    endpoint: String,
    external_endpoint: Option<String>,
    spire_mtls: Option<SpireRow>,
    #[serde(default)]
    metadata: serde_json::Map<String, serde_json::Value>,
    // The 3.x fields; absent from rows written before they were kept.
    #[serde(default)]
    tls_required: bool,
    #[serde(default)]
    auth_method: i32,
    #[serde(default)]
    spire_trust_domain: Option<String>,
}

pub(super) fn names_json(names: &[Name]) -> Json<Vec<NameRow>> {
    Json(
        names
            .iter()
            .map(|n| NameRow {
                components: n.components.clone(),
                id: name_id_sql(n.id),
            })
            .collect(),
    )
}

pub(super) fn connections_json(conns: &[ReportedConnection]) -> Json<Vec<ConnectionRow>> {
    Json(
        conns
            .iter()
            .map(|c| ConnectionRow {
                link_id: c.link_id.clone(),
                incoming: c.incoming,
            })
            .collect(),
    )
}

pub(super) fn details_json(details: &[ConnectionDetail]) -> Json<Vec<DetailRow>> {
    Json(details.iter().map(detail_row).collect())
}

fn detail_row(d: &ConnectionDetail) -> DetailRow {
    DetailRow {
        endpoint: d.endpoint.clone(),
        external_endpoint: d.external_endpoint.clone(),
        spire_mtls: d.spire_mtls.as_ref().map(|s| SpireRow {
            socket_path: s.socket_path.clone(),
            trust_domain: s.trust_domain.clone(),
        }),
        metadata: d.metadata.clone(),
        tls_required: d.tls_required,
        auth_method: d.auth_method,
        spire_trust_domain: d.spire_trust_domain.clone(),
    }
}

fn detail_from(d: DetailRow) -> ConnectionDetail {
    ConnectionDetail {
        endpoint: d.endpoint,
        external_endpoint: d.external_endpoint,
        spire_mtls: d.spire_mtls.map(|s| SpireMtls {
            socket_path: s.socket_path,
            trust_domain: s.trust_domain,
        }),
        metadata: d.metadata,
        tls_required: d.tls_required,
        auth_method: d.auth_method,
        spire_trust_domain: d.spire_trust_domain,
    }
}

pub(super) fn connections_from(rows: Vec<ConnectionRow>) -> Vec<ReportedConnection> {
    rows.into_iter()
        .map(|c| ReportedConnection {
            link_id: c.link_id,
            incoming: c.incoming,
        })
        .collect()
}

fn names_from(rows: Vec<NameRow>) -> Result<Vec<Name>, TxError> {
    rows.into_iter()
        .map(|n| {
            Ok(Name {
                components: n.components,
                id: name_id_from(n.id.as_deref())?,
            })
        })
        .collect()
}

/// The columns [`node_from`] reads, for `SELECT` lists.
macro_rules! node_columns {
    () => {
        "id, group_name, connection_details, reported_connections, reported_routes, \
         revision, received_links, session_id, session_generation, session_owner, \
         session_incarnation, session_state, generation, departure_generation, \
         departure_kind, floor(extract(epoch FROM updated_at))::bigint AS updated_ts"
    };
}
pub(super) use node_columns;

pub(super) fn node_from(row: &Row) -> Result<NodeRecord, TxError> {
    let details: Json<Vec<DetailRow>> = row.try_get("connection_details")?;
    let conns: Json<Vec<ConnectionRow>> = row.try_get("reported_connections")?;
    let routes: Json<Vec<NameRow>> = row.try_get("reported_routes")?;
    let received: Json<Vec<String>> = row.try_get("received_links")?;
    Ok(NodeRecord {
        id: row.try_get("id")?,
        group: row.try_get("group_name")?,
        connection_details: details.0.into_iter().map(detail_from).collect(),
        reported_connections: connections_from(conns.0),
        reported_routes: names_from(routes.0)?,
        revision: revision_from(row.try_get("revision")?)?,
        received_links: received.0,
        session: session_from(row)?,
        generation: to_u64(row.try_get("generation")?)?,
        departure: departure_from(row)?,
        updated_at: row.try_get("updated_ts")?,
    })
}

/// The `session_*` columns; `None` while the node is disconnected.
pub(super) fn session_from(row: &Row) -> Result<Option<Session>, TxError> {
    let Some(id) = row.try_get("session_id")? else {
        return Ok(None);
    };
    let state: &str = row.try_get("session_state")?;
    Ok(Some(Session {
        id,
        generation: to_u64(row.try_get("session_generation")?)?,
        owner: crate::store::model::ReplicaRef {
            id: row.try_get("session_owner")?,
            incarnation: to_u64(row.try_get("session_incarnation")?)?,
        },
        state: session_state_from(state)?,
    }))
}

fn departure_from(row: &Row) -> Result<Option<Departure>, TxError> {
    let generation: Option<i64> = row.try_get("departure_generation")?;
    let kind: Option<&str> = row.try_get("departure_kind")?;
    match (generation, kind) {
        (Some(g), Some(k)) => Ok(Some(Departure {
            generation: to_u64(g)?,
            kind: departure_kind_from(k)?,
        })),
        _ => Ok(None),
    }
}

pub(super) const TEMPLATE_COLUMNS: &str = "seq, node, component0, component1, component2, name_id, generation, \
     floor(extract(epoch FROM updated_at))::bigint AS updated_ts";

pub(super) fn template_from(row: &Row) -> Result<Template, TxError> {
    Ok(Template {
        name: name_from(row)?,
        node: row.try_get("node")?,
        generation: to_u64(row.try_get("generation")?)?,
        seq: to_u64(row.try_get("seq")?)?,
        updated_at: row.try_get("updated_ts")?,
    })
}

/// The columns [`link_from`] reads.
macro_rules! link_columns {
    () => {
        "link_id, source_node, source_group, dest_group, dest_node, dest_endpoint, \
         config_data, status, status_msg, deleted, \
         floor(extract(epoch FROM updated_at))::bigint AS updated_ts, \
         claim_source_generation, claim_dest_generation"
    };
}
pub(super) use link_columns;

pub(super) fn link_from(row: &Row) -> Result<Link, TxError> {
    Ok(Link {
        link_id: row.try_get("link_id")?,
        source_node: row.try_get("source_node")?,
        source_group: row.try_get("source_group")?,
        dest_group: row.try_get("dest_group")?,
        dest_node: row.try_get("dest_node")?,
        dest_endpoint: row.try_get("dest_endpoint")?,
        config_data: row.try_get("config_data")?,
        status: link_status_from(row.try_get("status")?)?,
        status_msg: row.try_get("status_msg")?,
        deleted: row.try_get("deleted")?,
        updated_at: row.try_get("updated_ts")?,
        claim: claim_from(row)?,
    })
}

/// The `claim_*` columns (the schema keeps them both set or both NULL).
fn claim_from(row: &Row) -> Result<Option<Claim>, TxError> {
    let source: Option<i64> = row.try_get("claim_source_generation")?;
    let dest: Option<i64> = row.try_get("claim_dest_generation")?;
    match (source, dest) {
        (Some(s), Some(d)) => Ok(Some(Claim {
            source_generation: to_u64(s)?,
            dest_generation: to_u64(d)?,
        })),
        (None, None) => Ok(None),
        _ => Err(TxError::Decode("half a link claim".into())),
    }
}

/// A claim as its two columns.
pub(super) fn claim_sql(claim: Option<Claim>) -> Result<(Option<i64>, Option<i64>), TxError> {
    match claim {
        Some(c) => Ok((
            Some(to_i64(c.source_generation)?),
            Some(to_i64(c.dest_generation)?),
        )),
        None => Ok((None, None)),
    }
}

/// The columns [`route_from`] reads.
macro_rules! route_columns {
    () => {
        "id, source_node, dest_node, link_id, component0, component1, component2, \
         name_id, status, status_msg, \
         floor(extract(epoch FROM updated_at))::bigint AS updated_ts"
    };
}
pub(super) use route_columns;

pub(super) fn route_from(row: &Row) -> Result<Route, TxError> {
    Ok(Route {
        id: row.try_get("id")?,
        source_node: row.try_get("source_node")?,
        dest_node: row.try_get("dest_node")?,
        link_id: row.try_get("link_id")?,
        name: name_from(row)?,
        status: route_status_from(row.try_get("status")?)?,
        status_msg: row.try_get("status_msg")?,
        updated_at: row.try_get("updated_ts")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enum_words_round_trip() {
        for s in LINK_STATUSES {
            assert_eq!(link_status_from(link_status_sql(*s)).unwrap(), *s);
        }
        for s in [
            RouteStatus::Pending,
            RouteStatus::Applied,
            RouteStatus::Failed,
            RouteStatus::Deleted,
        ] {
            assert_eq!(route_status_from(route_status_sql(s)).unwrap(), s);
        }
        assert!(matches!(link_status_from("gone"), Err(TxError::Decode(_))));
    }

    #[test]
    fn wide_name_ids_survive_as_text() {
        let id = Some(u128::MAX);
        assert_eq!(name_id_from(name_id_sql(id).as_deref()).unwrap(), id);
        assert_eq!(name_id_from(None).unwrap(), None);
        assert!(name_id_from(Some("-1")).is_err());
        let json = names_json(&[Name {
            components: ["a".into(), "b".into(), "c".into()],
            id,
        }]);
        let text = serde_json::to_string(&json.0).unwrap();
        let back: Vec<NameRow> = serde_json::from_str(&text).unwrap();
        assert_eq!(names_from(back).unwrap()[0].id, id);
    }
}
