//! The leader's wake-up listener on a real Postgres: the first `LISTEN` of
//! a term opens the leader's gate instead of asking for a second full
//! read; a reconnect, or a leader that stopped waiting, asks for one.
//! Facts wake it only when it may learn something from them.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::pg::{PgTestDb, fresh_pg_db};
use slim_cp::cluster::{Batch, Inbox, wakeups};
use slim_cp::store::Store;
use slim_cp::store::model::{Registration, ReplicaRef};
use slim_cp::store::postgres::FACTS_CHANNEL;
use tokio::sync::oneshot;
use tokio::time::timeout;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

const BOUND: Duration = Duration::from_secs(20);

async fn notify(client: &Client, payload: &str) {
    client
        .execute("SELECT pg_notify($1, $2)", &[&FACTS_CHANNEL, &payload])
        .await
        .expect("notifies");
}

async fn next(inbox: &Inbox) -> Batch {
    timeout(BOUND, inbox.next_batch())
        .await
        .expect("the inbox fills in time")
}

/// Starts the listener on `db`; `gate` as the term's first-listen gate.
fn start(db: &PgTestDb, gate: oneshot::Sender<()>) -> (Arc<Inbox>, CancellationToken) {
    let inbox = Arc::new(Inbox::new());
    let cancel = CancellationToken::new();
    let task = wakeups::listen(
        db.store().direct_connector(),
        inbox.clone(),
        gate,
        cancel.clone(),
    );
    tokio::spawn(task);
    (inbox, cancel)
}

/// The listener on `db`, once its first `LISTEN` opened the gate.
async fn listening(db: &PgTestDb) -> (Arc<Inbox>, CancellationToken) {
    let (gate, listening) = oneshot::channel();
    let started = start(db, gate);
    timeout(BOUND, listening)
        .await
        .expect("the gate opens in time")
        .expect("the listener opened the gate");
    started
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_listen_opens_the_gate_and_a_reconnect_asks_for_a_resync() {
    let db = fresh_pg_db().await;
    let (inbox, cancel) = listening(&db).await;
    let sql = db.client().await;
    notify(&sql, "n1").await;
    let first = next(&inbox).await;
    assert_eq!(
        first,
        Batch {
            nodes: vec!["n1".into()],
            resync: false
        },
        "the first LISTEN asked for no resync of its own; the notification came through"
    );

    // Every other backend of the database goes: the listener's among them.
    sql.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
        &[],
    )
    .await
    .expect("terminates the listener's backend");
    let again = next(&inbox).await;
    assert!(
        again.resync,
        "a reconnected listener asks for a resync: {again:?}"
    );
    notify(&sql, "n2").await;
    assert_eq!(
        next(&inbox).await.nodes,
        ["n2"],
        "it listens again after the reconnect"
    );
    cancel.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_stopped_waiting_gets_a_resync() {
    let db = fresh_pg_db().await;
    let (gate, listening) = oneshot::channel();
    drop(listening);
    let (inbox, cancel) = start(&db, gate);
    let batch = next(&inbox).await;
    assert!(
        batch.resync && batch.nodes.is_empty(),
        "its read came before the LISTEN: {batch:?}"
    );
    cancel.cancel();
}

fn registration(node: &str) -> Registration {
    Registration {
        node_id: node.into(),
        group: Some("g".into()),
        ..Registration::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_session_wakes_the_leader_when_ready_and_a_replacing_one_at_once() {
    let db = fresh_pg_db().await;
    let (inbox, cancel) = listening(&db).await;
    let store = db.store();
    let owner = ReplicaRef {
        id: "r".into(),
        incarnation: 1,
    };
    store
        .begin_session(registration("g/a"), owner.clone())
        .await
        .expect("a starts");
    let b = store
        .begin_session(registration("g/b"), owner.clone())
        .await
        .expect("b starts");
    assert!(
        store.mark_ready("g/b", b.session.id).await.expect("marks"),
        "b's session is current"
    );
    // Notifications arrive in commit order, and the inbox folds all
    // that came before a take into one batch.
    assert_eq!(
        next(&inbox).await.nodes,
        ["g/b"],
        "the new sessions' starts woke nobody; b's readiness did"
    );
    store
        .begin_session(registration("g/a"), owner)
        .await
        .expect("a starts again");
    assert_eq!(
        next(&inbox).await.nodes,
        ["g/a"],
        "a start that replaces a session wakes the leader"
    );
    cancel.cancel();
}
