//! A real `slim` data-plane node process and the config it runs with.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::{Proc, free_port, upstream, upstream_bin_v3};

/// How to configure a `slim` node.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    /// `services.slim/0.node_id`; the control plane knows the node as
    /// `{group}/{id}` (or `id` without a group).
    pub id: String,
    /// `services.slim/0.group_name`.
    pub group: Option<String>,
    /// Data-plane server port; `None` picks a free one. Preset it when
    /// another node's static peer list must name it before it starts.
    pub dataplane_port: Option<u16>,
    /// Announce `metadata.external_endpoint` (required for a node to be
    /// the destination of an inter-group link).
    pub external_endpoint: bool,
    /// Also run the node's own controller server (slimctl `node ...`).
    pub local_api: bool,
    /// Static same-group peers: (their node id, their data-plane port).
    pub peers: Vec<(String, u16)>,
    pub log_level: String,
    /// Run the SLIM 3.x `slim` (see `upstream_bin_v3`), whose config names
    /// the group `domain_name`.
    pub v3: bool,
    /// 3.x only: sign the registration with this shared secret
    /// (`auth: {type: shared_secret}` of the service).
    pub auth_secret: Option<String>,
    /// More `metadata` of the data-plane server. A 3.x node sends it in a
    /// field of its revision only, which is how the control plane tells
    /// its revision.
    pub metadata: Vec<(String, String)>,
}

impl NodeSpec {
    pub fn new(group: &str, id: &str) -> NodeSpec {
        NodeSpec {
            id: id.to_string(),
            group: Some(group.to_string()),
            dataplane_port: None,
            external_endpoint: true,
            local_api: false,
            peers: Vec::new(),
            log_level: "debug".into(),
            v3: false,
            auth_secret: None,
            metadata: Vec::new(),
        }
    }

    /// One more entry in the data-plane server's metadata.
    pub fn metadata(mut self, key: &str, value: &str) -> NodeSpec {
        self.metadata.push((key.to_string(), value.to_string()));
        self
    }

    /// A SLIM 3.x node.
    pub fn v3(mut self) -> NodeSpec {
        self.v3 = true;
        self
    }

    /// A SLIM 3.x node registering with a token under `secret`.
    pub fn auth_secret(mut self, secret: &str) -> NodeSpec {
        self.v3 = true;
        self.auth_secret = Some(secret.to_string());
        self
    }

    pub fn port(mut self, port: u16) -> NodeSpec {
        self.dataplane_port = Some(port);
        self
    }

    pub fn local_api(mut self) -> NodeSpec {
        self.local_api = true;
        self
    }

    pub fn no_external_endpoint(mut self) -> NodeSpec {
        self.external_endpoint = false;
        self
    }

    pub fn peer(mut self, node_id: &str, dataplane_port: u16) -> NodeSpec {
        self.peers.push((node_id.to_string(), dataplane_port));
        self
    }

    /// The id the control plane lists the node under.
    pub fn full_id(&self) -> String {
        match &self.group {
            Some(g) => format!("{g}/{}", self.id),
            None => self.id.clone(),
        }
    }

    /// The node's YAML. Key names are those of agntcy-slim 2.0.0-alpha.2
    /// (agntcy-slim-service 0.10 `ServiceConfiguration`, which rejects
    /// unknown keys; agntcy-slim-config 0.11 server/client configs).
    fn yaml(&self, dataplane: u16, local_api: Option<u16>, southbound_url: &str) -> String {
        let mut y = format!(
            "tracing:\n  log_level: {}\n  display_thread_names: false\n\
             runtime:\n  drain_timeout: 2s\n\
             services:\n  slim/0:\n    node_id: \"{}\"\n",
            self.log_level, self.id
        );
        if let Some(g) = &self.group {
            let key = if self.v3 { "domain_name" } else { "group_name" };
            y.push_str(&format!("    {key}: \"{g}\"\n"));
        }
        if let Some(secret) = &self.auth_secret {
            y.push_str(&format!(
                "    auth:\n      type: shared_secret\n      secret: \"{secret}\"\n"
            ));
        }
        // `insecure: true` on the server matters beyond TLS: without it the
        // node reports SPIRE mTLS connection details to the control plane.
        y.push_str(&format!(
            "    dataplane:\n      servers:\n        - endpoint: \"127.0.0.1:{dataplane}\"\n          tls:\n            insecure: true\n"
        ));
        if self.external_endpoint || !self.metadata.is_empty() {
            y.push_str("          metadata:\n");
        }
        if self.external_endpoint {
            y.push_str(&format!(
                "            external_endpoint: \"127.0.0.1:{dataplane}\"\n"
            ));
        }
        for (k, v) in &self.metadata {
            y.push_str(&format!("            {k}: \"{v}\"\n"));
        }
        y.push_str("      clients: []\n    controller:\n");
        if let Some(p) = local_api {
            y.push_str(&format!(
                "      servers:\n        - endpoint: \"127.0.0.1:{p}\"\n          tls:\n            insecure: true\n"
            ));
        }
        y.push_str(&format!(
            "      clients:\n        - endpoint: \"{southbound_url}\"\n          tls:\n            insecure: true\n"
        ));
        if !self.peers.is_empty() {
            // 2.0.0-alpha.2 names the peers' shared identity; 3.x derives
            // it from `domain_name` and refuses the key.
            y.push_str("    peers:\n");
            if !self.v3 {
                let deployment = self.group.as_deref().unwrap_or("slim");
                y.push_str(&format!("      deployment_name: \"{deployment}\"\n"));
            }
            y.push_str("      discovery:\n        type: static\n        peers:\n");
            for (id, port) in &self.peers {
                y.push_str(&format!(
                    "          - node_id: \"{id}\"\n            endpoint: \"http://127.0.0.1:{port}\"\n            tls:\n              insecure: true\n"
                ));
            }
        }
        y
    }
}

/// A real `slim` data-plane node process.
pub struct SlimNode {
    pub spec: NodeSpec,
    pub dataplane: u16,
    pub local_api: Option<u16>,
    config: PathBuf,
    proc: Proc,
}

impl SlimNode {
    /// Writes `<dir>/node-<group>-<id>.yaml` and starts the node pointed at
    /// `southbound_url`; returns once its data-plane server listens (its
    /// registration is the caller's to wait for).
    pub fn start(dir: &Path, spec: NodeSpec, southbound_url: &str) -> SlimNode {
        let dataplane = spec.dataplane_port.unwrap_or_else(free_port);
        let local_api = spec.local_api.then(free_port);
        let stem = format!("node-{}", spec.full_id().replace('/', "-"));
        let config = dir.join(format!("{stem}.yaml"));
        std::fs::write(&config, spec.yaml(dataplane, local_api, southbound_url))
            .expect("write node config");
        let log = dir.join(format!("{stem}.log"));
        let proc = Proc::spawn(&stem, Self::command(spec.v3, &config, dir), &log);
        let mut node = SlimNode {
            spec,
            dataplane,
            local_api,
            config,
            proc,
        };
        node.proc.wait_listening(dataplane);
        node
    }

    fn command(v3: bool, config: &Path, dir: &Path) -> Command {
        let bin = match v3 {
            true => upstream_bin_v3("slim").expect("the test required slim 3.x"),
            false => upstream("slim"),
        };
        let mut cmd = Command::new(bin);
        cmd.arg("--config").arg(config).current_dir(dir);
        cmd
    }

    pub fn full_id(&self) -> String {
        self.spec.full_id()
    }

    /// The data-plane URL apps (`slimctl bench --server`) connect to.
    pub fn dataplane_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.dataplane)
    }

    pub fn proc(&mut self) -> &mut Proc {
        &mut self.proc
    }

    /// SIGKILL: a crash.
    pub fn kill(&mut self) {
        self.proc.kill();
    }

    /// SIGTERM: a graceful stop. A 2.0.0-alpha.2 node drains and closes
    /// its control stream but never sends `DeregisterNodeRequest` (the
    /// binary does not call its service's `deregister`), so to the
    /// control plane this looks like a crash too.
    pub fn terminate(&mut self) {
        self.proc.terminate(Duration::from_secs(10));
    }

    /// Starts the node again with the same config (same id and ports).
    pub fn restart(&mut self) {
        self.proc.kill();
        let dir = self.config.parent().expect("config dir").to_path_buf();
        let log = self.proc.log_path().to_path_buf();
        let name = self.proc.name().to_string();
        let cmd = Self::command(self.spec.v3, &self.config, &dir);
        self.proc = Proc::spawn(&name, cmd, &log);
        self.proc.wait_listening(self.dataplane);
    }

    pub fn report(&self, lines: usize) -> String {
        self.proc.report(lines)
    }
}
