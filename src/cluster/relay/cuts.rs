//! Relay calls to a peer the leader has flagged for drain end at once.
//!
//! The leader flags a peer whose relay it cannot reach (see
//! [`crate::cluster::unreachable`]); that peer then moves its nodes to
//! replicas the leader can command. A call already waiting on the cut
//! peer would otherwise hold its reconcile until the relay's deadline
//! (the owner's node wait plus 5 s), long after the nodes have moved; a
//! new one would wait as long. Each run of a peer (id and incarnation)
//! has a token its calls select on: tripping it fails every call in
//! flight and every new one with [`TransportError::OwnerDrained`], which
//! a reconcile retries, reaching the node wherever it registers next.
//! Lifting the flag puts a fresh token in place.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Mutex, MutexGuard};

use tokio_util::sync::CancellationToken;

use crate::store::model::ReplicaRef;
use crate::transport::TransportError;

/// One token per run of a peer, tripped while it is flagged for drain.
#[derive(Debug, Default)]
pub struct Cuts {
    by_peer: Mutex<HashMap<(String, u64), CancellationToken>>,
}

impl Cuts {
    fn map(&self) -> MutexGuard<'_, HashMap<(String, u64), CancellationToken>> {
        self.by_peer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The token calls to `peer` select on now.
    fn token(&self, peer: &ReplicaRef) -> CancellationToken {
        let key = (peer.id.clone(), peer.incarnation);
        self.map().entry(key).or_default().clone()
    }

    /// Fails every call to run `incarnation` of `peer`, in flight or to
    /// come, until [`Cuts::restore`].
    pub fn trip(&self, peer: &str, incarnation: u64) {
        let key = (peer.to_string(), incarnation);
        self.map().entry(key).or_default().cancel();
    }

    /// Calls to run `incarnation` of `peer` go through again.
    pub fn restore(&self, peer: &str, incarnation: u64) {
        let key = (peer.to_string(), incarnation);
        if let Some(t) = self.map().get_mut(&key)
            && t.is_cancelled()
        {
            *t = CancellationToken::new();
        }
    }

    /// Whether calls to run `incarnation` of `peer` fail at once.
    pub fn is_tripped(&self, peer: &str, incarnation: u64) -> bool {
        let key = (peer.to_string(), incarnation);
        self.map()
            .get(&key)
            .is_some_and(CancellationToken::is_cancelled)
    }

    /// Forgets every run `keep` does not name (restarted, gone).
    pub fn retain(&self, keep: impl Fn(&str, u64) -> bool) {
        self.map().retain(|(id, inc), _| keep(id, *inc));
    }

    /// Restores every peer: for a replica that stops leading, since the
    /// flags are the leader's to act on and the next leader re-reads them.
    pub fn restore_all(&self) {
        self.map().clear();
    }

    /// `call` to `peer`, unless the peer is or becomes flagged first.
    pub async fn unless_cut<T>(
        &self,
        peer: &ReplicaRef,
        call: impl Future<Output = T>,
    ) -> Result<T, TransportError> {
        let token = self.token(peer);
        tokio::select! {
            biased;
            () = token.cancelled() => Err(TransportError::OwnerDrained(peer.id.clone())),
            out = call => Ok(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_peer(id: &str, incarnation: u64) -> ReplicaRef {
        ReplicaRef {
            id: id.into(),
            incarnation,
        }
    }

    fn drained(r: Result<(), TransportError>) -> bool {
        r == Err(TransportError::OwnerDrained("f".into()))
    }

    #[tokio::test]
    async fn tripping_a_peer_ends_its_call_in_flight() {
        let cuts = std::sync::Arc::new(Cuts::default());
        let (arrived, mut seen) = tokio::sync::oneshot::channel();
        let call = {
            let cuts = cuts.clone();
            tokio::spawn(async move {
                let hangs = async {
                    let _ = arrived.send(());
                    std::future::pending::<()>().await
                };
                cuts.unless_cut(&mk_peer("f", 1), hangs).await
            })
        };
        (&mut seen).await.expect("the call started");
        cuts.trip("f", 1);
        assert!(drained(call.await.expect("the call task")));
    }

    #[tokio::test]
    async fn a_tripped_peer_fails_new_calls_until_restored() {
        let cuts = Cuts::default();
        cuts.trip("f", 1);
        assert!(cuts.is_tripped("f", 1));
        assert!(drained(cuts.unless_cut(&mk_peer("f", 1), async {}).await));
        cuts.restore("f", 1);
        assert!(!cuts.is_tripped("f", 1));
        assert_eq!(cuts.unless_cut(&mk_peer("f", 1), async {}).await, Ok(()));
    }

    #[tokio::test]
    async fn a_peers_next_run_is_not_tripped() {
        let cuts = Cuts::default();
        cuts.trip("f", 1);
        assert_eq!(cuts.unless_cut(&mk_peer("f", 2), async {}).await, Ok(()));
        assert_eq!(cuts.unless_cut(&mk_peer("g", 1), async {}).await, Ok(()));
        cuts.retain(|_, inc| inc == 2);
        assert!(!cuts.is_tripped("f", 1));
    }

    #[tokio::test]
    async fn a_replica_that_stops_leading_restores_every_peer() {
        let cuts = Cuts::default();
        cuts.trip("f", 1);
        cuts.restore_all();
        assert_eq!(cuts.unless_cut(&mk_peer("f", 1), async {}).await, Ok(()));
    }
}
