//! One `slim-cp serve` process of a test cluster: its ports, its config
//! file, its log, and the signals a drill sends it.

use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use slim_cp::proto::cluster as pb;
use slim_cp::proto::cluster::admin_client::AdminClient;
use slim_cp::proto::cluster::relay_client::RelayClient;
use tonic::transport::Channel;

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Timings short enough for drills to run in seconds, with the margins the
/// configuration requires.
pub const CLUSTER_TIMINGS: &str =
    "  lease: 2s\n  renew: 500ms\n  heartbeat: 500ms\n  replica_ttl: 3s\n";

pub struct ReplicaProc {
    pub id: String,
    pub nb: u16,
    pub sb: u16,
    pub relay: u16,
    pub http: u16,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl ReplicaProc {
    pub fn new(dir: &Path, id: &str, db_url: &str, topology: &str) -> ReplicaProc {
        let (nb, sb, relay, http) = (free_port(), free_port(), free_port(), free_port());
        let config = dir.join(format!("{id}.yaml"));
        let body = format!(
            "northbound: {{endpoint: \"127.0.0.1:{nb}\", tls: {{insecure: true}}}}\n\
             southbound: {{endpoint: \"127.0.0.1:{sb}\", tls: {{insecure: true}}}}\n\
             database: {{type: postgres, url: \"{db_url}\", pool_size: 8}}\n\
             reconciler: {{base_retry_delay: 50ms, reconcile_period: 5s}}\n\
             topology: {topology}\n\
             http: {{endpoint: \"127.0.0.1:{http}\"}}\n\
             cluster:\n  replica_id: {id}\n  relay: {{endpoint: \"127.0.0.1:{relay}\"}}\n\
             {CLUSTER_TIMINGS}"
        );
        std::fs::write(&config, body).expect("config written");
        ReplicaProc {
            id: id.to_string(),
            nb,
            sb,
            relay,
            http,
            log: dir.join(format!("{id}.log")),
            config,
            child: None,
        }
    }

    /// Starts the process (appending to its log) and waits until its
    /// operator API answers.
    pub fn spawn(&mut self) {
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        let err = log.try_clone().expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_slim-cp"))
            .args(["serve", "--no-migrate", "--config"])
            .arg(&self.config)
            .env(
                "RUST_LOG",
                "info,slim_cp::transport::stream=debug,slim_cp::southbound=debug",
            )
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("slim-cp starts");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", self.nb)).is_err() {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("{} exited at start ({status}): {}", self.id, self.log());
            }
            assert!(
                Instant::now() < deadline,
                "{} did not listen: {}",
                self.id,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Sends a signal by name (`KILL`, `STOP`, `CONT`, `TERM`).
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{sig} {}", self.id);
    }

    /// kill -9, and reaps the process.
    pub fn kill9(&mut self) {
        eprintln!("{:?} kill -9 {}", std::time::SystemTime::now(), self.id);
        self.signal("KILL");
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }

    /// Waits up to `within` for the process to exit by itself.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(s) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    pub fn southbound(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.sb))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub async fn admin(&self) -> Result<AdminClient<Channel>, tonic::transport::Error> {
        AdminClient::connect(format!("http://127.0.0.1:{}", self.nb)).await
    }

    pub async fn relay_client(&self) -> RelayClient<Channel> {
        RelayClient::connect(format!("http://127.0.0.1:{}", self.relay))
            .await
            .expect("relay reachable")
    }

    /// The replica's own view, over its relay with `token`.
    pub async fn inspect(&self, token: &str) -> Option<pb::ReplicaState> {
        let mut req = tonic::Request::new(pb::InspectRequest {});
        req.metadata_mut()
            .insert(slim_cp::cluster::relay::auth::HEADER, token.parse().ok()?);
        req.set_timeout(Duration::from_secs(2));
        let mut client = RelayClient::connect(format!("http://127.0.0.1:{}", self.relay))
            .await
            .ok()?;
        client.inspect(req).await.ok().map(|r| r.into_inner())
    }
}

impl Drop for ReplicaProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // A stopped process must be continued to die cleanly.
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(c.id().to_string())
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
