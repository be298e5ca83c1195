//! Reading the cluster: the fleet from the shared database (a [`View`]),
//! and each replica's process and fencing counters from the admin API of
//! any replica (`slim-cp status`'s source).

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use super::DrillError;
use super::view::{LinkView, NodeView, RouteView, View};
use crate::proto::cluster as pb;
use crate::proto::cluster::admin_client::AdminClient;
use crate::store::model::{LinkStatus, RouteStatus, SessionState};
use crate::store::{PgStore, Store as _};

/// The fleet as the database has it now.
pub async fn view(store: &PgStore) -> Result<View, DrillError> {
    let read = |e: crate::store::StoreError| DrillError::Database(e.to_string());
    let (term, nodes, links, routes) = tokio::try_join!(
        store.leadership(),
        store.list_nodes(),
        store.list_links(),
        store.list_routes()
    )
    .map_err(read)?;
    let nodes = nodes
        .into_iter()
        .filter_map(|n| {
            let s = n.session?;
            let view = NodeView {
                owner: s.owner,
                generation: s.generation,
                ready: s.state == SessionState::Ready,
            };
            Some((n.id, view))
        })
        .collect();
    let links = links
        .into_iter()
        .filter(|l| !l.deleted)
        .map(|l| LinkView {
            applied: l.status == LinkStatus::Applied,
            id: l.link_id,
            source_node: l.source_node,
            source_group: l.source_group,
            dest_group: l.dest_group,
            dest_node: l.dest_node,
            claim: l.claim,
        })
        .collect();
    let routes = routes
        .into_iter()
        .filter(|r| !r.is_deleted())
        .map(|r| RouteView {
            applied: r.status == RouteStatus::Applied,
            key: (r.source_node, r.name.components.join("/"), r.dest_node),
            link_id: r.link_id,
        })
        .collect();
    Ok(View {
        epoch: term.epoch,
        leader: term.leader,
        nodes,
        links,
        routes,
    })
}

/// The admin API at `server` (`host:port` or a URL).
pub async fn admin(server: &str) -> Result<AdminClient<Channel>, DrillError> {
    let url = if server.contains("://") {
        server.to_string()
    } else {
        format!("http://{server}")
    };
    let channel = Endpoint::from_shared(url)
        .map_err(|_| DrillError::Input(format!("--server {server:?} is not an address")))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect_lazy();
    Ok(AdminClient::new(channel))
}

/// Every replica as the admin API reports it (live state where the
/// replica answered its peer).
pub async fn replicas(admin: &AdminClient<Channel>) -> Result<Vec<pb::ReplicaStatus>, DrillError> {
    let status = admin
        .clone()
        .status(pb::StatusRequest {})
        .await
        .map_err(|s| DrillError::Admin(format!("status: {}", s.message())))?;
    Ok(status.into_inner().replicas)
}
