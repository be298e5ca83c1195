//! Which peers this replica's relay reaches, and what the leader does
//! about one it cannot reach while the database still sees it alive.
//!
//! Every relay call (a forwarded request, a probe) ends in a streak: a
//! peer that answered, whatever it answered, was reached; one whose call
//! failed below gRPC (refused, reset, timed out) was not. The leader's
//! duty ([`crate::cluster::unreachable`]) probes every live peer each
//! heartbeat and turns the streaks into [`Verdict`]s:
//!
//! - drain a peer after [`DRAIN_AFTER`] failures in a row spanning at
//!   least the replica TTL: its nodes must move to a replica the leader
//!   can command, or commands to them wait for a heal that may never
//!   come; the span keeps a starved machine (a probe answered late three
//!   times) from moving nodes for nothing;
//! - only with a witness, another live peer the relay does reach: a
//!   leader that reaches no peer at all is more likely the one cut off,
//!   and draining everyone else would push every node onto it;
//! - restore a drained peer after [`RESTORE_AFTER`] answers in a row, so
//!   a flapping path does not move nodes back and forth at every beat.
//!
//! Pure logic: the duty does the I/O.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Failed relay calls in a row before the leader drains a peer.
pub const DRAIN_AFTER: u32 = 3;
/// Answered relay calls in a row before the leader lifts a drain.
pub const RESTORE_AFTER: u32 = 3;

/// The current run of one peer's relay calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Streak {
    /// Calls that failed since the last answer.
    pub failures: u32,
    /// Calls answered since the last failure.
    pub answers: u32,
    /// When the first of `failures` failed.
    pub failing_since: Option<Instant>,
}

impl Streak {
    /// How long the calls have been failing.
    pub fn failing_for(&self) -> Duration {
        self.failing_since.map_or(Duration::ZERO, |t| t.elapsed())
    }
}

/// Streaks per run of a peer (id and incarnation: a restarted peer starts
/// afresh), fed by every relay call.
#[derive(Debug, Default)]
pub struct Streaks {
    by_peer: Mutex<HashMap<(String, u64), Streak>>,
}

impl Streaks {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u64), Streak>> {
        self.by_peer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records one call to run `incarnation` of `peer`: answered or not.
    pub fn record(&self, peer: &str, incarnation: u64, answered: bool) {
        let mut map = self.map();
        let s = map.entry((peer.to_string(), incarnation)).or_default();
        if answered {
            *s = Streak {
                failures: 0,
                answers: s.answers.saturating_add(1),
                failing_since: None,
            };
        } else {
            *s = Streak {
                failures: s.failures.saturating_add(1),
                answers: 0,
                failing_since: s.failing_since.or_else(|| Some(Instant::now())),
            };
        }
    }

    pub fn get(&self, peer: &str, incarnation: u64) -> Streak {
        let key = (peer.to_string(), incarnation);
        self.map().get(&key).copied().unwrap_or_default()
    }

    /// Forgets every run `keep` does not name (restarted, gone).
    pub fn retain(&self, keep: impl Fn(&str, u64) -> bool) {
        self.map().retain(|(id, inc), _| keep(id, *inc));
    }
}

/// A live peer as the leader sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub id: String,
    pub incarnation: u64,
    /// Its drain flag in the database.
    pub drained: bool,
    pub streak: Streak,
}

/// What the leader does about one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Drain { id: String, incarnation: u64 },
    Restore { id: String, incarnation: u64 },
}

/// The verdicts for the live peers (the leader itself excluded); a peer
/// is drained only once its calls have failed for `span`.
pub fn verdicts(peers: &[Peer], span: Duration) -> Vec<Verdict> {
    let mut out = Vec::new();
    for p in peers {
        let (id, incarnation) = (p.id.clone(), p.incarnation);
        let failing = p.streak.failures >= DRAIN_AFTER && p.streak.failing_for() >= span;
        if p.drained && p.streak.answers >= RESTORE_AFTER {
            out.push(Verdict::Restore { id, incarnation });
        } else if !p.drained && failing && witnessed(peers, &p.id) {
            out.push(Verdict::Drain { id, incarnation });
        }
    }
    out
}

/// Whether another peer than `id` answers the relay now.
fn witnessed(peers: &[Peer], id: &str) -> bool {
    peers
        .iter()
        .any(|q| q.id != id && q.streak.failures == 0 && q.streak.answers > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_peer(id: &str, drained: bool, streaks: &Streaks) -> Peer {
        Peer {
            id: id.into(),
            incarnation: 1,
            drained,
            streak: streaks.get(id, 1),
        }
    }

    fn fail(s: &Streaks, id: &str, n: u32) {
        (0..n).for_each(|_| s.record(id, 1, false));
    }

    fn answer(s: &Streaks, id: &str, n: u32) {
        (0..n).for_each(|_| s.record(id, 1, true));
    }

    #[tokio::test(start_paused = true)]
    async fn a_restarted_peer_starts_a_fresh_streak() {
        let s = Streaks::default();
        fail(&s, "f", DRAIN_AFTER);
        assert_eq!(s.get("f", 2), Streak::default());
        s.retain(|_, inc| inc == 2);
        assert_eq!(s.get("f", 1), Streak::default());
    }

    const SPAN: Duration = Duration::from_secs(3);

    /// Peer `g` answers; `f` failed `failures` times, `waited` ago.
    async fn mk_streaks(failures: u32, waited: Duration) -> Streaks {
        let s = Streaks::default();
        answer(&s, "g", 1);
        fail(&s, "f", failures);
        tokio::time::advance(waited).await;
        s
    }

    #[tokio::test(start_paused = true)]
    async fn the_failure_streak_reaching_the_threshold_drains_the_peer() {
        let s = mk_streaks(DRAIN_AFTER - 1, SPAN).await;
        let peers = || [mk_peer("f", false, &s), mk_peer("g", false, &s)];
        assert_eq!(verdicts(&peers(), SPAN), vec![]);
        fail(&s, "f", 1);
        let drain = Verdict::Drain {
            id: "f".into(),
            incarnation: 1,
        };
        assert_eq!(verdicts(&peers(), SPAN), vec![drain]);
    }

    #[tokio::test(start_paused = true)]
    async fn failures_within_the_span_drain_nobody() {
        let s = mk_streaks(DRAIN_AFTER * 2, SPAN - Duration::from_millis(1)).await;
        let peers = [mk_peer("f", false, &s), mk_peer("g", false, &s)];
        assert_eq!(verdicts(&peers, SPAN), vec![]);
    }

    #[tokio::test(start_paused = true)]
    async fn one_answer_resets_the_failure_streak() {
        let s = mk_streaks(DRAIN_AFTER - 1, SPAN).await;
        answer(&s, "f", 1);
        fail(&s, "f", DRAIN_AFTER);
        let peers = [mk_peer("f", false, &s), mk_peer("g", false, &s)];
        assert_eq!(verdicts(&peers, SPAN), vec![]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_that_reaches_no_peer_drains_nobody() {
        let s = Streaks::default();
        fail(&s, "f", DRAIN_AFTER);
        fail(&s, "g", DRAIN_AFTER);
        tokio::time::advance(SPAN).await;
        let peers = [mk_peer("f", false, &s), mk_peer("g", false, &s)];
        assert_eq!(verdicts(&peers, SPAN), vec![]);
        // Nor with a single peer: there is no witness.
        assert_eq!(verdicts(&peers[..1], SPAN), vec![]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_drained_peer_is_restored_after_answers_in_a_row() {
        let s = Streaks::default();
        fail(&s, "f", DRAIN_AFTER);
        answer(&s, "f", RESTORE_AFTER - 1);
        assert_eq!(verdicts(&[mk_peer("f", true, &s)], SPAN), vec![]);
        answer(&s, "f", 1);
        let restore = Verdict::Restore {
            id: "f".into(),
            incarnation: 1,
        };
        assert_eq!(verdicts(&[mk_peer("f", true, &s)], SPAN), vec![restore]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_drained_peer_still_failing_stays_drained() {
        let s = mk_streaks(DRAIN_AFTER * 4, SPAN).await;
        let peers = [mk_peer("f", true, &s), mk_peer("g", false, &s)];
        assert_eq!(verdicts(&peers, SPAN), vec![]);
    }
}
