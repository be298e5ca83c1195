//! Conformance for retired links: the leader deletes a departed source's
//! link only while that source is still away, so a registration racing the
//! derivation never hands a node a link that is then deleted under it.

use super::{mk_link, start};
use crate::store::model::DepartureKind;
use crate::store::{ChangeSet, Retire, Store};

fn retire(link: &str, source: &str, source_generation: u64) -> ChangeSet {
    ChangeSet {
        retire_links: vec![Retire {
            link_id: link.into(),
            source: source.into(),
            source_generation,
        }],
        ..ChangeSet::default()
    }
}

async fn ids(store: &dyn Store) -> Vec<String> {
    let links = store.list_links().await.unwrap();
    links.into_iter().map(|l| l.link_id).collect()
}

pub async fn retired_links_go_only_while_their_source_is_away(store: &dyn Store) {
    for id in ["l-away", "l-back", "l-orphan"] {
        let mut link = mk_link(id, "a/n1", false);
        link.source_node = match id {
            "l-orphan" => "z/gone".into(),
            _ => "a/n1".into(),
        };
        link.dest_group = format!("b-{id}");
        store.put_link(link).await.unwrap();
    }
    let first = start(store, "a/n1").await.session;
    store
        .end_session("a/n1", first.id, DepartureKind::Crash)
        .await
        .unwrap();
    store
        .apply(retire("l-away", "a/n1", first.generation))
        .await
        .unwrap();
    assert_eq!(ids(store).await, ["l-back", "l-orphan"], "away: retired");
    // The source registers again before the leader's retirement lands.
    start(store, "a/n1").await;
    store
        .apply(retire("l-back", "a/n1", first.generation))
        .await
        .unwrap();
    assert_eq!(ids(store).await, ["l-back", "l-orphan"], "back: kept");
    store.apply(retire("l-orphan", "z/gone", 0)).await.unwrap();
    assert_eq!(ids(store).await, ["l-back"], "no record: retired");
}
