//! When the nodes a derivation affected are queued for reconciliation.
//!
//! Coalescing ([`Affected`]): the derivations of one moment (a burst of
//! registrations, link claims answering each other) reach a node as one
//! command rather than one per derivation. A fast store derives often and
//! a slow one seldom: queued at once, the same fleet cost more commands
//! the faster its store was (issue 12).
//!
//! Holding ([`Pacing`]): a node whose links were just commanded waits,
//! briefly, for their claims before it is looked at again. A gateway's
//! links are claimed one after another as its dials land, and each claim
//! lets routes ride its link. Looked at between claims, the gateway would
//! get its routes in several commands; held until its links are claimed
//! (or [`HOLD_MAX`] has passed), it gets them in one, however fast or slow
//! the store makes the claims arrive. A node with a link it has not been
//! commanded to create is never held: its dials are what the others wait
//! for. A node is also held for the links into its group that it may
//! claim, from sources commanded to dial them or about to be (connected):
//! at 10,000 nodes the gateways' link commands go out over about a second,
//! and a gateway released while a later source had yet to be commanded
//! got the routes over that source's link in a third command (29 of 100
//! gateways in one Postgres run, 228 commands instead of 199).
//!
//! Last, a node is held while facts wait in the leader's inbox: the next
//! derivation may change it again. In a registration burst the names and
//! gateways of late nodes reach the leader in batches a few hundred
//! milliseconds apart (at 10,000 nodes each batch reads thousands of
//! records); a gateway released between them, its own links all claimed,
//! got the next batch's routes in a third command (25 of 100 gateways,
//! 224 commands). It is looked at again every [`RECHECK`] until the inbox
//! is empty, and never held past [`FACTS_HOLD_MAX`]: a 10,000-node burst
//! lasts about two seconds, and gateways released at the one-second cap
//! while names still arrived cost 16-53 of them a third command.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, trace};

use super::working::Rows;
use crate::store::model::{Link, LinkStatus};

/// Affected nodes are queued once no derivation has affected any node for
/// this long ...
pub const COALESCE_QUIET: Duration = Duration::from_millis(30);
/// ... or at the latest this long after the first of them.
pub const COALESCE_MAX: Duration = Duration::from_millis(150);

/// The longest a node is held: a link that is never claimed (its
/// destination died) must not keep the routes over the others back.
pub const HOLD_MAX: Duration = Duration::from_secs(1);

/// The longest a node is held for facts waiting in the inbox: constant
/// churn must not keep its commands back for long.
pub const FACTS_HOLD_MAX: Duration = Duration::from_secs(2);

/// How often nodes held while facts wait are looked at again.
pub const RECHECK: Duration = Duration::from_millis(25);

/// Nodes whose desired state changed, waiting to be queued.
#[derive(Default)]
pub struct Affected {
    nodes: BTreeSet<String>,
    /// Nodes that only registered: their look waits behind changed ones.
    arrived: BTreeSet<String>,
    /// When the first of `nodes` and the latest came.
    first: Option<Instant>,
    last: Option<Instant>,
}

impl Affected {
    /// Nodes a derivation affected and those it saw arrive.
    pub fn add<'a>(
        &mut self,
        nodes: impl IntoIterator<Item = &'a String>,
        arrived: impl IntoIterator<Item = &'a String>,
    ) {
        let mut any = false;
        for n in nodes {
            any = true;
            self.nodes.insert(n.clone());
        }
        for n in arrived {
            any = true;
            self.arrived.insert(n.clone());
        }
        if any {
            let now = Instant::now();
            self.first.get_or_insert(now);
            self.last = Some(now);
        }
    }

    /// When the nodes are due: after a quiet spell, or at the latest
    /// [`COALESCE_MAX`] after the first.
    pub fn due(&self) -> Option<Instant> {
        let (first, last) = (self.first?, self.last?);
        Some((last + COALESCE_QUIET).min(first + COALESCE_MAX))
    }

    /// Whether no derivation's nodes are waiting.
    pub fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    /// If they are due at `now`: the changed nodes, then those that only
    /// arrived.
    pub fn take(&mut self, now: Instant) -> (BTreeSet<String>, BTreeSet<String>) {
        if self.due().is_none_or(|d| d > now) {
            return Default::default();
        }
        (self.first, self.last) = (None, None);
        let nodes = std::mem::take(&mut self.nodes);
        let mut arrived = std::mem::take(&mut self.arrived);
        arrived.retain(|n| !nodes.contains(n));
        (nodes, arrived)
    }
}

/// What the leader remembers between releases.
#[derive(Default)]
pub struct Pacing {
    /// Per node, the unclaimed links it sourced when it was last released:
    /// its command for them is on its way.
    commanded: HashMap<String, BTreeSet<String>>,
    /// The held nodes, each with when it was first held: it is looked at
    /// when affected again, or at the latest at its cap after that
    /// ([`HOLD_MAX`], or [`FACTS_HOLD_MAX`] if it waits for facts only).
    held_since: HashMap<String, Instant>,
    /// The held nodes that wait for nothing but the facts in the inbox,
    /// and when they are looked at again.
    waiting_for_facts: BTreeSet<String>,
    recheck_at: Option<Instant>,
}

/// The links of one release, indexed by what a hold asks of them.
struct Waiting<'r> {
    /// Per source, its links not yet claimed (Pending or Connecting).
    outgoing: HashMap<&'r str, Vec<&'r Link>>,
    /// Per destination group, the links into it not yet claimed.
    incoming: HashMap<&'r str, Vec<&'r Link>>,
}

impl<'r> Waiting<'r> {
    fn new(rows: &'r Rows) -> Self {
        let mut w = Waiting {
            outgoing: HashMap::new(),
            incoming: HashMap::new(),
        };
        for l in rows.links.iter().filter(|l| unclaimed(l)) {
            w.outgoing.entry(&l.source_node).or_default().push(l);
            w.incoming.entry(&l.dest_group).or_default().push(l);
        }
        w
    }
}

impl Pacing {
    /// Of `nodes` and the held nodes whose time is up, those to look at
    /// now; the others are held. `facts_waiting`: the inbox holds facts
    /// the leader has not derived yet.
    pub fn release(
        &mut self,
        rows: Option<&Rows>,
        mut nodes: BTreeSet<String>,
        now: Instant,
        facts_waiting: bool,
    ) -> Vec<String> {
        let expired = (self.held_since.iter()).filter(|(n, since)| self.cap(n, **since) <= now);
        let expired: Vec<String> = expired.map(|(n, _)| n.clone()).collect();
        nodes.extend(expired);
        if !facts_waiting {
            nodes.append(&mut self.waiting_for_facts);
        }
        let Some(rows) = rows else {
            self.held_since.clear();
            self.waiting_for_facts.clear();
            self.recheck_at = None;
            return nodes.into_iter().collect();
        };
        // A recheck while facts still wait usually has nobody to look at:
        // no index of every link for it.
        let go = if nodes.is_empty() {
            Vec::new()
        } else {
            let waiting = Waiting::new(rows);
            let mut held = |n: &String| self.hold(rows, &waiting, n, now, facts_waiting);
            nodes.into_iter().filter(|n| !held(n)).collect()
        };
        self.recheck_at = (!self.waiting_for_facts.is_empty()).then(|| now + RECHECK);
        go
    }

    /// When the hold of `node`, begun at `since`, runs out: one for the
    /// inbox's facts alone lasts longer than one for claims.
    fn cap(&self, node: &str, since: Instant) -> Instant {
        match self.waiting_for_facts.contains(node) {
            true => since + FACTS_HOLD_MAX,
            false => since + HOLD_MAX,
        }
    }

    /// Whether a node is held for its claims.
    pub fn holding(&self) -> bool {
        !self.held_since.is_empty()
    }

    /// Whether a link whose source was commanded to dial it is not claimed
    /// yet (as `rows` have it): its claim is on its way, and the
    /// derivation that takes it will send routes over it.
    pub fn awaiting_claims(&self, rows: Option<&Rows>) -> bool {
        let Some(rows) = rows.filter(|_| !self.commanded.is_empty()) else {
            return false;
        };
        rows.links.iter().any(|l| unclaimed(l) && self.dialed(l))
    }

    /// When the first held node's time is up, or the nodes held for the
    /// inbox's facts are looked at again.
    pub fn due(&self) -> Option<Instant> {
        let caps = (self.held_since.iter()).map(|(n, since)| self.cap(n, *since));
        caps.chain(self.recheck_at).min()
    }

    /// Whether `node` is held (again).
    fn hold(
        &mut self,
        rows: &Rows,
        w: &Waiting<'_>,
        node: &str,
        now: Instant,
        facts_waiting: bool,
    ) -> bool {
        let outgoing = w.outgoing.get(node).map_or(&[][..], Vec::as_slice);
        let sent = self.commanded.get(node);
        let uncommanded = outgoing
            .iter()
            .any(|l| sent.is_none_or(|s| !s.contains(&l.link_id)));
        if uncommanded {
            let ids = outgoing.iter().map(|l| l.link_id.clone()).collect();
            self.commanded.insert(node.to_string(), ids);
            self.held_since.remove(node);
            self.waiting_for_facts.remove(node);
            debug!(node, links = outgoing.len(), "released to dial");
            return false;
        }
        if outgoing.is_empty() {
            self.commanded.remove(node);
        }
        let group = rows.nodes.get(node).and_then(|n| n.group.as_deref());
        let incoming = group.and_then(|g| w.incoming.get(g));
        let awaited_in = incoming.is_some_and(|links| {
            links.iter().any(|l| {
                l.dest_node.as_deref().is_none_or(|d| d == node)
                    && (self.dialed(l) || connected(rows, &l.source_node))
            })
        });
        let since = *self.held_since.entry(node.to_string()).or_insert(now);
        let wants_claims = !outgoing.is_empty() || awaited_in;
        let awaited = wants_claims && since + HOLD_MAX > now;
        let facts_held = facts_waiting && since + FACTS_HOLD_MAX > now;
        let held = awaited || facts_held;
        if !held {
            self.held_since.remove(node);
        }
        if !held && (wants_claims && !awaited || facts_waiting && !facts_held) {
            debug!(node, "released at the cap of its hold");
        }
        if held && !awaited {
            self.waiting_for_facts.insert(node.to_string());
        } else {
            self.waiting_for_facts.remove(node);
        }
        trace!(node, held, outgoing = outgoing.len(), awaited_in, facts_held, held_for = ?now - since, "paced");
        held
    }

    /// Whether `l`'s source was commanded to dial it.
    fn dialed(&self, l: &Link) -> bool {
        l.status == LinkStatus::Connecting
            || self
                .commanded
                .get(&l.source_node)
                .is_some_and(|s| s.contains(&l.link_id))
    }
}

/// Whether `l` is live and not claimed (Pending or Connecting).
fn unclaimed(l: &Link) -> bool {
    !l.deleted && matches!(l.status, LinkStatus::Pending | LinkStatus::Connecting)
}

/// Whether `node` has a ready session: a link it sources will be dialed
/// once its command goes out, even if it has not gone yet.
fn connected(rows: &Rows, node: &str) -> bool {
    rows.nodes
        .get(node)
        .is_some_and(|n| n.ready_session().is_some())
}

#[cfg(test)]
#[path = "pacing_tests.rs"]
mod tests;
