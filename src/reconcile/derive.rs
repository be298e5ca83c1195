//! The leader's derivation: from the current facts, the links and routes
//! the fleet should have, written as one change set. Level-based and
//! idempotent: run it twice on the same facts and the second run changes
//! nothing. So a derivation looks only at what changed since the last one
//! (see [`Dirty`](super::working::Dirty)): the group pairs of the nodes and
//! links that changed, the names they announce and the names whose trees
//! ride a link that changed. A full derivation looks at everything.

use std::collections::{BTreeSet, HashSet};
use std::time::{Duration, Instant};

use tracing::warn;

use super::working::WorkingState;
use crate::config::TopologyConfig;
use crate::routing::links::{self, LinkScope};
use crate::routing::routes::{self, NameScope, RouteFacts, Router};
use crate::routing::templates;
use crate::store::model::{Link, NodeRecord, Segment, edge_ref};
use crate::store::{ChangeSet, Store, StoreError};

/// What a derivation changed.
#[derive(Debug, Default)]
pub struct Derivation {
    /// Nodes whose desired state changed: they need a reconcile.
    pub affected: BTreeSet<String>,
    pub changes: usize,
    /// Derive again after this long: a departed node's grace ends then.
    pub recheck_in: Option<Duration>,
    /// Whether it looked at everything.
    pub full: bool,
    /// How long it planned, and how long it wrote: on Postgres the two
    /// parts of a batch's cost.
    pub planned: Duration,
    pub written: Duration,
}

/// A derivation's plan, not written yet.
#[derive(Debug)]
pub struct Planned {
    pub changes: ChangeSet,
    pub drops: Drops,
    pub derivation: Derivation,
}

/// The announcements a plan drops (see [`templates::TemplatePlan`]).
#[derive(Debug, Default, PartialEq)]
pub struct Drops {
    pub all: Vec<(String, u64)>,
    pub older: Vec<(String, u64)>,
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
    let started = Instant::now();
    // The database's clock, like the departure stamps it is compared with.
    let (segments, now) = tokio::try_join!(segments(store, mode), state.now(store))?;
    state.prepare(mode, segments, now)?;
    let mut new_id = || uuid::Uuid::new_v4().to_string();
    let mut planned = plan(state, arrived, now, false, &mut new_id)?;
    planned.derivation.planned = started.elapsed();
    let mut out = commit(store, state, planned, now).await?;
    out.written = started.elapsed() - out.planned;
    Ok(out)
}

/// The API-mode segments, or none for a configured topology.
pub async fn segments(
    store: &dyn Store,
    mode: &TopologyConfig,
) -> Result<Vec<Segment>, StoreError> {
    match mode {
        TopologyConfig::Api => store.list_segments().await,
        _ => Ok(Vec::new()),
    }
}

/// The change set of the derivation at `now`, from the working state as
/// [`WorkingState::prepare`] left it: of what changed since the last
/// derivation, or of everything with `whole` (or when the state says so).
pub fn plan(
    state: &WorkingState,
    arrived: &BTreeSet<String>,
    now: i64,
    whole: bool,
    new_id: &mut dyn FnMut() -> String,
) -> Result<Planned, StoreError> {
    let rows = state.rows().ok_or_else(not_loaded)?;
    let active = state.active().ok_or_else(not_loaded)?;
    let trees = state.trees().ok_or_else(not_loaded)?;
    let graphs = state.graphs();
    let dirty = state.dirty();
    let full = whole || dirty.full;
    if !full && dirty.is_empty() {
        // Nothing changed since a derivation that was written: planning
        // would change nothing (derivation is idempotent).
        return Ok(Planned::nothing(state.next_deadline(now)));
    }
    let scope = match full {
        true => LinkScope::All,
        false => LinkScope::Some {
            groups: &dirty.groups,
            pairs: &dirty.pairs,
        },
    };
    let plan = links::plan_in(&rows.nodes, active, &rows.links, graphs, now, scope, new_id);
    for (a, b) in &plan.unlinkable {
        warn!(
            a,
            b, "groups may link but neither has a node with an external endpoint"
        );
    }
    log_links(&plan);
    let judged = match full {
        true => templates::plan_in(&rows.nodes, &rows.templates, rows.templates.nodes(), now),
        false => templates::plan_in(
            &rows.nodes,
            &rows.templates,
            dirty.nodes.iter().map(String::as_str),
            now,
        ),
    };
    let counts = |n: &NodeRecord, generation| templates::counts(n, generation, now);
    let facts = RouteFacts {
        fleet: &rows.nodes,
        active,
        announcements: &rows.templates,
        counts: &counts,
        graphs,
        trees,
    };
    let mut router = Router::new(facts, &plan.live);
    let routes = match full {
        true => router.changes(&rows.routes, NameScope::All, now),
        false => {
            // Reconcilers' writes may have changed a link since the last
            // derivation: their pairs count as changed too.
            let pairs: HashSet<(&str, &str)> = plan
                .planned
                .iter()
                .map(|(a, b)| (a.as_str(), b.as_str()))
                .collect();
            let planned = |l: &&Link| pairs.contains(&edge_ref(&l.source_group, &l.dest_group));
            let before: Vec<&Link> = rows.links.iter().filter(planned).collect();
            let after: Vec<&Link> = plan
                .live
                .iter()
                .map(|l| l.as_ref())
                .filter(planned)
                .collect();
            let mut edges = routes::realized_changes(&before, &after);
            edges.extend(dirty.pairs.iter().cloned());
            let mut names = dirty.names.clone();
            names.extend(router.names_over(&edges));
            router.changes(&rows.routes, NameScope::Some(&names), now)
        }
    };
    let mut out = Derivation {
        recheck_in: in_seconds(state.next_deadline(now)),
        full,
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
    out.changes = changes.put_links.len()
        + changes.retire_links.len()
        + changes.put_routes.len()
        + changes.delete_routes.len();
    let drops = Drops {
        all: judged.drop_all,
        older: judged.drop_older,
    };
    Ok(Planned {
        changes,
        drops,
        derivation: out,
    })
}

impl Planned {
    fn nothing(recheck_in: Option<i64>) -> Self {
        Planned {
            changes: ChangeSet::default(),
            drops: Drops::default(),
            derivation: Derivation {
                recheck_in: in_seconds(recheck_in),
                ..Derivation::default()
            },
        }
    }
}

fn in_seconds(secs: Option<i64>) -> Option<Duration> {
    secs.map(|s| Duration::from_secs(u64::try_from(s).unwrap_or(1)))
}

/// Writes a plan made at `now`: its drops, then its change set. Once
/// written, nothing is dirty any more.
pub async fn commit(
    store: &dyn Store,
    state: &mut WorkingState,
    planned: Planned,
    now: i64,
) -> Result<Derivation, StoreError> {
    drop_templates(store, &planned.drops, state).await?;
    if !planned.changes.is_empty() {
        tracing::trace!(changes = ?planned.changes, "derived changes");
        state.write(store, planned.changes).await?;
    }
    state.derived(now);
    Ok(planned.derivation)
}

fn not_loaded() -> StoreError {
    StoreError::Unavailable("the leader's working state was not loaded".into())
}

/// Drops what the plan says is gone; the nodes' templates are re-read.
async fn drop_templates(
    store: &dyn Store,
    drops: &Drops,
    state: &mut WorkingState,
) -> Result<(), StoreError> {
    let nodes = drops.all.iter().map(|(n, _)| n);
    nodes
        .chain(drops.older.iter().map(|(n, _)| n))
        .for_each(|n| state.touched(n));
    for (node, upto) in &drops.all {
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
    for (node, generation) in &drops.older {
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
            // The routine end of every dial: a fleet converging claims
            // thousands.
            tracing::debug!(link = %l.link_id, dest = l.dest_node.as_deref().unwrap_or("-"), "link claimed");
            continue;
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
        // The working state tells when it writes them.
        fresh: Default::default(),
    }
}
