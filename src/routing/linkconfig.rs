//! The `config_data` of a link: the data plane's gRPC client configuration
//! as JSON, which the `slim` node deserialises (field names from its
//! `agntcy-slim-config` crate). `connection_type` must be `remote`: the
//! node's default (`edge`) would make a link it never treats as managed by
//! the control plane. The link id travels inside so that the destination can
//! report the link back when it claims it.

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
const KEEPALIVE: &str = "20s";

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
        "keepalive": {
            "tcp_keepalive": KEEPALIVE,
            "http2_keepalive": KEEPALIVE,
            "timeout": KEEPALIVE,
            "keep_alive_while_idle": false,
        },
        "link_id": link_id,
        "connection_type": "remote",
    })
    .to_string()
}

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
    fn the_simulated_node_reads_it_like_a_real_one() {
        let parsed = crate::sim::parse_config(&config_data("h:1", "l-9")).unwrap();
        assert_eq!(parsed.link_id.as_deref(), Some("l-9"));
        assert_eq!(parsed.conn_type, crate::proto::sb::ConnectionType::Remote);
        assert_eq!(url("https://h:1"), "https://h:1");
    }
}
