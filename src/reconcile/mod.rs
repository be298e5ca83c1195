//! Leader-side work: the inbox of changed nodes, the level-based lifecycle,
//! and the derivation loop.

pub mod arrivals;
pub mod backoff;
pub mod db_clock;
pub mod derive;
pub mod diff;
pub mod leader;
pub mod lifecycle;
pub mod node;
pub mod pacing;
pub mod queue;
pub mod stranded;
pub mod supervisor;
pub mod view;
pub mod workers;
pub mod working;

pub use leader::Leader;
