//! Whether this replica is alive and whether it should get traffic, as
//! load balancers and orchestrators ask (`/healthz`, `/readyz`, and the
//! gRPC health service).
//!
//! Alive: the process answers and its runtime is not starved (a ticker
//! task has run recently). Ready: its listeners are up, the database
//! answered recently (a replica sharing Postgres), and it is not draining;
//! a schema mismatch never gets this far (the replica refuses to start).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
    draining: AtomicBool,
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
            draining: AtomicBool::new(false),
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

    pub fn set_listening(&self, up: bool) {
        self.listening.store(up, Ordering::Relaxed);
    }

    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// The database answered (`Ok`) or did not (`Err` with why).
    pub fn set_database(&self, answer: Result<(), String>) {
        let ok = answer.is_ok();
        if let Err(why) = answer {
            *self.database_why.lock().unwrap_or_else(|p| p.into_inner()) = why;
        }
        self.database.store(ok, Ordering::Relaxed);
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
