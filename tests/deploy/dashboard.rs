//! The dashboard's side of the deploy check: the metric names its queries
//! use, and the names a real `slim-cp serve` exports, started with the
//! compose configuration (its listeners moved to free loopback ports) on
//! a fresh Postgres database.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use yaml_serde::Value;

use crate::common::pg::{fresh_pg_database, pg_url_for};
use crate::common::{PATIENCE, RawNode, announce, http_get, mk_register, wait_for};
use slim_cp::proto::cluster as pb;
use slim_cp::proto::cluster::relay_client::RelayClient;

/// Every `slim_cp_*` name in the dashboard's queries and variables.
pub fn queried_metrics(dashboard: &serde_json::Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    collect(dashboard, &mut out);
    assert!(!out.is_empty(), "the dashboard queries nothing");
    out
}

fn collect(v: &serde_json::Value, out: &mut BTreeSet<String>) {
    match v {
        serde_json::Value::String(text) => {
            let mut rest = text.as_str();
            while let Some(i) = rest.find("slim_cp_") {
                let tail = &rest[i..];
                let end = tail
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(tail.len());
                out.insert(tail[..end].to_string());
                rest = &tail[end..];
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|i| collect(i, out)),
        serde_json::Value::Object(map) => map.values().for_each(|i| collect(i, out)),
        _ => {}
    }
}

/// Family name -> the sample names Prometheus stores for it, from the
/// `# TYPE` lines (a labelled family nobody has incremented yet has no
/// sample lines, but its type line is there).
pub fn exported(page: &str) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for line in page.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut w = rest.split_whitespace();
        let (Some(name), Some(kind)) = (w.next(), w.next()) else {
            continue;
        };
        let samples = match kind {
            "counter" => vec![format!("{name}_total")],
            "histogram" => ["_bucket", "_sum", "_count"]
                .iter()
                .map(|s| format!("{name}{s}"))
                .collect(),
            _ => vec![name.to_string()],
        };
        out.insert(name.to_string(), samples);
    }
    out
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Kills the replica when the test ends, however it ends.
struct Replica(Child);

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn wait_status(addr: SocketAddr, path: &str) -> String {
    wait_for(&format!("GET {path} to answer 200"), || async {
        match http_get(addr, path).await? {
            (200, body) => Ok(body),
            (code, body) => Err(format!("{code}: {body}")),
        }
    })
    .await
}

/// The listeners of a replica started by the test.
struct Addrs {
    http: SocketAddr,
    southbound: SocketAddr,
    relay: SocketAddr,
}

/// `config` with its four listeners on free loopback ports.
fn on_loopback(config: &mut Value) -> Addrs {
    let addr = |port| SocketAddr::from(([127, 0, 0, 1], port));
    let addrs = Addrs {
        http: addr(free_port()),
        southbound: addr(free_port()),
        relay: addr(free_port()),
    };
    for (path, at) in [
        (&["northbound"][..], addr(free_port())),
        (&["southbound"][..], addrs.southbound),
        (&["http"][..], addrs.http),
        (&["cluster", "relay"][..], addrs.relay),
    ] {
        let mut v = &mut *config;
        for key in path {
            v = &mut v[*key];
        }
        v["endpoint"] = Value::String(at.to_string());
    }
    addrs
}

/// Gives every labelled family a child, as a fleet would: a node
/// registers (registrations, facts, then the leader's reconcile), one is
/// refused (refusals), and a stranger calls the relay (relay calls).
/// Returns the node's stream: the caller keeps it open until it has read
/// the page, since closing it could drop the announcement still queued
/// on the client side (a flake: `entries_dropped` never counted).
async fn exercise(addrs: &Addrs) -> RawNode {
    let mut node = RawNode::open_at(addrs.southbound).await.expect("stream");
    assert!(node.register(mk_register("g1", "n1")).await.success);
    node.answer_empty_tables().await;
    // An announcement with an empty name component: dropped and counted.
    node.send(announce(&[""])).await;
    let mut nameless = RawNode::open_at(addrs.southbound).await.expect("stream");
    let refused = nameless.register(mk_register("g1", "")).await;
    assert!(!refused.success, "an empty node id is refused");
    let mut relay = RelayClient::connect(format!("http://{}", addrs.relay))
        .await
        .expect("relay listens");
    let stranger = relay.inspect(pb::InspectRequest {}).await;
    assert_eq!(
        stranger.map(|_| ()).map_err(|s| s.code()),
        Err(tonic::Code::Unauthenticated)
    );
    node
}

/// Runs `slim-cp serve` with `config_file` on loopback, on a fresh
/// database, until it leads; checks `/healthz` and `/readyz` answer 200,
/// exercises it, and returns the first `/metrics` page that has every
/// name in `want` (or the last one).
pub async fn scrape_running_replica(config_file: &Path, want: &BTreeSet<String>) -> String {
    let text = std::fs::read_to_string(config_file).expect("config readable");
    let mut config: Value = yaml_serde::from_str(&text).expect("config parses");
    let addrs = on_loopback(&mut config);
    let http = addrs.http;
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("deploy-dashboard-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("test dir");
    let file = dir.join("slim-cp.yaml");
    std::fs::write(&file, yaml_serde::to_string(&config).expect("yaml")).expect("written");
    let url = pg_url_for(&fresh_pg_database().await);
    let log = std::fs::File::create(dir.join("slim-cp.log")).expect("log");
    let child = Command::new(env!("CARGO_BIN_EXE_slim-cp"))
        .args(["serve", "--config"])
        .arg(&file)
        .env("SLIM_CP_DATABASE_URL", &url)
        .env("SLIM_CP_REPLICA_ID", "dashboard-0")
        .env_remove("SLIM_CP_CLUSTER_SECRET")
        .stdout(Stdio::from(log.try_clone().expect("log")))
        .stderr(Stdio::from(log))
        .spawn()
        .expect("slim-cp starts");
    let _replica = Replica(child);
    wait_status(http, "/healthz").await;
    wait_status(http, "/readyz").await;
    wait_for("the replica to lead", || async {
        let (_, page) = http_get(http, "/metrics").await?;
        if page.lines().any(|l| l == "slim_cp_leader 1") {
            Ok(())
        } else {
            Err(page)
        }
    })
    .await;
    let _node = exercise(&addrs).await;
    // Bounded: a name the replica never exports fails the caller's check
    // with this page, after PATIENCE.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let page = loop {
        let (_, page) = http_get(http, "/metrics").await.expect("metrics");
        let names: BTreeSet<String> = exported(&page).into_values().flatten().collect();
        if want.is_subset(&names) || tokio::time::Instant::now() >= deadline {
            break page;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let _ = std::fs::remove_dir_all(&dir);
    page
}
