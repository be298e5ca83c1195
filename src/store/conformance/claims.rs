//! Conformance cases for what derivation leans on beyond the basic
//! records: a link's claim survives every way links are written and read,
//! and the store's clock is the one its stamps are taken with.

use super::{mk_link, start};
use crate::store::model::{Claim, Link, LinkStatus};
use crate::store::{ChangeSet, Store};

fn claimed(id: &str, source_generation: u64, dest_generation: u64) -> Link {
    let mut link = mk_link(id, "a/n1", false);
    link.dest_node = Some("b/n1".into());
    link.status = LinkStatus::Applied;
    link.claim = Some(Claim {
        source_generation,
        dest_generation,
    });
    link
}

/// The link as every read returns it.
async fn reads(store: &dyn Store, id: &str) -> [Option<Link>; 4] {
    let find = |links: Vec<Link>| links.into_iter().find(|l| l.link_id == id);
    [
        find(store.list_links().await.unwrap()),
        find(store.links_touching("a/n1").await.unwrap()),
        find(store.links_touching("b/n1").await.unwrap()),
        find(store.desired_for_node("a/n1").await.unwrap().links),
    ]
}

/// Asserts that every read returns `link` as written.
async fn reads_back(store: &dyn Store, link: &Link, what: &str) {
    let want = [0, 1, 2, 3].map(|_| Some(link.clone()));
    assert_eq!(reads(store, &link.link_id).await, want, "{what}");
}

async fn apply_link(store: &dyn Store, link: &Link) {
    let batch = ChangeSet {
        put_links: vec![link.clone()],
        ..ChangeSet::default()
    };
    store.apply(batch).await.unwrap();
}

pub async fn link_claims_round_trip(store: &dyn Store) {
    let link = claimed("l-1", 3, u64::from(u32::MAX) + 7);
    store.put_link(link.clone()).await.unwrap();
    reads_back(store, &link, "a put keeps the claim").await;
    let reclaimed = claimed("l-1", 9, 11);
    apply_link(store, &reclaimed).await;
    reads_back(store, &reclaimed, "a change set replaces the claim").await;
    let mut waiting = reclaimed;
    waiting.claim = None;
    waiting.status = LinkStatus::Connecting;
    apply_link(store, &waiting).await;
    reads_back(store, &waiting, "and clears it, keeping the destination").await;
    super::mark_link(store, "l-1", "a/n1", true, "").await;
    let after = store.list_links().await.unwrap();
    assert_eq!(
        (after[0].claim, after[0].status),
        (None, LinkStatus::Connecting),
        "an answer from the source is no claim"
    );
}

pub async fn now_is_the_clock_of_the_stamps(store: &dyn Store) {
    start(store, "a/n1").await;
    let stamped = store.get_node("a/n1").await.unwrap().unwrap().updated_at;
    let now = store.now().await.unwrap();
    assert!(
        now >= stamped,
        "now {now} is before a stamp {stamped} written earlier"
    );
    assert!(now > 1_600_000_000, "Unix seconds: {now}");
}
