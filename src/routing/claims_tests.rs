//! Claims checked against the ends' current registrations: links whose
//! destination moved are recreated, links whose end registered again wait
//! for a new claim, and planning on the result changes nothing.

use super::links::{DEPARTURE_GRACE_SECS, LinkPlan, active_groups, plan};
use super::plan_tests::{apply, converge, mesh, mk_graphs, mk_node, mk_template, owned};
use super::routes::expand;
use crate::store::model::{
    Claim, Departure, DepartureKind, Link, LinkStatus, NodeRecord, ReportedConnection, SessionState,
};

/// a/n1 linked to b/n1, claimed under the first sessions of both.
fn linked() -> (Vec<NodeRecord>, Link) {
    let mut nodes = vec![mk_node("a", "n1"), mk_node("b", "n1")];
    let live = converge(&mut nodes, &mesh());
    assert_eq!(live.len(), 1);
    (nodes, live[0].clone())
}

fn node<'a>(nodes: &'a mut [NodeRecord], id: &str) -> &'a mut NodeRecord {
    nodes.iter_mut().find(|n| n.id == id).expect("node")
}

/// A new session of `id`, as a registration records it.
fn register_again(nodes: &mut [NodeRecord], id: &str, generation: u64) {
    let n = node(nodes, id);
    n.generation = generation;
    if let Some(s) = n.session.as_mut() {
        s.generation = generation;
    }
    n.received_links.clear();
}

fn plan_on<'s>(nodes: &[NodeRecord], stored: &'s [Link], now: i64) -> LinkPlan<'s> {
    plan(nodes, stored, &mk_graphs(&mesh(), nodes), now, &mut || {
        "l-new".into()
    })
}

/// Applies `p` and plans again: nothing may change.
fn assert_settled(p: &LinkPlan, nodes: &mut [NodeRecord], stored: &[Link], now: i64) {
    let mut stored = stored.to_vec();
    apply(p, nodes, &mut stored);
    let again = plan_on(nodes, &stored, now);
    assert_eq!(
        (&again.upserts, &again.hard_deletes, &again.consumed_claims),
        (&vec![], &vec![], &vec![]),
        "planning again changes nothing"
    );
    assert_eq!(again.live, p.live);
}

#[test]
fn a_claim_records_the_sessions_of_both_ends() {
    let (_, link) = linked();
    assert_eq!(link.status, LinkStatus::Applied);
    assert_eq!(
        link.claim,
        Some(Claim {
            source_generation: 1,
            dest_generation: 1
        })
    );
}

#[test]
fn a_destination_back_on_another_endpoint_gets_a_new_link_there() {
    let (mut nodes, link) = linked();
    register_again(&mut nodes, "b/n1", 2);
    node(&mut nodes, "b/n1").connection_details[0].external_endpoint = Some("n1.b:9".into());
    let p = plan_on(&nodes, std::slice::from_ref(&link), 0);
    let tomb: Vec<&Link> = p.upserts.iter().filter(|l| l.deleted).collect();
    assert_eq!(tomb.len(), 1, "{:?}", p.upserts);
    assert_eq!(tomb[0].link_id, link.link_id);
    assert!(
        tomb[0].status_msg.contains("moved"),
        "{}",
        tomb[0].status_msg
    );
    assert_eq!(p.live.len(), 1);
    let new = &p.live[0];
    assert_eq!(new.link_id, "l-new");
    assert_eq!(new.dest_endpoint, "n1.b:9");
    assert!(new.config_data.contains("n1.b:9"));
    assert_eq!(new.source_node, link.source_node, "same gateways");
    assert_eq!((new.dest_node.as_deref(), new.claim), (None, None));
    assert_settled(&p, &mut nodes, std::slice::from_ref(&link), 0);
}

#[test]
fn a_moved_destination_still_registering_is_left_until_ready() {
    let (mut nodes, link) = linked();
    register_again(&mut nodes, "b/n1", 2);
    let moved = node(&mut nodes, "b/n1");
    moved.connection_details[0].external_endpoint = Some("n1.b:9".into());
    if let Some(s) = moved.session.as_mut() {
        s.state = SessionState::Registering;
    }
    let p = plan_on(&nodes, std::slice::from_ref(&link), 0);
    assert!(p.upserts.iter().all(|l| !l.deleted), "not recreated yet");
    assert_eq!(p.live[0].link_id, link.link_id);
}

#[test]
fn a_source_that_registered_again_waits_for_a_new_claim_and_keeps_its_routes() {
    let (mut nodes, link) = linked();
    let announced = [mk_template("b/n1", 1)];
    let graphs = mk_graphs(&mesh(), &nodes);
    let groups = active_groups(&nodes, 0);
    let before = expand(
        &nodes,
        &groups,
        std::slice::from_ref(&link),
        &announced,
        &graphs,
        0,
    );
    assert_eq!(before.len(), 1);
    register_again(&mut nodes, "a/n1", 2);
    let p = plan_on(&nodes, std::slice::from_ref(&link), 0);
    assert_eq!(p.upserts.len(), 1);
    let waiting = &p.upserts[0];
    assert_eq!(waiting.link_id, link.link_id, "the same link");
    assert_eq!(waiting.status, LinkStatus::Connecting);
    assert_eq!(waiting.dest_node, link.dest_node, "still its gateway");
    assert_eq!(waiting.claim, None);
    let after = expand(&nodes, &groups, &p.live, &announced, &graphs, 0);
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>(),
        "routes kept"
    );
    assert_settled(&p, &mut nodes, std::slice::from_ref(&link), 0);
}

#[test]
fn a_destination_that_registered_again_without_a_fact_waits_for_a_new_claim() {
    let (mut nodes, link) = linked();
    register_again(&mut nodes, "b/n1", 2);
    let p = plan_on(&nodes, std::slice::from_ref(&link), 0);
    assert_eq!(p.upserts.len(), 1);
    let waiting = &p.upserts[0];
    assert_eq!(
        (waiting.status, waiting.dest_node.as_deref(), waiting.claim),
        (LinkStatus::Connecting, Some("b/n1"), None)
    );
    assert_settled(&p, &mut nodes, std::slice::from_ref(&link), 0);
}

#[test]
fn a_fact_claims_again_under_the_current_sessions_and_is_spent() {
    let (mut nodes, link) = linked();
    register_again(&mut nodes, "a/n1", 4);
    let waiting = owned(&plan_on(&nodes, std::slice::from_ref(&link), 0).live);
    register_again(&mut nodes, "b/n1", 5);
    node(&mut nodes, "b/n1")
        .reported_connections
        .push(ReportedConnection {
            link_id: link.link_id.clone(),
            incoming: true,
        });
    let p = plan_on(&nodes, &waiting, 0);
    assert_eq!(p.upserts.len(), 1);
    let claimed = &p.upserts[0];
    assert_eq!(claimed.status, LinkStatus::Applied);
    assert_eq!(
        claimed.claim,
        Some(Claim {
            source_generation: 4,
            dest_generation: 5
        })
    );
    assert_eq!(
        p.consumed_claims,
        [("b/n1".to_string(), link.link_id.clone())]
    );
    assert_settled(&p, &mut nodes, &waiting, 0);
}

#[test]
fn a_fact_for_a_standing_claim_is_spent_without_a_change() {
    let (mut nodes, link) = linked();
    node(&mut nodes, "b/n1")
        .received_links
        .push(link.link_id.clone());
    let p = plan_on(&nodes, std::slice::from_ref(&link), 0);
    assert!(p.upserts.is_empty(), "{:?}", p.upserts);
    assert_eq!(
        p.consumed_claims,
        [("b/n1".to_string(), link.link_id.clone())]
    );
    assert_settled(&p, &mut nodes, std::slice::from_ref(&link), 0);
}

#[test]
fn a_node_within_its_grace_does_not_outdate_the_claim() {
    let (mut nodes, link) = linked();
    // Its second session came and went before the leader derived from it.
    let gone = node(&mut nodes, "b/n1");
    gone.session = None;
    gone.generation = 2;
    gone.departure = Some(Departure {
        generation: 2,
        kind: DepartureKind::Crash,
    });
    gone.updated_at = 100;
    let p = plan_on(&nodes, std::slice::from_ref(&link), 101);
    assert!(p.upserts.is_empty(), "{:?}", p.upserts);
    assert_eq!(owned(&p.live), std::slice::from_ref(&link));
    assert_eq!(p.recheck_in, Some(DEPARTURE_GRACE_SECS));
}

#[test]
fn a_claim_that_predates_claims_is_made_again() {
    let (mut nodes, mut link) = linked();
    // Written by a release that kept no claims: claimed, but by whom?
    link.claim = None;
    let p = plan_on(&nodes, std::slice::from_ref(&link), 0);
    assert_eq!(p.upserts[0].status, LinkStatus::Connecting);
    assert_settled(&p, &mut nodes, std::slice::from_ref(&link), 0);
}
