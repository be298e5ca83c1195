//! Conformance for the fresh-row hint of a change set: a store may insert
//! the puts it names without looking for a row to replace, but a wrong
//! hint must end as the upsert would have, and a right one must not let
//! a batch past the one-live-link-per-pair rule.

use super::{mk_link, mk_route};
use crate::store::model::{Link, LinkStatus, Route, RouteStatus};
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

/// Applies the puts, every one of them hinted as new.
async fn apply_all_fresh(
    store: &dyn Store,
    put_links: Vec<Link>,
    put_routes: Vec<Route>,
) -> Result<(), StoreError> {
    let mut changes = ChangeSet {
        put_links,
        put_routes,
        ..ChangeSet::default()
    };
    changes.fresh = all_fresh(&changes);
    store.apply(changes).await
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
    apply_all_fresh(store, vec![link.clone(), other.clone()], routes.clone())
        .await
        .expect("a wrong hint is no error");
    assert_eq!(store.list_links().await.unwrap(), [link, other]);
    assert_eq!(store.list_routes().await.unwrap(), routes);
}

pub async fn a_fresh_live_link_still_keeps_its_pair_unique(store: &dyn Store) {
    store.put_link(mk_link("l-1", "a/n1", false)).await.unwrap();
    let route = mk_route("r-1", "a/n2", "l-2", RouteStatus::Pending);
    let link = mk_link("l-2", "a/n2", false);
    let err = apply_all_fresh(store, vec![link], vec![route])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
    let links = store.list_links().await.unwrap();
    assert_eq!(links, [mk_link("l-1", "a/n1", false)], "nothing written");
    assert!(store.list_routes().await.unwrap().is_empty());
}

/// More rows than a Postgres statement carries (it splits them): every
/// row lands, and a wrong hint whose conflict is met in a later part
/// still ends as the upsert would have, the parts written before it too.
pub async fn a_change_set_larger_than_a_statement_is_written_whole(store: &dyn Store) {
    const ROUTES: usize = 12_001;
    let link = mk_link("l-1", "a/n1", false);
    let route = |i: usize, status| mk_route(&format!("r-{i:05}"), "a/n1", "l-1", status);
    let first = (0..ROUTES)
        .map(|i| route(i, RouteStatus::Pending))
        .collect();
    apply_all_fresh(store, vec![link.clone()], first)
        .await
        .expect("a large batch applies");
    let stored = store.list_routes().await.unwrap();
    assert_eq!(stored.len(), ROUTES);
    assert!(stored.iter().all(|r| r.status == RouteStatus::Pending));

    // New routes first, then the stored ones again: the hint calls them
    // all new, and the first conflict comes after thousands of new rows.
    let new = |i: usize| mk_route(&format!("n-{i:05}"), "a/n1", "l-1", RouteStatus::Applied);
    let mut again: Vec<_> = (0..6_000).map(new).collect();
    again.extend((0..ROUTES).map(|i| route(i, RouteStatus::Applied)));
    apply_all_fresh(store, vec![], again.clone())
        .await
        .expect("a wrong hint is no error");
    // Listed by id: the `n-` routes before the `r-` ones, as put.
    assert_eq!(store.list_routes().await.unwrap(), again);
    assert_eq!(store.list_links().await.unwrap(), [link]);
}
