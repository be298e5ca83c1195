//! How a node applies a `ConfigurationCommand`, item by item, with the
//! statuses and error texts of the upstream controller:
//!
//! - `reconcile: false`: deletes, creates, route sets, route deletes, in
//!   that order, each acked;
//! - `reconcile: true`: the command is the whole desired control-plane
//!   state: outgoing remote links not listed are closed, listed ones
//!   created, tracked routes not listed removed, listed ones installed.
//!   `connections_to_delete` and `routes_to_delete` are ignored. A 3.x
//!   node reads the connections of such a command as server requirements,
//!   not as client configurations.

use std::collections::HashSet;

use super::linkcfg::{LinkConfig, parse_addr, parse_config, parse_requirements};
use super::names::NameKey;
use super::network::{Dial, NetState};
use super::tables::{Tables, Tracked};
use crate::proto::sb::control_message::Payload;
use crate::proto::{dp, sb};
use crate::revision::Revision;

/// A control message with a fresh id.
pub(crate) fn control(payload: Payload) -> sb::ControlMessage {
    sb::ControlMessage {
        message_id: uuid::Uuid::new_v4().to_string(),
        payload: Some(payload),
    }
}

fn command(cmd: sb::ConfigurationCommand) -> sb::ControlMessage {
    control(Payload::ConfigCommand(cmd))
}

fn bare_route(name: dp::Name) -> sb::Route {
    sb::Route {
        name: Some(name),
        link_id: None,
        direction: None,
    }
}

/// A local app subscribed `name`.
pub(crate) fn announce_msg(name: dp::Name) -> sb::ControlMessage {
    replay_msg(vec![name])
}

/// The node's local subscriptions, replayed after registration.
pub(crate) fn replay_msg(names: Vec<dp::Name>) -> sb::ControlMessage {
    command(sb::ConfigurationCommand {
        routes_to_set: names.into_iter().map(bare_route).collect(),
        ..Default::default()
    })
}

/// `name` is no longer subscribed here (an app left, or a link died).
pub(crate) fn withdraw_msg(name: dp::Name) -> sb::ControlMessage {
    command(sb::ConfigurationCommand {
        routes_to_delete: vec![bare_route(name)],
        ..Default::default()
    })
}

/// An incoming remote link completed negotiation: the link claim.
pub(crate) fn claim_msg(link_id: &str) -> sb::ControlMessage {
    command(sb::ConfigurationCommand {
        connections_received: vec![sb::ConnectionEntry {
            id: 0,
            connection_type: sb::ConnectionType::Remote as i32,
            config_data: String::new(),
            link_id: Some(link_id.to_string()),
            direction: sb::ConnectionDirection::Incoming as i32,
            peer_node_id: None,
        }],
        ..Default::default()
    })
}

/// The ack of the command with id `original`.
pub(crate) fn ack_msg(original: &str, applied: Applied) -> sb::ControlMessage {
    control(Payload::ConfigCommandAck(sb::ConfigurationCommandAck {
        original_message_id: original.to_string(),
        connections_status: applied.connections,
        routes_status: applied.routes,
    }))
}

/// Fault injection consulted while applying.
#[derive(Debug, Clone, Default)]
pub(crate) struct Faults {
    pub fail_commands: bool,
    pub refuse_endpoint: Option<String>,
}

/// The outcome of one command.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    pub connections: Vec<sb::ConnectionAck>,
    pub routes: Vec<sb::RouteAck>,
    /// Withdrawals to send after the ack (routes lost with closed links).
    pub owed: Vec<sb::ControlMessage>,
    /// Links whose dial failed: a real node spends its dial's whole
    /// backoff on each before it reads its next command.
    pub failed_dials: u64,
}

fn conn_ack(link_id: &str, result: Result<(), String>) -> sb::ConnectionAck {
    sb::ConnectionAck {
        link_id: link_id.to_string(),
        success: result.is_ok(),
        error_msg: result.err().unwrap_or_default(),
    }
}

fn route_ack(route: sb::Route, result: Result<(), String>) -> sb::RouteAck {
    sb::RouteAck {
        route: Some(route),
        success: result.is_ok(),
        error_msg: result.err().unwrap_or_default(),
    }
}

/// Applies `cmd` to the process `key`/`incarnation`, a node of
/// `revision`; `None` when that process no longer runs.
pub(crate) fn apply(
    net: &mut NetState,
    (key, incarnation, revision): (&str, u64, Revision),
    cmd: &sb::ConfigurationCommand,
    faults: &Faults,
) -> Option<Applied> {
    net.process(key, incarnation)?;
    if faults.fail_commands {
        return Some(fail_all(cmd));
    }
    let mut ctx = Ctx {
        net,
        key,
        incarnation,
        faults,
        requirements: cmd.reconcile && revision == Revision::V3,
        out: Applied::default(),
    };
    if cmd.reconcile {
        ctx.reconcile_connections(&cmd.connections_to_create);
        ctx.reconcile_routes(&cmd.routes_to_set);
    } else {
        for link in &cmd.connections_to_delete {
            let result = ctx.delete_link(link);
            ctx.out.connections.push(conn_ack(link, result));
        }
        for conn in &cmd.connections_to_create {
            let result = ctx.create_link(conn, true);
            ctx.out.connections.push(conn_ack(&conn.link_id, result));
        }
        for route in &cmd.routes_to_set {
            let result = ctx.set_route(route);
            ctx.out.routes.push(route_ack(route.clone(), result));
        }
        for route in &cmd.routes_to_delete {
            let result = ctx.delete_route(route);
            ctx.out.routes.push(route_ack(route.clone(), result));
        }
    }
    ctx.net.bump(key);
    Some(ctx.out)
}

/// Every item fails, nothing changes (fault injection).
fn fail_all(cmd: &sb::ConfigurationCommand) -> Applied {
    let fail = || Err("injected failure".to_string());
    let mut out = Applied::default();
    let mut links: Vec<&str> = Vec::new();
    let mut routes: Vec<&sb::Route> = cmd.routes_to_set.iter().collect();
    if !cmd.reconcile {
        links.extend(cmd.connections_to_delete.iter().map(String::as_str));
        routes.extend(cmd.routes_to_delete.iter());
    }
    let created = cmd.connections_to_create.iter().map(|c| c.link_id.as_str());
    let links: Vec<&str> = links.into_iter().chain(created).collect();
    out.connections = links.into_iter().map(|l| conn_ack(l, fail())).collect();
    out.routes = routes
        .into_iter()
        .map(|r| route_ack(r.clone(), fail()))
        .collect();
    out
}

struct Ctx<'a> {
    net: &'a mut NetState,
    key: &'a str,
    incarnation: u64,
    faults: &'a Faults,
    /// Connections carry server requirements (a 3.x full-state reconcile).
    requirements: bool,
    out: Applied,
}

impl Ctx<'_> {
    fn tables(&mut self) -> Result<&mut Tables, String> {
        match self.net.process(self.key, self.incarnation) {
            Some(p) => Ok(&mut p.tables),
            None => Err("node stopped".to_string()),
        }
    }

    /// The connection a route names by link id.
    fn route_conn(&mut self, route: &sb::Route) -> Result<Option<u64>, String> {
        let link = route.link_id.as_deref().map(str::trim).unwrap_or_default();
        if link.is_empty() {
            return Ok(None);
        }
        Ok(self.tables()?.find_link(link))
    }

    fn close(&mut self, conn_id: u64) {
        let owed = self.net.disconnect(self.key, conn_id);
        self.out.owed.extend(owed);
    }

    fn delete_link(&mut self, link: &str) -> Result<(), String> {
        if link.trim().is_empty() {
            return Err("link_id cannot be empty".to_string());
        }
        let found = self.tables()?.find_link(link);
        let conn_id = found.ok_or_else(|| format!("Connection with link_id {link} not found"))?;
        self.close(conn_id);
        Ok(())
    }

    /// Creates a connection from its client configuration. The link id is
    /// the configuration's; without one, the command's `link_id`.
    fn create_link(&mut self, conn: &sb::Connection, reuse: bool) -> Result<(), String> {
        let cfg = self
            .parse(&conn.config_data)
            .map_err(|e| format!("Failed to parse config: {e}"))?;
        let link = match (&cfg.link_id, conn.link_id.trim()) {
            (Some(l), _) => l.clone(),
            (None, "") => uuid::Uuid::new_v4().to_string(),
            (None, l) => l.to_string(),
        };
        if reuse && self.tables()?.find_link(&link).is_some() {
            return Ok(());
        }
        let refuse = self.faults.refuse_endpoint.as_deref().is_some_and(|r| {
            parse_addr(r).is_some_and(|a| parse_addr(&cfg.endpoint).is_some_and(|b| a == b))
        });
        let req = Dial {
            cfg: &cfg,
            config_data: &conn.config_data,
            link_id: &link,
            refuse,
        };
        self.net.dial(self.key, &req).map(|_| ()).map_err(|e| {
            self.out.failed_dials += 1;
            format!("Connection failed: {e}")
        })
    }

    fn parse(&self, config_data: &str) -> Result<LinkConfig, String> {
        match self.requirements {
            true => parse_requirements(config_data),
            false => parse_config(config_data),
        }
    }

    fn set_route(&mut self, route: &sb::Route) -> Result<(), String> {
        let conn = self.route_conn(route)?.ok_or_else(|| missing_link(route))?;
        let (key, name) = route_name(route)?;
        let tables = self.tables()?;
        let sub_id = tables.subscribe(key, &name, conn);
        tables.tracked.insert((key, conn), Tracked { sub_id, name });
        Ok(())
    }

    fn delete_route(&mut self, route: &sb::Route) -> Result<(), String> {
        let conn = self.route_conn(route)?.ok_or_else(|| missing_link(route))?;
        let (key, _) = route_name(route)?;
        let tables = self.tables()?;
        let sub_id = match tables.tracked.remove(&(key, conn)) {
            Some(t) => t.sub_id,
            None => tables.fresh_sub_id(),
        };
        tables
            .unsubscribe(key, conn, sub_id)
            .map_err(|e| format!("Failed to unsubscribe: {e}"))
    }

    fn reconcile_connections(&mut self, desired: &[sb::Connection]) {
        let wanted: HashSet<&str> = desired.iter().map(|c| c.link_id.as_str()).collect();
        let stale: Vec<(u64, String)> = match self.tables() {
            Ok(t) => t
                .conns()
                .filter(|c| c.direction == sb::ConnectionDirection::Outgoing)
                .filter(|c| c.conn_type == sb::ConnectionType::Remote)
                .filter_map(|c| Some((c.id, c.link_id.clone()?)))
                .filter(|(_, l)| !l.is_empty() && !wanted.contains(l.as_str()))
                .collect(),
            Err(_) => return,
        };
        for (conn_id, link) in stale {
            self.close(conn_id);
            self.out.connections.push(conn_ack(&link, Ok(())));
        }
        for conn in desired.iter().filter(|c| !c.link_id.is_empty()) {
            let exists = self.tables().map(|t| t.find_link(&conn.link_id).is_some());
            let result = match exists {
                Ok(true) => Ok(()),
                Ok(false) => self.create_link(conn, false),
                Err(e) => Err(e),
            };
            self.out.connections.push(conn_ack(&conn.link_id, result));
        }
    }

    fn reconcile_routes(&mut self, desired: &[sb::Route]) {
        let mut wanted: Vec<((NameKey, u64), &sb::Route)> = Vec::new();
        for route in desired {
            let resolved = match self.route_conn(route) {
                Ok(Some(conn)) => route_name(route).map(|(key, _)| (key, conn)),
                Ok(None) => Err("connection not found".to_string()),
                Err(e) => Err(e),
            };
            match resolved {
                Ok(k) => match wanted.iter_mut().find(|(w, _)| *w == k) {
                    Some(slot) => slot.1 = route,
                    None => wanted.push((k, route)),
                },
                Err(e) => self.out.routes.push(route_ack(route.clone(), Err(e))),
            }
        }
        let keys: HashSet<(NameKey, u64)> = wanted.iter().map(|(k, _)| *k).collect();
        self.delete_stale(&keys);
        self.create_wanted(&wanted);
    }

    /// Removes tracked routes that are no longer desired.
    fn delete_stale(&mut self, keep: &HashSet<(NameKey, u64)>) {
        let Ok(tables) = self.tables() else {
            return;
        };
        let mut stale: Vec<((NameKey, u64), Tracked)> = tables
            .tracked
            .iter()
            .filter(|(k, _)| !keep.contains(k))
            .map(|(k, t)| (*k, t.clone()))
            .collect();
        stale.sort_by_key(|(k, _)| *k);
        let mut acks = Vec::with_capacity(stale.len());
        for ((key, conn), tracked) in stale {
            let result = if tables.conn(conn).is_some() {
                tables
                    .unsubscribe(key, conn, tracked.sub_id)
                    .map_err(|e| format!("Failed to unsubscribe: {e}"))
            } else {
                Ok(())
            };
            if result.is_ok() {
                tables.tracked.remove(&(key, conn));
            }
            acks.push(route_ack(bare_route(tracked.name), result));
        }
        self.out.routes.extend(acks);
    }

    /// Reports desired routes already tracked, then installs the others.
    fn create_wanted(&mut self, wanted: &[((NameKey, u64), &sb::Route)]) {
        let Ok(tables) = self.tables() else {
            return;
        };
        let (known, new): (Vec<_>, Vec<_>) = wanted
            .iter()
            .partition(|(k, _)| tables.tracked.contains_key(k));
        let mut acks: Vec<sb::RouteAck> = known
            .iter()
            .map(|(_, r)| route_ack((*r).clone(), Ok(())))
            .collect();
        for ((key, conn), route) in new {
            let name = route.name.clone().unwrap_or_default();
            let sub_id = tables.subscribe(key, &name, conn);
            tables.tracked.insert((key, conn), Tracked { sub_id, name });
            acks.push(route_ack((*route).clone(), Ok(())));
        }
        self.out.routes.extend(acks);
    }
}

fn missing_link(route: &sb::Route) -> String {
    let link = route.link_id.as_deref().unwrap_or("<none>");
    format!("Connection with link_id {link} not found")
}

/// The route's name and its table key. A name without its encoded form
/// would crash the real node's data path; here it fails the item.
fn route_name(route: &sb::Route) -> Result<(NameKey, dp::Name), String> {
    let name = route.name.clone().ok_or("invalid name: missing name")?;
    let key = NameKey::of(&name).ok_or("invalid name: missing encoded name")?;
    Ok((key, name))
}
