//! Interop with the SLIM 3.x `slimctl` (3.4.6): its northbound calls,
//! domains included, against `slim-cp serve` on the same listener the
//! 2.0.0-alpha.2 slimctl uses.
//!
//! Needs `scripts/install-upstream.sh --line 3 slim slimctl` (binaries in
//! `~/.cache/slim-cp/upstream/3.4.6/bin` or `$SLIM_UPSTREAM_DIR/3.4.6/bin`);
//! without them each test prints one skip line (and fails in CI).

// `require_upstream!` (the 2.0.0-alpha.2 binaries) is not used here.
#[allow(unused_macros)]
#[macro_use]
mod interop_support;
mod common;

use interop_support::{CpConfig, NodeSpec, Scenario, Table, slimctl_controller_v3};

const SECRET: &str = "blue-domain-secret-0123456789abcdef";

/// A sealing key for the domain secrets a Postgres run stores (32 bytes,
/// base64); the memory store seals with a key of the process.
const SEAL_KEY: &str = "c2xpbS1jcCBpbnRlcm9wIHRlc3Qgc2VhbGluZyBrZXk=";

/// API mode with shared-secret registration auth and no configured group:
/// every domain comes through the API.
fn mk_domain_scenario(name: &str, cfg: CpConfig) -> Scenario {
    let auth = "  registration_auth:\n    type: shared_secret\n    secrets: {}\n";
    Scenario::new(name, cfg.with_topology(auth))
}

/// slim-cp on a fresh Postgres database, with a key to seal secrets.
fn on_postgres() -> CpConfig {
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let db = rt.block_on(common::pg::fresh_pg_database());
    let url = common::pg::pg_url_for(&db);
    CpConfig::slim_cp()
        .on_postgres(&url)
        .with_env(slim_cp::auth::sealing::KEY_ENV, SEAL_KEY)
}

/// `slimctl` 3.4.6 adds, lists and removes a domain; the secret is never
/// printed; removing it twice is an error with a reason; `node list` works.
fn slimctl_3_manages_domains(name: &str, cfg: CpConfig) {
    let s = mk_domain_scenario(name, cfg);
    let nb = s.cp.northbound_addr();
    let ctl = |args: &[&str]| slimctl_controller_v3(s.dir.path(), &nb, args);

    let added = ctl(&["domain", "add", "blue", SECRET]);
    assert!(added.ok(), "{added}");
    assert!(added.stdout.contains("Domain 'blue' added"), "{added}");

    let listed = ctl(&["domain", "list"]);
    assert!(listed.ok(), "{listed}");
    assert_eq!(listed.count(), Some(1), "{listed}");
    let t = listed.table();
    let row = t.find("DOMAIN", "blue").expect("blue listed");
    assert_eq!(t.cell(row, "NODES"), "(no nodes connected)");
    assert!(!listed.stdout.contains(SECRET), "{listed}");

    let short = ctl(&["domain", "add", "red", "short"]);
    assert!(!short.ok(), "{short}");
    assert!(short.error_message().contains("too short"), "{short}");

    let removed = ctl(&["domain", "remove", "blue"]);
    assert!(removed.ok(), "{removed}");
    let again = ctl(&["domain", "rm", "blue"]);
    assert!(!again.ok(), "{again}");
    assert!(again.error_message().contains("not found"), "{again}");
    assert_eq!(ctl(&["domain", "list"]).count(), Some(0));

    let nodes = ctl(&["node", "list"]);
    assert!(nodes.ok(), "{nodes}");
    assert_eq!(nodes.count(), Some(0), "{nodes}");
}

#[test]
fn slimctl_3_manages_domains_on_memory() {
    require_upstream_v3!("slimctl");
    slimctl_3_manages_domains("v3-domains-memory", CpConfig::slim_cp());
}

#[test]
fn slimctl_3_manages_domains_on_postgres() {
    require_upstream_v3!("slimctl");
    slimctl_3_manages_domains("v3-domains-postgres", on_postgres());
}

/// Without shared-secret auth, adding a domain is refused the way the
/// reference refuses it, and listing still answers.
#[test]
fn slimctl_3_is_told_why_a_domain_cannot_be_added() {
    require_upstream_v3!("slimctl");
    let s = Scenario::api_mode("v3-domains-no-auth");
    let nb = s.cp.northbound_addr();
    let ctl = |args: &[&str]| slimctl_controller_v3(s.dir.path(), &nb, args);
    let refused = ctl(&["domain", "add", "blue", SECRET]);
    assert!(!refused.ok(), "{refused}");
    assert!(
        refused.error_message().contains("shared_secret"),
        "{refused}"
    );
    assert!(!refused.stderr.contains(SECRET), "{refused}");
    let listed = ctl(&["domain", "list"]);
    assert!(listed.ok(), "{listed}");
    assert_eq!(listed.count(), Some(0), "{listed}");
}

/// `slimctl` 3.4.6's table for `args`, polled until `check` accepts it.
fn wait_table(s: &Scenario, args: &[&str], what: &str, check: impl Fn(&Table) -> bool) {
    let nb = s.cp.northbound_addr();
    s.wait_for(what, || {
        let out = slimctl_controller_v3(s.dir.path(), &nb, args);
        match out.ok() && check(&out.table()) {
            true => Ok(()),
            false => Err(out.to_string()),
        }
    });
}

fn node_status(t: &Table, id: &str) -> String {
    t.find("NODE_ID", id)
        .map(|row| t.cell(row, "STATUS").to_string())
        .unwrap_or_default()
}

/// A real 3.4.6 node signs its registration with the secret of a domain
/// added through `slimctl` 3.4.6: it is Connected and listed under its
/// domain; once the domain is removed its stream is closed and it is
/// refused when it registers again, so it stays NotConnected.
fn a_3x_node_registers_with_a_domain_secret_added_by_slimctl(name: &str, cfg: CpConfig) {
    let mut s = mk_domain_scenario(name, cfg);
    let nb = s.cp.northbound_addr();
    let added = slimctl_controller_v3(s.dir.path(), &nb, &["domain", "add", "blue", SECRET]);
    assert!(added.ok(), "{added}");
    s.start_node(NodeSpec::new("blue", "n1").auth_secret(SECRET));
    wait_table(&s, &["node", "list"], "blue/n1 Connected", |t| {
        node_status(t, "blue/n1") == "Connected"
    });
    wait_table(&s, &["domain", "list"], "blue/n1 under blue", |t| {
        t.find("DOMAIN", "blue")
            .is_some_and(|row| t.cell(row, "NODES") == "blue/n1")
    });
    let removed = slimctl_controller_v3(s.dir.path(), &nb, &["domain", "remove", "blue"]);
    assert!(removed.ok(), "{removed}");
    wait_table(&s, &["node", "list"], "blue/n1 NotConnected", |t| {
        node_status(t, "blue/n1") == "NotConnected"
    });
}

#[test]
fn a_3x_node_registers_with_a_domain_secret_added_by_slimctl_on_memory() {
    require_upstream_v3!("slim", "slimctl");
    let cfg = CpConfig::slim_cp();
    a_3x_node_registers_with_a_domain_secret_added_by_slimctl("v3-domain-node-memory", cfg);
}

#[test]
fn a_3x_node_registers_with_a_domain_secret_added_by_slimctl_on_postgres() {
    require_upstream_v3!("slim", "slimctl");
    let cfg = on_postgres();
    a_3x_node_registers_with_a_domain_secret_added_by_slimctl("v3-domain-node-postgres", cfg);
}

/// The proof across groups with the 3.x line on both ends, all through
/// `slimctl` 3.4.6: two real 3.4.6 nodes in two domains, a segment added,
/// listed and removed, the link between the domains added, listed applied
/// and its edge shown in the segment; then 200 messages from a 3.4.6
/// `bench pub` on g2 must all reach a 3.4.6 `bench sub` on g1, which they
/// can only do over that link and the route the control plane set up.
fn v3_cross_group_delivery(name: &str, cfg: CpConfig) {
    let mut s = Scenario::new(name, cfg);
    s.start_registered_node(NodeSpec::new("g1", "n1").v3());
    s.start_registered_node(NodeSpec::new("g2", "n2").v3());
    let nb = s.cp.northbound_addr();
    let ctl = |args: &[&str]| slimctl_controller_v3(s.dir.path(), &nb, args);
    wait_table(&s, &["node", "list"], "both nodes Connected", |t| {
        node_status(t, "g1/n1") == "Connected" && node_status(t, "g2/n2") == "Connected"
    });
    let added = ctl(&["segment", "add", "blue"]);
    assert!(added.ok(), "{added}");
    let segments = ctl(&["segment", "list"]);
    assert!(
        segments.table().find("SEGMENT", "blue").is_some(),
        "{segments}"
    );
    let removed = ctl(&["segment", "remove", "blue"]);
    assert!(removed.ok(), "{removed}");
    let linked = ctl(&["link", "add", "g1", "g2"]);
    assert!(linked.ok(), "{linked}");
    wait_table(&s, &["link", "list"], "the g1-g2 link applied", |t| {
        let applied = |r: &Vec<String>| t.cell(r, "STATUS").contains("APPLIED");
        t.rows.len() == 1 && t.rows.first().is_some_and(applied)
    });
    let segments = ctl(&["segment", "list"]);
    let t = segments.table();
    let row = t.find("SEGMENT", "default").expect("default segment");
    assert!(t.cell(row, "LINKS").contains("g1"), "{segments}");
    assert!(t.find("SEGMENT", "blue").is_none(), "{segments}");
    let d = s.deliver("g2/n2", "g1/n1", 200);
    assert_eq!(d.received, Some(200), "{d}");
    assert_eq!(d.pub_exit, Ok(Some(0)), "{d}");
}

#[test]
fn slimctl_3_links_3x_domains_and_messages_cross_on_memory() {
    require_upstream_v3!("slim", "slimctl");
    v3_cross_group_delivery("v3-e2e-memory", CpConfig::slim_cp());
}

#[test]
fn slimctl_3_links_3x_domains_and_messages_cross_on_postgres() {
    require_upstream_v3!("slim", "slimctl");
    v3_cross_group_delivery("v3-e2e-postgres", on_postgres());
}
