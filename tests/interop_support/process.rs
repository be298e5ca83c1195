//! A child process with its output in a log file: the building block of
//! the control plane and node handles.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{PATIENCE, accepts_tcp, poll, tail};

/// A running child whose stdout and stderr go to one log file. Killed
/// (SIGKILL) on drop, so a failing test leaves nothing behind.
pub struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    /// Starts `cmd` with its output appended to `log` (appended, so a
    /// restarted process keeps its earlier life's log for the report).
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Proc {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("open {}: {e}", log.display()));
        let err = out.try_clone().expect("clone log handle");
        // Plain logs: the reports below are read by humans and grep.
        cmd.env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name} ({cmd:?}): {e}"));
        Proc {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Whether the process is still alive (reaps it if it exited).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL, then reap: a crash as far as its peers can tell.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, SIGKILL after `grace`. std has no signal API and the crate
    /// forbids `unsafe`, so this goes through kill(1).
    pub fn terminate(&mut self, grace: Duration) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if !self.is_running() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
    }

    /// Waits up to `timeout` for the process to exit on its own and
    /// returns its exit code (`None` if a signal ended it); kills it and
    /// returns `Err` if it is still running then.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<Option<i32>, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Ok(status.code());
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(format!("{} still running after {timeout:?}", self.name));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Everything the process logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read(&self.log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The log's last `lines` lines under a header naming the process.
    pub fn report(&self, lines: usize) -> String {
        format!(
            "----- {} ({}) -----\n{}",
            self.name,
            self.log.display(),
            tail(&self.log, lines)
        )
    }

    /// Waits until `port` accepts TCP; panics with the log if the process
    /// exits first or the port stays closed.
    pub fn wait_listening(&mut self, port: u16) {
        if let Err(state) = self.try_wait_listening(port) {
            panic!("{state}\n{}", self.report(80));
        }
    }

    /// Waits until `port` accepts TCP; says why not if the process exits
    /// first or the port stays closed.
    pub fn try_wait_listening(&mut self, port: u16) -> Result<(), String> {
        poll(PATIENCE, || {
            if !self.is_running() {
                return Err(format!("{} exited", self.name));
            }
            if accepts_tcp(port) {
                Ok(())
            } else {
                Err(format!("{} not listening on {port}", self.name))
            }
        })
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}
