//! Harness for interop tests against the real upstream binaries: `slim`
//! data-plane nodes, the `slimctl` CLI and (for side-by-side runs) the
//! reference `slim-control-plane`, all as child processes on loopback.
//!
//! The upstream binaries are built by `scripts/install-upstream.sh`; a test
//! that needs one starts with `require_upstream!("slim", "slimctl")`, which
//! skips the test on a developer machine without them and fails it in CI.

// A toolkit: tests to come (crash, failover, HA) use parts no current
// test does, and each test binary that includes it uses a different part.
#![allow(dead_code, unused_imports)]

mod bench;
mod control_plane;
mod node;
mod process;
mod scenario;
mod slimctl;

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub use bench::{App, Delivery, Running, SUB_ROUTE, deliver_between, start_delivery};
pub use control_plane::{ControlPlane, CpConfig, CpKind};
pub use node::{NodeSpec, SlimNode};
pub use process::Proc;
pub use scenario::Scenario;
pub use slimctl::{
    CtlOutput, Table, slimctl, slimctl_controller, slimctl_controller_v3, spawn_slimctl,
    spawn_slimctl_of,
};

/// Bound for anything that happens promptly on a healthy machine. Generous
/// because CI machines are slow and several tests run at once.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// Skips the test (returns) unless every named upstream binary is
/// installed; in CI (`CI=true`) a missing binary fails the test instead.
macro_rules! require_upstream {
    ($($name:literal),+ $(,)?) => {
        $(
            if !$crate::interop_support::upstream_available($name) {
                return;
            }
        )+
    };
}

/// [`require_upstream!`] for SLIM 3.x binaries (see [`upstream_bin_v3`]).
// Only the 3.x test binaries use it.
#[allow(unused_macros)]
macro_rules! require_upstream_v3 {
    ($($name:literal),+ $(,)?) => {
        $(
            if !$crate::interop_support::upstream_v3_available($name) {
                return;
            }
        )+
    };
}

/// Where an upstream binary is: `$SLIM_UPSTREAM_DIR/bin`, then the
/// default cache `~/.cache/slim-cp/upstream/bin` (the install script's).
pub fn upstream_bin(name: &str) -> Option<PathBuf> {
    upstream_bin_in("bin", name)
}

/// The SLIM 3.x release the `_v3` helpers run.
pub const V3: &str = "3.4.6";

/// Where a SLIM 3.x binary is: the same roots as [`upstream_bin`], in
/// their `3.4.6/bin` folder.
pub fn upstream_bin_v3(name: &str) -> Option<PathBuf> {
    upstream_bin_in(&format!("{V3}/bin"), name)
}

fn upstream_bin_in(folder: &str, name: &str) -> Option<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(root) = std::env::var_os("SLIM_UPSTREAM_DIR").filter(|d| !d.is_empty()) {
        dirs.push(PathBuf::from(root).join(folder));
    }
    if let Some(home) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        dirs.push(
            PathBuf::from(home)
                .join(".cache/slim-cp/upstream")
                .join(folder),
        );
    }
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

/// The path of an upstream binary the test already required.
pub fn upstream(name: &str) -> PathBuf {
    upstream_bin(name).unwrap_or_else(|| panic!("upstream {name} not installed"))
}

/// Whether `name` is installed. Prints the one skip line when it is not,
/// and panics instead in CI, where a missing binary must fail the run
/// rather than pass it silently.
pub fn upstream_available(name: &str) -> bool {
    available(
        upstream_bin(name).is_some(),
        name,
        "scripts/install-upstream.sh",
    )
}

/// [`upstream_available`] for a SLIM 3.x binary.
pub fn upstream_v3_available(name: &str) -> bool {
    let what = format!("{V3} {name}");
    available(
        upstream_bin_v3(name).is_some(),
        &what,
        "scripts/install-upstream.sh --line 3",
    )
}

fn available(found: bool, what: &str, install: &str) -> bool {
    if found {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("upstream {what} not installed (run {install}); with CI=true that fails the test");
    }
    println!("skipped: upstream {what} not installed (run {install})");
    false
}

/// A port on 127.0.0.1 that was free a moment ago. Ports handed out by
/// this process are remembered so that two tests in one binary never get
/// the same one (the kernel may hand a just-closed port out again).
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local addr").port();
        drop(listener);
        if HANDED_OUT
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(port)
        {
            return port;
        }
    }
}

/// Whether something accepts TCP connections on 127.0.0.1:`port`.
pub fn accepts_tcp(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// Polls `check` every 100 ms until it yields `Ok` or `timeout` passes;
/// returns the last error (the state to report) on timeout.
pub fn poll<T>(
    timeout: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(v) => return Ok(v),
            Err(state) if Instant::now() >= deadline => return Err(state),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// A per-test scratch directory under the target dir (configs, logs). It
/// is removed when the test passes and kept, with its path printed, when
/// the test panics, so the logs can be read afterwards.
pub struct TestDir {
    path: PathBuf,
}

impl TestDir {
    pub fn new(name: &str) -> TestDir {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let path = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("interop")
            .join(format!("{name}-{}-{seq}", std::process::id()));
        // A leftover from an earlier run with a recycled pid: start clean.
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create test dir");
        TestDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        // SLIM_CP_KEEP_TEST_DIRS=1 keeps them after a pass too, to read.
        if std::thread::panicking() || std::env::var_os("SLIM_CP_KEEP_TEST_DIRS").is_some() {
            eprintln!("test files kept in {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// The last `lines` lines of a log file, for failure reports.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_else(|e| format!("<cannot read {}: {e}>", path.display()));
    let all: Vec<&str> = text.lines().collect();
    let skip = all.len().saturating_sub(lines);
    let mut out = String::new();
    if skip > 0 {
        out.push_str(&format!("... ({skip} earlier lines)\n"));
    }
    for line in &all[skip..] {
        out.push_str(line);
        out.push('\n');
    }
    out
}
