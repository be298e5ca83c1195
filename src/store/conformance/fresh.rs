//! Conformance for the fresh-row hint of a change set: a store may insert
//! the puts it names without looking for a row to replace, but a wrong
//! hint must end as the upsert would have, and a right one must not let
//! a batch past the one-live-link-per-pair rule.

use super::{mk_link, mk_route};
use crate::store::model::{LinkStatus, RouteStatus};
use crate::store::{ChangeSet, Fresh, Store, StoreError};

fn all_fresh(changes: &ChangeSet) -> Fresh {
    Fresh {
        links: changes
            .put_links
            .iter()
            .map(|l| l.link_id.clone())
            .collect(),
        routes: changes.put_routes.iter().map(|r| r.id.clone()).collect(),
    }
}

pub async fn a_wrong_fresh_hint_still_replaces(store: &dyn Store) {
    store.put_link(mk_link("l-1", "a/n1", false)).await.unwrap();
    let route = mk_route("r-1", "a/n1", "l-1", RouteStatus::Pending);
    store.put_route(route).await.unwrap();
    let mut link = mk_link("l-1", "a/n1", false);
    (link.status, link.dest_node) = (LinkStatus::Applied, Some("b/n1".into()));
    let mut other = mk_link("l-2", "c/n1", false);
    (other.source_group, other.dest_group) = ("c".into(), "d".into());
    let mut routes = vec![
        mk_route("r-1", "a/n1", "l-1", RouteStatus::Failed),
        mk_route("r-2", "a/n1", "l-1", RouteStatus::Pending),
    ];
    routes[0].status_msg = "no conn".into();
    let mut changes = ChangeSet {
        put_links: vec![link.clone(), other.clone()],
        put_routes: routes.clone(),
        ..ChangeSet::default()
    };
    changes.fresh = all_fresh(&changes);
    store
        .apply(changes)
        .await
        .expect("a wrong hint is no error");
    assert_eq!(store.list_links().await.unwrap(), [link, other]);
    assert_eq!(store.list_routes().await.unwrap(), routes);
}

pub async fn a_fresh_live_link_still_keeps_its_pair_unique(store: &dyn Store) {
    store.put_link(mk_link("l-1", "a/n1", false)).await.unwrap();
    let mut changes = ChangeSet {
        put_links: vec![mk_link("l-2", "a/n2", false)],
        put_routes: vec![mk_route("r-1", "a/n2", "l-2", RouteStatus::Pending)],
        ..ChangeSet::default()
    };
    changes.fresh = all_fresh(&changes);
    let err = store.apply(changes).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
    let links = store.list_links().await.unwrap();
    assert_eq!(links, [mk_link("l-1", "a/n1", false)], "nothing written");
    assert!(store.list_routes().await.unwrap().is_empty());
}
