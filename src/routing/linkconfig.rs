//! The `config_data` of a link: the data plane's gRPC client configuration
//! as JSON, which the `slim` node deserialises (field names from its
//! `agntcy-slim-config` crate). `connection_type` must be `remote`: the
//! node's default (`edge`) would make a link it never treats as managed by
//! the control plane. The link id travels inside so that the destination can
//! report the link back when it claims it.
//!
//! Commands (`ConfigurationCommand` with `reconcile: false`) carry this
//! client configuration to nodes of both revisions alike: 3.x `slim` reads
//! it with the same keys. The connections of a `RegisterNodeResponse` are
//! another matter: a 3.x node applies them as a full-state reconcile and
//! reads each `config_data` as the *server's requirements*
//! (`ServerConnectionConfig` of `agntcy-slim-config` 0.17: `endpoint`,
//! `tls_required` and `auth_method` required, `timeout` and `backoff` in
//! milliseconds), which it merges into its own outbound client settings.
//! A client configuration fails that parse (no `tls_required`), so such a
//! node gets [`requirements`] there instead.

use std::sync::LazyLock;

use serde_json::json;

/// The dial's bounds. A real node dials inside its command handler and
/// reads its control stream one message at a time, so an endless dial
/// towards a dead or unreachable endpoint would hold every later command,
/// the delete that would end it included. Bounded, a failed dial is answered
/// in a few seconds (at most `(1 + retries) * connect timeout + retries *
/// interval` when packets are dropped) and the control plane retries with
/// its own backoff. The backoff governs nothing else: a node never redials a
/// remote link that broke (it drops it, and the control plane recreates it).
const DIAL_INTERVAL: &str = "1s";
const DIAL_RETRIES: u32 = 3;
const CONNECT_TIMEOUT: &str = "2s";
const CONNECT_TIMEOUT_MS: u32 = 2000;
const KEEPALIVE: &str = "20s";

/// HTTP/2 and TCP keepalives of a link, the same in both revisions.
fn keepalive() -> serde_json::Value {
    json!({
        "tcp_keepalive": KEEPALIVE,
        "http2_keepalive": KEEPALIVE,
        "timeout": KEEPALIVE,
        "keep_alive_while_idle": false,
    })
}

/// The JSON client configuration for a link to `endpoint` (`host:port`).
pub fn config_data(endpoint: &str, link_id: &str) -> String {
    json!({
        "endpoint": url(endpoint),
        "tls": { "insecure": true },
        "connect_timeout": CONNECT_TIMEOUT,
        "backoff": {
            "type": "fixed_interval",
            "interval": DIAL_INTERVAL,
            "max_attempts": DIAL_RETRIES,
        },
        "keepalive": keepalive(),
        "link_id": link_id,
        "connection_type": "remote",
    })
    .to_string()
}

/// The server requirements for a link to `endpoint` (`host:port`), as a 3.x
/// node reads the connections of its `RegisterNodeResponse`. No `backoff`:
/// 3.x turns any value into a fixed interval retried without end, while
/// without one the node keeps the backoff of its own outbound client
/// settings (`controller.outbound_clients`), where an operator bounds it.
/// The link id and type ride along though the node ignores them here (it
/// takes both from the connection), so the text names its link in logs.
pub fn requirements(endpoint: &str, link_id: &str) -> String {
    json!({
        "endpoint": url(endpoint),
        "tls_required": false,
        "auth_method": "none",
        "timeout": CONNECT_TIMEOUT_MS,
        "keepalive": keepalive(),
        "link_id": link_id,
        "connection_type": "remote",
    })
    .to_string()
}

/// Whether `data` is what [`config_data`] gives for `endpoint` and
/// `link_id`, without rendering it: the planner asks this of every live
/// link on every derivation, and almost always the answer is yes.
pub fn is_current(data: &str, endpoint: &str, link_id: &str) -> bool {
    let plain = |v: &str| !v.chars().any(|c| c == '"' || c == '\\' || c.is_control());
    let Some(shape) = SHAPE.as_ref().filter(|_| plain(endpoint) && plain(link_id)) else {
        return data == config_data(endpoint, link_id);
    };
    let rest = data.strip_prefix(shape.head.as_str());
    let rest = match endpoint.contains("://") {
        true => rest,
        false => rest.and_then(|r| r.strip_prefix("http://")),
    };
    rest.and_then(|r| r.strip_prefix(endpoint))
        .and_then(|r| r.strip_prefix(shape.middle.as_str()))
        .and_then(|r| r.strip_prefix(link_id))
        .is_some_and(|r| r == shape.tail)
}

/// [`config_data`] cut around its two values: head, endpoint URL, middle,
/// link id, tail. `None` if the rendering ever puts the link id first.
struct Shape {
    head: String,
    middle: String,
    tail: String,
}

static SHAPE: LazyLock<Option<Shape>> = LazyLock::new(|| {
    const ENDPOINT: &str = "e://slim-cp-endpoint-mark";
    const LINK: &str = "slim-cp-link-mark";
    let full = config_data(ENDPOINT, LINK);
    let (head, rest) = full.split_once(ENDPOINT)?;
    let (middle, tail) = rest.split_once(LINK)?;
    Some(Shape {
        head: head.to_string(),
        middle: middle.to_string(),
        tail: tail.to_string(),
    })
});

/// `host:port` as the plaintext URL the node dials; a URL is kept as is.
pub fn url(endpoint: &str) -> String {
    if endpoint.contains("://") {
        endpoint.to_string()
    } else {
        format!("http://{endpoint}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_carries_endpoint_link_id_and_remote_type() {
        let data = config_data("10.0.0.2:46357", "l-1");
        let v: serde_json::Value = serde_json::from_str(&data).unwrap();
        assert_eq!(v["endpoint"], "http://10.0.0.2:46357");
        assert_eq!(v["link_id"], "l-1");
        assert_eq!(v["connection_type"], "remote");
        assert_eq!(v["tls"]["insecure"], true);
        assert_eq!(
            v["backoff"]["max_attempts"], DIAL_RETRIES,
            "a dial must end"
        );
        assert_eq!(v["connect_timeout"], CONNECT_TIMEOUT);
    }

    #[test]
    fn requirements_carry_what_a_3x_node_requires_and_no_endless_backoff() {
        let data = requirements("10.0.0.2:46357", "l-1");
        let v: serde_json::Value = serde_json::from_str(&data).unwrap();
        assert_eq!(v["endpoint"], "http://10.0.0.2:46357");
        assert_eq!(v["tls_required"], false);
        assert_eq!(v["auth_method"], "none");
        assert_eq!(v["timeout"], CONNECT_TIMEOUT_MS);
        assert!(v.get("backoff").is_none(), "3.x would retry it forever");
    }

    #[test]
    fn current_configs_are_recognised_without_rendering() {
        for (endpoint, link) in [("h:1", "l-1"), ("https://h:2", "l-2"), ("q\"h:3", "l\\3")] {
            let data = config_data(endpoint, link);
            assert!(is_current(&data, endpoint, link), "{data}");
            assert!(!is_current(&data, endpoint, "l-other"));
            assert!(!is_current(&data, "h:9", link));
            let older = data.replace("\"max_attempts\":3", "\"max_attempts\":4294967295");
            assert!(!is_current(&older, endpoint, link));
        }
        assert!(SHAPE.is_some(), "the fast path must be the one taken");
    }

    #[test]
    fn the_simulated_node_reads_it_like_a_real_one() {
        let parsed = crate::sim::parse_config(&config_data("h:1", "l-9")).unwrap();
        assert_eq!(parsed.link_id.as_deref(), Some("l-9"));
        assert_eq!(parsed.conn_type, crate::proto::sb::ConnectionType::Remote);
        assert_eq!(url("https://h:1"), "https://h:1");
    }
}
