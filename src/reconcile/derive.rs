//! The leader's derivation: from the current facts, the links and routes
//! the fleet should have, written as one change set. Level-based and
//! idempotent: run it twice on the same facts and the second run changes
//! nothing.

use std::collections::BTreeSet;

use tracing::warn;

use super::working::WorkingState;
use crate::config::TopologyConfig;
use crate::routing::{links, routes, templates, topology};
use crate::store::{ChangeSet, Store, StoreError};

/// What a derivation changed.
#[derive(Debug, Default)]
pub struct Derivation {
    /// Nodes whose desired state changed: they need a reconcile.
    pub affected: BTreeSet<String>,
    pub changes: usize,
    /// Derive again after this long: a departed node's grace ends then.
    pub recheck_in: Option<std::time::Duration>,
    /// How long it planned, and how long it wrote: on Postgres the two
    /// parts of a batch's cost.
    pub planned: std::time::Duration,
    pub written: std::time::Duration,
}

/// Derives and writes the desired links and routes from the working
/// state (just refreshed) and the rest of the store, and keeps the state
/// in step with what it wrote. `arrived` are nodes that registered since
/// the last derivation: the sources of links towards them are reconciled
/// too, so a connection that died with the node's previous life is dialled
/// again.
pub async fn derive(
    store: &dyn Store,
    mode: &TopologyConfig,
    arrived: &BTreeSet<String>,
    state: &mut WorkingState,
) -> Result<Derivation, StoreError> {
    let started = std::time::Instant::now();
    let (changes, mut out) = plan(store, mode, arrived, state).await?;
    out.planned = started.elapsed();
    if !changes.is_empty() {
        tracing::trace!(?changes, "derived changes");
        state.write(store, changes).await?;
    }
    out.written = started.elapsed() - out.planned;
    Ok(out)
}

/// The change set of one derivation, and what it affects.
async fn plan(
    store: &dyn Store,
    mode: &TopologyConfig,
    arrived: &BTreeSet<String>,
    state: &mut WorkingState,
) -> Result<(ChangeSet, Derivation), StoreError> {
    let segments = async {
        match mode {
            TopologyConfig::Api => store.list_segments().await,
            _ => Ok(Vec::new()),
        }
    };
    // The database's clock, like the departure stamps it is compared with.
    let (segments, now) = tokio::try_join!(segments, state.now(store))?;
    let rows = state.rows().ok_or_else(not_loaded)?;
    let nodes = &rows.nodes;
    let groups = links::active_groups(nodes, now);
    let graphs = topology::resolve(mode, &segments, &groups);
    let plan = links::plan(nodes, &rows.links, &graphs, now, &mut || {
        uuid::Uuid::new_v4().to_string()
    });
    for (a, b) in &plan.unlinkable {
        warn!(
            a,
            b, "groups may link but neither has a node with an external endpoint"
        );
    }
    log_links(&plan);
    let (holding, _) = links::holding(nodes, now);
    let announced = templates::plan(nodes, &rows.templates, &holding, now);
    let routes = routes::changes(
        nodes,
        &groups,
        &plan.live,
        &announced.live,
        &graphs,
        &rows.routes,
        now,
    );
    let recheck = [plan.recheck_in, announced.recheck_in]
        .into_iter()
        .flatten()
        .min();
    let mut out = Derivation {
        recheck_in: recheck.map(|s| std::time::Duration::from_secs(u64::try_from(s).unwrap_or(1))),
        ..Derivation::default()
    };
    for l in plan
        .live
        .iter()
        .filter(|l| l.dest_node.as_ref().is_some_and(|d| arrived.contains(d)))
    {
        out.affected.insert(l.source_node.clone());
    }
    let changes = change_set(plan, routes, &mut out.affected);
    drop_templates(store, &announced, state).await?;
    out.changes = changes.put_links.len()
        + changes.retire_links.len()
        + changes.put_routes.len()
        + changes.delete_routes.len();
    Ok((changes, out))
}

fn not_loaded() -> StoreError {
    StoreError::Unavailable("the leader's working state was not loaded".into())
}

/// Drops what the plan says is gone; the nodes' templates are re-read.
async fn drop_templates(
    store: &dyn Store,
    plan: &templates::TemplatePlan,
    state: &mut WorkingState,
) -> Result<(), StoreError> {
    let nodes = plan.drop_all.iter().map(|(n, _)| n);
    nodes
        .chain(plan.drop_older.iter().map(|(n, _)| n))
        .for_each(|n| state.touched(n));
    for (node, upto) in &plan.drop_all {
        let gone = store
            .drop_templates_before(node, upto.saturating_add(1))
            .await?;
        if gone > 0 {
            tracing::info!(
                node,
                announcements = gone,
                "announcements of a departed node dropped"
            );
        }
    }
    for (node, generation) in &plan.drop_older {
        store.drop_templates_before(node, *generation).await?;
    }
    Ok(())
}

/// One line per link change, for operators following a failover.
fn log_links(plan: &links::LinkPlan) {
    for l in &plan.upserts {
        let what = if l.deleted {
            "link deleted"
        } else if l.claim.is_some() {
            "link claimed"
        } else if l.dest_node.is_some() {
            "link awaits a new claim"
        } else {
            "link planned"
        };
        tracing::info!(
            link = %l.link_id,
            source = %l.source_node,
            dest_group = %l.dest_group,
            dest = l.dest_node.as_deref().unwrap_or("-"),
            note = %l.status_msg,
            "{what}"
        );
    }
    for r in &plan.hard_deletes {
        tracing::info!(link = %r.link_id, source = %r.source, "link removed (its source left)");
    }
}

fn change_set(
    plan: links::LinkPlan,
    routes: routes::RouteChanges,
    affected: &mut BTreeSet<String>,
) -> ChangeSet {
    for l in &plan.upserts {
        affected.insert(l.source_node.clone());
        affected.extend(l.dest_node.clone());
    }
    affected.extend(routes.put.iter().map(|r| r.source_node.clone()));
    let mut delete_routes = Vec::with_capacity(routes.gone.len());
    for (id, source) in routes.gone {
        affected.insert(source);
        delete_routes.push(id);
    }
    ChangeSet {
        put_links: plan.upserts,
        delete_links: Vec::new(),
        retire_links: plan.hard_deletes,
        put_routes: routes.put,
        delete_routes,
        consume_claims: plan.consumed_claims,
    }
}
