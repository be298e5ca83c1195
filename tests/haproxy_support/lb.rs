//! HAProxy running the shipped `deploy/haproxy/haproxy.cfg`, its
//! listeners and servers moved onto loopback, in front of `slim-cp serve`
//! replicas. Not declared by `haproxy_support` (the deploy checks need no
//! processes): a test that runs it includes it with
//! `#[path = "haproxy_support/lb.rs"] mod lb;` beside `cluster_support`,
//! `haproxy_support` and `interop_support`.

// Each test binary including this uses its own part.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

use crate::cluster_support::ReplicaProc;
use crate::haproxy_support::{self, Target};
use crate::interop_support::{Proc, free_port};

/// HAProxy running the shipped configuration on loopback.
pub struct Lb {
    pub southbound: u16,
    pub northbound: u16,
    pub proc: Proc,
    /// The configuration HAProxy runs.
    pub cfg: String,
}

/// Where HAProxy's health checks go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checks {
    /// Each replica's `/readyz`, as shipped.
    Readyz,
    /// A port nobody listens on: every checked server stays down and only
    /// the unchecked backups carry traffic.
    Failing,
}

impl Lb {
    /// Writes `<dir>/haproxy.cfg` (checked with `haproxy -c`), its
    /// health checks sent where `checks` says, starts HAProxy with it and
    /// returns once both frontends listen.
    pub fn start(haproxy: &Path, dir: &Path, replicas: &[ReplicaProc], checks: Checks) -> Lb {
        let shipped = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/deploy/haproxy/haproxy.cfg"
        ))
        .expect("the shipped haproxy.cfg");
        let (southbound, northbound) = (free_port(), free_port());
        let dead = free_port();
        let targets = |port: fn(&ReplicaProc) -> u16| -> Vec<Target> {
            replicas
                .iter()
                .map(|r| Target {
                    addr: format!("127.0.0.1:{}", port(r)),
                    check_port: match checks {
                        Checks::Readyz => r.http,
                        Checks::Failing => dead,
                    },
                })
                .collect()
        };
        let cfg = haproxy_support::on_loopback(
            &shipped,
            &[("southbound", southbound), ("northbound", northbound)],
            &[
                ("slim_cp_southbound", targets(|r| r.sb)),
                ("slim_cp_northbound", targets(|r| r.nb)),
            ],
            true,
        );
        let file = dir.join("haproxy.cfg");
        std::fs::write(&file, &cfg).expect("haproxy.cfg written");
        haproxy_support::check(haproxy, &file).unwrap_or_else(|e| panic!("{e}"));
        let mut cmd = Command::new(haproxy);
        cmd.arg("-db").arg("-f").arg(&file);
        let mut proc = Proc::spawn("haproxy", cmd, &dir.join("haproxy.log"));
        proc.wait_listening(southbound);
        proc.wait_listening(northbound);
        Lb {
            southbound,
            northbound,
            proc,
            cfg,
        }
    }

    /// What a node's controller client dials.
    pub fn southbound_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.southbound)
    }

    /// HAProxy's log lines for the southbound frontend's connections.
    pub fn southbound_sessions(&self) -> Vec<String> {
        std::fs::read_to_string(self.proc.log_path())
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(" southbound slim_cp_southbound/"))
            .map(str::to_string)
            .collect()
    }

    /// `127.0.0.1:PORT` of the northbound frontend, as slimctl's `--server`.
    pub fn northbound_addr(&self) -> String {
        format!("127.0.0.1:{}", self.northbound)
    }
}
