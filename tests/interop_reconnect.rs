//! Routes across a real node's control-stream reconnect, with one slim-cp
//! on the memory store and two upstream 2.0.0-alpha.2 `slim` nodes.
//!
//! A node whose control stream reconnects (its replica was killed,
//! drained or restarted) drops the links it dialed, but keeps the ones
//! dialed to it, with the routes over them, and forgets those routes'
//! subscription ids: it then refuses every removal of them with
//! "subscription id not found". slim-cp has the link's source re-create
//! the link, which drops them, and sets again what should stay.
//!
//! Needs `scripts/install-upstream.sh slim slimctl`; without the binaries
//! the test prints one skip line (and fails in CI).

#[macro_use]
mod interop_support;
mod common;

use std::net::SocketAddr;

use common::proxy::Proxy;
use interop_support::SUB_ROUTE;
use interop_support::{NodeSpec, Scenario, SlimNode};

/// Messages in the delivery after the route is gone.
const MSGS: u64 = 200;

/// How many times the control plane logged `what` about `node`.
fn logged(s: &Scenario, what: &str, node: &str) -> usize {
    let needle = format!("node={node}");
    let log = s.cp.log();
    log.lines()
        .filter(|l| l.contains(what) && l.contains(&needle))
        .count()
}

/// Scenario: `g1/n1` dials the `g1`-`g2` link to `g2/n2`; an app
/// subscribed on `g1/n1` gives `g2/n2` a route over it. `g2/n2`'s control
/// stream, which goes through a proxy, is closed: the node registers
/// again, keeping the link and the route. The app leaves: the route must
/// leave `g2/n2`'s own table (it does only because slim-cp re-created the
/// link), and a new app on `g1/n1` must still get every message published
/// on `g2/n2`, over the re-created link.
#[test]
fn a_route_kept_across_a_reconnect_leaves_the_node_with_its_app() {
    require_upstream!("slim", "slimctl");
    let rt = tokio::runtime::Runtime::new().expect("a runtime for the proxy");
    let mut s = Scenario::api_mode("reconnect-route");
    let southbound: SocketAddr = (s.cp.southbound_url().trim_start_matches("http://"))
        .parse()
        .expect("the control plane's southbound address");
    let proxy = rt.block_on(Proxy::start(southbound));
    s.start_registered_node(NodeSpec::new("g1", "n1"));
    let via_proxy = format!("http://{}", proxy.addr);
    let n2 = SlimNode::start(s.dir.path(), NodeSpec::new("g2", "n2"), &via_proxy);
    s.nodes.push(n2);
    s.wait_node_status("g2/n2", "Connected");
    s.ctl_ok(&["link", "add", "g1", "g2"]);
    let link = s.wait_for("the g1-g2 link applied", || {
        let t = s.table(&["link", "list", "-a"]);
        match t.rows_where("STATUS", "APPLIED").as_slice() {
            [row] => Ok((
                t.cell(row, "SOURCE").to_string(),
                t.cell(row, "LINK_ID").to_string(),
            )),
            _ => Err(format!("{t:?}")),
        }
    });
    assert_eq!(link.0, "g1/n1", "the test needs g2/n2 at the dialed end");

    let url = s.node("g1/n1").dataplane_url();
    let dir = s.dir.path().to_path_buf();
    let args = ["bench", "sub", "--server", &url, "-n", "1000000"];
    let mut app = interop_support::spawn_slimctl(&dir, "bench-sub-stays", &args);
    let on_n2 = |s: &Scenario| {
        let out = s.ctl(&["route", "list", "-n", "g2/n2"]);
        let t = out.table();
        let found = (t.rows.iter())
            .any(|r| t.cell(r, "ROUTE").starts_with(SUB_ROUTE) && t.cell(r, "LINK_ID") == link.1);
        (out.ok(), found, out.to_string())
    };
    s.wait_for("the app's route on g2/n2 over the link", || {
        match on_n2(&s) {
            (true, true, _) => Ok(()),
            (_, _, out) => Err(out),
        }
    });

    proxy.reset();
    s.wait_for("g2/n2 registered again", || {
        match logged(&s, "node registered", "g2/n2") {
            n if n >= 2 => Ok(()),
            n => Err(format!("{n} registrations")),
        }
    });
    s.wait_node_status("g2/n2", "Connected");
    let (ok, kept, out) = on_n2(&s);
    assert!(
        ok && kept,
        "the node kept the route across its reconnect: {out}"
    );

    app.kill();
    s.wait_for("the route gone from g2/n2's own table", || {
        match on_n2(&s) {
            (true, false, _) => Ok(()),
            (_, _, out) => Err(out),
        }
    });
    s.wait_for("the link's source to create it again", || {
        match logged(&s, "link re-created", "g1/n1") {
            0 => Err("not yet".to_string()),
            n => Ok(n),
        }
    });
    let d = s.deliver("g2/n2", "g1/n1", MSGS);
    assert_eq!(d.received, Some(MSGS), "{d}");
    assert_eq!(
        logged(&s, "link re-created", "g1/n1"),
        1,
        "the link was re-created once"
    );
}
