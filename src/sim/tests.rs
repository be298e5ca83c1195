//! Table and command logic, without a control plane.

use tokio::sync::mpsc;

use super::commands::{Faults, apply};
use super::names::{NULL_ID, NameKey, make_name};
use super::network::{NetState, ProcessStart, Signals};
use super::tables::{LIST_CHUNK, chunk_list};
use crate::proto::sb::control_message::Payload;
use crate::proto::{dp, sb};
use crate::revision::Revision;

/// A network with running nodes `a` (a:1) and `b` (b:2); the receivers
/// collect what each sends the control plane unprompted.
fn net() -> (
    NetState,
    mpsc::Receiver<sb::ControlMessage>,
    mpsc::Receiver<sb::ControlMessage>,
) {
    let mut net = NetState::default();
    let mut rxs = Vec::new();
    for (key, endpoint) in [("a", "127.0.0.1:1"), ("b", "0.0.0.0:2")] {
        assert!(net.add_node(key, Signals::new(None)));
        net.start_process(key, start(key, endpoint));
        let (tx, rx) = mpsc::channel(1000);
        net.process(key, 1).unwrap().outbox.attach(tx);
        rxs.push(rx);
    }
    let b = rxs.pop().unwrap();
    let a = rxs.pop().unwrap();
    (net, a, b)
}

fn start(key: &str, endpoint: &str) -> ProcessStart {
    ProcessStart {
        incarnation: 1,
        node_id: key.to_string(),
        endpoints: vec![endpoint.to_string()],
        restore: Vec::new(),
        emit_withdrawals: true,
    }
}

fn drain(rx: &mut mpsc::Receiver<sb::ControlMessage>) -> Vec<sb::ConfigurationCommand> {
    let mut out = Vec::new();
    while let Ok(msg) = rx.try_recv() {
        if let Some(Payload::ConfigCommand(cmd)) = msg.payload {
            out.push(cmd);
        }
    }
    out
}

fn link(id: &str, endpoint: &str) -> sb::Connection {
    sb::Connection {
        link_id: id.to_string(),
        config_data: format!(
            r#"{{"endpoint":"http://{endpoint}","link_id":"{id}","connection_type":"remote"}}"#
        ),
    }
}

fn name(n: &str) -> dp::Name {
    make_name(["org", "ns", n], NULL_ID)
}

fn route(n: &str, link: Option<&str>) -> sb::Route {
    sb::Route {
        name: Some(name(n)),
        link_id: link.map(str::to_string),
        direction: None,
    }
}

fn run(
    net: &mut NetState,
    key: &str,
    cmd: sb::ConfigurationCommand,
) -> (Vec<sb::ConnectionAck>, Vec<sb::RouteAck>) {
    let applied = apply(net, (key, 1, Revision::V2), &cmd, &Faults::default()).unwrap();
    for msg in applied.owed {
        net.process(key, 1).unwrap().outbox.notify(msg);
    }
    (applied.connections, applied.routes)
}

fn links(net: &mut NetState, key: &str) -> Vec<(String, sb::ConnectionDirection)> {
    let tables = &net.process(key, 1).unwrap().tables;
    let conns = tables
        .conns()
        .filter(|c| c.conn_type != sb::ConnectionType::Local);
    conns
        .map(|c| (c.link_id.clone().unwrap_or_default(), c.direction))
        .collect()
}

fn routed(net: &mut NetState, key: &str) -> Vec<(String, Option<String>)> {
    let routes = net.process(key, 1).unwrap().tables.routes();
    routes
        .into_iter()
        .map(|r| (r.name[2].clone(), r.link_id))
        .collect()
}

fn reconcile(conns: Vec<sb::Connection>, routes: Vec<sb::Route>) -> sb::ConfigurationCommand {
    sb::ConfigurationCommand {
        connections_to_create: conns,
        routes_to_set: routes,
        reconcile: true,
        ..Default::default()
    }
}

#[test]
fn full_state_reconcile_replaces_cp_managed_state() {
    let (mut net, mut a_rx, mut b_rx) = net();
    let cmd = reconcile(
        vec![link("L1", "127.0.0.1:2"), link("L2", "localhost:2")],
        vec![route("n1", Some("L1"))],
    );
    let (conns, routes) = run(&mut net, "a", cmd);
    assert!(conns.iter().all(|a| a.success), "{conns:?}");
    assert_eq!(routes.len(), 1);
    assert!(routes[0].success);
    let out = sb::ConnectionDirection::Outgoing;
    assert_eq!(
        links(&mut net, "a"),
        vec![("L1".into(), out), ("L2".into(), out)]
    );
    let claims: Vec<String> = drain(&mut b_rx)
        .into_iter()
        .flat_map(|c| c.connections_received)
        .filter_map(|e| e.link_id)
        .collect();
    assert_eq!(claims, vec!["L1", "L2"]);

    let cmd = reconcile(
        vec![link("L1", "127.0.0.1:2")],
        vec![route("n2", Some("L1"))],
    );
    let (conns, routes) = run(&mut net, "a", cmd);
    let acked: Vec<(&str, bool)> = conns
        .iter()
        .map(|c| (c.link_id.as_str(), c.success))
        .collect();
    assert_eq!(acked, vec![("L2", true), ("L1", true)]);
    let removed = routes[0].route.as_ref().unwrap();
    assert_eq!(
        (removed.name.clone(), removed.link_id.clone()),
        (Some(name("n1")), None)
    );
    assert!(routes.iter().all(|r| r.success));
    assert_eq!(
        routed(&mut net, "a"),
        vec![("n2".into(), Some("L1".into()))]
    );
    assert_eq!(
        links(&mut net, "b"),
        vec![("L1".into(), sb::ConnectionDirection::Incoming)]
    );
    assert!(drain(&mut a_rx).is_empty(), "no routes rode on L2");
}

#[test]
fn reconcile_leaves_incoming_and_untracked_state_alone() {
    let (mut net, _a, _b) = net();
    run(
        &mut net,
        "a",
        reconcile(vec![link("L1", "127.0.0.1:2")], vec![]),
    );
    let (conns, routes) = run(
        &mut net,
        "b",
        reconcile(
            vec![],
            vec![route("n", Some("L1")), route("x", Some("nope"))],
        ),
    );
    assert!(conns.is_empty());
    assert_eq!(routes[0].error_msg, "connection not found");
    assert!(routes[1].success);
    net.process("b", 1).unwrap().tables.tracked.clear();
    let (conns, routes) = run(&mut net, "b", reconcile(vec![], vec![]));
    assert!(conns.is_empty() && routes.is_empty());
    assert_eq!(links(&mut net, "b").len(), 1);
    assert_eq!(
        routed(&mut net, "b").len(),
        1,
        "untracked routes survive a reconcile"
    );
}

#[test]
fn incremental_items_fail_in_the_node_words() {
    let (mut net, _a, _b) = net();
    let cmd = sb::ConfigurationCommand {
        connections_to_delete: vec!["ghost".into(), " ".into()],
        connections_to_create: vec![
            sb::Connection {
                link_id: "bad".into(),
                config_data: "{invalid-json".into(),
            },
            link("far", "127.0.0.1:9"),
        ],
        routes_to_set: vec![route("n", Some("ghost")), route("n", None)],
        routes_to_delete: vec![route("n", Some("ghost"))],
        ..Default::default()
    };
    let (conns, routes) = run(&mut net, "a", cmd);
    let errors: Vec<&str> = conns.iter().map(|c| c.error_msg.as_str()).collect();
    assert_eq!(errors[0], "Connection with link_id ghost not found");
    assert_eq!(errors[1], "link_id cannot be empty");
    assert!(errors[2].starts_with("Failed to parse config: "));
    assert_eq!(errors[3], "Connection failed: grpc error");
    let errors: Vec<&str> = routes.iter().map(|r| r.error_msg.as_str()).collect();
    assert_eq!(
        errors,
        vec![
            "Connection with link_id ghost not found",
            "Connection with link_id <none> not found",
            "Connection with link_id ghost not found",
        ]
    );
    assert!(conns.iter().all(|c| !c.success));
}

#[test]
fn incremental_routes_follow_subscription_records() {
    let (mut net, _a, _b) = net();
    let create = sb::ConfigurationCommand {
        connections_to_create: vec![link("L", "127.0.0.1:2")],
        ..Default::default()
    };
    assert!(run(&mut net, "a", create).0[0].success);
    let set = || sb::ConfigurationCommand {
        routes_to_set: vec![route("n", Some("L"))],
        ..Default::default()
    };
    let del = || sb::ConfigurationCommand {
        routes_to_delete: vec![route("n", Some("L"))],
        ..Default::default()
    };
    assert!(run(&mut net, "a", set()).1[0].success);
    assert!(run(&mut net, "a", del()).1[0].success);
    assert!(routed(&mut net, "a").is_empty());
    let (_, routes) = run(&mut net, "a", del());
    assert_eq!(
        routes[0].error_msg,
        "Failed to unsubscribe: subscription not found"
    );
    // Setting twice leaves an orphan record: one delete does not unroute.
    run(&mut net, "a", set());
    run(&mut net, "a", set());
    assert!(run(&mut net, "a", del()).1[0].success);
    assert_eq!(routed(&mut net, "a").len(), 1);
    let (_, routes) = run(&mut net, "a", del());
    assert!(
        routes[0]
            .error_msg
            .starts_with("Failed to unsubscribe: subscription id not found")
    );
}

#[test]
fn closing_a_link_reports_its_routes_lost_at_both_ends() {
    let (mut net, mut a_rx, mut b_rx) = net();
    run(
        &mut net,
        "a",
        reconcile(vec![link("L", "127.0.0.1:2")], vec![route("n", Some("L"))]),
    );
    run(
        &mut net,
        "b",
        reconcile(vec![], vec![route("m", Some("L"))]),
    );
    drain(&mut b_rx);
    let del = sb::ConfigurationCommand {
        connections_to_delete: vec!["L".into()],
        ..Default::default()
    };
    assert!(run(&mut net, "a", del).0[0].success);
    let lost = |cmds: Vec<sb::ConfigurationCommand>| -> Vec<String> {
        cmds.into_iter()
            .flat_map(|c| c.routes_to_delete)
            .map(|r| {
                r.name
                    .and_then(|n| n.str_name)
                    .map(|s| s.str_component_2)
                    .unwrap_or_default()
            })
            .collect()
    };
    assert_eq!(lost(drain(&mut a_rx)), vec!["n"]);
    assert_eq!(lost(drain(&mut b_rx)), vec!["m"]);
    assert!(links(&mut net, "b").is_empty());
    assert!(net.process("a", 1).unwrap().tables.tracked.is_empty());
}

#[test]
fn a_crash_closes_the_far_ends() {
    let (mut net, _a, _b) = net();
    run(
        &mut net,
        "a",
        reconcile(vec![link("L", "127.0.0.1:2")], vec![]),
    );
    assert_eq!(net.resolve("http://127.0.0.1:2").as_deref(), Some("b"));
    assert!(net.stop_process("b", 1));
    assert!(links(&mut net, "a").is_empty());
    assert_eq!(net.resolve("127.0.0.1:2"), None);
    let (conns, _) = run(
        &mut net,
        "a",
        reconcile(vec![link("L", "127.0.0.1:2")], vec![]),
    );
    assert_eq!(conns[0].error_msg, "Connection failed: grpc error");
}

#[test]
fn injected_failures_answer_every_item() {
    let (mut net, _a, _b) = net();
    let faults = Faults {
        fail_commands: true,
        refuse_endpoint: None,
    };
    let cmd = sb::ConfigurationCommand {
        connections_to_delete: vec!["x".into()],
        connections_to_create: vec![link("L", "127.0.0.1:2")],
        routes_to_set: vec![route("n", Some("L"))],
        routes_to_delete: vec![route("m", Some("L"))],
        ..Default::default()
    };
    let applied = apply(&mut net, ("a", 1, Revision::V2), &cmd, &faults).unwrap();
    assert_eq!(applied.connections.len(), 2);
    assert_eq!(applied.routes.len(), 2);
    let all = applied
        .connections
        .iter()
        .map(|c| (&c.error_msg, c.success));
    assert!(
        all.chain(applied.routes.iter().map(|r| (&r.error_msg, r.success)))
            .all(|(e, s)| e == "injected failure" && !s)
    );
    assert!(links(&mut net, "a").is_empty());
    let refuse = Faults {
        fail_commands: false,
        refuse_endpoint: Some("127.0.0.1:2".into()),
    };
    let cmd = reconcile(vec![link("L", "127.0.0.1:2")], vec![]);
    let applied = apply(&mut net, ("a", 1, Revision::V2), &cmd, &refuse).unwrap();
    assert!(!applied.connections[0].success);
}

#[test]
fn lists_and_registration_report_like_the_node() {
    let (mut net, _a, _b) = net();
    run(
        &mut net,
        "a",
        reconcile(vec![link("L", "127.0.0.1:2")], vec![route("n", Some("L"))]),
    );
    let tables = &mut net.process("a", 1).unwrap().tables;
    let app = tables.app_conn();
    let local = name("mine");
    tables.subscribe(NameKey::of(&local).unwrap(), &local, app);
    let conns = tables.connection_entries();
    assert_eq!(conns.len(), 3);
    assert_eq!(conns[0].connection_type, sb::ConnectionType::Local as i32);
    assert_eq!(conns[0].config_data, "{}");
    let reg = tables.registration_connections();
    assert!(
        reg.iter()
            .all(|c| c.connection_type == sb::ConnectionType::Remote as i32)
    );
    let routes = tables.route_entries();
    assert_eq!(routes.len(), 2);
    assert_eq!(tables.local_names(), vec![local]);
    let kinds: Vec<i32> = routes
        .iter()
        .flat_map(|r| r.connections.iter().map(|c| c.connection_type))
        .collect();
    assert!(kinds.contains(&(sb::ConnectionType::Local as i32)));
}

#[test]
fn chunked_lists_end_with_done() {
    let entries: Vec<u32> = (0..250).collect();
    let chunks = chunk_list(&entries, LIST_CHUNK);
    let shape: Vec<(usize, bool)> = chunks.iter().map(|(c, d)| (c.len(), *d)).collect();
    assert_eq!(shape, vec![(100, false), (100, false), (50, true)]);
    let empty: Vec<u32> = Vec::new();
    assert_eq!(chunk_list(&empty, LIST_CHUNK), vec![(Vec::new(), true)]);
    assert_eq!(chunk_list(&entries[..100], LIST_CHUNK).len(), 1);
}

#[test]
fn connection_ids_are_reused_last_freed_first() {
    let (mut net, _a, _b) = net();
    run(
        &mut net,
        "a",
        reconcile(
            vec![link("L1", "127.0.0.1:2"), link("L2", "127.0.0.1:2")],
            vec![],
        ),
    );
    let ids = |net: &mut NetState| -> Vec<u64> {
        net.process("a", 1)
            .unwrap()
            .tables
            .conns()
            .map(|c| c.id)
            .collect()
    };
    assert_eq!(ids(&mut net), vec![0, 1, 2]);
    run(
        &mut net,
        "a",
        reconcile(vec![link("L2", "127.0.0.1:2")], vec![]),
    );
    run(
        &mut net,
        "a",
        reconcile(
            vec![link("L2", "127.0.0.1:2"), link("L3", "127.0.0.1:2")],
            vec![],
        ),
    );
    assert_eq!(ids(&mut net), vec![0, 1, 2]);
    assert_eq!(net.process("a", 1).unwrap().tables.find_link("L3"), Some(1));
}

#[test]
fn a_3x_node_reads_a_full_state_reconcile_as_server_requirements() {
    let (mut net, _a, _b) = net();
    let v3 = ("a", 1, Revision::V3);
    let client = reconcile(vec![link("l-1", "127.0.0.1:2")], Vec::new());
    let applied = apply(&mut net, v3, &client, &Faults::default()).unwrap();
    let err = &applied.connections[0].error_msg;
    assert!(err.contains("missing field `tls_required`"), "{err}");
    let data = crate::routing::linkconfig::requirements("127.0.0.1:2", "l-1");
    let conn = sb::Connection {
        link_id: "l-1".into(),
        config_data: data,
    };
    let applied = apply(
        &mut net,
        v3,
        &reconcile(vec![conn], Vec::new()),
        &Faults::default(),
    );
    assert!(applied.unwrap().connections[0].success);
    let outgoing = sb::ConnectionDirection::Outgoing;
    assert_eq!(links(&mut net, "a"), vec![("l-1".to_string(), outgoing)]);
}
