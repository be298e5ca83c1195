//! One `slim-cp serve` process of a test cluster: its ports, its config
//! file, its log, and the signals a drill sends it.

use std::collections::BTreeSet;
use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use slim_cp::proto::cluster as pb;
use slim_cp::proto::cluster::admin_client::AdminClient;
use slim_cp::proto::cluster::relay_client::RelayClient;
use tonic::transport::Channel;

/// A port free on loopback now and never handed out before by this
/// process: the kernel can give a just-closed port again at once, and a
/// replica given one port twice (northbound and ops) fails to start.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<BTreeSet<u16>> = std::sync::Mutex::new(BTreeSet::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
        if given.insert(port) {
            return port;
        }
    }
}

/// Timings short enough for drills to run in seconds, with the margins the
/// configuration requires.
pub const CLUSTER_TIMINGS: &str =
    "  lease: 2s\n  renew: 500ms\n  heartbeat: 500ms\n  replica_ttl: 3s\n";

/// Where a replica runs and how it is reached: loopback by default; a
/// partition drill puts it in a network namespace (`netns`) on its own
/// address, or advertises its relay through a proxy a drill can cut.
#[derive(Clone, Debug)]
pub struct Placement {
    /// The address it listens on and is reached at.
    pub host: IpAddr,
    /// Run it as `ip netns exec NAME ...`.
    pub netns: Option<String>,
    /// What peers dial for its relay, when not `host:relay`.
    pub relay_advertise: Option<SocketAddr>,
    /// The relay's port, when it must be known before the replica exists.
    pub relay_port: Option<u16>,
}

impl Placement {
    pub fn loopback() -> Placement {
        Placement {
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            netns: None,
            relay_advertise: None,
            relay_port: None,
        }
    }
}

pub struct ReplicaProc {
    pub id: String,
    pub place: Placement,
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
        ReplicaProc::placed(dir, id, db_url, topology, Placement::loopback())
    }

    /// A replica at `place`; ports are picked free on the root namespace's
    /// loopback, which is as good as any inside a fresh namespace.
    pub fn placed(
        dir: &Path,
        id: &str,
        db_url: &str,
        topology: &str,
        place: Placement,
    ) -> ReplicaProc {
        let (nb, sb, http) = (free_port(), free_port(), free_port());
        let relay = place.relay_port.unwrap_or_else(free_port);
        let host = place.host;
        let advertise = place
            .relay_advertise
            .map(|a| format!(", advertise: \"{a}\""))
            .unwrap_or_default();
        let config = dir.join(format!("{id}.yaml"));
        // Small pools: each opens in full, and two clusters of tests at
        // once must fit a default server's 100 connections.
        let body = format!(
            "northbound: {{endpoint: \"{host}:{nb}\", tls: {{insecure: true}}}}\n\
             southbound: {{endpoint: \"{host}:{sb}\", tls: {{insecure: true}}}}\n\
             database: {{type: postgres, url: \"{db_url}\", pool_size: 4}}\n\
             reconciler: {{base_retry_delay: 50ms, reconcile_period: 5s}}\n\
             topology: {topology}\n\
             http: {{endpoint: \"{host}:{http}\"}}\n\
             cluster:\n  replica_id: {id}\n  relay: {{endpoint: \"{host}:{relay}\"{advertise}}}\n\
             {CLUSTER_TIMINGS}"
        );
        std::fs::write(&config, body).expect("config written");
        ReplicaProc {
            id: id.to_string(),
            place,
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
        let mut cmd = match &self.place.netns {
            // `ip netns exec` execs in place: the child's pid is slim-cp's,
            // so signals reach the replica itself.
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_slim-cp")]);
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_slim-cp")),
        };
        let child = cmd
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
        while TcpStream::connect((self.place.host, self.nb)).is_err() {
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
        SocketAddr::new(self.place.host, self.sb)
    }

    /// The ops endpoint (`/readyz`, `/metrics`).
    pub fn http_addr(&self) -> SocketAddr {
        SocketAddr::new(self.place.host, self.http)
    }

    fn url(&self, port: u16) -> String {
        format!("http://{}", SocketAddr::new(self.place.host, port))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub async fn admin(&self) -> Result<AdminClient<Channel>, tonic::transport::Error> {
        AdminClient::connect(self.url(self.nb)).await
    }

    pub async fn relay_client(&self) -> RelayClient<Channel> {
        RelayClient::connect(self.url(self.relay))
            .await
            .expect("relay reachable")
    }

    /// The replica's own view, over its relay with `token`.
    pub async fn inspect(&self, token: &str) -> Option<pb::ReplicaState> {
        let mut req = tonic::Request::new(pb::InspectRequest {});
        req.metadata_mut()
            .insert(slim_cp::cluster::relay::auth::HEADER, token.parse().ok()?);
        req.set_timeout(Duration::from_secs(2));
        let connect = RelayClient::connect(self.url(self.relay));
        // A partitioned replica never answers the connect: bound it too.
        let mut client = tokio::time::timeout(Duration::from_secs(2), connect)
            .await
            .ok()?
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
