//! Routes a node holds but can no longer remove, and the links re-created
//! to drop them.
//!
//! A 2.0.0-alpha.2 node forgets the ids of its subscriptions whenever its
//! control stream reconnects, and drops only the connections it dialed.
//! The end of a link that was dialed *to* it keeps its connection, and
//! with it the routes set over it: listed as held, yet every removal is
//! refused with "subscription id not found", because the datapath finds a
//! subscription by its id only. Closing the connection is the one thing
//! that drops them. So the first such refusal flags the link; the link's
//! source (the node that dials it) deletes it, creates it again at its
//! next look with its own routes over it, and then the other end is
//! looked at at once to set again the routes it still should hold.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use uuid::Uuid;

use super::diff::Step;
use crate::proto::sb;
use crate::store::model::Link;

/// The refusal of an unsubscription whose id the node no longer knows.
pub fn is_stranded(message: &str) -> bool {
    message
        .to_ascii_lowercase()
        .contains("subscription id not found")
}

/// Links flagged for re-creation, each with the session of its source
/// when it was flagged, kept by the leader for its term (a new leader
/// meets the same refusal and flags them again). A source that has
/// registered since dropped the link itself, and got it anew from its
/// registration: its flag no longer holds.
#[derive(Default)]
pub struct Stranded(Mutex<BTreeMap<String, Uuid>>);

impl Stranded {
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Uuid>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Flags `link_id` for its source's `session`; `true` if it was not
    /// flagged for that session yet.
    pub fn flag(&self, link_id: &str, session: Uuid) -> bool {
        self.map().insert(link_id.to_string(), session) != Some(session)
    }

    /// Whether `link_id` is flagged for the source's current `session`;
    /// a flag of an earlier session is dropped.
    pub fn is_flagged(&self, link_id: &str, session: Uuid) -> bool {
        let mut map = self.map();
        match map.get(link_id) {
            Some(s) if *s == session => true,
            Some(_) => {
                map.remove(link_id);
                false
            }
            None => false,
        }
    }

    pub fn clear(&self, link_id: &str) {
        self.map().remove(link_id);
    }
}

/// The links carrying the routes whose removal `ack` refused as stranded,
/// among those the step asked to remove.
pub fn refused_removals(step: &Step, ack: &sb::ConfigurationCommandAck) -> BTreeSet<String> {
    let asked = &step.command.routes_to_delete;
    ack.routes_status
        .iter()
        .filter(|s| !s.success && is_stranded(&s.error_msg))
        .filter_map(|s| s.route.as_ref())
        .filter(|r| asked.contains(r))
        .filter_map(|r| r.link_id.clone())
        .collect()
}

impl Step {
    /// Adds the deletion of every flagged link `node` dials and holds to
    /// the step; its next look creates the link again, as any missing
    /// one, with the routes over it. Not both in one command: a node
    /// closes a deleted connection after answering, and would take the
    /// creation for the connection it is closing.
    pub fn drop_links(&mut self, node: &str, links: &[Link], flagged: impl Fn(&str) -> bool) {
        let held = |l: &&Link| {
            l.source_node == node
                && !l.deleted
                && flagged(&l.link_id)
                && !self.creating.contains(&l.link_id)
        };
        for l in links.iter().filter(held) {
            self.command.connections_to_delete.push(l.link_id.clone());
            self.dropping.push(l.link_id.clone());
        }
    }
}

#[cfg(test)]
#[path = "stranded_tests.rs"]
mod tests;
