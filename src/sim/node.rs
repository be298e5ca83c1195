//! The handle to a simulated node: lifecycle, local apps, fault injection
//! and observation.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tonic::transport::Endpoint;

use super::commands::{Faults, announce_msg, withdraw_msg};
use super::names::{NULL_ID, NameKey, make_name};
use super::network::{Change, ProcessStart, Signals};
use super::process::{NodeShared, Proc, Status, lock, run};
use super::session::{Ctl, Dialer};
use super::tables::{SimConnection, SimRoute, Tables};
use super::{NodeState, SimError, SimNetwork, SimNodeSpec, SimOptions};
use crate::proto::{dp, sb};

/// Handle to a simulated node (cheap to clone).
#[derive(Debug, Clone)]
pub struct SimNode {
    shared: Arc<NodeShared>,
}

impl SimNode {
    /// A node (not started) that opens its own TCP connection per attempt,
    /// like a real node. Its effective id must be new to `network`.
    pub fn new(
        spec: SimNodeSpec,
        control_plane: &str,
        network: Arc<SimNetwork>,
        options: SimOptions,
    ) -> Result<SimNode, SimError> {
        let endpoint = endpoint_of(control_plane, &options)?;
        Self::with_dialer(
            spec,
            Dialer::PerAttempt(Box::new(endpoint)),
            network,
            options,
            None,
        )
    }

    pub(crate) fn with_dialer(
        spec: SimNodeSpec,
        dialer: Dialer,
        network: Arc<SimNetwork>,
        options: SimOptions,
        fleet: Option<Arc<watch::Sender<Change>>>,
    ) -> Result<SimNode, SimError> {
        let key = spec.effective_id();
        let signals = Signals::new(fleet);
        if !network.lock().add_node(&key, signals.clone()) {
            return Err(SimError::DuplicateNode(key));
        }
        let status = Status {
            state: NodeState::Starting,
            registrations: 0,
            incarnation: 0,
            running: false,
            abort: None,
            ctl: None,
        };
        let shared = NodeShared {
            spec,
            key,
            options,
            network,
            dialer,
            signals,
            faults: Mutex::new(Faults::default()),
            silent: AtomicBool::new(false),
            commands: AtomicU64::new(0),
            failed_dials: AtomicU64::new(0),
            failed_links: AtomicU64::new(0),
            status: Mutex::new(status),
            apps: Mutex::new(BTreeMap::new()),
        };
        Ok(SimNode {
            shared: Arc::new(shared),
        })
    }

    /// Starts the process (needs a tokio runtime): it serves its data-plane
    /// endpoints at once and dials the control plane.
    pub fn start(&self) -> Result<(), SimError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| SimError::NoRuntime)?;
        let mut st = lock(&self.shared.status);
        if st.running {
            return Err(SimError::AlreadyRunning(self.shared.key.clone()));
        }
        st.incarnation += 1;
        st.running = true;
        st.state = NodeState::Starting;
        let start = ProcessStart {
            incarnation: st.incarnation,
            node_id: self.shared.spec.node_id.clone(),
            endpoints: self.endpoints(),
            restore: lock(&self.shared.apps).values().cloned().collect(),
            emit_withdrawals: self.shared.options.emit_lost_route_withdrawals,
        };
        self.shared
            .network
            .lock()
            .start_process(&self.shared.key, start);
        let (tx, rx) = mpsc::unbounded_channel();
        let proc = Proc {
            shared: self.shared.clone(),
            incarnation: st.incarnation,
        };
        let task = runtime.spawn(run(proc, rx));
        st.abort = Some(task.abort_handle());
        st.ctl = Some(tx);
        drop(st);
        self.shared.signals.bump();
        Ok(())
    }

    fn endpoints(&self) -> Vec<String> {
        let spec = &self.shared.spec;
        let mut out = vec![spec.endpoint.clone()];
        out.extend(spec.external_endpoint.iter().cloned());
        out
    }

    /// The process dies: no deregistration, the stream drops, the tables
    /// and every connection (at both ends) are gone. No-op when not running.
    pub fn crash(&self) {
        let (incarnation, abort) = {
            let mut st = lock(&self.shared.status);
            if !st.running {
                return;
            }
            st.running = false;
            st.state = NodeState::Stopped;
            st.ctl = None;
            (st.incarnation, st.abort.take())
        };
        if let Some(abort) = abort {
            abort.abort();
        }
        self.shared
            .network
            .lock()
            .stop_process(&self.shared.key, incarnation);
        self.shared.signals.bump();
    }

    /// A new process with the same spec (crashing the current one first):
    /// empty tables, local apps' subscriptions restored, dial as at start.
    pub fn restart(&self) -> Result<(), SimError> {
        self.crash();
        self.start()
    }

    /// Sends `DeregisterNodeRequest`, waits for the response, and stops the
    /// process (whatever the outcome: the real node deregisters on exit).
    pub async fn deregister(&self) -> Result<sb::DeregisterNodeResponse, SimError> {
        let ctl = {
            let st = lock(&self.shared.status);
            if st.state != NodeState::Registered {
                return Err(SimError::NotRegistered(self.shared.key.clone()));
            }
            st.ctl.clone()
        };
        let ctl = ctl.ok_or_else(|| SimError::NotRunning(self.shared.key.clone()))?;
        let (tx, rx) = oneshot::channel();
        ctl.send(Ctl::Deregister(tx))
            .map_err(|_| SimError::NotRunning(self.shared.key.clone()))?;
        let limit = self.shared.options.request_timeout + Duration::from_secs(1);
        match tokio::time::timeout(limit, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(SimError::StreamClosed("node stopped".to_string())),
            Err(_) => Err(SimError::Timeout("DeregisterNodeResponse".to_string())),
        }
    }

    /// A local app subscribes `components` (no id): the node announces it
    /// (only on the name's first local subscription). Returns whether a
    /// new subscription was made.
    pub fn announce(&self, components: [&str; 3]) -> Result<bool, SimError> {
        self.announce_name(make_name(components, NULL_ID))
    }

    /// Like [`SimNode::announce`] with a full wire name.
    pub fn announce_name(&self, name: dp::Name) -> Result<bool, SimError> {
        let key = NameKey::of(&name).ok_or_else(|| SimError::InvalidName(format!("{name:?}")))?;
        let incarnation = self.running_incarnation()?;
        let mut net = self.shared.network.lock();
        let p = net
            .process(&self.shared.key, incarnation)
            .ok_or_else(|| SimError::NotRunning(self.shared.key.clone()))?;
        if p.tables.has_local(&key) {
            return Ok(false);
        }
        let app = p.tables.app_conn();
        p.tables.subscribe(key, &name, app);
        p.outbox.notify(announce_msg(name.clone()));
        net.bump(&self.shared.key);
        drop(net);
        lock(&self.shared.apps).insert(key, name);
        Ok(true)
    }

    /// The local apps unsubscribe `components`: the node withdraws it.
    pub fn withdraw(&self, components: [&str; 3]) -> Result<bool, SimError> {
        self.withdraw_name(make_name(components, NULL_ID))
    }

    /// Like [`SimNode::withdraw`] with a full wire name.
    pub fn withdraw_name(&self, name: dp::Name) -> Result<bool, SimError> {
        let key = NameKey::of(&name).ok_or_else(|| SimError::InvalidName(format!("{name:?}")))?;
        let incarnation = self.running_incarnation()?;
        lock(&self.shared.apps).remove(&key);
        let mut net = self.shared.network.lock();
        let p = net
            .process(&self.shared.key, incarnation)
            .ok_or_else(|| SimError::NotRunning(self.shared.key.clone()))?;
        if !p.tables.remove_local(&key) {
            return Ok(false);
        }
        p.tables.untrack_name(&key);
        p.outbox.notify(withdraw_msg(name));
        net.bump(&self.shared.key);
        Ok(true)
    }

    fn running_incarnation(&self) -> Result<u64, SimError> {
        let st = lock(&self.shared.status);
        if st.running {
            Ok(st.incarnation)
        } else {
            Err(SimError::NotRunning(self.shared.key.clone()))
        }
    }
}

/// Fault injection and observation.
impl SimNode {
    /// Answer every item of every command with failure ("injected failure")
    /// and change nothing.
    pub fn set_fail_commands(&self, fail: bool) {
        lock(&self.shared.faults).fail_commands = fail;
    }

    /// Stop answering (and applying) commands and list requests; messages
    /// received meanwhile are dropped, as by a hung node.
    pub fn set_silent(&self, silent: bool) {
        self.shared.silent.store(silent, Ordering::Relaxed);
    }

    /// Connections to `endpoint` fail as if nothing listened there.
    pub fn set_fail_connections_to(&self, endpoint: Option<&str>) {
        lock(&self.shared.faults).refuse_endpoint = endpoint.map(str::to_string);
    }

    /// The spec the node was created with.
    pub fn spec(&self) -> &SimNodeSpec {
        &self.shared.spec
    }

    /// The configured node id.
    pub fn id(&self) -> &str {
        &self.shared.spec.node_id
    }

    /// `group/node` (or the bare id without a group).
    pub fn effective_id(&self) -> &str {
        &self.shared.key
    }

    /// Current lifecycle state.
    pub fn state(&self) -> NodeState {
        lock(&self.shared.status).state.clone()
    }

    /// Whether the node gave up on the control plane.
    pub fn is_lost(&self) -> bool {
        matches!(self.state(), NodeState::Lost { .. })
    }

    /// `ConfigurationCommand` messages received so far (all processes,
    /// silent periods included; the registration response is not one).
    pub fn commands_received(&self) -> u64 {
        self.shared.commands.load(Ordering::Relaxed)
    }

    /// Link dials that failed so far (all processes).
    pub fn failed_dials(&self) -> u64 {
        self.shared.failed_dials.load(Ordering::Relaxed)
    }

    /// Connections asked for that failed (all processes), whether the
    /// node could not read their configuration or could not dial.
    pub fn failed_links(&self) -> u64 {
        self.shared.failed_links.load(Ordering::Relaxed)
    }

    /// Successful registrations so far (all processes).
    pub fn registrations(&self) -> u64 {
        lock(&self.shared.status).registrations
    }

    fn tables<R>(&self, f: impl FnOnce(&Tables) -> R) -> Option<R> {
        let net = self.shared.network.lock();
        net.current(&self.shared.key).map(|p| f(&p.tables))
    }

    /// Non-local connections (links), in id order; empty when not running.
    pub fn connections(&self) -> Vec<SimConnection> {
        let all = self.all_connections();
        all.into_iter()
            .filter(|c| c.conn_type != sb::ConnectionType::Local)
            .collect()
    }

    /// Every connection, local ones included.
    pub fn all_connections(&self) -> Vec<SimConnection> {
        self.tables(|t| t.conns().cloned().collect())
            .unwrap_or_default()
    }

    /// Names routed over non-local connections.
    pub fn routes(&self) -> Vec<SimRoute> {
        self.tables(Tables::routes).unwrap_or_default()
    }

    /// Names the local apps subscribed (what the node replays).
    pub fn local_subscriptions(&self) -> Vec<dp::Name> {
        lock(&self.shared.apps).values().cloned().collect()
    }

    /// What the node would answer to `ConnectionListRequest` (unchunked).
    pub fn connection_entries(&self) -> Vec<sb::ConnectionEntry> {
        self.tables(Tables::connection_entries).unwrap_or_default()
    }

    /// What the node would answer to `RouteListRequest` (unchunked).
    pub fn route_entries(&self) -> Vec<sb::RouteEntry> {
        self.tables(Tables::route_entries).unwrap_or_default()
    }

    /// Waits until registered; false on timeout or when the node stopped
    /// or was lost.
    pub async fn wait_registered(&self, timeout: Duration) -> bool {
        self.wait_until(|n| !matches!(n.state(), NodeState::Starting), timeout)
            .await;
        self.state() == NodeState::Registered
    }

    /// Waits until `pred` holds, re-checking on every change of the node's
    /// state or tables; returns whether it held before `timeout`.
    pub async fn wait_until(
        &self,
        mut pred: impl FnMut(&SimNode) -> bool,
        timeout: Duration,
    ) -> bool {
        let mut changes = self.shared.signals.node.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            changes.borrow_and_update();
            if pred(self) {
                return true;
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => continue,
                _ => return pred(self),
            }
        }
    }
}

/// A tonic endpoint for the control-plane URL.
pub(crate) fn endpoint_of(url: &str, options: &SimOptions) -> Result<Endpoint, SimError> {
    let endpoint = Endpoint::from_shared(url.to_string())
        .map_err(|e| SimError::InvalidUrl(url.to_string(), e.to_string()))?;
    Ok(endpoint.connect_timeout(options.register_timeout))
}
