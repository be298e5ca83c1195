//! The receiving side of the relay: requests for nodes whose streams this
//! replica owns, closes of replaced sessions, inspection and step-down.
//! Every call is authenticated first; refusals are counted by reason.

use std::sync::Arc;

use tonic::{Request, Response, Status};
use uuid::Uuid;

use super::auth::Guard;
use super::wire;
use crate::cluster::Replica;
use crate::ops::Metrics;
use crate::proto::cluster as pb;
use crate::transport::TransportError;

pub struct RelayService {
    replica: Arc<Replica>,
    guard: Guard,
    metrics: Arc<Metrics>,
}

impl RelayService {
    pub fn new(replica: Arc<Replica>, guard: Guard, metrics: Arc<Metrics>) -> Self {
        Self {
            replica,
            guard,
            metrics,
        }
    }

    /// Checks the caller, and counts the call by method and outcome.
    fn admit(
        &self,
        method: &'static str,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<(), Status> {
        let checked = self.guard.check(metadata);
        if checked.is_err() {
            self.count(method, "unauthenticated");
        }
        checked
    }

    fn count(&self, method: &'static str, outcome: &'static str) {
        let labels = [("method", method), ("outcome", outcome)];
        self.metrics.relay_calls.get_or_create(&labels).inc();
    }

    pub fn into_server(self) -> pb::relay_server::RelayServer<Self> {
        pb::relay_server::RelayServer::new(self)
            .max_decoding_message_size(crate::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(crate::limits::MAX_MESSAGE_BYTES)
    }
}

fn session_id(text: &str) -> Result<Uuid, Status> {
    Uuid::parse_str(text)
        .map_err(|_| Status::invalid_argument(format!("session_id {text:?} is not a UUID")))
}

#[tonic::async_trait]
impl pb::relay_server::Relay for RelayService {
    async fn forward(
        &self,
        request: Request<pb::ForwardRequest>,
    ) -> Result<Response<pb::ForwardReply>, Status> {
        self.admit("forward", request.metadata())?;
        let req = request.into_inner();
        let what = wire::forwarded_from(&req)
            .ok_or_else(|| Status::invalid_argument("the relay request names no request"))?;
        let session = session_id(&req.session_id)?;
        let transport = &self.replica.transport;
        match transport.serve_forwarded(&req.node, session, what).await {
            Ok(reply) => {
                self.count("forward", "ok");
                Ok(Response::new(wire::reply_to_wire(reply)))
            }
            Err(e) => {
                if matches!(e, TransportError::Fenced { .. }) {
                    self.guard.count("stale epoch");
                    self.count("forward", "stale_epoch");
                } else {
                    self.count("forward", "error");
                }
                Err(wire::status_of(e))
            }
        }
    }

    async fn close_session(
        &self,
        request: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionReply>, Status> {
        self.admit("close_session", request.metadata())?;
        self.count("close_session", "ok");
        let req = request.into_inner();
        let session = session_id(&req.session_id)?;
        let closed = self.replica.transport.registry().remove(&req.node, session);
        if closed {
            tracing::info!(node = %req.node, "closed a session replaced on another replica");
        }
        Ok(Response::new(pb::CloseSessionReply { closed }))
    }

    async fn inspect(
        &self,
        request: Request<pb::InspectRequest>,
    ) -> Result<Response<pb::ReplicaState>, Status> {
        self.admit("inspect", request.metadata())?;
        self.count("inspect", "ok");
        let mut state = self.replica.state();
        state.relay_refused = self.guard.refused().into_iter().collect();
        Ok(Response::new(state))
    }

    async fn step_down(
        &self,
        request: Request<pb::StepDownRequest>,
    ) -> Result<Response<pb::StepDownReply>, Status> {
        self.admit("step_down", request.metadata())?;
        self.count("step_down", "ok");
        Ok(Response::new(self.replica.step_down().await?))
    }
}
