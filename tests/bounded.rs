//! Memory stays bounded under a node that floods while the store is away:
//! the fact outbox by count and by bytes (the stream is closed, so the
//! node replays on reconnect), and waiters for replies. Everything queued
//! is recorded or dropped once the store is back, and the gauges return
//! to zero.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::cut::cuttable_database;
use common::{RawNode, mk_name, wait_for};
use slim_cp::proto::sb;
use slim_cp::proto::sb::control_message::Payload;
use slim_cp::server::{self, Options, Running};
use slim_cp::southbound::{OUTBOX_CAPACITY, SESSION_OUTBOX_BYTES};
use slim_cp::store::PgStore;

async fn mk_replica(url: &str) -> Running {
    let store = PgStore::connect(url, 4).await.expect("connects");
    server::start(Options::loopback(), Arc::new(store))
        .await
        .expect("replica starts")
}

/// One announcement of `count` names whose last component is `len` bytes.
fn announcement(tag: usize, count: usize, len: usize) -> sb::ControlMessage {
    let routes = (0..count)
        .map(|i| sb::Route {
            name: Some(mk_name(&format!("{tag}-{i}-{}", "z".repeat(len)))),
            ..Default::default()
        })
        .collect();
    sb::ControlMessage {
        message_id: format!("m{tag}"),
        payload: Some(Payload::ConfigCommand(sb::ConfigurationCommand {
            routes_to_set: routes,
            ..Default::default()
        })),
    }
}

/// The highest outbox gauges seen while `raw` sends `facts` until its
/// stream is closed, and how many it sent.
struct Flood {
    sent: usize,
    max_facts: i64,
    max_bytes: i64,
    max_waiting: usize,
}

async fn flood(
    cp: &Running,
    raw: &mut RawNode,
    facts: impl Iterator<Item = sb::ControlMessage>,
) -> Flood {
    let mut seen = Flood {
        sent: 0,
        max_facts: 0,
        max_bytes: 0,
        max_waiting: 0,
    };
    for msg in facts {
        // A closed stream may stop taking messages rather than fail them.
        let send = tokio::time::timeout(Duration::from_secs(5), raw.tx.send(msg));
        if !matches!(send.await, Ok(Ok(()))) {
            break;
        }
        seen.sent += 1;
        seen.max_facts = seen.max_facts.max(cp.metrics.outbox.get());
        seen.max_bytes = seen.max_bytes.max(cp.metrics.outbox_bytes.get());
        seen.max_waiting = seen.max_waiting.max(cp.transport.registry().waiting());
        tokio::task::yield_now().await;
    }
    seen
}

/// The status that ends `raw`'s stream, past any requests before it.
async fn ended(raw: &mut RawNode) -> tonic::Status {
    loop {
        match raw.recv().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream ended cleanly"),
            Err(status) => return status,
        }
    }
}

fn assert_exhausted(status: &tonic::Status) {
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("too many facts pending"),
        "{status:?}"
    );
}

async fn wait_outbox_empty(cp: &Running) {
    wait_for("every outbox drained", || async {
        match (cp.metrics.outbox.get(), cp.metrics.outbox_bytes.get()) {
            (0, 0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// Scenario: the path to Postgres is black-holed; one node sends 10,000
/// small announcements, another a few huge ones. The first is stopped by
/// the count bound, the second by the byte bound, each with
/// RESOURCE_EXHAUSTED; neither gauge passes its bound; waiters stay few.
/// Once the path is back, the outboxes drain and both nodes register again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_while_the_store_is_away_stays_bounded() {
    let (path, url) = cuttable_database().await;
    let cp = mk_replica(&url).await;
    let mut small = RawNode::connect(&cp, "g", "small").await;
    let mut huge = RawNode::connect(&cp, "g", "huge").await;
    path.blackhole();

    let by_count = flood(&cp, &mut small, (0..10_000).map(|i| announcement(i, 1, 8))).await;
    assert_exhausted(&ended(&mut small).await);
    let cap = i64::try_from(OUTBOX_CAPACITY).unwrap_or(i64::MAX);
    assert!(
        by_count.max_facts <= cap + 1,
        "{} facts queued",
        by_count.max_facts
    );
    assert!(
        by_count.sent < 10_000,
        "the stream was closed before the end"
    );

    // About 770 kB each: the byte bound comes long before the count.
    let huge_facts = (0..200).map(|i| announcement(i, 2500, 240));
    let by_bytes = flood(&cp, &mut huge, huge_facts).await;
    assert_exhausted(&ended(&mut huge).await);
    let per_session = i64::try_from(SESSION_OUTBOX_BYTES).unwrap_or(i64::MAX);
    assert!(
        by_bytes.max_bytes <= 2 * per_session,
        "{} bytes held by two sessions",
        by_bytes.max_bytes
    );
    assert!(by_bytes.sent < 200, "{} huge facts accepted", by_bytes.sent);
    assert!(by_count.max_waiting.max(by_bytes.max_waiting) <= 2);
    assert_eq!(
        cp.metrics
            .dropped
            .get_or_create(&[("reason", "outbox_full")])
            .get(),
        2
    );

    eprintln!(
        "count bound: {} of 10000 sent, at most {} facts held; byte bound: {} of 200 sent, \
         at most {} bytes held",
        by_count.sent, by_count.max_facts, by_bytes.sent, by_bytes.max_bytes
    );
    path.restore();
    wait_outbox_empty(&cp).await;
    let small = RawNode::connect(&cp, "g", "small").await;
    let huge = RawNode::connect(&cp, "g", "huge").await;
    // Requests the two never answer fail with their sessions.
    drop((small, huge));
    wait_for("no session and no waiter left", || async {
        let registry = cp.transport.registry();
        match (registry.len(), registry.waiting()) {
            (0, 0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}
