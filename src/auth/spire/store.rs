//! The latest trust bundles, shared between the task that follows their
//! source and the verifier. `verify` is synchronous (the southbound calls
//! it inline), so readers take a cheap snapshot (`Arc`) and never wait on
//! the writer; every publication bumps a generation that tests and logs
//! can observe.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::watch;

use super::jwks::TrustBundle;

/// One publication of the bundles.
#[derive(Debug, Default)]
pub struct BundleSet {
    /// 0 before the first bundles arrive, then +1 per publication.
    pub generation: u64,
    /// Trust domain name to its JWT authorities.
    pub domains: BTreeMap<String, TrustBundle>,
}

/// The latest [`BundleSet`], replaced whole on every update.
#[derive(Debug)]
pub struct BundleStore {
    tx: watch::Sender<Arc<BundleSet>>,
}

impl Default for BundleStore {
    fn default() -> Self {
        Self::new()
    }
}

impl BundleStore {
    /// An empty store: every token is refused until bundles arrive.
    pub fn new() -> Self {
        Self {
            tx: watch::Sender::new(Arc::new(BundleSet::default())),
        }
    }

    /// The bundles now.
    pub fn current(&self) -> Arc<BundleSet> {
        self.tx.borrow().clone()
    }

    /// Replaces the bundles; returns the new generation.
    pub fn publish(&self, domains: BTreeMap<String, TrustBundle>) -> u64 {
        let mut generation = 0;
        self.tx.send_modify(|current| {
            generation = current.generation + 1;
            *current = Arc::new(BundleSet {
                generation,
                domains,
            });
        });
        generation
    }

    /// Returns once generation `at_least` (or a later one) is published.
    pub async fn wait_for_generation(&self, at_least: u64) {
        let mut rx = self.tx.subscribe();
        // Only fails if the sender is gone, and `self` holds it.
        let _ = rx.wait_for(|set| set.generation >= at_least).await;
    }
}
