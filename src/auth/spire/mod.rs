//! SPIRE registration auth: a node proves membership of its group with a
//! JWT-SVID in `RegisterNodeRequest.credentials` (what upstream nodes send
//! with SPIRE auth: their JWT-SVID, with the configured audience, `slim` by
//! default, among its audiences). slim-cp verifies it against the JWT trust
//! bundles of the token's trust domain and requires that trust domain to
//! equal the group the node claims, as the reference control plane does.
//!
//! The flow, one file per stage: [`workload`] or [`file`] follow a bundle
//! source into the [`store`]; [`verify`] checks a token against the
//! latest snapshot, parsing with [`jwt`], [`jwks`] and [`spiffe_id`].
//! [`mint`] makes keys and tokens, and [`agent`] serves bundles as a SPIRE
//! agent does, for tests and simulated deployments.

pub mod agent;
pub mod file;
pub mod jwks;
pub mod jwt;
pub mod mint;
pub mod spiffe_id;
pub mod store;
pub mod verify;
pub mod workload;

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::{CancellationToken, DropGuard};

pub use store::{BundleSet, BundleStore};
pub use verify::Refusal;
pub use workload::Backoff;

use super::AuthSetupError;
use crate::config::SpireBundleSource;
use crate::proto::sb;
use crate::southbound::auth::Authenticator;
use crate::southbound::handshake::group_of;

/// How the bundle sources are followed.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// How often a bundle file is re-read.
    pub file_poll: Duration,
    /// Reconnection backoff to the SPIRE agent.
    pub backoff: Backoff,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            file_poll: file::DEFAULT_POLL,
            backoff: Backoff::default(),
        }
    }
}

/// Verifies registration JWT-SVIDs against the latest trust bundles.
pub struct SpireAuth {
    bundles: Arc<BundleStore>,
    audience: String,
    /// Stops the task following the bundle source when the authenticator
    /// goes (the replica shut down, or a test ended).
    _follower: Option<DropGuard>,
}

impl fmt::Debug for SpireAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpireAuth")
            .field("audience", &self.audience)
            .field("generation", &self.bundles.current().generation)
            .finish()
    }
}

impl SpireAuth {
    /// An authenticator over `bundles`, which the caller keeps up to date.
    pub fn new(bundles: Arc<BundleStore>, audience: impl Into<String>) -> Self {
        SpireAuth {
            bundles,
            audience: audience.into(),
            _follower: None,
        }
    }

    /// Starts following `source` on the current Tokio runtime. A bundle
    /// file is read now and must be usable; the agent socket is dialled in
    /// the background (tokens are refused until its first bundles arrive).
    pub fn start(
        source: &SpireBundleSource,
        audience: &str,
        timing: Timing,
    ) -> Result<Self, AuthSetupError> {
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| AuthSetupError::NoRuntime)?;
        let store = Arc::new(BundleStore::new());
        let cancel = CancellationToken::new();
        let follower = follower(source, &store, timing, cancel.clone())?;
        runtime.spawn(follower);
        Ok(SpireAuth {
            _follower: Some(cancel.drop_guard()),
            ..SpireAuth::new(store, audience)
        })
    }

    /// The bundles this authenticator verifies against.
    pub fn bundles(&self) -> &Arc<BundleStore> {
        &self.bundles
    }

    /// Checks that `credentials` is a JWT-SVID proving membership of
    /// `group` at `now` (Unix seconds); the node's SPIFFE id if so.
    pub fn check(
        &self,
        group: Option<&str>,
        credentials: &str,
        now: u64,
    ) -> Result<spiffe_id::SpiffeId, Refusal> {
        let set = self.bundles.current();
        let expect = verify::Expectations {
            bundles: &set.domains,
            audience: &self.audience,
            now,
        };
        verify::check(&expect, group, credentials)
    }
}

/// The task that keeps `store` up to date from `source`; a bundle file is
/// loaded into `store` before it returns.
fn follower(
    source: &SpireBundleSource,
    store: &Arc<BundleStore>,
    timing: Timing,
    cancel: CancellationToken,
) -> Result<Pin<Box<dyn Future<Output = ()> + Send>>, AuthSetupError> {
    match source {
        SpireBundleSource::WorkloadApi { socket_path } => {
            let socket = workload::socket_file(socket_path);
            tracing::info!(socket = %socket.display(), "SPIRE registration auth: following the Workload API");
            let task = workload::follow(socket, store.clone(), timing.backoff, cancel);
            Ok(Box::pin(task))
        }
        SpireBundleSource::File { path, trust_domain } => {
            let path = PathBuf::from(path);
            let (bytes, bundles) =
                file::load(&path, trust_domain.as_deref()).map_err(|reason| {
                    AuthSetupError::SpireBundleFile {
                        path: path.display().to_string(),
                        reason,
                    }
                })?;
            store.publish(bundles);
            let task = file::follow(
                path,
                trust_domain.clone(),
                store.clone(),
                timing.file_poll,
                bytes,
                cancel,
            );
            Ok(Box::pin(task))
        }
    }
}

impl Authenticator for SpireAuth {
    fn verify(&self, request: &sb::RegisterNodeRequest) -> Result<(), String> {
        let now = u64::try_from(crate::clock::unix_now()).unwrap_or(0);
        let id = self
            .check(group_of(request), &request.credentials, now)
            .map_err(|r| r.to_string())?;
        tracing::debug!(node = %request.node_id, spiffe_id = %id, "JWT-SVID accepted");
        Ok(())
    }
}

#[cfg(test)]
#[path = "verify_tests.rs"]
mod verify_tests;

#[cfg(test)]
#[path = "source_tests.rs"]
mod source_tests;
