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

use std::collections::BTreeSet;
use std::sync::Mutex;

use super::diff::Step;
use crate::proto::sb;
use crate::store::model::Link;

/// The refusal of an unsubscription whose id the node no longer knows.
pub fn is_stranded(message: &str) -> bool {
    message
        .to_ascii_lowercase()
        .contains("subscription id not found")
}

/// Links flagged for re-creation, kept by the leader for its term (a new
/// leader meets the same refusal and flags them again).
#[derive(Default)]
pub struct Stranded(Mutex<BTreeSet<String>>);

impl Stranded {
    fn set(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Flags `link_id`; `true` if it was not flagged yet.
    pub fn flag(&self, link_id: &str) -> bool {
        self.set().insert(link_id.to_string())
    }

    pub fn is_flagged(&self, link_id: &str) -> bool {
        self.set().contains(link_id)
    }

    pub fn clear(&self, link_id: &str) {
        self.set().remove(link_id);
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
