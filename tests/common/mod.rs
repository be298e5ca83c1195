//! Shared helpers for integration tests: a replica on loopback, a raw node
//! that speaks the southbound protocol message by message, and waits that
//! dump state when they time out.

#![allow(dead_code)]

pub mod backend;
pub mod cut;
pub mod pg;
pub mod pki;
pub mod proxy;
pub mod reach;
pub mod scenario;

use std::future::Future;
use std::time::Duration;

use slim_cp::config::ClusterConfig;
use slim_cp::proto::sb::control_message::Payload;
use slim_cp::proto::sb::controller_service_client::ControllerServiceClient;
use slim_cp::proto::{dp, sb};
use slim_cp::server::{self, Options, Running};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

/// Generous bound for things that happen promptly on a healthy machine.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A replica on a fresh store of the running scenario's backend (see
/// [`backend`]; memory by default).
pub async fn start_replica(opts: Options) -> Running {
    server::start(opts, backend::fresh_store().await)
        .await
        .expect("replica starts")
}

/// The ids of the nodes the replica's store holds, sorted.
pub async fn stored_node_ids(running: &Running) -> Vec<String> {
    let mut ids: Vec<String> = running
        .store
        .list_nodes()
        .await
        .expect("the store lists nodes")
        .into_iter()
        .map(|n| n.id)
        .collect();
    ids.sort();
    ids
}

pub async fn mk_replica() -> Running {
    start_replica(Options::loopback()).await
}

/// `GET path` over plain HTTP/1.1 (the ops endpoint): the status code and
/// the body, or why the exchange failed.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> Result<(u16, String), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    conn.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("send: {e}"))?;
    let mut raw = String::new();
    conn.read_to_string(&mut raw)
        .await
        .map_err(|e| format!("read: {e}"))?;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_string()))
}

/// Opt-in logging (`SLIM_CP_TEST_LOG` holds a filter): a race found
/// under load is read from the replicas' own log.
pub fn init_test_log() {
    if let Ok(f) = std::env::var("SLIM_CP_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(f))
            .with_test_writer()
            .try_init();
    }
}

/// A cluster member's settings with timings short enough for tests.
pub fn mk_cluster_config(id: &str) -> ClusterConfig {
    ClusterConfig {
        replica_id: Some(id.into()),
        relay_endpoint: "127.0.0.1:0".into(),
        lease: Duration::from_secs(2),
        renew: Duration::from_millis(500),
        heartbeat: Duration::from_millis(300),
        replica_ttl: Duration::from_secs(3),
        ..ClusterConfig::default()
    }
}

/// Polls `check` until it yields `Some`, or panics with `what` and the
/// last state `dump` describes.
pub async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut last = String::new();
    while tokio::time::Instant::now() < deadline {
        match check().await {
            Ok(v) => return v,
            Err(state) => last = state,
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}; last state: {last}");
}

/// Waits until `count` yields `want` (a store call's count, say).
pub async fn wait_count<E, F, Fut>(what: &str, want: usize, mut count: F)
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<usize, E>>,
{
    wait_for(what, || {
        let next = count();
        async move {
            match next.await {
                Ok(n) if n == want => Ok(()),
                Ok(n) => Err(format!("{n}, want {want}")),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await;
}

/// A node driven by hand: every message is the test's to send and read.
pub struct RawNode {
    pub tx: mpsc::Sender<sb::ControlMessage>,
    pub rx: Streaming<sb::ControlMessage>,
}

impl RawNode {
    /// Opens `OpenControlChannel`; returns once the response headers came.
    pub async fn open(running: &Running) -> Result<RawNode, tonic::Status> {
        RawNode::open_at(running.southbound_addr).await
    }

    /// [`RawNode::open`] on the southbound listener at `addr`.
    pub async fn open_at(addr: std::net::SocketAddr) -> Result<RawNode, tonic::Status> {
        let url = format!("http://{addr}");
        let mut client = ControllerServiceClient::connect(url)
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let (tx, out) = mpsc::channel(64);
        let rx = client
            .open_control_channel(ReceiverStream::new(out))
            .await?
            .into_inner();
        Ok(RawNode { tx, rx })
    }

    pub async fn send(&self, payload: Payload) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        let msg = sb::ControlMessage {
            message_id: id.clone(),
            payload: Some(payload),
        };
        self.tx.send(msg).await.expect("stream open");
        id
    }

    /// The next message from the control plane, or the status ending the
    /// stream (`Ok(None)` for a clean end).
    pub async fn recv(&mut self) -> Result<Option<sb::ControlMessage>, tonic::Status> {
        tokio::time::timeout(PATIENCE, self.rx.message())
            .await
            .expect("control plane answers in time")
    }

    /// Expects the stream to end with `code` and a message containing `text`.
    pub async fn expect_end(&mut self, code: tonic::Code, text: &str) {
        let status = self
            .recv()
            .await
            .expect_err("the stream ends with an error");
        assert_eq!(status.code(), code, "{status:?}");
        assert!(status.message().contains(text), "{}", status.message());
    }

    /// Registers and returns the registration reply.
    pub async fn register(&mut self, req: sb::RegisterNodeRequest) -> sb::RegisterNodeResponse {
        let id = self.send(Payload::RegisterNodeRequest(req)).await;
        match self.recv().await {
            Ok(Some(sb::ControlMessage {
                payload: Some(Payload::RegisterNodeResponse(resp)),
                ..
            })) => {
                assert_eq!(resp.original_message_id, id);
                resp
            }
            other => panic!("expected RegisterNodeResponse, got {other:?}"),
        }
    }

    /// Opens and registers `group/node` in one go, then answers the
    /// reconcile every arrival gets (both live tables, empty), so that the
    /// test's own requests are the next ones on the stream.
    pub async fn connect(running: &Running, group: &str, node: &str) -> RawNode {
        let mut raw = RawNode::open(running).await.expect("stream opens");
        let resp = raw.register(mk_register(group, node)).await;
        assert!(resp.success, "registration accepted");
        raw.answer_empty_tables().await;
        raw
    }

    /// Answers one connection list request and one route list request with
    /// empty tables.
    pub async fn answer_empty_tables(&mut self) {
        for _ in 0..2 {
            let msg = self.recv().await.expect("stream open").expect("a request");
            self.answer(msg).await;
        }
    }

    /// Answers a list request with an empty table.
    pub async fn answer(&self, msg: sb::ControlMessage) {
        let id = msg.message_id;
        let reply = match msg.payload {
            Some(Payload::ConnectionListRequest(_)) => {
                Payload::ConnectionListResponse(sb::ConnectionListResponse {
                    original_message_id: id,
                    entries: vec![],
                    done: true,
                })
            }
            Some(Payload::RouteListRequest(_)) => {
                Payload::RouteListResponse(sb::RouteListResponse {
                    original_message_id: id,
                    entries: vec![],
                    done: true,
                })
            }
            other => panic!("expected a list request, got {other:?}"),
        };
        self.send(reply).await;
    }
}

pub fn mk_register(group: &str, node: &str) -> sb::RegisterNodeRequest {
    sb::RegisterNodeRequest {
        node_id: node.into(),
        group_name: Some(group.into()),
        connection_details: vec![sb::ConnectionDetails {
            endpoint: "0.0.0.0:46357".into(),
            external_endpoint: Some(format!("{node}.{group}.example:46357")),
            ..Default::default()
        }],
        ..Default::default()
    }
}

pub fn mk_name(last: &str) -> dp::Name {
    slim_cp::names::to_wire(&slim_cp::store::model::Name {
        components: ["org".into(), "ns".into(), last.into()],
        id: None,
    })
}

pub fn announce(names: &[&str]) -> Payload {
    Payload::ConfigCommand(sb::ConfigurationCommand {
        routes_to_set: names
            .iter()
            .map(|n| sb::Route {
                name: Some(mk_name(n)),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    })
}

/// The last name components of `node`'s recorded announcements.
pub async fn announced_by(
    running: &Running,
    node: &str,
) -> Result<std::collections::BTreeSet<String>, String> {
    let templates = running
        .store
        .list_templates()
        .await
        .map_err(|e| e.to_string())?;
    Ok(templates
        .into_iter()
        .filter(|t| t.node == node)
        .map(|t| t.name.components[2].clone())
        .collect())
}
