//! What a drill compares: the fleet as the database records it at one
//! moment, and the verdict on a later moment against an earlier one.
//!
//! Pure logic: [`super::snapshot`] reads the database.
//!
//! **Converged again** means, against the moment before the fault:
//!
//! 1. every node that was ready is ready again, on a replica the drill
//!    did not kill;
//! 2. the live links are exactly those that were, by id, each applied and,
//!    once claimed, claimed under the current sessions of both its ends
//!    (a node that moved has confirmed the link anew);
//! 3. the live routes are exactly those that were (same source node, name,
//!    destination node and link), each applied;
//! 4. when the fault deposes the leader, a new term is committed.
//!
//! **Lost**: a group pair that was linked with no live link at the end; a
//! route (source, name, destination) that was with none live at the end;
//! a node that was ready and is not (as in 1). **Duplicated**: live links
//! beyond one per group pair, live routes beyond one per route. A pair
//! linked at the end under another id than before is **replaced**: not
//! lost, but not converged either.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::store::model::{Claim, ReplicaRef};

/// A node's current session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub owner: ReplicaRef,
    pub generation: u64,
    pub ready: bool,
}

/// A live (not deleted) link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkView {
    pub id: String,
    pub source_node: String,
    pub source_group: String,
    pub dest_group: String,
    pub dest_node: Option<String>,
    pub applied: bool,
    pub claim: Option<Claim>,
}

/// What identifies a route: source node, name, destination node.
pub type RouteKey = (String, String, String);

/// A live (not deleted) route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteView {
    pub key: RouteKey,
    pub link_id: String,
    pub applied: bool,
}

/// The fleet at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    pub epoch: u64,
    pub leader: Option<ReplicaRef>,
    /// Nodes with a session, by id.
    pub nodes: BTreeMap<String, NodeView>,
    pub links: Vec<LinkView>,
    pub routes: Vec<RouteView>,
}

/// How a later view compares with the one before the fault.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub converged: bool,
    /// Why not converged (the first few reasons).
    pub pending: Vec<String>,
    pub nodes_lost: Vec<String>,
    pub links_lost: usize,
    pub links_duplicated: usize,
    pub links_replaced: usize,
    pub routes_lost: usize,
    pub routes_duplicated: usize,
}

impl Verdict {
    /// Nothing lost and nothing duplicated.
    pub fn intact(&self) -> bool {
        self.nodes_lost.is_empty()
            && self.links_lost == 0
            && self.links_duplicated == 0
            && self.routes_lost == 0
            && self.routes_duplicated == 0
    }
}

/// At most this many reasons are kept in [`Verdict::pending`].
const REASONS: usize = 5;

impl View {
    /// Whether the view is a steady state worth drilling from: a leader,
    /// every live link and route applied. `Err` says what is not.
    pub fn settled(&self) -> Result<(), String> {
        if self.leader.is_none() {
            return Err("no leader".into());
        }
        let links = self.links.iter().filter(|l| !self.link_holds(l)).count();
        let routes = self.routes.iter().filter(|r| !r.applied).count();
        let nodes = self.nodes.values().filter(|n| !n.ready).count();
        if links + routes + nodes > 0 {
            return Err(format!(
                "{links} links and {routes} routes not applied, {nodes} nodes registering"
            ));
        }
        Ok(())
    }

    /// Applied, and claimed (if at all) under both ends' current sessions.
    fn link_holds(&self, l: &LinkView) -> bool {
        let generation = |n: &str| self.nodes.get(n).map(|s| s.generation);
        let current = |c: &Claim| {
            let dest = l.dest_node.as_deref().and_then(generation);
            generation(&l.source_node) == Some(c.source_generation)
                && dest == Some(c.dest_generation)
        };
        l.applied && l.claim.as_ref().is_none_or(current)
    }

    fn ready_nodes(&self) -> impl Iterator<Item = &String> {
        self.nodes.iter().filter(|(_, s)| s.ready).map(|(id, _)| id)
    }
}

/// `now` against `before`; `gone` are the replica runs the drill killed,
/// and `new_term` whether the fault deposed the leader (a new term must
/// then be committed).
pub fn judge(before: &View, now: &View, gone: &[ReplicaRef], new_term: bool) -> Verdict {
    let mut pending = Vec::new();
    let nodes_lost: Vec<String> = before
        .ready_nodes()
        .filter(|id| {
            !now.nodes
                .get(*id)
                .is_some_and(|s| s.ready && !gone.contains(&s.owner))
        })
        .cloned()
        .collect();
    if !nodes_lost.is_empty() {
        pending.push(format!("{} nodes not ready again", nodes_lost.len()));
    }
    if new_term && now.epoch <= before.epoch {
        pending.push(format!("still epoch {}", now.epoch));
    }
    let links = judge_links(before, now, &mut pending);
    let routes = judge_routes(before, now, &mut pending);
    pending.truncate(REASONS);
    Verdict {
        converged: pending.is_empty(),
        pending,
        nodes_lost,
        links_lost: links.0,
        links_duplicated: links.1,
        links_replaced: links.2,
        routes_lost: routes.0,
        routes_duplicated: routes.1,
    }
}

/// Lost, duplicated and replaced links; reasons go to `pending`.
fn judge_links(before: &View, now: &View, pending: &mut Vec<String>) -> (usize, usize, usize) {
    let pair = |l: &LinkView| (l.source_group.clone(), l.dest_group.clone());
    let mut live: BTreeMap<(String, String), Vec<&str>> = BTreeMap::new();
    for l in &now.links {
        live.entry(pair(l)).or_default().push(&l.id);
    }
    let (mut lost, mut replaced) = (0, 0);
    for l in &before.links {
        match live.get(&pair(l)) {
            None => lost += 1,
            Some(ids) if !ids.contains(&l.id.as_str()) => replaced += 1,
            Some(_) => {}
        }
    }
    let duplicated: usize = live.values().map(|ids| ids.len() - 1).sum();
    let was: BTreeSet<&str> = before.links.iter().map(|l| l.id.as_str()).collect();
    let is: BTreeSet<&str> = now.links.iter().map(|l| l.id.as_str()).collect();
    if was != is {
        let (gone, new) = (was.difference(&is).count(), is.difference(&was).count());
        pending.push(format!("{gone} links gone, {new} new"));
    }
    let unsettled = now.links.iter().filter(|l| !now.link_holds(l)).count();
    if unsettled > 0 {
        pending.push(format!(
            "{unsettled} links not applied under current sessions"
        ));
    }
    (lost, duplicated, replaced)
}

/// Lost and duplicated routes; reasons go to `pending`.
fn judge_routes(before: &View, now: &View, pending: &mut Vec<String>) -> (usize, usize) {
    let mut live: BTreeMap<&RouteKey, usize> = BTreeMap::new();
    for r in &now.routes {
        *live.entry(&r.key).or_default() += 1;
    }
    let lost = before
        .routes
        .iter()
        .filter(|r| !live.contains_key(&r.key))
        .count();
    let duplicated: usize = live.values().map(|n| n - 1).sum();
    let held = |v: &View| -> BTreeSet<(RouteKey, String)> {
        v.routes
            .iter()
            .map(|r| (r.key.clone(), r.link_id.clone()))
            .collect()
    };
    let (was, is) = (held(before), held(now));
    if was != is {
        let (gone, new) = (was.difference(&is).count(), is.difference(&was).count());
        pending.push(format!("{gone} routes gone, {new} new"));
    }
    let unapplied = now.routes.iter().filter(|r| !r.applied).count();
    if unapplied > 0 {
        pending.push(format!("{unapplied} routes not applied"));
    }
    (lost, duplicated)
}

#[cfg(test)]
#[path = "view_tests.rs"]
mod tests;
