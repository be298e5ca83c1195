//! The leader's watch over replica liveness: a replica whose heartbeat
//! lapsed (database time) is declared dead, its incarnation bumped and its
//! sessions ended as crashes (the departure grace then applies). Only the
//! leader does it, fenced by its epoch, so two leaders never race on it.

use std::time::Duration;

use tokio::time::sleep;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::LeaderToken;
use crate::store::{PgStore, StoreError};

/// Runs until `cancel`, every `every`. `store` is fenced by the term.
pub async fn watch(
    store: PgStore,
    me: String,
    ttl: Duration,
    every: Duration,
    token: LeaderToken,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = sleep(every) => {}
        }
        match store.expire_replicas(&me, ttl).await {
            Ok(expired) => {
                for e in expired {
                    warn!(replica = %e.id, sessions = e.ended.len(), "replica declared dead; its sessions ended");
                }
            }
            Err(StoreError::Fenced { .. }) => {
                token.depose("a replica expiry was fenced");
                return;
            }
            Err(e) => debug!(error = %e, "replica expiry failed; retrying"),
        }
    }
}
