//! Bytes held in fact outboxes, bounded per session and per replica. The
//! count bound alone let one session hold 1,024 facts of megabytes each;
//! and while the store is away every session fills at once, so the replica
//! as a whole needs a bound too. A fact that does not fit closes its
//! stream: the node replays everything when it registers again.

use prometheus_client::metrics::gauge::Gauge;

use super::facts::Fact;
use crate::store::model::{ConnectionDetail, Name, Registration};

/// Bytes one session's outbox may hold. Its first fact is always taken
/// (a registration may be bigger on its own), so a session can make
/// progress whatever its size.
pub const SESSION_OUTBOX_BYTES: usize = 8 << 20;
/// Bytes all outboxes of a replica may hold together.
pub const REPLICA_OUTBOX_BYTES: usize = 512 << 20;

/// One session's share; `replica` is the gauge every session adds to.
pub struct SessionBytes {
    held: std::sync::atomic::AtomicUsize,
    replica: Gauge,
}

impl SessionBytes {
    pub fn new(replica: Gauge) -> Self {
        Self {
            held: Default::default(),
            replica,
        }
    }

    /// Takes room for `n` bytes, if there is some. `always` takes it even
    /// past the bounds: a session's end must be recorded.
    pub fn take(&self, n: usize, always: bool) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let before = self.held.fetch_add(n, Relaxed);
        let signed = i64::try_from(n).unwrap_or(i64::MAX);
        let total = self.replica.inc_by(signed).saturating_add(signed);
        let session_full = before > 0 && before + n > SESSION_OUTBOX_BYTES;
        let replica_full = usize::try_from(total).unwrap_or(usize::MAX) > REPLICA_OUTBOX_BYTES;
        if always || !(session_full || replica_full) {
            return true;
        }
        self.give(n);
        false
    }

    /// Gives back the room of a fact recorded or dropped.
    pub fn give(&self, n: usize) {
        self.held.fetch_sub(n, std::sync::atomic::Ordering::Relaxed);
        self.replica.dec_by(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

/// Per entry, what a fact costs beyond its text (vectors, enums, headers).
const ENTRY_OVERHEAD: usize = 48;

impl Fact {
    /// About what the fact holds in memory, in bytes.
    pub fn bytes(&self) -> usize {
        ENTRY_OVERHEAD
            + match self {
                Fact::Begun(r) => registration_bytes(r),
                Fact::Announced { set, withdrawn } => {
                    set.iter().chain(withdrawn).map(name_bytes).sum()
                }
                Fact::Received(links) => links.iter().map(|l| l.len() + ENTRY_OVERHEAD).sum(),
                Fact::Ready | Fact::Ended(_) => 0,
            }
    }
}

fn name_bytes(n: &Name) -> usize {
    n.components.iter().map(String::len).sum::<usize>() + ENTRY_OVERHEAD
}

fn detail_bytes(d: &ConnectionDetail) -> usize {
    let external = d.external_endpoint.as_ref().map_or(0, String::len);
    // Metadata is bounded at the door; its JSON text is a fair measure.
    let metadata = serde_json::to_string(&d.metadata).map_or(0, |m| m.len());
    let trust_domain = d.spire_trust_domain.as_ref().map_or(0, String::len);
    d.endpoint.len() + external + metadata + trust_domain + ENTRY_OVERHEAD
}

fn registration_bytes(r: &Registration) -> usize {
    r.node_id.len()
        + r.connection_details.iter().map(detail_bytes).sum::<usize>()
        + r.reported_connections
            .iter()
            .map(|c| c.link_id.len() + ENTRY_OVERHEAD)
            .sum::<usize>()
        + r.reported_routes.iter().map(name_bytes).sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize, len: usize) -> Vec<Name> {
        let c = "x".repeat(len);
        vec![
            Name {
                components: [c.clone(), c.clone(), c],
                id: None,
            };
            n
        ]
    }

    #[test]
    fn a_session_is_bounded_but_always_takes_its_first_fact() {
        let replica = Gauge::default();
        let s = SessionBytes::new(replica.clone());
        assert!(s.take(SESSION_OUTBOX_BYTES * 2, false), "first fact");
        assert!(!s.take(1, false));
        assert!(s.take(1, true), "an end is always taken");
        s.give(SESSION_OUTBOX_BYTES * 2 + 1);
        assert_eq!(replica.get(), 0);
        assert!(s.take(SESSION_OUTBOX_BYTES / 2, false));
        assert!(s.take(SESSION_OUTBOX_BYTES / 2, false));
        assert!(!s.take(1, false));
        assert_eq!(
            replica.get(),
            i64::try_from(SESSION_OUTBOX_BYTES).unwrap_or(0)
        );
    }

    #[test]
    fn the_replica_bound_holds_across_sessions() {
        let replica = Gauge::default();
        let sessions: Vec<_> = (0..100)
            .map(|_| SessionBytes::new(replica.clone()))
            .collect();
        let per = SESSION_OUTBOX_BYTES;
        let taken = sessions.iter().filter(|s| s.take(per, false)).count();
        assert_eq!(taken, REPLICA_OUTBOX_BYTES / per);
        let held = usize::try_from(replica.get()).unwrap_or(usize::MAX);
        assert!(held <= REPLICA_OUTBOX_BYTES, "{held}");
    }

    #[test]
    fn sizes_grow_with_what_a_fact_holds() {
        let small = Fact::Announced {
            set: names(1, 3),
            withdrawn: vec![],
        };
        let big = Fact::Announced {
            set: names(100, 200),
            withdrawn: names(10, 3),
        };
        assert!(big.bytes() > 100 * 600, "{}", big.bytes());
        assert!(small.bytes() < big.bytes() / 100);
    }
}
