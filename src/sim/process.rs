//! A simulated node's process task and the retry rules of a 2.0.0-alpha.2
//! node: retry TCP refusals at process start; after a registered stream
//! breaks, exactly one reconnect attempt; any other failure before
//! registration completes and it gives up for good.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use super::commands::Faults;
use super::names::NameKey;
use super::network::Signals;
use super::session::{Ctl, Dialer, End, OpenError, Stream, handshake, open, serve};
use super::tables::{SimConnection, Tables};
use super::{NodeState, SimNetwork, SimNodeSpec, SimOptions};
use crate::proto::sb::control_message::Payload;
use crate::proto::{dp, sb};
use crate::revision::Revision;

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug)]
pub(super) struct Status {
    pub state: NodeState,
    pub registrations: u64,
    pub incarnation: u64,
    pub running: bool,
    pub abort: Option<AbortHandle>,
    pub ctl: Option<mpsc::UnboundedSender<Ctl>>,
}

/// What a node's handle and its process task share.
#[derive(Debug)]
pub(crate) struct NodeShared {
    pub spec: SimNodeSpec,
    pub key: String,
    pub options: SimOptions,
    pub network: Arc<SimNetwork>,
    pub dialer: Dialer,
    pub signals: Arc<Signals>,
    pub faults: Mutex<Faults>,
    pub silent: AtomicBool,
    /// `ConfigurationCommand` messages received on registered streams
    /// (all processes), so benchmarks can compare how chatty control planes are.
    pub commands: AtomicU64,
    /// Dials of links that failed (all processes).
    pub failed_dials: AtomicU64,
    /// Connections a command asked for that the node refused or failed to
    /// make, parse errors included (all processes).
    pub failed_links: AtomicU64,
    pub status: Mutex<Status>,
    /// What local apps subscribed, kept across restarts (apps come back).
    pub apps: Mutex<BTreeMap<NameKey, dp::Name>>,
}

/// One process incarnation of a node, as its task sees it.
pub(crate) struct Proc {
    pub shared: Arc<NodeShared>,
    pub incarnation: u64,
}

impl Proc {
    /// Sets the state unless a newer process replaced this one.
    fn set_state(&self, state: NodeState, registered: bool) {
        let mut st = lock(&self.shared.status);
        if st.incarnation != self.incarnation || !st.running {
            return;
        }
        st.state = state;
        if registered {
            st.registrations += 1;
        }
        // Counted before the lock goes: see `SimFleet::last_change`.
        self.shared.signals.bump();
    }

    pub fn registered(&self) {
        self.set_state(NodeState::Registered, true);
    }

    /// Gives up on the control plane; the process keeps running.
    fn lose(&self, reason: String) {
        tracing::info!(node = %self.shared.key, %reason, "sim: node lost");
        if let Some(p) = self
            .shared
            .network
            .lock()
            .process(&self.shared.key, self.incarnation)
        {
            p.outbox.detach();
        }
        self.set_state(NodeState::Lost { reason }, false);
    }

    /// The process exits: `Stopped` after deregistering, `Lost` when the
    /// control plane failed its stream open at process start (the real
    /// process exits then, data plane included).
    fn exit(&self, state: NodeState) {
        {
            let mut st = lock(&self.shared.status);
            if st.incarnation != self.incarnation || !st.running {
                return;
            }
            st.running = false;
            st.state = state;
            st.ctl = None;
            st.abort = None;
        }
        self.shared
            .network
            .lock()
            .stop_process(&self.shared.key, self.incarnation);
        self.shared.signals.bump();
    }

    /// Before redialling: no stream, outgoing remote links dropped, maps cleared.
    fn prepare_reconnect(&self) {
        self.set_state(NodeState::Starting, false);
        let mut net = self.shared.network.lock();
        let key = self.shared.key.as_str();
        let outgoing: Vec<u64> = match net.process(key, self.incarnation) {
            Some(p) => {
                p.outbox.detach();
                p.tables
                    .conns()
                    .filter(|c| is_cp_managed(c))
                    .map(|c| c.id)
                    .collect()
            }
            None => return,
        };
        let mut owed = Vec::new();
        for id in outgoing {
            owed.extend(net.disconnect(key, id));
        }
        if let Some(p) = net.process(key, self.incarnation) {
            p.tables.tracked.clear();
            for msg in owed {
                p.outbox.notify(msg);
            }
        }
    }

    pub fn registration(&self) -> Option<sb::ControlMessage> {
        let spec = &self.shared.spec;
        let connections = self.with_tables(|t| t.registration_connections())?;
        let req = sb::RegisterNodeRequest {
            node_id: spec.node_id.clone(),
            connection_details: vec![listener(spec)],
            group_name: spec.group.clone(),
            connections,
            routes: Vec::new(),
            credentials: spec.credentials.clone(),
        };
        Some(super::commands::control(Payload::RegisterNodeRequest(req)))
    }

    /// The revision the node speaks.
    pub fn revision(&self) -> Revision {
        self.shared.spec.revision
    }

    /// Attaches the new stream's sender; returns the queued notifications.
    pub fn attach(&self, tx: &mpsc::Sender<sb::ControlMessage>) -> Vec<sb::ControlMessage> {
        let mut net = self.shared.network.lock();
        match net.process(&self.shared.key, self.incarnation) {
            Some(p) => p.outbox.attach(tx.clone()),
            None => Vec::new(),
        }
    }

    /// Sends (or queues) unprompted messages.
    pub fn notify(&self, msgs: Vec<sb::ControlMessage>) {
        let mut net = self.shared.network.lock();
        if let Some(p) = net.process(&self.shared.key, self.incarnation) {
            for msg in msgs {
                p.outbox.notify(msg);
            }
        }
    }

    pub fn with_tables<R>(&self, f: impl FnOnce(&mut Tables) -> R) -> Option<R> {
        let mut net = self.shared.network.lock();
        net.process(&self.shared.key, self.incarnation)
            .map(|p| f(&mut p.tables))
    }

    pub fn local_names(&self) -> Vec<dp::Name> {
        self.with_tables(|t| t.local_names()).unwrap_or_default()
    }

    pub fn faults(&self) -> Faults {
        lock(&self.shared.faults).clone()
    }

    /// Counts one `ConfigurationCommand` received from the control plane.
    pub fn count_command(&self) {
        self.shared.commands.fetch_add(1, Ordering::Relaxed);
    }

    pub fn silent(&self) -> bool {
        self.shared.silent.load(Ordering::Relaxed)
    }
}

/// What the real node drops before it redials: outgoing remote connections.
fn is_cp_managed(c: &SimConnection) -> bool {
    c.direction == sb::ConnectionDirection::Outgoing && c.conn_type == sb::ConnectionType::Remote
}

/// Opens a stream, bounded by the registration timeout.
async fn open_bounded(p: &Proc) -> Result<Stream, OpenError> {
    let limit = p.shared.options.register_timeout;
    match tokio::time::timeout(limit, open(&p.shared.dialer)).await {
        Ok(result) => result,
        Err(_) => Err(OpenError::Grpc(
            "timed out waiting for response headers".to_string(),
        )),
    }
}

/// At process start: retry while nothing listens; any other failure is fatal.
async fn first_stream(p: &Proc) -> Result<Stream, String> {
    loop {
        match open_bounded(p).await {
            Ok(stream) => return Ok(stream),
            Err(OpenError::Connect(e)) => {
                tracing::debug!(node = %p.shared.key, error = %e, "sim: control plane not reachable, retrying");
                tokio::time::sleep(p.shared.options.connect_retry_interval).await;
            }
            Err(e) => return Err(format!("failed to connect to control plane: {e}")),
        }
    }
}

/// The process task.
pub(super) async fn run(p: Proc, mut ctl: mpsc::UnboundedReceiver<Ctl>) {
    let mut stream = match first_stream(&p).await {
        Ok(s) => s,
        Err(reason) => {
            tracing::info!(node = %p.shared.key, %reason, "sim: node lost, process exits");
            return p.exit(NodeState::Lost { reason });
        }
    };
    loop {
        if let Err(reason) = handshake(&p, &mut stream).await {
            return p.lose(reason);
        }
        match serve(&p, &mut stream, &mut ctl).await {
            End::Deregistered => return p.exit(NodeState::Stopped),
            End::Broken(why) => {
                tracing::info!(node = %p.shared.key, %why, "sim: control stream ended, reconnecting once");
                p.prepare_reconnect();
                drop(stream);
                stream = match open_bounded(&p).await {
                    Ok(s) => s,
                    Err(e) => return p.lose(format!("failed to reconnect to control plane: {e}")),
                };
            }
        }
    }
}

/// The node's one data-plane listener, written in its revision.
fn listener(spec: &SimNodeSpec) -> sb::ConnectionDetails {
    use prost_types::value::Kind;
    let value = |v: &String| prost_types::Value {
        kind: Some(Kind::StringValue(v.clone())),
    };
    let fields = spec.metadata.iter().map(|(k, v)| (k.clone(), value(v)));
    let metadata = prost_types::Struct {
        fields: fields.collect(),
    };
    sb::ConnectionDetails {
        endpoint: spec.endpoint.clone(),
        external_endpoint: spec.external_endpoint.clone(),
        metadata: (!spec.metadata.is_empty()).then_some(metadata),
        form: spec.revision.into(),
        ..Default::default()
    }
}
