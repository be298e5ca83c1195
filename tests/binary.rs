//! The `slim-cp` binary as an operator runs it: `serve` on the memory
//! store and on Postgres (migrating on start), `migrate`, replica ids
//! (a duplicate refused), `status`, and a bad configuration refused with
//! the key and line.

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

/// Starts `serve` and waits until its northbound port answers. Its logs go
/// to a file beside the config (an unread pipe would fill and block it).
fn serve(path: &std::path::Path, nb: u16) -> Serving {
    let log = std::fs::File::create(path.with_extension("log")).expect("log file");
    let err = log.try_clone().expect("log file");
    let child = slim_cp(&["serve", "--config", &path.display().to_string()])
        .stdout(log)
        .stderr(err)
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

/// Scenario: a malformed key for sealing domain secrets stops the start,
/// naming the variable and never quoting the value.
#[test]
fn a_malformed_domain_secret_key_is_refused() {
    let (nb, sb) = (free_port(), free_port());
    let auth = "topology:\n  registration_auth: {type: shared_secret, secrets: {}}\n";
    let path = write_config(&config(
        nb,
        sb,
        &format!("database: {{type: in_memory}}\n{auth}"),
    ));
    let out = slim_cp(&["serve", "--config", &path.0.display().to_string()])
        .env("SLIM_CP_DOMAIN_SECRET_KEY", "c2hvcnQta2V5")
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let said = text(&out);
    assert!(
        said.contains("SLIM_CP_DOMAIN_SECRET_KEY decodes to 9 bytes"),
        "{said}"
    );
    assert!(!said.contains("c2hvcnQta2V5"), "{said}");
}

/// A replica of a cluster on `db`, its relay on loopback.
fn clustered(nb: u16, sb: u16, db: &str, id: &str) -> String {
    let relay = free_port();
    let http = free_port();
    let cluster = format!(
        "cluster:\n  replica_id: {id}\n  relay: {{endpoint: \"127.0.0.1:{relay}\"}}\n  \
         replica_ttl: 2s\nhttp: {{endpoint: \"127.0.0.1:{http}\"}}\n"
    );
    config(nb, sb, &format!("{db}{cluster}"))
}

/// Waits until `status` (asked at `nb`) shows `alive` live replicas, one
/// of them leading, under an epoch.
async fn wait_cluster(nb: u16, alive: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = slim_cp(&["status", "--server", &format!("127.0.0.1:{nb}"), "--json"])
            .output()
            .expect("runs");
        let status: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
        let replicas = status["replicas"].as_array().cloned().unwrap_or_default();
        let live = replicas.iter().filter(|r| r["alive"] == true).count();
        let leaders = replicas.iter().filter(|r| r["leader"] == true).count();
        if live == alive && leaders == 1 && status["epoch"].as_u64() >= Some(1) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "status never showed {alive} replicas and a leader: {}",
            text(&out)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Scenario: Postgres — `migrate` prepares a database and `serve` runs on
/// it; a second process with the same replica id is refused with a
/// message (never the URL), one with its own id joins, and `status` shows
/// both, one of them leading.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_serve_migrate_and_replica_ids() {
    let url = pg_url_for(&fresh_pg_database().await);
    let db = format!("database:\n  type: postgres\n  url: \"{url}\"\n");
    let (nb, sb) = (free_port(), free_port());
    let path = write_config(&clustered(nb, sb, &db, "cp-a"));
    let out = slim_cp(&["migrate", "--config", &path.0.display().to_string()])
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", text(&out));
    let _first = serve(&path.0, nb);
    // Listening comes before joining: wait until it has joined and leads.
    wait_cluster(nb, 1).await;
    let twin = write_config(&clustered(free_port(), free_port(), &db, "cp-a"));
    let out = slim_cp(&["serve", "--config", &twin.0.display().to_string()])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let said = text(&out);
    assert!(
        said.contains("in use by another running slim-cp replica"),
        "{said}"
    );
    assert!(
        !said.contains("postgres://"),
        "the URL is never printed: {said}"
    );

    let nb2 = free_port();
    let other = write_config(&clustered(nb2, free_port(), &db, "cp-b"));
    let _second = serve(&other.0, nb2);
    wait_cluster(nb2, 2).await;
}
