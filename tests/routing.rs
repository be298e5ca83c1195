//! Links and routes over real gRPC with simulated fleets, checked both in
//! the store (what the API reports) and on the nodes (what they hold).

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::scenario::{
    held_routes, link_between, mk_cp, mk_fleet, mk_links, nb_client, wait_links, wait_no_links,
    wait_routes, wait_routes_gone,
};
use common::{start_replica, wait_for};
use slim_cp::config::{AdjacencyEntry, ReconcilerConfig, TopologyConfig};
use slim_cp::server::Options;
use slim_cp::store::model::LinkStatus;

on_both_backends! {
/// Scenario: full mesh of three groups gives three Applied links, one per pair.
async fn full_mesh_of_three_groups() {
    let cp = mk_cp(mk_links(&[("*", &["*"])])).await;
    let fleet = mk_fleet(&cp, &["a", "b", "c"], 1).await;
    let links = wait_links(&cp, &fleet, 3).await;
    let pairs: BTreeSet<(String, String)> = links
        .iter()
        .map(|l| (l.source_group.clone(), l.dest_group.clone()))
        .collect();
    assert_eq!(pairs.len(), 3);
    assert_eq!(fleet.lost_count(), 0);
}
}

on_both_backends! {
/// Scenario: one announced name gives loop-free Applied routes from every
/// other group, held by the nodes; a withdrawal removes them from the nodes.
async fn announcement_routes_then_withdrawal() {
    let cp = mk_cp(mk_links(&[("*", &["*"])])).await;
    let fleet = mk_fleet(&cp, &["a", "b", "c"], 1).await;
    wait_links(&cp, &fleet, 3).await;
    let announcer = fleet.node("a/n0").unwrap();
    announcer.announce(["org", "ns", "app"]).unwrap();
    let n = wait_routes(&cp, &fleet, "app", &["b/n0", "c/n0"]).await;
    assert_eq!(n, 2, "one upward route per other group");
    announcer.withdraw(["org", "ns", "app"]).unwrap();
    wait_routes_gone(&cp, &fleet, "app").await;
}
}

on_both_backends! {
/// Scenario: star — spokes link only to the hub and reach each other
/// only through it.
async fn star_spokes_reach_each_other_via_the_hub() {
    let cp = mk_cp(mk_links(&[("hub", &["*"])])).await;
    let fleet = mk_fleet(&cp, &["hub", "x", "y"], 1).await;
    let links = wait_links(&cp, &fleet, 2).await;
    fleet
        .node("x/n0")
        .unwrap()
        .announce(["org", "ns", "svc"])
        .unwrap();
    wait_routes(&cp, &fleet, "svc", &["hub/n0", "y/n0"]).await;
    let held = held_routes(&fleet, "svc");
    let via_hub = link_between(&links, "hub", "y").link_id.clone();
    let to_x = link_between(&links, "hub", "x").link_id.clone();
    assert_eq!(
        held,
        BTreeSet::from([("y/n0".into(), via_hub), ("hub/n0".into(), to_x)])
    );
}
}

on_both_backends! {
/// Scenario: explicit pairs — customers reach cloud, never each other.
async fn explicit_pairs_link_only_what_is_listed() {
    let cp = mk_cp(mk_links(&[("cloud", &["ca", "cb"])])).await;
    let fleet = mk_fleet(&cp, &["cloud", "ca", "cb"], 1).await;
    let links = wait_links(&cp, &fleet, 2).await;
    assert!(
        links
            .iter()
            .all(|l| l.source_group == "cloud" || l.dest_group == "cloud")
    );
}
}

on_both_backends! {
/// Scenario: chain a-b-c-d — a name announced in d is reached from a over
/// three hops, each group forwarding towards its parent.
async fn chain_gives_a_multi_hop_route() {
    let cp = mk_cp(mk_links(&[("a", &["b"]), ("b", &["c"]), ("c", &["d"])])).await;
    let fleet = mk_fleet(&cp, &["a", "b", "c", "d"], 1).await;
    let links = wait_links(&cp, &fleet, 3).await;
    fleet
        .node("d/n0")
        .unwrap()
        .announce(["org", "ns", "far"])
        .unwrap();
    wait_routes(&cp, &fleet, "far", &["a/n0", "b/n0", "c/n0"]).await;
    let held = held_routes(&fleet, "far");
    let want = BTreeSet::from([
        (
            "a/n0".to_string(),
            link_between(&links, "a", "b").link_id.clone(),
        ),
        (
            "b/n0".to_string(),
            link_between(&links, "b", "c").link_id.clone(),
        ),
        (
            "c/n0".to_string(),
            link_between(&links, "c", "d").link_id.clone(),
        ),
    ]);
    assert_eq!(held, want);
}
}

on_both_backends! {
/// Scenario: two announcers of one name — upward routes towards the first,
/// downward routes from the root to the second; several names stay apart.
async fn two_announcers_and_independent_names() {
    let cp = mk_cp(mk_links(&[("a", &["b"]), ("b", &["c"])])).await;
    let fleet = mk_fleet(&cp, &["a", "b", "c"], 1).await;
    wait_links(&cp, &fleet, 2).await;
    fleet
        .node("a/n0")
        .unwrap()
        .announce(["org", "ns", "dup"])
        .unwrap();
    wait_routes(&cp, &fleet, "dup", &["b/n0", "c/n0"]).await;
    fleet
        .node("c/n0")
        .unwrap()
        .announce(["org", "ns", "dup"])
        .unwrap();
    let n = wait_routes(&cp, &fleet, "dup", &["a/n0", "b/n0", "c/n0"]).await;
    assert_eq!(n, 4, "up: b->a, c->b; down: a->b, b->c");
    fleet
        .node("b/n0")
        .unwrap()
        .announce(["org", "ns", "other"])
        .unwrap();
    let m = wait_routes(&cp, &fleet, "other", &["a/n0", "c/n0"]).await;
    assert_eq!(m, 2);
    assert_eq!(
        held_routes(&fleet, "dup").len(),
        4,
        "the second name changed nothing of the first"
    );
}
}

on_both_backends! {
/// Scenario: API mode — adding a topology link creates and applies a link
/// between the groups' nodes and routes over it; removing it takes link and
/// routes off the nodes, which then have nothing desired at all
/// (regression: the reference never told such a node, so its stale routes
/// stayed).
async fn api_mode_link_add_and_remove() {
    use slim_cp::proto::nb;
    let cp = mk_cp(TopologyConfig::Api).await;
    let fleet = mk_fleet(&cp, &["g1", "g2"], 1).await;
    let mut client = nb_client(&cp).await;
    let add = nb::AddTopologyLinkRequest {
        group_a: "g1".into(),
        group_b: "g2".into(),
        segment: String::new(),
    };
    let warnings = client
        .add_topology_link(add)
        .await
        .unwrap()
        .into_inner()
        .warnings;
    assert!(warnings.is_empty(), "{warnings:?}");
    wait_links(&cp, &fleet, 1).await;
    fleet.node("g2/n0").unwrap().announce(["org", "ns", "api"]).unwrap();
    wait_routes(&cp, &fleet, "api", &["g1/n0"]).await;
    let rm = nb::RemoveTopologyLinkRequest {
        group_a: "g2".into(),
        group_b: "g1".into(),
        segment: String::new(),
    };
    client.remove_topology_link(rm).await.unwrap();
    wait_no_links(&cp, &fleet).await;
    wait_routes_gone(&cp, &fleet, "api").await;
}
}

on_both_backends! {
/// Scenario: API mode segments — a link in a second segment works like one
/// in default, and removing the segment removes the link.
async fn api_mode_segment_add_and_remove() {
    use slim_cp::proto::nb;
    let cp = mk_cp(TopologyConfig::Api).await;
    let fleet = mk_fleet(&cp, &["g1", "g2"], 1).await;
    let mut client = nb_client(&cp).await;
    client
        .add_segment(nb::AddSegmentRequest {
            name: "blue".into(),
        })
        .await
        .unwrap();
    let add = nb::AddTopologyLinkRequest {
        group_a: "g1".into(),
        group_b: "g2".into(),
        segment: "blue".into(),
    };
    client.add_topology_link(add).await.unwrap();
    wait_links(&cp, &fleet, 1).await;
    client
        .remove_segment(nb::RemoveSegmentRequest {
            name: "blue".into(),
        })
        .await
        .unwrap();
    wait_no_links(&cp, &fleet).await;
}
}

on_both_backends! {
/// Scenario: `$group` segments isolate customers; named segments keep
/// their own graphs.
async fn segments_isolate_customers() {
    use slim_cp::config::SegmentConfig;
    let entry = |g: &str, n: &[&str]| AdjacencyEntry {
        group: g.into(),
        neighbors: n.iter().map(|s| s.to_string()).collect(),
    };
    let mode = TopologyConfig::Segments(vec![
        SegmentConfig {
            name: "seg-$group".into(),
            links: vec![entry("cloud", &["$group"])],
        },
        SegmentConfig {
            name: "ops".into(),
            links: vec![entry("cloud", &["ops"])],
        },
    ]);
    let cp = mk_cp(mode).await;
    let fleet = mk_fleet(&cp, &["cloud", "ca", "cb", "ops"], 1).await;
    wait_links(&cp, &fleet, 3).await;
    fleet
        .node("ca/n0")
        .unwrap()
        .announce(["org", "ns", "secret"])
        .unwrap();
    wait_routes(&cp, &fleet, "secret", &["cloud/n0"]).await;
    assert!(
        held_routes(&fleet, "secret")
            .iter()
            .all(|(n, _)| n == "cloud/n0"),
        "cb and ops never learn it"
    );
}
}

on_both_backends! {
/// Scenario: a node whose commands fail leaves its link Failed after the
/// retries, and the link recovers on the next sweep once the node heals.
async fn failing_node_goes_failed_then_recovers_on_the_sweep() {
    let cp = start_replica(Options {
        topology: TopologyConfig::Api,
        reconciler: ReconcilerConfig {
            base_retry_delay: Duration::from_millis(20),
            max_requeues: 2,
            reconcile_period: Duration::from_secs(1),
            ..ReconcilerConfig::default()
        },
        ..Options::loopback()
    })
    .await;
    let fleet = mk_fleet(&cp, &["a", "b"], 1).await;
    // The source of an a-b link is in a (b, the later name, is the
    // destination): make it refuse everything, then allow the link.
    fleet.node("a/n0").unwrap().set_fail_commands(true);
    let add = slim_cp::proto::nb::AddTopologyLinkRequest {
        group_a: "a".into(),
        group_b: "b".into(),
        segment: String::new(),
    };
    nb_client(&cp).await.add_topology_link(add).await.unwrap();
    wait_for("link failed", || async {
        let links = cp.store.list_links().await.map_err(|e| e.to_string())?;
        match links.first() {
            Some(l) if l.status == LinkStatus::Failed && l.status_msg.contains("injected") => {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    wait_for("the queue gives up on the node", || async {
        let c = cp.queue().map(|q| q.counters()).unwrap_or_default();
        if c.drops >= 1 {
            Ok(())
        } else {
            Err(format!("{c:?}"))
        }
    })
    .await;
    let links = cp.store.list_links().await.unwrap();
    assert_eq!(
        links[0].status,
        LinkStatus::Failed,
        "still failed once retries are spent"
    );
    fleet.node("a/n0").unwrap().set_fail_commands(false);
    wait_links(&cp, &fleet, 1).await;
}
}
