//! A stand-in for the SPIRE agent's Workload API, serving only
//! `FetchJWTBundles`: the bundles it is given, then each new set it is
//! told to publish. For tests and simulated deployments; like SPIRE, it
//! refuses calls without the `workload.spiffe.io: true` metadata.

use std::collections::HashMap;
use std::path::Path;

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tokio_util::sync::{CancellationToken, DropGuard};
use tonic::{Request, Response, Status};

use crate::proto::spiffe::spiffe_workload_api_server::{
    SpiffeWorkloadApi, SpiffeWorkloadApiServer,
};
use crate::proto::spiffe::{JwtBundlesRequest, JwtBundlesResponse};

/// Trust domain (name or `spiffe://` id) to its JWKS as JSON bytes, as
/// the Workload API sends them.
pub type Bundles = HashMap<String, Vec<u8>>;

/// A Workload API server on a unix socket; dropping it stops the server.
pub struct BundleAgent {
    publish: watch::Sender<Bundles>,
    _stop: DropGuard,
}

impl BundleAgent {
    /// Listens on `socket` (which must not exist yet) on the current Tokio
    /// runtime and serves `bundles`.
    pub fn serve(socket: &Path, bundles: Bundles) -> std::io::Result<Self> {
        let listener = tokio::net::UnixListener::bind(socket)?;
        let (publish, current) = watch::channel(bundles);
        let stop = CancellationToken::new();
        let server = tonic::transport::Server::builder()
            .add_service(SpiffeWorkloadApiServer::new(Service { current }))
            .serve_with_incoming_shutdown(
                UnixListenerStream::new(listener),
                stop.clone().cancelled_owned(),
            );
        tokio::spawn(server);
        Ok(BundleAgent {
            publish,
            _stop: stop.drop_guard(),
        })
    }

    /// Replaces the bundles; every open stream receives them.
    pub fn publish(&self, bundles: Bundles) {
        self.publish.send_replace(bundles);
    }
}

struct Service {
    current: watch::Receiver<Bundles>,
}

#[tonic::async_trait]
impl SpiffeWorkloadApi for Service {
    type FetchJWTBundlesStream = ReceiverStream<Result<JwtBundlesResponse, Status>>;

    async fn fetch_jwt_bundles(
        &self,
        request: Request<JwtBundlesRequest>,
    ) -> Result<Response<Self::FetchJWTBundlesStream>, Status> {
        let header = request.metadata().get("workload.spiffe.io");
        if header.and_then(|v| v.to_str().ok()) != Some("true") {
            return Err(Status::invalid_argument("security header missing"));
        }
        let (tx, rx) = mpsc::channel(4);
        let mut bundles = self.current.clone();
        tokio::spawn(async move {
            loop {
                let msg = JwtBundlesResponse {
                    bundles: bundles.borrow_and_update().clone(),
                };
                // Ends when the client goes or the agent is dropped.
                if tx.send(Ok(msg)).await.is_err() || bundles.changed().await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
