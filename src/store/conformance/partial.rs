//! Partial reads: what the leader refreshes between batches instead of
//! reading every table again. Each must agree with the full listing.

use super::{mk_link, mk_name, start};
use crate::store::Store;
use crate::store::model::{DepartureKind, LinkAnswer, LinkState, LinkStatus, NodeRecord};

/// The id of `node`'s session among `records`.
fn ended_session(records: &[NodeRecord], node: &str) -> uuid::Uuid {
    let record = records.iter().find(|n| n.id == node);
    record.and_then(|n| n.session.as_ref()).unwrap().id
}

fn ids(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

pub async fn partial_reads_agree_with_the_full_listings(store: &dyn Store) {
    for id in ["b/n2", "a/n1", "b/n1"] {
        let s = start(store, id).await.session;
        store
            .record_announcements(id, s.id, &[mk_name(id), mk_name("shared")], &[])
            .await
            .unwrap();
    }
    let all = store.list_nodes().await.unwrap();
    let some = store
        .get_nodes(&ids(&["b/n2", "z/none", "a/n1", "b/n2"]))
        .await
        .unwrap();
    let want: Vec<_> = all.iter().filter(|n| n.id != "b/n1").cloned().collect();
    assert_eq!(some, want, "by id, each once, missing ones absent");
    assert!(store.get_nodes(&[]).await.unwrap().is_empty());

    let every = store.list_templates().await.unwrap();
    let of = store.templates_of(&ids(&["b/n1", "b/n2"])).await.unwrap();
    let want: Vec<_> = every.iter().filter(|t| t.node != "a/n1").cloned().collect();
    assert_eq!(of, want, "in seq order, only the nodes asked for");
    assert_eq!(of.len(), 4);

    store.put_link(mk_link("l-2", "a/n1", true)).await.unwrap();
    store.put_link(mk_link("l-1", "a/n1", false)).await.unwrap();
    let links = store
        .get_links(&ids(&["l-2", "l-9", "l-1", "l-2"]))
        .await
        .unwrap();
    assert_eq!(links, store.list_links().await.unwrap(), "tombstones too");
    assert!(store.get_links(&ids(&["l-9"])).await.unwrap().is_empty());
    let refused = LinkAnswer {
        link_id: "l-1".into(),
        ok: false,
        message: "refused".into(),
    };
    store.mark_links_sent("a/n1", &[refused]).await.unwrap();
    let states = store
        .link_states(&ids(&["l-2", "l-9", "l-1", "l-2"]))
        .await
        .unwrap();
    let listed = store.list_links().await.unwrap();
    let want: Vec<LinkState> = listed.iter().map(LinkState::from).collect();
    assert_eq!(states, want, "the status part, by id, each once");
    assert_eq!(
        (states[0].status, states[0].status_msg.as_str()),
        (LinkStatus::Failed, "refused"),
        "as the answer left it"
    );

    store
        .end_session("b/n1", ended_session(&all, "b/n1"), DepartureKind::Crash)
        .await
        .unwrap();
    let sessions = store
        .sessions_of(&ids(&["b/n2", "b/n1", "z/none", "a/n1", "b/n2"]))
        .await
        .unwrap();
    let want: Vec<_> = (all.iter().filter(|n| n.id != "b/n1"))
        .map(|n| (n.id.clone(), n.session.clone().unwrap()))
        .collect();
    assert_eq!(sessions, want, "connected ones by id, each once");
}
