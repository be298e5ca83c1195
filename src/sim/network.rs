//! The simulated data-plane network: which node serves which endpoint, the
//! running processes' tables, and the in-memory "TCP connections" between
//! them. One lock guards it all, so that a link's two ends appear and
//! vanish together and no two locks are ever held at once.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{mpsc, watch};

use super::commands::{claim_msg, withdraw_msg};
use super::linkcfg::{LinkConfig, parse_addr};
use super::names::NameKey;
use super::tables::{Tables, link_conn};
use crate::proto::{dp, sb};

/// How many notifications a node queues while it has no stream (as upstream).
const MAX_PENDING: usize = 1000;

/// The fleet's latest change: how many there were, and when the last was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change {
    pub count: u64,
    pub at: std::time::Instant,
}

impl Change {
    pub(crate) fn new() -> Change {
        Change {
            count: 0,
            at: std::time::Instant::now(),
        }
    }

    fn record(&mut self) {
        self.count = self.count.wrapping_add(1);
        self.at = std::time::Instant::now();
    }
}

/// Change signals: one per node and optionally one per fleet (tables or
/// state changed), for waiters without polling.
#[derive(Debug)]
pub(crate) struct Signals {
    pub node: watch::Sender<u64>,
    pub fleet: Option<Arc<watch::Sender<Change>>>,
}

impl Signals {
    pub fn new(fleet: Option<Arc<watch::Sender<Change>>>) -> Arc<Signals> {
        Arc::new(Signals {
            node: watch::Sender::new(0),
            fleet,
        })
    }

    /// Wakes the node's and the fleet's waiters (watch channels coalesce,
    /// so a burst of changes costs a waiter one re-check).
    pub fn bump(&self) {
        self.node.send_modify(|v| *v = v.wrapping_add(1));
        if let Some(fleet) = &self.fleet {
            fleet.send_modify(Change::record);
        }
    }
}

/// Messages a node sends the control plane unprompted. Like the real
/// controller it never blocks: when the stream's queue is full or there is
/// no stream, they wait here until the next registration.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    tx: Option<mpsc::Sender<sb::ControlMessage>>,
    pending: VecDeque<sb::ControlMessage>,
}

impl Outbox {
    /// Sends now if possible, otherwise queues (dropping the oldest when full).
    pub fn notify(&mut self, msg: sb::ControlMessage) {
        let msg = match &self.tx {
            Some(tx) => match tx.try_send(msg) {
                Ok(()) => return,
                Err(e) => e.into_inner(),
            },
            None => msg,
        };
        if self.pending.len() >= MAX_PENDING {
            self.pending.pop_front();
        }
        self.pending.push_back(msg);
    }

    /// Attaches a new stream; returns what was queued, to be sent first.
    pub fn attach(&mut self, tx: mpsc::Sender<sb::ControlMessage>) -> Vec<sb::ControlMessage> {
        self.tx = Some(tx);
        self.pending.drain(..).collect()
    }

    /// The stream is gone: queue from now on.
    pub fn detach(&mut self) {
        self.tx = None;
    }
}

/// A running simulated process.
#[derive(Debug)]
pub(crate) struct Process {
    pub incarnation: u64,
    pub node_id: String,
    pub tables: Tables,
    pub outbox: Outbox,
    pub emit_withdrawals: bool,
}

impl Process {
    /// Reports names lost with a connection, as the real controller does:
    /// it forgets their tracked routes and sends one withdrawal per name.
    /// Returns the messages instead of sending when `defer` is set.
    pub fn lose_names(&mut self, names: &[dp::Name], defer: bool) -> Vec<sb::ControlMessage> {
        let mut out = Vec::new();
        for name in names {
            if let Some(key) = NameKey::of(name) {
                self.tables.untrack_name(&key);
            }
            if self.emit_withdrawals {
                out.push(withdraw_msg(name.clone()));
            }
        }
        if !defer {
            for msg in out.drain(..) {
                self.outbox.notify(msg);
            }
        }
        out
    }
}

#[derive(Debug)]
struct NodeSlot {
    signals: Arc<Signals>,
    process: Option<Process>,
}

/// A shared simulated network of nodes, addressed by data-plane endpoint.
#[derive(Debug, Default)]
pub struct SimNetwork {
    state: Mutex<NetState>,
}

/// Everything behind the network's lock.
#[derive(Debug, Default)]
pub(crate) struct NetState {
    nodes: HashMap<String, NodeSlot>,
    exact: HashMap<String, String>,
    wildcard: HashMap<u16, String>,
    wires: HashMap<u64, (String, String)>,
    next_wire: u64,
}

impl SimNetwork {
    /// An empty network.
    pub fn new() -> Arc<SimNetwork> {
        Arc::new(SimNetwork::default())
    }

    /// The effective id of the running node that serves `endpoint`.
    pub fn resolve(&self, endpoint: &str) -> Option<String> {
        self.lock().resolve(endpoint)
    }

    /// How many processes run in the network.
    pub fn running(&self) -> usize {
        let net = self.lock();
        net.nodes.values().filter(|s| s.process.is_some()).count()
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, NetState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl NetState {
    /// Makes the node known (its slot outlives its processes); false when
    /// a node with that id is running in the network. A stopped node's slot
    /// is taken over (the same machine back with a new configuration).
    pub fn add_node(&mut self, key: &str, signals: Arc<Signals>) -> bool {
        if self.nodes.get(key).is_some_and(|s| s.process.is_some()) {
            return false;
        }
        let slot = NodeSlot {
            signals,
            process: None,
        };
        self.nodes.insert(key.to_string(), slot);
        true
    }

    /// A running process, if it is the given incarnation.
    pub fn process(&mut self, key: &str, incarnation: u64) -> Option<&mut Process> {
        let slot = self.nodes.get_mut(key)?;
        slot.process
            .as_mut()
            .filter(|p| p.incarnation == incarnation)
    }

    /// Any running process of the node.
    pub fn current(&self, key: &str) -> Option<&Process> {
        self.nodes.get(key)?.process.as_ref()
    }

    /// Wakes the node's waiters.
    pub fn bump(&self, key: &str) {
        if let Some(slot) = self.nodes.get(key) {
            slot.signals.bump();
        }
    }

    /// Starts a process: fresh tables (plus the local apps' subscriptions
    /// in `restore`), and the node serves its endpoints from now on.
    pub fn start_process(&mut self, key: &str, start: ProcessStart) {
        let Some(slot) = self.nodes.get_mut(key) else {
            return;
        };
        let mut tables = Tables::new();
        for name in &start.restore {
            if let Some(k) = NameKey::of(name) {
                let app = tables.app_conn();
                tables.subscribe(k, name, app);
            }
        }
        slot.process = Some(Process {
            incarnation: start.incarnation,
            node_id: start.node_id,
            tables,
            outbox: Outbox::default(),
            emit_withdrawals: start.emit_withdrawals,
        });
        slot.signals.bump();
        for endpoint in &start.endpoints {
            self.index(endpoint, key);
        }
    }

    fn index(&mut self, endpoint: &str, key: &str) {
        let Some(addr) = parse_addr(endpoint) else {
            tracing::warn!(%endpoint, node = %key, "sim: unparsable data-plane endpoint");
            return;
        };
        let previous = if addr.is_wildcard() {
            self.wildcard.insert(addr.port, key.to_string())
        } else {
            self.exact.insert(addr.key(), key.to_string())
        };
        if let Some(prev) = previous.filter(|p| p != key) {
            tracing::warn!(%endpoint, node = %key, %prev, "sim: endpoint served twice");
        }
    }

    /// The node whose running process serves `endpoint`.
    pub fn resolve(&self, endpoint: &str) -> Option<String> {
        let addr = parse_addr(endpoint)?;
        let key = self
            .exact
            .get(&addr.key())
            .or_else(|| self.wildcard.get(&addr.port))?;
        self.current(key).map(|_| key.clone())
    }

    /// Ends a process (crash or exit): it stops serving, its tables are
    /// gone, and the far ends of its connections see them close.
    pub fn stop_process(&mut self, key: &str, incarnation: u64) -> bool {
        let Some(slot) = self.nodes.get_mut(key) else {
            return false;
        };
        if slot.process.as_ref().map(|p| p.incarnation) != Some(incarnation) {
            return false;
        }
        let Some(process) = slot.process.take() else {
            return false;
        };
        slot.signals.bump();
        self.exact.retain(|_, v| v != key);
        self.wildcard.retain(|_, v| v != key);
        let wires: Vec<u64> = process.tables.conns().filter_map(|c| c.wire).collect();
        for wire in wires {
            self.close_far_end(wire, key);
        }
        true
    }

    /// Closes one of `key`'s connections (both ends). Returns the
    /// withdrawals `key` owes the control plane, for the caller to send
    /// after its reply; the far end reports its own at once.
    pub fn disconnect(&mut self, key: &str, conn_id: u64) -> Vec<sb::ControlMessage> {
        let Some(process) = self.nodes.get_mut(key).and_then(|s| s.process.as_mut()) else {
            return Vec::new();
        };
        let Some((conn, names)) = process.tables.remove_conn(conn_id) else {
            return Vec::new();
        };
        process.tables.untrack_conn(conn_id);
        let owed = process.lose_names(&names, true);
        if let Some(wire) = conn.wire {
            self.close_far_end(wire, key);
        }
        self.bump(key);
        owed
    }

    /// Removes the other end of `wire` (seen from `from`), reporting lost names.
    fn close_far_end(&mut self, wire: u64, from: &str) {
        let Some((a, b)) = self.wires.remove(&wire) else {
            return;
        };
        let far = if a == from { b } else { a };
        let Some(slot) = self.nodes.get_mut(&far) else {
            return;
        };
        if let Some(process) = slot.process.as_mut() {
            let id = process.tables.conns().find(|c| c.wire == Some(wire));
            if let Some(id) = id.map(|c| c.id) {
                if let Some((_, names)) = process.tables.remove_conn(id) {
                    process.lose_names(&names, false);
                }
            }
        }
        slot.signals.bump();
    }

    /// Dials from `key`'s process. On success both ends hold the
    /// connection and a remote link's destination tells its control plane
    /// (`connections_received`). The error is what follows the node's
    /// "Connection failed: ".
    pub fn dial(&mut self, key: &str, req: &Dial<'_>) -> Result<u64, String> {
        let far = self.resolve(&req.cfg.endpoint).filter(|_| !req.refuse);
        let Some(far) = far else {
            return Err("grpc error".to_string());
        };
        let src_id = self
            .current(key)
            .map(|p| p.node_id.clone())
            .unwrap_or_default();
        let (kind, link) = (req.cfg.conn_type, req.link_id);
        let wire = self.next_wire;
        self.next_wire += 1;
        let Some(dst) = self.nodes.get_mut(&far).and_then(|s| s.process.as_mut()) else {
            return Err("grpc error".to_string());
        };
        let dst_id = dst.node_id.clone();
        let incoming = link_conn(kind, sb::ConnectionDirection::Incoming, link, &src_id, wire);
        dst.tables.insert_conn(incoming);
        if kind == sb::ConnectionType::Remote && !link.is_empty() {
            dst.outbox.notify(claim_msg(link));
        }
        self.bump(&far);
        let Some(src) = self.nodes.get_mut(key).and_then(|s| s.process.as_mut()) else {
            return Err("grpc error".to_string());
        };
        let mut outgoing = link_conn(kind, sb::ConnectionDirection::Outgoing, link, &dst_id, wire);
        outgoing.endpoint = Some(req.cfg.endpoint.clone());
        outgoing.config_data = Some(req.config_data.to_string());
        let id = src.tables.insert_conn(outgoing);
        self.wires.insert(wire, (key.to_string(), far));
        self.bump(key);
        Ok(id)
    }
}

/// A connection to create.
#[derive(Debug, Clone)]
pub(crate) struct Dial<'a> {
    /// The parsed client configuration.
    pub cfg: &'a LinkConfig,
    /// Its text, kept as the connection's configuration.
    pub config_data: &'a str,
    /// The link id the connection carries.
    pub link_id: &'a str,
    /// Fault injection: refuse as if nothing listened.
    pub refuse: bool,
}

/// What a new process starts from.
#[derive(Debug, Clone)]
pub(crate) struct ProcessStart {
    pub incarnation: u64,
    pub node_id: String,
    pub endpoints: Vec<String>,
    pub restore: Vec<dp::Name>,
    pub emit_withdrawals: bool,
}
