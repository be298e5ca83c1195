use super::*;

fn mk_run(id: &str, incarnation: u64) -> ReplicaRef {
    ReplicaRef {
        id: id.into(),
        incarnation,
    }
}

fn mk_node(owner: &ReplicaRef, generation: u64) -> NodeView {
    NodeView {
        owner: owner.clone(),
        generation,
        ready: true,
    }
}

fn mk_link(id: &str, from: (&str, &str), to: (&str, &str), claim: (u64, u64)) -> LinkView {
    LinkView {
        id: id.into(),
        source_node: from.1.into(),
        source_group: from.0.into(),
        dest_group: to.0.into(),
        dest_node: Some(to.1.into()),
        applied: true,
        claim: Some(Claim {
            source_generation: claim.0,
            dest_generation: claim.1,
        }),
    }
}

fn mk_route(source: &str, name: &str, dest: &str, link: &str) -> RouteView {
    RouteView {
        key: (source.into(), name.into(), dest.into()),
        link_id: link.into(),
        applied: true,
    }
}

/// Nodes a/n0 (on cp-0) and b/n0 (on cp-1), linked a→b, one route.
fn mk_view() -> View {
    let (r0, r1) = (mk_run("cp-0", 1), mk_run("cp-1", 1));
    View {
        epoch: 3,
        leader: Some(r0.clone()),
        nodes: [
            ("a/n0".to_string(), mk_node(&r0, 10)),
            ("b/n0".to_string(), mk_node(&r1, 11)),
        ]
        .into(),
        links: vec![mk_link("l1", ("a", "a/n0"), ("b", "b/n0"), (10, 11))],
        routes: vec![mk_route("a/n0", "org/ns/x", "b/n0", "l1")],
    }
}

#[test]
fn the_same_fleet_under_a_new_term_is_converged() {
    let before = mk_view();
    let mut now = mk_view();
    now.epoch = 4;
    let v = judge(&before, &now, &[], true);
    assert!(v.converged && v.intact(), "{v:?}");
}

#[test]
fn without_a_new_term_a_deposing_fault_is_not_converged() {
    let v = judge(&mk_view(), &mk_view(), &[], true);
    assert!(!v.converged);
    assert!(v.intact());
}

#[test]
fn a_node_still_on_the_killed_replica_is_not_ready_again() {
    let before = mk_view();
    let v = judge(&before, &before, &[mk_run("cp-1", 1)], false);
    assert_eq!(v.nodes_lost, vec!["b/n0".to_string()]);
    assert!(!v.converged);
}

#[test]
fn a_moved_node_must_claim_its_link_again() {
    let before = mk_view();
    let mut now = mk_view();
    now.nodes
        .insert("b/n0".into(), mk_node(&mk_run("cp-2", 1), 12));
    let v = judge(&before, &now, &[mk_run("cp-1", 1)], false);
    assert!(!v.converged && v.intact(), "{v:?}");
    now.links[0].claim = Some(Claim {
        source_generation: 10,
        dest_generation: 12,
    });
    let v = judge(&before, &now, &[mk_run("cp-1", 1)], false);
    assert!(v.converged, "{v:?}");
}

#[test]
fn a_pair_relinked_under_another_id_is_replaced_not_lost() {
    let before = mk_view();
    let mut now = mk_view();
    now.links[0].id = "l2".into();
    now.routes[0].link_id = "l2".into();
    let v = judge(&before, &now, &[], false);
    assert_eq!((v.links_lost, v.links_replaced), (0, 1));
    assert!(!v.converged);
}

#[test]
fn a_pair_without_a_link_and_a_route_gone_are_lost() {
    let before = mk_view();
    let mut now = mk_view();
    now.links.clear();
    now.routes.clear();
    let v = judge(&before, &now, &[], false);
    assert_eq!((v.links_lost, v.routes_lost), (1, 1));
    assert!(!v.intact());
}

#[test]
fn a_second_link_for_a_pair_and_a_second_route_are_duplicates() {
    let before = mk_view();
    let mut now = mk_view();
    now.links
        .push(mk_link("l9", ("a", "a/n0"), ("b", "b/n0"), (10, 11)));
    now.routes.push(mk_route("a/n0", "org/ns/x", "b/n0", "l9"));
    let v = judge(&before, &now, &[], false);
    assert_eq!((v.links_duplicated, v.routes_duplicated), (1, 1));
    assert!(!v.intact() && !v.converged);
}

#[test]
fn a_fleet_with_work_in_flight_is_not_settled() {
    let mut v = mk_view();
    assert_eq!(v.settled(), Ok(()));
    v.routes[0].applied = false;
    assert!(v.settled().is_err());
    let mut v = mk_view();
    v.leader = None;
    assert_eq!(v.settled(), Err("no leader".into()));
}
