//! Relay calls to a replica the leader has flagged for drain end at once,
//! over real gRPC: a peer that takes a forwarded request and never
//! answers (as one behind a cut does) holds the call only until the flag
//! is set, then the call fails with `OwnerDrained`, not at the relay's
//! deadline; new calls fail at once; lifting the flag lets them through.

mod common;

use std::sync::Arc;
use std::time::Duration;

use slim_cp::cluster::Identity;
use slim_cp::cluster::relay::RelayClient;
use slim_cp::proto::cluster as pb;
use slim_cp::proto::cluster::relay_server::{Relay, RelayServer};
use slim_cp::proto::sb;
use slim_cp::store::model::ReplicaRef;
use slim_cp::transport::{Forwarded, Location, Remote as _, Reply, TransportError};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

use common::pg::fresh_pg_store;

/// A peer whose relay answers `Inspect`, answers `ListConnections` at
/// once, and takes `ListRoutes` without ever answering (it says when one
/// arrived).
struct Silent {
    arrived: mpsc::UnboundedSender<()>,
}

#[tonic::async_trait]
impl Relay for Silent {
    async fn forward(
        &self,
        request: Request<pb::ForwardRequest>,
    ) -> Result<Response<pb::ForwardReply>, Status> {
        use pb::forward_reply::Reply as R;
        use pb::forward_request::Request as Q;
        match request.into_inner().request {
            Some(Q::ListConnections(_)) => Ok(Response::new(pb::ForwardReply {
                reply: Some(R::Connections(sb::ConnectionListResponse::default())),
            })),
            _ => {
                let _ = self.arrived.send(());
                std::future::pending().await
            }
        }
    }

    async fn close_session(
        &self,
        _: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionReply>, Status> {
        Ok(Response::new(pb::CloseSessionReply { closed: false }))
    }

    async fn inspect(
        &self,
        _: Request<pb::InspectRequest>,
    ) -> Result<Response<pb::ReplicaState>, Status> {
        Ok(Response::new(pb::ReplicaState::default()))
    }

    async fn step_down(
        &self,
        _: Request<pb::StepDownRequest>,
    ) -> Result<Response<pb::StepDownReply>, Status> {
        Err(Status::unimplemented("not a leader"))
    }
}

/// The silent peer on loopback; its address and the arrivals.
async fn mk_silent_peer() -> (String, mpsc::UnboundedReceiver<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RelayServer::new(Silent { arrived: tx }))
            .serve_with_incoming(incoming),
    );
    (addr.to_string(), rx)
}

fn mk_peer() -> ReplicaRef {
    ReplicaRef {
        id: "cp-far".into(),
        incarnation: 1,
    }
}

/// A relay client of `cp-lead` that knows where the silent peer listens;
/// a node wait of 30 s makes the relay's own deadline 35 s.
async fn mk_relay(address: &str) -> Arc<RelayClient> {
    let store = fresh_pg_store().await;
    let me = ReplicaRef {
        id: "cp-lead".into(),
        incarnation: 1,
    };
    let identity = Arc::new(Identity::new(me));
    let secret = "s".repeat(32);
    let relay = Arc::new(RelayClient::new(
        (*store).clone(),
        identity,
        &secret,
        Duration::from_secs(30),
    ));
    let wait = Duration::from_secs(10);
    let seen = relay.inspect(&mk_peer(), address, wait).await;
    assert!(seen.is_some(), "the silent peer answers Inspect");
    relay
}

fn mk_location() -> Location {
    Location {
        node: "g/n".into(),
        owner: mk_peer(),
        session: uuid::Uuid::new_v4(),
        local: false,
    }
}

/// Scenario: the leader waits on a forwarded request the peer never
/// answers; the peer is flagged for drain; the call ends with
/// `OwnerDrained`. A new call fails the same way without reaching the
/// peer; once the flag is lifted calls reach it again.
#[tokio::test]
async fn a_call_in_flight_to_a_replica_flagged_for_drain_ends_with_owner_drained() {
    let (address, mut arrived) = mk_silent_peer().await;
    let relay = mk_relay(&address).await;
    let call = {
        let relay = relay.clone();
        tokio::spawn(async move { relay.forward(&mk_location(), Forwarded::ListRoutes).await })
    };
    arrived.recv().await.expect("the peer took the call");
    relay.cuts().trip("cp-far", 1);
    let ended = call.await.expect("the call's task");
    assert_eq!(
        ended.err(),
        Some(TransportError::OwnerDrained("cp-far".into()))
    );

    let again = relay
        .forward(&mk_location(), Forwarded::ListConnections)
        .await;
    assert_eq!(
        again.err(),
        Some(TransportError::OwnerDrained("cp-far".into()))
    );

    relay.cuts().restore("cp-far", 1);
    let through = relay
        .forward(&mk_location(), Forwarded::ListConnections)
        .await;
    assert!(matches!(through, Ok(Reply::Connections(_))), "{through:?}");
}
