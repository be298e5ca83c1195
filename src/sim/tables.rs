//! A node's connection table, subscription table and the controller's route
//! tracking, modelled on the real node's three structures because their
//! interplay is what the control plane meets in practice:
//!
//! - the connection table is a pool: ids start at 0 (the controller's own
//!   local connection) and freed ids are reused, last freed first;
//! - the subscription table holds one record per subscribe (keyed by a
//!   subscription id); a name stays routed over a connection while any
//!   record for it remains, and removing one needs that record's exact id;
//! - the controller remembers, per (name, connection), the id of the last
//!   subscribe it issued (`tracked`). A full-state reconcile only removes
//!   tracked routes, and an untracked delete fails in the data path.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::names::{NULL_ID, NameKey, name_from_key, strings_of};
use crate::proto::dp;
use crate::proto::sb;

/// How many entries the node puts in one list reply.
pub const LIST_CHUNK: usize = 100;

/// One row of a node's connection table, as tests observe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConnection {
    /// Connection id in the node's pool (reported on the wire).
    pub id: u64,
    /// Local, remote, peer or edge.
    pub conn_type: sb::ConnectionType,
    /// Outgoing (this node dialled) or incoming.
    pub direction: sb::ConnectionDirection,
    /// The link id negotiated for the connection.
    pub link_id: Option<String>,
    /// For an outgoing connection, the endpoint it dialled.
    pub endpoint: Option<String>,
    /// The node id at the other end.
    pub remote_node: Option<String>,
    /// For an outgoing connection, the client configuration it was created from.
    pub config_data: Option<String>,
    /// Identity of the simulated transport connection (both ends share it).
    pub(crate) wire: Option<u64>,
}

/// One routed name over one non-local connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimRoute {
    /// String components as first recorded for the name's prefix.
    pub name: [String; 3],
    /// The name's component id (`NULL_ID` for none).
    pub name_id: u128,
    /// The connection the name is routed over.
    pub conn_id: u64,
    /// That connection's link id.
    pub link_id: Option<String>,
}

/// What the controller remembers about a route it installed.
#[derive(Debug, Clone)]
pub(crate) struct Tracked {
    pub sub_id: u64,
    pub name: dp::Name,
}

/// A node's tables. Pure data: no I/O, no peers.
#[derive(Debug)]
pub struct Tables {
    conns: BTreeMap<u64, SimConnection>,
    free_ids: Vec<u64>,
    next_conn: u64,
    slots: BTreeMap<NameKey, BTreeMap<u64, BTreeSet<u64>>>,
    strings: HashMap<[u64; 3], [String; 3]>,
    subs: HashMap<u64, (NameKey, u64)>,
    pub(crate) tracked: HashMap<(NameKey, u64), Tracked>,
    next_sub: u64,
    app_conn: Option<u64>,
}

impl Default for Tables {
    fn default() -> Self {
        Self::new()
    }
}

impl Tables {
    /// Fresh tables of a starting process: only the controller's local
    /// connection (id 0), which the node reports like any other.
    pub fn new() -> Tables {
        let mut tables = Tables {
            conns: BTreeMap::new(),
            free_ids: Vec::new(),
            next_conn: 0,
            slots: BTreeMap::new(),
            strings: HashMap::new(),
            subs: HashMap::new(),
            tracked: HashMap::new(),
            next_sub: 1,
            app_conn: None,
        };
        tables.insert_conn(local_conn());
        tables
    }

    /// Inserts a connection, reusing the last freed id first.
    pub fn insert_conn(&mut self, mut conn: SimConnection) -> u64 {
        let id = self.free_ids.pop().unwrap_or_else(|| {
            let id = self.next_conn;
            self.next_conn += 1;
            id
        });
        conn.id = id;
        self.conns.insert(id, conn);
        id
    }

    /// Removes a connection and every subscription record on it. Returns
    /// the connection and the names that were routed over it (the node
    /// reports those to the control plane as lost).
    pub fn remove_conn(&mut self, id: u64) -> Option<(SimConnection, Vec<dp::Name>)> {
        let conn = self.conns.remove(&id)?;
        self.free_ids.push(id);
        if self.app_conn == Some(id) {
            self.app_conn = None;
        }
        let keys: Vec<NameKey> = self
            .slots
            .iter()
            .filter(|(_, by_conn)| by_conn.contains_key(&id))
            .map(|(key, _)| *key)
            .collect();
        let mut names = Vec::with_capacity(keys.len());
        for key in keys {
            names.push(self.name_of(&key));
            let subs = self.slot_mut(&key).and_then(|s| s.remove(&id));
            for sub in subs.into_iter().flatten() {
                self.subs.remove(&sub);
            }
            self.prune(&key);
        }
        Some((conn, names))
    }

    /// A connection by id.
    pub fn conn(&self, id: u64) -> Option<&SimConnection> {
        self.conns.get(&id)
    }

    /// All connections, in id order.
    pub fn conns(&self) -> impl Iterator<Item = &SimConnection> {
        self.conns.values()
    }

    /// The first connection (by id) carrying `link_id`, any direction.
    pub fn find_link(&self, link_id: &str) -> Option<u64> {
        self.conns
            .values()
            .find(|c| c.link_id.as_deref() == Some(link_id))
            .map(|c| c.id)
    }

    /// The local connection the simulated apps subscribe on, created on
    /// first use like an app's local connection.
    pub fn app_conn(&mut self) -> u64 {
        match self.app_conn {
            Some(id) => id,
            None => {
                let id = self.insert_conn(local_conn());
                self.app_conn = Some(id);
                id
            }
        }
    }

    /// Adds one subscription record for `name` on `conn`; returns its id.
    /// The caller has checked that the name has an encoded form.
    pub fn subscribe(&mut self, key: NameKey, name: &dp::Name, conn: u64) -> u64 {
        let sub = self.fresh_sub_id();
        self.strings
            .entry(key.prefix)
            .or_insert_with(|| strings_of(name));
        self.slots
            .entry(key)
            .or_default()
            .entry(conn)
            .or_default()
            .insert(sub);
        self.subs.insert(sub, (key, conn));
        sub
    }

    /// A subscription id never used before (what the controller draws for
    /// every subscribe or untracked unsubscribe).
    pub fn fresh_sub_id(&mut self) -> u64 {
        let sub = self.next_sub;
        self.next_sub += 1;
        sub
    }

    /// Removes the record `sub` for `key` on `conn`, with the data path's
    /// checks in its order and its error texts.
    pub fn unsubscribe(&mut self, key: NameKey, conn: u64, sub: u64) -> Result<(), String> {
        if !self.strings.contains_key(&key.prefix) {
            return Err("subscription not found".to_string());
        }
        if !self.slots.contains_key(&key) {
            return Err(format!("id not found: {}", id_text(key.id)));
        }
        match self.subs.get(&sub) {
            None => return Err(format!("subscription id not found: {sub}")),
            Some((_, c)) if *c != conn => return Err(format!("connection id not found: {conn}")),
            Some((k, _)) if *k != key => return Err(format!("subscription id not found: {sub}")),
            Some(_) => {}
        }
        self.subs.remove(&sub);
        if let Some(by_conn) = self.slot_mut(&key) {
            if let Some(set) = by_conn.get_mut(&conn) {
                set.remove(&sub);
                if set.is_empty() {
                    by_conn.remove(&conn);
                }
            }
        }
        self.prune(&key);
        Ok(())
    }

    /// Whether any record routes `key` over `conn`.
    pub fn is_routed(&self, key: &NameKey, conn: u64) -> bool {
        self.slots.get(key).is_some_and(|s| s.contains_key(&conn))
    }

    /// Forgets every tracked route of a name (what the controller does when
    /// the data path reports the name unsubscribed).
    pub fn untrack_name(&mut self, key: &NameKey) {
        self.tracked.retain(|(k, _), _| k != key);
    }

    /// Forgets the tracked routes over one connection.
    pub fn untrack_conn(&mut self, conn: u64) {
        self.tracked.retain(|(_, c), _| *c != conn);
    }

    /// Local app subscriptions: names with a record on a local connection.
    pub fn local_names(&self) -> Vec<dp::Name> {
        self.slots
            .iter()
            .filter(|(_, by_conn)| by_conn.keys().any(|c| self.is_local_or_edge(*c)))
            .map(|(key, _)| self.name_of(key))
            .collect()
    }

    /// Whether a local app already subscribed `key`.
    pub fn has_local(&self, key: &NameKey) -> bool {
        self.app_conn.is_some_and(|app| self.is_routed(key, app))
    }

    /// Removes every local app record of `key`; false when there was none.
    pub fn remove_local(&mut self, key: &NameKey) -> bool {
        let Some(app) = self.app_conn else {
            return false;
        };
        let subs = self.slot_mut(key).and_then(|s| s.remove(&app));
        let Some(subs) = subs else {
            return false;
        };
        for sub in subs {
            self.subs.remove(&sub);
        }
        self.prune(key);
        true
    }

    /// Routes over non-local connections, in name order.
    pub fn routes(&self) -> Vec<SimRoute> {
        let mut out = Vec::new();
        for (key, by_conn) in &self.slots {
            for conn_id in by_conn.keys() {
                let Some(conn) = self.conns.get(conn_id) else {
                    continue;
                };
                if conn.conn_type == sb::ConnectionType::Local {
                    continue;
                }
                out.push(SimRoute {
                    name: self.strings.get(&key.prefix).cloned().unwrap_or_default(),
                    name_id: key.id,
                    conn_id: *conn_id,
                    link_id: conn.link_id.clone(),
                });
            }
        }
        out
    }

    /// The `connections` of a `RegisterNodeRequest`: every connection,
    /// typed remote whatever it is (as the real node reports them).
    pub fn registration_connections(&self) -> Vec<sb::ConnectionEntry> {
        self.conns
            .values()
            .map(|c| sb::ConnectionEntry {
                connection_type: sb::ConnectionType::Remote as i32,
                ..entry_of(c)
            })
            .collect()
    }

    /// The entries of a `ConnectionListResponse`.
    pub fn connection_entries(&self) -> Vec<sb::ConnectionEntry> {
        self.conns.values().map(entry_of).collect()
    }

    /// The entries of a `RouteListResponse`: one per name, its local
    /// connections first, then remote, peer and edge ones.
    pub fn route_entries(&self) -> Vec<sb::RouteEntry> {
        let order = [
            sb::ConnectionType::Remote,
            sb::ConnectionType::Peer,
            sb::ConnectionType::Edge,
        ];
        let mut out = Vec::with_capacity(self.slots.len());
        for (key, by_conn) in &self.slots {
            let conns: Vec<&SimConnection> =
                by_conn.keys().filter_map(|c| self.conns.get(c)).collect();
            let mut connections: Vec<sb::ConnectionEntry> = conns
                .iter()
                .filter(|c| c.conn_type == sb::ConnectionType::Local)
                .map(|c| sb::ConnectionEntry {
                    config_data: "{}".to_string(),
                    link_id: None,
                    direction: sb::ConnectionDirection::Outgoing as i32,
                    peer_node_id: None,
                    ..entry_of(c)
                })
                .collect();
            for kind in order {
                let of_kind = conns.iter().filter(|c| c.conn_type == kind);
                connections.extend(of_kind.map(|c| entry_of(c)));
            }
            out.push(sb::RouteEntry {
                name: Some(self.name_of(key)),
                connections,
            });
        }
        out
    }

    fn name_of(&self, key: &NameKey) -> dp::Name {
        let strings = self.strings.get(&key.prefix).cloned().unwrap_or_default();
        name_from_key(key, &strings)
    }

    fn slot_mut(&mut self, key: &NameKey) -> Option<&mut BTreeMap<u64, BTreeSet<u64>>> {
        self.slots.get_mut(key)
    }

    /// Drops an emptied slot, and the prefix strings with the last slot.
    fn prune(&mut self, key: &NameKey) {
        if self.slots.get(key).is_some_and(|s| s.is_empty()) {
            self.slots.remove(key);
        }
        let prefix_used = self.slots.keys().any(|k| k.prefix == key.prefix);
        if !prefix_used {
            self.strings.remove(&key.prefix);
        }
    }

    fn is_local_or_edge(&self, conn: u64) -> bool {
        self.conns.get(&conn).is_some_and(|c| {
            matches!(
                c.conn_type,
                sb::ConnectionType::Local | sb::ConnectionType::Edge
            )
        })
    }
}

/// A local (in-process) connection: server side, no configuration.
fn local_conn() -> SimConnection {
    SimConnection {
        id: 0,
        conn_type: sb::ConnectionType::Local,
        direction: sb::ConnectionDirection::Incoming,
        link_id: None,
        endpoint: None,
        remote_node: None,
        config_data: None,
        wire: None,
    }
}

fn entry_of(c: &SimConnection) -> sb::ConnectionEntry {
    sb::ConnectionEntry {
        id: c.id,
        connection_type: c.conn_type as i32,
        config_data: c.config_data.clone().unwrap_or_else(|| "{}".to_string()),
        link_id: c.link_id.clone(),
        direction: c.direction as i32,
        peer_node_id: c.remote_node.clone(),
    }
}

/// How the data path prints a name id in its errors.
fn id_text(id: u128) -> String {
    match id {
        NULL_ID => "NULL_COMPONENT".to_string(),
        _ if id == u128::MAX - 2 => "DATA_CHANNEL_ID".to_string(),
        _ if id == u128::MAX - 3 => "CONTROL_CHANNEL_ID".to_string(),
        _ => uuid::Uuid::from_u128(id).to_string(),
    }
}

/// Splits list entries into replies of at most `size` entries; the last
/// one is marked done, and an empty list still yields one (empty) reply.
pub fn chunk_list<T: Clone>(entries: &[T], size: usize) -> Vec<(Vec<T>, bool)> {
    if entries.is_empty() {
        return vec![(Vec::new(), true)];
    }
    let chunks: Vec<&[T]> = entries.chunks(size.max(1)).collect();
    let n = chunks.len();
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, c)| (c.to_vec(), i + 1 == n))
        .collect()
}

/// A new outgoing or incoming remote connection record (id assigned on insert).
pub(crate) fn link_conn(
    conn_type: sb::ConnectionType,
    direction: sb::ConnectionDirection,
    link_id: &str,
    remote_node: &str,
    wire: u64,
) -> SimConnection {
    SimConnection {
        id: 0,
        conn_type,
        direction,
        link_id: Some(link_id.to_string()),
        endpoint: None,
        remote_node: Some(remote_node.to_string()),
        config_data: None,
        wire: Some(wire),
    }
}
