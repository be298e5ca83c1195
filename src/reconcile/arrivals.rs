//! When the looks at nodes that only registered are queued.
//!
//! A node whose registration changed nobody's desired state still gets a
//! look (its live tables may hold what it should not, or lack what a
//! restart took), but that look has nothing to do with the change the
//! fleet is waiting for. In a registration burst there are hundreds of
//! them, each a few reads on the store and a round trip to the node; on
//! Postgres they ran beside the leader's claim writes and the gateways'
//! commands, on the same two cores, and held both back (issue 12: about
//! a tenth of a 1,000-node convergence). So they wait while the leader is
//! busy (a derivation's nodes are coalescing, a node is held for its
//! claims, an urgent reconcile is queued or running), and are queued once
//! it is not, or at the latest [`WAIT_MAX`] after the first of them came.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;

/// The longest an arrival's look waits for a quiet leader.
pub const WAIT_MAX: Duration = Duration::from_secs(2);

/// How often a busy leader is asked again: whether the urgent reconciles
/// are done is the queue's to know, and it does not call back.
pub const RECHECK: Duration = Duration::from_millis(20);

/// Arrived nodes waiting for their look to be queued.
#[derive(Default)]
pub struct Arrivals {
    nodes: BTreeSet<String>,
    /// When the first of `nodes` came.
    since: Option<Instant>,
    /// When a busy leader is asked again.
    recheck: Option<Instant>,
}

impl Arrivals {
    pub fn add(&mut self, nodes: BTreeSet<String>, now: Instant) {
        if nodes.is_empty() {
            return;
        }
        self.nodes.extend(nodes);
        self.since.get_or_insert(now);
        self.recheck.get_or_insert(now);
    }

    /// Nodes whose desired state changed get the urgent look instead.
    pub fn remove<'a>(&mut self, nodes: impl IntoIterator<Item = &'a String>) {
        for n in nodes {
            self.nodes.remove(n);
        }
        if self.nodes.is_empty() {
            (self.since, self.recheck) = (None, None);
        }
    }

    /// When to ask whether the leader is busy.
    pub fn due(&self) -> Option<Instant> {
        let latest = self.since? + WAIT_MAX;
        Some(self.recheck.map_or(latest, |r| r.min(latest)))
    }

    /// The nodes to queue now: all of them if the leader is not `busy` or
    /// the first has waited [`WAIT_MAX`], otherwise none until the next
    /// [`RECHECK`].
    pub fn take(&mut self, busy: bool, now: Instant) -> BTreeSet<String> {
        let Some(since) = self.since else {
            return BTreeSet::new();
        };
        if self.due().is_some_and(|d| d > now) {
            return BTreeSet::new();
        }
        if busy && since + WAIT_MAX > now {
            self.recheck = Some(now + RECHECK);
            return BTreeSet::new();
        }
        (self.since, self.recheck) = (None, None);
        std::mem::take(&mut self.nodes)
    }
}

#[cfg(test)]
#[path = "arrivals_tests.rs"]
mod tests;
