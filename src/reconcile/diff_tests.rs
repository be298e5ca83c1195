use super::*;
use crate::store::model::LinkStatus;

pub(in crate::reconcile) fn mk_link(id: &str, source: &str, deleted: bool) -> Link {
    Link {
        link_id: id.into(),
        source_node: source.into(),
        source_group: "a".into(),
        dest_group: "b".into(),
        dest_node: Some("b/n1".into()),
        dest_endpoint: "h:1".into(),
        config_data: format!("{{\"link_id\":\"{id}\"}}"),
        status: LinkStatus::Applied,
        status_msg: String::new(),
        deleted,
        updated_at: 0,
        claim: None,
    }
}

pub(in crate::reconcile) fn mk_name(last: &str) -> Name {
    Name {
        components: ["o".into(), "n".into(), last.into()],
        id: None,
    }
}

pub(in crate::reconcile) fn mk_route(id: &str, source: &str, link: &str, last: &str) -> Route {
    Route {
        id: id.into(),
        source_node: source.into(),
        dest_node: "c/n1".into(),
        link_id: link.into(),
        name: mk_name(last),
        status: RouteStatus::Pending,
        status_msg: String::new(),
        updated_at: 0,
    }
}

pub(in crate::reconcile) fn mk_conn(
    link: &str,
    incoming: bool,
    kind: sb::ConnectionType,
) -> sb::ConnectionEntry {
    sb::ConnectionEntry {
        link_id: Some(link.into()),
        direction: if incoming { 1 } else { 0 },
        connection_type: kind as i32,
        ..Default::default()
    }
}

pub(in crate::reconcile) fn mk_live_route(last: &str, link: &str) -> sb::RouteEntry {
    sb::RouteEntry {
        name: Some(names::to_wire(&mk_name(last))),
        connections: vec![mk_conn(link, false, sb::ConnectionType::Remote)],
    }
}

pub(in crate::reconcile) const REMOTE: sb::ConnectionType = sb::ConnectionType::Remote;

#[test]
fn missing_links_are_created_and_held_ones_left_alone() {
    let links = [mk_link("l-1", "a/n1", false), mk_link("l-2", "a/n1", false)];
    let conns = [mk_conn("l-2", false, REMOTE)];
    let step = decide(
        "a/n1",
        &links,
        &[],
        &Live {
            connections: &conns,
            routes: &[],
        },
        false,
    );
    assert_eq!(step.creating, ["l-1"]);
    assert_eq!(
        step.command.connections_to_create[0].config_data,
        links[0].config_data
    );
    assert!(step.command.connections_to_delete.is_empty());
}

#[test]
fn tombstones_are_deleted_when_held_and_dropped_when_not() {
    let links = [mk_link("l-1", "a/n1", true), mk_link("l-2", "a/n1", true)];
    let conns = [mk_conn("l-1", false, REMOTE)];
    let step = decide(
        "a/n1",
        &links,
        &[],
        &Live {
            connections: &conns,
            routes: &[],
        },
        false,
    );
    assert_eq!(step.command.connections_to_delete, ["l-1"]);
    assert_eq!(step.gone, ["l-2"]);
}

/// The node came back after its link moved to a sibling: it still dials
/// the link, which is now the sibling's. Its connection goes, the link is
/// not forgotten, with orphan detection off as on.
#[test]
fn a_link_of_another_source_is_deleted_from_the_node_not_forgotten() {
    let moved = mk_link("l-1", "a/n2", false);
    let conns = [mk_conn("l-1", false, REMOTE), mk_conn("l-2", true, REMOTE)];
    for orphans in [false, true] {
        let live = Live {
            connections: &conns,
            routes: &[],
        };
        let step = decide("a/n1", std::slice::from_ref(&moved), &[], &live, orphans);
        assert_eq!(
            step.command.connections_to_delete,
            ["l-1"],
            "orphans {orphans}"
        );
        assert_eq!(step.disowned, ["l-1"]);
        assert!(step.deleting.is_empty() && step.gone.is_empty(), "{step:?}");
        assert!(step.command.connections_to_create.is_empty());
    }
}

#[test]
fn unknown_connections_are_orphans_only_with_detection_on() {
    let conns = [
        mk_conn("stranger", false, REMOTE),
        mk_conn("peer", false, sb::ConnectionType::Peer),
    ];
    let live = Live {
        connections: &conns,
        routes: &[],
    };
    assert!(!decide("a/n1", &[], &[], &live, false).has_command());
    let step = decide("a/n1", &[], &[], &live, true);
    assert_eq!(
        step.command.connections_to_delete,
        ["stranger"],
        "peers are never touched"
    );
}

#[test]
fn routes_are_set_over_usable_links_and_deferred_otherwise() {
    let links = [mk_link("l-1", "b/n9", false), mk_link("l-2", "b/n9", false)];
    let conns = [mk_conn("l-1", true, REMOTE)];
    let routes = [
        mk_route("r-1", "b/n1", "l-1", "x"),
        mk_route("r-2", "b/n1", "l-2", "y"),
    ];
    let step = decide(
        "b/n1",
        &links,
        &routes,
        &Live {
            connections: &conns,
            routes: &[],
        },
        false,
    );
    assert_eq!(
        step.command.routes_to_set.len(),
        1,
        "over the incoming connection"
    );
    assert_eq!(step.setting.values().collect::<Vec<_>>(), ["r-1"]);
    assert_eq!(step.deferred, 1);
}

#[test]
fn a_deferred_link_takes_its_routes_with_it() {
    let links = [mk_link("l-1", "a/n1", false), mk_link("l-2", "a/n1", false)];
    let routes = [
        mk_route("r-1", "a/n1", "l-1", "x"),
        mk_route("r-2", "a/n1", "l-2", "y"),
        mk_route("r-3", "a/n1", "l-2", "z"),
    ];
    let live = Live {
        connections: &[],
        routes: &[],
    };
    let mut step = decide("a/n1", &links, &routes, &live, false);
    assert_eq!(step.creating, ["l-1", "l-2"]);
    step.defer_links(&["l-2".to_string()]);
    assert_eq!(step.creating, ["l-1"]);
    let created: Vec<&str> = step
        .command
        .connections_to_create
        .iter()
        .map(|c| c.link_id.as_str())
        .collect();
    assert_eq!(created, ["l-1"]);
    assert_eq!(step.command.routes_to_set.len(), 1);
    assert_eq!(step.setting.values().collect::<Vec<_>>(), ["r-1"]);
    assert_eq!(step.deferred, 2);
    assert!(step.has_command());
}

#[test]
fn held_routes_are_marked_and_stale_ones_removed() {
    let links = [mk_link("l-1", "a/n1", false)];
    let conns = [mk_conn("l-1", false, REMOTE)];
    let live_routes = [
        mk_live_route("x", "l-1"),
        mk_live_route("stale", "l-1"),
        mk_live_route("foreign", "l-9"),
    ];
    let routes = [mk_route("r-1", "a/n1", "l-1", "x")];
    let live = Live {
        connections: &conns,
        routes: &live_routes,
    };
    let step = decide("a/n1", &links, &routes, &live, false);
    assert_eq!(step.already, ["r-1"]);
    let deleted: Vec<_> = step
        .command
        .routes_to_delete
        .iter()
        .filter_map(|r| names::from_wire(r.name.as_ref()?).ok())
        .collect();
    assert_eq!(
        deleted,
        [mk_name("stale")],
        "routes over unknown links are orphans"
    );
    let with_orphans = decide("a/n1", &links, &routes, &live, true);
    assert_eq!(with_orphans.command.routes_to_delete.len(), 2);
}

#[test]
fn a_node_with_nothing_desired_still_loses_its_stale_routes() {
    let links = [mk_link("l-1", "a/n1", true)];
    let conns = [mk_conn("l-1", false, REMOTE)];
    let live_routes = [mk_live_route("x", "l-1")];
    let step = decide(
        "a/n1",
        &links,
        &[],
        &Live {
            connections: &conns,
            routes: &live_routes,
        },
        false,
    );
    assert_eq!(step.command.routes_to_delete.len(), 1);
    assert_eq!(step.command.connections_to_delete, ["l-1"]);
}

#[test]
fn not_found_is_recognised_in_the_nodes_wordings() {
    assert!(is_not_found("Connection with link_id l-1 not found"));
    assert!(is_not_found("connection not found"));
    assert!(!is_not_found("injected failure"));
}
