//! A control-plane child process: its generated config, its log, its
//! memory (read from /proc, which is why each runs as its own process) and
//! the signals a drill sends it.

use std::fs::File;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rustix::process::{Pid, Signal, kill_process};

/// How long a process may take to listen after it is started.
const START_BOUND: Duration = Duration::from_secs(30);

pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The number after `key` in a /proc file (`MemTotal:`, `VmHWM:`...).
pub fn proc_field(text: &str, key: &str) -> f64 {
    let line = text.lines().find(|l| l.starts_with(key));
    let value = line.and_then(|l| l.split_whitespace().nth(1));
    value.and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
}

/// `slim-cp` as cargo built it for this bench, with a word on its profile
/// (a debug build's timings mean nothing).
pub fn slim_cp_bin() -> Result<(PathBuf, &'static str)> {
    // Cargo builds the crate's binaries for a bench, in the bench profile
    // (`target/release` unless overridden).
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_slim-cp"));
    if !bin.is_file() {
        bail!(
            "no {}: run `cargo build --release --bins` first",
            bin.display()
        );
    }
    let debug = bin.components().any(|c| c.as_os_str() == "debug");
    Ok((
        bin,
        if debug {
            "DEBUG: unrepresentative"
        } else {
            "release"
        },
    ))
}

/// The config every benchmarked control plane shares, before its
/// `database:` (and `cluster:`) sections: full mesh, info logs.
pub fn base_config(nb: u16, sb: u16) -> String {
    format!(
        "tracing:\n  log_level: info\n\
         northbound:\n  endpoint: \"127.0.0.1:{nb}\"\n  tls:\n    insecure: true\n\
         southbound:\n  endpoint: \"127.0.0.1:{sb}\"\n  tls:\n    insecure: true\n\
         topology:\n  links:\n    - group: \"*\"\n      neighbors: [\"*\"]\n\
         reconciler:\n  max_requeues: 15\n  base_retry_delay: \"200ms\"\n  \
         reconcile_period: \"60s\"\n  workers: 4\n"
    )
}

/// One control-plane process; killed (and continued first, if stopped)
/// when dropped.
pub struct Proc {
    pub name: String,
    cmd: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
}

impl Proc {
    /// `bin args...`, logging to `<dir>/<name>.log`, run in `dir`.
    pub fn new(name: &str, bin: &Path, args: &[&str], dir: &Path) -> Proc {
        let mut cmd = vec![bin.display().to_string()];
        cmd.extend(args.iter().map(|a| a.to_string()));
        Proc {
            name: name.to_string(),
            cmd,
            log: dir.join(format!("{name}.log")),
            child: None,
        }
    }

    /// Starts the process (appending to its log, so restarts keep what came
    /// before) and waits until every port of `ports` listens.
    pub fn start(&mut self, ports: &[u16]) -> Result<()> {
        let log = File::options().create(true).append(true).open(&self.log)?;
        let mut cmd = Command::new(&self.cmd[0]);
        // RUST_LOG would override the config's log level (in slim-cp only);
        // SLIM_CP_BENCH_RUST_LOG sets it on purpose, for profiling a run.
        cmd.args(&self.cmd[1..]).env_remove("RUST_LOG");
        if let Ok(filter) = std::env::var("SLIM_CP_BENCH_RUST_LOG") {
            cmd.env("RUST_LOG", filter);
        }
        cmd.current_dir(self.log.parent().unwrap_or(Path::new(".")));
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = cmd
            .spawn()
            .with_context(|| format!("spawning {}", self.name))?;
        self.child = Some(child);
        self.wait_listening(ports)
    }

    /// Fails if the process exits first, or takes over [`START_BOUND`].
    fn wait_listening(&mut self, ports: &[u16]) -> Result<()> {
        let deadline = Instant::now() + START_BOUND;
        let listening = |p: &u16| TcpStream::connect(("127.0.0.1", *p)).is_ok();
        while !ports.iter().all(listening) {
            let log = self.log.display();
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!("{} exited at start ({status}); see {log}", self.name);
            }
            if Instant::now() > deadline {
                bail!(
                    "{} not listening after {START_BOUND:?}; see {log}",
                    self.name
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `sig` directly (no `kill` process in between: the drills time
    /// what follows it to the millisecond).
    pub fn signal(&self, sig: Signal) -> Result<()> {
        let pid = self
            .pid()
            .with_context(|| format!("{} is not running", self.name))?;
        send(pid, sig)
    }

    /// Waits for the process to end (after a kill -9) and reaps it.
    pub fn reap(&mut self) -> Result<()> {
        self.child.take().context("not running")?.wait()?;
        Ok(())
    }

    /// (peak, current) resident memory in MB.
    pub fn memory_mb(&self) -> Result<(f64, f64)> {
        let pid = self.pid().context("not running")?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        Ok((
            proc_field(&status, "VmHWM:") / 1024.0,
            proc_field(&status, "VmRSS:") / 1024.0,
        ))
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A stopped process must be continued to die cleanly.
            let _ = send(child.id(), Signal::CONT);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn send(pid: u32, sig: Signal) -> Result<()> {
    let pid = i32::try_from(pid).ok().and_then(Pid::from_raw);
    Ok(kill_process(pid.context("no such pid")?, sig)?)
}
