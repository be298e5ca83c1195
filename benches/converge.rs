//! Convergence benchmark, run by hand: `cargo bench --bench converge`
//! (quick run: `cargo bench --bench converge -- --nodes 50 --groups 5
//! --names 10 --only slim-cp`).
//!
//! Each control plane runs as a separate process (so its memory can be
//! read from /proc) with a full-mesh config on free loopback ports; a
//! simulated fleet in this process registers, announces names, and is
//! watched until what the nodes HOLD is converged: one live link per group
//! pair and, per name, one route at each non-root group's gateway. No API
//! is asked: a control plane that reports Applied but did not get the
//! state onto the nodes has not converged.

#![forbid(unsafe_code)]

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use slim_cp::proto::sb::{ConnectionDirection, ConnectionType};
use slim_cp::sim::{FleetOptions, SimFleet, SimNodeSpec, SimOptions};

/// How often the fleet is inspected: the time resolution of a result.
const POLL: Duration = Duration::from_millis(50);
/// How often progress (counts over time) is printed while waiting.
const PROGRESS: Duration = Duration::from_secs(10);
/// After convergence, how long the state must stay converged (a control
/// plane that converges and then churns links is not done).
const SETTLE: Duration = Duration::from_secs(3);
const DEFAULT_SIZES: [Size; 2] = [
    Size {
        nodes: 200,
        groups: 20,
        names: 50,
    },
    Size {
        nodes: 1000,
        groups: 50,
        names: 100,
    },
];

#[derive(Clone, Copy, Debug)]
struct Size {
    nodes: usize,
    groups: usize,
    names: usize,
}

impl Size {
    fn pairs(&self) -> usize {
        self.groups * (self.groups - 1) / 2
    }
    fn label(&self) -> String {
        format!("{}/{}/{}", self.nodes, self.groups, self.names)
    }
    /// Name k is announced by one node of group k % groups, walking
    /// through that group's nodes so announcers are spread, not piled up.
    fn announcer(&self, k: usize) -> usize {
        let per_group = self.nodes.div_ceil(self.groups);
        let i = k % self.groups + self.groups * ((k / self.groups) % per_group);
        if i < self.nodes { i } else { k % self.groups }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    SlimCp,
    Reference,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::SlimCp => "slim-cp",
            Kind::Reference => "reference",
        }
    }
}

struct Args {
    sizes: Vec<Size>,
    only: Option<Kind>,
    timeout: Option<Duration>,
    log_level: String,
    slim_cp: Option<PathBuf>,
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        sizes: Vec::new(),
        only: None,
        timeout: None,
        log_level: "info".into(),
        slim_cp: None,
    };
    let (mut nodes, mut groups, mut names) = (None, None, None);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        // cargo bench passes `--bench` to harness = false targets.
        if flag == "--bench" {
            continue;
        }
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--nodes" => nodes = Some(value()?.parse::<usize>()?),
            "--groups" => groups = Some(value()?.parse::<usize>()?),
            "--names" => names = Some(value()?.parse::<usize>()?),
            "--timeout" => a.timeout = Some(Duration::from_secs(value()?.parse()?)),
            "--log-level" => a.log_level = value()?,
            "--slim-cp" => a.slim_cp = Some(PathBuf::from(value()?)),
            "--only" => {
                a.only = Some(match value()?.as_str() {
                    "slim-cp" => Kind::SlimCp,
                    "reference" => Kind::Reference,
                    other => bail!("--only takes slim-cp or reference, not {other}"),
                })
            }
            other => bail!(
                "unknown argument {other} (flags: --nodes N --groups G --names K --only slim-cp|reference --timeout SECS --log-level LEVEL --slim-cp PATH)"
            ),
        }
    }
    if nodes.is_some() || groups.is_some() || names.is_some() {
        let s = Size {
            nodes: nodes.unwrap_or(50),
            groups: groups.unwrap_or(5),
            names: names.unwrap_or(10),
        };
        if s.groups < 2 || s.nodes < s.groups {
            bail!("need at least 2 groups and one node per group");
        }
        a.sizes.push(s);
    } else {
        a.sizes.extend(DEFAULT_SIZES);
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

fn start_cp(
    kind: Kind,
    bin: &Path,
    dir: &Path,
    tag: &str,
    log_level: &str,
) -> Result<ControlPlane> {
    let (nb, sb) = (free_port()?, free_port()?);
    let yaml = format!(
        "tracing:\n  log_level: {log_level}\n\
         northbound:\n  endpoint: \"127.0.0.1:{nb}\"\n  tls:\n    insecure: true\n\
         southbound:\n  endpoint: \"127.0.0.1:{sb}\"\n  tls:\n    insecure: true\n\
         database:\n  type: in_memory\n\
         topology:\n  links:\n    - group: \"*\"\n      neighbors: [\"*\"]\n\
         reconciler:\n  max_requeues: 15\n  base_retry_delay: \"200ms\"\n  reconcile_period: \"60s\"\n  workers: 4\n"
    );
    let config = dir.join(format!("{tag}.yaml"));
    std::fs::write(&config, yaml)?;
    let log = std::fs::File::create(dir.join(format!("{tag}.log")))?;
    let mut cmd = Command::new(bin);
    if kind == Kind::SlimCp {
        cmd.arg("serve");
    }
    // RUST_LOG would override the config's log level in slim-cp only.
    cmd.arg("--config")
        .arg(&config)
        .current_dir(dir)
        .env_remove("RUST_LOG");
    cmd.stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let mut cp = ControlPlane {
        child: cmd
            .spawn()
            .with_context(|| format!("spawn {}", bin.display()))?,
        southbound: sb,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let listening = |p: u16| TcpStream::connect(("127.0.0.1", p)).is_ok();
    while !(listening(nb) && listening(sb)) {
        if let Some(status) = cp.child.try_wait()? {
            bail!(
                "{} exited at start ({status}); see {}",
                kind.label(),
                dir.join(format!("{tag}.log")).display()
            );
        }
        if Instant::now() > deadline {
            bail!("{} not listening after 30 s", kind.label());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(cp)
}

/// (VmHWM, VmRSS) of a process in MB.
fn memory_mb(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |key: &str| {
        let line = status.lines().find(|l| l.starts_with(key));
        line.and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    (kb("VmHWM:") / 1024.0, kb("VmRSS:") / 1024.0)
}

/// What the fleet holds at one instant.
#[derive(Debug, Default, Clone)]
struct Counts {
    /// Distinct link ids of outgoing remote connections.
    links_out: usize,
    /// Of those, ones also held as incoming by a node of another group.
    links_live: usize,
    /// Distinct group pairs the live links join.
    pairs: usize,
    /// Names with exactly one route at each non-root group's gateway.
    names_done: usize,
    /// Routes (node, link) held for announced names.
    routes: usize,
    registered: usize,
    lost: usize,
}

impl Counts {
    fn converged(&self, s: Size) -> bool {
        let p = s.pairs();
        self.links_out == p && self.links_live == p && self.pairs == p && self.names_done == s.names
    }
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "registered {} lost {} | links out {} live {} pairs {} | routes {} names done {}",
            self.registered,
            self.lost,
            self.links_out,
            self.links_live,
            self.pairs,
            self.routes,
            self.names_done
        )
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
            let Some(link) = c.link_id.filter(|_| c.conn_type == ConnectionType::Remote) else {
                continue;
            };
            seen.insert(link.clone());
            match c.direction {
                ConnectionDirection::Outgoing => {
                    out.insert(link, group.clone());
                }
                ConnectionDirection::Incoming => inc.entry(link).or_default().push(group.clone()),
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
    let names_done = (0..s.names)
        .filter(|k| {
            let root = format!("g{}", k % s.groups);
            let routes = held
                .get(&format!("name{k}"))
                .map(Vec::as_slice)
                .unwrap_or_default();
            let groups: HashSet<&String> = routes.iter().map(|(g, _)| g).collect();
            routes.len() == s.groups - 1
                && groups.len() == s.groups - 1
                && !groups.contains(&root)
                && routes.iter().all(|(_, l)| live.contains(l.as_str()))
        })
        .count();
    Counts {
        links_out: out.len(),
        links_live: live.len(),
        pairs: pairs.len(),
        names_done,
        routes: (0..s.names)
            .filter_map(|k| held.get(&format!("name{k}")))
            .map(Vec::len)
            .sum(),
        registered: fleet.registered_count(),
        lost: fleet.lost_count(),
    }
}

/// One (fleet, control plane) result.
struct Outcome {
    size: Size,
    kind: Kind,
    /// Time to convergence, or None when it did not converge in time.
    time: Option<Duration>,
    commands: u64,
    hwm_mb: f64,
    rss_mb: f64,
    lost: usize,
    duplicates: usize,
    stable: bool,
    last: Counts,
}

async fn run(kind: Kind, bin: &Path, s: Size, dir: &Path, args: &Args) -> Result<Outcome> {
    let tag = format!("{}-{}n", kind.label(), s.nodes);
    let cp = start_cp(kind, bin, dir, &tag, &args.log_level)?;
    let pid = cp.child.id();
    let specs = (0..s.nodes)
        .map(|i| {
            // Endpoints are only names in the simulated network.
            let ep = format!("10.{}.{}.{}:46357", i / 65536, (i / 256) % 256, i % 256);
            let mut spec =
                SimNodeSpec::new(&format!("n{i}"), Some(&format!("g{}", i % s.groups)), &ep);
            spec.external_endpoint = Some(ep);
            spec
        })
        .collect();
    let opts = FleetOptions {
        nodes_per_channel: 32,
        node: SimOptions::default(),
    };
    let default_timeout = if kind == Kind::Reference { 400 } else { 300 };
    let timeout = args.timeout.unwrap_or(Duration::from_secs(default_timeout));
    println!(
        "--- {} on {} nodes / {} groups / {} names (bound {} s, log {}) ---",
        kind.label(),
        s.nodes,
        s.groups,
        s.names,
        timeout.as_secs(),
        dir.join(format!("{tag}.log")).display()
    );
    let t0 = Instant::now();
    let fleet = SimFleet::start(&format!("http://127.0.0.1:{}", cp.southbound), specs, opts)?;
    // Apps subscribe at boot; the node replays them once registered.
    for k in 0..s.names {
        fleet.nodes()[s.announcer(k)].announce(["bench", "ns", &format!("name{k}")])?;
    }
    let mut seen = HashSet::new();
    let mut next_progress = PROGRESS;
    let (time, mut last) = loop {
        let c = observe(&fleet, s, &mut seen);
        let elapsed = t0.elapsed();
        if c.converged(s) {
            break (Some(elapsed), c);
        }
        if elapsed >= timeout {
            println!("  DID NOT CONVERGE in {:.0} s: {c}", elapsed.as_secs_f64());
            break (None, c);
        }
        if elapsed >= next_progress {
            println!(
                "  {:>6.1} s  {c}  cmds {}",
                elapsed.as_secs_f64(),
                fleet.commands_received()
            );
            next_progress += PROGRESS;
        }
        tokio::time::sleep(POLL).await;
    };
    let (hwm_mb, rss_mb) = memory_mb(pid);
    let commands = fleet.commands_received();
    let mut stable = true;
    if let Some(t) = time {
        println!(
            "  converged at {:.2} s: {last}  cmds {commands}",
            t.as_secs_f64()
        );
        let settle_end = Instant::now() + SETTLE;
        while Instant::now() < settle_end {
            tokio::time::sleep(POLL).await;
            last = observe(&fleet, s, &mut seen);
            stable &= last.converged(s);
        }
        println!(
            "  after {} s more: {} ({last})  cmds {}",
            SETTLE.as_secs(),
            if stable {
                "still converged"
            } else {
                "NOT STABLE"
            },
            fleet.commands_received()
        );
    }
    let lost = fleet.lost_count();
    if lost > 0 {
        println!(
            "  LOST NODES: {:?}",
            fleet.lost().into_iter().take(5).collect::<Vec<_>>()
        );
    }
    drop(fleet);
    drop(cp);
    Ok(Outcome {
        size: s,
        kind,
        time,
        commands,
        hwm_mb,
        rss_mb,
        lost,
        duplicates: seen.len().saturating_sub(s.pairs()),
        stable,
        last,
    })
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpu
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("?")
        .trim()
        .to_string();
    let mem = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let total = mem
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "machine: nproc {nproc}, {model}, {:.1} GiB memory",
        total / 1024.0 / 1024.0
    )
}

fn slim_cp_bin(args: &Args) -> Option<PathBuf> {
    if let Some(p) = &args.slim_cp {
        return Some(p.clone());
    }
    // Cargo builds the crate's binaries for benches, in the bench profile.
    if let Some(p) = option_env!("CARGO_BIN_EXE_slim-cp")
        .map(PathBuf::from)
        .filter(|p| p.is_file())
    {
        return Some(p);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    ["release", "debug"]
        .iter()
        .map(|p| root.join(p).join("slim-cp"))
        .find(|p| p.is_file())
}

fn reference_bin() -> Option<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("SLIM_UPSTREAM_DIR").filter(|d| !d.is_empty()) {
        dirs.push(PathBuf::from(d).join("bin"));
    }
    if let Some(h) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        dirs.push(PathBuf::from(h).join(".cache/slim-cp/upstream/bin"));
    }
    dirs.into_iter()
        .map(|d| d.join("slim-control-plane"))
        .find(|p| p.is_file())
}

fn print_table(rows: &[Outcome]) {
    let head = [
        "nodes",
        "groups",
        "names",
        "control plane",
        "converge s",
        "commands",
        "peak RSS MB",
        "RSS MB",
        "lost",
        "dup links",
        "status",
        "ref/slim time",
        "ref/slim mem",
    ];
    let mut lines = vec![head.map(str::to_string).to_vec()];
    for r in rows {
        let twin = rows
            .iter()
            .find(|o| o.kind == Kind::SlimCp && o.size.label() == r.size.label());
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if r.kind == Kind::Reference && b > 0.0 => format!("{:.2}x", a / b),
            _ => "-".to_string(),
        };
        let secs = |o: &Outcome| o.time.map(|t| t.as_secs_f64());
        let status = match (r.time, r.stable, r.lost) {
            (None, _, _) => format!("DNF ({})", r.last),
            (_, _, l) if l > 0 => "LOST NODES".to_string(),
            (_, false, _) => "UNSTABLE".to_string(),
            _ => "ok".to_string(),
        };
        lines.push(vec![
            r.size.nodes.to_string(),
            r.size.groups.to_string(),
            r.size.names.to_string(),
            r.kind.label().to_string(),
            secs(r).map_or(">bound".into(), |t| format!("{t:.2}")),
            r.commands.to_string(),
            format!("{:.1}", r.hwm_mb),
            format!("{:.1}", r.rss_mb),
            r.lost.to_string(),
            r.duplicates.to_string(),
            status,
            ratio(secs(r), twin.and_then(secs)),
            ratio(Some(r.hwm_mb), twin.map(|t| t.hwm_mb)),
        ]);
    }
    let widths: Vec<usize> = (0..head.len())
        .map(|c| lines.iter().map(|l| l[c].len()).max().unwrap_or(0))
        .collect();
    for l in &lines {
        let cells: Vec<String> = l
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:>w$}"))
            .collect();
        println!("{}", cells.join("  ").trim_end());
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = parse_args()?;
    println!("{}", machine());
    let dir = std::env::temp_dir().join(format!("slim-cp-converge-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut kinds = Vec::new();
    if args.only != Some(Kind::Reference) {
        let bin = slim_cp_bin(&args).context(
            "no slim-cp binary: run `cargo build --release --bins` first (or pass --slim-cp PATH)",
        )?;
        let profile = if bin.components().any(|c| c.as_os_str() == "debug") {
            "DEBUG build: numbers are not representative"
        } else {
            "release build"
        };
        println!("slim-cp:   {} ({profile})", bin.display());
        kinds.push((Kind::SlimCp, bin));
    }
    if args.only != Some(Kind::SlimCp) {
        match reference_bin() {
            Some(bin) => {
                println!("reference: {}", bin.display());
                kinds.push((Kind::Reference, bin));
            }
            None => println!(
                "reference: slim-control-plane not installed (scripts/install-upstream.sh); skipped"
            ),
        }
    }
    println!(
        "poll every {} ms; configs and logs in {}",
        POLL.as_millis(),
        dir.display()
    );
    let mut rows = Vec::new();
    for s in &args.sizes {
        for (kind, bin) in &kinds {
            rows.push(run(*kind, bin, *s, &dir, &args).await?);
        }
    }
    println!();
    print_table(&rows);
    Ok(())
}
