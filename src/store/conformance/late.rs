//! Conformance for registrations recorded late (answered while the store
//! was away): a compare-and-set that never replaces a newer registration.

use super::{mk_registration, owner, start};
use crate::store::{Store, StoreError};

pub async fn a_late_registration_never_replaces_a_newer_one(store: &dyn Store) {
    let first = start(store, "a/n1").await.session;
    let mut late = mk_registration("a/n1");
    late.stale_after = Some(first.generation);
    let recorded = store.begin_session(late, owner()).await.unwrap();
    assert_eq!(
        recorded.replaced.map(|s| s.id),
        Some(first.id),
        "nothing newer: it starts"
    );
    let newest = start(store, "a/n1").await.session;
    let mut stale = mk_registration("a/n1");
    stale.stale_after = Some(recorded.session.generation);
    let refused = store.begin_session(stale.clone(), owner()).await;
    assert!(
        matches!(refused, Err(StoreError::StaleSession { .. })),
        "{refused:?}"
    );
    let rec = store.get_node("a/n1").await.unwrap().expect("record");
    assert_eq!(
        rec.session.map(|s| s.id),
        Some(newest.id),
        "the newer one stands"
    );
    assert_eq!(rec.generation, newest.generation);
    let mut unknown = mk_registration("b/new");
    unknown.stale_after = Some(0);
    assert!(
        store.begin_session(unknown, owner()).await.is_ok(),
        "no record, nothing newer"
    );
}
