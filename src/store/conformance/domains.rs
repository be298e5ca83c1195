//! Conformance for registration-auth domains: an upsert keyed by name,
//! listed in byte order, the sealed bytes kept exactly.

use crate::store::Store;
use crate::store::model::Domain;

fn mk_domain(name: &str, sealed: &[u8]) -> Domain {
    Domain {
        name: name.into(),
        sealed: sealed.to_vec(),
    }
}

pub async fn domains_round_trip_in_name_order(store: &dyn Store) {
    assert!(store.list_domains().await.unwrap().is_empty());
    assert!(
        store
            .put_domain(mk_domain("b", &[1, 0, 255]))
            .await
            .unwrap()
    );
    assert!(store.put_domain(mk_domain("B", &[2])).await.unwrap());
    assert!(store.put_domain(mk_domain("a", &[3])).await.unwrap());
    let listed = store.list_domains().await.unwrap();
    let names: Vec<_> = listed.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["B", "a", "b"], "byte order, like Rust");
    assert_eq!(
        listed[2],
        mk_domain("b", &[1, 0, 255]),
        "bytes kept exactly"
    );
}

pub async fn adding_a_domain_again_replaces_its_secret(store: &dyn Store) {
    assert!(store.put_domain(mk_domain("blue", &[1])).await.unwrap());
    assert!(
        !store.put_domain(mk_domain("blue", &[2, 2])).await.unwrap(),
        "not new: replaced"
    );
    assert_eq!(
        store.list_domains().await.unwrap(),
        vec![mk_domain("blue", &[2, 2])]
    );
}

pub async fn removing_a_domain_says_whether_it_existed(store: &dyn Store) {
    store.put_domain(mk_domain("blue", &[1])).await.unwrap();
    store.put_domain(mk_domain("red", &[1])).await.unwrap();
    assert!(store.remove_domain("blue").await.unwrap());
    assert!(!store.remove_domain("blue").await.unwrap());
    assert!(!store.remove_domain("green").await.unwrap());
    assert_eq!(
        store.list_domains().await.unwrap(),
        vec![mk_domain("red", &[1])]
    );
}
