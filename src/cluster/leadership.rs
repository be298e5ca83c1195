//! Who leads, under which epoch, and until when: the one value every piece
//! of leader work checks before a side effect.
//!
//! The election sets it; the supervisor starts and stops leader work on its
//! changes; reconcilers check a [`LeaderToken`] right before each command.
//! A token is valid only while the role is still `Leader` with the token's
//! epoch *and* the lease, measured on this process's monotonic clock, has
//! not run out. The second half matters after a freeze (SIGSTOP, a starved
//! CPU): the process wakes with its role still `Leader`, but its last
//! renewal is older than the lease, so nothing it had in flight may act
//! before the election loop notices and steps down.

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tracing::warn;

/// This replica's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Follower,
    /// Leading under this epoch.
    Leader(u64),
}

impl Role {
    pub fn epoch(self) -> Option<u64> {
        match self {
            Role::Leader(e) => Some(e),
            Role::Follower => None,
        }
    }
}

/// Until when the lease holds on the monotonic clock; `None` never ends
/// (the single replica of the memory store).
#[derive(Debug, Clone, Copy)]
enum Lease {
    Until(Instant),
    Forever,
}

/// The replica's role and lease, shared by everything that acts as leader.
pub struct Leadership {
    role: watch::Sender<Role>,
    lease: Mutex<Lease>,
    /// Leader work asks the election to let go (a fenced write, a stale
    /// epoch seen at a node): someone else leads.
    deposed: Notify,
    /// Whether leader work (of any term) is still running.
    working: watch::Sender<bool>,
    /// When the lease was last won or renewed (for the lease-age metric).
    renewed: Mutex<Option<Instant>>,
}

impl Leadership {
    /// A follower, until an election says otherwise.
    pub fn follower() -> Arc<Self> {
        Arc::new(Self {
            role: watch::Sender::new(Role::Follower),
            lease: Mutex::new(Lease::Until(Instant::now())),
            deposed: Notify::new(),
            working: watch::Sender::new(false),
            renewed: Mutex::new(None),
        })
    }

    /// The permanent leader of a single replica (memory store): nobody
    /// else can lead, so the lease never ends.
    pub fn solo(epoch: u64) -> Arc<Self> {
        Arc::new(Self {
            role: watch::Sender::new(Role::Leader(epoch)),
            lease: Mutex::new(Lease::Forever),
            deposed: Notify::new(),
            working: watch::Sender::new(false),
            renewed: Mutex::new(None),
        })
    }

    fn lease(&self) -> MutexGuard<'_, Lease> {
        self.lease.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn role(&self) -> Role {
        *self.role.borrow()
    }

    pub fn subscribe(&self) -> watch::Receiver<Role> {
        self.role.subscribe()
    }

    /// A token for the current term, if this replica leads.
    pub fn token(self: &Arc<Self>) -> Option<LeaderToken> {
        self.role().epoch().map(|epoch| LeaderToken {
            epoch,
            leadership: self.clone(),
        })
    }

    /// Whether `epoch` leads here and its lease still holds.
    pub fn holds(&self, epoch: u64) -> bool {
        if self.role() != Role::Leader(epoch) {
            return false;
        }
        match *self.lease() {
            Lease::Forever => true,
            Lease::Until(t) => Instant::now() < t,
        }
    }

    /// When the current lease ends (`None`: never).
    pub fn lease_end(&self) -> Option<Instant> {
        match *self.lease() {
            Lease::Forever => None,
            Lease::Until(t) => Some(t),
        }
    }

    /// How long ago the lease was last won or renewed (`None`: never, or
    /// a lease that needs no renewal).
    pub fn lease_age(&self) -> Option<std::time::Duration> {
        let renewed = *self.renewed.lock().unwrap_or_else(|p| p.into_inner());
        renewed.map(|t| t.elapsed())
    }

    fn renewed_now(&self) {
        *self.renewed.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }

    /// Becomes leader of `epoch` with a lease until `until`.
    pub(crate) fn promote(&self, epoch: u64, until: Instant) {
        self.renewed_now();
        *self.lease() = Lease::Until(until);
        self.role.send_replace(Role::Leader(epoch));
    }

    /// A renewal succeeded: the lease now ends at `until`.
    pub(crate) fn extend(&self, until: Instant) {
        self.renewed_now();
        let mut lease = self.lease();
        if let Lease::Until(t) = *lease {
            *lease = Lease::Until(t.max(until));
        }
    }

    /// Stops leading. The lease ends first, so a token checked concurrently
    /// already fails before the role changes.
    pub(crate) fn demote(&self) {
        *self.lease() = Lease::Until(Instant::now());
        self.role.send_if_modified(|r| {
            let was = *r != Role::Follower;
            *r = Role::Follower;
            was
        });
    }

    /// Resolves when leader work has asked to be deposed.
    pub(crate) async fn deposed(&self) {
        self.deposed.notified().await;
    }

    /// The supervisor reports whether leader work runs.
    pub fn set_working(&self, working: bool) {
        self.working.send_replace(working);
    }

    /// Waits until no leader work runs (a handover unlocks only then, so
    /// the next leader never overlaps this one's last commands).
    pub async fn wait_idle(&self) {
        let mut rx = self.working.subscribe();
        let _ = rx.wait_for(|w| !*w).await;
    }
}

/// Proof of leadership for one term, carried by leader work.
#[derive(Clone)]
pub struct LeaderToken {
    epoch: u64,
    leadership: Arc<Leadership>,
}

impl LeaderToken {
    /// A token for `epoch` of a permanent single-replica leader (tests).
    pub fn solo(epoch: u64) -> Self {
        Self {
            epoch,
            leadership: Leadership::solo(epoch),
        }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether this term still leads and its lease holds: check it right
    /// before every side effect.
    pub fn is_valid(&self) -> bool {
        self.leadership.holds(self.epoch)
    }

    /// Leader work found that another leader took over (a fenced write, a
    /// node that saw a newer epoch): stop leading now.
    pub fn depose(&self, why: &str) {
        if self.leadership.role() != Role::Leader(self.epoch) {
            return;
        }
        warn!(epoch = self.epoch, why, "deposed: stopping leader work");
        self.leadership.demote();
        self.leadership.deposed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_token_dies_with_its_lease_even_while_the_role_stands() {
        let l = Leadership::follower();
        assert!(l.token().is_none());
        l.promote(7, Instant::now() + Duration::from_secs(4));
        let token = l.token().expect("leads");
        assert!(token.is_valid());
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(l.role(), Role::Leader(7), "nobody demoted it yet");
        assert!(!token.is_valid(), "but the lease ran out");
    }

    #[tokio::test(start_paused = true)]
    async fn an_extension_never_shortens_the_lease() {
        let l = Leadership::follower();
        let start = Instant::now();
        l.promote(1, start + Duration::from_secs(4));
        l.extend(start + Duration::from_secs(2));
        assert_eq!(l.lease_end(), Some(start + Duration::from_secs(4)));
        l.extend(start + Duration::from_secs(6));
        assert_eq!(l.lease_end(), Some(start + Duration::from_secs(6)));
    }

    #[tokio::test]
    async fn a_token_of_an_old_term_is_invalid_in_a_new_one() {
        let l = Leadership::follower();
        l.promote(1, Instant::now() + Duration::from_secs(60));
        let old = l.token().expect("leads");
        l.demote();
        l.promote(2, Instant::now() + Duration::from_secs(60));
        assert!(!old.is_valid());
        old.depose("stale");
        assert_eq!(
            l.role(),
            Role::Leader(2),
            "an old term cannot depose a new one"
        );
    }

    #[test]
    fn the_solo_leader_never_expires() {
        let token = LeaderToken::solo(1);
        assert!(token.is_valid());
        assert_eq!(token.epoch(), 1);
    }
}
