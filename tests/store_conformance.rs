//! The store contract, run against every backend.

mod common;

mod memory {
    use std::sync::Arc;

    use slim_cp::store::MemoryStore;

    slim_cp::store_conformance_tests!(async { Arc::new(MemoryStore::new()) });
}

/// Each case on its own fresh, migrated database (dropped when it passes).
mod postgres {
    use super::common::pg::fresh_pg_db;

    slim_cp::store_conformance_tests!(fresh_pg_db());
}

/// What only the Postgres backend has: the pair index, fencing, schema
/// checks, unavailability, row locks under concurrency, metrics.
mod postgres_backend {
    use std::collections::{BTreeMap, BTreeSet};
    use std::future::Future;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use slim_cp::store::model::{
        ConnectionDetail, Link, LinkAnswer, LinkStatus, Name, Registration, ReplicaRef, Route,
        RouteMark, RouteStatus, SessionState,
    };
    use slim_cp::store::{ChangeSet, PgStore, SetupError, Store, StoreError};
    use tokio_postgres::NoTls;

    use super::common::pg::{PgTestDb, admin_url, fresh_pg_db, pg_url_for};

    fn mk_link(id: &str, source: &str, groups: (&str, &str), deleted: bool) -> Link {
        Link {
            link_id: id.into(),
            source_node: source.into(),
            source_group: groups.0.into(),
            dest_group: groups.1.into(),
            dest_node: None,
            dest_endpoint: "http://10.0.0.2:46357".into(),
            config_data: "{}".into(),
            status: LinkStatus::Pending,
            status_msg: String::new(),
            deleted,
            updated_at: 7,
            claim: None,
        }
    }

    fn mk_route(id: &str, link: &str) -> Route {
        Route {
            id: id.into(),
            source_node: "a/n1".into(),
            dest_node: "b/n1".into(),
            link_id: link.into(),
            name: Name {
                components: ["org".into(), "ns".into(), "app".into()],
                id: Some(u128::MAX),
            },
            status: RouteStatus::Pending,
            status_msg: String::new(),
            updated_at: 7,
        }
    }

    fn owner() -> ReplicaRef {
        ReplicaRef {
            id: "replica-a".into(),
            incarnation: 3,
        }
    }

    fn mk_registration(id: &str) -> Registration {
        Registration {
            node_id: id.into(),
            group: Some("a".into()),
            ..Registration::default()
        }
    }

    /// A store of its own on the test database, its pool `size`
    /// connections (opened in full before it returns).
    async fn own_store(db: &PgTestDb, size: usize) -> PgStore {
        PgStore::connect(&pg_url_for(db.name()), size)
            .await
            .expect("connects")
    }

    /// Runs `statement` on the test database as the admin user.
    async fn sql(db: &PgTestDb, statement: &str) {
        let client = db.client().await;
        client.batch_execute(statement).await.expect(statement);
    }

    #[tokio::test]
    async fn pg_a_pairs_link_is_replaced_inside_one_change_set() {
        let db = fresh_pg_db().await;
        db.put_link(mk_link("l-old", "a/n1", ("a", "b"), false))
            .await
            .unwrap();
        let replace = ChangeSet {
            put_links: vec![
                mk_link("l-new", "b/n1", ("b", "a"), false),
                mk_link("l-old", "a/n1", ("a", "b"), true),
            ],
            ..ChangeSet::default()
        };
        db.apply(replace)
            .await
            .expect("tombstone first, then the live link");
        let live: Vec<_> = db
            .list_links()
            .await
            .unwrap()
            .into_iter()
            .filter(|l| !l.deleted)
            .collect();
        assert_eq!(live.len(), 1);
        assert_eq!((live[0].link_id.as_str(), live[0].updated_at), ("l-new", 7));
    }

    #[tokio::test]
    async fn pg_a_second_live_link_for_a_pair_fails_the_whole_change_set() {
        let db = fresh_pg_db().await;
        db.put_link(mk_link("l-1", "a/n1", ("a", "b"), false))
            .await
            .unwrap();
        let conflicting = ChangeSet {
            put_links: vec![mk_link("l-2", "b/n1", ("b", "a"), false)],
            put_routes: vec![mk_route("r-1", "l-2")],
            ..ChangeSet::default()
        };
        let err = db.apply(conflicting).await.unwrap_err();
        assert!(
            matches!(&err, StoreError::Conflict(m) if m.contains("links_one_live_per_pair")),
            "{err:?}"
        );
        assert_eq!(db.list_links().await.unwrap().len(), 1);
        assert!(db.list_routes().await.unwrap().is_empty(), "all or nothing");
    }

    #[tokio::test]
    async fn pg_wide_name_ids_and_given_timestamps_round_trip() {
        let db = fresh_pg_db().await;
        db.put_route(mk_route("r-1", "l-1")).await.unwrap();
        assert_eq!(
            db.list_routes().await.unwrap(),
            vec![mk_route("r-1", "l-1")]
        );
        let s = db
            .begin_session(mk_registration("a/n1"), owner())
            .await
            .unwrap()
            .session;
        let rec = db.get_node("a/n1").await.unwrap().expect("record");
        assert_eq!(
            rec.session.map(|s| (s.owner, s.state)),
            Some((owner(), SessionState::Registering))
        );
        let skew = (rec.updated_at - slim_cp::clock::unix_now()).abs();
        assert!(skew < 30, "the database's now(), in Unix seconds: {skew}");
        let _ = s;
    }

    /// What a trigger on `routes` saw of each write's commit mode, in
    /// write order.
    async fn commit_modes(db: &PgTestDb) -> Vec<String> {
        let client = db.client().await;
        let rows = client
            .query("SELECT mode FROM commit_modes ORDER BY seq", &[])
            .await
            .expect("commit modes");
        rows.iter().map(|r| r.get(0)).collect()
    }

    /// A reconcile's records of what a node holds commit without waiting
    /// for the disk (the next look records them again), on generic plans
    /// (they look their rows up by id); the leader's derived rows do wait. Fenced, the fence still runs first: the
    /// records of a deposed term are refused.
    #[tokio::test]
    async fn pg_only_a_reconciles_records_skip_the_wait_for_the_disk() {
        let db = fresh_pg_db().await;
        sql(
            &db,
            "CREATE TABLE commit_modes (seq serial, mode text); \
             CREATE FUNCTION note_commit_mode() RETURNS trigger LANGUAGE plpgsql AS $$ \
               BEGIN INSERT INTO commit_modes (mode) \
                 VALUES (current_setting('synchronous_commit') || ' ' \
                   || current_setting('plan_cache_mode')); RETURN NULL; END $$; \
             CREATE TRIGGER note AFTER INSERT OR UPDATE ON routes \
               FOR EACH ROW EXECUTE FUNCTION note_commit_mode()",
        )
        .await;
        // Whatever the server's default (a throwaway cluster runs with it
        // off), this database's sessions start with it on.
        let on = format!("ALTER DATABASE {} SET synchronous_commit = on", db.name());
        sql(&db, &on).await;
        let auto = format!("ALTER DATABASE {} SET plan_cache_mode = auto", db.name());
        sql(&db, &auto).await;
        let store = own_store(&db, 2).await;
        let leader = store.with_fence(0);
        leader
            .apply(ChangeSet {
                put_links: vec![mk_link("l-1", "a/n1", ("a", "b"), false)],
                put_routes: vec![mk_route("r-1", "l-1")],
                ..ChangeSet::default()
            })
            .await
            .expect("epoch 0 stands");
        let applied = [RouteMark {
            id: "r-1".into(),
            status: RouteStatus::Applied,
            message: String::new(),
        }];
        leader
            .record_acknowledgement("a/n1", &[], &applied, &[])
            .await
            .expect("recorded");
        // The record also runs on generic plans (see `tx::relaxed`).
        assert_eq!(
            commit_modes(&db).await,
            ["on auto", "off force_generic_plan"]
        );
        sql(&db, "UPDATE leadership SET epoch = 1").await;
        let failed = [RouteMark {
            status: RouteStatus::Failed,
            ..applied[0].clone()
        }];
        let err = leader
            .record_acknowledgement("a/n1", &[], &failed, &[])
            .await
            .unwrap_err();
        assert_eq!(
            err,
            StoreError::Fenced {
                epoch: 0,
                current: 1
            }
        );
        let routes = db.list_routes().await.unwrap();
        assert_eq!(routes[0].status, RouteStatus::Applied, "nothing written");
    }

    /// How many backends of `db` a query of `pg_stat_activity` counts
    /// (`where` filters them).
    async fn backends(watcher: &tokio_postgres::Client, db: &PgTestDb, filter: &str) -> i64 {
        let sql = format!("SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND {filter}");
        let row = watcher.query_one(&sql, &[&db.name()]).await.unwrap();
        row.get(0)
    }

    /// Polls `probe` until its answer is `done`, for at most `patience`.
    async fn eventually<T: std::fmt::Debug, F: Future<Output = T>>(
        what: &str,
        patience: Duration,
        mut probe: impl FnMut() -> F,
        done: impl Fn(&T) -> bool,
    ) {
        let deadline = Instant::now() + patience;
        loop {
            let now = probe().await;
            if done(&now) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: {now:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Polls until `filter` counts `want` backends of `db`, for at most
    /// `patience`.
    async fn until_backends(db: &PgTestDb, filter: &str, want: i64, patience: Duration) {
        let watcher = db.client().await;
        let what = format!("backends where {filter}");
        let probe = || backends(&watcher, db, filter);
        eventually(&what, patience, probe, |n| *n == want).await;
    }

    const LOCK_WAITS: &str = "wait_event_type = 'Lock'";

    /// How the answer of [`answer_behind_a_lock`] is written.
    #[derive(Clone, Copy)]
    enum Answer {
        /// A reconcile's record, written with group commit.
        Recorded,
        /// A transaction of its own.
        Marked,
    }

    /// A transaction of the test's own that set link `l-1` (sourced at
    /// `a/n1`) to `status` and holds its row lock, and that source's
    /// success answer for it, recorded in a task and waiting on the lock.
    async fn answer_behind_a_lock(
        db: &PgTestDb,
        status: &str,
        how: Answer,
    ) -> (
        tokio_postgres::Client,
        tokio::task::JoinHandle<Result<(), StoreError>>,
    ) {
        db.put_link(mk_link("l-1", "a/n1", ("a", "b"), false))
            .await
            .unwrap();
        let holder = db.client().await;
        let hold = format!("BEGIN; UPDATE links SET status = '{status}' WHERE link_id = 'l-1'");
        holder.batch_execute(&hold).await.unwrap();
        let store = db.store();
        let answer = tokio::spawn(async move {
            let ok = [LinkAnswer {
                link_id: "l-1".into(),
                ok: true,
                message: String::new(),
            }];
            match how {
                Answer::Recorded => store.record_acknowledgement("a/n1", &ok, &[], &[]).await,
                Answer::Marked => store.mark_links_sent("a/n1", &ok).await.map(|_| ()),
            }
        });
        until_backends(db, LOCK_WAITS, 1, Duration::from_secs(30)).await;
        (holder, answer)
    }

    /// A source's answer meets a link the leader is claiming at that
    /// moment: the record waits for the claim's row lock and applies the
    /// status rule to what the claim left (Applied stays Applied), not to
    /// the Pending it would have read before the lock.
    #[tokio::test]
    async fn pg_an_answer_waits_for_a_concurrent_claim_and_keeps_it() {
        let db = fresh_pg_db().await;
        let (claim, answer) = answer_behind_a_lock(&db, "applied", Answer::Recorded).await;
        claim.batch_execute("COMMIT").await.unwrap();
        answer.await.unwrap().expect("recorded");
        let links = db.list_links().await.unwrap();
        assert_eq!(links[0].status, LinkStatus::Applied, "{links:?}");
    }

    /// Records of many nodes made at once go out together (group commit)
    /// and each keeps its own meaning: a link's answer counts at its own
    /// source only, and each record's route marks and forgotten
    /// tombstones take effect whatever else shared its transaction.
    #[tokio::test]
    async fn pg_records_made_at_once_each_take_effect() {
        let db = fresh_pg_db().await;
        let n = 12;
        let mut changes = ChangeSet::default();
        for i in 0..n {
            let (source, group) = (format!("a/n{i}"), format!("b{i}"));
            changes
                .put_links
                .push(mk_link(&format!("l-{i}"), &source, ("a", &group), false));
            changes
                .put_links
                .push(mk_link(&format!("t-{i}"), &source, ("a", &group), true));
            let mut route = mk_route(&format!("r-{i}"), &format!("l-{i}"));
            route.source_node = source;
            changes.put_routes.push(route);
        }
        db.apply(changes).await.expect("the rows");
        let leader = Arc::new(db.with_fence(0));
        let records = (0..n).map(|i| {
            let leader = leader.clone();
            tokio::spawn(async move {
                // Its own link answered, and its neighbour's, which is
                // not its to answer.
                let answer = |id: String| LinkAnswer {
                    link_id: id,
                    ok: true,
                    message: String::new(),
                };
                let answers = [
                    answer(format!("l-{i}")),
                    answer(format!("l-{}", (i + 1) % n)),
                ];
                let marks = [RouteMark {
                    id: format!("r-{i}"),
                    status: RouteStatus::Applied,
                    message: format!("mark {i}"),
                }];
                let answers = if i % 3 == 0 {
                    &answers[1..]
                } else {
                    &answers[..]
                };
                let source = format!("a/n{i}");
                let forgotten = [format!("t-{i}")];
                leader
                    .record_acknowledgement(&source, answers, &marks, &forgotten)
                    .await
            })
        });
        for r in records.collect::<Vec<_>>() {
            r.await.unwrap().expect("recorded");
        }
        let links = db.list_links().await.unwrap();
        assert!(
            links.iter().all(|l| !l.deleted),
            "every tombstone forgotten: {links:?}"
        );
        for l in &links {
            let i: usize = l.link_id[2..].parse().unwrap();
            let expected = match i % 3 {
                0 => LinkStatus::Pending,
                _ => LinkStatus::Connecting,
            };
            assert_eq!(l.status, expected, "{l:?}");
        }
        let routes = db.list_routes().await.unwrap();
        assert_eq!(routes.len(), n);
        for r in &routes {
            assert_eq!(r.status, RouteStatus::Applied, "{r:?}");
            assert_eq!(r.status_msg, format!("mark {}", &r.id[2..]));
        }
    }

    /// A write whose caller gives up while it waits for a row lock (its
    /// future dropped mid-transaction): nothing of it commits, and no
    /// connection is left open inside the transaction, holding locks.
    #[tokio::test]
    async fn pg_a_write_given_up_mid_transaction_leaves_nothing_behind() {
        let db = fresh_pg_db().await;
        // A transaction of its own: a reconcile's record goes with others
        // (group commit), and its batch is not the caller's to give up.
        let (holder, answer) = answer_behind_a_lock(&db, "failed", Answer::Marked).await;
        answer.abort();
        assert!(answer.await.unwrap_err().is_cancelled());
        holder.batch_execute("COMMIT").await.unwrap();
        // Once the lock is free, the given-up statement runs out and its
        // backend must not stay inside its transaction. The server ends
        // such a session itself after 30 s (the idle-in-transaction
        // timeout slim-cp sets): the wait is bounded well below that.
        let stuck = "(state LIKE 'idle in transaction%' OR wait_event_type = 'Lock')";
        until_backends(&db, stuck, 0, Duration::from_secs(10)).await;
        let links = db.list_links().await.expect("the store still works");
        assert_eq!(
            links[0].status,
            LinkStatus::Failed,
            "the answer never committed"
        );
    }

    #[tokio::test]
    async fn pg_fenced_writes_fail_once_the_epoch_moves() {
        let db = fresh_pg_db().await;
        let leader = db.with_fence(0);
        leader
            .put_link(mk_link("l-1", "a/n1", ("a", "b"), false))
            .await
            .expect("epoch 0 stands");
        sql(&db, "UPDATE leadership SET epoch = 1").await;
        let err = leader.delete_link("l-1").await.unwrap_err();
        assert_eq!(
            err,
            StoreError::Fenced {
                epoch: 0,
                current: 1
            }
        );
        assert_eq!(db.list_links().await.unwrap().len(), 1, "nothing written");
        leader
            .begin_session(mk_registration("a/n1"), owner())
            .await
            .expect("facts are not fenced");
        assert!(db.with_fence(1).delete_link("l-1").await.unwrap());
    }

    #[tokio::test]
    async fn pg_schema_checks_refuse_newer_and_missing_migrations() {
        let db = fresh_pg_db().await;
        let url = pg_url_for(db.name());
        PgStore::check_schema(&url).await.expect("freshly migrated");
        sql(&db, "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
                  VALUES (99991231000000, 'from the future', true, '\\x00', 0)").await;
        let err = PgStore::check_schema(&url).await.unwrap_err();
        assert!(
            matches!(
                err,
                SetupError::SchemaNewer {
                    applied: 99991231000000,
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            PgStore::migrate(&url).await.is_err(),
            "an older binary does not migrate it either"
        );
        sql(&db, "DELETE FROM _sqlx_migrations").await;
        let err = PgStore::check_schema(&url).await.unwrap_err();
        assert!(matches!(err, SetupError::SchemaPending(_)), "{err}");
    }

    #[tokio::test]
    async fn pg_a_vanished_database_is_unavailable_promptly() {
        let db = fresh_pg_db().await;
        db.list_nodes().await.expect("a pooled connection exists");
        let (admin, conn) = tokio_postgres::connect(&admin_url(), NoTls).await.unwrap();
        tokio::spawn(conn);
        let drop_it = format!("DROP DATABASE {} WITH (FORCE)", db.name());
        admin.batch_execute(&drop_it).await.unwrap();
        let started = Instant::now();
        let err = db.list_nodes().await.unwrap_err();
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        assert!(db.metrics().ops["list_nodes"].unavailable >= 1);
    }

    #[tokio::test]
    async fn pg_an_unreachable_server_fails_connect() {
        let started = Instant::now();
        let err = PgStore::connect("postgres://postgres@127.0.0.1:1/x", 2)
            .await
            .unwrap_err();
        assert!(matches!(err, SetupError::Connect(_)), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    /// The server processes of database `db`'s sessions.
    async fn backend_pids(db: &str) -> BTreeSet<i32> {
        let (client, connection) = tokio_postgres::connect(&admin_url(), NoTls)
            .await
            .expect("admin connects");
        tokio::spawn(connection);
        let rows = client
            .query(
                "SELECT pid FROM pg_stat_activity WHERE datname = $1",
                &[&db],
            )
            .await
            .expect("pg_stat_activity answers");
        rows.iter().map(|r| r.get(0)).collect()
    }

    #[tokio::test]
    async fn pg_the_pools_open_in_full_and_a_whole_table_read_does_not_keep_its_connection() {
        let db = fresh_pg_db().await;
        // The test database's own store holds sessions of its own.
        let others = backend_pids(db.name()).await;
        let store = own_store(&db, 2).await;
        let pooled: BTreeSet<i32> = backend_pids(db.name())
            .await
            .difference(&others)
            .copied()
            .collect();
        assert_eq!(pooled.len(), 2, "the pool opened in full before any use");
        store.get_node("a/n1").await.expect("a read");
        assert_eq!(
            backend_pids(db.name()).await,
            &others | &pooled,
            "reads reuse the pool"
        );
        store.list_routes().await.expect("a whole table");
        let patience = Duration::from_secs(10);
        let probe = || backend_pids(db.name());
        // The server ends the backend once the client has closed it.
        let closed = |now: &BTreeSet<i32>| !pooled.is_subset(now);
        eventually(
            "the whole-table read's connection stayed",
            patience,
            probe,
            closed,
        )
        .await;
        // Two reads at once need two connections: the idle one and one
        // opened in place of the closed one.
        let (a, b) = tokio::join!(store.get_node("a/n1"), store.get_node("a/n2"));
        a.and(b).expect("the pool serves again");
        let base = others.len();
        let whole = |n: usize| move |now: &BTreeSet<i32>| now.len() == base + n;
        eventually(
            "no connection took the closed one's place",
            patience,
            probe,
            whole(2),
        )
        .await;
        store.open_leader_pool().await;
        eventually(
            "the leader's pool did not open in full",
            patience,
            probe,
            whole(4),
        )
        .await;
    }

    #[tokio::test]
    async fn pg_a_large_change_set_is_written_whole_and_its_connection_stays_pooled() {
        let db = fresh_pg_db().await;
        let others = backend_pids(db.name()).await;
        let store = own_store(&db, 1).await;
        let pooled = backend_pids(db.name()).await;
        assert_eq!(pooled.len(), others.len() + 1, "one pooled connection");
        // More rows than a statement takes: written in several.
        let routes: Vec<Route> = (0..2500)
            .map(|i| mk_route(&format!("r{i:05}"), "l1"))
            .collect();
        let ids: Vec<String> = routes.iter().map(|r| r.id.clone()).collect();
        let put = ChangeSet {
            fresh: slim_cp::store::Fresh {
                routes: ids.iter().cloned().collect(),
                ..Default::default()
            },
            put_routes: routes,
            ..Default::default()
        };
        store.apply(put).await.expect("the routes");
        // A connection closed after the write would be replaced by a new
        // one, opened before this read could run on the pool of one.
        store.get_node("a/n1").await.expect("a read");
        assert_eq!(
            backend_pids(db.name()).await,
            pooled,
            "the write's connection stayed"
        );
        let delete = ChangeSet {
            delete_routes: ids[..1500].to_vec(),
            ..Default::default()
        };
        store.apply(delete).await.expect("the deletes");
        let left: Vec<String> = (store.routes_sourced("a/n1").await)
            .expect("the rest")
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(left, ids[1500..], "every put landed, then every delete");
        assert_eq!(
            backend_pids(db.name()).await,
            pooled,
            "the deletes' connection stayed"
        );
    }

    /// A fleet table's counters, as the test database's statistics say
    /// (a backend reports them as it ends, or within seconds of going idle).
    #[derive(Debug)]
    struct TableStats {
        table: String,
        seq_scans: i64,
        index_scans: i64,
        inserted: i64,
        updated: i64,
    }

    /// The statistics of `links`, `nodes` and `routes`, in that order.
    async fn table_stats(db: &PgTestDb) -> Vec<TableStats> {
        let rows = (db.client().await)
            .query(
                "SELECT relname::text, seq_scan, coalesce(idx_scan, 0), n_tup_ins, n_tup_upd \
                 FROM pg_stat_user_tables WHERE relname IN ('nodes', 'links', 'routes') \
                 ORDER BY relname",
                &[],
            )
            .await
            .expect("pg_stat_user_tables answers");
        let stats = |r: &tokio_postgres::Row| TableStats {
            table: r.get(0),
            seq_scans: r.get(1),
            index_scans: r.get(2),
            inserted: r.get(3),
            updated: r.get(4),
        };
        rows.iter().map(stats).collect()
    }

    /// Status writes find their rows by key, not by reading the table:
    /// each kind runs more often than a connection plans it afresh (the
    /// sixth run of a statement may take the connection's generic plan).
    #[tokio::test]
    async fn pg_status_writes_on_large_tables_never_scan_them() {
        let db = fresh_pg_db().await;
        let store = Arc::new(own_store(&db, 1).await);
        let starts: Vec<_> = (0..400)
            .map(|i| {
                let (store, node) = (store.clone(), format!("a/n{i:03}"));
                tokio::spawn(
                    async move { store.begin_session(mk_registration(&node), owner()).await },
                )
            })
            .collect();
        let mut sessions = Vec::new();
        for started in starts {
            sessions.push(started.await.unwrap().expect("a start").session.id);
        }
        let links: Vec<Link> = (0..1000)
            .map(|i| {
                let (id, source) = (format!("l{i:04}"), format!("a/n{:03}", i % 400));
                // One live link per group pair: a pair each.
                mk_link(&id, &source, ("a", &format!("g{i}")), false)
            })
            .collect();
        let routes: Vec<Route> = (0..3000)
            .map(|i| mk_route(&format!("r{i:04}"), &format!("l{:04}", i % 1000)))
            .collect();
        let put = ChangeSet {
            put_links: links,
            put_routes: routes,
            ..Default::default()
        };
        store.apply(put).await.expect("links and routes");
        // A backend reports its statistics as it ends.
        drop(store);
        let patience = Duration::from_secs(30);
        let inserted = |t: &Vec<TableStats>| {
            t.iter().map(|s| s.inserted).collect::<Vec<_>>() == [1000, 400, 3000]
        };
        let probe = || table_stats(&db);
        eventually("the setup's statistics", patience, probe, inserted).await;
        let before = table_stats(&db).await;
        let store = own_store(&db, 1).await;
        for round in 0..8 {
            let node = |k: usize| format!("a/n{:03}", round * 2 + k);
            let marks: Vec<RouteMark> = (0..10)
                .map(|k| RouteMark {
                    id: format!("r{:04}", round * 10 + k),
                    status: RouteStatus::Applied,
                    message: String::new(),
                })
                .collect();
            assert_eq!(store.mark_routes(&marks).await.expect("marks"), 10);
            let answer = LinkAnswer {
                link_id: format!("l{:04}", round * 2),
                ok: true,
                message: String::new(),
            };
            let sent = store.mark_links_sent(&node(0), &[answer]).await;
            assert_eq!(sent.expect("an answer"), 1);
            let (first, second) = (round * 2, round * 2 + 1);
            let ready = store.mark_ready(&node(0), sessions[first]).await;
            assert!(ready.expect("ready"));
            let (claimant, claims) = (node(1), [format!("l{:04}", round)]);
            let received = store.record_received(&claimant, sessions[second], &claims);
            received.await.expect("a claim");
        }
        drop(store);
        // 80 routes, 8 links and 8 + 8 nodes written: their statistics are in.
        let updated = |t: &Vec<TableStats>| {
            let counts = t.iter().map(|s| s.updated);
            counts.zip([8, 16, 80]).all(|(n, want)| n >= want)
        };
        eventually("the writes' statistics", patience, probe, updated).await;
        let after = table_stats(&db).await;
        for (b, a) in before.iter().zip(&after) {
            let t = &a.table;
            assert_eq!(
                a.seq_scans, b.seq_scans,
                "{t} was read whole: {b:?} then {a:?}"
            );
            assert!(
                a.index_scans > b.index_scans,
                "{t} was not read by key: {b:?} then {a:?}"
            );
        }
    }

    #[tokio::test]
    async fn pg_facts_written_together_are_answered_one_by_one() {
        let db = fresh_pg_db().await;
        let store = db.store();
        let mut sessions = Vec::new();
        for i in 0..20 {
            let node = format!("a/n{i}");
            let s = store.begin_session(mk_registration(&node), owner()).await;
            sessions.push((node, s.unwrap().session.id));
        }
        // Node 7's claim names a session it does not have.
        sessions[7].1 = uuid::Uuid::new_v4();
        let claims: Vec<_> = sessions
            .iter()
            .map(|(node, session)| {
                let (store, node, session) = (store.clone(), node.clone(), *session);
                tokio::spawn(async move {
                    let ids = vec![format!("link-{node}"), "shared".to_string()];
                    let first = store.record_received(&node, session, &ids).await;
                    let ready = store.mark_ready(&node, session).await;
                    (first, ready)
                })
            })
            .collect();
        let mut answers = Vec::new();
        for c in claims {
            answers.push(c.await.unwrap());
        }
        for (i, ((node, _), (claimed, ready))) in sessions.iter().zip(answers).enumerate() {
            let rec = db.get_node(node).await.unwrap().unwrap();
            if i == 7 {
                assert!(matches!(claimed, Err(StoreError::StaleSession { .. })));
                assert_eq!(ready, Ok(false));
                assert!(rec.received_links.is_empty());
                continue;
            }
            assert_eq!((claimed, ready), (Ok(()), Ok(true)), "{node}");
            let want = [format!("link-{node}"), "shared".to_string()];
            assert_eq!(rec.received_links, want, "{node}");
            let state = rec.session.map(|s| s.state);
            assert_eq!(state, Some(slim_cp::store::model::SessionState::Ready));
        }
        let m = db.metrics();
        let (claims, readies) = (&m.ops["record_received"], &m.ops["mark_ready"]);
        assert!(claims.calls < 20, "claims not grouped: {claims:?}");
        assert!(readies.calls < 20, "readiness not grouped: {readies:?}");
    }

    /// Registrations that arrive together, of nodes known and new (one of
    /// them twice), each start once, in the order of their generations:
    /// a known node's replaces its session, a new node's replaces
    /// nothing, and the second start of one node replaces the first.
    #[tokio::test]
    async fn pg_registrations_of_known_and_new_nodes_together_each_start() {
        let db = fresh_pg_db().await;
        let store = db.store();
        let mut known = BTreeMap::new();
        for i in 0..10 {
            let node = format!("a/k{i}");
            let start = store.begin_session(mk_registration(&node), owner()).await;
            known.insert(node, start.expect("known node starts").session);
        }
        let before = db.metrics().ops["begin_session"].calls;
        let mut nodes: Vec<String> = known.keys().cloned().collect();
        nodes.extend((0..10).map(|i| format!("a/new{i}")));
        nodes.push("a/new3".into());
        let tasks: Vec<_> = (nodes.iter().cloned())
            .map(|node| {
                let store = store.clone();
                tokio::spawn(async move {
                    let start = store.begin_session(mk_registration(&node), owner()).await;
                    (node, start.expect("begin_session"))
                })
            })
            .collect();
        let mut starts: BTreeMap<String, Vec<_>> = BTreeMap::new();
        for t in tasks {
            let (node, start) = t.await.unwrap();
            starts.entry(node).or_default().push(start);
        }
        let calls = db.metrics().ops["begin_session"].calls - before;
        assert!(
            calls < nodes.len() as u64,
            "not grouped: {calls} transactions"
        );
        for (node, mut of_node) in starts {
            of_node.sort_by_key(|s| s.session.generation);
            let first = known.get(&node);
            assert_eq!(of_node[0].replaced.as_ref(), first, "{node}");
            if let [a, b] = of_node.as_slice() {
                assert_eq!(
                    b.replaced.as_ref(),
                    Some(&a.session),
                    "{node}: second start"
                );
            }
            let last = of_node.last().map(|s| &s.session);
            let rec = db.get_node(&node).await.unwrap().expect("row");
            assert_eq!(rec.session.as_ref(), last, "{node}: the latest start holds");
            assert_eq!(rec.generation, last.map_or(0, |s| s.generation), "{node}");
            assert!(first.is_none_or(|f| f.generation < of_node[0].session.generation));
        }
    }

    #[tokio::test]
    async fn pg_concurrent_registrations_of_one_node_serialize() {
        let db = fresh_pg_db().await;
        let store = db.store();
        let tasks: Vec<_> = (0..12)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(
                    async move { store.begin_session(mk_registration("a/n1"), owner()).await },
                )
            })
            .collect();
        let mut starts = Vec::new();
        for t in tasks {
            starts.push(t.await.unwrap().expect("begin_session"));
        }
        starts.sort_by_key(|s| s.session.generation);
        for pair in starts.windows(2) {
            assert!(pair[0].session.generation < pair[1].session.generation);
            assert_eq!(
                pair[1].replaced.as_ref(),
                Some(&pair[0].session),
                "lock order = generation order"
            );
        }
        assert_eq!(starts[0].replaced, None);
        let rec = db.get_node("a/n1").await.unwrap().unwrap();
        assert_eq!(rec.session.as_ref(), starts.last().map(|s| &s.session));
    }

    /// The table's updates and how many of them were heap-only, once the
    /// statistics show at least `updates` (a backend reports its counts
    /// when it exits: the writes' store must be dropped first).
    async fn updates_of(db: &PgTestDb, table: &str, updates: i64) -> (i64, i64) {
        let client = db.client().await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let row = client
                .query_one(
                    "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = $1",
                    &[&table],
                )
                .await
                .expect("table statistics");
            let counts: (i64, i64) = (row.get(0), row.get(1));
            if counts.0 >= updates || Instant::now() > deadline {
                return counts;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Runs `write` on a store of its own (one connection, so one backend
    /// reports it) and returns the heap-only share of the `updates` it
    /// made to `table`, in percent.
    async fn heap_only_percent<F, Fut>(db: &PgTestDb, table: &str, updates: i64, write: F) -> i64
    where
        F: FnOnce(PgStore) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let (before, hot_before) = updates_of(db, table, 0).await;
        let store = own_store(db, 1).await;
        write(store).await;
        let (after, hot_after) = updates_of(db, table, before + updates).await;
        assert_eq!(after - before, updates, "every row rewritten once");
        (hot_after - hot_before) * 100 / updates
    }

    /// 300 links across 25 groups: enough rows to fill pages, since a page
    /// with room would take a new version at any fillfactor.
    fn many_links() -> Vec<Link> {
        let groups: Vec<String> = (0..25).map(|g| format!("g{g:02}")).collect();
        let mut links = Vec::new();
        for (i, a) in groups.iter().enumerate() {
            for b in &groups[i + 1..] {
                let id = format!("link-{a}-{b}");
                links.push(mk_link(&id, &format!("{a}/n1"), (a, b), false));
            }
        }
        links
    }

    /// A claim rewrites a link without touching an indexed column: with
    /// room on its page the new version is heap-only, and none of the
    /// table's four indexes gets an entry.
    #[tokio::test]
    async fn pg_a_links_status_change_is_written_beside_it_not_into_its_indexes() {
        let db = fresh_pg_db().await;
        let mut links = many_links();
        let planned = ChangeSet {
            put_links: links.clone(),
            ..ChangeSet::default()
        };
        db.apply(planned).await.expect("links planned");
        for l in &mut links {
            l.status = LinkStatus::Applied;
            l.status_msg = "claimed".into();
            l.updated_at = 8;
        }
        let claimed = ChangeSet {
            put_links: links.clone(),
            ..ChangeSet::default()
        };
        let n = links.len() as i64;
        let hot = heap_only_percent(&db, "links", n, |store| async move {
            store.apply(claimed).await.expect("links claimed");
        })
        .await;
        assert!(hot >= 90, "{hot} % of the claims were heap-only");
    }

    /// A registration whose row is about as wide as a real node's (its
    /// listener's metadata): a page then holds a handful of rows, as in a
    /// fleet, rather than dozens of tiny ones.
    fn wide_registration(id: &str) -> Registration {
        let detail = ConnectionDetail {
            endpoint: "10.0.0.1:46357".into(),
            metadata: [("note".to_string(), "x".repeat(600).into())]
                .into_iter()
                .collect(),
            ..ConnectionDetail::default()
        };
        Registration {
            connection_details: vec![detail],
            ..mk_registration(id)
        }
    }

    /// Readiness rewrites a node's session state, no indexed column: with
    /// room on the pages a burst's readiness is written beside the rows,
    /// not into the table's indexes. The marks arrive together, so they
    /// are written in a few transactions, as in a registration burst: a
    /// version replaced in the same transaction cannot be pruned to make
    /// room. At a fillfactor of 70 a third of them found none (65 %
    /// heap-only, checked).
    #[tokio::test]
    async fn pg_a_bursts_readiness_is_written_beside_the_rows_not_into_their_indexes() {
        let db = fresh_pg_db().await;
        let mut sessions = Vec::new();
        for i in 0..300 {
            let node = format!("a/n{i:03}");
            let start = db.begin_session(wide_registration(&node), owner()).await;
            sessions.push((node, start.expect("registered").session.id));
        }
        let n = sessions.len() as i64;
        let hot = heap_only_percent(&db, "nodes", n, |store| async move {
            let marks = (sessions.iter()).map(|(node, session)| store.mark_ready(node, *session));
            let ready = futures_util::future::join_all(marks).await;
            for ((node, _), ready) in sessions.iter().zip(ready) {
                assert!(ready.expect("ready"), "{node}: its session is current");
            }
        })
        .await;
        assert!(hot >= 90, "{hot} % of the readiness updates were heap-only");
    }

    /// An acknowledgement marks a node's routes at once: each mark rewrites
    /// a route's status, no indexed column, so with room on the pages none
    /// of the marks writes into the table's indexes.
    #[tokio::test]
    async fn pg_marking_a_nodes_routes_writes_beside_them_not_into_their_indexes() {
        let db = fresh_pg_db().await;
        let links = many_links();
        let routes: Vec<Route> = links
            .iter()
            .enumerate()
            .map(|(i, l)| mk_route(&format!("r-{i:03}"), &l.link_id))
            .collect();
        let planned = ChangeSet {
            put_links: links,
            put_routes: routes.clone(),
            ..ChangeSet::default()
        };
        db.apply(planned).await.expect("routes planned");
        let marks: Vec<RouteMark> = routes
            .iter()
            .map(|r| RouteMark {
                id: r.id.clone(),
                status: RouteStatus::Applied,
                message: String::new(),
            })
            .collect();
        let n = marks.len() as i64;
        let hot = heap_only_percent(&db, "routes", n, |store| async move {
            let marked = store.mark_routes(&marks).await.expect("routes marked");
            assert_eq!(marked, marks.len(), "every route found");
        })
        .await;
        assert!(hot >= 90, "{hot} % of the marks were heap-only");
    }

    #[tokio::test]
    async fn pg_metrics_count_calls_and_refusals() {
        let db = fresh_pg_db().await;
        let s = db
            .begin_session(mk_registration("a/n1"), owner())
            .await
            .unwrap()
            .session;
        db.mark_ready("a/n1", s.id).await.unwrap();
        let stale = db
            .record_announcements("a/n1", uuid::Uuid::new_v4(), &[], &[])
            .await;
        assert!(matches!(stale, Err(StoreError::StaleSession { .. })));
        // Written with group commit, a stale announcement or claim is that
        // call's answer, not its transaction's failure.
        let claim = db.record_received("a/n1", uuid::Uuid::new_v4(), &[]).await;
        assert!(matches!(claim, Err(StoreError::StaleSession { .. })));
        let m = db.metrics();
        assert_eq!(m.ops["begin_session"].calls, 1);
        assert_eq!(m.ops["mark_ready"].errors, 0);
        let ra = &m.ops["record_announcements"];
        assert_eq!((ra.calls, ra.errors, ra.unavailable), (1, 0, 0));
        let rr = &m.ops["record_received"];
        assert_eq!((rr.calls, rr.errors), (1, 0));
    }
}

#[test]
fn test_database_urls_keep_server_and_parameters() {
    use common::pg::with_database;
    assert_eq!(
        with_database("postgres://postgres@127.0.0.1:5432/postgres", "x"),
        "postgres://postgres@127.0.0.1:5432/x"
    );
    assert_eq!(
        with_database("postgres://u:p@h/db?sslmode=disable", "x"),
        "postgres://u:p@h/x?sslmode=disable"
    );
    assert_eq!(with_database("postgres://h", "x"), "postgres://h/x");
}
