//! Departures, crashes, gateway failover and reconnect storms with
//! simulated fleets: after each, the nodes hold exactly one link per
//! allowed group pair and every announced name is reachable from every
//! group over what the nodes hold.

mod common;

use std::collections::BTreeSet;

use common::scenario::{
    assert_links_point_at, mk_cp, mk_fleet, mk_fleet_sized, mk_links, reopen_stream,
    respawn_all_elsewhere, wait_links, wait_reachable, wait_routes, wait_routes_gone,
};
use common::{wait_count, wait_for};
use slim_cp::server::Running;
use slim_cp::sim::SimFleet;
use slim_cp::store::model::{Link, RouteMark, RouteStatus};

const MESH: &[(&str, &[&str])] = &[("*", &["*"])];

/// The group pairs the links join.
fn group_pairs(links: &[Link]) -> BTreeSet<(String, String)> {
    links
        .iter()
        .map(|l| slim_cp::store::model::edge(&l.source_group, &l.dest_group))
        .collect()
}

fn only_link(links: &[Link]) -> &Link {
    assert_eq!(links.len(), 1, "{links:?}");
    &links[0]
}

/// a (two nodes) and b (one), `app` announced in b and reachable from a.
async fn two_groups(a_nodes: usize, b_nodes: usize) -> (Running, SimFleet, Link) {
    let cp = mk_cp(mk_links(MESH)).await;
    let fleet = mk_fleet_sized(&cp, &[("a", a_nodes), ("b", b_nodes)]).await;
    let link = only_link(&wait_links(&cp, &fleet, 1).await).clone();
    (cp, fleet, link)
}

on_both_backends! {
/// Scenario: the source-side gateway crashes; its outgoing link moves to
/// its sibling under the same id, is claimed again, and traffic flows.
async fn source_gateway_crash_moves_the_link_to_a_sibling() {
    let (cp, fleet, link) = two_groups(2, 1).await;
    fleet
        .node("b/n0")
        .unwrap()
        .announce(["org", "ns", "app"])
        .unwrap();
    wait_reachable(&fleet, "app", &["b"]).await;
    fleet.node(&link.source_node).unwrap().crash();
    let moved = only_link(&wait_links(&cp, &fleet, 1).await).clone();
    assert_eq!(moved.link_id, link.link_id, "same link, new source");
    assert_ne!(moved.source_node, link.source_node);
    assert_eq!(
        moved.dest_node, link.dest_node,
        "claimed again by the destination"
    );
    wait_reachable(&fleet, "app", &["b"]).await;
}
}

on_both_backends! {
/// Scenario: the destination-side gateway crashes; the link is recreated
/// towards its sibling's endpoint and the old one leaves the source.
async fn destination_gateway_crash_recreates_the_link_to_a_sibling() {
    let (cp, fleet, link) = two_groups(1, 2).await;
    fleet
        .node("a/n0")
        .unwrap()
        .announce(["org", "ns", "app"])
        .unwrap();
    wait_reachable(&fleet, "app", &["a"]).await;
    let dest = link.dest_node.clone().unwrap();
    fleet.node(&dest).unwrap().crash();
    let new = only_link(&wait_links(&cp, &fleet, 1).await).clone();
    assert_ne!(new.link_id, link.link_id);
    assert_ne!(new.dest_node.as_deref(), Some(dest.as_str()));
    let source_links: Vec<_> = fleet
        .node("a/n0")
        .unwrap()
        .connections()
        .into_iter()
        .filter_map(|c| c.link_id)
        .collect();
    assert_eq!(
        source_links,
        std::slice::from_ref(&new.link_id),
        "the old link was deleted on the source"
    );
    wait_reachable(&fleet, "app", &["a"]).await;
}
}

on_both_backends! {
/// Scenario: the destination gateway crashes and, within its grace, a name
/// announced beside it makes the source reconciled while its link is gone.
/// The source is not asked to dial the dead endpoint (a real node would
/// spend its whole dial backoff on it before reading its next command);
/// the link waits and moves to the sibling when the grace ends.
async fn a_source_never_dials_a_destination_that_has_no_session() {
    let (cp, fleet, link) = two_groups(1, 2).await;
    let dest = link.dest_node.clone().unwrap();
    let sibling = ["b/n0", "b/n1"]
        .into_iter()
        .find(|n| *n != dest)
        .unwrap();
    let deferred = || {
        cp.metrics
            .reconciles
            .get_or_create(&[("outcome", "deferred")])
            .get()
    };
    let before = deferred();
    fleet.node(&dest).unwrap().crash();
    fleet
        .node(sibling)
        .unwrap()
        .announce(["org", "ns", "late"])
        .unwrap();
    wait_for("the source's reconcile to defer the route over the old link", || async {
        let over_old = cp
            .store
            .routes_sourced("a/n0")
            .await
            .map_err(|e| e.to_string())?
            .iter()
            .any(|r| r.link_id == link.link_id && r.name.components[2] == "late");
        match over_old && deferred() > before {
            true => Ok(()),
            false => Err(format!("route over the old link: {over_old}")),
        }
    })
    .await;
    let new = only_link(&wait_links(&cp, &fleet, 1).await).clone();
    assert_eq!(new.dest_node.as_deref(), Some(sibling));
    wait_reachable(&fleet, "late", &["b"]).await;
    assert_eq!(
        fleet.node("a/n0").unwrap().failed_dials(),
        0,
        "the source was asked to dial the dead gateway"
    );
}
}

on_both_backends! {
/// Scenario: the store no longer knows that a gateway holds a route (its
/// status is Pending again, as when a database crash loses a record's
/// asynchronous commit; the crash also breaks the leader's wake-up
/// listener, whose reconnect asks for a full resync), and the gateway's
/// next reconcile sends a command for a new name. The route it already
/// holds is recorded Applied with that command's answers, in the same
/// write.
async fn a_route_already_held_is_recorded_with_the_next_commands_answers() {
    let (cp, fleet, _) = two_groups(1, 1).await;
    let announcer = fleet.node("b/n0").unwrap();
    announcer.announce(["org", "ns", "app"]).unwrap();
    wait_routes(&cp, &fleet, "app", &["a/n0"]).await;
    let forgotten: Vec<RouteMark> = (cp.store.list_routes().await.unwrap().into_iter())
        .map(|r| RouteMark {
            id: r.id,
            status: RouteStatus::Pending,
            message: String::new(),
        })
        .collect();
    assert_eq!(forgotten.len(), 1);
    cp.store.mark_routes(&forgotten).await.unwrap();
    cp.inbox.resync();
    announcer.announce(["org", "ns", "more"]).unwrap();
    wait_routes(&cp, &fleet, "more", &["a/n0"]).await;
    let routes = cp.store.list_routes().await.unwrap();
    let app = routes.iter().find(|r| r.id == forgotten[0].id).unwrap();
    assert_eq!(app.status, RouteStatus::Applied, "{routes:?}");
}
}

on_both_backends! {
/// Scenario: an announcer crashes — its routes leave every node — then
/// returns, and the routes come back.
async fn announcer_crash_then_return() {
    let cp = mk_cp(mk_links(MESH)).await;
    let fleet = mk_fleet(&cp, &["a", "b", "c"], 1).await;
    wait_links(&cp, &fleet, 3).await;
    let announcer = fleet.node("a/n0").unwrap();
    announcer.announce(["org", "ns", "svc"]).unwrap();
    wait_routes(&cp, &fleet, "svc", &["b/n0", "c/n0"]).await;
    announcer.crash();
    wait_routes_gone(&cp, &fleet, "svc").await;
    assert!(cp.store.list_templates().await.unwrap().is_empty());
    announcer.restart().unwrap();
    wait_links(&cp, &fleet, 3).await;
    wait_routes(&cp, &fleet, "svc", &["b/n0", "c/n0"]).await;
    wait_reachable(&fleet, "svc", &["a"]).await;
}
}

on_both_backends! {
/// Scenario: the last node of a group leaves; the group's links leave the
/// store and every node.
async fn last_node_of_a_group_takes_its_links() {
    let cp = mk_cp(mk_links(MESH)).await;
    let fleet = mk_fleet(&cp, &["a", "b", "c"], 1).await;
    wait_links(&cp, &fleet, 3).await;
    let resp = fleet.node("b/n0").unwrap().deregister().await.unwrap();
    assert!(resp.success);
    let links = wait_links(&cp, &fleet, 1).await;
    assert!(
        links
            .iter()
            .all(|l| l.source_group != "b" && l.dest_group != "b")
    );
    wait_for("only the a-c link held, at both ends", || async {
        let held: usize = ["a/n0", "c/n0"]
            .iter()
            .map(|n| fleet.node(n).unwrap().connections().len())
            .sum();
        if held == 2 { Ok(()) } else { Err(format!("{held} connections held")) }
    })
    .await;
    wait_for("b forgotten", || async {
        match cp.store.get_node("b/n0").await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(r) => Err(format!("{r:?}")),
        }
    })
    .await;
}
}

on_both_backends! {
/// Scenario: deregistration forgets the node; a crash keeps it as not
/// connected; both take their routes and links with them.
async fn deregistration_versus_crash() {
    let cp = mk_cp(mk_links(MESH)).await;
    let fleet = mk_fleet(&cp, &["a", "b", "c"], 1).await;
    wait_links(&cp, &fleet, 3).await;
    fleet.node("b/n0").unwrap().deregister().await.unwrap();
    fleet.node("c/n0").unwrap().crash();
    wait_for("departures", || async {
        let b = cp.store.get_node("b/n0").await.map_err(|e| e.to_string())?;
        let c = cp.store.get_node("c/n0").await.map_err(|e| e.to_string())?;
        let links = cp.store.list_links().await.map_err(|e| e.to_string())?;
        if b.is_none() && c.is_some_and(|c| !c.is_connected()) && links.is_empty() {
            Ok(())
        } else {
            Err(format!("{links:?}"))
        }
    })
    .await;
    assert!(fleet.node("a/n0").unwrap().connections().is_empty());
}
}

on_both_backends! {
/// Scenario: a destination node comes back on a different endpoint; the
/// link follows it.
async fn reconnect_on_a_new_endpoint_is_relinked() {
    let (cp, mut fleet, link) = two_groups(1, 1).await;
    fleet.node("b/n0").unwrap().crash();
    wait_count("link gone", 0, || async { cp.store.list_links().await.map(|v| v.len()) }).await;
    let moved = common::scenario::respawn_elsewhere(&mut fleet, "b/n0").await;
    let new = only_link(&wait_links(&cp, &fleet, 1).await).clone();
    assert_ne!(new.link_id, link.link_id);
    assert_eq!(new.dest_endpoint, moved);
}
}

on_both_backends! {
/// Scenario: every node crashes and reconnects at once; the fleet ends with
/// exactly one link per allowed pair and names reachable again.
async fn whole_fleet_crash_and_reconnect() {
    let cp = mk_cp(mk_links(MESH)).await;
    let fleet = mk_fleet(&cp, &["a", "b", "c", "d"], 3).await;
    wait_links(&cp, &fleet, 6).await;
    fleet
        .node("a/n1")
        .unwrap()
        .announce(["org", "ns", "x"])
        .unwrap();
    wait_reachable(&fleet, "x", &["a"]).await;
    for n in fleet.nodes() {
        n.crash();
    }
    for n in fleet.nodes() {
        n.restart().unwrap();
    }
    assert!(fleet.wait_all_registered(common::PATIENCE).await);
    let links = wait_links(&cp, &fleet, 6).await;
    let pairs = group_pairs(&links);
    assert_eq!(pairs.len(), 6, "one link per pair, no duplicates");
    wait_reachable(&fleet, "x", &["a"]).await;
    assert_eq!(fleet.lost_count(), 0);
}
}

on_both_backends! {
/// Scenario: every node dies and comes back at once on another endpoint,
/// within the departure grace, so the links survive the crash and must
/// follow the nodes: each is re-pointed at its destination's new endpoint,
/// claimed again, and the name is reachable again over what nodes hold.
async fn every_node_restarts_at_once_on_another_endpoint_within_the_grace() {
    let cp = mk_cp(mk_links(MESH)).await;
    let mut fleet = mk_fleet(&cp, &["a", "b", "c", "d"], 3).await;
    wait_links(&cp, &fleet, 6).await;
    let name = ["org", "ns", "x"];
    fleet.node("a/n1").unwrap().announce(name).unwrap();
    wait_reachable(&fleet, "x", &["a"]).await;
    let crashed = std::time::Instant::now();
    fleet.crash_all();
    let moved = respawn_all_elsewhere(&mut fleet).await;
    eprintln!("every node back after {:?}", crashed.elapsed());
    // A new process has no local apps yet: the app subscribes again.
    fleet.node("a/n1").unwrap().announce(name).unwrap();
    let links = wait_links(&cp, &fleet, 6).await;
    assert_links_point_at(&links, &moved);
    let pairs = group_pairs(&links);
    assert_eq!(pairs.len(), 6, "one link per pair");
    wait_reachable(&fleet, "x", &["a"]).await;
    assert_eq!(fleet.lost_count(), 0);
}
}

on_both_backends! {
/// Scenario: the control plane closes a node's stream (it only re-opens
/// its control stream); it keeps its incoming link without recreation.
async fn stream_reconnect_keeps_incoming_links() {
    let (cp, fleet, link) = two_groups(1, 1).await;
    let dest = link.dest_node.clone().unwrap();
    reopen_stream(&cp, &fleet, &dest).await;
    let after = only_link(&wait_links(&cp, &fleet, 1).await).clone();
    assert_eq!(after.link_id, link.link_id, "not recreated");
}
}

on_both_backends! {
/// Regression (reference: a claim that survived a reconnect did not
/// re-expand routes): after the destination re-opens its stream, names
/// behind it are reachable again.
async fn routes_follow_a_claim_that_survived_a_reconnect() {
    let (cp, fleet, link) = two_groups(1, 1).await;
    let dest = link.dest_node.clone().unwrap();
    fleet
        .node(&dest)
        .unwrap()
        .announce(["org", "ns", "behind"])
        .unwrap();
    wait_reachable(&fleet, "behind", &["b"]).await;
    reopen_stream(&cp, &fleet, &dest).await;
    wait_reachable(&fleet, "behind", &["b"]).await;
}
}

on_both_backends! {
/// Regression (reference: registration raced deregistration and crash of
/// the same node, leaving links stuck mid-claim): a node that registers,
/// crashes and comes back many times in quick succession ends with one
/// Applied link, held by both ends.
async fn register_and_disconnect_races_leave_no_stuck_link() {
    let (cp, fleet, _) = two_groups(1, 2).await;
    let flapper = fleet.node("b/n1").unwrap();
    for i in 0..20 {
        flapper.crash();
        if i % 3 == 0 {
            tokio::task::yield_now().await;
        }
        flapper.restart().unwrap();
        if i % 2 == 0 {
            assert!(flapper.wait_registered(common::PATIENCE).await);
        }
    }
    assert!(fleet.wait_all_registered(common::PATIENCE).await);
    let link = only_link(&wait_links(&cp, &fleet, 1).await).clone();
    assert!(link.dest_node.is_some(), "claimed, not stuck mid-claim");
    assert_eq!(fleet.lost_count(), 0);
}
}

on_both_backends! {
/// Regression (reference: route expansion after a registration used links
/// from before the registration ensured them): names announced at once
/// by freshly registered nodes converge, every time.
async fn announcements_racing_link_creation_converge() {
    for round in 0..3 {
        let cp = mk_cp(mk_links(MESH)).await;
        let fleet = mk_fleet(&cp, &["a", "b", "c"], 1).await;
        fleet
            .node("c/n0")
            .unwrap()
            .announce(["org", "ns", "early"])
            .unwrap();
        wait_links(&cp, &fleet, 3).await;
        wait_reachable(&fleet, "early", &["c"]).await;
        assert_eq!(fleet.lost_count(), 0, "round {round}");
    }
}
}

on_both_backends! {
/// Regression (reference: duplicate links for one group pair at 200 nodes
/// in 2 of 3 runs): 20 groups of 10 nodes, full mesh — exactly 190 links.
async fn two_hundred_nodes_give_exactly_one_link_per_pair() {
    let cp = mk_cp(mk_links(MESH)).await;
    let groups: Vec<String> = (0..20).map(|g| format!("g{g:02}")).collect();
    let sized: Vec<(&str, usize)> = groups.iter().map(|g| (g.as_str(), 10)).collect();
    let fleet = mk_fleet_sized(&cp, &sized).await;
    let links = wait_links(&cp, &fleet, 190).await;
    let pairs = group_pairs(&links);
    assert_eq!(pairs.len(), 190);
    let held: usize = fleet.nodes().iter().map(|n| n.connections().len()).sum();
    assert_eq!(
        held, 380,
        "each link once at its source and once at its destination"
    );
}
}

on_both_backends! {
/// Scenario: a node registers still dialing a link another node now
/// sources (it was the link's source before the link moved while it was
/// away past the grace). Its reconcile deletes that connection from it,
/// and the link, answered as deleted there, stays its new source's.
async fn a_node_still_dialing_a_moved_link_is_told_to_drop_it() {
    use common::{RawNode, mk_register};
    use slim_cp::proto::sb::{self, control_message::Payload};
    let (cp, _fleet, link) = two_groups(1, 1).await;
    let mut stale = RawNode::open(&cp).await.expect("stream opens");
    let group = link.source_group.clone();
    assert!(stale.register(mk_register(&group, "stale")).await.success);
    let held = sb::ConnectionEntry {
        link_id: Some(link.link_id.clone()),
        direction: sb::ConnectionDirection::Outgoing as i32,
        connection_type: sb::ConnectionType::Remote as i32,
        ..Default::default()
    };
    let (id, cmd) = loop {
        let msg = stale.recv().await.expect("stream open").expect("a message");
        match msg.payload {
            Some(Payload::ConnectionListRequest(_)) => {
                let reply = sb::ConnectionListResponse {
                    original_message_id: msg.message_id,
                    entries: vec![held.clone()],
                    done: true,
                };
                stale.send(Payload::ConnectionListResponse(reply)).await;
            }
            Some(Payload::ConfigCommand(cmd)) => break (msg.message_id, cmd),
            _ => stale.answer(msg).await,
        }
    };
    assert_eq!(cmd.connections_to_delete, std::slice::from_ref(&link.link_id));
    assert!(cmd.connections_to_create.is_empty(), "{cmd:?}");
    let converged = || cp.metrics.reconciles.get_or_create(&[("outcome", "converged")]).get();
    let before = converged();
    let ack = sb::ConfigurationCommandAck {
        original_message_id: id,
        connections_status: vec![sb::ConnectionAck {
            link_id: link.link_id.clone(),
            success: true,
            error_msg: String::new(),
        }],
        ..Default::default()
    };
    stale.send(Payload::ConfigCommandAck(ack)).await;
    wait_for("the stale node's reconcile done", || async {
        match converged() {
            n if n > before => Ok(()),
            n => Err(format!("{n} converged")),
        }
    })
    .await;
    let kept = cp.store.get_links(std::slice::from_ref(&link.link_id)).await;
    let kept = kept.expect("read");
    assert_eq!(kept.len(), 1, "not forgotten");
    assert!(!kept[0].deleted);
    assert_eq!(kept[0].source_node, link.source_node);
}
}
