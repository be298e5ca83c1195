//! The leader's release step: what it passes [`Arrivals`] as "busy".

use super::*;
use crate::reconcile::arrivals::{RECHECK, WAIT_MAX};
use crate::reconcile::pacing::COALESCE_QUIET;
use crate::reconcile::queue::QueueConfig;
use crate::reconcile::working::LinkWrites;
use crate::store::MemoryStore;

fn leader(queue: &Arc<WorkQueue>) -> Leader {
    leader_on(Arc::new(MemoryStore::new()), queue)
}

fn leader_on(store: Arc<MemoryStore>, queue: &Arc<WorkQueue>) -> Leader {
    Leader::new(
        store,
        WorkingState::new(Arc::new(LinkWrites::default())),
        Arc::new(Inbox::new()),
        queue.clone(),
        TopologyConfig::default(),
        Duration::from_secs(30),
        LeaderToken::solo(1),
    )
}

/// The leader with `edge` arrived, its coalescing window over, while the
/// urgent reconcile of `gateway` runs.
async fn arrival_beside_a_running_gateway() -> (Leader, Arc<WorkQueue>) {
    let queue = Arc::new(WorkQueue::new(QueueConfig::default()));
    let mut leader = leader(&queue);
    queue.add_urgent("gateway");
    assert_eq!(queue.get().await.as_deref(), Some("gateway"));
    edge_arrives(&mut leader).await;
    (leader, queue)
}

/// Node `edge` arrives and its coalescing window passes.
async fn edge_arrives(leader: &mut Leader) {
    let edge = BTreeSet::from(["edge".to_string()]);
    leader.affected.add(&BTreeSet::new(), &edge);
    tokio::time::advance(COALESCE_QUIET).await;
    leader.release_affected();
    assert!(
        leader.affected.is_empty(),
        "the coalescing window was taken"
    );
}

#[tokio::test(start_paused = true)]
async fn an_arrival_waits_while_an_urgent_reconcile_runs_then_goes() {
    let (mut leader, queue) = arrival_beside_a_running_gateway().await;
    assert!(queue.is_empty(), "queued beside a running urgent reconcile");
    let recheck = leader.arrivals.due().expect("the look is kept back");

    tokio::time::advance(RECHECK).await;
    assert!(Instant::now() >= recheck);
    leader.release_affected();
    assert!(queue.is_empty(), "the gateway still runs");

    queue.done("gateway");
    tokio::time::advance(RECHECK).await;
    leader.release_affected();
    assert_eq!(queue.len(), 1);
    assert_eq!(queue.get().await.as_deref(), Some("edge"));
    assert_eq!(leader.arrivals.due(), None);
}

#[tokio::test(start_paused = true)]
async fn an_arrival_goes_after_the_longest_wait_however_busy() {
    let (mut leader, queue) = arrival_beside_a_running_gateway().await;
    tokio::time::advance(WAIT_MAX - RECHECK).await;
    leader.release_affected();
    assert!(queue.is_empty(), "before the longest wait");
    tokio::time::advance(RECHECK).await;
    leader.release_affected();
    assert_eq!(queue.get().await.as_deref(), Some("edge"));
    assert!(queue.urgent_busy(), "the gateway was still running");
}

#[tokio::test(start_paused = true)]
async fn an_arrival_waits_for_derivations_still_coalescing() {
    let (mut leader, queue) = arrival_beside_a_running_gateway().await;
    queue.done("gateway");
    let other = BTreeSet::from(["other".to_string()]);
    leader.affected.add(&other, &BTreeSet::new());
    tokio::time::advance(RECHECK).await;
    leader.release_affected();
    assert!(queue.is_empty(), "a derivation's nodes are coalescing");
    tokio::time::advance(COALESCE_QUIET).await;
    leader.release_affected();
    // `other` goes urgent, so the look still waits for it to run.
    assert_eq!(queue.get().await.as_deref(), Some("other"));
    assert!(queue.is_empty());
    queue.done("other");
    tokio::time::advance(RECHECK).await;
    leader.release_affected();
    assert_eq!(queue.get().await.as_deref(), Some("edge"));
}

/// A store holding one ready node, `g/n1`.
async fn store_with_a_ready_node() -> Arc<MemoryStore> {
    use crate::store::model::{Registration, ReplicaRef};
    let store = Arc::new(MemoryStore::new());
    let owner = ReplicaRef {
        id: "r".into(),
        incarnation: 1,
    };
    let registration = Registration {
        node_id: "g/n1".into(),
        group: Some("g".into()),
        ..Registration::default()
    };
    let started = store.begin_session(registration, owner).await;
    let session = started.expect("registers").session.id;
    assert!(
        store
            .mark_ready("g/n1", session)
            .await
            .expect("marks ready")
    );
    store
}

/// A leader on a store holding one ready node, its first read behind
/// `listening`; returns the queue its initial sweep fills.
async fn gated_leader(listening: oneshot::Receiver<()>) -> Arc<WorkQueue> {
    let queue = Arc::new(WorkQueue::new(QueueConfig::default()));
    let leader = leader_on(store_with_a_ready_node().await, &queue);
    tokio::spawn(leader.run(Some(listening), CancellationToken::new()));
    queue
}

#[tokio::test]
async fn a_term_reads_every_row_and_judges_every_node_before_the_first_signal() {
    let queue = Arc::new(WorkQueue::new(QueueConfig::default()));
    let mut leader = leader_on(store_with_a_ready_node().await, &queue);
    leader.resync(true).await.expect("not fenced");
    let rows = leader.state.rows().expect("read at the start of the term");
    assert!(rows.nodes.get("g/n1").is_some());
    assert_eq!(queue.get().await.as_deref(), Some("g/n1"), "swept");
    assert!(leader.seen.contains_key("g/n1"), "its lifecycle judged");
    assert!(!leader.affected.is_empty(), "its arrival noted");
}

#[tokio::test(start_paused = true)]
async fn the_first_read_goes_as_soon_as_the_listener_listens() {
    let (gate, listening) = oneshot::channel();
    let begun = Instant::now();
    let queue = gated_leader(listening).await;
    gate.send(()).expect("the leader waits for the gate");
    assert_eq!(queue.get().await.as_deref(), Some("g/n1"));
    assert!(
        begun.elapsed() < LISTENING_WAIT,
        "read once the gate opened, not at the timeout"
    );
}

#[tokio::test(start_paused = true)]
async fn the_first_read_waits_for_the_listener_at_most_a_while() {
    let (_gate, listening) = oneshot::channel();
    let begun = Instant::now();
    let queue = gated_leader(listening).await;
    assert_eq!(queue.get().await.as_deref(), Some("g/n1"));
    assert!(
        begun.elapsed() >= LISTENING_WAIT,
        "with the gate shut, the read waited {:?}",
        begun.elapsed()
    );
}

/// Gateway `a/n1` was commanded to dial link `l0`, not yet claimed.
async fn leader_awaiting_a_claim(queue: &Arc<WorkQueue>) -> Leader {
    use crate::reconcile::diff::tests::mk_link;
    use crate::store::model::LinkStatus;
    let store = Arc::new(MemoryStore::new());
    let mut link = mk_link("l0", "a/n1", false);
    link.status = LinkStatus::Connecting;
    store.put_link(link).await.expect("stores the link");
    let mut leader = leader_on(store, queue);
    leader.resync(true).await.expect("not fenced");
    let go = leader.pacing.release(
        leader.state.rows(),
        BTreeSet::from(["a/n1".into()]),
        Instant::now(),
        false,
    );
    assert_eq!(go, ["a/n1"], "commanded to dial");
    leader
}

#[tokio::test(start_paused = true)]
async fn an_arrival_waits_for_claims_on_their_way() {
    let queue = Arc::new(WorkQueue::new(QueueConfig::default()));
    let mut leader = leader_awaiting_a_claim(&queue).await;
    edge_arrives(&mut leader).await;
    assert!(queue.is_empty(), "queued while a claim is on its way");
    tokio::time::advance(WAIT_MAX).await;
    leader.release_affected();
    assert_eq!(queue.get().await.as_deref(), Some("edge"), "at the cap");
}

/// `g/n1`, with nothing to dial or claim, is held while a fact waits in
/// the inbox, and queued at the first recheck after the inbox is taken.
#[tokio::test(start_paused = true)]
async fn a_changed_node_waits_for_the_facts_in_the_inbox() {
    use crate::reconcile::pacing::RECHECK;
    let queue = Arc::new(WorkQueue::new(QueueConfig::default()));
    let mut leader = leader_on(store_with_a_ready_node().await, &queue);
    leader.resync(false).await.expect("not fenced");
    leader.inbox.node_changed("other");
    let changed = BTreeSet::from(["g/n1".to_string()]);
    leader.affected.add(&changed, &BTreeSet::new());
    tokio::time::advance(COALESCE_QUIET).await;
    leader.release_affected();
    assert!(queue.is_empty(), "held while a fact waits");
    assert!(leader.pacing.holding());

    let batch = leader.inbox.next_batch().await;
    assert_eq!(batch.nodes, ["other"]);
    tokio::time::advance(RECHECK).await;
    leader.release_affected();
    assert_eq!(queue.get().await.as_deref(), Some("g/n1"), "inbox empty");
    assert!(!leader.pacing.holding());
}
