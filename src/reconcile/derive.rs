//! The leader's derivation: from the current facts, the links and routes
//! the fleet should have, written as one change set. Level-based and
//! idempotent: run it twice on the same facts and the second run changes
//! nothing.

use std::collections::{BTreeMap, BTreeSet};

use tracing::warn;

use crate::config::TopologyConfig;
use crate::routing::{links, routes, templates, topology};
use crate::store::model::{NodeRecord, Route};
use crate::store::{ChangeSet, Store, StoreError};

/// What a derivation changed.
#[derive(Debug, Default)]
pub struct Derivation {
    /// Nodes whose desired state changed: they need a reconcile.
    pub affected: BTreeSet<String>,
    pub changes: usize,
    /// Derive again after this long: a departed node's grace ends then.
    pub recheck_in: Option<std::time::Duration>,
}

/// Derives and writes the desired links and routes from `nodes` (every
/// node record, as just read) and the rest of the store. `arrived` are
/// nodes that registered since the last derivation: the sources of links
/// towards them are reconciled too, so a connection that died with the
/// node's previous life is dialled again.
pub async fn derive(
    store: &dyn Store,
    mode: &TopologyConfig,
    arrived: &BTreeSet<String>,
    nodes: Vec<NodeRecord>,
) -> Result<Derivation, StoreError> {
    // Independent reads: on Postgres they run side by side on the pool's
    // connections, so a batch waits for the slowest, not for their sum.
    let segments = async {
        match mode {
            TopologyConfig::Api => store.list_segments().await,
            _ => Ok(Vec::new()),
        }
    };
    // The database's clock, like the departure stamps it is compared with.
    let (templates, stored_links, stored_routes, segments, now) = tokio::try_join!(
        store.list_templates(),
        store.list_links(),
        store.list_routes(),
        segments,
        store.now()
    )?;
    let groups = links::active_groups(&nodes, now);
    let graphs = topology::resolve(mode, &segments, &groups);
    let plan = links::plan(&nodes, &stored_links, &graphs, now, &mut || {
        uuid::Uuid::new_v4().to_string()
    });
    for (a, b) in &plan.unlinkable {
        warn!(
            a,
            b, "groups may link but neither has a node with an external endpoint"
        );
    }
    log_links(&plan);
    let (holding, _) = links::holding(&nodes, now);
    let announced = templates::plan(&nodes, &templates, &holding, now);
    drop_templates(store, &announced).await?;
    let desired = routes::expand(&nodes, &groups, &plan.live, &announced.live, &graphs, now);
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
    let changes = change_set(plan, desired, &stored_routes, &mut out.affected);
    out.changes = changes.put_links.len()
        + changes.retire_links.len()
        + changes.put_routes.len()
        + changes.delete_routes.len();
    if !changes.is_empty() {
        tracing::trace!(?changes, "derived changes");
        store.apply(changes).await?;
    }
    Ok(out)
}

async fn drop_templates(
    store: &dyn Store,
    plan: &templates::TemplatePlan,
) -> Result<(), StoreError> {
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
    desired: BTreeMap<String, Route>,
    stored: &[Route],
    affected: &mut BTreeSet<String>,
) -> ChangeSet {
    for l in &plan.upserts {
        affected.insert(l.source_node.clone());
        affected.extend(l.dest_node.clone());
    }
    let stored_ids: BTreeSet<&str> = stored.iter().map(|r| r.id.as_str()).collect();
    let put_routes: Vec<Route> = desired
        .values()
        .filter(|r| !stored_ids.contains(r.id.as_str()))
        .cloned()
        .collect();
    let gone: Vec<&Route> = stored
        .iter()
        .filter(|r| !desired.contains_key(&r.id))
        .collect();
    affected.extend(put_routes.iter().map(|r| r.source_node.clone()));
    affected.extend(gone.iter().map(|r| r.source_node.clone()));
    ChangeSet {
        put_links: plan.upserts,
        delete_links: Vec::new(),
        retire_links: plan.hard_deletes,
        put_routes,
        delete_routes: gone.into_iter().map(|r| r.id.clone()).collect(),
        consume_claims: plan.consumed_claims,
    }
}
