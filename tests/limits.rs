//! Input past the limits both stores can keep (see `slim_cp::limits`): a
//! registration that breaks one is refused with a message that names the
//! field; a later entry that breaks one is dropped and counted; the session
//! and its fact writer keep working either way, on both backends.

mod common;

use common::{RawNode, announce, announced_by, mk_name, mk_register, wait_for};
use slim_cp::limits::{MAX_ENTRIES, MAX_ID_BYTES, MAX_NAME_COMPONENT_BYTES};
use slim_cp::proto::sb::control_message::Payload;
use slim_cp::proto::{dp, sb};
use slim_cp::server::Running;

fn dropped(cp: &Running, reason: &'static str) -> u64 {
    cp.metrics
        .dropped
        .get_or_create(&[("reason", reason)])
        .get()
}

async fn wait_announced(cp: &Running, node: &str, last: &str) {
    wait_for(&format!("{last} recorded"), || async {
        match announced_by(cp, node).await? {
            names if names.iter().any(|n| n == last) => Ok(()),
            names => Err(format!("{names:?}")),
        }
    })
    .await;
}

fn long_name(len: usize) -> dp::Name {
    let mut name = mk_name("x");
    if let Some(s) = name.str_name.as_mut() {
        s.str_component_2 = "y".repeat(len);
    }
    name
}

on_both_backends! {
    /// Scenario: registrations with an overlong node id, group or endpoint
    /// are refused with `success: false`, and the stream's status names
    /// the field; nothing is recorded; a good node registers after them.
    async fn overlong_registrations_are_refused_with_the_field_named() {
        let cp = common::mk_replica().await;
        let long = "n".repeat(MAX_ID_BYTES + 1);
        let mut endpoint = mk_register("edge", "ep");
        endpoint.connection_details[0].endpoint = format!("{}:1", "h".repeat(2000));
        let cases = [
            (mk_register("edge", &long), "node_id"),
            (mk_register(&long, "n1"), "group_name"),
            (endpoint, "connection_details.endpoint"),
        ];
        for (req, field) in cases {
            let mut raw = RawNode::open(&cp).await.expect("opens");
            let reply = raw.register(req).await;
            assert!(!reply.success, "{field}: refused");
            raw.expect_end(tonic::Code::InvalidArgument, field).await;
        }
        let refused = cp.metrics.refusals.get_or_create(&[("reason", "too_long")]).get();
        assert_eq!(refused, 3);
        let nodes = cp.store.list_nodes().await.expect("lists");
        assert!(nodes.is_empty(), "nothing recorded: {nodes:?}");
        let _ok = RawNode::connect(&cp, "edge", "ok").await;
        assert!(cp.store.get_node("edge/ok").await.expect("reads").is_some());
    }
}

on_both_backends! {
    /// Scenario: a registered node announces a name with an overlong
    /// component beside a good one, and claims an overlong link id; the
    /// bad entries are dropped and counted, the good one is recorded, and
    /// the writer is not stuck: the next announcement is recorded too.
    async fn overlong_entries_are_dropped_and_the_session_keeps_working() {
        let cp = common::mk_replica().await;
        let raw = RawNode::connect(&cp, "edge", "n1").await;
        let cmd = sb::ConfigurationCommand {
            routes_to_set: vec![
                sb::Route {
                    name: Some(long_name(MAX_NAME_COMPONENT_BYTES + 1)),
                    ..Default::default()
                },
                sb::Route {
                    name: Some(mk_name("good")),
                    ..Default::default()
                },
            ],
            connections_received: vec![sb::ConnectionEntry {
                link_id: Some("l".repeat(3000)),
                ..Default::default()
            }],
            ..Default::default()
        };
        raw.send(Payload::ConfigCommand(cmd)).await;
        wait_announced(&cp, "edge/n1", "good").await;
        assert_eq!(dropped(&cp, "bad_name"), 1);
        assert_eq!(dropped(&cp, "bad_link_id"), 1);
        raw.send(announce(&["after"])).await;
        wait_announced(&cp, "edge/n1", "after").await;
        let names = announced_by(&cp, "edge/n1").await.expect("lists");
        assert_eq!(names.len(), 2, "only the good names: {names:?}");
        let rec = cp.store.get_node("edge/n1").await.expect("reads").expect("known");
        assert!(rec.ready_session().is_some(), "the session stands");
        assert!(rec.received_links.is_empty(), "the bad claim was dropped");
    }
}

on_both_backends! {
    /// Scenario: a command with more entries than any node sends is dropped
    /// whole and counted; the session goes on.
    async fn a_command_with_too_many_entries_is_dropped_whole() {
        let cp = common::mk_replica().await;
        let raw = RawNode::connect(&cp, "edge", "n1").await;
        let route = sb::Route {
            name: Some(mk_name("flood")),
            ..Default::default()
        };
        let cmd = sb::ConfigurationCommand {
            routes_to_set: vec![route; MAX_ENTRIES + 1],
            ..Default::default()
        };
        raw.send(Payload::ConfigCommand(cmd)).await;
        wait_for("the flood counted", || async {
            match dropped(&cp, "too_many") {
                0 => Err("not yet".to_string()),
                n => Ok(n),
            }
        })
        .await;
        raw.send(announce(&["after"])).await;
        wait_announced(&cp, "edge/n1", "after").await;
        let names = announced_by(&cp, "edge/n1").await.expect("lists");
        assert_eq!(Vec::from_iter(names), ["after"], "nothing of the flood recorded");
    }
}

/// Scenario: a fact that slipped past the door and that Postgres cannot
/// hold (NUL in a text) is `Rejected` at once, with its SQLSTATE, not
/// `Unavailable`: nothing retries it forever. The session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_rejects_what_it_cannot_hold_without_a_retry() {
    use slim_cp::store::model::{Name, Registration, ReplicaRef};
    use slim_cp::store::{Store, StoreError};
    let store = common::pg::fresh_pg_store().await;
    let reg = Registration {
        node_id: "g/n".into(),
        group: Some("g".into()),
        ..Registration::default()
    };
    let owner = ReplicaRef {
        id: "r".into(),
        incarnation: 1,
    };
    let started = store.begin_session(reg, owner).await.expect("begins");
    let session = started.session.id;
    let name = |last: &str| Name {
        components: ["org".into(), "ns".into(), last.into()],
        id: None,
    };
    let bad = store
        .record_announcements("g/n", session, &[name("nul\u{0}")], &[])
        .await;
    match bad {
        Err(StoreError::Rejected(why)) => assert!(why.contains("SQLSTATE"), "{why}"),
        other => panic!("expected a rejection, got {other:?}"),
    }
    store
        .record_announcements("g/n", session, &[name("fine")], &[])
        .await
        .expect("the next fact is recorded");
    let names: Vec<_> = store
        .list_templates()
        .await
        .expect("lists")
        .into_iter()
        .map(|t| t.name.components[2].clone())
        .collect();
    assert_eq!(names, ["fine"]);
}

on_both_backends! {
    /// Scenario: a registration lists a route whose name no store keeps;
    /// the node is still registered (the name alone is dropped and
    /// counted), so a bad route cannot cost a node its place.
    async fn a_registration_route_with_a_bad_name_is_dropped_and_counted() {
        let cp = common::mk_replica().await;
        let mut req = mk_register("edge", "n1");
        req.routes = vec![sb::Route {
            name: Some(long_name(MAX_NAME_COMPONENT_BYTES + 1)),
            link_id: Some("l1".into()),
            direction: None,
        }];
        let mut raw = RawNode::open(&cp).await.expect("opens");
        assert!(raw.register(req).await.success, "registered");
        assert_eq!(dropped(&cp, "bad_name"), 1);
        let rec = cp.store.get_node("edge/n1").await.expect("reads").expect("known");
        assert!(rec.reported_routes.is_empty(), "{:?}", rec.reported_routes);
    }
}
