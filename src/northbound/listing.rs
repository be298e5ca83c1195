//! Read-only operator calls: listings from the store, live tables from the
//! nodes. Wire shapes and status numbers follow the reference (see
//! shared/spec/protocol-notes.md, "Northbound status numbers").

use std::collections::{BTreeSet, HashMap};

use crate::names;
use crate::proto::details::Form;
use crate::proto::{nb, sb};
use crate::routing::topology::SegmentGraph;
use crate::southbound::handshake::detail_to_wire;
use crate::store::model::{Link, LinkStatus, NodeRecord, Route, RouteStatus, Template};

/// The source id of wildcard templates in route listings.
pub const ALL_NODES: &str = "*";

/// A node as `ListNodes` gives it. Its listeners are written in the common
/// form (see [`Form::Common`]), whatever revision the node spoke: slimctl
/// 2.0.0-alpha.2 and 3.x send byte-identical `ListNodes` calls (same
/// request, same tonic user agent, no header of their own), so the
/// caller's revision cannot be told, and a listener written in the other
/// revision's form would fail the caller's whole listing.
pub fn node_entry(n: &NodeRecord) -> nb::NodeEntry {
    let status = if n.is_connected() {
        nb::NodeStatus::Connected
    } else {
        nb::NodeStatus::NotConnected
    };
    nb::NodeEntry {
        id: n.id.clone(),
        connections: n
            .connection_details
            .iter()
            .map(|d| detail_to_wire(d, Form::Common))
            .collect(),
        status: status as i32,
        group: n.group.clone().unwrap_or_default(),
    }
}

fn route_status(s: RouteStatus) -> nb::RouteStatus {
    match s {
        RouteStatus::Applied => nb::RouteStatus::Applied,
        RouteStatus::Failed => nb::RouteStatus::Failed,
        RouteStatus::Deleted => nb::RouteStatus::Deleted,
        RouteStatus::Pending => nb::RouteStatus::Pending,
    }
}

fn link_status(s: LinkStatus) -> nb::LinkStatus {
    match s {
        LinkStatus::Pending | LinkStatus::Connecting => nb::LinkStatus::Pending,
        LinkStatus::Applied => nb::LinkStatus::Applied,
        LinkStatus::Failed => nb::LinkStatus::Failed,
    }
}

/// `filter` empty matches everything.
fn matches(filter: &str, value: &str) -> bool {
    filter.is_empty() || filter == value
}

/// Routes, wildcard templates first (as `* -> node`, Applied), then routes
/// by source node.
pub fn route_entries(
    templates: &[Template],
    routes: &[Route],
    req: &nb::RouteListRequest,
) -> Vec<nb::RouteEntry> {
    let wildcard = templates.iter().map(|t| nb::RouteEntry {
        id: format!("{ALL_NODES}:{}:{}", t.node, t.seq),
        source_node_id: ALL_NODES.into(),
        dest_node_id: t.node.clone(),
        name: Some(names::to_wire(&t.name)),
        status: nb::RouteStatus::Applied as i32,
        last_updated: t.updated_at,
        ..Default::default()
    });
    let mut concrete: Vec<nb::RouteEntry> = routes
        .iter()
        .map(|r| nb::RouteEntry {
            id: r.id.clone(),
            source_node_id: r.source_node.clone(),
            dest_node_id: r.dest_node.clone(),
            name: Some(names::to_wire(&r.name)),
            status: route_status(r.status) as i32,
            status_msg: r.status_msg.clone(),
            last_updated: r.updated_at,
            link_id: r.link_id.clone(),
            ..Default::default()
        })
        .collect();
    concrete.sort_by(|a, b| a.source_node_id.cmp(&b.source_node_id));
    wildcard
        .chain(concrete)
        .filter(|e| matches(&req.src_node_id, &e.source_node_id))
        .filter(|e| matches(&req.dest_node_id, &e.dest_node_id))
        .collect()
}

fn link_entry(l: &Link) -> nb::LinkEntry {
    nb::LinkEntry {
        id: l.link_id.clone(),
        link_id: l.link_id.clone(),
        source_node_id: l.source_node.clone(),
        dest_node_id: l.dest_node.clone().unwrap_or_default(),
        dest_endpoint: crate::routing::linkconfig::url(&l.dest_endpoint),
        conn_config_data: l.config_data.clone(),
        status: link_status(l.status) as i32,
        status_msg: l.status_msg.clone(),
        deleted: l.deleted,
        last_updated: l.updated_at,
    }
}

/// Stored links matching the filters, then one Pending entry per allowed
/// group pair with no live link yet (group names in the node fields), as
/// the reference shows them.
pub fn link_entries(
    links: &[Link],
    graphs: &[SegmentGraph],
    req: &nb::LinkListRequest,
) -> Vec<nb::LinkEntry> {
    let realized: BTreeSet<(String, String)> = links
        .iter()
        .filter(|l| !l.deleted)
        .map(|l| crate::store::model::edge(&l.source_group, &l.dest_group))
        .collect();
    let stored = links
        .iter()
        .filter(|l| matches(&req.src_node_id, &l.source_node))
        .filter(|l| {
            matches(
                &req.dest_node_id,
                l.dest_node.as_deref().unwrap_or_default(),
            )
        })
        .map(link_entry);
    let wanted: BTreeSet<(&str, &str)> = graphs.iter().flat_map(SegmentGraph::edges).collect();
    let pending = wanted
        .into_iter()
        .filter(|(a, b)| !realized.contains(&(a.to_string(), b.to_string())))
        .map(|(a, b)| nb::LinkEntry {
            id: format!("pending|{a}|{b}"),
            link_id: "-".into(),
            source_node_id: a.to_string(),
            dest_node_id: b.to_string(),
            dest_endpoint: "-".into(),
            status: nb::LinkStatus::Pending as i32,
            ..Default::default()
        });
    stored.chain(pending).collect()
}

pub fn segment_entries(graphs: &[SegmentGraph]) -> Vec<nb::SegmentEntry> {
    graphs
        .iter()
        .map(|g| nb::SegmentEntry {
            name: g.name.clone(),
            groups: g.groups(),
            edges: g
                .edges()
                .map(|(a, b)| nb::SegmentEdge {
                    group_a: a.to_string(),
                    group_b: b.to_string(),
                })
                .collect(),
        })
        .collect()
}

/// Fills `peer_node_id` of the node's remote connections from the links
/// they carry, so operators see who is at the other end.
pub fn name_peers(node: &str, entries: &mut [sb::ConnectionEntry], links: &[Link]) {
    let peers: HashMap<&str, &str> = links
        .iter()
        .filter_map(|l| {
            let peer = if l.source_node == node {
                l.dest_node.as_deref()?
            } else {
                l.source_node.as_str()
            };
            Some((l.link_id.as_str(), peer))
        })
        .collect();
    for e in entries {
        let remote = e.connection_type == sb::ConnectionType::Remote as i32;
        if let Some(peer) = e
            .link_id
            .as_deref()
            .and_then(|l| peers.get(l))
            .filter(|_| remote)
        {
            e.peer_node_id = Some((*peer).to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_link(id: &str, source: &str, dest: Option<&str>) -> Link {
        Link {
            link_id: id.into(),
            source_node: source.into(),
            source_group: "a".into(),
            dest_group: "b".into(),
            dest_node: dest.map(str::to_string),
            dest_endpoint: "h:1".into(),
            config_data: String::new(),
            status: LinkStatus::Applied,
            status_msg: String::new(),
            deleted: false,
            updated_at: 0,
            claim: None,
        }
    }

    fn mk_entry(link: &str, kind: sb::ConnectionType) -> sb::ConnectionEntry {
        sb::ConnectionEntry {
            link_id: Some(link.into()),
            connection_type: kind as i32,
            ..Default::default()
        }
    }

    #[test]
    fn remote_connections_name_the_node_at_the_other_end() {
        let links = [
            mk_link("out", "a/n1", Some("b/n1")),
            mk_link("in", "c/n1", Some("a/n1")),
        ];
        let mut entries = [
            mk_entry("out", sb::ConnectionType::Remote),
            mk_entry("in", sb::ConnectionType::Remote),
            mk_entry("out", sb::ConnectionType::Peer),
            mk_entry("unknown", sb::ConnectionType::Remote),
        ];
        name_peers("a/n1", &mut entries, &links);
        let peers: Vec<_> = entries.iter().map(|e| e.peer_node_id.as_deref()).collect();
        assert_eq!(peers, [Some("b/n1"), Some("c/n1"), None, None]);
    }

    #[test]
    fn an_unclaimed_link_names_no_peer() {
        let links = [mk_link("out", "a/n1", None)];
        let mut entries = [mk_entry("out", sb::ConnectionType::Remote)];
        name_peers("a/n1", &mut entries, &links);
        assert_eq!(entries[0].peer_node_id, None);
    }
}
