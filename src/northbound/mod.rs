//! The northbound operator API (`ControlPlaneService`), as `slimctl
//! controller` calls it. Listings come from the store; a node's live
//! connections and routes are asked of the node through the transport.

mod domains;
mod errors;
pub mod listing;
mod topology;

use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::cluster::Signals;
use crate::config::TopologyConfig;
use crate::proto::{nb, sb};
use crate::routing::links;
use crate::routing::topology::{self as topo, SegmentGraph};
use crate::store::Store;
use crate::transport::Transport;

pub use crate::routing::topology::DEFAULT_SEGMENT;

/// What the operator API needs.
pub struct Ctx {
    pub store: Arc<dyn Store>,
    pub transport: Arc<Transport>,
    pub topology: TopologyConfig,
    pub signals: Arc<dyn Signals>,
    /// The API-managed registration domains; `None` without shared-secret
    /// registration auth.
    pub domains: Option<Arc<crate::auth::Domains>>,
}

impl Ctx {
    async fn graphs(&self) -> Result<Vec<SegmentGraph>, Status> {
        let nodes = self.store.list_nodes().await.map_err(errors::from_store)?;
        // Grace is judged on the store's clock, as the leader judges it.
        let now = self.store.now().await.map_err(errors::from_store)?;
        let groups = links::active_groups(&nodes, now);
        let stored = match self.topology {
            TopologyConfig::Api => self
                .store
                .list_segments()
                .await
                .map_err(errors::from_store)?,
            _ => Vec::new(),
        };
        Ok(topo::resolve(&self.topology, &stored, &groups))
    }

    /// The node's live connections, with peers named from the links.
    async fn live_connections(&self, node: &str) -> Result<sb::ConnectionListResponse, Status> {
        self.known(node).await?;
        let mut entries = self
            .transport
            .list_connections(node)
            .await
            .map_err(|e| errors::from_transport(node, e))?;
        // Only the node's own links can name its peers.
        let links = self
            .store
            .links_touching(node)
            .await
            .map_err(errors::from_store)?;
        listing::name_peers(node, &mut entries, &links);
        Ok(sb::ConnectionListResponse {
            original_message_id: String::new(),
            entries,
            done: true,
        })
    }

    async fn live_routes(&self, node: &str) -> Result<sb::RouteListResponse, Status> {
        self.known(node).await?;
        let entries = self
            .transport
            .list_routes(node)
            .await
            .map_err(|e| errors::from_transport(node, e))?;
        Ok(sb::RouteListResponse {
            original_message_id: String::new(),
            entries,
            done: true,
        })
    }

    async fn known(&self, node: &str) -> Result<(), Status> {
        if node.is_empty() {
            return Err(Status::invalid_argument("node id must not be empty"));
        }
        match self
            .store
            .get_node(node)
            .await
            .map_err(errors::from_store)?
        {
            Some(_) => Ok(()),
            None => Err(Status::not_found(format!("node {node} not found"))),
        }
    }
}

type ListStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

fn stream_of<T: Send + 'static>(items: Vec<T>) -> Response<ListStream<T>> {
    Response::new(Box::pin(tokio_stream::iter(items.into_iter().map(Ok))))
}

/// The `ControlPlaneService` implementation.
pub struct Northbound {
    ctx: Arc<Ctx>,
}

impl Northbound {
    pub fn new(ctx: Ctx) -> Self {
        Self { ctx: Arc::new(ctx) }
    }

    pub fn into_server(self) -> nb::control_plane_service_server::ControlPlaneServiceServer<Self> {
        nb::control_plane_service_server::ControlPlaneServiceServer::new(self)
            .max_decoding_message_size(crate::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(crate::limits::MAX_MESSAGE_BYTES)
    }
}

#[tonic::async_trait]
impl nb::control_plane_service_server::ControlPlaneService for Northbound {
    type ListNodesStream = ListStream<nb::NodeEntry>;
    type ListRoutesStream = ListStream<nb::RouteEntry>;
    type ListLinksStream = ListStream<nb::LinkEntry>;

    async fn list_node_routes(
        &self,
        request: Request<nb::Node>,
    ) -> Result<Response<sb::RouteListResponse>, Status> {
        let node = request.into_inner().id;
        Ok(Response::new(self.ctx.live_routes(&node).await?))
    }

    async fn list_connections(
        &self,
        request: Request<nb::Node>,
    ) -> Result<Response<sb::ConnectionListResponse>, Status> {
        let node = request.into_inner().id;
        Ok(Response::new(self.ctx.live_connections(&node).await?))
    }

    async fn list_nodes(
        &self,
        _request: Request<nb::NodeListRequest>,
    ) -> Result<Response<Self::ListNodesStream>, Status> {
        let nodes = self
            .ctx
            .store
            .list_nodes()
            .await
            .map_err(errors::from_store)?;
        Ok(stream_of(nodes.iter().map(listing::node_entry).collect()))
    }

    async fn list_routes(
        &self,
        request: Request<nb::RouteListRequest>,
    ) -> Result<Response<Self::ListRoutesStream>, Status> {
        let store = &self.ctx.store;
        let templates = store.list_templates().await.map_err(errors::from_store)?;
        let routes = store.list_routes().await.map_err(errors::from_store)?;
        let req = request.into_inner();
        Ok(stream_of(listing::route_entries(&templates, &routes, &req)))
    }

    async fn list_links(
        &self,
        request: Request<nb::LinkListRequest>,
    ) -> Result<Response<Self::ListLinksStream>, Status> {
        let links = self
            .ctx
            .store
            .list_links()
            .await
            .map_err(errors::from_store)?;
        let graphs = self.ctx.graphs().await?;
        let req = request.into_inner();
        Ok(stream_of(listing::link_entries(&links, &graphs, &req)))
    }

    async fn list_segments(
        &self,
        _request: Request<nb::SegmentListRequest>,
    ) -> Result<Response<nb::SegmentListResponse>, Status> {
        let graphs = self.ctx.graphs().await?;
        Ok(Response::new(nb::SegmentListResponse {
            segments: listing::segment_entries(&graphs),
        }))
    }

    async fn add_segment(
        &self,
        request: Request<nb::AddSegmentRequest>,
    ) -> Result<Response<nb::AddSegmentResponse>, Status> {
        self.ctx.add_segment(&request.into_inner().name).await?;
        Ok(Response::new(nb::AddSegmentResponse {}))
    }

    async fn remove_segment(
        &self,
        request: Request<nb::RemoveSegmentRequest>,
    ) -> Result<Response<nb::RemoveSegmentResponse>, Status> {
        self.ctx.remove_segment(&request.into_inner().name).await?;
        Ok(Response::new(nb::RemoveSegmentResponse {}))
    }

    async fn add_topology_link(
        &self,
        request: Request<nb::AddTopologyLinkRequest>,
    ) -> Result<Response<nb::AddTopologyLinkResponse>, Status> {
        let r = request.into_inner();
        let warnings = self
            .ctx
            .add_topology_link(&r.group_a, &r.group_b, &r.segment)
            .await?;
        Ok(Response::new(nb::AddTopologyLinkResponse { warnings }))
    }

    async fn remove_topology_link(
        &self,
        request: Request<nb::RemoveTopologyLinkRequest>,
    ) -> Result<Response<nb::RemoveTopologyLinkResponse>, Status> {
        let r = request.into_inner();
        self.ctx
            .remove_topology_link(&r.group_a, &r.group_b, &r.segment)
            .await?;
        Ok(Response::new(nb::RemoveTopologyLinkResponse {}))
    }

    async fn list_domains(
        &self,
        _request: Request<nb::ListDomainsRequest>,
    ) -> Result<Response<nb::ListDomainsResponse>, Status> {
        let domains = self.ctx.list_domains().await?;
        Ok(Response::new(nb::ListDomainsResponse { domains }))
    }

    async fn add_domain(
        &self,
        request: Request<nb::AddDomainRequest>,
    ) -> Result<Response<nb::AddDomainResponse>, Status> {
        let r = request.into_inner();
        self.ctx.add_domain(&r.domain_name, &r.secret).await?;
        Ok(Response::new(nb::AddDomainResponse {}))
    }

    async fn remove_domain(
        &self,
        request: Request<nb::RemoveDomainRequest>,
    ) -> Result<Response<nb::RemoveDomainResponse>, Status> {
        let name = request.into_inner().domain_name;
        self.ctx.remove_domain(&name).await?;
        Ok(Response::new(nb::RemoveDomainResponse {}))
    }
}
