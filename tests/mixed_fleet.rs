//! A fleet mixing both southbound revisions: simulated 2.0.0-alpha.2
//! nodes, 3.x nodes that show their revision (listener metadata, which
//! 3.x sends in a field of its own) and 3.x nodes that send nothing of
//! their revision (indistinguishable from 2.0.0-alpha.2 on the wire), in
//! linked groups, on both stores. Checked on what the nodes hold: every
//! link at both ends, every announced name routed from every other group.

mod common;

use common::PATIENCE;
use common::scenario::{fleet_options, mk_cp, mk_links, wait_links, wait_reachable};
use slim_cp::revision::Revision;
use slim_cp::server::Running;
use slim_cp::sim::{SimFleet, SimNodeSpec};

/// Group `known3`: 3.x with metadata. Group `plain3`: 3.x without (read
/// as 2.0.0-alpha.2). Group `v2`: 2.0.0-alpha.2. A link between two
/// unlinked groups goes from the earlier-named one; a group joining
/// linked groups dials them.
const GROUPS: [&str; 3] = ["known3", "plain3", "v2"];

fn mk_spec(group: &str, i: usize) -> SimNodeSpec {
    let endpoint = format!("127.0.0.1:{}", 31000 + i);
    let mut spec = SimNodeSpec::new(&format!("n{}", i % 2), Some(group), &endpoint);
    spec.external_endpoint = Some(endpoint);
    match group {
        "known3" => spec.v3().with_metadata("region", "eu"),
        "plain3" => spec.v3(),
        _ => spec,
    }
}

/// The nodes of `indexes` (two per group, in `GROUPS` order), started.
fn start_nodes(cp: &Running, indexes: std::ops::Range<usize>) -> SimFleet {
    let specs: Vec<SimNodeSpec> = indexes.map(|i| mk_spec(GROUPS[i / 2], i)).collect();
    let url = format!("http://{}", cp.southbound_addr);
    SimFleet::start(&url, specs, fleet_options(1)).expect("fleet starts")
}

async fn assert_all_registered(fleet: &SimFleet) {
    let all = fleet.wait_all_registered(PATIENCE).await;
    assert!(all, "lost: {:?}", fleet.lost());
}

/// Two nodes per group, all registered.
async fn mk_mixed_fleet(cp: &Running) -> SimFleet {
    let fleet = start_nodes(cp, 0..6);
    assert_all_registered(&fleet).await;
    fleet
}

/// `plain3` and `v2` first, linked (`plain3` dials), then `known3`, which
/// joins linked groups and so dials both: each 3.x group is the source of
/// a link, whatever order a burst would have registered them in.
async fn mk_fleet_known3_last(cp: &Running) -> SimFleet {
    let mut fleet = start_nodes(cp, 2..6);
    wait_links(cp, &fleet, 1).await;
    for i in 0..2 {
        fleet.spawn(mk_spec(GROUPS[0], i)).expect("known3 starts");
    }
    assert_all_registered(&fleet).await;
    fleet
}

/// Every group announces one name; each must be reachable from the other
/// two over what the nodes hold.
async fn announce_and_wait_reachable(fleet: &SimFleet) {
    for g in GROUPS {
        let announcer = fleet.node(&format!("{g}/n0")).expect("announcer");
        announcer.announce(["org", "ns", g]).expect("announced");
    }
    wait_all_reachable(fleet).await;
}

async fn wait_all_reachable(fleet: &SimFleet) {
    for g in GROUPS {
        wait_reachable(fleet, g, &[g]).await;
    }
}

on_both_backends! {
/// Scenario: a full mesh of a 2.0.0-alpha.2 group, a 3.x group that shows
/// its revision and a 3.x group that does not. The store records each
/// node's revision; three links are held at both ends; a name announced in
/// each group is reachable from the other two over held routes.
async fn a_mixed_fleet_converges() {
    let cp = mk_cp(mk_links(&[("*", &["*"])])).await;
    let fleet = mk_mixed_fleet(&cp).await;
    let revisions = [
        ("known3/n0", Revision::V3),
        ("plain3/n0", Revision::V2),
        ("v2/n0", Revision::V2),
    ];
    for (id, want) in revisions {
        let rec = cp.store.get_node(id).await.expect("reads").expect("recorded");
        assert_eq!(rec.revision, want, "{id}");
    }
    wait_links(&cp, &fleet, 3).await;
    announce_and_wait_reachable(&fleet).await;
    assert_eq!(fleet.lost_count(), 0);
}
}

on_both_backends! {
/// Scenario: every link's source restarts (empty tables) and registers
/// again while its links stand, so its registration response carries
/// them. A 3.x node known as such reads them as server requirements and
/// makes them at once, refusing none; a 3.x node read as 2.0.0-alpha.2
/// cannot parse the client configuration it gets there, and its links
/// come back by the command that follows. Either way everything is held
/// again.
async fn restarted_sources_of_both_revisions_get_their_links_back() {
    let cp = mk_cp(mk_links(&[("*", &["*"])])).await;
    let fleet = mk_fleet_known3_last(&cp).await;
    let links = wait_links(&cp, &fleet, 3).await;
    announce_and_wait_reachable(&fleet).await;
    let sources: std::collections::BTreeSet<String> =
        links.iter().map(|l| l.source_node.clone()).collect();
    let from = |g: &str| links.iter().filter(|l| l.source_group == g).count();
    assert_eq!(from("known3"), 2, "the known 3.x group is the source of two links");
    for id in &sources {
        let node = fleet.node(id).expect("source");
        let before = node.registrations();
        node.restart().expect("restarts");
        let again = |f: &SimFleet| f.node(id).is_some_and(|n| n.registrations() > before);
        assert!(fleet.wait_until(again, PATIENCE).await, "{id} registered again");
    }
    wait_links(&cp, &fleet, 3).await;
    wait_all_reachable(&fleet).await;
    for id in &sources {
        let failed = fleet.node(id).expect("source").failed_links();
        match id.split('/').next() {
            Some("known3") => assert_eq!(failed, 0, "{id} read every link it was given"),
            _ => assert!(failed > 0, "{id}: the client configuration is unreadable to it"),
        }
    }
    assert_eq!(fleet.lost_count(), 0);
}
}
