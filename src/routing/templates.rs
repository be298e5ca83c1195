//! Which announcements count, and which can go.
//!
//! A node that vanished keeps its announcements through the departure
//! grace (it may only be re-opening its control stream, and replays them
//! when it registers again). After the grace, a departed node's
//! announcements go; a returned node's announcements of an earlier session
//! that it did not replay go once it has been quiet for the grace.

use std::collections::{BTreeMap, BTreeSet};

use super::fleet::{Fleet, crashed_away, holds_links};
use super::links::{DEPARTURE_GRACE_SECS, grace_left};
use crate::store::model::{Name, NodeRecord, Template};

/// What the announcements come to.
///
/// Drops are bounded by the generation of the node record the plan saw,
/// never "everything of a node": the facts were read in more than one
/// look, and a node that registered and announced between the looks has
/// announcements of a newer generation, which must survive. A node the
/// plan did not see at all is left alone (the next look sees it; a
/// deregistered node's announcements go before its record does).
#[derive(Debug, Default, PartialEq)]
pub struct TemplatePlan {
    /// Announcements routes are expanded for (see [`counts`]).
    pub live: Vec<Template>,
    /// `(node, generation)`: the node departed; its announcements up to
    /// and including `generation` (its record's latest) go.
    pub drop_all: Vec<(String, u64)>,
    /// `(node, generation)`: announcements of earlier generations go.
    pub drop_older: Vec<(String, u64)>,
    /// Look again after this many seconds.
    pub recheck_in: Option<i64>,
}

/// Whether an announcement of `node` from session `generation` counts:
/// the node holds its links, and the announcement is not of an earlier
/// session that the node, ready and quiet for the grace, did not replay.
pub fn counts(node: &NodeRecord, generation: u64, now: i64) -> bool {
    let unreplayed = generation < node.generation
        && node.ready_session().is_some()
        && grace_left(now, node.updated_at).is_none();
    holds_links(node, now) && !unreplayed
}

/// When the announcements of `node` (`generations`, one per announcement)
/// are judged differently by time alone: the end of the grace after which
/// a departed node's go, or a returned node's unreplayed ones do. A Unix
/// second; `None` when time changes nothing.
pub fn judged_again_at(
    node: &NodeRecord,
    mut generations: impl Iterator<Item = u64>,
) -> Option<i64> {
    let unreplayed = node.ready_session().is_some() && generations.any(|g| g < node.generation);
    // The grace is over once `grace_left` says so: a second after its
    // nominal end (stamps are floored).
    let end = node.updated_at.saturating_add(DEPARTURE_GRACE_SECS + 1);
    (crashed_away(node) || unreplayed).then_some(end)
}

/// Plans the announcements given every node's record.
pub fn plan(nodes: &[NodeRecord], templates: &[Template], now: i64) -> TemplatePlan {
    let fleet = Fleet::new(nodes.iter().cloned());
    let index = Announcements::new(templates.iter().cloned());
    let mut out = plan_in(&fleet, &index, index.nodes(), now);
    out.live = templates
        .iter()
        .filter(|t| {
            fleet
                .get(&t.node)
                .is_some_and(|n| counts(n, t.generation, now))
        })
        .cloned()
        .collect();
    out
}

/// The drops and rechecks of the announcements of `nodes` (those the
/// plan looks at); leaves [`TemplatePlan::live`] empty: [`counts`] says
/// which count.
pub fn plan_in<'n>(
    fleet: &Fleet,
    index: &Announcements,
    nodes: impl IntoIterator<Item = &'n str>,
    now: i64,
) -> TemplatePlan {
    let mut out = TemplatePlan::default();
    for id in nodes {
        let announced = index.of(id);
        let Some(node) = fleet.get(id).filter(|_| !announced.is_empty()) else {
            continue;
        };
        if !holds_links(node, now) {
            out.drop_all.push((id.to_string(), node.generation));
            continue;
        }
        let stale = announced.iter().any(|t| t.generation < node.generation);
        if !stale || node.ready_session().is_none() {
            continue;
        }
        match grace_left(now, node.updated_at) {
            None => out.drop_older.push((id.to_string(), node.generation)),
            Some(left) => out.recheck_in = Some(out.recheck_in.map_or(left, |r| r.min(left))),
        }
    }
    out
}

/// The announcements a leader keeps between derivations, by node and by
/// name, so that a derivation reads those of the nodes and names it
/// looks at.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Announcements {
    /// Each node's, by `seq`.
    by_node: BTreeMap<String, Vec<Template>>,
    /// Each name's announcers: `(seq, node)` to the announcement's
    /// generation.
    by_name: BTreeMap<Name, BTreeMap<(u64, String), u64>>,
}

impl Announcements {
    pub fn new(templates: impl IntoIterator<Item = Template>) -> Self {
        let mut by_node: BTreeMap<String, Vec<Template>> = BTreeMap::new();
        for t in templates {
            by_node.entry(t.node.clone()).or_default().push(t);
        }
        let mut out = Announcements::default();
        for (node, fresh) in by_node {
            out.replace(&node, fresh);
        }
        out
    }

    /// Replaces the announcements of `node` with `fresh` (its, in any
    /// order); returns the names of the old and the new ones.
    pub fn replace(&mut self, node: &str, mut fresh: Vec<Template>) -> BTreeSet<Name> {
        let mut touched = BTreeSet::new();
        for t in self.by_node.remove(node).unwrap_or_default() {
            if let Some(announcers) = self.by_name.get_mut(&t.name) {
                announcers.remove(&(t.seq, t.node));
                if announcers.is_empty() {
                    self.by_name.remove(&t.name);
                }
            }
            touched.insert(t.name);
        }
        if fresh.is_empty() {
            return touched;
        }
        fresh.sort_by_key(|t| t.seq);
        for t in &fresh {
            let announcers = self.by_name.entry(t.name.clone()).or_default();
            announcers.insert((t.seq, t.node.clone()), t.generation);
            touched.insert(t.name.clone());
        }
        self.by_node.insert(node.to_string(), fresh);
        touched
    }

    /// The announcements of `node`, by `seq`.
    pub fn of(&self, node: &str) -> &[Template] {
        self.by_node.get(node).map_or(&[], Vec::as_slice)
    }

    /// The nodes with announcements, by id.
    pub fn nodes(&self) -> impl Iterator<Item = &str> {
        self.by_node.keys().map(String::as_str)
    }

    /// The names announced, in order.
    pub fn names(&self) -> impl Iterator<Item = &Name> {
        self.by_name.keys()
    }

    /// The announcers of `name` as `(node, generation)`, by `seq`.
    pub fn announcers<'a>(&'a self, name: &Name) -> impl Iterator<Item = (&'a str, u64)> {
        let announcers = self.by_name.get(name).into_iter().flatten();
        announcers.map(|((_, node), generation)| (node.as_str(), *generation))
    }

    pub fn len(&self) -> usize {
        self.by_node.values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.by_node.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::links::DEPARTURE_GRACE_SECS;
    use crate::store::model::{Name, ReplicaRef, Session, SessionState};

    fn mk_node(id: &str, generation: u64, updated_at: i64) -> NodeRecord {
        NodeRecord {
            id: id.into(),
            group: Some("g".into()),
            connection_details: vec![],
            reported_connections: vec![],
            reported_routes: vec![],
            revision: Default::default(),
            received_links: vec![],
            session: Some(Session {
                id: uuid::Uuid::nil(),
                generation,
                owner: ReplicaRef {
                    id: "r".into(),
                    incarnation: 1,
                },
                state: SessionState::Ready,
            }),
            generation,
            departure: None,
            updated_at,
        }
    }

    fn mk_template(node: &str, last: &str, generation: u64) -> Template {
        let name = Name {
            components: ["o".into(), "n".into(), last.into()],
            id: None,
        };
        Template {
            name,
            node: node.into(),
            generation,
            seq: 1,
            updated_at: 0,
        }
    }

    #[test]
    fn announcements_of_departed_nodes_go() {
        let templates = [mk_template("g/gone", "x", 1), mk_template("g/n", "y", 1)];
        let mut gone = mk_node("g/gone", 3, 0);
        gone.session = None;
        let nodes = [gone, mk_node("g/n", 1, 0)];
        let p = plan(&nodes, &templates, 100);
        assert_eq!(p.drop_all, [("g/gone".to_string(), 3)]);
        assert_eq!(p.live, [templates[1].clone()]);
    }

    /// Regression: derivation read the nodes, then the templates; a node
    /// that registered and announced in between was unknown to the first
    /// look and all its announcements were dropped for good (the names
    /// were never routed). Only what the plan saw may go.
    #[test]
    fn a_node_unknown_to_the_plan_keeps_its_announcements() {
        let templates = [mk_template("g/new", "x", 7)];
        let p = plan(&[], &templates, 100);
        assert!(p.drop_all.is_empty(), "{p:?}");
        assert!(p.live.is_empty(), "not routed until the node is seen");
    }

    #[test]
    fn unreplayed_announcements_go_once_the_node_is_quiet() {
        let templates = [mk_template("g/n", "old", 1), mk_template("g/n", "new", 2)];
        let nodes = [mk_node("g/n", 2, 100)];
        let early = plan(&nodes, &templates, 101);
        assert!(early.drop_older.is_empty(), "it may still replay");
        assert_eq!(early.live.len(), 2);
        assert_eq!(early.recheck_in, Some(DEPARTURE_GRACE_SECS));
        let later = plan(&nodes, &templates, 101 + DEPARTURE_GRACE_SECS);
        assert_eq!(later.drop_older, [("g/n".to_string(), 2)]);
        assert_eq!(later.live, [templates[1].clone()]);
    }
}
