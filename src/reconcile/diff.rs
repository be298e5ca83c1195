//! One node's reconcile step, decided purely: compare what the store wants
//! the node to hold with what the node says it holds (its live connection
//! and route tables) and build the one command that closes the gap.
//!
//! Only what the control plane manages is touched: outgoing remote
//! connections of links it knows, and routes over remote connections of
//! links it knows. Anything else on the node (its own configured peers,
//! local apps, unknown remote connections) is left alone unless orphan
//! detection is on.

use std::collections::{BTreeMap, BTreeSet};

use crate::names;
use crate::proto::sb;
use crate::store::model::{Link, Name, Route, RouteStatus};

/// What the node reported holding.
pub struct Live<'a> {
    pub connections: &'a [sb::ConnectionEntry],
    pub routes: &'a [sb::RouteEntry],
}

/// The decided step.
#[derive(Debug, Default, PartialEq)]
pub struct Step {
    pub command: sb::ConfigurationCommand,
    /// Link ids whose creation the command asks for.
    pub creating: Vec<String>,
    /// Tombstoned link ids the command deletes from the node.
    pub deleting: Vec<String>,
    /// Link ids of another source the node still dials (the link moved to
    /// a sibling while the node was away): the command deletes its stale
    /// connection, and the link stays.
    pub disowned: Vec<String>,
    /// Live link ids the command deletes to create them again at the
    /// next look (see [`super::stranded`]).
    pub dropping: Vec<String>,
    /// Tombstones the node no longer holds: drop them now.
    pub gone: Vec<String>,
    /// Route ids the command sets, by (name, link id).
    pub setting: BTreeMap<(Name, String), String>,
    /// Route ids already on the node but not yet marked applied.
    pub already: Vec<String>,
    /// Routes that must wait: their link is not on the node yet.
    pub deferred: usize,
}

impl Step {
    /// Takes the creation of `links` out of the step, with the routes that
    /// would have used them: they wait for a later look.
    pub fn defer_links(&mut self, links: &[String]) {
        if links.is_empty() {
            return;
        }
        let deferred = |l: &str| links.iter().any(|d| d == l);
        let cmd = &mut self.command;
        cmd.connections_to_create.retain(|c| !deferred(&c.link_id));
        self.creating.retain(|l| !deferred(l));
        let before = cmd.routes_to_set.len();
        cmd.routes_to_set
            .retain(|r| !r.link_id.as_deref().is_some_and(deferred));
        self.setting.retain(|(_, l), _| !deferred(l));
        self.deferred += before - cmd.routes_to_set.len();
    }

    pub fn has_command(&self) -> bool {
        let c = &self.command;
        !(c.connections_to_create.is_empty()
            && c.connections_to_delete.is_empty()
            && c.routes_to_set.is_empty()
            && c.routes_to_delete.is_empty())
    }
}

fn is_remote(c: &sb::ConnectionEntry) -> bool {
    c.connection_type == sb::ConnectionType::Remote as i32
}

fn link_of(c: &sb::ConnectionEntry) -> Option<&str> {
    c.link_id.as_deref().filter(|l| !l.is_empty())
}

/// Link ids of the node's outgoing remote connections, and of all its
/// remote connections (either direction).
fn live_links(conns: &[sb::ConnectionEntry]) -> (BTreeSet<&str>, BTreeSet<&str>) {
    let remote = conns.iter().filter(|c| is_remote(c));
    (outgoing_links(conns), remote.filter_map(link_of).collect())
}

/// Link ids of the node's outgoing remote connections.
pub fn outgoing_links(conns: &[sb::ConnectionEntry]) -> BTreeSet<&str> {
    let remote = conns.iter().filter(|c| is_remote(c));
    remote
        .filter(|c| c.direction == sb::ConnectionDirection::Outgoing as i32)
        .filter_map(link_of)
        .collect()
}

/// (name, link id) pairs the node routes over remote connections.
fn live_routes(entries: &[sb::RouteEntry]) -> BTreeSet<(Name, String)> {
    let mut out = BTreeSet::new();
    for e in entries {
        let Some(name) = e.name.as_ref().and_then(|n| names::from_wire(n).ok()) else {
            continue;
        };
        for c in e.connections.iter().filter(|c| is_remote(c)) {
            if let Some(l) = link_of(c) {
                out.insert((name.clone(), l.to_string()));
            }
        }
    }
    out
}

pub(super) fn wire_route(name: &Name, link_id: &str) -> sb::Route {
    sb::Route {
        name: Some(names::to_wire(name)),
        link_id: Some(link_id.to_string()),
        direction: None,
    }
}

/// Decides the step for `node`. `links` are the links it sources or is the
/// claimed destination of (tombstones included), and those of another
/// source it holds an outgoing connection of; `routes` those it sources.
pub fn decide(
    node: &str,
    links: &[Link],
    routes: &[Route],
    live: &Live<'_>,
    orphans: bool,
) -> Step {
    let mut step = Step::default();
    let (outgoing, usable) = live_links(live.connections);
    let sourced = links.iter().filter(|l| l.source_node == node);
    let wanted: BTreeSet<&str> = sourced
        .clone()
        .filter(|l| !l.deleted)
        .map(|l| l.link_id.as_str())
        .collect();
    for l in sourced {
        let held = outgoing.contains(l.link_id.as_str());
        match (l.deleted, held) {
            (false, false) => {
                step.command.connections_to_create.push(sb::Connection {
                    link_id: l.link_id.clone(),
                    config_data: l.config_data.clone(),
                });
                step.creating.push(l.link_id.clone());
            }
            (true, true) => step.deleting.push(l.link_id.clone()),
            (true, false) => step.gone.push(l.link_id.clone()),
            (false, true) => {}
        }
    }
    let disowned = links
        .iter()
        .filter(|l| l.source_node != node && outgoing.contains(l.link_id.as_str()));
    step.disowned = disowned.map(|l| l.link_id.clone()).collect();
    if orphans {
        let known: BTreeSet<&str> = links.iter().map(|l| l.link_id.as_str()).collect();
        let extra: Vec<String> = outgoing
            .iter()
            .filter(|l| !wanted.contains(*l) && !known.contains(*l))
            .map(|l| l.to_string())
            .collect();
        step.deleting.extend(extra);
    }
    step.command.connections_to_delete = [&step.deleting[..], &step.disowned[..]].concat();
    decide_routes(links, routes, live, &usable, orphans, &mut step);
    step
}

fn decide_routes(
    links: &[Link],
    routes: &[Route],
    live: &Live<'_>,
    usable: &BTreeSet<&str>,
    orphans: bool,
    step: &mut Step,
) {
    let held = live_routes(live.routes);
    let known: BTreeSet<&str> = links.iter().map(|l| l.link_id.as_str()).collect();
    let desired: BTreeSet<(Name, String)> = routes
        .iter()
        .map(|r| (r.name.clone(), r.link_id.clone()))
        .collect();
    for r in routes {
        let key = (r.name.clone(), r.link_id.clone());
        if held.contains(&key) {
            if r.status != RouteStatus::Applied {
                step.already.push(r.id.clone());
            }
        } else if usable.contains(r.link_id.as_str()) || step.creating.contains(&r.link_id) {
            step.command
                .routes_to_set
                .push(wire_route(&r.name, &r.link_id));
            step.setting.insert(key, r.id.clone());
        } else {
            step.deferred += 1;
        }
    }
    for (name, link_id) in held.difference(&desired) {
        if orphans || known.contains(link_id.as_str()) {
            step.command
                .routes_to_delete
                .push(wire_route(name, link_id));
        }
    }
}

/// A node's error text meaning "that was not there": deleting it is done.
pub fn is_not_found(message: &str) -> bool {
    message.to_ascii_lowercase().contains("not found")
}

#[cfg(test)]
#[path = "diff_tests.rs"]
pub(super) mod tests;
