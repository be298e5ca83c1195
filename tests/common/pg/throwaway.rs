//! A throwaway PostgreSQL cluster for machines where no server runs,
//! shared by every test process of one test run.
//!
//! nextest runs each test as a process of its own, so a cluster per
//! process would cost an `initdb` (seconds) per test. A run's processes
//! share one instead, keyed by their common parent (the `cargo-nextest`
//! or `cargo` process): `$TMPDIR/slim-cp-test-pg-<uid>/run-<parent pid>/`
//! holds its data directory, socket directory, log, its port in `ready`,
//! and one file per test process that uses it in `users/`. Test processes
//! look it up, start it ([`super::cluster`]) and register under an
//! exclusive `flock` on `lock` beside the run directories.
//!
//! Test processes have no exit hook, and may crash or be killed, so the
//! one that starts the cluster also starts a watchdog (`watchdog.sh`, in
//! a process group of its own, so that a Ctrl-C aimed at the tests does
//! not end it first). Every second the watchdog forgets registered
//! processes that are gone. As soon as the run's parent has exited, or
//! once no registered process has been alive for 20 s (a test binary run
//! straight from a shell, whose parent lives on), it stops the cluster
//! (`pg_ctl stop -m immediate`) and renames its directory `gone-*` under
//! the lock, then removes it. A later test process of the same run starts
//! a new cluster. Directories whose watchdog or server is gone, or that
//! never became ready (a test process killed while starting a cluster),
//! are removed by the next test process that takes the lock.
//!
//! `initdb` and `pg_ctl` refuse to run as root: as root, the cluster and
//! its watchdog run as the `postgres` account (or `nobody`), and the
//! directories they write are theirs.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::{FlockOperation, flock};
use rustix::process::{Pid, test_kill_process};

use super::cluster::{Binaries, Cluster, Flavour, Owner};

/// The admin URL of this run's cluster, started if it is not running.
pub fn shared_cluster(bins: &Binaries) -> Result<String, String> {
    let (port, _) = shared_cluster_of(bins, Flavour::Plaintext)?;
    Ok(format!("postgres://postgres@127.0.0.1:{port}/postgres"))
}

/// This run's cluster of `flavour`, started if it is not running: its
/// port and directory.
pub fn shared_cluster_of(bins: &Binaries, flavour: Flavour) -> Result<(u16, PathBuf), String> {
    let owner = Owner::get()?;
    let base = base_dir(&owner)?;
    let lock_path = base.join("lock");
    let lock = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&lock_path)
        .map_err(|e| format!("opening {}: {e}", lock_path.display()))?;
    flock(&lock, FlockOperation::LockExclusive)
        .map_err(|e| format!("locking {}: {e}", lock_path.display()))?;
    sweep(&base, bins, &owner);
    let run = std::os::unix::process::parent_id();
    let dir = match flavour {
        Flavour::Plaintext => base.join(format!("run-{run}")),
        Flavour::Tls => base.join(format!("run-{run}-tls")),
    };
    let port = match ready_port(&dir) {
        Some(port) => {
            register(&dir)?;
            port
        }
        None => {
            let cluster = Cluster {
                dir: &dir,
                bins,
                owner: &owner,
            };
            cluster
                .start(run, &lock_path, flavour)
                .inspect_err(|_| cluster.remove())?
        }
    };
    // Closing the file releases the lock.
    drop(lock);
    Ok((port, dir))
}

/// `$TMPDIR/slim-cp-test-pg-<uid>`, the owner's so that its watchdogs can
/// remove run directories.
fn base_dir(owner: &Owner) -> Result<PathBuf, String> {
    let euid = rustix::process::geteuid().as_raw();
    let base = std::env::temp_dir().join(format!("slim-cp-test-pg-{euid}"));
    match DirBuilder::new().mode(0o755).create(&base) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
            return Err(format!("creating {}: {e}", base.display()));
        }
        _ => {}
    }
    let meta = fs::symlink_metadata(&base).map_err(|e| format!("{}: {e}", base.display()))?;
    // Another user's directory in a shared /tmp is not ours to run from.
    if !meta.is_dir() || (meta.uid() != euid && meta.uid() != owner.uid) {
        return Err(format!(
            "{} is not a directory of this user's",
            base.display()
        ));
    }
    owner.adopt(&base)?;
    Ok(base)
}

/// The port of the cluster in `dir`, if it is ready.
fn ready_port(dir: &Path) -> Option<u16> {
    fs::read_to_string(dir.join("ready"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Marks this process as a user of the cluster in `dir`.
pub fn register(dir: &Path) -> Result<(), String> {
    let me = dir.join("users").join(std::process::id().to_string());
    File::create(&me)
        .map(drop)
        .map_err(|e| format!("registering {}: {e}", me.display()))
}

/// Removes run directories nobody looks after: those whose watchdog or
/// server is gone, and those never made ready (under the lock, a
/// directory is either ready or being started by the lock's holder).
/// Also removes stopped clusters (`gone-*`) their watchdog did not finish
/// removing.
fn sweep(base: &Path, bins: &Binaries, owner: &Owner) {
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if !dir.is_dir() {
            continue;
        }
        if name.starts_with("gone-") && abandoned_removal(&dir) {
            let _ = fs::remove_dir_all(&dir);
        }
        if !name.starts_with("run-") || (ready_port(&dir).is_some() && looked_after(&dir)) {
            continue;
        }
        Cluster {
            dir: &dir,
            bins,
            owner,
        }
        .remove();
    }
}

/// Whether a stopped cluster's removal has stalled: its watchdog still
/// removes it for up to half a minute on a busy disk, so give it ten.
fn abandoned_removal(dir: &Path) -> bool {
    let stalled = fs::metadata(dir)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age > Duration::from_secs(600));
    stalled && !watchdog_pid(dir).is_some_and(is_alive)
}

/// Whether the cluster in `dir` and its watchdog both run.
fn looked_after(dir: &Path) -> bool {
    let server = dir.join("data").join("postmaster.pid");
    watchdog_pid(dir).is_some_and(is_alive) && pid_in(&server).is_some_and(is_alive)
}

pub fn watchdog_pid(dir: &Path) -> Option<Pid> {
    pid_in(&dir.join("watchdog.pid"))
}

/// The pid on the first line of `file`.
fn pid_in(file: &Path) -> Option<Pid> {
    let text = fs::read_to_string(file).ok()?;
    Pid::from_raw(text.lines().next()?.trim().parse().ok()?)
}

/// Whether `pid` runs. A zombie does not: an orphaned watchdog killed
/// stays one until init reaps it, and init may take its time.
pub fn is_alive(pid: Pid) -> bool {
    match fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_pid())) {
        // The state follows the command name, which may hold ") ".
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) if Path::new("/proc/self").exists() => false,
        // Without /proc: EPERM means another user's process.
        Err(_) => match test_kill_process(pid) {
            Ok(()) => true,
            Err(e) => e == rustix::io::Errno::PERM,
        },
    }
}
