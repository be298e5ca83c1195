//! Three `slim-cp serve` processes on one real Postgres database (a fresh
//! one per test) behind a redispatching load balancer, and what the drills
//! check: who leads under which epoch, what every write was fenced with,
//! and what the simulated nodes hold.

#![allow(dead_code)]

pub mod logs;
pub mod replica;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use slim_cp::proto::sb::ConnectionDirection;
use slim_cp::sim::{Balancer, FleetOptions, SimFleet, SimNodeSpec, SimOptions};
use slim_cp::store::model::{LinkStatus, RouteStatus};
use slim_cp::store::{PgStore, Store as _};
use tokio_postgres::NoTls;

use crate::common::pg::{fresh_pg_database, pg_url_for};
pub use replica::{Placement, ReplicaProc};

/// Bound for what a loaded two-core machine does promptly with processes.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Full mesh between every group.
pub const MESH: &str = "{links: [{group: \"*\", neighbors: [\"*\"]}]}";

pub struct Cluster {
    pub db: String,
    pub url: String,
    /// Reads the shared database the way any replica does.
    pub store: Arc<PgStore>,
    pub replicas: Vec<ReplicaProc>,
    pub lb: Balancer,
    /// The relay credential (from the secret the replicas keep in the database).
    pub token: String,
    pub dir: PathBuf,
}

/// Records, for every statement on links and routes, the epoch the
/// writing transaction was fenced with and the epoch standing then.
const FENCE_AUDIT: &str = "
CREATE TABLE fence_audit (tbl text, writer text, standing bigint);
CREATE FUNCTION fence_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO fence_audit
    SELECT TG_TABLE_NAME, current_setting('slim_cp.epoch', true), epoch
    FROM leadership WHERE singleton;
  RETURN NULL;
END $$;
CREATE TRIGGER links_fence AFTER INSERT OR UPDATE OR DELETE ON links
  FOR EACH STATEMENT EXECUTE FUNCTION fence_audit();
CREATE TRIGGER routes_fence AFTER INSERT OR UPDATE OR DELETE ON routes
  FOR EACH STATEMENT EXECUTE FUNCTION fence_audit();
";

pub async fn sql(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.expect("database");
    tokio::spawn(conn);
    client
}

/// The relay secret the replicas keep in the database, once the first of
/// them has made it (a replica listens before it is stored).
async fn relay_secret(url: &str) -> String {
    let client = sql(url).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let row = client
            .query_opt("SELECT secret FROM cluster_secret", &[])
            .await
            .expect("the secret's table");
        if let Some(row) = row {
            return row.get(0);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the replicas keep no relay secret"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl Cluster {
    /// `n` replicas (`cp-0` ...), started one after the other so `cp-0`
    /// leads first, with `topology` (YAML flow style).
    pub async fn start(n: usize, topology: &str) -> Cluster {
        Cluster::start_placed(n, topology, |_, url| {
            (url.to_string(), Placement::loopback())
        })
        .await
    }

    /// As [`Cluster::start`], with replica `i` placed by `place(i, url)`,
    /// which answers the database URL that replica uses and where it runs.
    pub async fn start_placed(
        n: usize,
        topology: &str,
        mut place: impl FnMut(usize, &str) -> (String, Placement),
    ) -> Cluster {
        let db = fresh_pg_database().await;
        let url = pg_url_for(&db);
        sql(&url)
            .await
            .batch_execute(FENCE_AUDIT)
            .await
            .expect("audit installed");
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("cluster-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("test dir");
        let mut replicas = Vec::new();
        for i in 0..n {
            let (db_url, at) = place(i, &url);
            let mut r = ReplicaProc::placed(&dir, &format!("cp-{i}"), &db_url, topology, at);
            r.spawn();
            replicas.push(r);
        }
        let lb = Balancer::start(replicas.iter().map(ReplicaProc::southbound).collect())
            .await
            .expect("balancer starts");
        let store = Arc::new(PgStore::connect(&url, 4).await.expect("observer connects"));
        let secret = relay_secret(&url).await;
        let cluster = Cluster {
            db,
            url,
            store,
            replicas,
            lb,
            token: slim_cp::cluster::relay::auth::token(&secret),
            dir,
        };
        cluster.leader().await;
        cluster
    }

    pub fn index_of(&self, id: &str) -> usize {
        self.replicas
            .iter()
            .position(|r| r.id == id)
            .unwrap_or_else(|| panic!("no replica {id}"))
    }

    /// Waits for exactly one leader, agreed on by the database and by
    /// every replica that answers; returns its index and epoch.
    pub async fn leader(&self) -> (usize, u64) {
        self.wait("one leader agreed on", || async {
            let term = self.store.leadership().await.map_err(|e| e.to_string())?;
            let leader = term.leader.ok_or("no leader in the database")?;
            let mut leaders = Vec::new();
            for r in &self.replicas {
                if let Some(s) = r.inspect(&self.token).await
                    && s.leader
                {
                    leaders.push((r.id.clone(), s.epoch));
                }
            }
            if leaders == [(leader.id.clone(), term.epoch)] {
                Ok((self.index_of(&leader.id), term.epoch))
            } else {
                Err(format!(
                    "database: {} at {}; replicas: {leaders:?}",
                    leader.id, term.epoch
                ))
            }
        })
        .await
    }

    /// Waits for a leader of an epoch above `epoch`.
    pub async fn next_leader(&self, epoch: u64) -> (usize, u64) {
        self.wait("a new term", || async {
            let (i, e) = Box::pin(self.leader()).await;
            if e > epoch {
                Ok((i, e))
            } else {
                Err(format!("still epoch {e}"))
            }
        })
        .await
    }

    /// Waits until the database names a leader of a term above `epoch`
    /// (the moment a new leader can act: it has bumped the epoch), polled
    /// every 20 ms; the time since `since`.
    pub async fn takeover(&self, epoch: u64, since: std::time::Instant) -> Duration {
        let deadline = since + PATIENCE;
        while std::time::Instant::now() < deadline {
            if let Ok(term) = self.store.leadership().await
                && term.epoch > epoch
                && term.leader.is_some()
            {
                return since.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("no new term\n{}", self.log_tails());
    }

    /// Waits until replica `i` answers `/readyz` with 200.
    pub async fn ready(&self, i: usize) {
        let addr = self.replicas[i].http_addr();
        self.wait("the replica ready", || async {
            match crate::common::http_get(addr, "/readyz").await {
                Ok((200, _)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }

    /// A rolling restart: each replica in turn gets SIGTERM (it drains
    /// and, when leading, hands over), must exit cleanly, is started
    /// again and waited for on `/readyz` before the next. Returns the
    /// slowest handover: from a leader's SIGTERM until the database names
    /// a leader of a higher term.
    pub async fn restart_each(&mut self) -> Duration {
        let mut takeover = Duration::ZERO;
        for i in 0..self.replicas.len() {
            let (leader, epoch) = self.leader().await;
            let term = std::time::Instant::now();
            self.replicas[i].signal("TERM");
            if i == leader {
                takeover = takeover.max(self.takeover(epoch, term).await);
                self.next_leader(epoch).await;
            }
            let exited = self.replicas[i].wait_exit(PATIENCE);
            assert!(
                exited.is_some_and(|s| s.success()),
                "{} exits cleanly on SIGTERM: {exited:?}",
                self.replicas[i].id
            );
            self.replicas[i].spawn();
            self.ready(i).await;
        }
        takeover
    }

    /// Commands refused by the replicas' epoch gates, summed over those
    /// that answer.
    pub async fn fenced(&self) -> u64 {
        let mut total = 0;
        for r in &self.replicas {
            if let Some(s) = r.inspect(&self.token).await {
                total += s.commands_fenced;
            }
        }
        total
    }

    /// Polls `check` for up to [`PATIENCE`]; on timeout panics with its
    /// last word and the replicas' log tails.
    pub async fn wait<T, F, Fut>(&self, what: &str, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let mut last = String::new();
        while tokio::time::Instant::now() < deadline {
            match check().await {
                Ok(v) => return v,
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("timed out waiting for {what}: {last}\n{}", self.log_tails());
    }

    pub fn log_tails(&self) -> String {
        let mut out = String::new();
        for r in &self.replicas {
            let log = r.log();
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            out += &format!("--- {} (logs in {})\n", r.id, self.dir.display());
            for l in tail.iter().rev() {
                out += l;
                out.push('\n');
            }
        }
        out
    }

    /// Statements on links and routes so far, and those not fenced by the
    /// epoch standing when they ran.
    pub async fn fence_audit(&self) -> (i64, Vec<String>) {
        let client = sql(&self.url).await;
        let total: i64 = client
            .query_one("SELECT count(*) FROM fence_audit", &[])
            .await
            .expect("audit")
            .get(0);
        let bad = client
            .query(
                "SELECT tbl || ' by ' || coalesce(nullif(writer, ''), 'no epoch') || \
                   ' while ' || standing FROM fence_audit \
                 WHERE coalesce(nullif(writer, ''), '-1')::bigint <> standing",
                &[],
            )
            .await
            .expect("audit");
        (total, bad.iter().map(|r| r.get(0)).collect())
    }

    /// Waits until replica `i` logs that it stopped leading.
    pub async fn stood_down(&self, i: usize) {
        let r = &self.replicas[i];
        self.wait("the old leader steps down", || async {
            let log = r.log();
            let said = log.contains("lease ran out before a renewal succeeded")
                || log.contains("another replica took over the term")
                || log.contains("the election connection failed");
            if said {
                Ok(())
            } else {
                Err("no step-down logged yet".into())
            }
        })
        .await;
    }

    /// No write was made under an epoch other than the one standing, and
    /// there were writes to judge.
    pub async fn assert_fenced(&self) {
        let (total, bad) = self.fence_audit().await;
        assert!(total > 0, "the audit saw no write at all");
        assert!(
            bad.is_empty(),
            "{} of {total} writes not fenced by the standing epoch: {bad:?}",
            bad.len()
        );
    }

    /// A simulated fleet through the balancer, one connection per node so
    /// the nodes spread over the replicas; every node has an external
    /// endpoint. Waits until all are registered.
    pub async fn fleet(&self, groups: &[&str], per_group: usize) -> SimFleet {
        let mut specs = Vec::new();
        for g in groups {
            for i in 0..per_group {
                let endpoint = format!("127.0.0.1:{}", 40000 + specs.len());
                let mut spec = SimNodeSpec::new(&format!("n{i}"), Some(g), &endpoint);
                spec.external_endpoint = Some(endpoint);
                specs.push(spec);
            }
        }
        let opts = FleetOptions {
            nodes_per_channel: 1,
            node: SimOptions {
                connect_retry_interval: Duration::from_millis(50),
                ..SimOptions::default()
            },
        };
        let fleet = SimFleet::start(&self.lb.url(), specs, opts).expect("fleet starts");
        assert!(
            fleet.wait_all_registered(PATIENCE).await,
            "lost: {:?}",
            fleet.lost()
        );
        fleet
    }

    /// Waits until the fleet is converged, exactly: one Applied link per
    /// pair of `groups` held by both ends and nothing else held, every
    /// name in `names` (last component, announcing group) reachable from
    /// every group over held routes, and one Applied route per non-root
    /// group for each. Returns the live links' ids.
    pub async fn converged(
        &self,
        fleet: &SimFleet,
        groups: usize,
        names: &[(&str, &str)],
    ) -> BTreeSet<String> {
        let pairs = groups * (groups - 1) / 2;
        self.wait("the fleet converged", || async {
            let links = crate::common::scenario::live_links(self.store.as_ref()).await?;
            let ids: BTreeSet<String> = links.iter().map(|l| l.link_id.clone()).collect();
            let applied = links
                .iter()
                .filter(|l| l.status == LinkStatus::Applied)
                .count();
            if links.len() != pairs || applied != pairs {
                return Err(format!(
                    "{} live links, {applied} applied, want {pairs}",
                    links.len()
                ));
            }
            if fleet.lost_count() > 0 {
                return Err(format!("nodes lost: {:?}", fleet.lost()));
            }
            held_exactly(fleet, &links)?;
            let routes = self.store.list_routes().await.map_err(|e| e.to_string())?;
            for (name, group) in names {
                let mine: Vec<_> = routes
                    .iter()
                    .filter(|r| r.name.components[2] == *name)
                    .collect();
                let ok = mine.len() == groups - 1
                    && mine.iter().all(|r| r.status == RouteStatus::Applied);
                if !ok {
                    return Err(format!(
                        "{name}: {} routes, want {} applied",
                        mine.len(),
                        groups - 1
                    ));
                }
                let missing = crate::common::reach::unreachable(fleet, name, &[group]);
                if !missing.is_empty() {
                    return Err(format!("{name} unreachable from {missing:?}"));
                }
            }
            Ok(ids)
        })
        .await
    }
}

/// Every live link is held by its source (outgoing) and its destination
/// (incoming), and no node holds any other connection.
fn held_exactly(fleet: &SimFleet, links: &[slim_cp::store::model::Link]) -> Result<(), String> {
    let mut want = BTreeSet::new();
    for l in links {
        let dest = l
            .dest_node
            .clone()
            .ok_or(format!("link {} unclaimed", l.link_id))?;
        want.insert((l.source_node.clone(), l.link_id.clone(), false));
        want.insert((dest, l.link_id.clone(), true));
    }
    let mut held = BTreeSet::new();
    for n in fleet.nodes() {
        for c in n.connections() {
            let id = c.link_id.clone().unwrap_or_default();
            let incoming = c.direction == ConnectionDirection::Incoming;
            held.insert((n.effective_id().to_string(), id, incoming));
        }
    }
    if held == want {
        Ok(())
    } else {
        let extra: Vec<_> = held.difference(&want).collect();
        let missing: Vec<_> = want.difference(&held).collect();
        Err(format!(
            "held connections differ: extra {extra:?}, missing {missing:?}"
        ))
    }
}
