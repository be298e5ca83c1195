//! The node records a derivation reads, indexed by group and by id, so
//! that the leader can keep them between derivations and replace one node
//! at a time, and a derivation can look at one group, or one node, without
//! walking the fleet.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::links::grace_left;
use crate::store::model::{ConnectionDetail, DepartureKind, NodeRecord};

/// One group's records, by id.
type Members = BTreeMap<String, NodeRecord>;

#[derive(Debug, Default, Clone, PartialEq)]
pub struct Fleet {
    groups: BTreeMap<String, Members>,
    /// Nodes that registered without a group (refused by nothing, linked
    /// by nothing).
    ungrouped: Members,
    group_of: HashMap<String, Option<String>>,
}

impl Fleet {
    pub fn new(records: impl IntoIterator<Item = NodeRecord>) -> Self {
        let mut fleet = Fleet::default();
        for r in records {
            fleet.upsert(r);
        }
        fleet
    }

    pub fn len(&self) -> usize {
        self.group_of.len()
    }

    pub fn is_empty(&self) -> bool {
        self.group_of.is_empty()
    }

    pub fn get(&self, id: &str) -> Option<&NodeRecord> {
        match self.group_of.get(id)? {
            Some(g) => self.groups.get(g.as_str())?.get(id),
            None => self.ungrouped.get(id),
        }
    }

    /// Puts `record`, as a derivation reads it (see [`trimmed`]), in place
    /// of the node's; returns the one it replaced.
    pub fn upsert(&mut self, record: NodeRecord) -> Option<NodeRecord> {
        let record = trimmed(record);
        let old = self.remove(&record.id);
        self.group_of
            .insert(record.id.clone(), record.group.clone());
        let members = match &record.group {
            Some(g) => self.groups.entry(g.clone()).or_default(),
            None => &mut self.ungrouped,
        };
        members.insert(record.id.clone(), record);
        old
    }

    /// Takes the node out; returns its record.
    pub fn remove(&mut self, id: &str) -> Option<NodeRecord> {
        let Some(group) = self.group_of.remove(id)? else {
            return self.ungrouped.remove(id);
        };
        let members = self.groups.get_mut(group.as_str())?;
        let old = members.remove(id);
        if members.is_empty() {
            self.groups.remove(group.as_str());
        }
        old
    }

    /// Every record: ungrouped ones, then group by group in name order,
    /// each group's by id.
    pub fn iter(&self) -> impl Iterator<Item = &NodeRecord> {
        self.ungrouped
            .values()
            .chain(self.groups.values().flat_map(BTreeMap::values))
    }

    /// The records of `group`, by id.
    pub fn group(&self, group: &str) -> impl Iterator<Item = &NodeRecord> {
        self.groups
            .get(group)
            .into_iter()
            .flat_map(BTreeMap::values)
    }

    /// The groups with a node, in name order.
    pub fn group_names(&self) -> impl Iterator<Item = &str> {
        self.groups.keys().map(String::as_str)
    }

    /// Whether node `id` holds its links at `now` (see [`holds_links`]).
    pub fn holds_links(&self, id: &str, now: i64) -> bool {
        self.get(id).is_some_and(|n| holds_links(n, now))
    }

    /// Groups with a node that holds its links at `now`: the groups `*`
    /// and `$group` stand for.
    pub fn active_groups(&self, now: i64) -> BTreeSet<String> {
        self.groups
            .iter()
            .filter(|(_, members)| members.values().any(|n| holds_links(n, now)))
            .map(|(g, _)| g.clone())
            .collect()
    }
}

/// The record with only what a derivation reads of it: the external
/// endpoint (of the first detail that has one), the incoming connections
/// it reports, no announced routes. The leader keeps a record of every
/// node for as long as it leads.
pub fn trimmed(mut n: NodeRecord) -> NodeRecord {
    let external = n
        .connection_details
        .iter()
        .find_map(|d| d.external_endpoint.clone().filter(|e| !e.is_empty()));
    n.connection_details = external
        .map(|e| ConnectionDetail {
            external_endpoint: Some(e),
            ..ConnectionDetail::default()
        })
        .into_iter()
        .collect();
    n.reported_connections.retain(|c| c.incoming);
    n.reported_connections.shrink_to_fit();
    n.reported_routes = Vec::new();
    n
}

/// Whether a node holds its links: ready, registering again, or crashed
/// less than the departure grace ago (see [`grace_left`]).
pub fn holds_links(n: &NodeRecord, now: i64) -> bool {
    n.session.is_some() || crash_grace_left(n, now).is_some()
}

/// Seconds left of a crashed node's departure grace; `None` for a node
/// that did not crash, or whose grace is over.
pub fn crash_grace_left(n: &NodeRecord, now: i64) -> Option<i64> {
    crashed_away(n)
        .then(|| grace_left(now, n.updated_at))
        .flatten()
}

/// Whether the node is away after a crash (its grace may be over).
pub fn crashed_away(n: &NodeRecord) -> bool {
    n.session.is_none() && n.departure.is_some_and(|d| d.kind == DepartureKind::Crash)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::plan_tests::mk_node;
    use crate::store::model::Departure;

    #[test]
    fn a_node_that_changes_group_moves_between_groups() {
        let mut fleet = Fleet::new([mk_node("a", "n1"), mk_node("a", "n2")]);
        let mut moved = mk_node("b", "n1");
        moved.id = "a/n1".into();
        let old = fleet.upsert(moved);
        assert_eq!(old.and_then(|o| o.group).as_deref(), Some("a"));
        let in_a: Vec<_> = fleet.group("a").map(|n| n.id.as_str()).collect();
        let in_b: Vec<_> = fleet.group("b").map(|n| n.id.as_str()).collect();
        assert_eq!((in_a, in_b), (vec!["a/n2"], vec!["a/n1"]));
        assert_eq!(
            fleet.get("a/n1").and_then(|n| n.group.as_deref()),
            Some("b")
        );
        assert!(fleet.remove("a/n2").is_some());
        assert_eq!(fleet.group("a").count(), 0);
        assert_eq!(fleet.len(), 1);
        assert_eq!(fleet, Fleet::new(fleet.iter().cloned()));
    }

    #[test]
    fn a_crashed_group_is_active_through_the_grace_only() {
        let mut gone = mk_node("a", "n1");
        gone.session = None;
        gone.updated_at = 100;
        gone.departure = Some(Departure {
            generation: 1,
            kind: DepartureKind::Crash,
        });
        let mut left = mk_node("b", "n1");
        left.session = None;
        left.departure = Some(Departure {
            generation: 1,
            kind: DepartureKind::Deregistered,
        });
        let fleet = Fleet::new([gone, left, mk_node("c", "n1")]);
        let names = |now| fleet.active_groups(now).into_iter().collect::<Vec<_>>();
        assert_eq!(names(102), ["a", "c"]);
        assert_eq!(names(110), ["c"]);
        assert!(fleet.holds_links("a/n1", 101) && !fleet.holds_links("b/n1", 101));
    }
}
