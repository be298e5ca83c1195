//! Derivation alone, no network: `cargo bench --bench derive` (run by
//! hand; `-- --sizes 1000,10000 --db memory,postgres --trials 20`).
//!
//! For each fleet size a store is filled with registered, ready nodes and
//! their announced names (full mesh), and the leader's derivation is run
//! until it changes nothing. Then it times what a leader does per batch
//! (refresh its working state, derive, write): a batch where nothing
//! changed, and a batch where one new node registered, both as a leader
//! does between batches (reading only the batch's rows) and after a resync
//! (reading every table). A derivation whose cost grows with the change,
//! not the fleet, keeps the one-node columns flat across sizes.
//! `--db postgres[:URL]` uses a fresh database on the server of URL (the
//! admin database, default the local one) per size.

#[path = "../common/database.rs"]
#[allow(dead_code)] // shared with the benches that report the database's size
mod database;
#[path = "../common/table.rs"]
mod table;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use slim_cp::config::{AdjacencyEntry, TopologyConfig};
use slim_cp::reconcile::derive::derive;
use slim_cp::reconcile::working::{LinkWrites, WorkingState};
use slim_cp::store::model::{ConnectionDetail, Name, Registration, ReplicaRef};
use slim_cp::store::{MemoryStore, PgStore, Store, StoreError};
use uuid::Uuid;

use database::{BenchDb, DEFAULT_ADMIN_URL};

/// Nodes, groups, names.
const SIZES: [(usize, usize, usize); 3] =
    [(1_000, 50, 100), (10_000, 100, 200), (100_000, 100, 200)];

struct Args {
    sizes: Vec<(usize, usize, usize)>,
    dbs: Vec<Option<String>>,
    trials: usize,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        sizes: SIZES.to_vec(),
        dbs: vec![None],
        trials: 20,
    };
    let mut it = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--sizes" => args.sizes = parse_sizes(&value)?,
            "--db" => args.dbs = parse_dbs(&value)?,
            "--trials" => args.trials = value.parse().context("--trials")?,
            other => bail!("unknown flag {other} (--sizes, --db, --trials)"),
        }
    }
    Ok(args)
}

/// `1000,10000`: node counts; groups and names as in [`SIZES`] for the
/// nearest size at or below.
fn parse_sizes(value: &str) -> Result<Vec<(usize, usize, usize)>> {
    value
        .split(',')
        .map(|n| {
            let nodes: usize = n.trim().parse().with_context(|| format!("size {n:?}"))?;
            let (_, groups, names) = SIZES
                .iter()
                .rev()
                .find(|s| s.0 <= nodes)
                .copied()
                .unwrap_or((0, nodes.clamp(2, 50), 100));
            Ok((nodes, groups.min(nodes), names))
        })
        .collect()
}

fn parse_dbs(value: &str) -> Result<Vec<Option<String>>> {
    value
        .split(',')
        .map(|d| match d.trim() {
            "memory" => Ok(None),
            "postgres" => Ok(Some(DEFAULT_ADMIN_URL.to_string())),
            other => match other.strip_prefix("postgres:") {
                Some(url) => Ok(Some(url.to_string())),
                None => bail!("--db takes memory, postgres or postgres:URL, not {other:?}"),
            },
        })
        .collect()
}

fn mesh() -> TopologyConfig {
    TopologyConfig::Links(vec![AdjacencyEntry {
        group: "*".into(),
        neighbors: vec!["*".into()],
    }])
}

fn registration(k: usize, groups: usize) -> Registration {
    let (group, id) = (format!("g{}", k % groups), format!("n{k}"));
    Registration {
        node_id: format!("{group}/{id}"),
        group: Some(group),
        connection_details: vec![ConnectionDetail {
            endpoint: format!("10.{}.{}.{}:46357", k >> 16, (k >> 8) & 255, k & 255),
            external_endpoint: Some(format!("n{k}.example:46357")),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Registers node `k` and marks it ready; announces name `k` if it has one.
async fn register(
    store: &dyn Store,
    k: usize,
    groups: usize,
    names: usize,
) -> Result<(String, Uuid)> {
    let reg = registration(k, groups);
    let node = reg.node_id.clone();
    let owner = ReplicaRef {
        id: "bench".into(),
        incarnation: 1,
    };
    let session = store.begin_session(reg, owner).await?.session.id;
    store.mark_ready(&node, session).await?;
    if k < names {
        let name = Name {
            components: ["org".into(), "ns".into(), format!("app{k}")],
            id: None,
        };
        store
            .record_announcements(&node, session, &[name], &[])
            .await?;
    }
    Ok((node, session))
}

/// Every planned link's destination reports it received the link, as a
/// node does once the source's dial lands: the claims that let routes
/// follow.
async fn claim_all(store: &dyn Store, sessions: &HashMap<String, Uuid>) -> Result<()> {
    let nodes = store.list_nodes().await?;
    let by_endpoint: HashMap<&str, &str> = nodes
        .iter()
        .filter_map(|n| {
            let ext = n.connection_details.first()?.external_endpoint.as_deref()?;
            Some((ext, n.id.as_str()))
        })
        .collect();
    for l in store
        .list_links()
        .await?
        .iter()
        .filter(|l| l.dest_node.is_none())
    {
        let Some(dest) = by_endpoint.get(l.dest_endpoint.as_str()) else {
            bail!("no node serves {}", l.dest_endpoint);
        };
        let session = sessions
            .get(*dest)
            .context("a destination without a session")?;
        store
            .record_received(dest, *session, std::slice::from_ref(&l.link_id))
            .await?;
    }
    Ok(())
}

/// One leader batch for the `arrived` nodes: refresh, derive, write.
/// Returns its duration and how many rows it changed.
async fn batch(
    store: &dyn Store,
    state: &mut WorkingState,
    arrived: &BTreeSet<String>,
) -> Result<(Duration, usize)> {
    let t = Instant::now();
    let signalled: Vec<String> = arrived.iter().cloned().collect();
    state.refresh(store, &signalled).await?;
    let d = derive(store, &mesh(), arrived, state).await?;
    Ok((t.elapsed(), d.changes))
}

struct Row {
    size: (usize, usize, usize),
    store: &'static str,
    first: Duration,
    idle: Vec<Duration>,
    one_node: Vec<Duration>,
    /// One node joins, right after a resync: every table read.
    one_node_full: Vec<Duration>,
    links: usize,
    routes: usize,
    /// Median time of each whole-table read a batch makes.
    reads: [Duration; 4],
}

/// What each of the batch's whole-table reads costs: nodes, links,
/// routes, templates.
async fn reads(store: &dyn Store, trials: usize) -> Result<[Duration; 4]> {
    let mut times: [Vec<Duration>; 4] = Default::default();
    for _ in 0..trials {
        times[0].push(timed(store.list_nodes()).await?);
        times[1].push(timed(store.list_links()).await?);
        times[2].push(timed(store.list_routes()).await?);
        times[3].push(timed(store.list_templates()).await?);
    }
    Ok(times.map(|mut v| median(&mut v)))
}

async fn timed<T>(read: impl Future<Output = Result<T, StoreError>>) -> Result<Duration> {
    let t = Instant::now();
    read.await?;
    Ok(t.elapsed())
}

async fn measure(store: Arc<dyn Store>, size: (usize, usize, usize), trials: usize) -> Result<Row> {
    let (nodes, groups, names) = size;
    let mut sessions = HashMap::new();
    for k in 0..nodes {
        let (node, session) = register(store.as_ref(), k, groups, names).await?;
        sessions.insert(node, session);
    }
    let state = &mut WorkingState::new(Arc::new(LinkWrites::default()));
    let none = &BTreeSet::new();
    let (first, _) = batch(store.as_ref(), state, none).await?;
    claim_all(store.as_ref(), &sessions).await?;
    state.invalidate();
    while batch(store.as_ref(), state, none).await?.1 > 0 {}
    let (mut idle, mut one_node, mut one_node_full) = (Vec::new(), Vec::new(), Vec::new());
    for t in 0..trials {
        idle.push(batch(store.as_ref(), state, none).await?.0);
        let (node, _) = register(store.as_ref(), nodes + 2 * t, groups, 0).await?;
        one_node.push(
            batch(store.as_ref(), state, &BTreeSet::from([node]))
                .await?
                .0,
        );
        let (node, _) = register(store.as_ref(), nodes + 2 * t + 1, groups, 0).await?;
        state.invalidate();
        let full = batch(store.as_ref(), state, &BTreeSet::from([node])).await?;
        one_node_full.push(full.0);
    }
    Ok(Row {
        size,
        store: "",
        first,
        idle,
        one_node,
        one_node_full,
        reads: reads(store.as_ref(), trials).await?,
        links: store.list_links().await?.len(),
        routes: store.list_routes().await?.len(),
    })
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = parse_args()?;
    let mut rows = Vec::new();
    for &size in &args.sizes {
        for db in &args.dbs {
            eprintln!(
                "{size:?} on {}",
                db.as_deref().map_or("memory", |_| "postgres")
            );
            let row = match db {
                None => measure(Arc::new(MemoryStore::new()), size, args.trials)
                    .await
                    .map(|r| Row {
                        store: "memory",
                        ..r
                    })?,
                Some(admin) => {
                    let bench_db = BenchDb::create(admin, "derive").await?;
                    let store = PgStore::connect(&bench_db.url, 8).await?;
                    let row = measure(Arc::new(store), size, args.trials).await;
                    bench_db.remove().await?;
                    row.map(|r| Row {
                        store: "postgres",
                        ..r
                    })?
                }
            };
            rows.push(row);
        }
    }
    print(rows);
    Ok(())
}

fn print(rows: Vec<Row>) {
    let header = [
        "nodes / groups / names",
        "store",
        "links",
        "routes",
        "first derivation",
        "no change (median)",
        "one node joins (median)",
        "one node joins (max)",
        "one node joins after a resync (median)",
        "reads: nodes / links / routes / templates",
    ];
    let cells = rows
        .into_iter()
        .map(|mut r| {
            let max = r.one_node.iter().max().copied().unwrap_or_default();
            vec![
                format!("{} / {} / {}", r.size.0, r.size.1, r.size.2),
                r.store.to_string(),
                r.links.to_string(),
                r.routes.to_string(),
                ms(r.first),
                ms(median(&mut r.idle)),
                ms(median(&mut r.one_node)),
                ms(max),
                ms(median(&mut r.one_node_full)),
                r.reads.map(ms).join(" / "),
            ]
        })
        .collect::<Vec<_>>();
    table::print(&header, &cells, &[0, 1]);
}
