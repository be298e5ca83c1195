//! The store contract as executable cases. Every backend runs every case
//! (see `tests/store_conformance.rs`) through [`crate::store_conformance_tests`],
//! so the backends cannot drift apart the way the reference's two did.

use uuid::Uuid;

use super::model::{
    DepartureKind, Link, LinkAnswer, LinkStatus, Name, Registration, ReplicaRef,
    ReportedConnection, Route, RouteMark, RouteStatus, SessionState,
};
use super::{ChangeSet, Store};
use crate::store::StoreError;

mod claims;
mod domains;
mod fresh;
mod late;
mod partial;
mod retire;
mod revision;
pub use claims::{link_claims_round_trip, now_is_the_clock_of_the_stamps};
pub use domains::{
    adding_a_domain_again_replaces_its_secret, domains_round_trip_in_name_order,
    removing_a_domain_says_whether_it_existed,
};
pub use fresh::{
    a_change_set_larger_than_a_statement_is_written_whole,
    a_fresh_live_link_still_keeps_its_pair_unique, a_wrong_fresh_hint_still_replaces,
};
pub use late::{
    a_late_registration_already_recorded_stands, a_late_registration_never_replaces_a_newer_one,
};
pub use partial::partial_reads_agree_with_the_full_listings;
pub use retire::retired_links_go_only_while_their_source_is_away;
pub use revision::{
    a_reregistration_replaces_the_revision, the_revision_and_3x_details_round_trip,
};

/// Expands to one `#[tokio::test]` per conformance case. `$make` is an
/// expression of a future yielding something that derefs to a fresh store.
#[macro_export]
macro_rules! store_conformance_tests {
    ($make:expr) => {
        $crate::store_conformance_tests!(@cases $make;
            session_starts_registering_and_creates_record,
            generations_increase_store_wide,
            reregistration_replaces_session,
            an_owner_may_choose_the_session_id,
            mark_ready_only_for_current_session,
            end_session_records_departure,
            late_end_of_replaced_session_changes_nothing,
            announcements_require_current_session,
            announcements_keep_creation_order,
            announcements_at_once_keep_each_nodes_order,
            drop_templates_before_generation,
            received_links_deduplicate_and_reset,
            forget_node_only_when_unchanged,
            links_and_routes_round_trip,
            desired_state_filters_deleted_and_foreign,
            nodes_listed_by_id,
            segments_round_trip,
            segment_edges_are_undirected_and_idempotent,
            edges_of_a_missing_segment_fail,
            change_sets_apply_every_change,
            links_touching_include_claimed_and_tombstones,
            link_answers_follow_the_status_rules,
            every_status_meets_every_answer_as_the_rule_says,
            route_marks_need_the_route,
            answers_of_one_command_are_recorded_at_once,
            an_acknowledgement_is_recorded_whole,
            one_live_link_per_group_pair,
            a_restarted_replica_ends_its_earlier_sessions,
            link_claims_round_trip,
            now_is_the_clock_of_the_stamps,
            retired_links_go_only_while_their_source_is_away,
            a_late_registration_never_replaces_a_newer_one,
            a_late_registration_already_recorded_stands,
            domains_round_trip_in_name_order,
            adding_a_domain_again_replaces_its_secret,
            removing_a_domain_says_whether_it_existed,
            partial_reads_agree_with_the_full_listings,
            the_revision_and_3x_details_round_trip,
            a_reregistration_replaces_the_revision,
            a_wrong_fresh_hint_still_replaces,
            a_fresh_live_link_still_keeps_its_pair_unique,
            a_change_set_larger_than_a_statement_is_written_whole
        );
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let store = $make.await;
                $crate::store::conformance::$case(&*store).await;
            }
        )*
    };
}

fn owner() -> ReplicaRef {
    ReplicaRef {
        id: "replica-a".into(),
        incarnation: 1,
    }
}

fn mk_registration(id: &str) -> Registration {
    Registration {
        node_id: id.into(),
        group: id.split('/').next().map(str::to_string),
        reported_connections: vec![ReportedConnection {
            link_id: "l-1".into(),
            incoming: false,
        }],
        ..Registration::default()
    }
}

fn mk_name(last: &str) -> Name {
    Name {
        components: ["org".into(), "ns".into(), last.into()],
        id: None,
    }
}

fn mk_link(id: &str, source: &str, deleted: bool) -> Link {
    Link {
        link_id: id.into(),
        source_node: source.into(),
        source_group: "a".into(),
        dest_group: "b".into(),
        dest_node: None,
        dest_endpoint: "http://10.0.0.2:46357".into(),
        config_data: "{}".into(),
        status: LinkStatus::Pending,
        status_msg: String::new(),
        deleted,
        updated_at: 0,
        claim: None,
    }
}

fn mk_route(id: &str, source: &str, link: &str, status: RouteStatus) -> Route {
    Route {
        id: id.into(),
        source_node: source.into(),
        dest_node: "b/n1".into(),
        link_id: link.into(),
        name: mk_name("app"),
        status,
        status_msg: String::new(),
        updated_at: 0,
    }
}

/// One answer to a link creation; whether the link was found.
async fn mark_link(store: &dyn Store, id: &str, source: &str, ok: bool, message: &str) -> bool {
    let answer = LinkAnswer {
        link_id: id.into(),
        ok,
        message: message.into(),
    };
    store.mark_links_sent(source, &[answer]).await.unwrap() == 1
}

/// One route mark; whether the route was found.
async fn mark_route(store: &dyn Store, id: &str, status: RouteStatus, message: &str) -> bool {
    let mark = RouteMark {
        id: id.into(),
        status,
        message: message.into(),
    };
    store.mark_routes(&[mark]).await.unwrap() == 1
}

async fn start(store: &dyn Store, id: &str) -> super::SessionStart {
    store
        .begin_session(mk_registration(id), owner())
        .await
        .expect("begin_session")
}

pub async fn session_starts_registering_and_creates_record(store: &dyn Store) {
    let started = start(store, "a/n1").await;
    assert_eq!(started.session.state, SessionState::Registering);
    assert_eq!(started.replaced, None);
    let rec = store.get_node("a/n1").await.unwrap().expect("record");
    assert_eq!(rec.group.as_deref(), Some("a"));
    assert_eq!(rec.session.as_ref(), Some(&started.session));
    assert_eq!(rec.generation, started.session.generation);
    assert_eq!(rec.reported_connections.len(), 1);
    assert!(rec.ready_session().is_none());
}

pub async fn generations_increase_store_wide(store: &dyn Store) {
    let g1 = start(store, "a/n1").await.session.generation;
    let g2 = start(store, "b/n1").await.session.generation;
    let g3 = start(store, "a/n1").await.session.generation;
    assert!(g1 < g2 && g2 < g3, "{g1} {g2} {g3}");
    let s = start(store, "c/n1").await.session;
    store
        .end_session("c/n1", s.id, DepartureKind::Deregistered)
        .await
        .unwrap();
    assert!(store.forget_node("c/n1", s.generation).await.unwrap());
    let again = start(store, "c/n1").await.session.generation;
    assert!(again > s.generation, "a recreated record continues upward");
}

pub async fn an_owner_may_choose_the_session_id(store: &dyn Store) {
    let chosen = Uuid::new_v4();
    let reg = Registration {
        session_id: chosen,
        ..mk_registration("a/n1")
    };
    let started = store.begin_session(reg, owner()).await.unwrap();
    assert_eq!(started.session.id, chosen);
    assert!(store.mark_ready("a/n1", chosen).await.unwrap());
}

pub async fn reregistration_replaces_session(store: &dyn Store) {
    let first = start(store, "a/n1").await.session;
    let second = start(store, "a/n1").await;
    assert_eq!(second.replaced.as_ref(), Some(&first));
    assert_ne!(second.session.id, first.id);
    let rec = store.get_node("a/n1").await.unwrap().unwrap();
    assert_eq!(rec.session.map(|s| s.id), Some(second.session.id));
}

pub async fn mark_ready_only_for_current_session(store: &dyn Store) {
    let first = start(store, "a/n1").await.session;
    let second = start(store, "a/n1").await.session;
    assert!(!store.mark_ready("a/n1", first.id).await.unwrap());
    assert!(!store.mark_ready("a/nobody", first.id).await.unwrap());
    assert!(store.mark_ready("a/n1", second.id).await.unwrap());
    assert!(
        store.mark_ready("a/n1", second.id).await.unwrap(),
        "idempotent"
    );
    let rec = store.get_node("a/n1").await.unwrap().unwrap();
    assert_eq!(rec.ready_session().map(|s| s.id), Some(second.id));
}

pub async fn end_session_records_departure(store: &dyn Store) {
    let s = start(store, "a/n1").await.session;
    store
        .record_received("a/n1", s.id, &["l-9".into()])
        .await
        .unwrap();
    assert!(
        store
            .end_session("a/n1", s.id, DepartureKind::Crash)
            .await
            .unwrap()
    );
    let rec = store
        .get_node("a/n1")
        .await
        .unwrap()
        .expect("crash keeps the record");
    assert!(!rec.is_connected());
    let dep = rec.departure.expect("departure");
    assert_eq!(
        (dep.generation, dep.kind),
        (s.generation, DepartureKind::Crash)
    );
    assert!(rec.received_links.is_empty());
    let next = start(store, "a/n1").await;
    assert_eq!(next.replaced, None, "an ended session is not replaced");
    let rec = store.get_node("a/n1").await.unwrap().unwrap();
    assert_eq!(rec.departure, None, "a new session clears the departure");
}

pub async fn late_end_of_replaced_session_changes_nothing(store: &dyn Store) {
    let old = start(store, "a/n1").await.session;
    let new = start(store, "a/n1").await.session;
    assert!(
        !store
            .end_session("a/n1", old.id, DepartureKind::Crash)
            .await
            .unwrap()
    );
    let rec = store.get_node("a/n1").await.unwrap().unwrap();
    assert_eq!(rec.session.map(|s| s.id), Some(new.id));
    assert_eq!(rec.departure, None);
}

pub async fn announcements_require_current_session(store: &dyn Store) {
    let old = start(store, "a/n1").await.session;
    let new = start(store, "a/n1").await.session;
    let err = store
        .record_announcements("a/n1", old.id, &[mk_name("x")], &[])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::StaleSession { .. }), "{err:?}");
    let err = store
        .record_received("a/n1", old.id, &["l-1".into()])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::StaleSession { .. }), "{err:?}");
    assert!(store.list_templates().await.unwrap().is_empty());
    store
        .record_announcements("a/n1", new.id, &[mk_name("x")], &[])
        .await
        .unwrap();
    let templates = store.list_templates().await.unwrap();
    assert_eq!(templates.len(), 1);
    assert_eq!(templates[0].generation, new.generation);
    assert_eq!(templates[0].node, "a/n1");
    assert!(
        templates[0].updated_at > 1_600_000_000,
        "stamped with the time"
    );
}

pub async fn announcements_keep_creation_order(store: &dyn Store) {
    let a = start(store, "a/n1").await.session;
    let b = start(store, "b/n1").await.session;
    store
        .record_announcements("b/n1", b.id, &[mk_name("x")], &[])
        .await
        .unwrap();
    store
        .record_announcements("a/n1", a.id, &[mk_name("x"), mk_name("y")], &[])
        .await
        .unwrap();
    store
        .record_announcements("b/n1", b.id, &[mk_name("x")], &[mk_name("never")])
        .await
        .unwrap();
    let order: Vec<(String, String)> = store
        .list_templates()
        .await
        .unwrap()
        .into_iter()
        .map(|t| (t.node, t.name.components[2].clone()))
        .collect();
    let expected =
        [("b/n1", "x"), ("a/n1", "x"), ("a/n1", "y")].map(|(n, x)| (n.to_string(), x.to_string()));
    assert_eq!(order, expected, "re-announcing keeps the original position");
    store
        .record_announcements("a/n1", a.id, &[], &[mk_name("x")])
        .await
        .unwrap();
    assert_eq!(store.list_templates().await.unwrap().len(), 2);
}

/// Many announcements in flight at once (a fast store writes them in one
/// transaction): each node's are applied in call order, and a stale one
/// fails alone.
pub async fn announcements_at_once_keep_each_nodes_order(store: &dyn Store) {
    let a = start(store, "a/n1").await.session;
    let b = start(store, "b/n1").await.session;
    let c_old = start(store, "c/n1").await.session;
    start(store, "c/n1").await;
    let (x, y) = (mk_name("x"), mk_name("y"));
    let (xy, only_x) = ([x.clone(), y.clone()], [x.clone()]);
    let answers = tokio::join!(
        store.record_announcements("a/n1", a.id, &xy, &[]),
        store.record_announcements("b/n1", b.id, &only_x, &[]),
        store.record_announcements("c/n1", c_old.id, &only_x, &[]),
        store.record_announcements("a/n1", a.id, &[], &only_x),
        store.record_announcements("a/n1", a.id, &only_x, &[]),
        store.record_announcements("b/n1", b.id, &[], &only_x),
    );
    assert!(matches!(answers.2, Err(StoreError::StaleSession { .. })));
    for ok in [answers.0, answers.1, answers.3, answers.4, answers.5] {
        ok.unwrap();
    }
    let held = |node: &str, templates: &[crate::store::model::Template]| -> Vec<String> {
        templates
            .iter()
            .filter(|t| t.node == node)
            .map(|t| t.name.components[2].clone())
            .collect()
    };
    let templates = store.list_templates().await.unwrap();
    assert_eq!(
        held("a/n1", &templates),
        ["y", "x"],
        "x withdrawn, then announced again: a new place"
    );
    assert!(
        held("b/n1", &templates).is_empty(),
        "announced, then withdrawn"
    );
    assert!(
        held("c/n1", &templates).is_empty(),
        "a stale session wrote nothing"
    );
}

pub async fn drop_templates_before_generation(store: &dyn Store) {
    let old = start(store, "a/n1").await.session;
    store
        .record_announcements("a/n1", old.id, &[mk_name("old")], &[])
        .await
        .unwrap();
    let new = start(store, "a/n1").await.session;
    store
        .record_announcements("a/n1", new.id, &[mk_name("new")], &[])
        .await
        .unwrap();
    let other = start(store, "b/n1").await.session;
    store
        .record_announcements("b/n1", other.id, &[mk_name("old")], &[])
        .await
        .unwrap();
    assert_eq!(
        store
            .drop_templates_before("a/n1", new.generation)
            .await
            .unwrap(),
        1
    );
    let left: Vec<_> = store.list_templates().await.unwrap();
    assert_eq!(left.len(), 2);
    assert!(
        left.iter()
            .all(|t| t.node != "a/n1" || t.name.components[2] == "new")
    );
    assert_eq!(
        store.drop_templates_before("a/n1", u64::MAX).await.unwrap(),
        1
    );
    assert_eq!(store.list_templates().await.unwrap().len(), 1);
}

pub async fn received_links_deduplicate_and_reset(store: &dyn Store) {
    let s = start(store, "a/n1").await.session;
    for ids in [vec!["l-1".to_string(), "l-2".into()], vec!["l-2".into()]] {
        store.record_received("a/n1", s.id, &ids).await.unwrap();
    }
    let rec = store.get_node("a/n1").await.unwrap().unwrap();
    assert_eq!(rec.received_links, vec!["l-1".to_string(), "l-2".into()]);
    start(store, "a/n1").await;
    let rec = store.get_node("a/n1").await.unwrap().unwrap();
    assert!(
        rec.received_links.is_empty(),
        "claims belong to one session"
    );
}

pub async fn forget_node_only_when_unchanged(store: &dyn Store) {
    let s = start(store, "a/n1").await.session;
    assert!(
        !store.forget_node("a/n1", s.generation).await.unwrap(),
        "connected"
    );
    store
        .end_session("a/n1", s.id, DepartureKind::Deregistered)
        .await
        .unwrap();
    assert!(!store.forget_node("a/n1", s.generation - 1).await.unwrap());
    assert!(store.forget_node("a/n1", s.generation).await.unwrap());
    assert_eq!(store.get_node("a/n1").await.unwrap(), None);
    assert!(!store.forget_node("a/n1", s.generation).await.unwrap());
    let _: Uuid = s.id;
}

pub async fn links_and_routes_round_trip(store: &dyn Store) {
    let mut link = mk_link("l-1", "a/n1", false);
    store.put_link(link.clone()).await.unwrap();
    link.status = LinkStatus::Applied;
    link.dest_node = Some("b/n1".into());
    store.put_link(link.clone()).await.unwrap();
    assert_eq!(store.list_links().await.unwrap(), vec![link]);
    let route = mk_route("r-1", "a/n1", "l-1", RouteStatus::Pending);
    store.put_route(route.clone()).await.unwrap();
    assert_eq!(store.list_routes().await.unwrap(), vec![route]);
    assert!(store.delete_route("r-1").await.unwrap());
    assert!(!store.delete_route("r-1").await.unwrap());
    assert!(store.delete_link("l-1").await.unwrap());
    assert!(!store.delete_link("l-1").await.unwrap());
    assert!(store.list_links().await.unwrap().is_empty());
    assert!(store.list_routes().await.unwrap().is_empty());
}

pub async fn desired_state_filters_deleted_and_foreign(store: &dyn Store) {
    store.put_link(mk_link("l-1", "a/n1", false)).await.unwrap();
    store.put_link(mk_link("l-2", "a/n1", true)).await.unwrap();
    // Another pair: a store holds one live link per group pair.
    let mut foreign = mk_link("l-3", "a/n2", false);
    foreign.dest_group = "c".into();
    store.put_link(foreign).await.unwrap();
    for route in [
        mk_route("r-1", "a/n1", "l-1", RouteStatus::Applied),
        mk_route("r-2", "a/n1", "l-1", RouteStatus::Deleted),
        mk_route("r-3", "a/n1", "l-2", RouteStatus::Pending),
        mk_route("r-4", "a/n2", "l-3", RouteStatus::Pending),
    ] {
        store.put_route(route).await.unwrap();
    }
    let desired = store.desired_for_node("a/n1").await.unwrap();
    let links: Vec<_> = desired.links.iter().map(|l| l.link_id.as_str()).collect();
    let routes: Vec<_> = desired.routes.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(links, ["l-1"]);
    assert_eq!(routes, ["r-1"]);
    let none = store.desired_for_node("z/n9").await.unwrap();
    assert!(none.links.is_empty() && none.routes.is_empty());
    // A session begins with the same desired state, read in its own
    // transaction; a node that never had one begins with nothing.
    let again = start(store, "a/n1").await;
    assert_eq!(again.desired, desired);
    assert_eq!(start(store, "z/n9").await.desired, none);
}

pub async fn nodes_listed_by_id(store: &dyn Store) {
    for id in ["b/n2", "a/n1", "b/n1"] {
        start(store, id).await;
    }
    let ids: Vec<String> = store
        .list_nodes()
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.id)
        .collect();
    assert_eq!(ids, ["a/n1", "b/n1", "b/n2"]);
}

pub async fn segments_round_trip(store: &dyn Store) {
    assert!(store.add_segment("blue").await.unwrap());
    assert!(store.add_segment("default").await.unwrap());
    assert!(store.add_segment_edge("blue", "b", "a").await.unwrap());
    assert!(
        !store.add_segment("blue").await.unwrap(),
        "exists; edges kept"
    );
    let segments = store.list_segments().await.unwrap();
    let names: Vec<_> = segments.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["blue", "default"]);
    assert_eq!(segments[0].edges, [("a".to_string(), "b".to_string())]);
    assert!(store.remove_segment("blue").await.unwrap());
    assert!(!store.remove_segment("blue").await.unwrap());
    assert!(store.add_segment("blue").await.unwrap());
    assert!(
        store.list_segments().await.unwrap()[0].edges.is_empty(),
        "edges went with it"
    );
}

pub async fn segment_edges_are_undirected_and_idempotent(store: &dyn Store) {
    store.add_segment("s").await.unwrap();
    assert!(store.add_segment_edge("s", "x", "y").await.unwrap());
    assert!(!store.add_segment_edge("s", "y", "x").await.unwrap());
    assert!(store.add_segment_edge("s", "c", "a").await.unwrap());
    let edges = store.list_segments().await.unwrap()[0].edges.clone();
    let want = [("a", "c"), ("x", "y")].map(|(a, b)| (a.to_string(), b.to_string()));
    assert_eq!(edges, want);
    assert!(store.remove_segment_edge("s", "y", "x").await.unwrap());
    assert!(!store.remove_segment_edge("s", "x", "y").await.unwrap());
}

pub async fn edges_of_a_missing_segment_fail(store: &dyn Store) {
    let err = store.add_segment_edge("nope", "a", "b").await.unwrap_err();
    assert_eq!(err, StoreError::SegmentNotFound("nope".into()));
    let err = store
        .remove_segment_edge("nope", "a", "b")
        .await
        .unwrap_err();
    assert_eq!(err, StoreError::SegmentNotFound("nope".into()));
    assert!(store.list_segments().await.unwrap().is_empty());
}

pub async fn change_sets_apply_every_change(store: &dyn Store) {
    let s = start(store, "b/n1").await.session;
    store
        .record_received("b/n1", s.id, &["l-1".into(), "l-2".into()])
        .await
        .unwrap();
    store
        .put_link(mk_link("l-old", "a/n1", false))
        .await
        .unwrap();
    store
        .put_route(mk_route("r-old", "a/n1", "l-old", RouteStatus::Applied))
        .await
        .unwrap();
    let changes = ChangeSet {
        put_links: vec![mk_link("l-1", "a/n1", false), mk_link("l-2", "a/n2", true)],
        delete_links: vec!["l-old".into(), "l-never".into()],
        put_routes: vec![mk_route("r-1", "a/n1", "l-1", RouteStatus::Pending)],
        delete_routes: vec!["r-old".into()],
        retire_links: vec![],
        consume_claims: vec![
            ("b/n1".into(), "l-1".into()),
            ("z/none".into(), "l-1".into()),
        ],
        ..ChangeSet::default()
    };
    assert!(!changes.is_empty());
    store.apply(changes).await.unwrap();
    let links: Vec<_> = store
        .list_links()
        .await
        .unwrap()
        .into_iter()
        .map(|l| (l.link_id, l.deleted))
        .collect();
    assert_eq!(
        links,
        [("l-1".to_string(), false), ("l-2".to_string(), true)]
    );
    let routes: Vec<_> = store
        .list_routes()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(routes, ["r-1"]);
    let rec = store.get_node("b/n1").await.unwrap().unwrap();
    assert_eq!(rec.received_links, ["l-2"]);
    assert!(
        rec.reported_connections.is_empty() || rec.reported_connections.iter().all(|c| !c.incoming)
    );
    store.apply(ChangeSet::default()).await.unwrap();
}

pub async fn links_touching_include_claimed_and_tombstones(store: &dyn Store) {
    let mut claimed = mk_link("l-1", "a/n1", false);
    claimed.dest_node = Some("b/n1".into());
    store.put_link(claimed).await.unwrap();
    store.put_link(mk_link("l-2", "b/n1", true)).await.unwrap();
    let mut unrelated = mk_link("l-3", "c/n1", false);
    unrelated.source_group = "c".into();
    store.put_link(unrelated).await.unwrap();
    store
        .put_route(mk_route("r-1", "b/n1", "l-1", RouteStatus::Pending))
        .await
        .unwrap();
    store
        .put_route(mk_route("r-2", "a/n1", "l-1", RouteStatus::Pending))
        .await
        .unwrap();
    let ids: Vec<_> = store
        .links_touching("b/n1")
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.link_id)
        .collect();
    assert_eq!(ids, ["l-1", "l-2"]);
    let routes: Vec<_> = store
        .routes_sourced("b/n1")
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(routes, ["r-1"]);
}

pub async fn link_answers_follow_the_status_rules(store: &dyn Store) {
    store.put_link(mk_link("l-1", "a/n1", false)).await.unwrap();
    assert!(
        !mark_link(store, "l-1", "a/other", true, "").await,
        "not its source"
    );
    assert!(!mark_link(store, "l-none", "a/n1", true, "").await);
    let status = || async { store.list_links().await.unwrap()[0].status };
    assert!(mark_link(store, "l-1", "a/n1", true, "").await);
    assert_eq!(status().await, LinkStatus::Connecting);
    mark_link(store, "l-1", "a/n1", false, "refused").await;
    assert_eq!(status().await, LinkStatus::Failed);
    assert_eq!(store.list_links().await.unwrap()[0].status_msg, "refused");
    mark_link(store, "l-1", "a/n1", true, "").await;
    assert_eq!(status().await, LinkStatus::Connecting, "a retry recovers");
    let mut applied = mk_link("l-1", "a/n1", false);
    applied.status = LinkStatus::Applied;
    store.put_link(applied).await.unwrap();
    mark_link(store, "l-1", "a/n1", false, "late").await;
    assert_eq!(
        status().await,
        LinkStatus::Applied,
        "a claimed link stays applied"
    );
    store.put_link(mk_link("l-1", "a/n1", true)).await.unwrap();
    assert!(!mark_link(store, "l-1", "a/n1", true, "").await, "deleted");
}

/// Each status meets a success and a failure, and ends as the shared
/// rule says: a backend that renders the rule elsewhere (Postgres, into
/// SQL) must agree with it everywhere, not only on the common paths.
pub async fn every_status_meets_every_answer_as_the_rule_says(store: &dyn Store) {
    use LinkStatus::{Applied, Connecting, Failed, Pending};
    for (i, from) in [Pending, Connecting, Applied, Failed]
        .into_iter()
        .enumerate()
    {
        for ok in [true, false] {
            let id = format!("l-{i}-{ok}");
            let mut link = mk_link(&id, "a/n1", false);
            (link.status, link.dest_group) = (from, format!("b{i}{ok}"));
            store.put_link(link).await.unwrap();
            assert!(mark_link(store, &id, "a/n1", ok, "said").await, "{id}");
            let links = store.list_links().await.unwrap();
            let after = links.iter().find(|l| l.link_id == id).map(|l| l.status);
            assert_eq!(
                after,
                Some(crate::store::sent_status(from, ok)),
                "{from:?}, ok {ok}"
            );
        }
    }
}

pub async fn route_marks_need_the_route(store: &dyn Store) {
    assert!(!mark_route(store, "r-1", RouteStatus::Applied, "").await);
    store
        .put_route(mk_route("r-1", "a/n1", "l-1", RouteStatus::Pending))
        .await
        .unwrap();
    assert!(mark_route(store, "r-1", RouteStatus::Failed, "no conn").await);
    let r = &store.list_routes().await.unwrap()[0];
    assert_eq!(
        (r.status, r.status_msg.as_str()),
        (RouteStatus::Failed, "no conn")
    );
}

pub async fn one_live_link_per_group_pair(store: &dyn Store) {
    store.put_link(mk_link("l-1", "a/n1", false)).await.unwrap();
    let mut reverse = mk_link("l-2", "b/n1", false);
    (reverse.source_group, reverse.dest_group) = ("b".into(), "a".into());
    let err = store.put_link(reverse.clone()).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
    let batch = ChangeSet {
        put_links: vec![reverse.clone()],
        ..ChangeSet::default()
    };
    let err = store.apply(batch).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
    let ids: Vec<_> = store
        .list_links()
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.link_id)
        .collect();
    assert_eq!(ids, ["l-1"], "nothing written");
    let replace = ChangeSet {
        put_links: vec![mk_link("l-1", "a/n1", true), reverse],
        ..ChangeSet::default()
    };
    store
        .apply(replace)
        .await
        .expect("a tombstone and its successor in one batch");
    assert!(
        store.put_link(mk_link("l-3", "a/n2", true)).await.is_ok(),
        "tombstones do not count"
    );
}

pub async fn a_restarted_replica_ends_its_earlier_sessions(store: &dyn Store) {
    let old = owner();
    let other = ReplicaRef {
        id: "replica-b".into(),
        incarnation: 1,
    };
    let mine = store
        .begin_session(mk_registration("a/n1"), old.clone())
        .await
        .unwrap()
        .session;
    store
        .begin_session(mk_registration("a/n2"), old.clone())
        .await
        .unwrap();
    store
        .begin_session(mk_registration("b/n1"), other)
        .await
        .unwrap();
    let next = ReplicaRef {
        id: old.id.clone(),
        incarnation: old.incarnation + 1,
    };
    let fresh = store
        .begin_session(mk_registration("c/n1"), next.clone())
        .await
        .unwrap();
    let ended = store.end_earlier_incarnations(&next).await.unwrap();
    assert_eq!(ended, ["a/n1", "a/n2"]);
    let rec = store.get_node("a/n1").await.unwrap().unwrap();
    assert!(!rec.is_connected());
    let dep = rec.departure.expect("departure");
    assert_eq!(
        (dep.generation, dep.kind),
        (mine.generation, DepartureKind::Crash)
    );
    assert!(
        store
            .get_node("b/n1")
            .await
            .unwrap()
            .unwrap()
            .is_connected(),
        "another replica's"
    );
    let c = store.get_node("c/n1").await.unwrap().unwrap();
    assert_eq!(
        c.session.map(|s| s.id),
        Some(fresh.session.id),
        "its own current sessions stay"
    );
    assert!(
        store
            .end_earlier_incarnations(&next)
            .await
            .unwrap()
            .is_empty()
    );
}

pub async fn an_acknowledgement_is_recorded_whole(store: &dyn Store) {
    let mut live = mk_link("l-1", "a/n1", false);
    live.dest_group = "b".into();
    store.put_link(live).await.unwrap();
    let mut tombstone = mk_link("l-old", "a/n1", true);
    tombstone.dest_group = "c".into();
    store.put_link(tombstone).await.unwrap();
    store
        .put_route(mk_route("r-1", "a/n1", "l-1", RouteStatus::Pending))
        .await
        .unwrap();
    let answers = [LinkAnswer {
        link_id: "l-1".into(),
        ok: true,
        message: String::new(),
    }];
    let marks = [RouteMark {
        id: "r-1".into(),
        status: RouteStatus::Applied,
        message: String::new(),
    }];
    store
        .record_acknowledgement("a/n1", &answers, &marks, &["l-old".to_string()])
        .await
        .unwrap();
    let links = store.list_links().await.unwrap();
    let got: Vec<_> = links
        .iter()
        .map(|l| (l.link_id.as_str(), l.status))
        .collect();
    assert_eq!(
        got,
        [("l-1", LinkStatus::Connecting)],
        "answered; tombstone gone"
    );
    let routes = store.list_routes().await.unwrap();
    assert_eq!(routes[0].status, RouteStatus::Applied);
    // Nothing to record writes nothing and is no error.
    store
        .record_acknowledgement("a/n1", &[], &[], &[])
        .await
        .unwrap();
}

pub async fn answers_of_one_command_are_recorded_at_once(store: &dyn Store) {
    for (id, source) in [("l-1", "a/n1"), ("l-2", "a/n1"), ("l-3", "a/other")] {
        let mut link = mk_link(id, source, false);
        link.dest_group = format!("b-{id}");
        store.put_link(link).await.unwrap();
    }
    let answer = |id: &str, ok: bool, message: &str| LinkAnswer {
        link_id: id.into(),
        ok,
        message: message.into(),
    };
    let answers = [
        answer("l-1", false, "first"),
        answer("l-2", false, "refused"),
        answer("l-3", true, ""),
        answer("l-missing", true, ""),
        answer("l-1", true, ""),
    ];
    assert_eq!(store.mark_links_sent("a/n1", &answers).await.unwrap(), 2);
    let links = store.list_links().await.unwrap();
    let got: Vec<_> = links
        .iter()
        .map(|l| (l.link_id.as_str(), l.status, l.status_msg.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("l-1", LinkStatus::Connecting, ""),
            ("l-2", LinkStatus::Failed, "refused"),
            ("l-3", LinkStatus::Pending, ""),
        ],
        "the last answer wins; another source's link is not touched"
    );
    store
        .put_route(mk_route("r-1", "a/n1", "l-1", RouteStatus::Pending))
        .await
        .unwrap();
    let mark = |id: &str, status, message: &str| RouteMark {
        id: id.into(),
        status,
        message: message.into(),
    };
    let marks = [
        mark("r-1", RouteStatus::Failed, "no conn"),
        mark("r-none", RouteStatus::Applied, ""),
        mark("r-1", RouteStatus::Applied, ""),
    ];
    assert_eq!(store.mark_routes(&marks).await.unwrap(), 1);
    assert_eq!(
        store.list_routes().await.unwrap()[0].status,
        RouteStatus::Applied
    );
    assert_eq!(store.mark_routes(&[]).await.unwrap(), 0);
}
