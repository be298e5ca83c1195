//! Healing proved with real nodes and real apps: a group of two `slim`
//! nodes, peered with each other, loses (SIGKILL) the one that holds the
//! inter-group link; the link moves to the survivor and messages
//! published in the other group reach the survivor's app again.
//!
//! Needs `scripts/install-upstream.sh slim slimctl`; without the binaries
//! each test prints one skip line (and fails in CI).

#[macro_use]
mod interop_support;

use std::time::{Duration, Instant};

use interop_support::{NodeSpec, Scenario, Table, free_port};

/// Messages per delivery round.
const MSGS: u64 = 200;

/// Bound on the link landing on the survivor after the SIGKILL.
const HEAL_WITHIN: Duration = Duration::from_secs(15);

/// An applied inter-group link as `link list` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Link {
    id: String,
    /// The node that dials (`group/id`).
    source: String,
    /// The node dialled, at its external endpoint (`group/id`).
    dest: String,
}

impl Link {
    /// The link's end in `group`.
    fn end_in(&self, group: &str) -> &str {
        if in_group(&self.source, group) {
            &self.source
        } else {
            &self.dest
        }
    }
}

fn in_group(full_id: &str, group: &str) -> bool {
    full_id
        .strip_prefix(group)
        .is_some_and(|r| r.starts_with('/'))
}

/// The node id without its group: how a node's own connection and route
/// lists name the node at the other end.
fn bare(full_id: &str) -> &str {
    full_id.rsplit('/').next().unwrap_or(full_id)
}

/// The one APPLIED link of `link list -a`, or the listing as the state
/// to report while there is none (or, wrongly, more than one).
fn applied_link(s: &Scenario) -> Result<Link, String> {
    let out = s.ctl(&["link", "list", "-a"]);
    if !out.ok() {
        return Err(out.to_string());
    }
    let t = out.table();
    match t.rows_where("STATUS", "APPLIED").as_slice() {
        [row] => Ok(Link {
            id: t.cell(row, "LINK_ID").to_string(),
            source: t.cell(row, "SOURCE").to_string(),
            dest: t.cell(row, "DEST_NODE").to_string(),
        }),
        _ => Err(out.to_string()),
    }
}

/// Waits until node `full_id`'s own connection list passes `check`.
fn wait_connections(s: &Scenario, full_id: &str, what: &str, check: impl Fn(&Table) -> bool) {
    s.wait_for(&format!("{what} on {full_id}"), || {
        let out = s.ctl(&["connection", "list", "-n", full_id]);
        if out.ok() && check(&out.table()) {
            Ok(())
        } else {
            Err(out.to_string())
        }
    });
}

/// Whether a connection table has a row of `kind` (`Peer`, `Remote`)
/// with `column` equal to `value`.
fn has_conn(t: &Table, kind: &str, column: &str, value: &str) -> bool {
    t.rows
        .iter()
        .any(|r| t.cell(r, "TYPE") == kind && t.cell(r, column) == value)
}

/// The scenario of both tests. Group `sub_group` holds `n1` and `n2`,
/// each with an external endpoint and each the other's static peer;
/// group `pub_group` holds `p1`. slim-cp links the groups; the subscriber
/// runs on the group's node that does NOT hold the link and the publisher
/// on `p1`, so every message crosses the link holder and then the
/// intra-group peer connection. Then the holder is SIGKILLed, the link
/// must land on the subscriber's node, and every message must arrive again.
fn gateway_failover(name: &str, sub_group: &str, pub_group: &str) {
    let start = Instant::now();
    let mut s = Scenario::api_mode(name);
    let (port1, port2) = (free_port(), free_port());
    s.start_node(NodeSpec::new(sub_group, "n1").port(port1).peer("n2", port2));
    s.start_node(NodeSpec::new(sub_group, "n2").port(port2).peer("n1", port1));
    s.start_node(NodeSpec::new(pub_group, "p1"));
    let p1 = format!("{pub_group}/p1");
    for id in [
        format!("{sub_group}/n1"),
        format!("{sub_group}/n2"),
        p1.clone(),
    ] {
        s.wait_node_status(&id, "Connected");
    }

    // The link, and which end of it is in the subscriber's group.
    s.ctl_ok(&["link", "add", "--segment", "default", sub_group, pub_group]);
    let link = s.wait_for("the link to be applied", || applied_link(&s));
    assert_eq!(link.end_in(pub_group), p1, "{link:?}");
    // Both groups' nodes have external endpoints: the later-named group
    // is the destination. The two tests rely on it to cover both sides.
    let sub_is_source = sub_group < pub_group;
    assert_eq!(
        in_group(&link.source, sub_group),
        sub_is_source,
        "the later-named group should be the destination: {link:?}"
    );
    let holder = link.end_in(sub_group).to_string();
    let app = format!(
        "{sub_group}/{}",
        if bare(&holder) == "n1" { "n2" } else { "n1" }
    );

    // Phase one: the app's node has only the peer connection to the
    // holder (no inter-group connection of its own), so the messages can
    // only reach it over p1 -> holder -> (peer connection) -> app.
    wait_connections(&s, &app, "the peer connection to the holder", |t| {
        has_conn(t, "Peer", "ENDPOINT", bare(&holder))
    });
    wait_connections(&s, &holder, "the peer connection and the link", |t| {
        has_conn(t, "Peer", "ENDPOINT", bare(&app)) && has_conn(t, "Remote", "LINK_ID", &link.id)
    });
    let app_conns = s.table(&["connection", "list", "-n", &app]);
    assert!(
        app_conns.rows_where("TYPE", "Remote").is_empty(),
        "the app's node must not hold an inter-group connection: {app_conns:?}"
    );
    let d = s.deliver_when(&p1, &app, MSGS, |t, r| {
        t.cell(r, "LINK_ID") == link.id && t.cell(r, "ENDPOINT") == bare(&holder)
    });
    assert_eq!(
        d.received,
        Some(MSGS),
        "phase one: p1 -> {holder} -> peer -> {app}\n{d}"
    );
    assert_eq!(d.pub_exit, Ok(Some(0)), "phase one\n{d}");
    let phase_one = start.elapsed();

    // Phase two: the holder crashes; after the grace the link moves to
    // the app's node (source side: the same link, claimed again;
    // destination side: a new link towards the survivor's endpoint).
    s.node(&holder).kill();
    let killed = Instant::now();
    s.wait_node_status(&holder, "NotConnected");
    // The grace is ~3 s; allow for a slow machine, not for a stuck link.
    let moved = s.wait_for_within(HEAL_WITHIN, "the link to move to the app's node", || {
        let l = applied_link(&s)?;
        if l.end_in(sub_group) == app {
            Ok(l)
        } else {
            Err(format!("still {l:?}"))
        }
    });
    let healed = killed.elapsed();
    assert_eq!(moved.end_in(pub_group), p1, "{moved:?}");
    assert_eq!(
        in_group(&moved.source, sub_group),
        sub_is_source,
        "the link kept its direction: {moved:?}"
    );
    if sub_is_source {
        assert_eq!(moved.id, link.id, "a moved outgoing link keeps its id");
    } else {
        assert_ne!(moved.id, link.id, "an incoming link is recreated");
    }
    let direction = if sub_is_source {
        "Outgoing"
    } else {
        "Incoming"
    };
    wait_connections(&s, &app, "the moved link", |t| {
        t.rows.iter().any(|r| {
            t.cell(r, "TYPE") == "Remote"
                && t.cell(r, "LINK_ID") == moved.id
                && t.cell(r, "DIRECTION") == direction
        })
    });
    let d = s.deliver_when(&p1, &app, MSGS, |t, r| {
        t.cell(r, "LINK_ID") == moved.id && t.cell(r, "ENDPOINT") == bare(&app)
    });
    assert_eq!(
        d.received,
        Some(MSGS),
        "phase two: p1 -> {app} after {holder} died\n{d}"
    );
    assert_eq!(d.pub_exit, Ok(Some(0)), "phase two\n{d}");
    println!(
        "{name}: holder {holder}, app {app}; phase one done at {phase_one:.1?}; \
         link on {app} {healed:.1?} after the kill; phase two done at {:.1?}",
        start.elapsed()
    );
}

/// The subscriber's group sources the link; its holder dies and the link moves to the sibling.
#[test]
fn source_gateway_crash_moves_the_link_and_messages_arrive_again() {
    require_upstream!("slim", "slimctl");
    gateway_failover("failover-source", "g1", "g2");
}

/// The subscriber's group is the link's destination; its holder dies and the link is recreated towards the sibling.
#[test]
fn destination_gateway_crash_recreates_the_link_and_messages_arrive_again() {
    require_upstream!("slim", "slimctl");
    gateway_failover("failover-destination", "g2", "g1");
}
