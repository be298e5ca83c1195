use super::*;
use crate::reconcile::diff::tests::{mk_link, mk_route};
use crate::store::Retire;

fn link_to(id: &str, source: &str, dest: Option<&str>) -> Link {
    Link {
        dest_node: dest.map(str::to_string),
        ..mk_link(id, source, false)
    }
}

fn ids<T>(items: &[T], id: impl Fn(&T) -> &str) -> Vec<String> {
    items.iter().map(|x| id(x).to_string()).collect()
}

fn loaded() -> DesiredView {
    let view = DesiredView::default();
    view.rebuild(
        &[
            link_to("l-1", "a/n1", Some("b/n1")),
            link_to("l-2", "a/n1", None),
        ],
        &[
            mk_route("r-2", "a/n1", "l-1", "y"),
            mk_route("r-1", "a/n1", "l-1", "x"),
            mk_route("r-3", "b/n1", "l-9", "z"),
        ],
    );
    view
}

#[test]
fn silent_until_rebuilt_and_after_forget() {
    let view = DesiredView::default();
    assert!(view.of("a/n1").is_none());
    view.rebuild(&[], &[]);
    let rows = view.of("a/n1").expect("known once rebuilt");
    assert!(rows.links.is_empty() && rows.routes.is_empty());
    view.forget();
    assert!(view.of("a/n1").is_none());
}

#[test]
fn a_node_reads_the_links_it_is_an_end_of_and_the_routes_it_sources_by_id() {
    let view = loaded();
    let source = view.of("a/n1").expect("rows");
    assert_eq!(ids(&source.links, |l| &l.link_id), ["l-1", "l-2"]);
    assert_eq!(ids(&source.routes, |r| &r.id), ["r-1", "r-2"]);
    assert_eq!(source.routes[0].link_id, "l-1");
    assert_eq!(source.entries.len(), 2);
    let dest = view.of("b/n1").expect("rows");
    assert_eq!(ids(&dest.links, |l| &l.link_id), ["l-1"]);
    assert_eq!(ids(&dest.routes, |r| &r.id), ["r-3"]);
    let bare = view.of("c/n1").expect("rows");
    assert!(bare.links.is_empty() && bare.routes.is_empty());
}

#[test]
fn the_nodes_a_write_touches_are_unsure_until_it_commits() {
    let view = loaded();
    let moved = link_to("l-1", "a/n1", Some("b/n2"));
    let changes = ChangeSet {
        put_links: vec![moved],
        put_routes: vec![mk_route("r-4", "c/n1", "l-2", "w")],
        delete_routes: vec!["r-3".into()],
        ..ChangeSet::default()
    };
    view.write_begins(&changes);
    for node in ["a/n1", "b/n1", "b/n2", "c/n1"] {
        assert!(view.of(node).is_none(), "{node} is touched by the write");
    }
    assert!(view.of("d/n1").is_some(), "an untouched node reads on");
    view.write_ended();
    let old_dest = view.of("b/n1").expect("rows");
    assert!(
        old_dest.links.is_empty(),
        "the re-pointed link left its old end"
    );
    assert!(old_dest.routes.is_empty(), "its deleted route is gone");
    let new_dest = view.of("b/n2").expect("rows");
    assert_eq!(ids(&new_dest.links, |l| &l.link_id), ["l-1"]);
    let c = view.of("c/n1").expect("rows");
    assert_eq!(ids(&c.routes, |r| &r.id), ["r-4"]);
}

#[test]
fn a_retired_link_leaves_its_ends_unsure_until_read_back() {
    let view = loaded();
    let changes = ChangeSet {
        retire_links: vec![Retire {
            link_id: "l-1".into(),
            source: "a/n1".into(),
            source_generation: 1,
        }],
        ..ChangeSet::default()
    };
    view.write_begins(&changes);
    view.write_ended();
    assert!(
        view.of("a/n1").is_none(),
        "the store decides the retirement"
    );
    assert!(view.of("b/n1").is_none());
    view.restated(&["l-1".into()], &["l-1".into()]);
    let source = view.of("a/n1").expect("settled");
    assert_eq!(ids(&source.links, |l| &l.link_id), ["l-2"]);
    assert!(view.of("b/n1").expect("settled").links.is_empty());
}

#[test]
fn a_retired_link_the_store_kept_is_read_back_whole() {
    let view = loaded();
    view.write_begins(&ChangeSet {
        retire_links: vec![Retire {
            link_id: "l-2".into(),
            source: "a/n1".into(),
            source_generation: 1,
        }],
        ..ChangeSet::default()
    });
    view.write_ended();
    assert!(view.of("a/n1").is_none());
    view.reread(&["l-2".into()], &[link_to("l-2", "a/n1", Some("b/n3"))]);
    let source = view.of("a/n1").expect("settled");
    assert_eq!(ids(&source.links, |l| &l.link_id), ["l-1", "l-2"]);
    assert_eq!(
        ids(&view.of("b/n3").expect("rows").links, |l| &l.link_id),
        ["l-2"]
    );
}

#[test]
fn a_mark_lands_on_the_route_as_read_never_on_a_newer_version() {
    let view = loaded();
    let read = view.of("a/n1").expect("rows");
    let applied = |id: &str| RouteMark {
        id: id.into(),
        status: RouteStatus::Applied,
        message: String::new(),
    };
    view.marked(&read.entries, &[applied("r-1")]);
    let after = view.of("a/n1").expect("rows");
    assert_eq!(after.routes[0].status, RouteStatus::Applied);
    assert_eq!(after.routes[1].status, RouteStatus::Pending);
    // A derivation puts r-2 anew while a reconcile that read the old one
    // marks it: the new version stays unmarked, as the store may hold it.
    view.write_begins(&ChangeSet {
        put_routes: vec![mk_route("r-2", "a/n1", "l-1", "y")],
        ..ChangeSet::default()
    });
    view.write_ended();
    view.marked(&read.entries, &[applied("r-2")]);
    let last = view.of("a/n1").expect("rows");
    assert_eq!(last.routes[1].status, RouteStatus::Pending);
}

#[test]
fn tombstones_a_record_dropped_are_gone() {
    let view = DesiredView::default();
    view.rebuild(&[mk_link("l-1", "a/n1", true)], &[]);
    assert_eq!(view.of("b/n1").expect("rows").links.len(), 1);
    view.dropped(&["l-1".into()]);
    assert!(view.of("a/n1").expect("rows").links.is_empty());
    assert!(view.of("b/n1").expect("rows").links.is_empty());
}

#[tokio::test]
async fn a_working_state_without_a_view_leaves_it_silent_once_loaded() {
    use crate::reconcile::working::{LinkWrites, WorkingState};
    use crate::store::{MemoryStore, Store};
    let store = MemoryStore::new();
    store
        .put_link(link_to("l-1", "a/n1", None))
        .await
        .expect("a link");
    let mut kept = WorkingState::new(Arc::new(LinkWrites::default()));
    kept.refresh(&store, &[]).await.expect("loaded");
    let rows = kept.view().of("a/n1").expect("a view once loaded");
    assert_eq!(rows.links.len(), 1);
    let mut bare = WorkingState::new(Arc::new(LinkWrites::default())).without_view();
    bare.refresh(&store, &[]).await.expect("loaded");
    assert!(bare.rows().is_some(), "the rows are loaded");
    assert!(bare.view().of("a/n1").is_none(), "the view stays silent");
}
