use super::*;
use crate::reconcile::diff::tests::mk_link;
use crate::routing::fleet::Fleet;
use crate::routing::plan_tests::mk_node;
use crate::store::model::NodeRecord;

fn ids(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// The nodes `p` lets go now of those `affected`, the links as in `rows`.
fn release(p: &mut Pacing, rows: &Rows, affected: &[&str]) -> Vec<String> {
    p.release(Some(rows), set(affected), Instant::now(), false)
}

/// As [`release`], while facts wait in the inbox.
fn release_facts_waiting(p: &mut Pacing, rows: &Rows, affected: &[&str]) -> Vec<String> {
    p.release(Some(rows), set(affected), Instant::now(), true)
}

#[tokio::test(start_paused = true)]
async fn affected_nodes_wait_for_a_quiet_spell() {
    let mut a = Affected::default();
    assert_eq!(a.due(), None);
    a.add(&ids(&[]), &ids(&[]));
    assert_eq!(a.due(), None, "a derivation that affected nothing");
    let t0 = Instant::now();
    a.add(&ids(&["g/n1"]), &ids(&[]));
    assert_eq!(a.due(), Some(t0 + COALESCE_QUIET));
    tokio::time::advance(COALESCE_QUIET / 2).await;
    a.add(&ids(&["g/n1", "g/n2"]), &ids(&["g/n2", "g/n3"]));
    assert_eq!(a.due(), Some(Instant::now() + COALESCE_QUIET));
    assert_eq!(a.take(Instant::now()), (set(&[]), set(&[])), "not due yet");
    tokio::time::advance(COALESCE_QUIET).await;
    let (changed, arrived) = a.take(Instant::now());
    assert_eq!(changed, set(&["g/n1", "g/n2"]));
    assert_eq!(
        arrived,
        set(&["g/n3"]),
        "a changed node is not also routine"
    );
    assert_eq!(a.due(), None);
}

#[tokio::test(start_paused = true)]
async fn affected_nodes_never_wait_past_the_cap() {
    let mut a = Affected::default();
    let t0 = Instant::now();
    while Instant::now() < t0 + COALESCE_MAX * 2 {
        a.add(&ids(&[]), &ids(&["g/n1"]));
        assert!(a.due().unwrap() <= t0 + COALESCE_MAX);
        tokio::time::advance(COALESCE_QUIET / 2).await;
    }
}

/// Gateway `a/n1` sources links to `b` and `c`; `b/n1` is `b`'s node.
fn rows(statuses: [LinkStatus; 2]) -> Rows {
    let mut links = Vec::new();
    for (i, (group, status)) in ["b", "c"].into_iter().zip(statuses).enumerate() {
        let mut l = mk_link(&format!("l{i}"), "a/n1", false);
        l.dest_group = group.into();
        l.dest_node = None;
        l.status = status;
        links.push(l);
    }
    Rows {
        nodes: Fleet::new(vec![
            mk_node("a", "n1"),
            mk_node("b", "n1"),
            mk_node("c", "n1"),
        ]),
        links,
        ..Rows::default()
    }
}

#[tokio::test(start_paused = true)]
async fn a_gateway_goes_at_once_for_its_dials_then_waits_for_their_claims() {
    use LinkStatus::*;
    let mut p = Pacing::default();
    let now = Instant::now();
    let pending = rows([Pending, Pending]);
    let go = release(&mut p, &pending, &["a/n1"]);
    assert_eq!(go, ids(&["a/n1"]), "its dials go at once");
    assert_eq!(p.due(), None, "nobody held");
    // Still Pending in the rows (the answers not read yet): commanded.
    let go = release(&mut p, &pending, &["a/n1", "b/n1"]);
    assert!(
        go.is_empty(),
        "the source and the dialed group wait: {go:?}"
    );
    assert_eq!(p.due(), Some(now + HOLD_MAX));
    tokio::time::advance(HOLD_MAX / 2).await;
    let half = rows([Applied, Connecting]);
    let go = release(&mut p, &half, &["a/n1", "b/n1"]);
    assert_eq!(go, ids(&["b/n1"]), "b's link is claimed");
    assert_eq!(p.due(), Some(now + HOLD_MAX), "held since the first hold");
    let claimed = rows([Applied, Applied]);
    let go = release(&mut p, &claimed, &["a/n1"]);
    assert_eq!(go, ids(&["a/n1"]), "every link claimed");
    assert_eq!(p.due(), None);
}

#[tokio::test(start_paused = true)]
async fn a_new_link_or_the_cap_releases_a_held_gateway() {
    use LinkStatus::*;
    let mut p = Pacing::default();
    let mut one = rows([Pending, Applied]);
    one.links.truncate(1);
    assert_eq!(release(&mut p, &one, &["a/n1"]), ids(&["a/n1"]));
    assert!(release(&mut p, &one, &["a/n1"]).is_empty());
    let two = rows([Connecting, Pending]);
    let go = release(&mut p, &two, &["a/n1"]);
    assert_eq!(go, ids(&["a/n1"]), "a link it was not commanded to create");
    assert!(release(&mut p, &two, &["a/n1"]).is_empty());
    tokio::time::advance(HOLD_MAX).await;
    let go = release(&mut p, &two, &["a/n1"]);
    assert_eq!(go, ids(&["a/n1"]), "never past the cap");
    assert_eq!(p.due(), None);
}

#[test]
fn claims_are_awaited_for_commanded_links_only() {
    use LinkStatus::*;
    let mut p = Pacing::default();
    let planned = rows([Pending, Pending]);
    assert!(!p.awaiting_claims(Some(&planned)), "nothing commanded yet");
    assert_eq!(release(&mut p, &planned, &["a/n1"]), ids(&["a/n1"]));
    assert!(
        p.awaiting_claims(Some(&planned)),
        "its dials are on their way"
    );
    assert!(p.awaiting_claims(Some(&rows([Applied, Connecting]))));
    assert!(!p.awaiting_claims(Some(&rows([Applied, Applied]))));
    assert!(!p.awaiting_claims(Some(&rows([Applied, Failed]))));
    let mut gone = rows([Applied, Connecting]);
    gone.links[1].deleted = true;
    assert!(
        !p.awaiting_claims(Some(&gone)),
        "a deleted link is not claimed"
    );
    assert!(!p.awaiting_claims(None));
}

/// `b/n1` waits for the link into `b` from `a/n1`, whose command has not
/// gone yet, while `a/n1` is connected; not once `a/n1` is away.
#[tokio::test(start_paused = true)]
async fn a_destination_waits_for_a_connected_source_not_yet_commanded() {
    use LinkStatus::*;
    let mut p = Pacing::default();
    let mut planned = rows([Pending, Applied]);
    assert!(
        release(&mut p, &planned, &["b/n1"]).is_empty(),
        "held for the link a/n1 is about to dial"
    );
    assert_eq!(p.due(), Some(Instant::now() + HOLD_MAX));
    assert_eq!(
        release(&mut p, &rows([Applied, Applied]), &["b/n1"]),
        ids(&["b/n1"]),
        "claimed"
    );
    if let Some(source) = planned.nodes.get("a/n1").cloned() {
        planned.nodes.upsert(NodeRecord {
            session: None,
            ..source
        });
    }
    assert_eq!(
        release(&mut p, &planned, &["b/n1"]),
        ids(&["b/n1"]),
        "a source away dials nothing"
    );
}

/// A held node nobody affects again is due at its cap, and goes then.
#[tokio::test(start_paused = true)]
async fn a_held_node_goes_at_its_cap_unasked() {
    use LinkStatus::*;
    let mut p = Pacing::default();
    let now = Instant::now();
    let planned = rows([Pending, Pending]);
    assert_eq!(release(&mut p, &planned, &["a/n1"]), ids(&["a/n1"]));
    let sent = rows([Connecting, Connecting]);
    assert!(release(&mut p, &sent, &["a/n1"]).is_empty());
    assert_eq!(p.due(), Some(now + HOLD_MAX));
    tokio::time::advance(HOLD_MAX / 2).await;
    assert!(release(&mut p, &sent, &[]).is_empty(), "not yet");
    tokio::time::advance(HOLD_MAX / 2).await;
    let go = release(&mut p, &sent, &[]);
    assert_eq!(go, ids(&["a/n1"]));
    assert_eq!(p.due(), None);
}

#[test]
fn without_rows_nothing_is_held() {
    let mut p = Pacing::default();
    let go = p.release(None, set(&["a/n1"]), Instant::now(), true);
    assert_eq!(go, ids(&["a/n1"]));
}

/// `a/n1`, its links claimed, waits while facts wait in the inbox: it is
/// looked at again every [`RECHECK`] and goes once the inbox is empty,
/// asked or not; never past the cap.
#[tokio::test(start_paused = true)]
async fn a_node_waits_while_facts_wait_in_the_inbox() {
    use LinkStatus::*;
    let mut p = Pacing::default();
    let now = Instant::now();
    let planned = rows([Pending, Pending]);
    let go = release_facts_waiting(&mut p, &planned, &["a/n1"]);
    assert_eq!(go, ids(&["a/n1"]), "its dials go whatever waits");
    let claimed = rows([Applied, Applied]);
    assert!(release_facts_waiting(&mut p, &claimed, &["a/n1"]).is_empty());
    assert!(p.holding());
    assert_eq!(p.due(), Some(now + RECHECK), "looked at again soon");
    tokio::time::advance(RECHECK).await;
    assert!(
        release_facts_waiting(&mut p, &claimed, &[]).is_empty(),
        "facts still wait"
    );
    assert_eq!(p.due(), Some(Instant::now() + RECHECK));
    tokio::time::advance(RECHECK).await;
    assert_eq!(
        release(&mut p, &claimed, &[]),
        ids(&["a/n1"]),
        "inbox empty"
    );
    assert_eq!(p.due(), None);
    assert!(!p.holding());

    assert!(release_facts_waiting(&mut p, &claimed, &["a/n1"]).is_empty());
    tokio::time::advance(HOLD_MAX).await;
    assert!(
        release_facts_waiting(&mut p, &claimed, &[]).is_empty(),
        "past the cap of a hold for claims"
    );
    assert_eq!(p.due(), Some(Instant::now() + RECHECK), "still rechecked");
    tokio::time::advance(FACTS_HOLD_MAX - HOLD_MAX).await;
    let go = release_facts_waiting(&mut p, &claimed, &[]);
    assert_eq!(go, ids(&["a/n1"]), "never past its own cap");
    assert_eq!(p.due(), None);
}

/// Held for a claim past its cap while facts wait, `a/n1` is due at the
/// rechecks, not at the cap it passed (the leader would spin).
#[tokio::test(start_paused = true)]
async fn a_hold_for_claims_that_turns_into_one_for_facts_is_not_due_at_once() {
    use LinkStatus::*;
    let mut p = Pacing::default();
    let planned = rows([Pending, Pending]);
    assert_eq!(release(&mut p, &planned, &["a/n1"]), ids(&["a/n1"]));
    let sent = rows([Connecting, Connecting]);
    assert!(release_facts_waiting(&mut p, &sent, &["a/n1"]).is_empty());
    tokio::time::advance(HOLD_MAX).await;
    assert!(release_facts_waiting(&mut p, &sent, &[]).is_empty());
    let now = Instant::now();
    assert!(p.due().is_some_and(|d| d > now), "due later: {:?}", p.due());
    assert_eq!(release(&mut p, &sent, &[]), ids(&["a/n1"]), "inbox empty");
}
