//! Whether this replica is alive and whether it should get traffic, as
//! load balancers and orchestrators ask (`/healthz`, `/readyz`, and the
//! gRPC health service).
//!
//! Alive: the process answers and its runtime is not starved (a ticker
//! task has run recently). Ready: its listeners are up, the database
//! answered recently (a replica sharing Postgres), and it is not draining
//! (asked by an operator, or flagged by the leader); a schema mismatch
//! never gets this far (the replica refuses to start).
//!
//! The same facts say whether the node listener should be open
//! ([`Health::should_listen`]): a replica that cannot serve stops
//! listening (a refused connect is retried by the node and redispatched by
//! the load balancer), and listens again once it can. The listener reports
//! back what it actually did ([`Health::set_listening`]), so readiness and
//! the drain's pause follow the socket, not the wish.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A runtime whose ticker is this late is not responsive.
const STARVED_AFTER: Duration = Duration::from_secs(10);
const TICK: Duration = Duration::from_secs(1);

/// The replica's health, shared by whoever knows a part of it.
#[derive(Debug)]
pub struct Health {
    started: Instant,
    /// Milliseconds since `started` of the ticker's last run.
    ticked: AtomicU64,
    listening: AtomicBool,
    /// Since when the node listener has been closed (`None` while open).
    closed_since: Mutex<Option<Instant>>,
    /// Asked by an operator: for good (the process stops afterwards).
    draining: AtomicBool,
    /// Set by the leader in this replica's row (its relay did not answer);
    /// cleared by the leader once it does.
    drain_flag: AtomicBool,
    /// Whether the node listener should be open, for the listener.
    intake: watch::Sender<bool>,
    /// Whether the database answered recently (always, without one).
    database: AtomicBool,
    /// Why the database counts as unreachable, for `/readyz`.
    database_why: Mutex<String>,
}

impl Health {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            started: Instant::now(),
            ticked: AtomicU64::new(0),
            listening: AtomicBool::new(false),
            closed_since: Mutex::new(Some(Instant::now())),
            draining: AtomicBool::new(false),
            drain_flag: AtomicBool::new(false),
            intake: watch::channel(true).0,
            database: AtomicBool::new(true),
            database_why: Mutex::new(String::new()),
        })
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Keeps the liveness ticker running until `cancel`.
    pub fn tick(self: &Arc<Self>, cancel: CancellationToken) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                me.ticked.store(me.elapsed_ms(), Ordering::Relaxed);
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(TICK) => {}
                }
            }
        })
    }

    /// What the node listener did: opened (`true`) or closed its socket.
    pub fn set_listening(&self, up: bool) {
        let was = self.listening.swap(up, Ordering::Relaxed);
        let mut since = self.closed_since.lock().unwrap_or_else(|p| p.into_inner());
        if up {
            *since = None;
        } else if was || since.is_none() {
            *since = Some(Instant::now());
        }
    }

    pub fn is_listening(&self) -> bool {
        self.listening.load(Ordering::Relaxed)
    }

    /// How long the node listener has been closed (`None` while open).
    pub fn closed_for(&self) -> Option<Duration> {
        let since = *self.closed_since.lock().unwrap_or_else(|p| p.into_inner());
        since.map(|t| t.elapsed())
    }

    /// Whether the node listener should be open, as it changes.
    pub fn should_listen(&self) -> watch::Receiver<bool> {
        self.intake.subscribe()
    }

    /// An operator's drain: not ready and not listening until the end.
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
        self.refresh_intake();
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// The leader's drain flag as this replica's row has it; `true` when
    /// it changed.
    pub fn set_drain_flag(&self, flagged: bool) -> bool {
        let was = self.drain_flag.swap(flagged, Ordering::Relaxed);
        self.refresh_intake();
        was != flagged
    }

    pub fn drain_flagged(&self) -> bool {
        self.drain_flag.load(Ordering::Relaxed)
    }

    /// The database answered (`Ok`) or did not (`Err` with why).
    pub fn set_database(&self, answer: Result<(), String>) {
        let ok = answer.is_ok();
        if let Err(why) = answer {
            *self.database_why.lock().unwrap_or_else(|p| p.into_inner()) = why;
        }
        self.database.store(ok, Ordering::Relaxed);
        self.refresh_intake();
    }

    pub fn database_reachable(&self) -> bool {
        self.database.load(Ordering::Relaxed)
    }

    /// Open while nothing keeps this replica from serving new nodes: a
    /// starved runtime is not a reason (closing would not help it).
    fn refresh_intake(&self) {
        let open = !self.is_draining() && !self.drain_flagged() && self.database_reachable();
        self.intake
            .send_if_modified(|v| std::mem::replace(v, open) != open);
    }

    /// `Ok` while the runtime is responsive.
    pub fn alive(&self) -> Result<(), String> {
        let late = self
            .elapsed_ms()
            .saturating_sub(self.ticked.load(Ordering::Relaxed));
        let limit = u64::try_from(STARVED_AFTER.as_millis()).unwrap_or(u64::MAX);
        if late > limit {
            return Err(format!("the runtime has not run its ticker for {late} ms"));
        }
        Ok(())
    }

    /// `Ok` when the replica should get traffic; else every reason not to.
    pub fn ready(&self) -> Result<(), Vec<String>> {
        let mut why = Vec::new();
        if let Err(e) = self.alive() {
            why.push(e);
        }
        if !self.listening.load(Ordering::Relaxed) {
            why.push("not listening".into());
        }
        if self.is_draining() {
            why.push("draining".into());
        }
        if self.drain_flagged() {
            why.push(
                "draining: flagged by the leader, whose relay calls to this replica fail".into(),
            );
        }
        if !self.database.load(Ordering::Relaxed) {
            let detail = self
                .database_why
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            why.push(format!("database unreachable: {detail}"));
        }
        if why.is_empty() { Ok(()) } else { Err(why) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn ready_needs_listeners_a_database_and_no_drain() {
        let h = Health::new();
        let _ticker = h.tick(CancellationToken::new());
        tokio::task::yield_now().await;
        assert_eq!(h.ready(), Err(vec!["not listening".to_string()]));
        h.set_listening(true);
        assert_eq!(h.ready(), Ok(()));
        h.set_database(Err("timeout".into()));
        assert_eq!(
            h.ready(),
            Err(vec!["database unreachable: timeout".to_string()])
        );
        h.set_database(Ok(()));
        h.set_draining();
        assert_eq!(h.ready(), Err(vec!["draining".to_string()]));
    }

    #[tokio::test(start_paused = true)]
    async fn the_listener_should_close_without_a_database_or_with_the_flag_and_reopen() {
        let h = Health::new();
        let intake = h.should_listen();
        assert!(*intake.borrow());
        h.set_database(Err("timeout".into()));
        assert!(!*intake.borrow());
        h.set_database(Ok(()));
        assert!(*intake.borrow());
        h.set_drain_flag(true);
        assert!(!*intake.borrow());
        assert!(h.set_drain_flag(false));
        assert!(*intake.borrow());
        h.set_draining();
        h.set_database(Ok(()));
        assert!(!*intake.borrow(), "an operator's drain is for good");
    }

    #[tokio::test(start_paused = true)]
    async fn closed_for_counts_from_the_socket_closing() {
        let h = Health::new();
        h.set_listening(true);
        assert_eq!(h.closed_for(), None);
        h.set_listening(false);
        tokio::time::advance(Duration::from_secs(2)).await;
        h.set_listening(false);
        assert_eq!(h.closed_for(), Some(Duration::from_secs(2)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_starved_runtime_is_not_alive() {
        let h = Health::new();
        h.set_listening(true);
        assert!(h.alive().is_ok());
        // No ticker runs: time passes without it.
        tokio::time::advance(STARVED_AFTER + TICK).await;
        assert!(h.alive().is_err());
        assert!(h.ready().is_err());
    }
}
