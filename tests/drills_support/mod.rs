//! The stage of the real-node drills: three `slim-cp serve` replicas on a
//! fresh Postgres database behind HAProxy (the shipped configuration on
//! loopback), and four real upstream `slim` nodes of one release line
//! dialling HAProxy: `g1/a1` and `g1/a2`, `g2/b1` and `g2/b2`, each the
//! static peer of its group's other node. The replicas' topology is a full
//! mesh, so the groups get one link, carried by one gateway in each group.
//! The publisher app runs on `g2`'s gateway (routes are installed on
//! gateways); the subscriber on a `g1` node, by default the one that is
//! not the gateway, so every message crosses the link and then the peer
//! connection.
//!
//! What "converged" means here is read from the nodes themselves as well
//! as from the database: see [`Stage::settled`].

pub mod held;
pub mod report;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use slim_cp::store::Store as _;
use slim_cp::store::model::{LinkStatus, SessionState};

use crate::cluster_support::{Cluster, MESH};
use crate::interop_support::{
    App, CtlOutput, Delivery, NodeSpec, Running, SUB_ROUTE, SlimNode, TestDir, free_port, poll,
    slimctl_controller, slimctl_controller_v3, start_delivery,
};
use crate::lb::{Checks, Lb};
pub use held::Link;

/// Messages per delivery round.
pub const MSGS: u64 = 200;

/// Messages published across a fault: at the 10-30 thousand a second a
/// `bench pub` sends here, a publish that spans the moments after it.
pub const DURING: u64 = 60_000;

/// What came of the [`DURING`] messages published across a fault.
#[derive(Debug, Clone, Copy)]
pub struct Across {
    /// As the subscriber counted them (`None`: it printed no count).
    pub received: Option<u64>,
    /// The publisher's own rate, messages a second.
    pub rate: Option<u64>,
}

/// The prefix of the bench apps' names in a node's `route list`.
const APPS: &str = "bench/test/";

/// The subscriber's group and the publisher's.
pub const SUB_GROUP: &str = "g1";
pub const PUB_GROUP: &str = "g2";

/// Bound for what a loaded two-core machine does with real processes.
pub const PATIENCE: Duration = crate::cluster_support::PATIENCE;

/// The upstream release the nodes and apps run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Line {
    /// 2.0.0-alpha.2, the revision the architecture describes.
    V2,
    /// 3.4.6 (config key `domain_name`, its own `slimctl`).
    V3,
}

impl Line {
    pub fn name(self) -> &'static str {
        match self {
            Line::V2 => "2.0.0-alpha.2",
            Line::V3 => crate::interop_support::V3,
        }
    }

    /// For file names.
    pub fn tag(self) -> &'static str {
        match self {
            Line::V2 => "v2",
            Line::V3 => "v3",
        }
    }

    fn spec(self, group: &str, id: &str) -> NodeSpec {
        let spec = NodeSpec::new(group, id);
        match self {
            Line::V2 => spec,
            Line::V3 => spec.v3(),
        }
    }

    /// `slimctl controller` of this line.
    fn ctl(self, dir: &Path, northbound: &str, args: &[&str]) -> CtlOutput {
        match self {
            Line::V2 => slimctl_controller(dir, northbound, args),
            Line::V3 => slimctl_controller_v3(dir, northbound, args),
        }
    }
}

/// What the fleet looks like once settled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settled {
    /// The one live link, Applied and held at both ends.
    pub link: Link,
    /// Each node's owning replica.
    pub owners: BTreeMap<String, String>,
}

/// Fields drop in order: the nodes and HAProxy go before the replicas,
/// and the test files are kept (or removed) last.
pub struct Stage {
    pub line: Line,
    pub nodes: Vec<SlimNode>,
    pub lb: Lb,
    pub cluster: Cluster,
    /// The fleet before the fault.
    pub before: Settled,
    /// The subscriber's node.
    pub sub: String,
    last_ctl: Mutex<Option<CtlOutput>>,
    pub dir: TestDir,
}

impl Stage {
    /// Starts everything and waits until the fleet is settled; the
    /// subscriber goes on `g1`'s node that is not the gateway.
    pub async fn start(name: &str, line: Line, haproxy: &Path) -> Stage {
        let cluster = Cluster::start(3, MESH).await;
        let dir = TestDir::new(name);
        let lb = Lb::start(haproxy, dir.path(), &cluster.replicas, Checks::Readyz);
        let ports: Vec<u16> = (0..4).map(|_| free_port()).collect();
        let mut nodes = Vec::new();
        // A group's gateway is its first node to register, and HAProxy's
        // `leastconn` spreads the nodes in the order they start (measured:
        // the first and the fourth land on one follower). So `g2/b1`, then
        // `g1/a1`, `g2/b2`, `g1/a2` puts the publisher's gateway and the
        // subscriber's node `g1/a2` on one follower, for the follower
        // drill. Any other spread works too; the drill says what it held.
        for (g, k) in [(1, 0), (0, 0), (1, 1), (0, 1)] {
            let (group, prefix) = [(SUB_GROUP, "a"), (PUB_GROUP, "b")][g];
            let (me, other) = (2 * g + k, 2 * g + 1 - k);
            let spec = line
                .spec(group, &format!("{prefix}{}", k + 1))
                .port(ports[me])
                .peer(&format!("{prefix}{}", 2 - k), ports[other]);
            nodes.push(SlimNode::start(dir.path(), spec, &lb.southbound_url()));
        }
        let mut stage = Stage {
            line,
            nodes,
            lb,
            cluster,
            before: Settled {
                link: Link::default(),
                owners: BTreeMap::new(),
            },
            sub: String::new(),
            last_ctl: Mutex::new(None),
            dir,
        };
        stage.before = stage.wait_settled(&[]).await;
        let gateway = stage.before.link.end_in(SUB_GROUP).to_string();
        stage.sub = stage.other_in(SUB_GROUP, &gateway);
        stage
    }

    /// The node of `group` that is not `id`.
    pub fn other_in(&self, group: &str, id: &str) -> String {
        self.nodes
            .iter()
            .map(SlimNode::full_id)
            .find(|n| held::in_group(n, group) && n != id)
            .unwrap_or_else(|| panic!("no other node than {id} in {group}"))
    }

    /// The publisher's node: `g2`'s gateway before the fault.
    pub fn publisher(&self) -> String {
        self.before.link.end_in(PUB_GROUP).to_string()
    }

    /// `slimctl controller` of the stage's line through HAProxy.
    pub fn ctl(&self, args: &[&str]) -> CtlOutput {
        let out = self
            .line
            .ctl(self.dir.path(), &self.lb.northbound_addr(), args);
        *self.last_ctl.lock().unwrap_or_else(|e| e.into_inner()) = Some(out.clone());
        out
    }

    /// Waits until the fleet is settled with no node on the replicas in
    /// `dead` (indices); panics with the last state after [`PATIENCE`].
    pub async fn wait_settled(&self, dead: &[usize]) -> Settled {
        let dead: Vec<String> = dead
            .iter()
            .map(|&i| self.cluster.replicas[i].id.clone())
            .collect();
        self.cluster
            .wait("the fleet settled", || self.settled(&dead))
            .await
    }

    /// Settled: every node's process runs and its session is ready on a
    /// live replica; the database holds exactly one live link, Applied
    /// and claimed; and the nodes' own connection tables (asked through
    /// HAProxy, so the owning replica asks the node) show that link
    /// outgoing on its source, incoming on its destination and no other
    /// inter-group connection anywhere.
    async fn settled(&self, dead: &[String]) -> Result<Settled, String> {
        let mut owners = BTreeMap::new();
        for n in self
            .cluster
            .store
            .list_nodes()
            .await
            .map_err(|e| e.to_string())?
        {
            let s = n.session.as_ref().ok_or(format!("{}: no session", n.id))?;
            if s.state != SessionState::Ready || dead.contains(&s.owner.id) {
                return Err(format!("{}: {:?} on {}", n.id, s.state, s.owner.id));
            }
            owners.insert(n.id.clone(), s.owner.id.clone());
        }
        let ids: Vec<String> = self.nodes.iter().map(SlimNode::full_id).collect();
        if !owners.keys().eq(ids.iter().collect::<BTreeSet<_>>()) {
            return Err(format!("nodes in the database: {:?}", owners.keys()));
        }
        let links = crate::common::scenario::live_links(self.cluster.store.as_ref()).await?;
        let [l] = links.as_slice() else {
            return Err(format!("{} live links: {links:?}", links.len()));
        };
        let dest = match (&l.dest_node, l.status) {
            (Some(d), LinkStatus::Applied) => d.clone(),
            _ => return Err(format!("link not settled: {l:?}")),
        };
        let link = Link {
            id: l.link_id.clone(),
            source: l.source_node.clone(),
            dest,
        };
        held::held_exactly(self, &ids, &link)?;
        Ok(Settled { link, owners })
    }

    /// Whether every node process still runs (none crashed or gave up).
    pub fn nodes_running(&mut self) -> usize {
        self.nodes
            .iter_mut()
            .map(|n| n.proc().is_running())
            .filter(|running| *running)
            .count()
    }

    /// [`MSGS`] messages from the publisher's node to the subscriber's,
    /// once the publisher's node holds the subscriber's route over `link`.
    pub fn deliver(&self, link: &Link) -> Delivery {
        self.start_delivery(link, MSGS).finish()
    }

    /// Starts `msgs` messages from the publisher's node to the
    /// subscriber's, once the publisher's node holds the subscriber's
    /// route over `link`.
    fn start_delivery(&self, link: &Link, msgs: u64) -> Running {
        let app = |id: &str| {
            App::on(
                self.nodes
                    .iter()
                    .find(|n| n.full_id() == id)
                    .unwrap_or_else(|| panic!("no node {id}")),
            )
        };
        let publisher = self.publisher();
        start_delivery(
            self.dir.path(),
            &app(&self.sub),
            &app(&publisher),
            msgs,
            || {
                let route = poll(PATIENCE, || {
                    let out = self.ctl(&["route", "list", "-n", &publisher]);
                    let t = out.table();
                    let there = t.rows.iter().any(|r| {
                        t.cell(r, "ROUTE").starts_with(SUB_ROUTE) && t.cell(r, "LINK_ID") == link.id
                    });
                    if there { Ok(()) } else { Err(out.to_string()) }
                });
                if let Err(last) = route {
                    panic!("the subscriber's route never reached {publisher}: {last}");
                }
            },
        )
    }

    /// Starts [`DURING`] messages across the fleet's link and returns once
    /// the publisher sends: the fault comes next, while they flow.
    pub fn start_publishing(&self) -> Running {
        let mut running = self.start_delivery(&self.before.link, DURING);
        if let Err(log) = running.wait_publishing(PATIENCE) {
            panic!("the publisher of the messages during the fault never sent: {log}");
        }
        running
    }

    /// Waits for the messages published across a fault to end, then until
    /// their apps' routes over `link` are gone (as after any delivery).
    pub fn finish_publishing(&self, running: Running, link: &Link) -> Across {
        let d = running.finish();
        self.wait_quiet(link);
        Across {
            received: d.received,
            rate: d.pub_rate(),
        }
    }

    /// Delivers and asserts that every message arrived.
    pub fn deliver_all(&self, link: &Link, when: &str) -> u64 {
        let d = self.deliver(link);
        assert_eq!(
            d.received,
            Some(MSGS),
            "{when}: {} -> {}\n{d}",
            self.publisher(),
            self.sub
        );
        assert_eq!(d.pub_exit, Ok(Some(0)), "{when}\n{d}");
        self.wait_quiet(link);
        MSGS
    }

    /// Waits until the finished apps' routes over `link` are gone from
    /// both gateways' own tables (the subscriber's on `g2`'s, the
    /// publisher's own name on `g1`'s): the control plane removed them and
    /// the nodes applied the removals. A fault then meets a quiet fleet,
    /// not the tail of the last delivery: a 3.4.6 node can spend 5 s in
    /// such a removal, waiting for its peer's acknowledgement of the
    /// unsubscription, and reads nothing else from its control stream
    /// meanwhile.
    fn wait_quiet(&self, link: &Link) {
        for end in [&link.source, &link.dest] {
            let quiet = poll(PATIENCE, || {
                let out = self.ctl(&["route", "list", "-n", end]);
                let t = out.table();
                let left = t.rows.iter().any(|r| {
                    t.cell(r, "ROUTE").starts_with(APPS) && t.cell(r, "LINK_ID") == link.id
                });
                if out.ok() && !left {
                    Ok(())
                } else {
                    Err(out.to_string())
                }
            });
            if let Err(last) = quiet {
                panic!("the apps' routes stayed on {end}: {last}");
            }
        }
    }

    /// The fleet settled on the link it started with: same id, same
    /// gateways.
    pub fn assert_same_link(&self, after: &Settled, drill: &str) {
        assert_eq!(
            after.link,
            self.before.link,
            "{drill} [slim {}]: the link (id and gateways) must survive",
            self.line.name()
        );
    }

    /// Everything a reader needs after a failure.
    pub fn report(&self) -> String {
        let mut s = String::from("===== drill failure report =====\n");
        if let Some(out) = &*self.last_ctl.lock().unwrap_or_else(|e| e.into_inner()) {
            s.push_str(&format!("----- last slimctl -----\n{out}\n"));
        }
        s.push_str(&self.cluster.log_tails());
        s.push_str(&self.lb.proc.report(40));
        for n in &self.nodes {
            s.push_str(&n.report(60));
        }
        s
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.report());
        }
    }
}
