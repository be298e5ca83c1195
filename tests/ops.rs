//! What operators and load balancers see of a replica: the HTTP endpoint
//! (liveness, readiness, Prometheus metrics), the gRPC health service on
//! both public listeners, and a drain that moves every node to another
//! replica in batches.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::cut::cuttable_database;
use common::pg::{fresh_pg_database, pg_url_for};
use common::scenario::{mk_links, wait_links_in};
use common::{PATIENCE, mk_cluster_config, mk_replica, wait_for};
use slim_cp::config::{DrainConfig, ReconcilerConfig};
use slim_cp::server::{self, Options, Running};
use slim_cp::sim::{Balancer, FleetOptions, SimFleet, SimNodeSpec, SimOptions};
use slim_cp::store::PgStore;

/// A replica of a cluster on the database at `url`, with its HTTP endpoint.
async fn mk_member(url: &str, id: &str, drain: DrainConfig) -> Running {
    common::init_test_log();
    let store = PgStore::connect(url, 4).await.expect("connects");
    let opts = Options {
        http: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
        topology: mk_links(&[("*", &["*"])]),
        reconciler: ReconcilerConfig {
            base_retry_delay: Duration::from_millis(50),
            ..ReconcilerConfig::default()
        },
        drain,
        ..Options::loopback()
    };
    server::start_clustered(opts, store, mk_cluster_config(id))
        .await
        .expect("replica starts")
}

/// `GET path` on the HTTP endpoint: the status code and the body.
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    common::http_get(addr, path)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// `/metrics`, parsed by a Prometheus text parser.
async fn scrape(addr: SocketAddr) -> prometheus_parse::Scrape {
    let (status, body) = get(addr, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).expect("parses")
}

/// The value of sample `name` with labels including `labels` (0 if absent).
fn sample(s: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    s.samples
        .iter()
        .filter(|x| x.metric == name)
        .filter(|x| labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .map(|x| match &x.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => *v,
            _ => 0.0,
        })
        .sum()
}

fn mk_fleet(url: &str, groups: usize, per_group: usize, nodes_per_channel: usize) -> SimFleet {
    let mut specs = Vec::new();
    for g in 0..groups {
        for i in 0..per_group {
            let endpoint = format!("127.0.0.1:{}", 50000 + specs.len());
            let mut spec = SimNodeSpec::new(&format!("n{i}"), Some(&format!("g{g}")), &endpoint);
            spec.external_endpoint = Some(endpoint);
            specs.push(spec);
        }
    }
    let opts = FleetOptions {
        nodes_per_channel,
        node: SimOptions {
            connect_retry_interval: Duration::from_millis(50),
            ..SimOptions::default()
        },
    };
    SimFleet::start(url, specs, opts).expect("fleet starts")
}

async fn wait_status(addr: SocketAddr, path: &str, want: u16, what: &str) -> String {
    wait_for(what, || async {
        let (status, body) = get(addr, path).await;
        if status == want {
            Ok(body)
        } else {
            Err(format!("{status}: {body}"))
        }
    })
    .await
}

/// Scenario: a replica with its HTTP endpoint: alive and ready; the
/// metrics parse and move as a fleet registers and converges; readiness
/// turns 503 while the database is cut and while the replica drains, and
/// back to 200 once the database returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_and_readiness_follows_the_database_and_the_drain() {
    let (path, url) = cuttable_database().await;
    let cp = mk_member(&url, "cp-a", DrainConfig::default()).await;
    let http = cp.http_addr.expect("the endpoint is on");
    assert_eq!(get(http, "/healthz").await.0, 200);
    wait_status(http, "/readyz", 200, "ready").await;
    let before = wait_for("the single member to lead", || async {
        let s = scrape(http).await;
        if sample(&s, "slim_cp_leader", &[]) == 1.0 {
            Ok(s)
        } else {
            Err("not leading".into())
        }
    })
    .await;
    assert_eq!(sample(&before, "slim_cp_registrations_total", &[]), 0.0);

    let fleet = mk_fleet(&format!("http://{}", cp.southbound_addr), 3, 2, 1);
    assert!(
        fleet.wait_all_registered(PATIENCE).await,
        "lost: {:?}",
        fleet.lost()
    );
    wait_links_in(cp.store.as_ref(), &fleet, 3).await;
    // The links are in the store before the reconcile that sends them has
    // its acks and counts its outcome, so wait for those counts too.
    let after = wait_for("the counters to catch up", || async {
        let s = scrape(http).await;
        let recorded = sample(
            &s,
            "slim_cp_registrations_total",
            &[("outcome", "recorded")],
        );
        let converged = sample(&s, "slim_cp_reconciles_total", &[("outcome", "converged")]);
        // Three links from at most three sources: one command each, at least.
        let acked = sample(&s, "slim_cp_commands_total", &[("result", "acked")]);
        if recorded == 6.0 && converged >= 1.0 && acked >= 1.0 {
            Ok(s)
        } else {
            Err(format!(
                "{recorded} registrations, {converged} converged reconciles, {acked} acks"
            ))
        }
    })
    .await;
    assert_eq!(sample(&after, "slim_cp_sessions", &[]), 6.0);
    assert!(
        sample(
            &after,
            "slim_cp_facts_recorded_total",
            &[("kind", "registration")]
        ) == 0.0
    );
    assert!(sample(&after, "slim_cp_facts_recorded_total", &[("kind", "ready")]) >= 6.0);
    // Registrations arriving together share a transaction (group commit).
    let begun = sample(
        &after,
        "slim_cp_store_transactions_total",
        &[("op", "begin_session")],
    );
    assert!((1.0..=6.0).contains(&begun), "{begun} transactions");
    assert!(
        after
            .docs
            .contains_key("slim_cp_reconcile_duration_seconds")
    );
    assert!(sample(&after, "slim_cp_epoch", &[]) >= 1.0);

    path.cut();
    let why = wait_status(http, "/readyz", 503, "not ready without the database").await;
    assert!(why.contains("database unreachable"), "{why}");
    assert_eq!(get(http, "/healthz").await.0, 200, "still alive");
    path.restore();
    wait_status(http, "/readyz", 200, "ready again").await;

    let cp = Arc::new(cp);
    let draining = tokio::spawn({
        let cp = cp.clone();
        async move { cp.drain().await }
    });
    let why = wait_status(http, "/readyz", 503, "not ready while draining").await;
    assert!(why.contains("draining"), "{why}");
    draining.await.expect("drained");
    assert_eq!(cp.registry().len(), 0, "every stream closed");
}

/// Scenario: `grpc_health_probe`-style checks against both listeners
/// report SERVING, overall and for the API each one serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_health_service_reports_serving_on_both_listeners() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    let cp = mk_replica().await;
    let listeners = [
        (cp.southbound_addr, "controller.proto.v1.ControllerService"),
        (
            cp.northbound_addr,
            "controlplane.proto.v1.ControlPlaneService",
        ),
    ];
    for (addr, service) in listeners {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("url")
            .connect()
            .await
            .expect("connects");
        let mut client = HealthClient::new(channel);
        for name in ["", service] {
            let status = wait_for(&format!("{name:?} serving on {addr}"), || {
                let mut client = client.clone();
                async move {
                    let req = HealthCheckRequest {
                        service: name.into(),
                    };
                    let s = client
                        .check(req)
                        .await
                        .map_err(|e| e.to_string())?
                        .into_inner()
                        .status;
                    if s == ServingStatus::Serving as i32 {
                        Ok(s)
                    } else {
                        Err(format!("{s}"))
                    }
                }
            })
            .await;
            assert_eq!(status, ServingStatus::Serving as i32);
        }
        let unknown = client
            .check(HealthCheckRequest {
                service: "no.such.Service".into(),
            })
            .await;
        assert_eq!(unknown.unwrap_err().code(), tonic::Code::NotFound);
    }
}

/// Scenario: 300 nodes on replica A, a second replica B joins behind the
/// same redispatching balancer, A drains: every node moves to B, none is
/// lost, and A closes its streams a batch at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_moves_every_node_in_batches() {
    let url = pg_url_for(&fresh_pg_database().await);
    let drain = DrainConfig {
        lb_grace: Duration::from_millis(200),
        batch: 50,
        interval: Duration::from_millis(300),
    };
    let a = Arc::new(mk_member(&url, "cp-a", drain).await);
    let lb = Balancer::start(vec![a.southbound_addr])
        .await
        .expect("balancer");
    let fleet = mk_fleet(&lb.url(), 10, 30, 1);
    assert!(
        fleet.wait_all_registered(PATIENCE * 2).await,
        "lost: {:?}",
        fleet.lost()
    );
    let b = mk_member(&url, "cp-b", DrainConfig::default()).await;
    lb.set_backends(vec![a.southbound_addr, b.southbound_addr]);

    let held = tokio::spawn({
        let a = a.clone();
        async move {
            let mut seen = vec![a.registry().len()];
            while seen.last() != Some(&0) {
                tokio::time::sleep(Duration::from_millis(5)).await;
                let now = a.registry().len();
                if seen.last() != Some(&now) {
                    seen.push(now);
                }
            }
            seen
        }
    });
    a.drain().await;
    let seen = held.await.expect("watched");
    wait_for("every node on B", || async {
        let on_b = b.registry().len();
        if on_b == 300 {
            Ok(())
        } else {
            Err(format!("{on_b} on B, lost {:?}", fleet.lost()))
        }
    })
    .await;
    // B holds a stream before its reply reaches the node: the last batch's
    // nodes may still be counting their second registration.
    wait_for("each node registered twice (moved once)", || async {
        let counts: Vec<u64> = fleet.nodes().iter().map(|n| n.registrations()).collect();
        match counts.iter().all(|c| *c == 2) {
            true => Ok(()),
            false => Err(format!("registrations per node: {counts:?}")),
        }
    })
    .await;
    assert_eq!(fleet.lost_count(), 0, "lost: {:?}", fleet.lost());
    let steps: Vec<usize> = seen.windows(2).map(|w| w[0].saturating_sub(w[1])).collect();
    assert!(
        steps.iter().all(|s| *s <= 50),
        "at most a batch at a time: {seen:?}"
    );
    assert!(
        steps.iter().filter(|s| **s > 0).count() >= 6,
        "in batches: {seen:?}"
    );
}
