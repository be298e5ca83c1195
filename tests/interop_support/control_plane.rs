//! A control plane process: slim-cp, or the reference for side-by-side
//! runs, on two free loopback ports with its config and log in the test dir.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{Proc, free_port, upstream};

/// Which control plane to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpKind {
    /// This crate's `slim-cp serve`.
    SlimCp,
    /// The upstream single-replica `slim-control-plane`.
    Reference,
}

/// What goes into a control plane's config file.
#[derive(Clone, Debug)]
pub struct CpConfig {
    pub kind: CpKind,
    /// YAML for the `topology:` section's body (indented two spaces by the
    /// caller); `None` is API mode.
    pub topology: Option<String>,
    pub log_level: String,
    /// A Postgres database to use (slim-cp only); `None` is the memory
    /// store.
    pub postgres: Option<String>,
    /// Environment variables for the process (slim-cp only).
    pub env: Vec<(String, String)>,
}

impl CpConfig {
    pub fn slim_cp() -> CpConfig {
        CpConfig {
            kind: CpKind::SlimCp,
            topology: None,
            log_level: "debug".into(),
            postgres: None,
            env: Vec::new(),
        }
    }

    pub fn reference() -> CpConfig {
        CpConfig {
            kind: CpKind::Reference,
            ..CpConfig::slim_cp()
        }
    }

    /// slim-cp on the Postgres database at `url` (migrated at start).
    pub fn on_postgres(mut self, url: &str) -> CpConfig {
        self.postgres = Some(url.to_string());
        self
    }

    /// The process gets `key=value` in its environment.
    pub fn with_env(mut self, key: &str, value: &str) -> CpConfig {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// Config mode with the given `topology:` body.
    pub fn with_topology(mut self, body: &str) -> CpConfig {
        self.topology = Some(body.to_string());
        self
    }
}

/// A control plane process on two free loopback ports.
pub struct ControlPlane {
    pub kind: CpKind,
    pub northbound: u16,
    pub southbound: u16,
    env: Vec<(String, String)>,
    config: PathBuf,
    proc: Proc,
}

impl ControlPlane {
    /// Writes `<dir>/<name>.yaml`, starts the process, and returns once
    /// both listeners accept TCP. A port handed out free can be taken by
    /// another test process before the control plane binds it: then it
    /// starts again on other ports.
    pub fn start(dir: &Path, name: &str, cfg: &CpConfig) -> ControlPlane {
        const ATTEMPTS: usize = 3;
        for attempt in 1..=ATTEMPTS {
            let mut cp = Self::spawn(dir, name, cfg);
            let ready = cp.proc.try_wait_listening(cp.northbound);
            let ready = ready.and_then(|()| cp.proc.try_wait_listening(cp.southbound));
            match ready {
                Ok(()) => return cp,
                Err(_) if attempt < ATTEMPTS && cp.log().contains("Address already in use") => {
                    eprintln!("{name}: a port was taken before it bound; starting again");
                }
                Err(state) => panic!("{state}\n{}", cp.report(80)),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// Writes the config on fresh ports and starts the process.
    fn spawn(dir: &Path, name: &str, cfg: &CpConfig) -> ControlPlane {
        let (northbound, southbound) = (free_port(), free_port());
        // Both accept the reference's spelling of the memory store.
        let mut yaml = format!(
            "tracing:\n  log_level: {}\n\
             northbound:\n  endpoint: \"127.0.0.1:{northbound}\"\n  tls:\n    insecure: true\n\
             southbound:\n  endpoint: \"127.0.0.1:{southbound}\"\n  tls:\n    insecure: true\n",
            cfg.log_level
        );
        match &cfg.postgres {
            Some(url) => yaml.push_str(&format!(
                // A small pool: it opens in full, and the replicas of two
                // tests at once must fit a default server's connections.
                "database:\n  type: postgres\n  url: \"{url}\"\n  pool_size: 4\nhttp:\n  endpoint: \"127.0.0.1:{}\"\n",
                free_port()
            )),
            None => yaml.push_str("database:\n  type: in_memory\n"),
        }
        if let Some(body) = &cfg.topology {
            yaml.push_str("topology:\n");
            yaml.push_str(body);
            if !body.ends_with('\n') {
                yaml.push('\n');
            }
        }
        let config = dir.join(format!("{name}.yaml"));
        std::fs::write(&config, yaml).expect("write control plane config");
        let log = dir.join(format!("{name}.log"));
        let proc = Proc::spawn(name, Self::command(cfg.kind, &cfg.env, &config, dir), &log);
        ControlPlane {
            kind: cfg.kind,
            northbound,
            southbound,
            env: cfg.env.clone(),
            config,
            proc,
        }
    }

    fn command(kind: CpKind, env: &[(String, String)], config: &Path, dir: &Path) -> Command {
        let mut cmd = match kind {
            CpKind::SlimCp => {
                let mut c = Command::new(env!("CARGO_BIN_EXE_slim-cp"));
                c.arg("serve");
                c
            }
            CpKind::Reference => Command::new(upstream("slim-control-plane")),
        };
        cmd.arg("--config").arg(config).current_dir(dir);
        if kind == CpKind::SlimCp {
            // slim-cp lets RUST_LOG override `log_level`: keep its own debug
            // lines but not hyper/h2's frame-by-frame ones, which would push
            // everything useful out of a failure report's log tail.
            cmd.env("RUST_LOG", "info,slim_cp=debug");
            cmd.envs(env.iter().map(|(k, v)| (k, v)));
        }
        cmd
    }

    fn wait_ready(&mut self) {
        self.proc.wait_listening(self.northbound);
        self.proc.wait_listening(self.southbound);
    }

    /// `127.0.0.1:PORT` of the operator API, as slimctl's `--server`.
    pub fn northbound_addr(&self) -> String {
        format!("127.0.0.1:{}", self.northbound)
    }

    /// The URL a node's controller client dials.
    pub fn southbound_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.southbound)
    }

    pub fn proc(&mut self) -> &mut Proc {
        &mut self.proc
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        self.proc.kill();
    }

    /// Starts it again on the same ports and config (after `kill`).
    pub fn restart(&mut self) {
        self.proc.kill();
        let dir = self.config.parent().expect("config dir").to_path_buf();
        let log = self.proc.log_path().to_path_buf();
        let name = self.proc.name().to_string();
        self.proc = Proc::spawn(
            &name,
            Self::command(self.kind, &self.env, &self.config, &dir),
            &log,
        );
        self.wait_ready();
    }

    pub fn report(&self, lines: usize) -> String {
        self.proc.report(lines)
    }

    /// Everything it logged so far.
    pub fn log(&self) -> String {
        self.proc.log_text()
    }
}
