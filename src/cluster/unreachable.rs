//! The leader's watch over peers its relay cannot reach while the
//! database still sees them alive: it probes every live peer each
//! heartbeat (`Inspect`), and sets the drain flag of one whose relay
//! keeps failing, so the peer moves its nodes to replicas the leader can
//! command; it lifts the flag once the peer answers again, so a healed
//! replica comes back into service without an operator (see
//! [`super::reachability`] for the rules).
//!
//! The flag lives in the replica's row: it survives a change of leader
//! (the next one lifts it as soon as the peer answers it), a restart of
//! the peer clears it (a new run starts undrained), and `slim-cp status`
//! shows it. Only the leader writes it, fenced by its epoch.
//!
//! While a peer is flagged, the leader's relay calls to it (those in
//! flight and new ones) fail at once (see [`super::relay::Cuts`]): the
//! reconciles waiting on them retry and reach the nodes where they
//! register next, instead of waiting out the relay's deadline.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::LeaderToken;
use super::reachability::{self, Peer, Verdict};
use super::relay::RelayClient;
use crate::store::model::ReplicaRef;
use crate::store::postgres::ReplicaInfo;
use crate::store::{PgStore, StoreError};

/// Runs until `cancel`, every `every`. `store` is fenced by the term.
pub async fn watch(
    store: PgStore,
    relay: Arc<RelayClient>,
    me: String,
    timings: (Duration, Duration),
    token: LeaderToken,
    cancel: CancellationToken,
) {
    watch_peers(store, &relay, me, timings, token, cancel).await;
    // The flags are for the leader to act on: the next one re-reads them.
    relay.cuts().restore_all();
}

async fn watch_peers(
    store: PgStore,
    relay: &Arc<RelayClient>,
    me: String,
    (ttl, every): (Duration, Duration),
    token: LeaderToken,
    cancel: CancellationToken,
) {
    // A probe waits longer than a beat: a loaded peer that is slow to
    // answer is not a cut one.
    let wait = (every * 2).max(Duration::from_secs(1));
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = sleep(every) => {}
        }
        let rows = match store.list_replicas(ttl).await {
            Ok(rows) => rows,
            Err(e) => {
                debug!(error = %e, "cannot list the replicas to probe; retrying");
                continue;
            }
        };
        follow_flags(relay, &rows, &me);
        let peers = probe(relay, &rows, &me, wait).await;
        // Failing for a whole TTL while heartbeating: not a slow moment.
        let mut verdicts = reachability::verdicts(&peers, ttl);
        verdicts.extend(own_flag(&rows, &me));
        for v in verdicts {
            if let Err(StoreError::Fenced { .. }) = apply(&store, relay, &v).await {
                token.depose("a drain flag change was fenced");
                return;
            }
        }
    }
}

/// Every live peer probed at once; their rows with the streaks after.
async fn probe(
    relay: &Arc<RelayClient>,
    rows: &[ReplicaInfo],
    me: &str,
    wait: Duration,
) -> Vec<Peer> {
    let live: Vec<&ReplicaInfo> = rows.iter().filter(|r| r.alive && r.id != me).collect();
    relay
        .streaks()
        .retain(|id, inc| rows.iter().any(|r| r.id == id && r.incarnation == inc));
    let mut asks = JoinSet::new();
    for r in &live {
        let (relay, addr) = (relay.clone(), r.endpoint.clone());
        let peer = ReplicaRef {
            id: r.id.clone(),
            incarnation: r.incarnation,
        };
        asks.spawn(async move { relay.inspect(&peer, &addr, wait).await });
    }
    while asks.join_next().await.is_some() {}
    live.into_iter()
        .map(|r| Peer {
            id: r.id.clone(),
            incarnation: r.incarnation,
            drained: r.drain,
            streak: relay.streaks().get(&r.id, r.incarnation),
        })
        .collect()
}

/// Calls to the peers flagged in the database (by this leader or an
/// earlier one) fail at once; calls to the others go through.
fn follow_flags(relay: &RelayClient, rows: &[ReplicaInfo], me: &str) {
    let cuts = relay.cuts();
    cuts.retain(|id, inc| rows.iter().any(|r| r.id == id && r.incarnation == inc));
    for r in rows.iter().filter(|r| r.id != me) {
        if r.drain {
            cuts.trip(&r.id, r.incarnation);
        } else {
            cuts.restore(&r.id, r.incarnation);
        }
    }
}

/// A leader's own flag (set by the leader before it, when it could not
/// reach this one) means nothing now: lift it.
fn own_flag(rows: &[ReplicaInfo], me: &str) -> Option<Verdict> {
    let mine = rows.iter().find(|r| r.id == me && r.drain)?;
    Some(Verdict::Restore {
        id: mine.id.clone(),
        incarnation: mine.incarnation,
    })
}

async fn apply(store: &PgStore, relay: &RelayClient, v: &Verdict) -> Result<(), StoreError> {
    let (id, incarnation, drain) = match v {
        Verdict::Drain { id, incarnation } => (id, *incarnation, true),
        Verdict::Restore { id, incarnation } => (id, *incarnation, false),
    };
    match store.set_drain(id, incarnation, drain).await {
        Ok(true) if drain => {
            relay.cuts().trip(id, incarnation);
            warn!(
                replica = %id,
                failures = relay.streaks().get(id, incarnation).failures,
                "this leader's relay calls to the replica keep failing while it heartbeats: \
                 flagged it for drain, so its nodes move to replicas the leader reaches; \
                 calls to it fail at once meanwhile"
            );
        }
        Ok(true) => {
            relay.cuts().restore(id, incarnation);
            info!(
                replica = %id,
                "the replica answers the relay again: its drain flag is lifted"
            );
        }
        Ok(false) => debug!(replica = %id, "that run of the replica is gone; flag left"),
        Err(e @ StoreError::Fenced { .. }) => return Err(e),
        Err(e) => debug!(replica = %id, error = %e, "drain flag not changed; retrying"),
    }
    Ok(())
}
