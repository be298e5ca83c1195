//! Follows the SPIFFE Workload API of the local SPIRE agent:
//! `FetchJWTBundles` over its unix socket, a server stream that sends the
//! bundles at once and again on every change. Each message replaces the
//! published bundles. A broken stream keeps the last bundles (tokens go on
//! verifying through an agent restart) and is re-opened with backoff.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Endpoint, Uri};

use super::jwks::parse_bundle_map;
use super::store::BundleStore;
use crate::proto::spiffe::spiffe_workload_api_client::SpiffeWorkloadApiClient;
use crate::proto::spiffe::{JwtBundlesRequest, JwtBundlesResponse};

/// The metadata every Workload API call must carry (the agent refuses
/// calls without it, as a guard against server-side request forgery).
const SECURITY_HEADER: &str = "workload.spiffe.io";

/// Backoff between attempts to reach the agent.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// After the first failure.
    pub initial: Duration,
    /// The ceiling.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(30),
        }
    }
}

/// The socket path in `socket_path`: `/path`, `unix:/path` or
/// `unix:///path` (the forms SPIFFE_ENDPOINT_SOCKET uses).
pub fn socket_file(socket_path: &str) -> PathBuf {
    let path = socket_path
        .strip_prefix("unix://")
        .or_else(|| socket_path.strip_prefix("unix:"))
        .unwrap_or(socket_path);
    PathBuf::from(path)
}

/// Follows the agent at `socket` until `cancel`, publishing into `store`.
pub async fn follow(
    socket: PathBuf,
    store: Arc<BundleStore>,
    backoff: Backoff,
    cancel: CancellationToken,
) {
    let mut delay = backoff.initial;
    loop {
        let outcome = tokio::select! {
            () = cancel.cancelled() => return,
            outcome = stream_bundles(&socket, &store) => outcome,
        };
        match outcome {
            // The agent delivered bundles: the next failure starts afresh.
            Ok(true) => delay = backoff.initial,
            Ok(false) => {}
            Err(e) => tracing::warn!(
                socket = %socket.display(),
                retry_in = ?delay,
                "SPIRE Workload API: {e}; keeping the last trust bundles"
            ),
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(backoff.max);
    }
}

/// One stream, until it ends. `Ok(true)` if it delivered bundles.
async fn stream_bundles(socket: &std::path::Path, store: &BundleStore) -> Result<bool, String> {
    let path = socket.to_path_buf();
    // The URI is a placeholder: the connector dials the socket.
    let channel = Endpoint::from_static("http://workload-api.invalid")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    let mut request = tonic::Request::new(JwtBundlesRequest {});
    request.metadata_mut().insert(
        SECURITY_HEADER,
        tonic::metadata::MetadataValue::from_static("true"),
    );
    let mut stream = SpiffeWorkloadApiClient::new(channel)
        .fetch_jwt_bundles(request)
        .await
        .map_err(|s| format!("FetchJWTBundles refused: {}: {}", s.code(), s.message()))?
        .into_inner();
    let mut delivered = false;
    loop {
        let message = stream
            .message()
            .await
            .map_err(|s| format!("stream broke: {}: {}", s.code(), s.message()))?;
        let Some(message) = message else {
            return Ok(delivered);
        };
        publish(store, &message);
        delivered = true;
    }
}

/// Replaces the published bundles with those of `message`.
fn publish(store: &BundleStore, message: &JwtBundlesResponse) {
    let previous = store.current();
    let entries = message
        .bundles
        .iter()
        .map(|(td, json)| (td.as_str(), json.as_slice()));
    let (domains, problems) = parse_bundle_map(entries, &previous.domains);
    for problem in problems {
        tracing::warn!("SPIRE Workload API sent an unusable JWT bundle: {problem}");
    }
    let trust_domains: Vec<String> = domains.keys().cloned().collect();
    let generation = store.publish(domains);
    tracing::info!(
        generation,
        ?trust_domains,
        "SPIRE JWT trust bundles updated"
    );
}
