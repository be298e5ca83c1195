//! Scenario building blocks shared by the routing and healing suites: a
//! replica with a topology, a simulated fleet against it, and waits that
//! check what the nodes hold as well as what the store says.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use slim_cp::config::{AdjacencyEntry, ReconcilerConfig, TopologyConfig};
use slim_cp::server::{Options, Running};
use slim_cp::sim::{FleetOptions, SimFleet, SimNodeSpec, SimOptions};
use slim_cp::store::model::{Link, LinkStatus, RouteStatus};

use super::{PATIENCE, start_replica, wait_for};

pub fn mk_links(pairs: &[(&str, &[&str])]) -> TopologyConfig {
    TopologyConfig::Links(
        pairs
            .iter()
            .map(|(g, n)| AdjacencyEntry {
                group: g.to_string(),
                neighbors: n.iter().map(|s| s.to_string()).collect(),
            })
            .collect(),
    )
}

pub async fn mk_cp(topology: TopologyConfig) -> Running {
    super::init_test_log();
    start_replica(Options {
        topology,
        reconciler: ReconcilerConfig {
            base_retry_delay: Duration::from_millis(50),
            ..ReconcilerConfig::default()
        },
        ..Options::loopback()
    })
    .await
}

/// `groups` × `per_group` nodes, each with an external endpoint.
pub async fn mk_fleet(cp: &Running, groups: &[&str], per_group: usize) -> SimFleet {
    let sized: Vec<(&str, usize)> = groups.iter().map(|g| (*g, per_group)).collect();
    mk_fleet_sized(cp, &sized).await
}

/// Fleet options for tests: `nodes_per_channel` nodes share an HTTP/2
/// connection (1: each node dials its own, like a real one), and a node
/// not yet able to reach the control plane retries quickly.
pub fn fleet_options(nodes_per_channel: usize) -> FleetOptions {
    FleetOptions {
        nodes_per_channel,
        node: SimOptions {
            connect_retry_interval: Duration::from_millis(50),
            ..SimOptions::default()
        },
    }
}

/// The data-plane endpoint of the `i`-th simulated node (in-memory
/// network: the ports are names, nothing listens on them).
fn endpoint(i: usize) -> String {
    format!("127.0.0.1:{}", 30000 + i)
}

fn mk_spec(group: &str, node: &str, endpoint: String) -> SimNodeSpec {
    let mut spec = SimNodeSpec::new(node, Some(group), &endpoint);
    spec.external_endpoint = Some(endpoint);
    spec
}

/// A fleet with the given number of nodes per group (`n0`, `n1`, ...),
/// each with an external endpoint, all registered.
pub async fn mk_fleet_sized(cp: &Running, groups: &[(&str, usize)]) -> SimFleet {
    let url = format!("http://{}", cp.southbound_addr);
    mk_fleet_at(&url, groups, 8).await
}

/// As [`mk_fleet_sized`], dialing `url`, `nodes_per_channel` nodes to an
/// HTTP/2 connection (1: each its own, like real nodes, which move
/// replicas one by one).
pub async fn mk_fleet_at(
    url: &str,
    groups: &[(&str, usize)],
    nodes_per_channel: usize,
) -> SimFleet {
    let mut specs = Vec::new();
    for (g, count) in groups {
        for i in 0..*count {
            specs.push(mk_spec(g, &format!("n{i}"), endpoint(specs.len())));
        }
    }
    let opts = fleet_options(nodes_per_channel);
    let fleet = SimFleet::start(url, specs, opts).unwrap();
    assert!(
        fleet.wait_all_registered(PATIENCE).await,
        "lost: {:?}",
        fleet.lost()
    );
    fleet
}

/// Starts `group/node` at `endpoint` on the fleet's network and waits for
/// its registration.
async fn spawn_at(fleet: &mut SimFleet, group: &str, node: &str, endpoint: String) -> u64 {
    let spawned = fleet
        .spawn(mk_spec(group, node, endpoint))
        .expect("spawned")
        .clone();
    assert!(
        spawned.wait_registered(PATIENCE).await,
        "{:?}",
        spawned.state()
    );
    spawned.registrations()
}

/// Starts one more node, `group/node`, and waits for its registration;
/// returns its registration count.
pub async fn spawn_node(fleet: &mut SimFleet, group: &str, node: &str) -> u64 {
    let at = endpoint(20_000 + fleet.nodes().len());
    spawn_at(fleet, group, node, at).await
}

/// Starts `group/node` again on a new endpoint (the old process must be
/// gone); returns the new endpoint once it is registered.
pub async fn respawn_elsewhere(fleet: &mut SimFleet, id: &str) -> String {
    let (group, node) = id.split_once('/').expect("group/node");
    let moved = endpoint(10_000 + fleet.nodes().len());
    spawn_at(fleet, group, node, moved.clone()).await;
    moved
}

/// Starts every node of the fleet again on a new endpoint (their old
/// processes must be gone), all at once, and waits until every one is
/// registered; returns the new endpoints by node id.
pub async fn respawn_all_elsewhere(fleet: &mut SimFleet) -> BTreeMap<String, String> {
    let ids: Vec<String> = fleet
        .nodes()
        .iter()
        .map(|n| n.effective_id().to_string())
        .collect();
    let mut moved = BTreeMap::new();
    for (i, id) in ids.into_iter().enumerate() {
        let (group, node) = id.split_once('/').expect("group/node");
        let at = endpoint(15_000 + i);
        fleet
            .spawn(mk_spec(group, node, at.clone()))
            .expect("spawned");
        moved.insert(id, at);
    }
    assert!(
        fleet.wait_all_registered(PATIENCE).await,
        "lost: {:?}",
        fleet.lost()
    );
    moved
}

/// Asserts that every link points at the endpoint its destination node
/// now serves (`endpoints`, by node id).
pub fn assert_links_point_at(links: &[Link], endpoints: &BTreeMap<String, String>) {
    for l in links {
        let dest = l.dest_node.as_deref().expect("a claimed link");
        assert_eq!(
            Some(&l.dest_endpoint),
            endpoints.get(dest),
            "link {} towards {dest}",
            l.link_id
        );
    }
}

/// Waits until `last` is reachable from every group over what the nodes
/// hold (see [`super::reach`]).
pub async fn wait_reachable(fleet: &SimFleet, last: &str, announcer_groups: &[&str]) {
    wait_for(&format!("{last} reachable from every group"), || async {
        let missing = super::reach::unreachable(fleet, last, announcer_groups);
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("unreachable from {missing:?}"))
        }
    })
    .await;
}

/// Waits until the store has exactly `n` Applied links and each is held by
/// its source (outgoing) and its destination (incoming).
pub async fn wait_links(cp: &Running, fleet: &SimFleet, n: usize) -> Vec<Link> {
    wait_links_in(cp.store.as_ref(), fleet, n).await
}

/// The store's links that are not deleted (an error as text, for waits).
pub async fn live_links(store: &dyn slim_cp::store::Store) -> Result<Vec<Link>, String> {
    let links = store.list_links().await.map_err(|e| e.to_string())?;
    Ok(links.into_iter().filter(|l| !l.deleted).collect())
}

/// [`wait_links`] on any store (another replica's, say).
pub async fn wait_links_in(
    store: &dyn slim_cp::store::Store,
    fleet: &SimFleet,
    n: usize,
) -> Vec<Link> {
    wait_for(&format!("{n} applied links held by both ends"), || async {
        let links = live_links(store).await?;
        let applied = links
            .iter()
            .filter(|l| l.status == LinkStatus::Applied)
            .count();
        let held = links
            .iter()
            .filter(|l| {
                let at = |node: &str, incoming: bool| {
                    fleet.node(node).is_some_and(|s| {
                        s.connections().iter().any(|c| {
                            c.link_id.as_deref() == Some(&l.link_id)
                                && (c.direction
                                    == slim_cp::proto::sb::ConnectionDirection::Incoming)
                                    == incoming
                        })
                    })
                };
                at(&l.source_node, false) && l.dest_node.as_deref().is_some_and(|d| at(d, true))
            })
            .count();
        if links.len() == n && applied == n && held == n {
            Ok(links)
        } else {
            Err(format!(
                "{} links, {applied} applied, {held} held: {links:?}",
                links.len()
            ))
        }
    })
    .await
}

/// Waits until every node in `holders` holds a route for `last` and the
/// store's routes for it are all Applied; returns the store's route count.
pub async fn wait_routes(cp: &Running, fleet: &SimFleet, last: &str, holders: &[&str]) -> usize {
    wait_for(&format!("routes for {last} on {holders:?}"), || async {
        let routes: Vec<_> = cp
            .store
            .list_routes()
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|r| r.name.components[2] == last)
            .collect();
        let applied = routes.iter().all(|r| r.status == RouteStatus::Applied);
        let on_nodes: BTreeSet<String> = fleet
            .nodes()
            .iter()
            .filter(|n| {
                n.routes()
                    .iter()
                    .any(|r| r.name[2] == last && r.link_id.is_some())
            })
            .map(|n| n.effective_id().to_string())
            .collect();
        let want: BTreeSet<String> = holders.iter().map(|s| s.to_string()).collect();
        if applied && on_nodes == want && !routes.is_empty() {
            Ok(routes.len())
        } else {
            Err(format!(
                "applied={applied} on_nodes={on_nodes:?} routes={routes:?}"
            ))
        }
    })
    .await
}

pub async fn wait_routes_gone(cp: &Running, fleet: &SimFleet, last: &str) {
    wait_for(&format!("routes for {last} gone"), || async {
        let stored = cp
            .store
            .list_routes()
            .await
            .map_err(|e| e.to_string())?
            .iter()
            .filter(|r| r.name.components[2] == last)
            .count();
        let held = fleet
            .nodes()
            .iter()
            .filter(|n| {
                n.routes()
                    .iter()
                    .any(|r| r.name[2] == last && r.link_id.is_some())
            })
            .count();
        if stored == 0 && held == 0 {
            Ok(())
        } else {
            Err(format!("{stored} stored, {held} held"))
        }
    })
    .await;
}
/// Which node holds a route for `last` over which link, as the nodes say.
pub fn held_routes(fleet: &SimFleet, last: &str) -> BTreeSet<(String, String)> {
    fleet
        .nodes()
        .iter()
        .flat_map(|n| {
            n.routes()
                .into_iter()
                .filter(|r| r.name[2] == last)
                .filter_map(|r| Some((n.effective_id().to_string(), r.link_id?)))
                .collect::<Vec<_>>()
        })
        .collect()
}

pub fn link_between<'a>(links: &'a [Link], a: &str, b: &str) -> &'a Link {
    links
        .iter()
        .find(|l| {
            (l.source_group == a && l.dest_group == b) || (l.source_group == b && l.dest_group == a)
        })
        .unwrap_or_else(|| panic!("no link {a}-{b} in {links:?}"))
}

/// Waits until no link is stored and no node holds one.
pub async fn wait_no_links(cp: &Running, fleet: &SimFleet) {
    wait_for("no link stored or held", || async {
        let stored = cp
            .store
            .list_links()
            .await
            .map_err(|e| e.to_string())?
            .len();
        let held: usize = fleet.nodes().iter().map(|n| n.connections().len()).sum();
        if stored == 0 && held == 0 {
            Ok(())
        } else {
            Err(format!("{stored} stored, {held} held"))
        }
    })
    .await;
}

/// A northbound client of the replica.
pub async fn nb_client(
    cp: &Running,
) -> slim_cp::proto::nb::control_plane_service_client::ControlPlaneServiceClient<
    tonic::transport::Channel,
> {
    let url = format!("http://{}", cp.northbound_addr);
    slim_cp::proto::nb::control_plane_service_client::ControlPlaneServiceClient::connect(url)
        .await
        .expect("northbound reachable")
}

/// Closes the node's stream on the control plane's side (the node only
/// re-opens its control stream) and waits for its re-registration.
pub async fn reopen_stream(cp: &Running, fleet: &SimFleet, node: &str) {
    let sim = fleet.node(node).expect("node in fleet");
    let before = sim.registrations();
    let session = cp.registry().get(node).expect("a stream").session();
    cp.registry().remove(node, session);
    wait_for("re-registered", || async {
        let n = sim.registrations();
        if n > before {
            Ok(())
        } else {
            Err(format!("{n} registrations"))
        }
    })
    .await;
}
