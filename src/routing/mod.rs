//! Pure routing logic: no I/O, no clocks, no randomness. Everything here is
//! a function of the topology configuration and the facts passed in.

pub mod fleet;
pub mod gateway;
pub mod graph;
pub mod linkconfig;
pub mod links;
pub mod routes;
pub mod stored;
pub mod templates;
pub mod topology;
pub mod trees;

/// Hashed maps and sets for a derivation's hot lookups: xxHash64 with a
/// seed drawn per process (the keys carry names nodes chose).
pub type FastMap<K, V> = std::collections::HashMap<K, V, twox_hash::xxhash64::RandomState>;
pub type FastSet<K> = std::collections::HashSet<K, twox_hash::xxhash64::RandomState>;

#[cfg(test)]
mod claims_tests;
#[cfg(test)]
pub(crate) mod plan_tests;
#[cfg(test)]
mod scope_tests;
