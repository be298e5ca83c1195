//! The leader's working state against a full rebuild: after any sequence
//! of facts, leader batches, reconciler writes and time passing, a
//! refreshed working state holds exactly the rows a fresh leader would
//! read, and each batch's derivation of what changed plans exactly what a
//! derivation of everything would, on both stores.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use slim_cp::config::{AdjacencyEntry, TopologyConfig};
use slim_cp::reconcile::derive::{Planned, commit, plan};
use slim_cp::reconcile::working::{LinkWrites, Rows, WorkingState};
use slim_cp::store::model::{
    ConnectionDetail, DepartureKind, Link, LinkAnswer, Name, Registration, ReplicaRef, Route,
    RouteStatus,
};
use slim_cp::store::{ChangeSet, MemoryStore, Store};

const NODES: usize = 8;
const GROUPS: usize = 4;

/// Batches whose derivation looked at what changed only, and changed
/// something: the histories must make some, or the comparison proves
/// nothing.
static NARROW_CHANGES: AtomicUsize = AtomicUsize::new(0);

/// Nodes whose rows in the reconcilers' view were compared with the
/// store's.
static VIEWS_COMPARED: AtomicUsize = AtomicUsize::new(0);

/// One thing that happens to the store between or during leader batches.
#[derive(Debug, Clone)]
enum Op {
    Register(usize),
    Announce(usize, usize),
    Withdraw(usize, usize),
    End(usize, bool),
    Forget(usize),
    /// The node reports every live link into its group as received.
    Claim(usize),
    /// A reconciler records its answers to the node's links.
    Answer(usize, bool),
    /// A reconciler deletes every tombstone.
    ForgetTombstones,
    /// The clock moves on this many seconds: graces end.
    Wait(i64),
    Batch,
}

fn op() -> impl Strategy<Value = Op> {
    let k = 0..NODES;
    prop_oneof![
        3 => k.clone().prop_map(Op::Register),
        2 => (k.clone(), 0..3usize).prop_map(|(k, n)| Op::Announce(k, n)),
        1 => (k.clone(), 0..3usize).prop_map(|(k, n)| Op::Withdraw(k, n)),
        1 => (k.clone(), any::<bool>()).prop_map(|(k, d)| Op::End(k, d)),
        1 => k.clone().prop_map(Op::Forget),
        2 => k.clone().prop_map(Op::Claim),
        1 => (k, any::<bool>()).prop_map(|(k, ok)| Op::Answer(k, ok)),
        1 => Just(Op::ForgetTombstones),
        1 => (1..5i64).prop_map(Op::Wait),
        4 => Just(Op::Batch),
    ]
}

fn node(k: usize) -> String {
    format!("g{}/n{k}", k % GROUPS)
}

fn name(n: usize) -> Name {
    Name {
        components: ["org".into(), "ns".into(), format!("app{n}")],
        id: None,
    }
}

fn mesh() -> TopologyConfig {
    TopologyConfig::Links(vec![AdjacencyEntry {
        group: "*".into(),
        neighbors: vec!["*".into()],
    }])
}

/// A leader as far as its working state goes: the nodes signalled since
/// its last batch, and the links its reconcilers wrote.
struct World {
    store: Arc<dyn Store>,
    state: WorkingState,
    writes: Arc<LinkWrites>,
    signalled: BTreeSet<String>,
    /// Seconds the leader's clock is ahead of the store's.
    ahead: i64,
    /// Link ids minted so far: both plans of a batch mint the same ones.
    minted: usize,
    /// This history's own link ids (Postgres keeps every history's rows).
    prefix: String,
}

impl World {
    fn new(store: Arc<dyn Store>) -> Self {
        let writes = Arc::new(LinkWrites::default());
        Self {
            store,
            state: WorkingState::new(writes.clone()),
            writes,
            signalled: BTreeSet::new(),
            ahead: 0,
            minted: 0,
            prefix: uuid::Uuid::new_v4().simple().to_string(),
        }
    }

    async fn session(&self, k: usize) -> Option<uuid::Uuid> {
        let rec = self.store.get_node(&node(k)).await.ok()??;
        rec.session.map(|s| s.id)
    }

    async fn run(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let s = self.store.clone();
        let store = s.as_ref();
        match *op {
            Op::Register(k) => {
                let reg = Registration {
                    node_id: node(k),
                    group: Some(format!("g{}", k % GROUPS)),
                    connection_details: vec![ConnectionDetail {
                        endpoint: format!("10.0.0.{k}:46357"),
                        external_endpoint: Some(format!("n{k}.example:46357")),
                        ..Default::default()
                    }],
                    ..Default::default()
                };
                let owner = ReplicaRef {
                    id: "r1".into(),
                    incarnation: 1,
                };
                let started = store.begin_session(reg, owner).await;
                let session = started.map_err(fail)?.session.id;
                store.mark_ready(&node(k), session).await.map_err(fail)?;
            }
            Op::Announce(k, n) | Op::Withdraw(k, n) => {
                let Some(session) = self.session(k).await else {
                    return Ok(());
                };
                let (set, gone) = match op {
                    Op::Announce(..) => (vec![name(n)], vec![]),
                    _ => (vec![], vec![name(n)]),
                };
                let id = node(k);
                let done = store.record_announcements(&id, session, &set, &gone);
                done.await.map_err(fail)?;
            }
            Op::End(k, deregistered) => {
                let Some(session) = self.session(k).await else {
                    return Ok(());
                };
                let kind = match deregistered {
                    true => DepartureKind::Deregistered,
                    false => DepartureKind::Crash,
                };
                store
                    .end_session(&node(k), session, kind)
                    .await
                    .map_err(fail)?;
            }
            Op::Forget(k) => {
                let Some(rec) = store.get_node(&node(k)).await.map_err(fail)? else {
                    return Ok(());
                };
                store
                    .forget_node(&node(k), rec.generation)
                    .await
                    .map_err(fail)?;
            }
            Op::Claim(k) => {
                let Some(session) = self.session(k).await else {
                    return Ok(());
                };
                let group = format!("g{}", k % GROUPS);
                let links = store.list_links().await.map_err(fail)?;
                let into: Vec<String> = links
                    .into_iter()
                    .filter(|l| !l.deleted && l.dest_group == group)
                    .map(|l| l.link_id)
                    .collect();
                let id = node(k);
                let done = store.record_received(&id, session, &into);
                done.await.map_err(fail)?;
            }
            Op::Answer(k, ok) => {
                let links = store.links_touching(&node(k)).await.map_err(fail)?;
                let answers: Vec<LinkAnswer> = links
                    .iter()
                    .filter(|l| l.source_node == node(k))
                    .map(|l| LinkAnswer {
                        link_id: l.link_id.clone(),
                        ok,
                        message: String::new(),
                    })
                    .collect();
                store
                    .mark_links_sent(&node(k), &answers)
                    .await
                    .map_err(fail)?;
                self.writes.wrote(answers.iter().map(|a| &a.link_id));
                return Ok(());
            }
            Op::ForgetTombstones => {
                let links = store.list_links().await.map_err(fail)?;
                let gone: Vec<String> = links
                    .into_iter()
                    .filter(|l| l.deleted)
                    .map(|l| l.link_id)
                    .collect();
                let changes = ChangeSet {
                    delete_links: gone.clone(),
                    ..ChangeSet::default()
                };
                store.apply(changes).await.map_err(fail)?;
                self.writes.wrote(&gone);
                return Ok(());
            }
            Op::Wait(secs) => {
                self.ahead += secs;
                return Ok(());
            }
            Op::Batch => return self.batch().await,
        }
        if let Op::Register(k)
        | Op::Announce(k, _)
        | Op::Withdraw(k, _)
        | Op::End(k, _)
        | Op::Forget(k)
        | Op::Claim(k) = *op
        {
            self.signalled.insert(node(k));
        }
        Ok(())
    }

    /// A leader batch, checked twice: its derivation of what changed plans
    /// what one of everything would, and, refreshed, the working state
    /// reads as a full rebuild would.
    async fn batch(&mut self) -> Result<(), TestCaseError> {
        let store = self.store.clone();
        let nodes: Vec<String> = std::mem::take(&mut self.signalled).into_iter().collect();
        let arrived = nodes.iter().cloned().collect();
        self.state
            .refresh(store.as_ref(), &nodes)
            .await
            .map_err(fail)?;
        let now = self.state.now(store.as_ref()).await.map_err(fail)? + self.ahead;
        self.state.prepare(&mesh(), Vec::new(), now).map_err(fail)?;
        let incremental = self.plan(&arrived, now, false)?;
        let whole = self.plan(&arrived, now, true)?;
        prop_assert_eq!(&incremental.changes, &whole.changes);
        prop_assert_eq!(&incremental.drops, &whole.drops);
        prop_assert_eq!(&incremental.derivation.affected, &whole.derivation.affected);
        prop_assert_eq!(
            incremental.derivation.recheck_in,
            whole.derivation.recheck_in
        );
        if !incremental.derivation.full && !incremental.changes.is_empty() {
            NARROW_CHANGES.fetch_add(1, Ordering::Relaxed);
        }
        self.minted += incremental.changes.put_links.len();
        commit(store.as_ref(), &mut self.state, incremental, now)
            .await
            .map_err(fail)?;
        self.state
            .refresh(store.as_ref(), &[])
            .await
            .map_err(fail)?;
        let full = Rows::load(store.as_ref()).await.map_err(fail)?;
        prop_assert_eq!(self.state.rows(), Some(&full));
        // What reconcilers read of each node equals the store's rows.
        let nodes: BTreeSet<&str> = (full.nodes.iter().map(|n| n.id.as_str()))
            .chain(full.links.iter().map(|l| l.source_node.as_str()))
            .chain(full.links.iter().filter_map(|l| l.dest_node.as_deref()))
            .chain(full.routes.iter().map(|(_, source)| source))
            .collect();
        for n in nodes {
            self.same_view(store.as_ref(), n).await?;
        }
        Ok(())
    }

    /// The view's rows of `node` are the store's, but for what a reconcile
    /// does not read (statuses, messages, times), and a route the view
    /// holds as applied is applied in the store.
    async fn same_view(&self, store: &dyn Store, node: &str) -> Result<(), TestCaseError> {
        let Some(seen) = self.state.view().of(node) else {
            return Err(fail(format!(
                "the view is silent for {node} after a refresh"
            )));
        };
        let (links, routes) = store.reconcile_view(node).await.map_err(fail)?;
        let link_key = |l: &Link| {
            let endpoint = (l.dest_endpoint.clone(), l.config_data.clone());
            (
                l.link_id.clone(),
                l.source_node.clone(),
                l.dest_node.clone(),
                l.deleted,
                endpoint,
            )
        };
        let mut viewed: Vec<_> = seen.links.iter().map(link_key).collect();
        viewed.sort();
        prop_assert_eq!(
            viewed,
            links.iter().map(link_key).collect::<Vec<_>>(),
            "links of {}",
            node
        );
        let route_key = |r: &Route| {
            (
                r.id.clone(),
                r.link_id.clone(),
                r.name.clone(),
                r.dest_node.clone(),
            )
        };
        let viewed: Vec<_> = seen.routes.iter().map(route_key).collect();
        prop_assert_eq!(
            viewed,
            routes.iter().map(route_key).collect::<Vec<_>>(),
            "routes of {}",
            node
        );
        for (v, s) in seen.routes.iter().zip(&routes) {
            let applied = RouteStatus::Applied;
            prop_assert!(
                v.status != applied || s.status == applied,
                "{} marked ahead",
                v.id
            );
        }
        VIEWS_COMPARED.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The batch's plan, minting link ids after those minted so far.
    fn plan(
        &self,
        arrived: &BTreeSet<String>,
        now: i64,
        whole: bool,
    ) -> Result<Planned, TestCaseError> {
        let mut n = self.minted;
        let mut mint = || {
            n += 1;
            format!("l-{}-{n}", self.prefix)
        };
        plan(&self.state, arrived, now, whole, &mut mint).map_err(fail)
    }
}

fn fail(e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

/// Runs `cases` random histories, each with a leader that starts from
/// nothing, on stores made by `make` (Postgres: one database, the
/// histories piling up in it; the rows compared are all of them).
fn check<F, Fut>(cases: u32, make: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Arc<dyn Store>>,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let mut runner = TestRunner::new(Config {
        cases,
        ..Config::default()
    });
    let history = proptest::collection::vec(op(), 1..40);
    let outcome = runner.run(&history, |ops| {
        rt.block_on(async {
            let mut world = World::new(make().await);
            // A node in every group first: later derivations then mostly
            // look at what changed (a group coming or going is a full one).
            let prelude: Vec<Op> = (0..GROUPS).map(Op::Register).chain([Op::Batch]).collect();
            for op in prelude.iter().chain(&ops).chain([&Op::Batch]) {
                world.run(op).await?;
            }
            Ok(())
        })
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }
    let compared = VIEWS_COMPARED.swap(0, Ordering::Relaxed);
    assert!(compared >= cases as usize, "only {compared} views compared");
    let narrow = NARROW_CHANGES.swap(0, Ordering::Relaxed);
    assert!(
        narrow >= cases as usize,
        "only {narrow} narrow derivations changed anything"
    );
}

#[test]
fn memory_incremental_state_equals_a_full_rebuild() {
    check(256, || async {
        Arc::new(MemoryStore::new()) as Arc<dyn Store>
    });
}

#[test]
fn postgres_incremental_state_equals_a_full_rebuild() {
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let store: Arc<dyn Store> = rt.block_on(common::pg::fresh_pg_store());
    check(48, move || {
        let store = store.clone();
        async move { store }
    });
}

/// Scenario: a destination's claim fact reaches the leader before the
/// signal of the source's new session, whose connection it reports (the
/// two signals travel apart). The claim is made under that session, so
/// the source's late signal finds the link claimed, rather than outdated
/// with the claim fact already spent.
async fn a_claim_ahead_of_its_sources_signal_is_made_under_the_new_session(store: Arc<dyn Store>) {
    let (source, dest) = (0, 1);
    let mut w = World::new(store.clone());
    let steps = [
        Op::Register(source),
        Op::Register(dest),
        Op::Batch,
        Op::Claim(dest),
        Op::Batch,
        Op::End(source, false),
        Op::Batch,
        Op::Register(source),
    ];
    for op in &steps {
        w.run(op).await.expect("a step");
    }
    let late = w.signalled.remove(&node(source));
    assert!(late, "the source's registration signalled it");
    w.run(&Op::Claim(dest)).await.expect("the claim");
    w.run(&Op::Batch).await.expect("the batch of the claim");
    w.signalled.insert(node(source));
    w.run(&Op::Batch)
        .await
        .expect("the batch of the late signal");
    let links = store.list_links().await.expect("the links");
    let live: Vec<_> = links
        .iter()
        .filter(|l| !l.deleted && l.link_id.contains(&w.prefix))
        .collect();
    assert_eq!(live.len(), 1, "one link: {links:?}");
    let generation = w.generation(source).await;
    assert_eq!(
        live[0].status,
        slim_cp::store::model::LinkStatus::Applied,
        "{:?}",
        live[0]
    );
    let claim = live[0].claim.expect("claimed");
    assert_eq!(
        claim.source_generation, generation,
        "under the source's new session"
    );
}

#[test]
fn memory_a_claim_ahead_of_its_sources_signal_is_made_under_the_new_session() {
    on_memory(a_claim_ahead_of_its_sources_signal_is_made_under_the_new_session);
}

#[test]
fn postgres_a_claim_ahead_of_its_sources_signal_is_made_under_the_new_session() {
    on_postgres(a_claim_ahead_of_its_sources_signal_is_made_under_the_new_session);
}

/// Scenario: a claim is read as part of a source read for another claim.
/// `c` claims `b -> c`, so the leader reads `b` again; `b`'s record holds
/// its own claim of `a -> b`, made over a connection from `a`'s new
/// session, whose signal has not arrived. That claim too is made under the
/// new session: the source of every claim read is read with it, however
/// the claims chain.
async fn a_claim_read_with_a_claims_source_is_made_under_its_sources_new_session(
    store: Arc<dyn Store>,
) {
    let (a, b, c) = (0, 1, 2);
    let mut w = World::new(store.clone());
    for op in [Op::Register(a), Op::Register(b), Op::Register(c), Op::Batch] {
        w.run(&op).await.expect("a step");
    }
    for op in [Op::Claim(b), Op::Claim(c), Op::Batch] {
        w.run(&op).await.expect("a step");
    }
    let ab = w.live_link(a, b).await;
    let bc = w.live_link(b, c).await;
    for op in [Op::End(a, false), Op::End(b, false), Op::Batch] {
        w.run(&op).await.expect("a step");
    }
    for op in [Op::Register(a), Op::Register(b)] {
        w.run(&op).await.expect("a step");
    }
    w.signalled.clear();
    w.receive(b, &ab).await;
    w.receive(c, &bc).await;
    w.signalled.insert(node(c));
    w.run(&Op::Batch).await.expect("the batch of c's claim");
    w.signalled.extend([node(a), node(b)]);
    w.run(&Op::Batch)
        .await
        .expect("the batch of the late signals");
    for (link, source) in [(&ab, a), (&bc, b)] {
        let l = w.live_link_by_id(link).await;
        assert_eq!(
            l.status,
            slim_cp::store::model::LinkStatus::Applied,
            "{l:?}"
        );
        let generation = w.generation(source).await;
        let claim = l.claim.expect("claimed");
        assert_eq!(claim.source_generation, generation, "{l:?}");
    }
}

impl World {
    /// This history's live link from `source` into `dest`'s group.
    async fn live_link(&self, source: usize, dest: usize) -> String {
        let links = self.store.list_links().await.expect("the links");
        let dest_group = format!("g{}", dest % GROUPS);
        let found = links.iter().find(|l| {
            !l.deleted
                && l.link_id.contains(&self.prefix)
                && l.source_node == node(source)
                && l.dest_group == dest_group
        });
        found.expect("the link").link_id.clone()
    }

    async fn live_link_by_id(&self, id: &str) -> slim_cp::store::model::Link {
        let links = self.store.list_links().await.expect("the links");
        let found = links.into_iter().find(|l| !l.deleted && l.link_id == id);
        found.expect("the live link")
    }

    /// Node `k`'s generation in the store.
    async fn generation(&self, k: usize) -> u64 {
        let rec = self.store.get_node(&node(k)).await.expect("read");
        rec.expect("the node").generation
    }

    /// Node `k`'s current session reports `link` as received.
    async fn receive(&self, k: usize, link: &str) {
        let session = self.session(k).await.expect("a session");
        let (id, into) = (node(k), [link.to_string()]);
        let done = self.store.record_received(&id, session, &into);
        done.await.expect("the claim fact");
    }
}

#[test]
fn memory_a_claim_read_with_a_claims_source_is_made_under_its_sources_new_session() {
    on_memory(a_claim_read_with_a_claims_source_is_made_under_its_sources_new_session);
}

#[test]
fn postgres_a_claim_read_with_a_claims_source_is_made_under_its_sources_new_session() {
    on_postgres(a_claim_read_with_a_claims_source_is_made_under_its_sources_new_session);
}

/// Runs `scenario` on a memory store.
fn on_memory<Fut: std::future::Future<Output = ()>>(scenario: fn(Arc<dyn Store>) -> Fut) {
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    rt.block_on(scenario(Arc::new(MemoryStore::new())));
}

/// Runs `scenario` on a fresh Postgres database.
fn on_postgres<Fut: std::future::Future<Output = ()>>(scenario: fn(Arc<dyn Store>) -> Fut) {
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    rt.block_on(async { scenario(common::pg::fresh_pg_store().await).await });
}
