//! Link planning: from the current facts (the nodes' registrations and
//! sessions, their claims, the topology) and the stored links, the changes
//! that give every allowed group pair exactly one live link.
//!
//! Links are sticky: a valid link is kept even if a newer node would win
//! the gateway choice, so arrivals never move traffic. A link changes only
//! when an end departs or stops being what the link says: a departed source
//! moves to a sibling (same link id, Pending, destination cleared so it is
//! claimed again); a departed destination, or one that came back on another
//! endpoint, gets the link deleted and recreated (the source would keep
//! dialling the old endpoint otherwise).
//!
//! Nothing here trusts what an earlier leader did: a claim records the
//! session generations of both ends, and a connection does not survive a
//! new session of either end (the source drops its outgoing connections
//! when it registers again; a restarted process has none). So a claimed
//! link whose end has a newer session is only Connecting until its
//! destination claims it again, whoever planned it before.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::fleet::{Fleet, crash_grace_left, holds_links};
use super::gateway;
use super::linkconfig;
use super::topology::{SegmentGraph, may_link};
use crate::store::Retire;
use crate::store::model::{Claim, Link, LinkStatus, NodeRecord, edge_ref};

/// How long a node that vanished without a goodbye keeps its links: a
/// node that only re-opened its control stream is back within this time
/// and keeps its incoming links without recreation; a dead one loses them
/// a little later.
pub const DEPARTURE_GRACE_SECS: i64 = 3;

/// Seconds left, at `now`, of a grace of [`DEPARTURE_GRACE_SECS`] that
/// began at the stamp `since`; `None` once it is over. Both are whole
/// seconds, floored (see `Store::now`), so `now - since` can read up to a
/// second less than the time that really passed: the grace is over only
/// once the difference exceeds [`DEPARTURE_GRACE_SECS`], so that it never
/// lasts less (it may last up to a second more).
pub fn grace_left(now: i64, since: i64) -> Option<i64> {
    let left = DEPARTURE_GRACE_SECS + 1 - (now - since);
    (left > 0).then_some(left)
}

/// Nodes that hold their links: ready ones, ones registering again, and ones
/// that crashed less than [`DEPARTURE_GRACE_SECS`] ago (see
/// [`grace_left`]). Also returns when the earliest grace ends, in seconds
/// from `now`.
pub fn holding(nodes: &[NodeRecord], now: i64) -> (BTreeSet<&str>, Option<i64>) {
    let held = nodes.iter().filter(|n| holds_links(n, now));
    let recheck = nodes.iter().filter_map(|n| crash_grace_left(n, now)).min();
    (held.map(|n| n.id.as_str()).collect(), recheck)
}

/// Groups with a node that holds links (see [`holding`]): the groups `*`
/// and `$group` stand for.
pub fn active_groups(nodes: &[NodeRecord], now: i64) -> BTreeSet<String> {
    nodes
        .iter()
        .filter(|n| holds_links(n, now))
        .filter_map(|n| n.group.clone())
        .collect()
}

/// Which group pairs a plan looks at. A pair it does not look at keeps
/// its stored links as they are: the leader asks only for the pairs its
/// facts changed, since a plan of an unchanged pair changes nothing.
#[derive(Debug, Clone, Copy)]
pub enum LinkScope<'a> {
    All,
    /// Every pair with a group of `groups`, and `pairs` (`(a, b)`, `a < b`).
    Some {
        groups: &'a BTreeSet<String>,
        pairs: &'a BTreeSet<(String, String)>,
    },
}

/// What to change. `'s` is the stored links' lifetime: a link the plan
/// keeps as it is stays borrowed.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct LinkPlan<'s> {
    /// Links to write: new, moved, claimed, or newly deleted (tombstones).
    pub upserts: Vec<Link>,
    /// Links (tombstones or live ones) to delete outright because their
    /// source left: guarded, since the source may be registering again.
    pub hard_deletes: Vec<Retire>,
    /// `(node, link_id)` claim facts that are spent: they claimed the link,
    /// or refer to a connection that no longer exists. Either way they
    /// must not claim it for a later session.
    pub consumed_claims: Vec<(String, String)>,
    /// Allowed pairs that cannot link: neither group has an external endpoint.
    pub unlinkable: Vec<(String, String)>,
    /// Every live (not deleted) link after the plan, in no order.
    pub live: Vec<Cow<'s, Link>>,
    /// The pairs planned, `(a, b)` with `a < b`: only their links can
    /// have changed.
    pub planned: BTreeSet<(String, String)>,
    /// Plan again after this many seconds: a departed node's grace ends.
    pub recheck_in: Option<i64>,
}

/// Where a link may point and who may claim it.
struct Group<'c, 'a> {
    name: &'c str,
    ctx: &'c Ctx<'a>,
}

impl<'c, 'a> Group<'c, 'a> {
    /// The group's ready members, by id.
    fn nodes(&self) -> &'c [&'a NodeRecord] {
        self.ctx.ready(self.name)
    }

    /// Whether `id` is a node of this group that still holds its links.
    fn holds(&self, id: &str) -> bool {
        let n = self.ctx.fleet.get(id);
        n.is_some_and(|n| n.group.as_deref() == Some(self.name) && holds_links(n, self.ctx.now))
    }

    /// The external endpoint of the ready member `id`; `None` if `id` is
    /// not a ready member, `Some(None)` if it has no external endpoint.
    fn endpoint_of(&self, id: &str) -> Option<Option<&'a str>> {
        self.ctx.ready_member(self.name, id).map(external)
    }

    fn with_external(&self) -> impl Iterator<Item = (&'a str, &'a str)> + 'c {
        self.nodes()
            .iter()
            .filter_map(|n| external(n).map(|e| (n.id.as_str(), e)))
    }

    fn serves(&self, endpoint: &str) -> bool {
        self.with_external().any(|(_, e)| e == endpoint)
    }

    /// The member holding a connection of `link_id` towards it.
    fn claimant(&self, link_id: &str) -> Option<&'a NodeRecord> {
        self.nodes()
            .iter()
            .copied()
            .find(|n| holds_incoming(n, link_id))
    }
}

fn external(n: &NodeRecord) -> Option<&str> {
    n.connection_details
        .iter()
        .find_map(|d| d.external_endpoint.as_deref().filter(|e| !e.is_empty()))
}

fn holds_incoming(n: &NodeRecord, link_id: &str) -> bool {
    n.claimed_links().any(|l| l == link_id)
}

/// Plans the links of every pair. `new_id` mints link ids; `now` stamps
/// changed links.
pub fn plan<'s>(
    nodes: &[NodeRecord],
    stored: &'s [Link],
    graphs: &[SegmentGraph],
    now: i64,
    new_id: &mut dyn FnMut() -> String,
) -> LinkPlan<'s> {
    let fleet = Fleet::new(nodes.iter().cloned());
    let active = fleet.active_groups(now);
    let mut out = plan_in(&fleet, &active, stored, graphs, now, LinkScope::All, new_id);
    out.recheck_in = holding(nodes, now).1;
    out
}

/// Plans the links of the pairs `scope` names, among the `active` groups
/// (see [`Fleet::active_groups`]); the other pairs' live links are in
/// [`LinkPlan::live`] as stored. Leaves [`LinkPlan::recheck_in`] to the
/// caller, who knows when graces end without walking the fleet.
pub fn plan_in<'s>(
    fleet: &Fleet,
    active: &BTreeSet<String>,
    stored: &'s [Link],
    graphs: &[SegmentGraph],
    now: i64,
    scope: LinkScope<'_>,
    new_id: &mut dyn FnMut() -> String,
) -> LinkPlan<'s> {
    let ctx = Ctx::new(fleet, stored, now);
    let mut out = LinkPlan::default();
    let mut gateways = Gateways::new(stored);
    let mut by_pair: HashMap<(&str, &str), Vec<&Link>> = HashMap::new();
    let covers = covering(scope);
    for l in stored {
        if l.deleted {
            if !fleet.holds_links(&l.source_node, now) {
                out.hard_deletes.push(ctx.retire(l));
            }
            continue;
        }
        let pair = edge_ref(&l.source_group, &l.dest_group);
        match covers(pair) {
            true => by_pair.entry(pair).or_default().push(l),
            // The topology is the last plan's (or everything is planned),
            // which left only allowed pairs linked.
            false => out.live.push(Cow::Borrowed(l)),
        }
    }
    // Groups whose nodes hold links, ready or within their grace: a group
    // whose only node is reconnecting keeps its links.
    let allowed =
        |a: &str, b: &str| active.contains(a) && active.contains(b) && may_link(graphs, a, b);
    for (a, b) in pairs_in(active, scope) {
        if !allowed(a, b) {
            continue;
        }
        out.planned.insert((a.to_string(), b.to_string()));
        let existing = by_pair.remove(&(a, b)).unwrap_or_default();
        plan_pair(&ctx, (a, b), existing, &mut gateways, new_id, &mut out);
    }
    // Whatever is left is a pair no longer allowed, or a group now empty.
    let mut leftovers: Vec<&Link> = Vec::new();
    for ((a, b), links) in by_pair {
        match allowed(a, b) {
            true => out.live.extend(links.into_iter().map(Cow::Borrowed)),
            false => leftovers.extend(links),
        }
    }
    leftovers.sort_by(|x, y| x.link_id.cmp(&y.link_id));
    for l in leftovers {
        tombstone(
            l,
            "the topology no longer links these groups",
            &ctx,
            &mut out,
        );
    }
    out
}

/// Whether `scope` covers a pair `(a, b)` (`a < b`).
fn covering<'a>(scope: LinkScope<'a>) -> impl Fn((&str, &str)) -> bool + 'a {
    let (groups, pairs) = match scope {
        LinkScope::All => (None, HashSet::new()),
        LinkScope::Some { groups, pairs } => {
            let pairs: HashSet<(&str, &str)> = pairs.iter().map(|(a, b)| edge_ref(a, b)).collect();
            (Some(groups), pairs)
        }
    };
    move |(a, b)| groups.is_none_or(|g| g.contains(a) || g.contains(b)) || pairs.contains(&(a, b))
}

/// The pairs `scope` names among the `active` groups, `(a, b)` with
/// `a < b`, in order.
fn pairs_in<'a>(
    active: &'a BTreeSet<String>,
    scope: LinkScope<'a>,
) -> BTreeSet<(&'a str, &'a str)> {
    let mut out = BTreeSet::new();
    let (groups, pairs) = match scope {
        LinkScope::Some { groups, pairs } => (groups, pairs),
        LinkScope::All => {
            let all: Vec<&str> = active.iter().map(String::as_str).collect();
            for (i, a) in all.iter().enumerate() {
                out.extend(all[i + 1..].iter().map(|b| (*a, *b)));
            }
            return out;
        }
    };
    for g in groups.iter().filter(|g| active.contains(*g)) {
        let others = active.iter().filter(|h| *h != g);
        out.extend(others.map(|h| edge_ref(g, h)));
    }
    out.extend(pairs.iter().map(|(a, b)| edge_ref(a, b)));
    out
}

/// What planning one pair needs to know.
struct Ctx<'a> {
    fleet: &'a Fleet,
    /// Each group's ready members, by id, found when first asked for.
    ready: HashMap<&'a str, OnceCell<Vec<&'a NodeRecord>>>,
    /// Groups at either end of a stored live link.
    linked: HashSet<&'a str>,
    now: i64,
}

impl<'a> Ctx<'a> {
    fn new(fleet: &'a Fleet, stored: &'a [Link], now: i64) -> Self {
        let ready = fleet.group_names().map(|g| (g, OnceCell::new())).collect();
        let live = stored.iter().filter(|l| !l.deleted);
        let linked = live
            .flat_map(|l| [l.source_group.as_str(), l.dest_group.as_str()])
            .collect();
        Ctx {
            fleet,
            ready,
            linked,
            now,
        }
    }

    fn group<'c>(&'c self, name: &'c str) -> Group<'c, 'a> {
        Group { name, ctx: self }
    }

    /// The ready members of `group`, by id.
    fn ready(&self, group: &str) -> &[&'a NodeRecord] {
        let Some(cell) = self.ready.get(group) else {
            return &[];
        };
        cell.get_or_init(|| {
            let members = self.fleet.group(group);
            members.filter(|n| n.ready_session().is_some()).collect()
        })
    }

    /// `id`, if it is a ready member of `group`.
    fn ready_member(&self, group: &str, id: &str) -> Option<&'a NodeRecord> {
        let n = self.fleet.get(id)?;
        let member = n.group.as_deref() == Some(group) && n.ready_session().is_some();
        member.then_some(n)
    }

    fn generation(&self, id: &str) -> u64 {
        self.fleet.get(id).map_or(0, |n| n.generation)
    }

    /// A guarded delete of `l`, for a source that left.
    fn retire(&self, l: &Link) -> Retire {
        Retire {
            link_id: l.link_id.clone(),
            source: l.source_node.clone(),
            source_generation: self.generation(&l.source_node),
        }
    }

    /// A claim made now by `dest` for a link from `source`: the latest
    /// session each has started (the ended one, for a node within its
    /// grace, so that its return counts as newer).
    fn claim_now(&self, source: &str, dest: &str) -> Claim {
        Claim {
            source_generation: self.generation(source),
            dest_generation: self.generation(dest),
        }
    }

    /// Whether the link's claim still stands: neither end has a session
    /// newer than the one it was claimed under. A node without a session
    /// (within its grace) has started nothing newer.
    fn claim_current(&self, link: &Link) -> bool {
        let newer = |id: &str, claimed: u64| {
            let session = self.fleet.get(id).and_then(|n| n.session.as_ref());
            session.is_some_and(|s| s.generation > claimed)
        };
        match (link.claim, link.dest_node.as_deref()) {
            (Some(c), Some(d)) => {
                !newer(&link.source_node, c.source_generation) && !newer(d, c.dest_generation)
            }
            _ => false,
        }
    }
}

fn tombstone(l: &Link, why: &str, ctx: &Ctx<'_>, out: &mut LinkPlan<'_>) {
    if ctx.fleet.holds_links(&l.source_node, ctx.now) {
        let mut dead = l.clone();
        dead.deleted = true;
        dead.status_msg = why.to_string();
        dead.updated_at = ctx.now;
        out.upserts.push(dead);
    } else {
        out.hard_deletes.push(ctx.retire(l));
    }
}

fn plan_pair<'a, 's>(
    ctx: &Ctx<'a>,
    (a, b): (&'a str, &'a str),
    mut existing: Vec<&'s Link>,
    gateways: &mut Gateways<'_>,
    new_id: &mut dyn FnMut() -> String,
    out: &mut LinkPlan<'s>,
) {
    existing.sort_by(|x, y| x.link_id.cmp(&y.link_id));
    let mut kept = None;
    for l in existing {
        if kept.is_some() {
            tombstone(l, "duplicate link for this group pair", ctx, out);
            continue;
        }
        match revise(ctx, l, gateways, out) {
            Ok(link) => kept = Some(link),
            Err(why) => tombstone(l, &why, ctx, out),
        }
    }
    let link = kept.or_else(|| create(ctx, (a, b), gateways, new_id, out).map(Cow::Owned));
    if let Some(link) = link {
        out.live.push(link);
    }
}

const DEPARTED: &str = "its destination departed";

/// The link kept up to date (moved, claimed, or awaiting a new claim), or
/// why it must go and be recreated.
fn revise<'s>(
    ctx: &Ctx<'_>,
    l: &'s Link,
    gateways: &mut Gateways<'_>,
    out: &mut LinkPlan<'_>,
) -> Result<Cow<'s, Link>, String> {
    let (src, dst) = (ctx.group(&l.source_group), ctx.group(&l.dest_group));
    if let Some(why) = destination_lost(&dst, l) {
        return Err(why);
    }
    // Borrowed until something changes: most links of a derivation stay
    // as they are, and copying every one cost more than the planning.
    let mut link = Cow::Borrowed(l);
    let changed = if src.holds(&l.source_node) {
        settle_claim(ctx, &dst, &mut link, out)
    } else {
        // Moved, the link is unclaimed and dialled anew: a claimed
        // destination kept through its grace cannot take the new
        // connection unless it is ready at the link's endpoint (left for
        // the next derivation to judge, nothing would make it look).
        if !dst.serves(&l.dest_endpoint) {
            return Err(DEPARTED.to_string());
        }
        move_source(&src, &dst, link.to_mut(), gateways, out)?;
        true
    };
    let refreshed = refresh_config(&mut link);
    if changed || refreshed {
        let owned = link.to_mut();
        owned.updated_at = ctx.now;
        out.upserts.push(owned.clone());
    }
    Ok(link)
}

/// Renders the link's client configuration as this version does; returns
/// whether the stored one differed. A link written by an earlier version
/// (one whose dial retried forever, say) gets today's the next time it
/// is dialled; a held connection is not touched.
fn refresh_config(link: &mut Cow<'_, Link>) -> bool {
    if linkconfig::is_current(&link.config_data, &link.dest_endpoint, &link.link_id) {
        return false;
    }
    let config = linkconfig::config_data(&link.dest_endpoint, &link.link_id);
    link.to_mut().config_data = config;
    true
}

/// Why the link's destination can no longer take it, if it cannot: its
/// claimed node departed or is ready on another endpoint than the one the
/// source dials; or, unclaimed, no ready node serves that endpoint. A node
/// still registering (or within its grace) is left alone until it is
/// ready: only then is it a candidate for the recreated link, so the
/// recreation points at it again rather than at a sibling.
fn destination_lost(dst: &Group<'_, '_>, l: &Link) -> Option<String> {
    let Some(d) = l.dest_node.as_deref() else {
        return (!dst.serves(&l.dest_endpoint)).then(|| DEPARTED.to_string());
    };
    if !dst.holds(d) {
        return Some(DEPARTED.to_string());
    }
    match dst.endpoint_of(d)? {
        Some(e) if e == l.dest_endpoint => None,
        Some(e) => Some(format!("its destination {d} moved to {e}")),
        None => Some(format!("its destination {d} has no external endpoint")),
    }
}

/// Moves the link of a departed source to a sibling in its group.
fn move_source(
    src: &Group<'_, '_>,
    dst: &Group<'_, '_>,
    link: &mut Link,
    gateways: &mut Gateways<'_>,
    out: &mut LinkPlan<'_>,
) -> Result<(), String> {
    let sibling = gateways
        .pick(src.ctx, src.name, src.nodes().iter().map(|n| n.id.as_str()))
        .ok_or("its source departed and no sibling is ready")?;
    // The old connection's claim must not claim the moved link: only the
    // new source's connection may.
    for n in dst
        .nodes()
        .iter()
        .filter(|n| holds_incoming(n, &link.link_id))
    {
        out.consumed_claims
            .push((n.id.clone(), link.link_id.clone()));
    }
    link.status_msg = format!("gateway moved from {} to {sibling}", link.source_node);
    link.source_node = sibling.to_string();
    link.dest_node = None;
    link.claim = None;
    link.status = LinkStatus::Pending;
    Ok(())
}

/// Brings a kept link's claim in line with the facts; returns whether the
/// link changed. A claim fact from the destination claims the link (again)
/// under both ends' current sessions. Without one, a claim that an end's
/// newer session outdated leaves the link Connecting: the destination stays
/// its gateway (routes over it are kept, so a reconnect does not churn
/// them) until it reports the connection again.
fn settle_claim(
    ctx: &Ctx<'_>,
    dst: &Group<'_, '_>,
    link: &mut Cow<'_, Link>,
    out: &mut LinkPlan<'_>,
) -> bool {
    let claimant = match link.dest_node.as_deref() {
        Some(d) => ctx
            .fleet
            .get(d)
            .filter(|n| holds_incoming(n, &link.link_id)),
        None => dst.claimant(&link.link_id),
    };
    if let Some(c) = claimant {
        // Spent even when the claim already stands: left behind, it would
        // claim the link for a later session it says nothing about.
        out.consumed_claims
            .push((c.id.clone(), link.link_id.clone()));
        if link.status == LinkStatus::Applied && ctx.claim_current(link) {
            return false;
        }
        let claim = ctx.claim_now(&link.source_node, &c.id);
        let link = link.to_mut();
        link.claim = Some(claim);
        link.dest_node = Some(c.id.clone());
        link.status = LinkStatus::Applied;
        link.status_msg = String::new();
        return true;
    }
    let Some(d) = link.dest_node.as_deref() else {
        return false;
    };
    let awaiting = link.claim.is_none() && link.status != LinkStatus::Applied;
    if awaiting || ctx.claim_current(link) {
        return false;
    }
    let why = format!("an end registered again: waiting for {d} to claim it again");
    let link = link.to_mut();
    link.status_msg = why;
    link.claim = None;
    link.status = LinkStatus::Connecting;
    true
}

/// A new link for the pair: towards the group with an external endpoint,
/// from a gateway chosen in the other. When both have one, a group that
/// joins linked groups dials them (see [`newcomer_dials`]); otherwise the
/// link goes towards the later-named group.
fn create<'a>(
    ctx: &Ctx<'a>,
    (a, b): (&'a str, &'a str),
    gateways: &mut Gateways<'_>,
    new_id: &mut dyn FnMut() -> String,
    out: &mut LinkPlan<'_>,
) -> Option<Link> {
    let group = |g: &'a str| ctx.group(g);
    // A group whose nodes are all still registering (or within their
    // grace) has nobody to link yet; that is not a missing endpoint.
    if group(a).nodes().is_empty() || group(b).nodes().is_empty() {
        return None;
    }
    let reachable = |g: &'a str| group(g).with_external().next().is_some();
    let (src_group, dst_group) = if reachable(a) && reachable(b) {
        newcomer_dials(ctx, (a, b))
    } else if reachable(b) {
        (a, b)
    } else if reachable(a) {
        (b, a)
    } else {
        out.unlinkable.push((a.to_string(), b.to_string()));
        return None;
    };
    let dst = group(dst_group);
    let targets: BTreeMap<&str, &str> = dst.with_external().collect();
    let target = gateways.pick(ctx, dst_group, targets.keys().copied())?;
    let endpoint = targets.get(target)?.to_string();
    let source = gateways.pick(
        ctx,
        src_group,
        group(src_group).nodes().iter().map(|n| n.id.as_str()),
    )?;
    let link_id = new_id();
    let link = Link {
        config_data: linkconfig::config_data(&endpoint, &link_id),
        link_id,
        source_node: source.to_string(),
        source_group: src_group.to_string(),
        dest_group: dst_group.to_string(),
        dest_node: None,
        dest_endpoint: endpoint,
        status: LinkStatus::Pending,
        status_msg: String::new(),
        deleted: false,
        updated_at: ctx.now,
        claim: None,
    };
    out.upserts.push(link.clone());
    Some(link)
}

/// Source and destination groups of a new link between `a` and `b` (`a <
/// b`), both reachable: from the one with no live link yet to the one
/// with links, else from `a` to `b`. A group that joins a linked fleet
/// then sources all its new links, and the linked gateways only claim
/// them: the routes over them ride the one route command those gateways
/// wait for ([`Pacing`](crate::reconcile::pacing)) rather than a link
/// command of their own each (at 10,000 nodes a group registering after
/// the first link commands cost 99 gateways a second one).
fn newcomer_dials<'a>(ctx: &Ctx<'_>, (a, b): (&'a str, &'a str)) -> (&'a str, &'a str) {
    match (ctx.linked.contains(a), ctx.linked.contains(b)) {
        (true, false) => (b, a),
        _ => (a, b),
    }
}

/// One gateway per group: the node that carries the group's links, as
/// their source and (with an external endpoint) their destination. Every
/// gateway costs the fleet its own commands (the connections it dials, the
/// routes it holds), so a group's links go to the gateway it already has:
/// chosen per pair, the links planned while many nodes were ready spread
/// over many gateways and those planned while few were over few, and the
/// same fleet cost up to seven times the commands depending on how its
/// registrations raced the first derivation (issue 12).
struct Gateways<'s> {
    stored: &'s [Link],
    /// Found when first asked for: most plans create and move nothing.
    chosen: Option<HashMap<String, String>>,
}

impl<'s> Gateways<'s> {
    fn new(stored: &'s [Link]) -> Self {
        Gateways {
            stored,
            chosen: None,
        }
    }

    /// The gateway of `group` among `candidates`: the one it has if that is
    /// a candidate, else the rendezvous choice, which becomes the group's
    /// gateway if it had none.
    fn pick<'n, I>(&mut self, ctx: &Ctx<'_>, group: &str, candidates: I) -> Option<&'n str>
    where
        I: Iterator<Item = &'n str> + Clone,
    {
        let stored = self.stored;
        let chosen = self
            .chosen
            .get_or_insert_with(|| stored_gateways(ctx, stored));
        let current = chosen.get(group);
        if let Some(c) = candidates
            .clone()
            .find(|c| Some(*c) == current.map(String::as_str))
        {
            return Some(c);
        }
        let pick = gateway::choose(group, candidates)?;
        chosen
            .entry(group.to_string())
            .or_insert_with(|| pick.to_string());
        Some(pick)
    }
}

/// The gateways the stored live links use: per group, the ready node at
/// either end of its links (the rendezvous choice among several).
fn stored_gateways(ctx: &Ctx<'_>, stored: &[Link]) -> HashMap<String, String> {
    let mut candidates: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for l in stored.iter().filter(|l| !l.deleted) {
        let source = ctx.ready_member(&l.source_group, &l.source_node);
        let dest = match l.dest_node.as_deref() {
            Some(d) => ctx.ready_member(&l.dest_group, d),
            None => ctx
                .ready(&l.dest_group)
                .iter()
                .copied()
                .find(|n| external(n) == Some(&l.dest_endpoint)),
        };
        for (g, n) in [(&l.source_group, source), (&l.dest_group, dest)] {
            if let Some(n) = n {
                candidates.entry(g).or_default().insert(&n.id);
            }
        }
    }
    let chosen = candidates.into_iter().filter_map(|(g, ids)| {
        let id = gateway::choose(g, ids.iter().copied())?;
        Some((g.to_string(), id.to_string()))
    });
    chosen.collect()
}
