#![forbid(unsafe_code)]
//! slim-cp: a highly available control plane for SLIM data-plane fleets.

pub mod auth;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod drill;
pub mod limits;
pub mod names;
pub mod northbound;
pub mod ops;
pub mod proto;
pub mod reconcile;
pub mod revision;
pub mod routing;
pub mod server;
pub mod sim;
pub mod southbound;
pub mod store;
pub mod task;
pub mod tls;
pub mod transport;
