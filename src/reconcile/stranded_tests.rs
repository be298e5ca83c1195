use super::*;
use crate::reconcile::diff::tests::{REMOTE, mk_conn, mk_link, mk_live_route, mk_route};
use crate::reconcile::diff::wire_route;
use crate::reconcile::diff::{Live, decide};
use crate::reconcile::node::link_answers;

/// What a 2.0.0-alpha.2 node answers to such a removal.
const REFUSAL: &str = "Failed to unsubscribe: subscription id not found: 9774471574581886120";

fn refusal(route: &sb::Route, message: &str) -> sb::RouteAck {
    sb::RouteAck {
        route: Some(route.clone()),
        success: message.is_empty(),
        error_msg: message.into(),
    }
}

#[test]
fn only_an_unknown_subscription_id_counts_as_stranded() {
    assert!(is_stranded(REFUSAL));
    assert!(!is_stranded("Connection with link_id l-1 not found"));
    assert!(!is_stranded("subscription ack timed out"));
}

#[test]
fn refused_removals_name_the_links_of_stranded_refusals_the_step_asked_for() {
    let (mine, other) = (
        mk_route("r1", "b/n1", "l-1", "x"),
        mk_route("r2", "b/n1", "l-2", "y"),
    );
    let mut step = Step::default();
    let asked = wire_route(&mine.name, &mine.link_id);
    let timed_out = wire_route(&other.name, &other.link_id);
    step.command.routes_to_delete = vec![asked.clone(), timed_out.clone()];
    let never_asked = wire_route(&mine.name, "l-9");
    let ack = sb::ConfigurationCommandAck {
        routes_status: vec![
            refusal(&asked, REFUSAL),
            refusal(&timed_out, "subscription ack timed out"),
            refusal(&never_asked, REFUSAL),
        ],
        ..Default::default()
    };
    let links: Vec<String> = refused_removals(&step, &ack).into_iter().collect();
    assert_eq!(links, ["l-1"]);
}

#[test]
fn a_flagged_link_the_node_dials_and_holds_is_deleted() {
    let node = "a/n1";
    let links = [
        mk_link("l-1", node, false),
        mk_link("l-2", node, false),
        mk_link("l-3", "z/n9", false),
    ];
    let routes = [
        mk_route("r1", node, "l-1", "x"),
        mk_route("r2", node, "l-2", "y"),
    ];
    let conns = [mk_conn("l-1", false, REMOTE), mk_conn("l-2", false, REMOTE)];
    let held = [mk_live_route("x", "l-1"), mk_live_route("y", "l-2")];
    let live = Live {
        connections: &conns,
        routes: &held,
    };
    let mut step = decide(node, &links, &routes, &live, false);
    assert!(!step.has_command(), "everything is held: {step:?}");
    // l-3 is flagged too, but another node dials it.
    step.drop_links(node, &links, |l| l == "l-1" || l == "l-3");
    assert_eq!(step.dropping, ["l-1"]);
    assert_eq!(step.command.connections_to_delete, ["l-1"]);
    assert!(
        step.command.connections_to_create.is_empty(),
        "created at the next look"
    );
    assert!(step.deleting.is_empty(), "the link is no tombstone");
    assert!(step.has_command());
}

#[test]
fn links_being_created_or_deleted_are_not_dropped() {
    let node = "a/n1";
    let links = [mk_link("l-1", node, false), mk_link("l-2", node, true)];
    let conns = [mk_conn("l-2", false, REMOTE)];
    let live = Live {
        connections: &conns,
        routes: &[],
    };
    let mut step = decide(node, &links, &[], &live, false);
    let before = step.command.clone();
    step.drop_links(node, &links, |_| true);
    assert!(step.dropping.is_empty());
    assert_eq!(step.command, before, "l-1 is created anyway, l-2 deleted");
}

/// Dropped (to be created again) or disowned (another source's now), the
/// link's row must outlive the deletion of its connection.
#[test]
fn a_dropped_or_disowned_link_is_neither_answered_nor_gone() {
    let dropped = Step {
        dropping: vec!["l-1".into()],
        ..Default::default()
    };
    let disowned = Step {
        disowned: vec!["l-1".into()],
        ..Default::default()
    };
    for step in [dropped, disowned] {
        a_deletion_that_keeps_the_link(&step);
    }
}

fn a_deletion_that_keeps_the_link(step: &Step) {
    let ack = |ok: bool, msg: &str| sb::ConfigurationCommandAck {
        connections_status: vec![sb::ConnectionAck {
            link_id: "l-1".into(),
            success: ok,
            error_msg: msg.into(),
        }],
        ..Default::default()
    };
    for (ok, msg) in [(true, ""), (false, "Connection with link_id l-1 not found")] {
        let mut failures = Vec::new();
        let (answers, gone) = link_answers(step, &ack(ok, msg), &mut failures);
        assert!(answers.is_empty() && gone.is_empty() && failures.is_empty());
    }
    let mut failures = Vec::new();
    let (answers, gone) = link_answers(step, &ack(false, "boom"), &mut failures);
    assert!(answers.is_empty() && gone.is_empty());
    assert_eq!(failures, ["delete l-1: boom"]);
}

#[test]
fn flags_hold_for_the_source_s_session_and_are_cleared() {
    let (first, second) = (Uuid::from_u128(1), Uuid::from_u128(2));
    let s = Stranded::default();
    assert!(s.flag("l-1", first));
    assert!(!s.flag("l-1", first), "already flagged");
    assert!(s.is_flagged("l-1", first));
    s.clear("l-1");
    assert!(!s.is_flagged("l-1", first));
    assert!(s.flag("l-1", first));
    assert!(
        !s.is_flagged("l-1", second),
        "the source registered again: it dropped the link itself"
    );
    assert!(!s.is_flagged("l-1", first), "and the flag is gone");
    assert!(
        s.flag("l-1", second),
        "a new session's refusal flags it again"
    );
}
