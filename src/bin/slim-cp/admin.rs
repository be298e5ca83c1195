//! `slim-cp status` and `slim-cp step-down`: the admin service of any
//! replica, as an operator reads it.

use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use slim_cp::proto::cluster as pb;
use slim_cp::proto::cluster::admin_client::AdminClient;
use tonic::transport::{Channel, Endpoint};

/// Connects to the admin service at `server` (`host:port` or a URL).
async fn connect(server: &str) -> Result<AdminClient<Channel>> {
    let url = if server.contains("://") {
        server.to_string()
    } else {
        format!("http://{server}")
    };
    let channel = Endpoint::from_shared(url.clone())
        .with_context(|| format!("--server {server:?} is not an address"))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        .connect()
        .await
        .with_context(|| format!("cannot reach {url}"))?;
    Ok(AdminClient::new(channel))
}

pub async fn status(server: &str, as_json: bool) -> Result<()> {
    let status = connect(server)
        .await?
        .status(pb::StatusRequest {})
        .await
        .context("status")?
        .into_inner();
    if as_json {
        println!("{}", serde_json::to_string_pretty(&to_json(&status))?);
    } else {
        print!("{}", render(&status));
    }
    Ok(())
}

pub async fn step_down(server: &str) -> Result<()> {
    let reply = connect(server)
        .await?
        .step_down(pb::StepDownRequest {})
        .await
        .context("step-down")?
        .into_inner();
    println!(
        "replica {} stepped down from epoch {}",
        reply.replica, reply.epoch
    );
    Ok(())
}

pub async fn drain(server: &str) -> Result<()> {
    let reply = connect(server)
        .await?
        .drain(pb::DrainRequest {})
        .await
        .context("drain")?
        .into_inner();
    println!(
        "replica {} is draining its {} node sessions, then stops",
        reply.replica, reply.sessions
    );
    Ok(())
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn by_status(m: &std::collections::HashMap<String, u64>) -> String {
    let mut items: Vec<_> = m.iter().collect();
    items.sort();
    let parts: Vec<String> = items.iter().map(|(k, v)| format!("{k} {v}")).collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

/// The human-readable report.
pub fn render(s: &pb::ClusterStatus) -> String {
    let mut out = format!(
        "store: {}; epoch {}; leader {} (since {})\n",
        s.store,
        s.epoch,
        if s.leader.is_empty() {
            "none"
        } else {
            &s.leader
        },
        s.leader_since
    );
    out += &format!(
        "{:<20} {:>11} {:<22} {:<5} {:<6} {:>8} {:<5} {:>9} {:<7}\n",
        "REPLICA",
        "INCARNATION",
        "RELAY",
        "ALIVE",
        "LEADER",
        "SESSIONS",
        "READY",
        "HEARTBEAT",
        "DRAINED"
    );
    for r in &s.replicas {
        let ready = r.live.as_ref().map_or("?", |l| yes(l.ready));
        out += &format!(
            "{:<20} {:>11} {:<22} {:<5} {:<6} {:>8} {:<5} {:>8}ms {:<7}\n",
            r.id,
            r.incarnation,
            r.address,
            yes(r.alive),
            yes(r.leader),
            r.sessions,
            ready,
            r.heartbeat_age_ms,
            yes(r.drain)
        );
    }
    out += &format!("nodes: {} ({} connected)\n", s.nodes, s.nodes_connected);
    out += &format!("links: {}\n", by_status(&s.links));
    out += &format!("routes: {}\n", by_status(&s.routes));
    out += &format!("queue depth: {}\n", s.queue_depth);
    out
}

fn state_json(l: &pb::ReplicaState) -> Value {
    json!({
        "leader": l.leader,
        "epoch": l.epoch,
        "sessions": l.sessions,
        "ready": l.ready,
        "queue_depth": l.queue_depth,
        "relay_refused": l.relay_refused,
        "commands_sent": l.commands_sent,
        "commands_fenced": l.commands_fenced,
        "highest_epoch": l.highest_epoch,
        "pid": l.pid,
        "host": l.host,
        "fenced_writes": l.fenced_writes,
    })
}

/// The machine-readable report (`--json`).
pub fn to_json(s: &pb::ClusterStatus) -> Value {
    let replicas: Vec<Value> = s
        .replicas
        .iter()
        .map(|r| {
            json!({
                "id": r.id,
                "incarnation": r.incarnation,
                "address": r.address,
                "alive": r.alive,
                "leader": r.leader,
                "sessions": r.sessions,
                "heartbeat_age_ms": r.heartbeat_age_ms,
                "drain": r.drain,
                "live": r.live.as_ref().map(state_json),
            })
        })
        .collect();
    json!({
        "store": s.store,
        "epoch": s.epoch,
        "leader": s.leader,
        "leader_since": s.leader_since,
        "replicas": replicas,
        "nodes": s.nodes,
        "nodes_connected": s.nodes_connected,
        "links": s.links,
        "routes": s.routes,
        "queue_depth": s.queue_depth,
    })
}
