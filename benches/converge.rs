//! Convergence benchmark, run by hand: `cargo bench --bench converge`
//! (quick: `cargo bench --bench converge -- --nodes 50 --groups 5 --names 10
//! --only slim-cp`; also `--timeout SECS`). Cargo builds `slim-cp` in the
//! bench profile first (`cargo build --release --bins` gives the same one).
//!
//! Each control plane runs as a separate process (so its memory can be read
//! from /proc) with a full-mesh config on free loopback ports; a simulated
//! fleet in this process registers, announces names, and is watched until
//! what the nodes HOLD is converged: one live link per group pair and, per
//! name, one route at each non-root group's gateway. No API is asked: a
//! control plane that reports Applied without getting the state onto the
//! nodes has not converged.

#![forbid(unsafe_code)]

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use slim_cp::proto::sb::{ConnectionDirection, ConnectionType};
use slim_cp::sim::{FleetOptions, SimFleet, SimNodeSpec, SimOptions};

/// Shortest pause between two inspections of the fleet. The pause grows
/// with the inspection's cost so that watching never takes more than a
/// fifth of a core from the fleet and the control plane under test.
const MIN_POLL: Duration = Duration::from_millis(10);
/// How often progress (the counts over time) is printed while waiting.
const PROGRESS: Duration = Duration::from_secs(10);
/// After convergence the state must stay converged this long (a control
/// plane that converges and then churns links is not done).
const SETTLE: Duration = Duration::from_secs(3);
const DEFAULT_SIZES: [Size; 2] = [Size::new(200, 20, 50), Size::new(1000, 50, 100)];

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Size {
    nodes: usize,
    groups: usize,
    names: usize,
}

impl Size {
    const fn new(nodes: usize, groups: usize, names: usize) -> Size {
        Size {
            nodes,
            groups,
            names,
        }
    }
    fn pairs(&self) -> usize {
        self.groups * (self.groups - 1) / 2
    }
    /// Node announcing name k: n{k}, of group k % groups, so announcers
    /// are spread over groups and nodes rather than piled on one.
    fn announcer(&self, k: usize) -> usize {
        if k < self.nodes { k } else { k % self.groups }
    }
}

/// The two control planes, by the names `--only` takes.
const SLIM: &str = "slim-cp";
const REFERENCE: &str = "reference";

#[derive(Default)]
struct Args {
    sizes: Vec<Size>,
    only: Option<String>,
    timeout: Option<Duration>,
}

fn parse_args() -> Result<Args> {
    let mut a = Args::default();
    let mut custom = Size::new(50, 5, 10);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        // cargo bench passes `--bench` to harness = false targets.
        if flag == "--bench" {
            continue;
        }
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--nodes" => custom.nodes = value()?.parse()?,
            "--groups" => custom.groups = value()?.parse()?,
            "--names" => custom.names = value()?.parse()?,
            "--timeout" => a.timeout = Some(Duration::from_secs(value()?.parse()?)),
            "--only" => a.only = Some(value()?).filter(|v| [SLIM, REFERENCE].contains(&&**v)),
            other => bail!("unknown argument {other} (see the header of benches/converge.rs)"),
        }
        if matches!(flag.as_str(), "--nodes" | "--groups" | "--names") {
            a.sizes = vec![custom];
        }
    }
    if a.only.is_none() && std::env::args().any(|a| a == "--only") {
        bail!("--only takes {SLIM} or {REFERENCE}");
    }
    if a.sizes.is_empty() {
        a.sizes.extend(DEFAULT_SIZES);
    } else if custom.groups < 2 || custom.nodes < custom.groups {
        bail!("need at least 2 groups and one node per group");
    }
    Ok(a)
}

/// A control-plane child process, SIGKILLed when dropped.
struct ControlPlane {
    child: Child,
    southbound: u16,
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Starts `bin` on a generated config and waits until both ports listen.
fn start_cp(kind: &str, bin: &Path, dir: &Path, tag: &str) -> Result<ControlPlane> {
    let (nb, sb) = (free_port()?, free_port()?);
    let yaml = format!(
        "tracing:\n  log_level: info\n\
         northbound:\n  endpoint: \"127.0.0.1:{nb}\"\n  tls:\n    insecure: true\n\
         southbound:\n  endpoint: \"127.0.0.1:{sb}\"\n  tls:\n    insecure: true\n\
         database:\n  type: in_memory\n\
         topology:\n  links:\n    - group: \"*\"\n      neighbors: [\"*\"]\n\
         reconciler:\n  max_requeues: 15\n  base_retry_delay: \"200ms\"\n  \
         reconcile_period: \"60s\"\n  workers: 4\n"
    );
    let config = dir.join(format!("{tag}.yaml"));
    std::fs::write(&config, yaml)?;
    let log_path = dir.join(format!("{tag}.log"));
    let log = std::fs::File::create(&log_path)?;
    let mut cmd = Command::new(bin);
    if kind == SLIM {
        cmd.arg("serve");
    }
    // RUST_LOG would override the config's log level, in slim-cp only.
    cmd.args([Path::new("--config"), &config])
        .env_remove("RUST_LOG");
    cmd.current_dir(dir).stdin(Stdio::null());
    cmd.stdout(log.try_clone()?).stderr(log);
    let child = cmd.spawn().context("spawning the control plane")?;
    let mut cp = ControlPlane {
        child,
        southbound: sb,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let listening = |p: u16| TcpStream::connect(("127.0.0.1", p)).is_ok();
    while !(listening(nb) && listening(sb)) {
        let log = log_path.display();
        if let Some(status) = cp.child.try_wait()? {
            bail!("{kind} exited at start ({status}); see {log}");
        }
        if Instant::now() > deadline {
            bail!("{kind} not listening after 30 s; see {log}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(cp)
}

/// The number after `key` in a /proc file (`MemTotal:`, `VmHWM:`...).
fn proc_field(text: &str, key: &str) -> f64 {
    let line = text.lines().find(|l| l.starts_with(key));
    let value = line.and_then(|l| l.split_whitespace().nth(1));
    value.and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
}

/// What the fleet holds at one instant.
#[derive(Debug, Default, Clone)]
struct Counts {
    /// Distinct link ids of outgoing remote connections.
    out: usize,
    /// Of those, ones also held as incoming by a node of another group.
    live: usize,
    /// Distinct group pairs the live links join.
    pairs: usize,
    /// Routes (node, link) held for the announced names.
    routes: usize,
    /// Names with exactly one route at each non-root group's gateway.
    names_done: usize,
    /// Names with at least one route (on a live link) in every non-root
    /// group, duplicates allowed: what "reachable" needs, not "converged".
    names_covered: usize,
    registered: usize,
    lost: usize,
}

impl Counts {
    fn converged(&self, s: Size) -> bool {
        // Every node registered too: links and routes among the groups
        // can be complete while some nodes still wait to register.
        let p = s.pairs();
        self.registered == s.nodes
            && self.out == p
            && self.live == p
            && self.pairs == p
            && self.names_done == s.names
    }
    /// Every pair linked and every name reachable, extra links and routes
    /// allowed (a looser bar, for control planes that leave duplicates).
    fn covered(&self, s: Size) -> bool {
        self.registered == s.nodes && self.pairs == s.pairs() && self.names_covered == s.names
    }
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = self;
        write!(f, "registered {}, lost {}; ", c.registered, c.lost)?;
        write!(f, "links out {} live {} pairs {}; ", c.out, c.live, c.pairs)?;
        write!(f, "routes {}, names done {}", c.routes, c.names_done)?;
        write!(f, " (covered {})", c.names_covered)
    }
}

/// Inspects every node's tables; adds every link id seen to `seen`.
fn observe(fleet: &SimFleet, s: Size, seen: &mut HashSet<String>) -> Counts {
    let mut out: HashMap<String, String> = HashMap::new();
    let mut inc: HashMap<String, Vec<String>> = HashMap::new();
    let mut held: HashMap<String, Vec<(String, String)>> = HashMap::new();
    for node in fleet.nodes() {
        let group = node.spec().group.clone().unwrap_or_default();
        for c in node.connections() {
            let remote = c.conn_type == ConnectionType::Remote;
            let Some(link) = c.link_id.filter(|_| remote) else {
                continue;
            };
            seen.insert(link.clone());
            if c.direction == ConnectionDirection::Outgoing {
                out.insert(link, group.clone());
            } else {
                inc.entry(link).or_default().push(group.clone());
            }
        }
        for r in node.routes() {
            let [_, _, name] = r.name;
            if let Some(link) = r.link_id {
                held.entry(name).or_default().push((group.clone(), link));
            }
        }
    }
    let mut live = HashSet::new();
    let mut pairs = BTreeSet::new();
    for (link, a) in &out {
        if let Some(b) = inc.get(link).and_then(|gs| gs.iter().find(|b| *b != a)) {
            live.insert(link.as_str());
            pairs.insert(if a < b { (a, b) } else { (b, a) });
        }
    }
    let mut c = Counts::default();
    for k in 0..s.names {
        let root = format!("g{}", k % s.groups);
        let held = held.get(&format!("name{k}")).map_or(&[][..], Vec::as_slice);
        let groups: HashSet<&String> = held.iter().map(|(g, _)| g).collect();
        c.routes += held.len();
        let on_live = held.iter().all(|(_, l)| live.contains(l.as_str()));
        let reached = held
            .iter()
            .filter(|(g, l)| *g != root && live.contains(l.as_str()));
        let reached: HashSet<&String> = reached.map(|(g, _)| g).collect();
        c.names_covered += usize::from(reached.len() == s.groups - 1);
        let one_per_group = groups.len() == s.groups - 1 && !groups.contains(&root);
        c.names_done += usize::from(held.len() == s.groups - 1 && one_per_group && on_live);
    }
    (c.registered, c.lost) = (fleet.registered_count(), fleet.lost_count());
    (c.out, c.live, c.pairs) = (out.len(), live.len(), pairs.len());
    c
}

/// One (fleet, control plane) result.
#[derive(Default)]
struct Outcome {
    size: Size,
    kind: &'static str,
    /// Time to convergence, or None when it did not converge in time.
    time: Option<Duration>,
    /// Time until first covered (see `Counts::covered`).
    covered: Option<Duration>,
    commands: u64,
    hwm_mb: f64,
    rss_mb: f64,
    duplicates: usize,
    stable: bool,
    /// The last counts seen (lost nodes included).
    last: Counts,
}

async fn run(kind: &'static str, bin: &Path, s: Size, dir: &Path, args: &Args) -> Result<Outcome> {
    let tag = format!("{kind}-{}n", s.nodes);
    let cp = start_cp(kind, bin, dir, &tag)?;
    let specs = (0..s.nodes).map(|i| {
        // Endpoints are only names in the simulated network.
        let ep = format!("10.{}.{}.{}:46357", i >> 16, (i >> 8) & 255, i & 255);
        let mut spec = SimNodeSpec::new(&format!("n{i}"), Some(&format!("g{}", i % s.groups)), &ep);
        spec.external_endpoint = Some(ep);
        spec
    });
    // 32 nodes share an HTTP/2 connection: 1,000 fit in few descriptors.
    let (nodes_per_channel, node) = (32, SimOptions::default());
    let opts = FleetOptions {
        nodes_per_channel,
        node,
    };
    let bound = if kind == REFERENCE { 400 } else { 300 };
    let timeout = args.timeout.unwrap_or(Duration::from_secs(bound));
    let (n, g, k) = (s.nodes, s.groups, s.names);
    let secs = timeout.as_secs();
    println!("--- {tag}: {n} nodes, {g} groups, {k} names (bound {secs} s) ---");
    // Other work on the machine skews timings: show how busy it was.
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("  load average at start: {}", load.trim());
    let t0 = Instant::now();
    let url = format!("http://127.0.0.1:{}", cp.southbound);
    let fleet = SimFleet::start(&url, specs.collect(), opts)?;
    // Apps subscribe at boot; each node announces once registered.
    for k in 0..s.names {
        fleet.nodes()[s.announcer(k)].announce(["bench", "ns", &format!("name{k}")])?;
    }
    let (mut seen, mut next_progress, mut worst) = (HashSet::new(), PROGRESS, Duration::ZERO);
    let mut o = Outcome {
        size: s,
        kind,
        stable: true,
        ..Outcome::default()
    };
    (o.time, o.last) = loop {
        let started = Instant::now();
        let c = observe(&fleet, s, &mut seen);
        let (elapsed, cost) = (t0.elapsed(), started.elapsed());
        worst = worst.max(cost);
        if o.covered.is_none() && c.covered(s) {
            o.covered = Some(elapsed);
        }
        if c.converged(s) {
            break (Some(elapsed), c);
        }
        let secs = elapsed.as_secs_f64();
        if elapsed >= timeout {
            println!("  DID NOT CONVERGE in {secs:.0} s: {c}");
            break (None, c);
        }
        if elapsed >= next_progress {
            println!("  {secs:>6.1} s  {c}; cmds {}", fleet.commands_received());
            next_progress += PROGRESS;
        }
        tokio::time::sleep(MIN_POLL.max(cost * 4)).await;
    };
    // Right after convergence, before the settle period adds anything.
    let status = std::fs::read_to_string(format!("/proc/{}/status", cp.child.id()))?;
    o.hwm_mb = proc_field(&status, "VmHWM:") / 1024.0;
    o.rss_mb = proc_field(&status, "VmRSS:") / 1024.0;
    o.commands = fleet.commands_received();
    if let Some(t) = o.time {
        let (t, last, cmds) = (t.as_secs_f64(), &o.last, o.commands);
        println!("  converged at {t:.2} s: {last}; cmds {cmds}");
        let end = Instant::now() + SETTLE;
        while Instant::now() < end {
            tokio::time::sleep(MIN_POLL.max(worst * 4)).await;
            o.last = observe(&fleet, s, &mut seen);
            o.stable &= o.last.converged(s);
        }
        let verdict = if o.stable { "still" } else { "NO LONGER" };
        let (more, wait, last) = (fleet.commands_received(), SETTLE.as_secs(), &o.last);
        println!("  {wait} s later: {verdict} converged ({last}); cmds {more}");
    }
    println!("  slowest fleet inspection {} ms", worst.as_millis());
    for (node, why) in fleet.lost().into_iter().take(5) {
        println!("  LOST {node}: {why}");
    }
    drop(fleet);
    drop(cp);
    o.duplicates = seen.len().saturating_sub(s.pairs());
    Ok(o)
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpu.lines().find(|l| l.starts_with("model name"));
    let model = model.and_then(|l| l.split(':').nth(1)).unwrap_or("?");
    let mem = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let gib = proc_field(&mem, "MemTotal:") / 1024.0 / 1024.0;
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = model.trim();
    format!("machine: nproc {nproc}, {model}, {gib:.1} GiB memory")
}

fn reference_bin() -> Option<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("SLIM_UPSTREAM_DIR").filter(|d| !d.is_empty()) {
        dirs.push(PathBuf::from(d).join("bin"));
    }
    if let Some(h) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        dirs.push(PathBuf::from(h).join(".cache/slim-cp/upstream/bin"));
    }
    let bins = dirs.into_iter().map(|d| d.join("slim-control-plane"));
    bins.into_iter().find(|p| p.is_file())
}

/// Columns: fleet, control plane, results, then the reference/slim-cp
/// ratios on the reference's row when both ran.
fn print_table(rows: &[Outcome]) {
    // Column widths; the control plane's name (column 3) is left-aligned.
    const WIDTHS: [usize; 15] = [5, 6, 5, 9, 10, 9, 8, 11, 7, 4, 9, 13, 12, 12, 0];
    let line = |row: &str| {
        let cells = row.split('|').zip(WIDTHS).enumerate();
        let cells = cells.map(|(i, (c, w))| match i {
            3 => format!("{c:<w$}"),
            _ => format!("{c:>w$}"),
        });
        println!("{}", cells.collect::<Vec<_>>().join("  ").trim_end());
    };
    line(
        "nodes|groups|names|cp|converge s|covered s|commands|peak RSS MB|RSS MB|lost|\
         dup links|ref/slim time|ref/slim cov|ref/slim mem|status",
    );
    for r in rows {
        let twin = rows.iter().find(|o| o.kind == SLIM && o.size == r.size);
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if r.kind == REFERENCE => format!("{:.2}x", a / b),
            _ => "-".to_string(),
        };
        let secs = |o: &Outcome| o.time.map(|t| t.as_secs_f64());
        let cov = |o: &Outcome| o.covered.map(|t| t.as_secs_f64());
        let status = match (r.time, r.stable, r.last.lost) {
            (None, _, _) => format!("DID NOT CONVERGE ({})", r.last),
            (_, _, 1..) => "LOST NODES".to_string(),
            (_, false, _) => "UNSTABLE".to_string(),
            _ => "ok".to_string(),
        };
        let shown = |t: Option<f64>| t.map_or(">bound".into(), |t| format!("{t:.2}"));
        let (time, covered) = (shown(secs(r)), shown(cov(r)));
        let Size { nodes, groups, .. } = r.size;
        let (names, kind, cmds, hwm, rss) = (r.size.names, r.kind, r.commands, r.hwm_mb, r.rss_mb);
        let (lost, dups) = (r.last.lost, r.duplicates);
        let t_ratio = ratio(secs(r), twin.and_then(secs));
        let c_ratio = ratio(cov(r), twin.and_then(cov));
        let m_ratio = ratio(Some(hwm), twin.map(|t| t.hwm_mb));
        line(&format!(
            "{nodes}|{groups}|{names}|{kind}|{time}|{covered}|{cmds}|{hwm:.1}|{rss:.1}|{lost}|\
             {dups}|{t_ratio}|{c_ratio}|{m_ratio}|{status}"
        ));
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = parse_args()?;
    println!("{}", machine());
    let dir = std::env::temp_dir().join(format!("slim-cp-converge-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut kinds = Vec::new();
    let wants = |kind: &str| args.only.as_deref().is_none_or(|o| o == kind);
    if wants(SLIM) {
        // Cargo builds the crate's binaries for a bench, in the bench
        // profile (`target/release` unless overridden).
        let slim_cp = PathBuf::from(env!("CARGO_BIN_EXE_slim-cp"));
        let bin = slim_cp.display();
        if !slim_cp.is_file() {
            bail!("no {bin}: run `cargo build --release --bins` first");
        }
        let debug = slim_cp.components().any(|c| c.as_os_str() == "debug");
        let profile = if debug {
            "DEBUG: unrepresentative"
        } else {
            "release"
        };
        println!("slim-cp:   {bin} ({profile})");
        kinds.push((SLIM, slim_cp.clone()));
    }
    if wants(REFERENCE) {
        match reference_bin() {
            Some(bin) => println!("reference: {}", bin.display()),
            None => println!("reference: slim-control-plane not installed; skipped"),
        }
        kinds.extend(reference_bin().map(|b| (REFERENCE, b)));
    }
    println!("configs and logs (log level info): {}", dir.display());
    let mut rows = Vec::new();
    for s in &args.sizes {
        for (kind, bin) in &kinds {
            rows.push(run(kind, bin, *s, &dir, &args).await?);
        }
    }
    println!();
    print_table(&rows);
    Ok(())
}
