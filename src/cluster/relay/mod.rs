//! The internal relay: gRPC between replicas, on a listener of its own
//! (never on the public ones), authenticated with a cluster secret.

pub mod auth;
mod client;
mod cuts;
mod server;
mod wire;

pub use auth::{Guard, Stamp};
pub use client::RelayClient;
pub use cuts::Cuts;
pub use server::RelayService;
