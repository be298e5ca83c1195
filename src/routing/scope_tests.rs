//! Plans of what changed against plans of everything: a scope leaves out
//! only what would not change.

use std::collections::BTreeSet;

use super::fleet::Fleet;
use super::links::{LinkScope, plan_in};
use super::plan_tests::{converge, mesh, mk_graphs, mk_node, mk_template};
use super::routes::{NameScope, RouteFacts, Router, realized_changes};
use super::templates::Announcements;
use crate::store::model::{Departure, DepartureKind, Link, NodeRecord};

/// Four fully meshed groups of two nodes each, converged.
fn mesh_of_four() -> (Vec<NodeRecord>, Vec<Link>) {
    let mut nodes: Vec<NodeRecord> = ["a", "b", "c", "d"]
        .into_iter()
        .flat_map(|g| [mk_node(g, "n1"), mk_node(g, "n2")])
        .collect();
    let live = converge(&mut nodes, &mesh());
    assert_eq!(live.len(), 6);
    (nodes, live)
}

fn pairs(links: &[Link]) -> BTreeSet<(String, String)> {
    links
        .iter()
        .map(|l| crate::store::model::edge(&l.source_group, &l.dest_group))
        .collect()
}

#[test]
fn planning_the_changed_groups_plans_what_planning_everything_does() {
    let (mut nodes, live) = mesh_of_four();
    // The gateway of b crashed long ago: its links move to its sibling.
    let gateway = live
        .iter()
        .find(|l| l.source_group == "b")
        .map(|l| l.source_node.clone())
        .expect("b sources a link");
    let n = nodes.iter_mut().find(|n| n.id == gateway).expect("node");
    n.session = None;
    n.departure = Some(Departure {
        generation: 1,
        kind: DepartureKind::Crash,
    });
    let fleet = Fleet::new(nodes.iter().cloned());
    let graphs = mk_graphs(&mesh(), &nodes);
    let active = fleet.active_groups(100);
    let ids = || {
        let mut n = 0;
        move || {
            n += 1;
            format!("new-{n}")
        }
    };
    let whole = plan_in(
        &fleet,
        &active,
        &live,
        &graphs,
        100,
        LinkScope::All,
        &mut ids(),
    );
    let groups = BTreeSet::from(["b".to_string()]);
    let none = BTreeSet::new();
    let scope = LinkScope::Some {
        groups: &groups,
        pairs: &none,
    };
    let narrow = plan_in(&fleet, &active, &live, &graphs, 100, scope, &mut ids());
    assert!(!whole.upserts.is_empty(), "the gateway's links move");
    assert_eq!(narrow.upserts, whole.upserts);
    assert_eq!(narrow.hard_deletes, whole.hard_deletes);
    assert_eq!(narrow.consumed_claims, whole.consumed_claims);
    let owned = |p: &super::links::LinkPlan<'_>| {
        let mut v: Vec<Link> = p.live.iter().map(|l| l.clone().into_owned()).collect();
        v.sort_by(|x, y| x.link_id.cmp(&y.link_id));
        v
    };
    assert_eq!(owned(&narrow), owned(&whole), "the same live links");
    // Only b's three pairs were planned.
    let planned: Vec<_> = narrow
        .planned
        .iter()
        .map(|(a, b)| format!("{a}-{b}"))
        .collect();
    assert_eq!(planned, ["a-b", "b-c", "b-d"]);
    assert_eq!(pairs(&live).len(), whole.planned.len());
}

#[test]
fn a_link_changes_for_routes_when_its_gateways_do() {
    let (_, live) = mesh_of_four();
    let mut moved = live.clone();
    moved[0].source_node = format!("{}-sibling", moved[0].source_node);
    let mut restatused = moved.clone();
    restatused[1].status_msg = "answered".into();
    let changed = realized_changes(&live, &restatused);
    let expected = crate::store::model::edge(&live[0].source_group, &live[0].dest_group);
    assert_eq!(changed, BTreeSet::from([expected]));
    assert!(realized_changes(&live, &live).is_empty());
}

#[test]
fn only_names_whose_trees_ride_a_changed_link_are_looked_at() {
    let (nodes, live) = mesh_of_four();
    let fleet = Fleet::new(nodes.iter().cloned());
    let graphs = mk_graphs(&mesh(), &nodes);
    let active = fleet.active_groups(0);
    // "app" is announced in a: its tree is the star around a.
    let announcements = Announcements::new([mk_template("a/n1", 1)]);
    let facts = RouteFacts {
        fleet: &fleet,
        active: &active,
        announcements: &announcements,
        counts: &|_, _| true,
        graphs: &graphs,
        trees: &super::trees::Trees::default(),
    };
    let mut router = Router::new(facts, &live);
    let edge = |a: &str, b: &str| BTreeSet::from([(a.to_string(), b.to_string())]);
    assert_eq!(router.names_over(&edge("b", "c")), BTreeSet::new());
    let over_a = router.names_over(&edge("a", "c"));
    assert_eq!(over_a.len(), 1, "{over_a:?}");
    // A scope of no names changes nothing; all of them, every route.
    let stored = super::stored::StoredRoutes::default();
    let none = BTreeSet::new();
    assert!(
        router
            .changes(&stored, NameScope::Some(&none), 0)
            .put
            .is_empty()
    );
    let all = router.changes(&stored, NameScope::All, 0);
    let by_name = router.changes(&stored, NameScope::Some(&over_a), 0);
    assert_eq!(all.put.len(), 3, "one route per other group");
    assert_eq!(by_name, all);
}
