//! Leader-side work: the inbox of changed nodes, the level-based lifecycle,
//! and the derivation loop.

pub mod inbox;
pub mod leader;
pub mod lifecycle;

pub use inbox::{Inbox, Signals};
pub use leader::Leader;
