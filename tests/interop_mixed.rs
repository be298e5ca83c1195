//! A fleet mixing the upstream releases: one `slim` 2.0.0-alpha.2 node and
//! one `slim` 3.4.6 node in two groups linked through the API of
//! `slim-cp serve`. Both must hold the link (the dialling side outgoing,
//! the other incoming), and messages are sent both ways with each node's
//! own `slimctl bench` (the apps never cross revisions; only the link
//! between the nodes does). And the 3.4.6 node, restarted, gets its link
//! back: from its registration response when slim-cp knows it is 3.x.
//!
//! Needs both lines of `scripts/install-upstream.sh` (`slim` and `slimctl`
//! 2.0.0-alpha.2 in `~/.cache/slim-cp/upstream/bin`, 3.4.6 in
//! `.../upstream/3.4.6/bin`); without them the test prints one skip line
//! (and fails in CI).

#[macro_use]
mod interop_support;

use interop_support::{NodeSpec, Scenario, Table};

const OLD: &str = "old/n1";
const NEW: &str = "new/n1";

/// The link ids in node `id`'s own connection table (asked through the
/// control plane) with the given direction.
fn held_links(s: &Scenario, id: &str, direction: &str) -> Result<Vec<String>, String> {
    let out = s.ctl(&["connection", "list", "-n", id]);
    if !out.ok() {
        return Err(out.to_string());
    }
    let t: Table = out.table();
    let links = t
        .rows
        .iter()
        .filter(|r| t.cell(r, "DIRECTION").eq_ignore_ascii_case(direction))
        .map(|r| t.cell(r, "LINK_ID").to_string())
        .filter(|l| !l.is_empty() && l != "-")
        .collect();
    Ok(links)
}

/// Waits until one end holds `link` outgoing and the other incoming.
fn wait_link_held_by_both(s: &Scenario, link: &str) {
    s.wait_for("the link held at both ends", || {
        let mut ends = Vec::new();
        for id in [OLD, NEW] {
            let out = held_links(s, id, "outgoing")?;
            let inc = held_links(s, id, "incoming")?;
            ends.push((out.iter().any(|l| l == link), inc.iter().any(|l| l == link)));
        }
        match ends.as_slice() {
            [(true, false), (false, true)] | [(false, true), (true, false)] => Ok(()),
            other => Err(format!("{link}: (outgoing, incoming) per node: {other:?}")),
        }
    });
}

/// A 2.0.0-alpha.2 node in `old` and a 3.4.6 node in `new` (with `extra`
/// server metadata), registered with one slim-cp, `old` and `new` linked
/// through the API: waits until the link is Applied and held at both
/// ends; returns the scenario and the link id. The 3.4.6 node is the
/// link's source (a link goes from the earlier-named group).
fn mk_linked_pair(name: &str, extra: Option<(&str, &str)>) -> (Scenario, String) {
    let mut s = Scenario::api_mode(name);
    s.start_registered_node(NodeSpec::new("old", "n1"));
    let new = NodeSpec::new("new", "n1").v3();
    let new = match extra {
        Some((k, v)) => new.metadata(k, v),
        None => new,
    };
    s.start_registered_node(new);
    s.ctl_ok(&["link", "add", "old", "new"]);
    let link = s.wait_for("the old-new link applied", || {
        let t = s.table(&["link", "list"]);
        match t.rows.first() {
            Some(r) if t.rows.len() == 1 && t.cell(r, "STATUS").contains("APPLIED") => {
                Ok(t.cell(r, "LINK_ID").to_string())
            }
            _ => Err(format!("{t:?}")),
        }
    });
    wait_link_held_by_both(&s, &link);
    (s, link)
}

/// Scenario: the linked pair; 100 messages are published each way, each
/// with its node's own `slimctl bench`.
#[test]
#[ignore = "measured: apps of 2.0.0-alpha.2 and 3.4.6 cannot set up a session with each \
            other (the publisher's retries are exhausted; the subscriber calls the other \
            line's control messages unsigned); the link itself is held (see the README)"]
fn nodes_of_both_releases_link_and_exchange_messages() {
    require_upstream!("slim", "slimctl");
    require_upstream_v3!("slim", "slimctl");
    let (mut s, _) = mk_linked_pair("mixed-releases", None);
    let to_old = s.deliver(NEW, OLD, 100);
    let to_new = s.deliver(OLD, NEW, 100);
    eprintln!("3.4.6 -> 2.0.0-alpha.2: {to_old}");
    eprintln!("2.0.0-alpha.2 -> 3.4.6: {to_new}");
    assert_eq!(
        to_old.received,
        Some(100),
        "3.4.6 to 2.0.0-alpha.2: {to_old}"
    );
    assert_eq!(
        to_new.received,
        Some(100),
        "2.0.0-alpha.2 to 3.4.6: {to_new}"
    );
}

/// What a 3.4.6 node logs for each connection of its registration
/// response (a full-state reconcile), whether it can read it or not (a
/// parse error goes back in the ack, unlogged).
const FROM_REGISTRATION: &str = "desired state: creating connection";
/// What it logs for each connection of a command.
const FROM_COMMAND: &str = "received a connection to create";

/// How the restarted node's log says its link came back.
struct Restored {
    offered_at_registration: bool,
    made_by_command: bool,
}

/// The linked pair; the 3.4.6 node (the link's source) restarts with empty
/// tables and registers again while the link stands, so its registration
/// response carries the link; the link must be held at both ends again.
fn restart_the_3x_source(name: &str, extra: Option<(&str, &str)>) -> Restored {
    let (mut s, link) = mk_linked_pair(name, extra);
    let before = s.node(NEW).proc().log_text().len();
    s.node(NEW).restart();
    wait_link_held_by_both(&s, &link);
    let log = s.node(NEW).proc().log_text();
    let after = log.get(before..).unwrap_or_default();
    Restored {
        offered_at_registration: after.contains(FROM_REGISTRATION),
        made_by_command: after.contains(FROM_COMMAND),
    }
}

/// Scenario: a 3.4.6 node whose listener has metadata of its own is known
/// as 3.x; restarted, it reads its link from the registration response
/// (server requirements) without a parse error.
#[test]
fn a_known_3x_node_reads_its_links_from_the_registration_response() {
    require_upstream!("slim", "slimctl");
    require_upstream_v3!("slim", "slimctl");
    let r = restart_the_3x_source("mixed-known-3x", Some(("region", "eu")));
    assert!(r.offered_at_registration, "the response carried the link");
    assert!(
        !r.made_by_command,
        "the requirements were read; no command needed"
    );
}

/// Scenario: a plain 3.4.6 node (nothing on the wire says 3.x) is served
/// as 2.0.0-alpha.2; restarted, it cannot read the client configuration
/// of its registration response and gets its link back by the command
/// that follows (the cost the README describes).
#[test]
fn a_plain_3x_node_gets_its_links_back_by_command() {
    require_upstream!("slim", "slimctl");
    require_upstream_v3!("slim", "slimctl");
    let r = restart_the_3x_source("mixed-plain-3x", None);
    assert!(r.offered_at_registration, "the response carried the link");
    assert!(r.made_by_command, "unreadable there, made by the command");
}
