//! One throwaway PostgreSQL cluster in a directory of its own: made with
//! `initdb`, started and stopped with `pg_ctl`, looked after by
//! `watchdog.sh`. [`super::throwaway`] decides who shares it and when it
//! goes.

use std::ffi::{OsStr, OsString};
use std::fs::{self, DirBuilder};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rustix::process::{Signal, kill_process};

use super::throwaway::{is_alive, register, watchdog_pid};
use crate::common::pki;

const WATCHDOG: &str = include_str!("watchdog.sh");
/// How long a cluster outlives its last test process while the run's
/// parent is still there.
const IDLE_SECS: u32 = 20;
/// Attempts at starting the server, each on a fresh port: another
/// process may take the free port between our finding it and the server
/// binding it.
const START_ATTEMPTS: usize = 3;

/// Where `initdb` and `pg_ctl` are.
pub struct Binaries {
    initdb: PathBuf,
    pg_ctl: PathBuf,
}

impl Binaries {
    /// On PATH, else the newest under `/usr/lib/postgresql/*/bin`, where
    /// Debian and Ubuntu install them, off PATH.
    pub fn find() -> Option<Binaries> {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let on_path = |name: &str| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(name))
                .find(|f| is_executable(f))
        };
        if let (Some(initdb), Some(pg_ctl)) = (on_path("initdb"), on_path("pg_ctl")) {
            return Some(Binaries { initdb, pg_ctl });
        }
        let mut versions: Vec<(Vec<u32>, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|entry| {
                let entry = entry.ok()?;
                let name = entry.file_name().into_string().ok()?;
                let version = name.split('.').map(str::parse).collect::<Result<_, _>>();
                Some((version.ok()?, entry.path().join("bin")))
            })
            .collect();
        versions.sort();
        versions
            .into_iter()
            .rev()
            .map(|(_, bin)| Binaries {
                initdb: bin.join("initdb"),
                pg_ctl: bin.join("pg_ctl"),
            })
            .find(|b| is_executable(&b.initdb) && is_executable(&b.pg_ctl))
    }
}

fn is_executable(file: &Path) -> bool {
    fs::metadata(file).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Who runs the cluster: whoever runs the tests, except root.
pub struct Owner {
    pub uid: u32,
    gid: u32,
    /// Whether commands switch to `uid`/`gid` (the tests run as root).
    switch: bool,
}

impl Owner {
    pub fn get() -> Result<Owner, String> {
        let euid = rustix::process::geteuid();
        if !euid.is_root() {
            return Ok(Owner {
                uid: euid.as_raw(),
                gid: rustix::process::getegid().as_raw(),
                switch: false,
            });
        }
        let passwd = fs::read_to_string("/etc/passwd").unwrap_or_default();
        ["postgres", "nobody"]
            .iter()
            .find_map(|name| {
                let fields: Vec<&str> = passwd
                    .lines()
                    .map(|line| line.split(':').collect::<Vec<_>>())
                    .find(|f| f.first() == Some(name))?;
                Some(Owner {
                    uid: fields.get(2)?.parse().ok()?,
                    gid: fields.get(3)?.parse().ok()?,
                    switch: true,
                })
            })
            .ok_or_else(|| {
                "initdb refuses root, and there is no postgres or nobody account to run it as"
                    .to_string()
            })
    }

    fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new(program);
        if self.switch {
            cmd.uid(self.uid).gid(self.gid);
        }
        // Messages in English whatever the locale, and no locale initdb
        // might not find.
        cmd.env("LC_ALL", "C").stdin(Stdio::null());
        cmd
    }

    /// Makes `path` the owner's, when that is not who we are.
    pub fn adopt(&self, path: &Path) -> Result<(), String> {
        if self.switch {
            std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid))
                .map_err(|e| format!("chown {}: {e}", path.display()))?;
        }
        Ok(())
    }
}

/// Whether a cluster serves TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    Plaintext,
    /// `ssl = on`, with a certificate for `localhost` (no IP address) from
    /// a CA made for the cluster: `ca.pem` in the cluster's directory, and
    /// `other-ca.pem` beside it, a CA that signed nothing of it.
    Tls,
}

/// One run's cluster, in `dir`.
pub struct Cluster<'a> {
    pub dir: &'a Path,
    pub bins: &'a Binaries,
    pub owner: &'a Owner,
}

impl Cluster<'_> {
    /// Creates, starts and registers with the cluster; returns its port.
    pub fn start(&self, run: u32, lock: &Path, flavour: Flavour) -> Result<u16, String> {
        for sub in [
            self.dir.to_path_buf(),
            self.path("users"),
            self.path("sock"),
        ] {
            DirBuilder::new()
                .mode(0o700)
                .create(&sub)
                .map_err(|e| format!("creating {}: {e}", sub.display()))?;
            self.owner.adopt(&sub)?;
        }
        register(self.dir)?;
        self.start_watchdog(run, lock)?;
        let data = self.path("data");
        let initdb = [
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ];
        self.tool(
            &self.bins.initdb,
            &[OsStr::new("-D"), data.as_os_str()],
            &initdb,
        )?;
        let ssl = match flavour {
            Flavour::Plaintext => "off",
            Flavour::Tls => {
                self.write_certificates(&data)?;
                "on"
            }
        };
        let mut last = String::new();
        for _ in 0..START_ATTEMPTS {
            let port = free_port()?;
            // Loopback only, a socket directory of its own (the default
            // one may be missing or another server's), and no fsync: the
            // data dies with the run.
            let mut options = OsString::from(format!(
                "-h 127.0.0.1 -p {port} -c max_connections=200 -F \
                 -c full_page_writes=off -c synchronous_commit=off -c ssl={ssl} -k "
            ));
            options.push("'");
            options.push(self.path("sock"));
            options.push("'");
            let log = self.path("log");
            let paths = [
                OsStr::new("-D"),
                data.as_os_str(),
                OsStr::new("-l"),
                log.as_os_str(),
                OsStr::new("-o"),
                &options,
            ];
            match self.tool(
                &self.bins.pg_ctl,
                &paths,
                &["-w", "-t", "60", "-s", "start"],
            ) {
                Ok(()) => {
                    fs::write(self.path("ready"), port.to_string())
                        .map_err(|e| format!("writing {}: {e}", self.dir.display()))?;
                    return Ok(port);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The server's certificate and key where Postgres looks by default
    /// (`server.crt`, `server.key` in the data directory), the key private
    /// to the owner as the server demands; the CAs for clients beside.
    fn write_certificates(&self, data: &Path) -> Result<(), String> {
        let (ca, issuer) = pki::ca("slim-cp test database CA");
        let (other_ca, _) = pki::ca("slim-cp test CA that signed nothing");
        let usage = rcgen::ExtendedKeyUsagePurpose::ServerAuth;
        let (cert, key) = pki::leaf(&issuer, &["localhost"], usage);
        for (file, pem, mode) in [
            (data.join("server.crt"), cert, 0o644),
            (data.join("server.key"), key, 0o600),
            (self.path("ca.pem"), ca, 0o644),
            (self.path("other-ca.pem"), other_ca, 0o644),
        ] {
            fs::write(&file, pem)
                .and_then(|()| fs::set_permissions(&file, fs::Permissions::from_mode(mode)))
                .map_err(|e| format!("writing {}: {e}", file.display()))?;
            self.owner.adopt(&file)?;
        }
        Ok(())
    }

    fn start_watchdog(&self, run: u32, lock: &Path) -> Result<(), String> {
        // A file rather than `sh -c`, so that `ps` shows what runs. The
        // shell keeps reading it after the watchdog removes the directory.
        let script = self.path("watchdog.sh");
        fs::write(&script, WATCHDOG).map_err(|e| format!("writing {}: {e}", script.display()))?;
        let mut cmd = self.owner.command(Path::new("sh"));
        cmd.arg(&script)
            .arg(self.dir)
            .arg(run.to_string())
            .arg(IDLE_SECS.to_string())
            .arg(lock)
            .arg(&self.bins.pg_ctl)
            // Pipes inherited from the test would make nextest wait for
            // them, and a signal to the test's process group must not end
            // the watchdog before the cluster.
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .current_dir(self.dir);
        // Not waited for: it outlives this process, and init reaps it.
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting the cluster's watchdog: {e}"))?;
        fs::write(self.path("watchdog.pid"), child.id().to_string())
            .map_err(|e| format!("writing {}: {e}", self.dir.display()))
    }

    /// Runs a PostgreSQL tool as the owner, in the cluster's directory;
    /// fails with its message and the end of the server's log, on one line.
    fn tool(&self, program: &Path, paths: &[&OsStr], args: &[&str]) -> Result<(), String> {
        let out = self
            .owner
            .command(program)
            .args(paths)
            .args(args)
            .current_dir(self.dir)
            .output()
            .map_err(|e| format!("running {}: {e}", program.display()))?;
        if out.status.success() {
            return Ok(());
        }
        let log = fs::read_to_string(self.path("log")).unwrap_or_default();
        let mut tail: Vec<&str> = log.lines().rev().take(5).collect();
        tail.reverse();
        let message = format!(
            "{} failed ({}): {} {}",
            program.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            tail.join(" | ")
        );
        Err(message.replace('\n', " "))
    }

    /// Stops the server if it runs, ends the watchdog, and removes the
    /// directory.
    pub fn remove(&self) {
        if let Some(pid) = watchdog_pid(self.dir).filter(|&pid| is_alive(pid)) {
            let _ = kill_process(pid, Signal::TERM);
        }
        let data = self.path("data");
        if data.join("postmaster.pid").exists() {
            let stop = ["-m", "immediate", "-w", "-s", "stop"];
            let _ = self.tool(
                &self.bins.pg_ctl,
                &[OsStr::new("-D"), data.as_os_str()],
                &stop,
            );
        }
        // An initdb orphaned by a test process killed mid-start may still
        // be writing: it gives up (and removes what it made) once its
        // directory is going, so try a few times.
        for _ in 0..10 {
            if fs::remove_dir_all(self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// A loopback port nothing listens on right now.
fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("finding a free port: {e}"))
}
