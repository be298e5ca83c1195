//! A fleet mixing the upstream releases: one `slim` 2.0.0-alpha.2 node and
//! one `slim` 3.4.6 node in two groups linked through the API of
//! `slim-cp serve`. Both must hold the link (the dialling side outgoing,
//! the other incoming), and messages are sent both ways with each node's
//! own `slimctl bench` (the apps never cross revisions; only the link
//! between the nodes does).
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

/// Scenario: a 2.0.0-alpha.2 node in `old` and a 3.4.6 node in `new`
/// register with one slim-cp; `old` and `new` are linked; the link is
/// Applied and held at both ends; 100 messages are published each way.
#[test]
fn nodes_of_both_releases_link_and_exchange_messages() {
    require_upstream!("slim", "slimctl");
    require_upstream_v3!("slim", "slimctl");
    let mut s = Scenario::api_mode("mixed-releases");
    s.start_registered_node(NodeSpec::new("old", "n1"));
    s.start_registered_node(NodeSpec::new("new", "n1").v3());
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
