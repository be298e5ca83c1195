//! The sending side of the relay: where a node's session is (the database
//! says which replica owns it, the replica rows say where that replica
//! listens) and the calls to that replica. A failed call is "outcome
//! unknown" ([`TransportError::Relay`]): the caller queries again before
//! acting, which every reconcile does anyway.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tonic::Request;
use tonic::transport::{Channel, Endpoint};
use tracing::debug;

use super::auth::Stamp;
use super::cuts::Cuts;
use super::wire;
use crate::cluster::Identity;
use crate::cluster::reachability::Streaks;
use crate::proto::cluster as pb;
use crate::proto::cluster::relay_client::RelayClient as Grpc;
use crate::store::model::ReplicaRef;
use crate::store::{PgStore, Store};
use crate::transport::{Forwarded, Location, Remote, Reply, TransportError};

/// A dead peer's TCP handshake never completes: give up on it soon.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Calls to other replicas.
pub struct RelayClient {
    store: PgStore,
    identity: Arc<Identity>,
    stamp: Stamp,
    /// Bounds a forwarded call: longer than the owner's own wait for its
    /// node, so the owner's answer (even a timeout) comes back first.
    deadline: Duration,
    /// Relay address per replica id and incarnation.
    peers: Mutex<HashMap<String, (u64, String)>>,
    channels: Mutex<HashMap<String, Channel>>,
    /// Whether each peer answered its latest calls (see `reachability`).
    streaks: Streaks,
    /// Peers whose calls fail at once: flagged for drain.
    cuts: Cuts,
}

impl RelayClient {
    pub fn new(store: PgStore, identity: Arc<Identity>, secret: &str, node_wait: Duration) -> Self {
        Self {
            store,
            identity,
            stamp: Stamp::new(secret),
            deadline: node_wait + Duration::from_secs(5),
            peers: Mutex::default(),
            channels: Mutex::default(),
            streaks: Streaks::default(),
            cuts: Cuts::default(),
        }
    }

    /// How each peer's relay calls went lately.
    pub fn streaks(&self) -> &Streaks {
        &self.streaks
    }

    /// The peers whose forwarded calls fail at once (flagged for drain).
    pub fn cuts(&self) -> &Cuts {
        &self.cuts
    }

    fn peers(&self) -> MutexGuard<'_, HashMap<String, (u64, String)>> {
        self.peers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The relay address of `owner`'s run, from the cache or the database.
    async fn address(&self, owner: &ReplicaRef) -> Result<String, TransportError> {
        if let Some((inc, addr)) = self.peers().get(&owner.id)
            && *inc == owner.incarnation
        {
            return Ok(addr.clone());
        }
        self.refresh_peers()
            .await
            .map_err(|e| TransportError::Relay(e.to_string()))?;
        match self.peers().get(&owner.id) {
            Some((_, addr)) => Ok(addr.clone()),
            None => Err(TransportError::Relay(format!(
                "replica {} is unknown",
                owner.id
            ))),
        }
    }

    /// Learns every replica's relay address from the database. The cache
    /// outlives the database: a replica cut off from it still knows whom
    /// to ask (see [`RelayClient::a_peer_is_ready`]).
    pub async fn refresh_peers(&self) -> Result<(), crate::store::StoreError> {
        let rows = self.store.list_replicas(Duration::MAX).await?;
        let mut peers = self.peers();
        peers.clear();
        for r in rows {
            peers.insert(r.id, (r.incarnation, r.endpoint));
        }
        Ok(())
    }

    /// `Inspect` of `peer` at `address` within `wait`; the outcome goes
    /// into its streak. `None` when it did not answer.
    pub async fn inspect(
        &self,
        peer: &ReplicaRef,
        address: &str,
        wait: Duration,
    ) -> Option<pb::ReplicaState> {
        let req = self.request(pb::InspectRequest {}, wait);
        let reply = match self.client(address) {
            Ok(mut c) => c.inspect(req).await,
            Err(_) => return None,
        };
        let answered = answered(&reply);
        self.streaks.record(&peer.id, peer.incarnation, answered);
        if reply.is_ok() {
            // A peer reached is one to ask when the database is away.
            let known = (peer.incarnation, address.to_string());
            self.peers().insert(peer.id.clone(), known);
        }
        reply.ok().map(tonic::Response::into_inner)
    }

    /// Whether a peer known from the last [`RelayClient::refresh_peers`]
    /// says, within `wait`, that it is ready (listening, its database
    /// answering, not draining): a replica this one's nodes can move to.
    pub async fn a_peer_is_ready(self: &Arc<Self>, wait: Duration) -> bool {
        let me = self.identity.id();
        let peers: Vec<(ReplicaRef, String)> = self
            .peers()
            .iter()
            .filter(|(id, _)| **id != me)
            .map(|(id, (incarnation, addr))| {
                let peer = ReplicaRef {
                    id: id.clone(),
                    incarnation: *incarnation,
                };
                (peer, addr.clone())
            })
            .collect();
        let mut asks = tokio::task::JoinSet::new();
        for (peer, addr) in peers {
            let me = self.clone();
            asks.spawn(async move {
                me.inspect(&peer, &addr, wait)
                    .await
                    .is_some_and(|s| s.ready)
            });
        }
        while let Some(done) = asks.join_next().await {
            if done.unwrap_or(false) {
                return true;
            }
        }
        false
    }

    /// A client for the replica at `address` (channels are cached and
    /// reconnect by themselves).
    pub fn client(&self, address: &str) -> Result<Grpc<Channel>, TransportError> {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = channels.get(address) {
            return Ok(sized(Grpc::new(c.clone())));
        }
        let channel = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| TransportError::Relay(format!("relay address {address:?}: {e}")))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_keepalive(Some(Duration::from_secs(10)))
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5))
            .connect_lazy();
        channels.insert(address.to_string(), channel.clone());
        Ok(sized(Grpc::new(channel)))
    }

    /// A request stamped with the credentials and bounded by `deadline`.
    pub fn request<T>(&self, message: T, deadline: Duration) -> Request<T> {
        let mut req = Request::new(message);
        req.set_timeout(deadline);
        self.stamp.apply(&mut req);
        req
    }

    /// Asks the owner of `node`'s replaced session to close that stream.
    pub async fn close_session(&self, node: &str, old: &crate::store::model::Session) {
        let result = async {
            let address = self.address(&old.owner).await?;
            let msg = pb::CloseSessionRequest {
                node: node.to_string(),
                session_id: old.id.to_string(),
            };
            let req = self.request(msg, CONNECT_TIMEOUT * 2);
            self.client(&address)?
                .close_session(req)
                .await
                .map_err(|s| TransportError::Relay(s.message().to_string()))
        }
        .await;
        // Best effort: the old owner also learns from its next fact and
        // from its periodic check of the sessions it holds.
        if let Err(e) = result {
            debug!(node, owner = %old.owner.id, error = %e, "could not ask the old owner to close");
        }
    }
}

#[async_trait]
impl Remote for RelayClient {
    async fn locate_all(&self, nodes: &[String]) -> Result<Vec<Location>, TransportError> {
        let sessions = self
            .store
            .sessions_of(nodes)
            .await
            .map_err(|e| TransportError::Relay(e.to_string()))?;
        let located = sessions.into_iter().map(|(node, s)| Location {
            node,
            local: self.identity.is(&s.owner),
            owner: s.owner,
            session: s.id,
        });
        Ok(located.collect())
    }

    async fn forward(&self, at: &Location, what: Forwarded) -> Result<Reply, TransportError> {
        let address = self.address(&at.owner).await?;
        let epoch = match &what {
            Forwarded::Command { epoch, .. } => *epoch,
            _ => 0,
        };
        let msg = wire::forward_request(at, what);
        let mut client = self.client(&address)?;
        let call = client.forward(self.request(msg, self.deadline));
        let reply = self.cuts.unless_cut(&at.owner, call).await?;
        let answered = answered(&reply);
        self.streaks
            .record(&at.owner.id, at.owner.incarnation, answered);
        let reply = reply.map_err(|s| wire::error_from(&at.node, epoch, &s))?;
        wire::reply_from(reply.into_inner())
    }
}

/// Whether a relay call reached the peer: any answer of its own counts,
/// only a failure below gRPC (see [`wire::unreached`]) does not.
fn answered<T>(reply: &Result<T, tonic::Status>) -> bool {
    reply.as_ref().err().is_none_or(|s| !wire::unreached(s))
}

/// The relay carries what the listeners accept, both ways.
fn sized(client: Grpc<Channel>) -> Grpc<Channel> {
    client
        .max_decoding_message_size(crate::limits::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(crate::limits::MAX_MESSAGE_BYTES)
}
