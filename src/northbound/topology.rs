//! API-mode topology mutations. In config mode the file is the source of
//! truth and every mutation is refused with FAILED_PRECONDITION.

use tonic::Status;

use super::{Ctx, DEFAULT_SEGMENT, errors};
use crate::store::model::NodeRecord;

/// Segment and group names: non-empty, printable, no `/` (it separates the
/// group from the node in ids), no template or wildcard tokens.
pub fn check_name(what: &str, value: &str) -> Result<(), Status> {
    let bad = if value.trim().is_empty() {
        Some("must not be empty")
    } else if value.chars().any(|c| c.is_control() || c.is_whitespace()) {
        Some("must not contain whitespace or control characters")
    } else if value.len() > crate::limits::MAX_ID_BYTES {
        return Err(Status::invalid_argument(format!(
            "{what} is {} bytes long; at most {} are accepted",
            value.len(),
            crate::limits::MAX_ID_BYTES
        )));
    } else if value.contains('/') {
        Some("must not contain '/'")
    } else if value == "*" || value.contains("$group") {
        Some("must be a concrete name, not '*' or '$group'")
    } else {
        None
    };
    match bad {
        Some(why) => Err(Status::invalid_argument(format!("{what} {value:?} {why}"))),
        None => Ok(()),
    }
}

impl Ctx {
    pub(super) fn ensure_api_mode(&self) -> Result<(), Status> {
        if self.topology.is_api_mode() {
            return Ok(());
        }
        Err(Status::failed_precondition(
            "the topology is managed by the configuration file (config mode); \
             remove the `topology` links/segments from the file to manage it through the API",
        ))
    }

    /// After a topology change every node may gain or lose links.
    async fn topology_changed(&self) {
        if let Ok(nodes) = self.store.list_nodes().await {
            nodes.iter().for_each(|n| self.signals.node_changed(&n.id));
        }
    }

    pub async fn add_segment(&self, name: &str) -> Result<(), Status> {
        self.ensure_api_mode()?;
        check_name("segment name", name)?;
        self.store
            .add_segment(name)
            .await
            .map_err(errors::from_store)?;
        Ok(())
    }

    pub async fn remove_segment(&self, name: &str) -> Result<(), Status> {
        self.ensure_api_mode()?;
        check_name("segment name", name)?;
        if name == DEFAULT_SEGMENT {
            return Err(Status::failed_precondition(
                "the default segment cannot be removed; remove its links instead",
            ));
        }
        if !self
            .store
            .remove_segment(name)
            .await
            .map_err(errors::from_store)?
        {
            return Err(Status::not_found(format!("segment '{name}' not found")));
        }
        self.topology_changed().await;
        Ok(())
    }

    /// Adds the link (idempotent) and warns about groups with no node yet.
    pub async fn add_topology_link(
        &self,
        a: &str,
        b: &str,
        segment: &str,
    ) -> Result<Vec<String>, Status> {
        self.ensure_api_mode()?;
        check_pair(a, b)?;
        let segment = segment_or_default(segment);
        self.store
            .add_segment_edge(segment, a, b)
            .await
            .map_err(errors::from_store)?;
        let nodes = self.store.list_nodes().await.map_err(errors::from_store)?;
        self.topology_changed().await;
        Ok([a, b]
            .iter()
            .filter_map(|g| no_nodes_warning(&nodes, g))
            .collect())
    }

    pub async fn remove_topology_link(
        &self,
        a: &str,
        b: &str,
        segment: &str,
    ) -> Result<(), Status> {
        self.ensure_api_mode()?;
        check_pair(a, b)?;
        let segment = segment_or_default(segment);
        let removed = self
            .store
            .remove_segment_edge(segment, a, b)
            .await
            .map_err(errors::from_store)?;
        if !removed {
            return Err(Status::not_found(format!(
                "link {a}↔{b} not found in segment '{segment}'"
            )));
        }
        self.topology_changed().await;
        Ok(())
    }
}

fn segment_or_default(segment: &str) -> &str {
    if segment.is_empty() {
        DEFAULT_SEGMENT
    } else {
        segment
    }
}

fn check_pair(a: &str, b: &str) -> Result<(), Status> {
    check_name("group_a", a)?;
    check_name("group_b", b)?;
    if a == b {
        return Err(Status::invalid_argument(format!(
            "a topology link joins two different groups; got {a:?} twice"
        )));
    }
    Ok(())
}

fn no_nodes_warning(nodes: &[NodeRecord], group: &str) -> Option<String> {
    let present = nodes.iter().any(|n| n.group.as_deref() == Some(group));
    (!present).then(|| {
        format!(
            "group '{group}' has no registered nodes yet; the link will be created when its nodes register"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_with_a_reason() {
        for bad in ["", " ", "a b", "a/b", "*", "seg-$group", "x\n"] {
            let err = check_name("segment name", bad).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{bad:?}");
            assert!(err.message().contains("segment name"), "{}", err.message());
        }
        assert!(check_name("segment name", "blue-1").is_ok());
    }

    #[test]
    fn a_group_cannot_link_to_itself() {
        assert_eq!(
            check_pair("a", "a").unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }
}
