//! The `slim-cp` binary as an operator runs it: `serve` on the memory
//! store and on Postgres (migrating on start), `migrate`, a second replica
//! on the same database refused, and a bad configuration refused with the
//! key and line.

mod common;

use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::pg::{fresh_pg_database, pg_url_for};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A config file in the target directory, removed when dropped.
struct ConfigFile(std::path::PathBuf);

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn write_config(body: &str) -> ConfigFile {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join(format!("slim-cp-{}.yaml", uuid::Uuid::new_v4().simple()));
    std::fs::write(&path, body).expect("config written");
    ConfigFile(path)
}

fn config(nb: u16, sb: u16, database: &str) -> String {
    format!(
        "northbound:\n  endpoint: \"127.0.0.1:{nb}\"\n  tls: {{insecure: true}}\n\
         southbound:\n  endpoint: \"127.0.0.1:{sb}\"\n  tls: {{insecure: true}}\n{database}"
    )
}

fn slim_cp(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_slim-cp"));
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

struct Serving(Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `serve` and waits until its northbound port answers.
fn serve(path: &std::path::Path, nb: u16) -> Serving {
    let child = slim_cp(&["serve", "--config", &path.display().to_string()])
        .spawn()
        .expect("starts");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", nb)).is_err() {
        assert!(Instant::now() < deadline, "serve did not listen on {nb}");
        std::thread::sleep(Duration::from_millis(50));
    }
    Serving(child)
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Scenario: the memory store with a minimal file: both APIs listen.
#[test]
fn serve_on_memory_listens_on_both_apis() {
    let (nb, sb) = (free_port(), free_port());
    let path = write_config(&config(nb, sb, "database: {type: in_memory}\n"));
    let _cp = serve(&path.0, nb);
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", sb)).is_ok(),
        "southbound listens"
    );
}

/// Scenario: a bad file is refused with the key and the line.
#[test]
fn bad_configuration_is_refused_with_key_and_line() {
    let path = write_config("reconciler:\n  workers: four\n");
    let out = slim_cp(&["serve", "--config", &path.0.display().to_string()])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let said = text(&out);
    assert!(
        said.contains("reconciler.workers") && said.contains("line 2"),
        "{said}"
    );
}

/// Scenario: Postgres — `migrate` prepares a database, `serve` runs on it,
/// and a second replica on the same database is refused with a message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_serve_migrate_and_single_replica_guard() {
    let url = pg_url_for(&fresh_pg_database().await);
    let db = format!("database:\n  type: postgres\n  url: \"{url}\"\n");
    let (nb, sb) = (free_port(), free_port());
    let path = write_config(&config(nb, sb, &db));
    let out = slim_cp(&["migrate", "--config", &path.0.display().to_string()])
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", text(&out));
    let _first = serve(&path.0, nb);
    let (nb2, sb2) = (free_port(), free_port());
    let second = write_config(&config(nb2, sb2, &db));
    let out = slim_cp(&["serve", "--config", &second.0.display().to_string()])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let said = text(&out);
    assert!(said.contains("another slim-cp replica"), "{said}");
    assert!(
        !said.contains("postgres://"),
        "the URL is never printed: {said}"
    );
}
