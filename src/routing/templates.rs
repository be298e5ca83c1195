//! Which announcements count, and which can go.
//!
//! A node that vanished keeps its announcements through the departure
//! grace (it may only be re-opening its control stream, and replays them
//! when it registers again). After the grace, a departed node's
//! announcements go; a returned node's announcements of an earlier session
//! that it did not replay go once it has been quiet for the grace.

use std::collections::{BTreeMap, BTreeSet};

use super::links::grace_left;
use crate::store::model::{NodeRecord, Template};

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
    /// Announcements routes are expanded for.
    pub live: Vec<Template>,
    /// `(node, generation)`: the node departed; its announcements up to
    /// and including `generation` (its record's latest) go.
    pub drop_all: Vec<(String, u64)>,
    /// `(node, generation)`: announcements of earlier generations go.
    pub drop_older: Vec<(String, u64)>,
    /// Look again after this many seconds.
    pub recheck_in: Option<i64>,
}

/// Plans the announcements given the nodes that hold links (see
/// [`super::links::holding`]).
pub fn plan(
    nodes: &[NodeRecord],
    templates: &[Template],
    holding: &BTreeSet<&str>,
    now: i64,
) -> TemplatePlan {
    let by_id: BTreeMap<&str, &NodeRecord> = nodes.iter().map(|n| (n.id.as_str(), n)).collect();
    let announcers: BTreeSet<&str> = templates.iter().map(|t| t.node.as_str()).collect();
    let mut out = TemplatePlan::default();
    let mut older_dropped = BTreeMap::new();
    for id in announcers {
        let Some(node) = by_id.get(id) else {
            continue;
        };
        if !holding.contains(id) {
            out.drop_all.push((id.to_string(), node.generation));
            continue;
        }
        let stale = templates
            .iter()
            .any(|t| t.node == id && t.generation < node.generation);
        if !stale || node.ready_session().is_none() {
            continue;
        }
        match grace_left(now, node.updated_at) {
            None => {
                out.drop_older.push((id.to_string(), node.generation));
                older_dropped.insert(id, node.generation);
            }
            Some(left) => out.recheck_in = Some(out.recheck_in.map_or(left, |r| r.min(left))),
        }
    }
    out.live = templates
        .iter()
        .filter(|t| holding.contains(t.node.as_str()))
        .filter(|t| {
            older_dropped
                .get(t.node.as_str())
                .is_none_or(|g| t.generation >= *g)
        })
        .cloned()
        .collect();
    out
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
        let nodes = [mk_node("g/gone", 3, 0), mk_node("g/n", 1, 0)];
        let p = plan(&nodes, &templates, &BTreeSet::from(["g/n"]), 100);
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
        let p = plan(&[], &templates, &BTreeSet::new(), 100);
        assert!(p.drop_all.is_empty(), "{p:?}");
        assert!(p.live.is_empty(), "not routed until the node is seen");
    }

    #[test]
    fn unreplayed_announcements_go_once_the_node_is_quiet() {
        let templates = [mk_template("g/n", "old", 1), mk_template("g/n", "new", 2)];
        let nodes = [mk_node("g/n", 2, 100)];
        let holding = BTreeSet::from(["g/n"]);
        let early = plan(&nodes, &templates, &holding, 101);
        assert!(early.drop_older.is_empty(), "it may still replay");
        assert_eq!(early.live.len(), 2);
        assert_eq!(early.recheck_in, Some(DEPARTURE_GRACE_SECS));
        let later = plan(&nodes, &templates, &holding, 101 + DEPARTURE_GRACE_SECS);
        assert_eq!(later.drop_older, [("g/n".to_string(), 2)]);
        assert_eq!(later.live, [templates[1].clone()]);
    }
}
