//! The southbound API: `OpenControlChannel` streams from data-plane nodes.
//!
//! The response stream is returned at once, so the node gets its response
//! headers before it sends `RegisterNodeRequest`; a task per stream then
//! drives the session (see [`session`]).

pub mod auth;
mod facts;
pub mod handshake;
mod outbox;
mod register;
mod serve;
mod session;
mod validate;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status, Streaming};

use crate::cluster::{Identity, Signals};
use crate::ops::Metrics;
use crate::proto::sb;
use crate::store::Store;
use crate::transport::Registry;
use auth::Authenticator;
pub use facts::OUTBOX_CAPACITY;
pub use outbox::{REPLICA_OUTBOX_BYTES, SESSION_OUTBOX_BYTES};

/// The node must send `RegisterNodeRequest` within this time of opening.
pub const REGISTER_TIMEOUT: Duration = Duration::from_secs(15);

/// Messages queued towards one node before senders wait.
const OUTBOUND_CAPACITY: usize = 64;

/// What every stream's session needs.
pub struct Ctx {
    pub store: Arc<dyn Store>,
    pub registry: Arc<Registry>,
    pub signals: Arc<dyn Signals>,
    /// This replica: the owner sessions are recorded under.
    pub identity: Arc<Identity>,
    pub auth: Arc<dyn Authenticator>,
    pub register_timeout: Duration,
    /// The sessions' fact writers: a replica going away waits for them, so
    /// the ends of its streams are recorded before its relay stops.
    pub writers: TaskTracker,
    pub metrics: Arc<Metrics>,
    /// The highest session generation this replica has seen recorded (by
    /// its own registrations, and by its heartbeats in a cluster): a
    /// registration answered while the store was away is recorded later
    /// only if the node has no newer one.
    pub seen_generation: Arc<AtomicU64>,
}

/// The `ControllerService` implementation.
pub struct Southbound {
    ctx: Arc<Ctx>,
}

impl Southbound {
    pub fn new(ctx: Ctx) -> Self {
        Self { ctx: Arc::new(ctx) }
    }

    pub fn into_server(self) -> sb::controller_service_server::ControllerServiceServer<Self> {
        sb::controller_service_server::ControllerServiceServer::new(self)
            .max_decoding_message_size(crate::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(crate::limits::MAX_MESSAGE_BYTES)
    }
}

#[tonic::async_trait]
impl sb::controller_service_server::ControllerService for Southbound {
    type OpenControlChannelStream = OutboundStream;

    async fn open_control_channel(
        &self,
        request: Request<Streaming<sb::ControlMessage>>,
    ) -> Result<Response<Self::OpenControlChannelStream>, Status> {
        let peer = request.remote_addr();
        let (tx, rx) = mpsc::channel(OUTBOUND_CAPACITY);
        tokio::spawn(session::drive(
            self.ctx.clone(),
            peer,
            request.into_inner(),
            tx,
        ));
        Ok(Response::new(OutboundStream(ReceiverStream::new(rx))))
    }
}

/// A node's response stream: the session's boxed messages, unboxed as
/// tonic encodes them.
pub struct OutboundStream(ReceiverStream<Result<Box<sb::ControlMessage>, Status>>);

impl Stream for OutboundStream {
    type Item = Result<sb::ControlMessage, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let next = Pin::new(&mut self.0).poll_next(cx);
        next.map(|item| item.map(|r| r.map(|msg| *msg)))
    }
}
