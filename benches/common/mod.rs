//! What both benchmarks start: control-plane processes, fresh Postgres
//! databases, and clusters of replicas behind a balancer. Included by each
//! bench with `#[path]`; each uses only part of it.

pub mod cluster;
pub mod cpu;
pub mod database;
pub mod process;
pub mod scrape;
pub mod table;
