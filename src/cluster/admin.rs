//! The operator's view of the cluster (`slim-cp status`) and the handover
//! (`slim-cp step-down`), served on the northbound listener beside the
//! upstream API. Any replica answers: the database says who is who, each
//! live replica says what it holds, and a step-down reaches the leader
//! over the relay.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tonic::{Request, Response, Status};

use super::Replica;
use super::relay::RelayClient;
use crate::proto::cluster as pb;
use crate::store::model::{LinkStatus, ReplicaRef, RouteStatus};
use crate::store::{PgStore, Store, StoreError};

/// A peer that does not answer `Inspect` in this time is shown without
/// its live state.
const INSPECT_WAIT: Duration = Duration::from_secs(2);

/// Where the cluster's state comes from.
pub enum Backing {
    /// The single replica of the memory store.
    Solo(Arc<dyn Store>),
    /// Replicas sharing Postgres.
    Shared {
        store: PgStore,
        relay: Arc<RelayClient>,
        ttl: Duration,
        /// How long a leader may take to hand over.
        handover: Duration,
    },
}

pub struct AdminService {
    replica: Arc<Replica>,
    backing: Backing,
}

impl AdminService {
    pub fn new(replica: Arc<Replica>, backing: Backing) -> Self {
        Self { replica, backing }
    }

    pub fn into_server(self) -> pb::admin_server::AdminServer<Self> {
        pb::admin_server::AdminServer::new(self)
            .max_decoding_message_size(crate::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(crate::limits::MAX_MESSAGE_BYTES)
    }

    async fn solo_status(&self, store: &dyn Store) -> Result<pb::ClusterStatus, StoreError> {
        let nodes = store.list_nodes().await?;
        let mut links = BTreeMap::new();
        for l in store.list_links().await? {
            *links
                .entry(link_word(l.deleted, l.status).to_string())
                .or_default() += 1;
        }
        let mut routes = BTreeMap::new();
        for r in store.list_routes().await? {
            *routes.entry(route_word(r.status).to_string()).or_default() += 1;
        }
        let live = self.replica.state();
        Ok(pb::ClusterStatus {
            replicas: vec![pb::ReplicaStatus {
                id: live.id.clone(),
                incarnation: live.incarnation,
                address: String::new(),
                alive: true,
                leader: true,
                sessions: live.sessions,
                live: Some(live.clone()),
                heartbeat_age_ms: 0,
                drain: false,
            }],
            epoch: live.epoch,
            leader: live.id.clone(),
            leader_since: 0,
            nodes: nodes.len() as u64,
            nodes_connected: nodes.iter().filter(|n| n.is_connected()).count() as u64,
            links: links.into_iter().collect(),
            routes: routes.into_iter().collect(),
            queue_depth: live.queue_depth,
            store: "memory".into(),
        })
    }

    async fn shared_status(
        &self,
        store: &PgStore,
        relay: &Arc<RelayClient>,
        ttl: Duration,
    ) -> Result<pb::ClusterStatus, StoreError> {
        let rows = store.list_replicas(ttl).await?;
        let term = store.leadership().await?;
        let counts = store.counts().await?;
        let mut live = self.inspect_all(relay, &rows).await;
        let leader = term
            .leader
            .as_ref()
            .map(|l| l.id.clone())
            .unwrap_or_default();
        let replicas: Vec<pb::ReplicaStatus> = rows
            .into_iter()
            .map(|r| pb::ReplicaStatus {
                leader: r.id == leader && r.alive,
                sessions: counts.sessions.get(&r.id).copied().unwrap_or(0),
                live: live.remove(&r.id),
                heartbeat_age_ms: u64::try_from(r.heartbeat_age.as_millis()).unwrap_or(u64::MAX),
                address: r.endpoint,
                alive: r.alive,
                drain: r.drain,
                incarnation: r.incarnation,
                id: r.id,
            })
            .collect();
        let queue_depth = replicas
            .iter()
            .filter(|r| r.leader)
            .filter_map(|r| r.live.as_ref())
            .map(|s| s.queue_depth)
            .sum();
        Ok(pb::ClusterStatus {
            replicas,
            epoch: term.epoch,
            leader,
            leader_since: term.since.unwrap_or(0),
            nodes: counts.nodes,
            nodes_connected: counts.connected,
            links: counts.links.into_iter().collect(),
            routes: counts.routes.into_iter().collect(),
            queue_depth,
            store: "postgres".into(),
        })
    }

    /// Each live replica's own state, asked in parallel.
    async fn inspect_all(
        &self,
        relay: &Arc<RelayClient>,
        rows: &[crate::store::postgres::ReplicaInfo],
    ) -> BTreeMap<String, pb::ReplicaState> {
        let me = self.replica.identity.id();
        let mut out = BTreeMap::new();
        out.insert(me.clone(), self.replica.state());
        let mut asks = JoinSet::new();
        for r in rows.iter().filter(|r| r.alive && r.id != me) {
            let (relay, address) = (relay.clone(), r.endpoint.clone());
            let peer = ReplicaRef {
                id: r.id.clone(),
                incarnation: r.incarnation,
            };
            asks.spawn(async move {
                let state = relay.inspect(&peer, &address, INSPECT_WAIT).await?;
                Some((peer.id, state))
            });
        }
        while let Some(done) = asks.join_next().await {
            if let Ok(Some((id, state))) = done {
                out.insert(id, state);
            }
        }
        out
    }

    async fn forward_step_down(
        &self,
        store: &PgStore,
        relay: &RelayClient,
        handover: Duration,
    ) -> Result<pb::StepDownReply, Status> {
        let term = store.leadership().await.map_err(unavailable)?;
        let Some(leader) = term.leader else {
            return Err(Status::failed_precondition("no replica leads right now"));
        };
        if self.replica.identity.id() == leader.id {
            return self.replica.step_down().await;
        }
        let rows = store
            .list_replicas(Duration::MAX)
            .await
            .map_err(unavailable)?;
        let Some(row) = rows.iter().find(|r| r.id == leader.id) else {
            return Err(Status::unavailable(format!(
                "leader {} has no relay address",
                leader.id
            )));
        };
        let mut client = relay
            .client(&row.endpoint)
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let req = relay.request(pb::StepDownRequest {}, handover);
        Ok(client.step_down(req).await?.into_inner())
    }
}

fn unavailable(e: StoreError) -> Status {
    Status::unavailable(e.to_string())
}

fn link_word(deleted: bool, status: LinkStatus) -> &'static str {
    match (deleted, status) {
        (true, _) => "deleted",
        (_, LinkStatus::Pending) => "pending",
        (_, LinkStatus::Connecting) => "connecting",
        (_, LinkStatus::Applied) => "applied",
        (_, LinkStatus::Failed) => "failed",
    }
}

fn route_word(status: RouteStatus) -> &'static str {
    match status {
        RouteStatus::Pending => "pending",
        RouteStatus::Applied => "applied",
        RouteStatus::Failed => "failed",
        RouteStatus::Deleted => "deleted",
    }
}

#[tonic::async_trait]
impl pb::admin_server::Admin for AdminService {
    async fn status(
        &self,
        _request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::ClusterStatus>, Status> {
        let status = match &self.backing {
            Backing::Solo(store) => self.solo_status(store.as_ref()).await,
            Backing::Shared {
                store, relay, ttl, ..
            } => self.shared_status(store, relay, *ttl).await,
        };
        status.map(Response::new).map_err(unavailable)
    }

    async fn drain(
        &self,
        _request: Request<pb::DrainRequest>,
    ) -> Result<Response<pb::DrainReply>, Status> {
        Ok(Response::new(self.replica.request_drain()))
    }

    async fn step_down(
        &self,
        _request: Request<pb::StepDownRequest>,
    ) -> Result<Response<pb::StepDownReply>, Status> {
        match &self.backing {
            Backing::Solo(_) => self.replica.step_down().await.map(Response::new),
            Backing::Shared {
                store,
                relay,
                handover,
                ..
            } => self
                .forward_step_down(store, relay, *handover)
                .await
                .map(Response::new),
        }
    }
}
