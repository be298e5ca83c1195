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

pub async fn a_late_registration_already_recorded_stands(store: &dyn Store) {
    let mut reg = mk_registration("a/n1");
    reg.session_id = uuid::Uuid::new_v4();
    // The first attempt was recorded, but its caller never heard.
    let first = store.begin_session(reg.clone(), owner()).await.unwrap();
    let mut late = reg;
    late.stale_after = Some(first.session.generation.saturating_sub(1));
    let again = store.begin_session(late.clone(), owner()).await.unwrap();
    assert_eq!(again.session, first.session, "the recorded session stands");
    assert_eq!(again.replaced, None);
    let rec = store.get_node("a/n1").await.unwrap().expect("record");
    assert_eq!(
        rec.generation, first.session.generation,
        "nothing new began"
    );
    // Once another session replaced it, the same late registration is stale.
    start(store, "a/n1").await;
    let refused = store.begin_session(late, owner()).await;
    assert!(
        matches!(refused, Err(StoreError::StaleSession { .. })),
        "{refused:?}"
    );
}
