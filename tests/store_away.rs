//! Registrations while the database is away, as real drills make it:
//! black-holed (every byte dropped, nothing refused), so a store call
//! hangs rather than fails. Nodes give up for good without a reply within
//! 10 s; so every node is answered in time with exactly what it holds, and
//! its registration is recorded once the database is back, unless the node
//! registered again elsewhere meanwhile.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::cut::cuttable_database;
use common::pg::pg_url_for;
use common::{PATIENCE, RawNode, announce, mk_register, wait_for};
use slim_cp::proto::sb;
use slim_cp::server::{self, Options, Running};
use slim_cp::store::model::ReplicaRef;
use slim_cp::store::{PgStore, Store};
use tokio::time::Instant;

async fn mk_replica(url: &str, id: &str) -> Running {
    let store = PgStore::connect(url, 8).await.expect("connects");
    let opts = Options {
        replica: ReplicaRef {
            id: id.into(),
            incarnation: 1,
        },
        ..Options::loopback()
    };
    server::start(opts, Arc::new(store))
        .await
        .expect("replica starts")
}

/// A registration of a node that holds one outgoing link and a route
/// over it (it re-registers after its control stream broke).
fn mk_holding(group: &str, node: &str) -> sb::RegisterNodeRequest {
    let mut req = mk_register(group, node);
    req.connections = vec![sb::ConnectionEntry {
        link_id: Some(format!("link-{node}")),
        direction: sb::ConnectionDirection::Outgoing as i32,
        connection_type: sb::ConnectionType::Remote as i32,
        config_data: format!("{{\"endpoint\":\"http://{node}:1\"}}"),
        ..Default::default()
    }];
    req.routes = vec![sb::Route {
        name: Some(common::mk_name(node)),
        link_id: Some(format!("link-{node}")),
        direction: None,
    }];
    req
}

/// Scenario: the path to Postgres is black-holed while 50 nodes register;
/// every node is answered `success: true` within 8 s with exactly the
/// link and route it holds, none is lost; after the path is back, every
/// registration and the names announced meanwhile are recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_registrations_during_a_black_hole_are_answered_in_time() {
    let (path, url) = cuttable_database().await;
    let cp = mk_replica(&url, "solo").await;
    path.blackhole();
    let mut tasks = Vec::new();
    for i in 0..50 {
        let addr = cp.southbound_addr;
        tasks.push(tokio::spawn(async move {
            let node = format!("n{i}");
            let mut raw = RawNode::open_at(addr).await.expect("opens");
            let sent = Instant::now();
            let reply = raw.register(mk_holding("g", &node)).await;
            let took = sent.elapsed();
            raw.send(announce(&[&format!("late-{i}")])).await;
            (node, reply, took, raw)
        }));
    }
    let mut streams = Vec::new();
    for t in tasks {
        let (node, reply, took, raw) = t.await.expect("registered");
        assert!(reply.success, "{node}");
        assert!(
            took < Duration::from_secs(8),
            "{node} answered after {took:?}"
        );
        let links: Vec<_> = reply
            .connections
            .iter()
            .map(|c| c.link_id.clone())
            .collect();
        assert_eq!(links, [format!("link-{node}")], "{node} keeps its link");
        assert_eq!(reply.routes.len(), 1, "{node} keeps its route");
        streams.push(raw);
    }
    path.restore();
    let store = PgStore::connect(&pg_url_for_path(&url), 2)
        .await
        .expect("observer");
    wait_for("every registration and announcement recorded", || async {
        let nodes = store.list_nodes().await.map_err(|e| e.to_string())?;
        let sessions = nodes.iter().filter(|n| n.is_connected()).count();
        let names = store
            .list_templates()
            .await
            .map_err(|e| e.to_string())?
            .len();
        if sessions == 50 && names == 50 {
            Ok(())
        } else {
            Err(format!("{sessions} sessions, {names} announcements"))
        }
    })
    .await;
    drop(streams);
}

/// The database URL without the proxy (`url` goes through it).
fn pg_url_for_path(url: &str) -> String {
    let db = url.rsplit('/').next().unwrap_or_default();
    pg_url_for(db.split('?').next().unwrap_or(db))
}

/// Scenario: a node's registration on replica A waits in A's outbox (A
/// cannot reach the database); the node registers again on replica B,
/// which can; A's path comes back: the newer session (B's) stands, A's
/// late write is refused and A closes the old stream, and B keeps serving
/// the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_registration_yields_to_a_newer_one() {
    let (path, url) = cuttable_database().await;
    let a = mk_replica(&url, "a").await;
    let b = mk_replica(&pg_url_for_path(&url), "b").await;
    path.blackhole();
    let mut old = RawNode::open_at(a.southbound_addr)
        .await
        .expect("opens on A");
    assert!(
        old.register(mk_register("g", "mover")).await.success,
        "answered unrecorded"
    );
    let mut new = RawNode::open_at(b.southbound_addr)
        .await
        .expect("opens on B");
    assert!(new.register(mk_register("g", "mover")).await.success);
    let recorded = b
        .store
        .get_node("g/mover")
        .await
        .expect("read")
        .expect("record");
    let newest = recorded.session.expect("a session").id;
    path.restore();
    // A refuses its late registration and closes the old stream.
    let ended = tokio::time::timeout(PATIENCE, async {
        while let Ok(Some(_)) = old.recv().await {}
    })
    .await;
    assert!(ended.is_ok(), "the old stream is closed");
    let rec = b
        .store
        .get_node("g/mover")
        .await
        .expect("read")
        .expect("record");
    assert_eq!(
        rec.session.map(|s| s.id),
        Some(newest),
        "the newer session stands"
    );
    assert_eq!(a.registry().len(), 0);
    // B still serves it: its requests reach the node on the new stream
    // (the node answers whatever it is asked, the reconciler's too).
    let answering = tokio::spawn(async move {
        while let Ok(Some(m)) = new.recv().await {
            new.answer(m).await;
        }
    });
    let asked = b.transport.list_routes("g/mover").await;
    assert!(asked.is_ok(), "answered through B: {asked:?}");
    answering.abort();
}

/// Scenario: while the path to Postgres is black-holed, a gateway
/// announces a name (the fact that waits for the store) and then reports
/// three dials one message at a time, as its peers' connections land.
/// Queued behind the announcement, the three claims are recorded as one
/// fact once the path is back: one write, not three, all three claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_queued_back_to_back_are_recorded_as_one_fact() {
    let (path, url) = cuttable_database().await;
    let cp = mk_replica(&url, "solo").await;
    let raw = RawNode::connect(&cp, "g", "gw").await;
    let recorded = |kind: &'static str| cp.metrics.facts.get_or_create(&[("kind", kind)]).get();
    wait_for("the readiness recorded", || async {
        match recorded("ready") {
            1 => Ok(()),
            n => Err(format!("{n} recorded")),
        }
    })
    .await;
    path.blackhole();
    raw.send(announce(&["waits"])).await;
    let links: Vec<String> = (0..3).map(|i| format!("link-{i}")).collect();
    for l in &links {
        let claim = sb::ConfigurationCommand {
            connections_received: vec![sb::ConnectionEntry {
                link_id: Some(l.clone()),
                direction: sb::ConnectionDirection::Incoming as i32,
                connection_type: sb::ConnectionType::Remote as i32,
                ..Default::default()
            }],
            ..Default::default()
        };
        raw.send(sb::control_message::Payload::ConfigCommand(claim))
            .await;
    }
    wait_for("three claims queued behind the announcement", || async {
        match cp.metrics.outbox.get() {
            3 => Ok(()),
            n => Err(format!("{n} queued")),
        }
    })
    .await;
    path.restore();
    wait_for("every claim recorded", || async {
        let rec = cp.store.get_node("g/gw").await.map_err(|e| e.to_string())?;
        let held = rec.map(|r| r.received_links).unwrap_or_default();
        match links.iter().all(|l| held.contains(l)) {
            true => Ok(()),
            false => Err(format!("recorded {held:?}")),
        }
    })
    .await;
    assert_eq!(recorded("announcement"), 1);
    assert_eq!(recorded("claim"), 1, "the three queued claims went as one");
    assert_eq!(cp.metrics.outbox.get(), 0);
}
