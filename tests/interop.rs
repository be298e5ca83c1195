//! Interop with the real upstream binaries: `slim` nodes register with
//! `slim-cp serve`, and the upstream `slimctl` drives its northbound API.
//!
//! Needs `scripts/install-upstream.sh slim slimctl slim-control-plane`;
//! without the binaries each test prints one skip line (and fails in CI).

#[macro_use]
mod interop_support;

use interop_support::{CpConfig, NodeSpec, Scenario};

/// The text slimctl prints between the two groups of a link or edge.
const ARROW: &str = "↔";

/// A real node registers and is listed Connected with its group and
/// endpoints; SIGKILLed it is NotConnected; restarted, Connected again;
/// SIGTERMed, NotConnected again.
#[test]
fn node_registers_and_is_not_connected_after_sigkill() {
    require_upstream!("slim", "slimctl");
    let mut s = Scenario::api_mode("node-lifecycle");
    s.start_node(NodeSpec::new("g1", "n1"));
    let row = s.wait_node_status("g1/n1", "Connected");
    let t = s.table(&["node", "list"]);
    let ep = format!("127.0.0.1:{}", s.node("g1/n1").dataplane);
    assert_eq!(t.cell(&row, "GROUP"), "g1");
    assert_eq!(t.cell(&row, "ENDPOINT"), ep);
    assert_eq!(t.cell(&row, "PUBLIC_ENDPOINT"), ep);
    assert_eq!(s.ctl_ok(&["node", "list"]).count(), Some(1));

    s.node("g1/n1").kill();
    s.wait_node_status("g1/n1", "NotConnected");

    s.node("g1/n1").restart();
    s.wait_node_status("g1/n1", "Connected");
    assert_eq!(
        s.ctl_ok(&["node", "list"]).count(),
        Some(1),
        "one record per node id"
    );

    // A 2.0.0-alpha.2 node never deregisters, even when stopped cleanly:
    // its record stays, like after a crash.
    s.node("g1/n1").terminate();
    s.wait_node_status("g1/n1", "NotConnected");
}

/// Segments in API mode: `default` exists and stays; others come and go.
#[test]
fn segments_are_managed_through_the_api() {
    require_upstream!("slimctl");
    let s = Scenario::api_mode("segments");
    let names = |s: &Scenario| {
        s.table(&["segment", "list"])
            .column("SEGMENT")
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&s), ["default"]);

    let out = s.ctl_ok(&["segment", "add", "blue"]);
    assert!(out.stdout.contains("Segment 'blue' added"), "{out}");
    let mut listed = names(&s);
    listed.sort();
    assert_eq!(listed, ["blue", "default"]);

    s.ctl_ok(&["segment", "remove", "blue"]);
    assert_eq!(names(&s), ["default"]);

    let msg = s.ctl_err(&["segment", "remove", "default"]);
    assert!(msg.contains("default"), "message should say why: {msg}");
    let msg = s.ctl_err(&["segment", "remove", "nosuch"]);
    assert!(msg.contains("not found"), "{msg}");
    assert_eq!(names(&s), ["default"]);
}

/// Topology links in API mode: adding warns about groups without nodes,
/// the pending entry is listed, removing it removes it.
#[test]
fn topology_links_are_managed_through_the_api() {
    require_upstream!("slim", "slimctl");
    let mut s = Scenario::api_mode("topology-links");
    s.start_registered_node(NodeSpec::new("g1", "n1"));

    let out = s.ctl_ok(&["link", "add", "--segment", "default", "g1", "g2"]);
    assert!(
        out.stdout.contains(&format!("Link g1{ARROW}g2 added")),
        "{out}"
    );
    let warnings: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.contains("Warning:"))
        .collect();
    assert_eq!(warnings.len(), 1, "only g2 has no nodes:\n{out}");
    assert!(warnings[0].contains("'g2'"), "{out}");

    let out = s.ctl_ok(&["link", "add", "ga", "gb"]);
    assert_eq!(
        out.stdout.matches("Warning:").count(),
        2,
        "neither group has nodes:\n{out}"
    );

    let links = s.ctl_ok(&["link", "list", "-a"]);
    assert_eq!(links.count(), Some(2), "{links}");
    let t = links.table();
    let pending = |a: &str, b: &str| {
        t.rows.iter().any(|r| {
            let (src, dst) = (t.cell(r, "SOURCE"), t.cell(r, "DEST_NODE"));
            ((src, dst) == (a, b) || (src, dst) == (b, a)) && t.cell(r, "STATUS") == "PENDING"
        })
    };
    assert!(pending("g1", "g2") && pending("ga", "gb"), "{links}");
    // Nothing can be applied while g2 and gb have no nodes.
    assert_eq!(s.ctl_ok(&["link", "list"]).count(), Some(0));
    let seg = s.table(&["segment", "list"]);
    let edges = seg
        .cell(
            seg.find("SEGMENT", "default").expect("default segment"),
            "LINKS",
        )
        .to_string();
    assert!(
        edges.contains(&format!("g1{ARROW}g2")) && edges.contains(&format!("ga{ARROW}gb")),
        "{edges}"
    );

    let out = s.ctl_ok(&["link", "remove", "ga", "gb"]);
    assert!(
        out.stdout.contains(&format!("Link ga{ARROW}gb removed")),
        "{out}"
    );
    let links = s.ctl_ok(&["link", "list", "-a"]);
    assert_eq!(links.count(), Some(1), "{links}");
    assert!(!links.stdout.contains("ga"), "{links}");
    let msg = s.ctl_err(&["link", "remove", "ga", "gb"]);
    assert!(msg.contains("not found"), "{msg}");
}

/// With the topology in the file (config mode), every topology mutation
/// is refused with a message that points at the configuration.
#[test]
fn config_mode_refuses_topology_mutations() {
    require_upstream!("slimctl");
    let cfg =
        CpConfig::slim_cp().with_topology("  links:\n    - group: g1\n      neighbors: [g2]\n");
    let s = Scenario::new("config-mode", cfg);
    for args in [
        &["segment", "add", "blue"][..],
        &["segment", "remove", "default"],
        &["link", "add", "g3", "g4"],
        &["link", "remove", "g1", "g2"],
    ] {
        let msg = s.ctl_err(args);
        assert!(
            msg.contains("config"),
            "{args:?} should blame config mode: {msg}"
        );
    }
    s.ctl_ok(&["segment", "list"]);
    s.ctl_ok(&["link", "list", "-a"]);
}

/// Groups are listed with their nodes, and per-node connection and route
/// lists are answered by the live node itself; unknown or dead nodes fail.
#[test]
fn node_queries_reach_the_live_node() {
    require_upstream!("slim", "slimctl");
    let mut s = Scenario::api_mode("node-queries");
    s.start_registered_node(NodeSpec::new("g1", "n1"));
    s.start_registered_node(NodeSpec::new("g2", "n2").no_external_endpoint());

    let groups = s.table(&["group", "list"]);
    assert_eq!(groups.column("GROUP"), ["g1", "g2"]);
    assert_eq!(groups.column("NODES"), ["g1/n1", "g2/n2"]);
    let nodes = s.table(&["node", "list"]);
    let n2 = nodes.find("NODE_ID", "g2/n2").expect("g2/n2 listed");
    assert_eq!(
        nodes.cell(n2, "PUBLIC_ENDPOINT"),
        "-",
        "no external endpoint announced"
    );

    let conns = s.ctl_ok(&["connection", "list", "-n", "g1/n1"]);
    assert!(
        conns.stdout.starts_with("Connections for node: g1/n1"),
        "{conns}"
    );
    // The node always has its local (process-internal) connection.
    assert!(conns.table().column("TYPE").contains(&"Local"), "{conns}");
    let routes = s.ctl_ok(&["route", "list", "-n", "g1/n1"]);
    assert!(
        routes.stdout.starts_with("Routes for node: g1/n1"),
        "{routes}"
    );
    assert!(routes.count().is_some(), "{routes}");

    for args in [
        ["connection", "list", "-n", "g1/nope"],
        ["route", "list", "-n", "g1/nope"],
    ] {
        let msg = s.ctl_err(&args);
        assert!(msg.contains("not found"), "{args:?}: {msg}");
    }

    s.node("g2/n2").kill();
    s.wait_node_status("g2/n2", "NotConnected");
    for args in [
        ["connection", "list", "-n", "g2/n2"],
        ["route", "list", "-n", "g2/n2"],
    ] {
        s.ctl_err(&args);
    }
}

/// The controller-wide route list succeeds, and an app's subscription on a
/// node shows up as an applied `* -> node` route until the app goes away.
#[test]
fn route_list_shows_announced_subscriptions() {
    require_upstream!("slim", "slimctl");
    let mut s = Scenario::api_mode("route-list");
    s.start_registered_node(NodeSpec::new("g1", "n1"));
    let out = s.ctl_ok(&["route", "list", "-a"]);
    assert!(out.stdout.starts_with("Routes: 0 (all statuses)"), "{out}");
    assert!(
        s.ctl_ok(&["route", "list"])
            .stdout
            .starts_with("Routes: 0 (applied only)")
    );

    let url = s.node("g1/n1").dataplane_url();
    let dir = s.dir.path().to_path_buf();
    let mut sub = interop_support::spawn_slimctl(
        &dir,
        "bench-sub",
        &["bench", "sub", "--server", &url, "-n", "1000"],
    );
    let route = s.wait_for("the subscription's route", || {
        let out = s.ctl(&["route", "list"]);
        let t = out.table();
        match t
            .rows
            .iter()
            .find(|r| t.cell(r, "ROUTE").starts_with("bench/test/sub-0"))
        {
            Some(r) => Ok(r.clone()),
            None => Err(out.to_string()),
        }
    });
    let t = s.table(&["route", "list"]);
    assert_eq!(
        t.cell(&route, "SOURCE"),
        "*",
        "a template matches every source"
    );
    assert_eq!(t.cell(&route, "DEST_NODE"), "g1/n1");
    assert_eq!(t.cell(&route, "STATUS"), "APPLIED");

    sub.kill();
    s.wait_for("the route to be withdrawn", || {
        let out = s.ctl(&["route", "list"]);
        if out.ok() && out.count() == Some(0) {
            Ok(())
        } else {
            Err(out.to_string())
        }
    });
}

/// The reference control plane and slim-cp list the same fleet the same
/// way (node, group and per-node connection listings).
#[test]
fn listings_match_the_reference_control_plane() {
    require_upstream!("slim", "slimctl", "slim-control-plane");
    let mut ours = Scenario::api_mode("side-by-side-slim-cp");
    let mut theirs = Scenario::new("side-by-side-reference", CpConfig::reference());
    for s in [&mut ours, &mut theirs] {
        s.start_registered_node(NodeSpec::new("g1", "n1"));
        s.start_registered_node(NodeSpec::new("g2", "n2"));
    }
    // Ports differ between the two fleets; compare everything else.
    let strip = |t: interop_support::Table| {
        t.rows
            .into_iter()
            .map(|r| {
                r.into_iter()
                    .map(|c| {
                        if c.starts_with("127.0.0.1:") {
                            "ADDR".into()
                        } else {
                            c
                        }
                    })
                    .collect::<Vec<String>>()
            })
            .collect::<Vec<_>>()
    };
    for args in [
        &["node", "list"][..],
        &["group", "list"],
        &["connection", "list", "-n", "g2/n2"],
    ] {
        let (a, b) = (ours.table(args), theirs.table(args));
        assert_eq!(a.headers, b.headers, "{args:?}");
        let (mut a, mut b) = (strip(a), strip(b));
        a.sort();
        b.sort();
        assert_eq!(a, b, "{args:?}: slim-cp vs reference");
    }
}

/// Two groups linked through the API, an app subscribed on g1 and one
/// publishing on g2: every message must arrive, which it can only do over
/// the inter-group link and the route the control plane set up.
fn cross_group_delivery(name: &str, cfg: CpConfig) {
    let mut s = Scenario::new(name, cfg);
    s.start_registered_node(NodeSpec::new("g1", "n1"));
    s.start_registered_node(NodeSpec::new("g2", "n2"));
    s.ctl_ok(&["link", "add", "g1", "g2"]);
    s.wait_for("the g1-g2 link to be applied", || {
        let out = s.ctl(&["link", "list"]);
        if out.count() == Some(1) {
            Ok(())
        } else {
            Err(out.to_string())
        }
    });
    let d = s.deliver("g2/n2", "g1/n1", 200);
    assert_eq!(d.received, Some(200), "{d}");
    assert_eq!(d.pub_exit, Ok(Some(0)), "{d}");
}

/// The proof against the reference control plane: it validates the
/// harness (node configs, link prerequisites, the bench apps).
#[test]
fn reference_delivers_messages_across_groups() {
    require_upstream!("slim", "slimctl", "slim-control-plane");
    cross_group_delivery("e2e-reference", CpConfig::reference());
}

/// The same proof against slim-cp.
#[test]
fn slim_cp_delivers_messages_across_groups() {
    require_upstream!("slim", "slimctl");
    cross_group_delivery("e2e-slim-cp", CpConfig::slim_cp());
}
