//! Pure routing logic: no I/O, no clocks, no randomness. Everything here is
//! a function of the topology configuration and the facts passed in.

pub mod gateway;
pub mod graph;
pub mod linkconfig;
pub mod links;
pub mod routes;
pub mod templates;
pub mod topology;

#[cfg(test)]
mod claims_tests;
#[cfg(test)]
mod plan_tests;
