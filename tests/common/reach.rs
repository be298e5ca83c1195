//! Reachability of an announced name over what simulated nodes hold: the
//! proof that links and routes work, independent of what the control plane
//! reports. Within a group nodes reach each other directly (the data
//! plane's own peering); across groups only held routes over held links
//! count.

use std::collections::{BTreeMap, BTreeSet};

use slim_cp::proto::sb::ConnectionDirection;
use slim_cp::sim::SimFleet;

fn group_of(node: &str) -> &str {
    node.split('/').next().unwrap_or(node)
}

/// Groups from which `last` (the third name component) cannot reach a
/// group in `announcer_groups`, among the groups of live fleet nodes.
pub fn unreachable(fleet: &SimFleet, last: &str, announcer_groups: &[&str]) -> Vec<String> {
    let mut ends: BTreeMap<String, (Option<String>, Option<String>)> = BTreeMap::new();
    let mut hops: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut groups = BTreeSet::new();
    for n in fleet
        .nodes()
        .iter()
        .filter(|n| n.state() == slim_cp::sim::NodeState::Registered)
    {
        let id = n.effective_id().to_string();
        groups.insert(group_of(&id).to_string());
        for c in n.connections() {
            let Some(l) = c.link_id.clone() else { continue };
            let e = ends.entry(l).or_default();
            match c.direction {
                ConnectionDirection::Outgoing => e.0 = Some(id.clone()),
                ConnectionDirection::Incoming => e.1 = Some(id.clone()),
            }
        }
        for r in n.routes().into_iter().filter(|r| r.name[2] == last) {
            if let Some(l) = r.link_id {
                hops.entry(id.clone()).or_default().insert(l);
            }
        }
    }
    let next = |node: &str, link: &str| -> Option<String> {
        let (out, inc) = ends.get(link)?;
        let (out, inc) = (out.as_deref()?, inc.as_deref()?);
        Some(if out == node { inc } else { out }.to_string())
    };
    let targets: BTreeSet<&str> = announcer_groups.iter().copied().collect();
    let mut missing = Vec::new();
    for g in &groups {
        let mut seen = BTreeSet::from([g.clone()]);
        let mut frontier = vec![g.clone()];
        let mut found = targets.contains(g.as_str());
        while let Some(cur) = frontier.pop().filter(|_| !found) {
            for (node, links) in hops.iter().filter(|(n, _)| group_of(n) == cur) {
                for l in links {
                    let Some(peer) = next(node, l) else { continue };
                    let pg = group_of(&peer).to_string();
                    found |= targets.contains(pg.as_str());
                    if seen.insert(pg.clone()) {
                        frontier.push(pg);
                    }
                }
            }
        }
        if !found {
            missing.push(g.clone());
        }
    }
    missing
}
