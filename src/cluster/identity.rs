//! Which replica this process is: a stable id and the incarnation of this
//! run. The id comes from the configuration (or `SLIM_CP_REPLICA_ID`), the
//! hostname only as a last resort; the incarnation comes from the database
//! and strictly increases per id, so it never depends on a clock. A replica
//! declared dead while it was only slow rejoins under a new incarnation.

use std::sync::{Mutex, MutexGuard};

use crate::store::model::ReplicaRef;

/// The replica's identity, shared by the parts that record sessions.
#[derive(Debug)]
pub struct Identity {
    current: Mutex<ReplicaRef>,
}

impl Identity {
    pub fn new(replica: ReplicaRef) -> Self {
        Self {
            current: Mutex::new(replica),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ReplicaRef> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn current(&self) -> ReplicaRef {
        self.lock().clone()
    }

    pub fn id(&self) -> String {
        self.lock().id.clone()
    }

    /// Whether `owner` is this very run of this replica.
    pub fn is(&self, owner: &ReplicaRef) -> bool {
        *self.lock() == *owner
    }

    /// A new run under the same id (after being declared dead).
    pub(crate) fn set_incarnation(&self, incarnation: u64) {
        self.lock().incarnation = incarnation;
    }
}

/// The hostname, from `HOSTNAME` or the kernel: the replica id of last
/// resort (a Kubernetes StatefulSet pod's hostname is stable; a
/// Deployment's is not, which costs nothing but a dead row to expire).
pub fn hostname() -> Option<String> {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_incarnation_is_another_owner() {
        let me = Identity::new(ReplicaRef {
            id: "cp-0".into(),
            incarnation: 3,
        });
        let before = me.current();
        assert!(me.is(&before));
        me.set_incarnation(4);
        assert!(!me.is(&before));
        assert_eq!(me.id(), "cp-0");
    }
}
