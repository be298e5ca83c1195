//! The end-to-end proof with real apps: `slimctl bench sub` on one node,
//! `slimctl bench pub` on another, and the count of messages that arrived.
//! A listing that says APPLIED proves nothing; delivered messages do.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::{PATIENCE, Proc, Scenario, SlimNode, Table, poll, spawn_slimctl_of};

/// slimctl's publisher gives up on its session after 35 s; wait a bit more.
const PUB_TIMEOUT: Duration = Duration::from_secs(45);
/// The subscriber exits once it has everything, or 10 s after the last
/// message when some were lost.
const SUB_TIMEOUT: Duration = Duration::from_secs(20);

/// What one run delivered, with both apps' logs for the failure message.
pub struct Delivery {
    pub received: Option<u64>,
    pub pub_exit: Result<Option<i32>, String>,
    pub sub_log: String,
    pub pub_log: String,
}

impl std::fmt::Display for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "received: {:?}, publisher exit: {:?}",
            self.received, self.pub_exit
        )?;
        writeln!(f, "----- bench sub -----\n{}", self.sub_log)?;
        write!(f, "----- bench pub -----\n{}", self.pub_log)
    }
}

impl Scenario {
    /// Runs a subscriber for `msgs` messages on node `to` (`group/id`),
    /// waits until node `from` has a route to it, then publishes `msgs`
    /// from there and reports how many arrived.
    pub fn deliver(&mut self, from: &str, to: &str, msgs: u64) -> Delivery {
        self.deliver_when(from, to, msgs, |_, _| true)
    }

    /// Like [`Scenario::deliver`], but the publisher starts only once the
    /// subscriber's route on node `from` passes `route_ok` (given the
    /// node's `route list` table and the route's row), e.g. once it goes
    /// over a particular link.
    pub fn deliver_when(
        &mut self,
        from: &str,
        to: &str,
        msgs: u64,
        route_ok: impl Fn(&Table, &[String]) -> bool,
    ) -> Delivery {
        let dir = self.dir.path().to_path_buf();
        let sub = App::on(self.node(to));
        let publisher = App::on(self.node(from));
        deliver_between(&dir, &sub, &publisher, msgs, || {
            // The publisher's first session attempt gets through only if
            // the route is already on its node; a miss costs slimctl a
            // ~10 s retry. So wait for the route in the publishing node's
            // own table (asked through the control plane), not just in
            // the control plane's.
            self.wait_for_within(
                PATIENCE,
                "the subscriber's route on the publisher's node",
                || {
                    let out = self.ctl(&["route", "list", "-n", from]);
                    let t = out.table();
                    let there = t
                        .rows
                        .iter()
                        .any(|r| t.cell(r, "ROUTE").starts_with(SUB_ROUTE) && route_ok(&t, r));
                    if there { Ok(()) } else { Err(out.to_string()) }
                },
            );
        })
    }
}

/// The prefix of the subscriber's name in a node's `route list`.
pub const SUB_ROUTE: &str = "bench/test/sub-0";

/// Where an app runs: its node's data-plane URL and release. Each app is
/// the bench of its node's own release: it speaks that node's data-plane
/// protocol, so only the link between the nodes crosses revisions.
pub struct App {
    /// `group/id` of the node.
    pub node: String,
    pub url: String,
    pub v3: bool,
}

impl App {
    pub fn on(node: &SlimNode) -> App {
        App {
            node: node.full_id(),
            url: node.dataplane_url(),
            v3: node.spec.v3,
        }
    }
}

/// Runs a subscriber for `msgs` messages on `sub`'s node, calls
/// `route_ready` (which returns once the publisher's node has the
/// subscriber's route), then publishes `msgs` from `publisher`'s node and
/// reports how many arrived. Logs go to `dir`.
pub fn deliver_between(
    dir: &Path,
    sub: &App,
    publisher: &App,
    msgs: u64,
    route_ready: impl FnOnce(),
) -> Delivery {
    start_delivery(dir, sub, publisher, msgs, route_ready).finish()
}

/// A subscriber and a publisher that are running.
pub struct Running {
    sub: Proc,
    publisher: Proc,
}

/// Starts what [`deliver_between`] runs, without waiting for the end.
pub fn start_delivery(
    dir: &Path,
    sub: &App,
    publisher: &App,
    msgs: u64,
    route_ready: impl FnOnce(),
) -> Running {
    let n = msgs.to_string();
    // The subscriber expects one message more than is sent, so it stays
    // in the session until the publisher closes it. One that leaves as
    // soon as it has everything races the publisher's close, which then
    // waits ~10 s for an ack that never comes.
    let expect = (msgs + 1).to_string();
    // One log pair per run: logs are appended to, and a second run on
    // the same node must not read the first run's count.
    let run = {
        static RUNS: AtomicUsize = AtomicUsize::new(0);
        RUNS.fetch_add(1, Ordering::Relaxed)
    };
    let name = |role: &str| format!("bench-{role}-{}-{run}", sub.node.replace('/', "-"));
    let sub_proc = spawn_slimctl_of(
        sub.v3,
        dir,
        &name("sub"),
        &["bench", "sub", "--server", &sub.url, "-n", &expect],
    );
    route_ready();
    let pub_proc = spawn_slimctl_of(
        publisher.v3,
        dir,
        &name("pub"),
        &["bench", "pub", "--server", &publisher.url, "-n", &n],
    );
    Running {
        sub: sub_proc,
        publisher: pub_proc,
    }
}

impl Running {
    /// Waits until the publisher has its session and sends (its log says
    /// so); `Err` with its log if it has not within `within`.
    pub fn wait_publishing(&mut self, within: Duration) -> Result<(), String> {
        poll(within, || {
            let log = self.publisher.log_text();
            match log.contains("session established") {
                true => Ok(()),
                false => Err(log),
            }
        })
    }

    /// Whether the publisher is still sending.
    pub fn publishing(&mut self) -> bool {
        self.publisher.is_running()
    }

    /// Waits for both apps and reports what arrived.
    pub fn finish(mut self) -> Delivery {
        let pub_exit = self.publisher.wait_exit(PUB_TIMEOUT);
        let _ = self.sub.wait_exit(SUB_TIMEOUT);
        let sub_log = self.sub.log_text();
        Delivery {
            received: received(&sub_log),
            pub_exit,
            sub_log,
            pub_log: self.publisher.log_text(),
        }
    }
}

impl Delivery {
    /// The publisher's own rate, from its `Pub stats: N msgs/sec` line.
    pub fn pub_rate(&self) -> Option<u64> {
        self.pub_log.lines().find_map(|l| {
            let rest = l.trim().strip_prefix("Pub stats:")?;
            let n = rest.split_whitespace().next()?;
            n.replace(',', "").parse().ok()
        })
    }
}

/// The count in the subscriber's `[sub-0] received N messages` line.
fn received(log: &str) -> Option<u64> {
    log.lines().find_map(|l| {
        l.trim()
            .strip_prefix("[sub-0] received ")?
            .strip_suffix(" messages")?
            .parse()
            .ok()
    })
}
