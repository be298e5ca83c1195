//! What operators run a replica with: health and readiness, metrics, the
//! HTTP endpoint that serves them, and draining.

pub mod grpc_health;
pub mod health;
pub mod http;
pub mod metrics;

pub use health::Health;
pub use metrics::Metrics;
