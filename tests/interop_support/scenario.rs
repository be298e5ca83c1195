//! One test's world: a control plane, the nodes attached to it, slimctl
//! against it, and a failure report with every log when anything panics.

use std::sync::Mutex;
use std::time::Duration;

use super::{
    ControlPlane, CpConfig, CtlOutput, NodeSpec, PATIENCE, SlimNode, Table, TestDir, poll,
    slimctl_controller,
};

/// Log lines per process in a failure report.
const REPORT_LINES: usize = 120;

pub struct Scenario {
    pub cp: ControlPlane,
    pub nodes: Vec<SlimNode>,
    /// The last slimctl run, for failure reports.
    last_ctl: Mutex<Option<CtlOutput>>,
    /// Declared last so that it is dropped after the processes: their logs
    /// must be complete before the directory is kept or removed.
    pub dir: TestDir,
}

impl Scenario {
    /// A control plane configured by `cfg`; `name` names the scratch dir.
    pub fn new(name: &str, cfg: CpConfig) -> Scenario {
        let dir = TestDir::new(name);
        let cp = ControlPlane::start(dir.path(), "control-plane", &cfg);
        Scenario {
            cp,
            nodes: Vec::new(),
            last_ctl: Mutex::new(None),
            dir,
        }
    }

    /// slim-cp in API mode.
    pub fn api_mode(name: &str) -> Scenario {
        Scenario::new(name, CpConfig::slim_cp())
    }

    /// Starts a node pointed at this control plane; returns its index.
    pub fn start_node(&mut self, spec: NodeSpec) -> usize {
        let node = SlimNode::start(self.dir.path(), spec, &self.cp.southbound_url());
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    /// Starts a node and waits until `node list` shows it Connected.
    pub fn start_registered_node(&mut self, spec: NodeSpec) -> usize {
        let full_id = spec.full_id();
        let i = self.start_node(spec);
        self.wait_node_status(&full_id, "Connected");
        i
    }

    /// The node the control plane lists as `full_id` (`group/id`).
    pub fn node(&mut self, full_id: &str) -> &mut SlimNode {
        self.nodes
            .iter_mut()
            .find(|n| n.full_id() == full_id)
            .unwrap_or_else(|| panic!("no node {full_id} in this scenario"))
    }

    /// `slimctl controller --server <this control plane> <args>`.
    pub fn ctl(&self, args: &[&str]) -> CtlOutput {
        let out = slimctl_controller(self.dir.path(), &self.cp.northbound_addr(), args);
        *self.last_ctl.lock().unwrap_or_else(|e| e.into_inner()) = Some(out.clone());
        out
    }

    /// Like [`Scenario::ctl`], and panics unless the command succeeded.
    pub fn ctl_ok(&self, args: &[&str]) -> CtlOutput {
        let out = self.ctl(args);
        assert!(out.ok(), "slimctl failed:\n{out}");
        out
    }

    /// Like [`Scenario::ctl`], and panics unless the command failed (a
    /// non-zero exit, not a timeout); returns its error message.
    pub fn ctl_err(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        assert!(
            out.code.is_some_and(|c| c != 0),
            "expected slimctl to fail:\n{out}"
        );
        out.error_message()
    }

    /// The table printed by a successful `args`.
    pub fn table(&self, args: &[&str]) -> Table {
        self.ctl_ok(args).table()
    }

    /// Polls `check` until it succeeds; on timeout panics with the last
    /// state it reported (the logs follow from `Drop`).
    pub fn wait_for<T>(&self, what: &str, check: impl FnMut() -> Result<T, String>) -> T {
        self.wait_for_within(PATIENCE, what, check)
    }

    pub fn wait_for_within<T>(
        &self,
        timeout: Duration,
        what: &str,
        check: impl FnMut() -> Result<T, String>,
    ) -> T {
        match poll(timeout, check) {
            Ok(v) => v,
            Err(state) => {
                panic!("timed out after {timeout:?} waiting for {what}; last state: {state}")
            }
        }
    }

    /// Waits until `node list` shows `full_id` with `status`
    /// (`Connected`/`NotConnected`); returns its row.
    pub fn wait_node_status(&self, full_id: &str, status: &str) -> Vec<String> {
        self.wait_for(&format!("node {full_id} to be {status}"), || {
            let out = self.ctl(&["node", "list"]);
            if !out.ok() {
                return Err(out.to_string());
            }
            let t = out.table();
            match t.find("NODE_ID", full_id) {
                Some(row) if t.cell(row, "STATUS") == status => Ok(row.clone()),
                _ => Err(out.stdout),
            }
        })
    }

    /// Everything a reader needs after a failure: the last slimctl run
    /// and the tail of every process log.
    pub fn report(&self) -> String {
        let mut s = String::from("===== interop failure report =====\n");
        if let Some(out) = &*self.last_ctl.lock().unwrap_or_else(|e| e.into_inner()) {
            s.push_str(&format!("----- last slimctl -----\n{out}\n"));
        }
        s.push_str(&self.cp.report(REPORT_LINES));
        for n in &self.nodes {
            s.push_str(&n.report(REPORT_LINES));
        }
        s
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.report());
        }
    }
}
