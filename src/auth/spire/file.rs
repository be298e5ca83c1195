//! Trust bundles from a file (`bundle_path`), for deployments without an
//! agent socket. Read once at start-up (an unusable file stops the start),
//! then polled; a changed file that parses replaces the bundles, one that
//! does not is logged and the last good bundles stay.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::jwks::{TrustBundle, parse_bundle_file};
use super::store::BundleStore;

/// How often the file is re-read by default. Polling, not inotify: it
/// works the same on every filesystem, including the symlink swaps of a
/// Kubernetes ConfigMap volume.
pub const DEFAULT_POLL: Duration = Duration::from_secs(2);

/// Reads and parses the file now.
pub fn load(
    path: &Path,
    trust_domain: Option<&str>,
) -> Result<(Vec<u8>, BTreeMap<String, TrustBundle>), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read: {e}"))?;
    let bundles = parse_bundle_file(&bytes, trust_domain).map_err(|e| e.to_string())?;
    Ok((bytes, bundles))
}

/// Re-reads `path` every `poll` until `cancel`; `last` is the content
/// already published.
pub async fn follow(
    path: PathBuf,
    trust_domain: Option<String>,
    store: Arc<BundleStore>,
    poll: Duration,
    mut last: Vec<u8>,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(poll) => {}
        }
        let bytes = match tokio::fs::read(&path).await {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::warn!(path = %path.display(), "SPIRE bundle file: cannot read: {e}; keeping the last trust bundles");
                continue;
            }
        };
        // Comparing contents, not mtimes: coarse timestamps miss quick
        // rewrites, and a touch without a change needs no reload.
        if bytes == last {
            continue;
        }
        match parse_bundle_file(&bytes, trust_domain.as_deref()) {
            Ok(bundles) => {
                let generation = store.publish(bundles);
                tracing::info!(path = %path.display(), generation, "SPIRE trust bundle file reloaded");
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), "SPIRE bundle file: {e}; keeping the last trust bundles")
            }
        }
        last = bytes;
    }
}
