//! Link planning and route expansion on hand-built facts.

use std::collections::BTreeSet;

use super::links::{LinkPlan, active_groups, plan};
use super::routes::{changes, expand};
use super::stored::StoredRoutes;
use super::topology::{SegmentGraph, resolve};
use crate::config::{AdjacencyEntry, SegmentConfig, TopologyConfig};
use crate::store::model::{
    ConnectionDetail, Link, LinkStatus, Name, NodeRecord, ReplicaRef, Route, Session, SessionState,
    Template,
};

pub(crate) fn mk_node(group: &str, node: &str) -> NodeRecord {
    NodeRecord {
        id: format!("{group}/{node}"),
        group: Some(group.into()),
        connection_details: vec![ConnectionDetail {
            endpoint: format!("{node}.{group}:1"),
            external_endpoint: Some(format!("{node}.{group}:2")),
            ..Default::default()
        }],
        reported_connections: vec![],
        reported_routes: vec![],
        revision: Default::default(),
        received_links: vec![],
        session: Some(Session {
            id: uuid::Uuid::nil(),
            generation: 1,
            owner: ReplicaRef {
                id: "r".into(),
                incarnation: 1,
            },
            state: SessionState::Ready,
        }),
        generation: 1,
        departure: None,
        updated_at: 0,
    }
}

pub(super) fn mk_graphs(mode: &TopologyConfig, nodes: &[NodeRecord]) -> Vec<SegmentGraph> {
    let groups: BTreeSet<String> = nodes.iter().filter_map(|n| n.group.clone()).collect();
    resolve(mode, &[], &groups)
}

pub(super) fn mesh() -> TopologyConfig {
    TopologyConfig::Links(vec![AdjacencyEntry {
        group: "*".into(),
        neighbors: vec!["*".into()],
    }])
}

fn chain(groups: &[&str]) -> TopologyConfig {
    TopologyConfig::Links(
        groups
            .windows(2)
            .map(|w| AdjacencyEntry {
                group: w[0].into(),
                neighbors: vec![w[1].into()],
            })
            .collect(),
    )
}

pub(super) fn ids() -> impl FnMut() -> String {
    let mut n = 0;
    move || {
        n += 1;
        format!("l-{n}")
    }
}

/// The plan's live links, owned.
pub(super) fn owned(live: &[std::borrow::Cow<'_, Link>]) -> Vec<Link> {
    live.iter().map(|l| l.clone().into_owned()).collect()
}

/// Ends `id`'s session as a crash stamped `at` (its grace runs from then).
pub(super) fn crash(nodes: &mut [NodeRecord], id: &str, at: i64) {
    use crate::store::model::{Departure, DepartureKind};
    let node = nodes.iter_mut().find(|n| n.id == id).expect("the node");
    node.session = None;
    node.departure = Some(Departure {
        generation: node.generation,
        kind: DepartureKind::Crash,
    });
    node.updated_at = at;
}

/// Applies a plan as the store would: its links, and its spent claims.
pub(super) fn apply(p: &LinkPlan<'_>, nodes: &mut [NodeRecord], stored: &mut Vec<Link>) {
    for l in &p.upserts {
        stored.retain(|s| s.link_id != l.link_id);
        stored.push(l.clone());
    }
    stored.retain(|s| !p.hard_deletes.iter().any(|r| r.link_id == s.link_id));
    for (node, link) in &p.consumed_claims {
        for n in nodes.iter_mut().filter(|n| &n.id == node) {
            n.received_links.retain(|l| l != link);
            n.reported_connections
                .retain(|c| !(c.incoming && &c.link_id == link));
        }
    }
}

/// Plans until nothing changes, claiming every link as a real destination
/// would, and returns the live links.
pub(super) fn converge(nodes: &mut [NodeRecord], mode: &TopologyConfig) -> Vec<Link> {
    let graphs = mk_graphs(mode, nodes);
    let mut stored: Vec<Link> = Vec::new();
    let mut new_id = ids();
    for _ in 0..5 {
        let before = stored.clone();
        let p = plan(nodes, &before, &graphs, 0, &mut new_id);
        apply(&p, nodes, &mut stored);
        for l in stored.iter().filter(|l| !l.deleted && l.claim.is_none()) {
            if let Some(n) = nodes.iter_mut().find(|n| {
                Some(&l.dest_endpoint) == n.connection_details[0].external_endpoint.as_ref()
            }) {
                n.received_links.push(l.link_id.clone());
            }
        }
    }
    stored.into_iter().filter(|l| !l.deleted).collect()
}

pub(super) fn mk_name(last: &str) -> Name {
    Name {
        components: ["org".into(), "ns".into(), last.into()],
        id: None,
    }
}

pub(super) fn mk_template(node: &str, seq: u64) -> Template {
    Template {
        name: mk_name("app"),
        node: node.into(),
        generation: 1,
        seq,
        updated_at: 0,
    }
}

#[test]
fn full_mesh_of_three_groups_plans_three_links() {
    let nodes = vec![mk_node("a", "n1"), mk_node("b", "n1"), mk_node("c", "n1")];
    let p = plan(&nodes, &[], &mk_graphs(&mesh(), &nodes), 7, &mut ids());
    assert_eq!(p.upserts.len(), 3);
    let pairs: Vec<(&str, &str)> = p
        .live
        .iter()
        .map(|l| (l.source_group.as_str(), l.dest_group.as_str()))
        .collect();
    assert_eq!(
        pairs,
        [("a", "b"), ("a", "c"), ("b", "c")],
        "the later-named group is the destination"
    );
    let l = &p.live[0];
    assert_eq!(
        (l.status, l.dest_node.as_deref(), l.updated_at),
        (LinkStatus::Pending, None, 7)
    );
    assert_eq!(l.dest_endpoint, "n1.b:2");
    assert!(l.config_data.contains(&l.link_id));
}

#[test]
fn a_group_joining_a_linked_mesh_dials_the_linked_groups() {
    let mut nodes = vec![mk_node("b", "n1"), mk_node("c", "n1")];
    let first = plan(&nodes, &[], &mk_graphs(&mesh(), &nodes), 0, &mut ids());
    let stored = owned(&first.live);
    nodes.extend([mk_node("a", "n1"), mk_node("d", "n1")]);
    let graphs = mk_graphs(&mesh(), &nodes);
    let p = plan(&nodes, &stored, &graphs, 0, &mut ids());
    let new: BTreeSet<(&str, &str)> = p
        .upserts
        .iter()
        .map(|l| (l.source_group.as_str(), l.dest_group.as_str()))
        .collect();
    let expected = [("a", "b"), ("a", "c"), ("a", "d"), ("d", "b"), ("d", "c")];
    assert_eq!(
        new,
        BTreeSet::from(expected),
        "newcomers dial the linked groups, each other by name"
    );
    assert!(
        p.upserts
            .iter()
            .all(|l| l.source_node != "b/n1" && l.source_node != "c/n1"),
        "the linked gateways are commanded nothing new"
    );
}

#[test]
fn a_link_written_by_an_earlier_version_gets_todays_config_once() {
    let nodes = vec![mk_node("a", "n1"), mk_node("b", "n1")];
    let graphs = mk_graphs(&mesh(), &nodes);
    let mut stored = plan(&nodes, &[], &graphs, 0, &mut ids()).upserts;
    let current = stored[0].config_data.clone();
    stored[0].config_data = current.replace("\"max_attempts\":3", "\"max_attempts\":4294967295");
    assert_ne!(
        stored[0].config_data, current,
        "the test must change the config"
    );
    let again = plan(&nodes, &stored, &graphs, 5, &mut ids());
    assert_eq!(again.upserts.len(), 1);
    let refreshed = &again.upserts[0];
    assert_eq!(
        refreshed.link_id, stored[0].link_id,
        "the same link, not a new one"
    );
    assert_eq!(refreshed.config_data, current);
    let settled = plan(&nodes, &again.upserts, &graphs, 6, &mut ids());
    assert!(settled.upserts.is_empty());
}

#[test]
fn planning_again_changes_nothing() {
    let nodes = vec![mk_node("a", "n1"), mk_node("b", "n1")];
    let graphs = mk_graphs(&mesh(), &nodes);
    let first = plan(&nodes, &[], &graphs, 0, &mut ids());
    let second = plan(&nodes, &first.upserts, &graphs, 0, &mut ids());
    assert!(second.upserts.is_empty() && second.hard_deletes.is_empty());
    assert_eq!(second.live, first.live);
}

#[test]
fn a_claim_applies_the_link() {
    let mut nodes = vec![mk_node("a", "n1"), mk_node("b", "n1")];
    let live = converge(&mut nodes, &mesh());
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].status, LinkStatus::Applied);
    assert_eq!(live[0].dest_node.as_deref(), Some("b/n1"));
}

#[test]
fn a_departed_source_moves_to_a_sibling_and_is_claimed_again() {
    let mut nodes = vec![mk_node("a", "n1"), mk_node("a", "n2"), mk_node("b", "n1")];
    let live = converge(&mut nodes, &mesh());
    let source = live[0].source_node.clone();
    nodes.retain(|n| n.id != source);
    // A late report of the old connection: it must not claim the moved link.
    let dest = nodes.iter_mut().find(|n| n.id == "b/n1").unwrap();
    dest.received_links.push(live[0].link_id.clone());
    let p = plan(&nodes, &live, &mk_graphs(&mesh(), &nodes), 0, &mut ids());
    let moved = &p.upserts[0];
    assert_eq!(moved.link_id, live[0].link_id, "same link id");
    assert_ne!(moved.source_node, source);
    assert_eq!(
        (moved.status, moved.dest_node.as_deref()),
        (LinkStatus::Pending, None)
    );
    assert_eq!(
        p.consumed_claims,
        [("b/n1".to_string(), moved.link_id.clone())]
    );
}

/// Regression (a property test on Postgres): a link whose source left
/// while its claimed destination was within its crash grace was moved to
/// a sibling, unclaimed, towards the crashed node's endpoint; the next
/// derivation would delete it, but nothing made one look at the pair.
/// Planned once, the link goes towards a ready node, and planning again
/// changes nothing.
#[test]
fn a_moved_link_whose_destination_crashed_is_recreated_at_once() {
    let mut nodes = vec![
        mk_node("a", "n1"),
        mk_node("a", "n2"),
        mk_node("b", "n1"),
        mk_node("b", "n2"),
    ];
    let mut stored = converge(&mut nodes, &mesh());
    let (source, dest) = (
        stored[0].source_node.clone(),
        stored[0].dest_node.clone().expect("claimed"),
    );
    nodes.retain(|n| n.id != source);
    crash(&mut nodes, &dest, 100);
    let graphs = mk_graphs(&mesh(), &nodes);
    let before = stored.clone();
    let p = plan(&nodes, &before, &graphs, 101, &mut || "l-new".into());
    assert_eq!(p.live.len(), 1);
    let link = p.live[0].clone().into_owned();
    assert_eq!(link.link_id, "l-new", "recreated, not moved");
    assert!(!link.dest_endpoint.contains(dest.split('/').nth(1).unwrap()));
    apply(&p, &mut nodes, &mut stored);
    let again = plan(&nodes, &stored, &graphs, 101, &mut ids());
    assert!(
        again.upserts.is_empty() && again.hard_deletes.is_empty(),
        "{again:?}"
    );
}

#[test]
fn a_departed_destination_is_deleted_and_recreated_towards_a_sibling() {
    let mut nodes = vec![mk_node("a", "n1"), mk_node("b", "n1"), mk_node("b", "n2")];
    let live = converge(&mut nodes, &mesh());
    let dest = live[0].dest_node.clone().unwrap();
    nodes.retain(|n| n.id != dest);
    let p = plan(&nodes, &live, &mk_graphs(&mesh(), &nodes), 0, &mut || {
        "l-new".into()
    });
    let tomb: Vec<_> = p.upserts.iter().filter(|l| l.deleted).collect();
    assert_eq!(tomb.len(), 1, "the old link is deleted on its source");
    assert_eq!(p.live.len(), 1);
    assert_eq!(p.live[0].link_id, "l-new");
    assert!(
        !p.live[0]
            .dest_endpoint
            .contains(dest.split('/').nth(1).unwrap())
    );
}

#[test]
fn the_last_node_of_a_group_takes_its_links_with_it() {
    let mut nodes = vec![mk_node("a", "n1"), mk_node("b", "n1"), mk_node("c", "n1")];
    let live = converge(&mut nodes, &mesh());
    nodes.retain(|n| n.group.as_deref() != Some("a"));
    let p = plan(&nodes, &live, &mk_graphs(&mesh(), &nodes), 0, &mut ids());
    assert_eq!(p.hard_deletes.len(), 2, "links a sourced go with a's node");
    assert_eq!(p.live.len(), 1);
    assert!(p.upserts.is_empty());
}

#[test]
fn links_towards_a_departed_group_are_soft_deleted_on_their_source() {
    let mut nodes = vec![mk_node("a", "n1"), mk_node("b", "n1")];
    let live = converge(&mut nodes, &mesh());
    nodes.retain(|n| n.group.as_deref() != Some("b"));
    let p = plan(&nodes, &live, &mk_graphs(&mesh(), &nodes), 0, &mut ids());
    assert_eq!(p.upserts.len(), 1);
    assert!(p.upserts[0].deleted);
}

#[test]
fn star_spokes_never_link_each_other() {
    let star = TopologyConfig::Links(vec![AdjacencyEntry {
        group: "hub".into(),
        neighbors: vec!["*".into()],
    }]);
    let nodes = vec![mk_node("hub", "n1"), mk_node("x", "n1"), mk_node("y", "n1")];
    let p = plan(&nodes, &[], &mk_graphs(&star, &nodes), 0, &mut ids());
    let pairs: BTreeSet<(String, String)> = p
        .live
        .iter()
        .map(|l| (l.source_group.clone(), l.dest_group.clone()))
        .collect();
    assert_eq!(
        pairs,
        BTreeSet::from([("hub".into(), "x".into()), ("hub".into(), "y".into())])
    );
}

#[test]
fn pairs_without_external_endpoints_are_reported_unlinkable() {
    let mut nodes = vec![mk_node("a", "n1"), mk_node("b", "n1")];
    for n in &mut nodes {
        n.connection_details[0].external_endpoint = None;
    }
    let p = plan(&nodes, &[], &mk_graphs(&mesh(), &nodes), 0, &mut ids());
    assert!(p.live.is_empty());
    assert_eq!(p.unlinkable, [("a".to_string(), "b".to_string())]);
}

#[test]
fn duplicate_links_of_a_pair_are_reduced_to_one() {
    let mut nodes = vec![mk_node("a", "n1"), mk_node("b", "n1")];
    let live = converge(&mut nodes, &mesh());
    let mut twin = live[0].clone();
    twin.link_id = "z-twin".into();
    let stored = vec![live[0].clone(), twin];
    let p = plan(&nodes, &stored, &mk_graphs(&mesh(), &nodes), 0, &mut ids());
    assert_eq!(p.live.len(), 1);
    assert_eq!(p.upserts.iter().filter(|l| l.deleted).count(), 1);
}

/// Four groups of one node in a chain a-b-c-d, linked.
fn linked_chain() -> (
    Vec<NodeRecord>,
    Vec<Link>,
    Vec<SegmentGraph>,
    BTreeSet<String>,
) {
    let mut nodes: Vec<_> = ["a", "b", "c", "d"]
        .iter()
        .map(|g| mk_node(g, "n1"))
        .collect();
    let mode = chain(&["a", "b", "c", "d"]);
    let live = converge(&mut nodes, &mode);
    let graphs = mk_graphs(&mode, &nodes);
    let m = active_groups(&nodes, 0);
    (nodes, live, graphs, m)
}

#[test]
fn chain_routes_go_up_to_the_first_announcer_and_down_to_later_ones() {
    let (nodes, live, graphs, m) = linked_chain();
    assert_eq!(live.len(), 3);
    let first = expand(&nodes, &m, &live, &[mk_template("a/n1", 1)], &graphs, 0);
    let hops: BTreeSet<String> = first.values().map(|r| r.source_node.clone()).collect();
    assert_eq!(
        hops,
        BTreeSet::from(["b/n1".into(), "c/n1".into(), "d/n1".into()]),
        "upward from every other group"
    );
    let both = [mk_template("a/n1", 1), mk_template("d/n1", 2)];
    let routes = expand(&nodes, &m, &live, &both, &graphs, 0);
    assert_eq!(routes.len(), 6, "three up, three down");
    let on_a: Vec<_> = routes
        .values()
        .filter(|r| r.source_node == "a/n1")
        .collect();
    assert_eq!(on_a.len(), 1);
    assert_eq!(on_a[0].dest_node, "d/n1");
}

#[test]
fn route_changes_are_what_expansion_adds_and_drops() {
    let (nodes, live, graphs, m) = linked_chain();
    let both = [mk_template("a/n1", 1), mk_template("d/n1", 2)];
    let desired = expand(&nodes, &m, &live, &both, &graphs, 0);
    // Stored: half of the desired routes, and one nobody wants any more.
    let mut kept: Vec<Route> = desired.values().step_by(2).cloned().collect();
    let mut old = kept[0].clone();
    old.id = "b/n1|old|org/ns/x/-".into();
    old.source_node = "b/n1".into();
    old.name = mk_name("x");
    kept.push(old);
    let stored = StoredRoutes::new(&kept);
    let c = changes(&nodes, &m, &live, &both, &graphs, &stored, 0);
    let missing: Vec<_> = desired
        .values()
        .filter(|r| stored.get(&r.id).is_none())
        .cloned()
        .collect();
    assert_eq!(c.put, missing, "the desired routes not stored, by id");
    assert_eq!(c.put.len(), 3);
    assert_eq!(c.gone, [("b/n1|old|org/ns/x/-".into(), "b/n1".into())]);
}

#[test]
fn routes_wait_for_a_claimed_link() {
    let nodes = vec![mk_node("a", "n1"), mk_node("b", "n1")];
    let graphs = mk_graphs(&mesh(), &nodes);
    let p = plan(&nodes, &[], &graphs, 0, &mut ids());
    let routes = expand(
        &nodes,
        &active_groups(&nodes, 0),
        &p.live,
        &[mk_template("a/n1", 1)],
        &graphs,
        0,
    );
    assert!(routes.is_empty());
}

#[test]
fn group_segments_keep_customers_apart() {
    let mode = TopologyConfig::Segments(vec![SegmentConfig {
        name: "seg-$group".into(),
        links: vec![AdjacencyEntry {
            group: "cloud".into(),
            neighbors: vec!["$group".into()],
        }],
    }]);
    let mut nodes = vec![
        mk_node("cloud", "n1"),
        mk_node("ca", "n1"),
        mk_node("cb", "n1"),
    ];
    let live = converge(&mut nodes, &mode);
    assert_eq!(live.len(), 2);
    let graphs = mk_graphs(&mode, &nodes);
    let routes = expand(
        &nodes,
        &active_groups(&nodes, 0),
        &live,
        &[mk_template("ca/n1", 1)],
        &graphs,
        0,
    );
    let sources: Vec<_> = routes.values().map(|r| r.source_node.as_str()).collect();
    assert_eq!(sources, ["cloud/n1"], "cb never learns of ca's name");
}

#[test]
fn a_destination_that_just_crashed_keeps_its_link_for_the_grace() {
    use super::links::DEPARTURE_GRACE_SECS;
    let mut nodes = vec![mk_node("a", "n1"), mk_node("b", "n1"), mk_node("b", "n2")];
    let live = converge(&mut nodes, &mesh());
    let dest = live[0].dest_node.clone().unwrap();
    crash(&mut nodes, &dest, 100);
    let graphs = mk_graphs(&mesh(), &nodes);
    let at = |now: i64| plan(&nodes, &live, &graphs, now, &mut || "l-new".into());
    let within = at(101);
    assert!(
        within.upserts.is_empty(),
        "kept while it may be reconnecting"
    );
    assert_eq!(within.recheck_in, Some(DEPARTURE_GRACE_SECS));
    // Regression (the rolling-restart drill with 3.4.6 nodes): stamps are
    // whole seconds, floored, so a crash at 100.98 and a plan at 103.14
    // read three seconds apart after 2.16 s; the link was recreated
    // towards the sibling 45 ms before its gateway came back.
    let edge = at(100 + DEPARTURE_GRACE_SECS);
    assert!(edge.upserts.is_empty(), "kept for the whole grace");
    assert_eq!(edge.recheck_in, Some(1));
    let after = at(101 + DEPARTURE_GRACE_SECS);
    assert_eq!(
        after.live[0].link_id, "l-new",
        "recreated once the grace is over"
    );
    assert_eq!(after.recheck_in, None);
}

/// The nodes at each group's ends of `links`, by group.
fn gateways_of(links: &[Link]) -> std::collections::BTreeMap<String, BTreeSet<String>> {
    let mut out = std::collections::BTreeMap::<String, BTreeSet<String>>::new();
    for l in links {
        let (node, _) = l.dest_endpoint.split_once('.').unwrap();
        let dest = format!("{}/{node}", l.dest_group);
        let ends = [
            (&l.source_group, l.source_node.clone()),
            (&l.dest_group, dest),
        ];
        for (g, n) in ends {
            out.entry(g.clone()).or_default().insert(n);
        }
    }
    out
}

/// Issue 12: chosen per group pair, a group's links spread over as many
/// gateways as it had ready nodes when they were planned, each costing its
/// own commands, so the same fleet cost up to seven times the commands
/// when its nodes registered before the first derivation.
#[test]
fn a_group_carries_all_its_links_on_one_gateway() {
    let mk_group = |g: &str| {
        (0..5)
            .map(|i| mk_node(g, &format!("n{i}")))
            .collect::<Vec<_>>()
    };
    let mut nodes: Vec<NodeRecord> = ["a", "b", "c"].iter().flat_map(|g| mk_group(g)).collect();
    let before = converge(&mut nodes, &mesh());
    let first = gateways_of(&before);
    assert!(first.values().all(|ns| ns.len() == 1), "{first:?}");
    // A group arriving later links to the gateways the others have.
    nodes.extend(mk_group("d"));
    let p = plan(&nodes, &before, &mk_graphs(&mesh(), &nodes), 0, &mut ids());
    let after = gateways_of(&owned(&p.live));
    assert_eq!(p.live.len(), 6);
    assert!(after.values().all(|ns| ns.len() == 1), "{after:?}");
    for (g, ns) in &first {
        assert_eq!(&after[g], ns, "group {g} kept its gateway");
    }
}
