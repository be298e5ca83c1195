//! Registration-auth domains managed through the API (`AddDomain`): the
//! shared secrets that live in the store beside the configuration file's.
//!
//! Each replica keeps the opened secrets as ready HMAC keys, so that a
//! registration never waits on the database. The replica that serves an
//! `AddDomain`/`RemoveDomain` updates its own copy at once; every replica
//! also reloads the table every [`RELOAD_PERIOD`], which is how a domain
//! added through one replica reaches the others.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::sealing::{KEY_ENV, SealKey};
use super::shared_secret::{HmacSha256, keyed};
use crate::config::SharedSecret;
use crate::store::Store;
use crate::store::model::Domain;

/// How often each replica reloads the stored domains.
pub const RELOAD_PERIOD: Duration = Duration::from_secs(2);

/// Why a domain cannot be stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DomainError {
    /// No key to seal with: the secret would have to be stored in clear.
    #[error(
        "no key to seal domain secrets with: set {KEY_ENV} (32 random bytes, base64) \
         on every replica"
    )]
    NoSealKey,
}

/// The domain secrets one replica accepts, beside the configured ones.
pub struct Domains {
    seal: Option<SealKey>,
    /// Groups with a secret in the configuration file.
    configured: BTreeSet<String>,
    keys: RwLock<BTreeMap<String, HmacSha256>>,
    /// Bumped by every local edit, so that a reload read before the edit
    /// cannot undo it (the next one picks the edit up from the store).
    edits: AtomicU64,
    /// Stored domains whose secret did not open at the last reload: each is
    /// warned about once, not every period.
    unopened: Mutex<BTreeSet<String>>,
}

impl std::fmt::Debug for Domains {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Domains")
            .field("configured", &self.configured)
            .field("stored", &self.stored_names())
            .finish()
    }
}

impl Domains {
    /// `configured`: the groups the file has secrets for (listed, and
    /// never removable through the API). Without `seal`, domains can be
    /// listed but not added.
    pub fn new(configured: BTreeSet<String>, seal: Option<SealKey>) -> Self {
        Self {
            seal,
            configured,
            keys: RwLock::default(),
            edits: AtomicU64::new(0),
            unopened: Mutex::default(),
        }
    }

    pub fn configured(&self) -> &BTreeSet<String> {
        &self.configured
    }

    /// The stored domains this replica has loaded.
    pub fn stored_names(&self) -> Vec<String> {
        self.read().keys().cloned().collect()
    }

    /// `secret` sealed for the store.
    pub fn seal(&self, name: &str, secret: &SharedSecret) -> Result<Domain, DomainError> {
        let key = self.seal.as_ref().ok_or(DomainError::NoSealKey)?;
        Ok(Domain {
            name: name.to_string(),
            sealed: key.seal(name, secret.expose().as_bytes()),
        })
    }

    /// Accept `secret` for `name` from now on (after it is stored).
    pub fn learn(&self, name: &str, secret: &SharedSecret) {
        let key = keyed(secret.expose().as_bytes());
        self.write().insert(name.to_string(), key);
        self.edits.fetch_add(1, Ordering::SeqCst);
    }

    /// Stop accepting the stored secret of `name` (after it is removed).
    pub fn forget(&self, name: &str) {
        self.write().remove(name);
        self.edits.fetch_add(1, Ordering::SeqCst);
    }

    /// The HMAC key of a stored domain.
    pub(crate) fn key(&self, group: &str) -> Option<HmacSha256> {
        self.read().get(group).cloned()
    }

    /// Replaces the loaded domains with what the store holds. A secret that
    /// does not open (another replica's key differs) is left out with a
    /// warning: registrations for that domain then fail with "no secret",
    /// which says where to look.
    pub fn reload(&self, stored: &[Domain]) {
        let keys = self.open_all(stored);
        *self.write() = keys;
    }

    /// [`Domains::reload`] unless a local edit came after `edits` was read.
    /// Returns the domains that went away (removed through another
    /// replica) and have no configured secret either.
    fn reload_since(&self, edits: u64, stored: &[Domain]) -> Vec<String> {
        let keys = self.open_all(stored);
        let mut held = self.write();
        if self.edits.load(Ordering::SeqCst) != edits {
            return Vec::new();
        }
        let gone = held
            .keys()
            .filter(|name| !keys.contains_key(*name) && !self.configured.contains(*name))
            .cloned()
            .collect();
        *held = keys;
        gone
    }

    fn open_all(&self, stored: &[Domain]) -> BTreeMap<String, HmacSha256> {
        let mut keys = BTreeMap::new();
        let mut unopened = BTreeSet::new();
        let mut warned = self.unopened.lock().unwrap_or_else(|p| p.into_inner());
        for d in stored {
            let opened = match &self.seal {
                Some(seal) => seal.open(&d.name, &d.sealed).map_err(|e| e.to_string()),
                None => Err(DomainError::NoSealKey.to_string()),
            };
            match opened {
                Ok(secret) => {
                    keys.insert(d.name.clone(), keyed(&secret));
                }
                Err(why) => {
                    if !warned.contains(&d.name) {
                        warn!(domain = %d.name, %why, "stored domain secret left out");
                    }
                    unopened.insert(d.name.clone());
                }
            }
        }
        *warned = unopened;
        keys
    }

    /// Reloads from `store` now and every [`RELOAD_PERIOD`] until
    /// `cancel`, calling `gone` with each domain removed elsewhere (so its
    /// nodes' streams here can be closed, as the replica that removed it
    /// closed its own). A failed load keeps the last good set: a database
    /// outage must not turn away nodes it was accepting.
    pub fn spawn_reloader(
        self: Arc<Self>,
        store: Arc<dyn Store>,
        cancel: CancellationToken,
        gone: impl Fn(&str) + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(RELOAD_PERIOD);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let edits = self.edits.load(Ordering::SeqCst);
                match store.list_domains().await {
                    Ok(stored) => self
                        .reload_since(edits, &stored)
                        .iter()
                        .for_each(|d| gone(d)),
                    Err(e) => warn!(error = %e, "could not reload the stored domains"),
                }
            }
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, HmacSha256>> {
        // A panic while holding the lock leaves a whole map; keep using it.
        self.keys.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, HmacSha256>> {
        self.keys.write().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    fn secret() -> SharedSecret {
        SharedSecret::new(SECRET).unwrap()
    }

    #[test]
    fn reload_opens_what_this_key_sealed_and_skips_the_rest() {
        let domains = Domains::new(BTreeSet::new(), Some(SealKey::random()));
        let ours = domains.seal("blue", &secret()).unwrap();
        let theirs = Domains::new(BTreeSet::new(), Some(SealKey::random()))
            .seal("red", &secret())
            .unwrap();
        domains.reload(&[ours, theirs]);
        assert_eq!(domains.stored_names(), vec!["blue".to_string()]);
        assert!(domains.key("blue").is_some());
        domains.forget("blue");
        assert!(domains.key("blue").is_none());
    }

    #[test]
    fn a_reload_reports_domains_removed_elsewhere_unless_configured() {
        let configured = BTreeSet::from(["cfg".to_string()]);
        let domains = Domains::new(configured, Some(SealKey::random()));
        let stored = ["blue", "cfg"].map(|n| domains.seal(n, &secret()).unwrap());
        domains.reload(&stored);
        let edits = domains.edits.load(Ordering::SeqCst);
        assert_eq!(domains.reload_since(edits, &[]), vec!["blue".to_string()]);
        assert!(domains.stored_names().is_empty());
        domains.reload(&stored);
        let before = domains.edits.load(Ordering::SeqCst);
        domains.learn("red", &secret());
        assert!(
            domains.reload_since(before, &[]).is_empty(),
            "a reload read before a local edit is dropped"
        );
        assert!(domains.key("red").is_some());
    }

    #[test]
    fn without_a_key_nothing_is_sealed() {
        let domains = Domains::new(BTreeSet::new(), None);
        assert_eq!(
            domains.seal("blue", &secret()).err(),
            Some(DomainError::NoSealKey)
        );
    }
}
