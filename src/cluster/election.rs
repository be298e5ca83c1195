//! Leader election: a session-level advisory lock on a dedicated
//! connection, a lease on top of it, and an epoch that fences everything
//! the leader writes and sends.
//!
//! - Standby: waits for the lock in rounds of `renew` (`lock_timeout`), so
//!   a lock released by a dead leader's session is taken at once. Between
//!   rounds it reads the leadership row: when the holder's lease has run
//!   out (database time) while it still holds the lock (a frozen process
//!   whose kernel keeps the connection alive), it terminates the holder's
//!   backend and takes over.
//! - Winning: on the lock's own connection, bump the epoch past both the
//!   row's and any epoch this replica has seen, and stamp the term; the
//!   row lock waits for every fenced write of the old term to finish.
//! - Leading: renew every `renew`; stop by itself `renew` before the lease
//!   could run out on the standbys' side, and at once when a renewal finds
//!   the term superseded or the connection gone.
//! - Handing over: stop leader work, wait for it to wind down, unlock;
//!   a waiting standby gets the lock immediately.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep, sleep_until, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::pgconn::{PgConn, sqlstate};
use super::{Identity, Leadership};
use crate::store::postgres::PgConnector;
use crate::transport::Transport;

/// The lock's key: "slim", slot 2 (slot 1 was the single-replica guard of
/// earlier releases; sqlx's migrator uses a one-int key).
const KEY: (i32, i32) = (0x736c_696d, 2);

/// `lock_not_available`: a lock wait ran into `lock_timeout`.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// Election timings.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    /// Standbys replace a leader whose last renewal is older than this.
    pub lease: Duration,
    pub renew: Duration,
}

impl Timings {
    /// How long after a renewal was sent the leader keeps acting: one
    /// renewal interval short of the standbys' deadline.
    fn self_stop(self) -> Duration {
        self.lease.saturating_sub(self.renew)
    }
}

/// Asks the election to hand leadership over; answered with the epoch
/// left, or `None` if this replica did not lead.
type Resign = oneshot::Sender<Option<u64>>;

/// A handle to ask for a handover (`slim-cp step-down`, SIGTERM).
#[derive(Clone)]
pub struct ElectionHandle {
    tx: mpsc::Sender<Resign>,
}

impl ElectionHandle {
    /// Hands leadership over if this replica leads; returns the epoch it
    /// left. Waits until leader work has stopped and the lock is released.
    pub async fn resign(&self) -> Option<u64> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(tx).await.ok()?;
        rx.await.ok().flatten()
    }
}

/// How a connection's turn ended, and how long to stay out after it.
enum Ended {
    Cancelled,
    /// Resigned: stay out a whole lease, so a standby surely wins.
    Resigned,
    /// Lost the lease, the term or the connection: compete again soon.
    Lost,
}

/// The election loop of one replica.
pub struct Election {
    config: PgConnector,
    identity: Arc<Identity>,
    leadership: Arc<Leadership>,
    transport: Arc<Transport>,
    timings: Timings,
    requests: mpsc::Receiver<Resign>,
}

impl Election {
    pub fn new(
        config: PgConnector,
        identity: Arc<Identity>,
        leadership: Arc<Leadership>,
        transport: Arc<Transport>,
        timings: Timings,
    ) -> (Election, ElectionHandle) {
        let (tx, requests) = mpsc::channel(4);
        let election = Election {
            config,
            identity,
            leadership,
            transport,
            timings,
            requests,
        };
        (election, ElectionHandle { tx })
    }

    /// Competes, leads and hands over until `cancel`; a leader resigns
    /// before returning.
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut pause = Duration::ZERO;
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                Some(ask) = self.requests.recv() => { let _ = ask.send(None); continue; }
                () = sleep(pause) => {}
            }
            let mut conn = match PgConn::open(&self.config, "election").await {
                Ok(c) => c,
                Err(e) => {
                    debug!(error = %e, "election: cannot reach the database");
                    pause = self.timings.renew;
                    continue;
                }
            };
            pause = match self.turn(&mut conn, &cancel).await {
                Ended::Cancelled => return,
                Ended::Resigned => self.timings.lease,
                Ended::Lost => self.timings.renew,
            };
        }
    }

    /// One connection's turn: stand by until the lock is ours, then lead.
    async fn turn(&mut self, conn: &mut PgConn, cancel: &CancellationToken) -> Ended {
        match self.stand_by(conn, cancel).await {
            Ok(()) => {}
            Err(ended) => return ended,
        }
        match self.establish(conn).await {
            Ok(epoch) => self.lead(conn, epoch, cancel).await,
            Err(e) => {
                warn!(error = %e, "election: won the lock but could not start a term");
                Ended::Lost
            }
        }
    }

    async fn stand_by(&mut self, conn: &PgConn, cancel: &CancellationToken) -> Result<(), Ended> {
        let wait = format!(
            "SET lock_timeout = {}",
            self.timings.renew.as_millis().max(1)
        );
        if let Err(e) = conn.client.batch_execute(&wait).await {
            debug!(error = %e, "election: connection failed");
            return Err(Ended::Lost);
        }
        let lock = format!("SELECT pg_advisory_lock({}, {})", KEY.0, KEY.1);
        let mut watch = HolderWatch::default();
        loop {
            // The attempt is never dropped half-way (only with the whole
            // connection): a wait abandoned client-side could still take
            // the lock server-side, and a second attempt would stack it.
            let attempt = conn.client.simple_query(&lock);
            tokio::pin!(attempt);
            let result = loop {
                tokio::select! {
                    () = cancel.cancelled() => return Err(Ended::Cancelled),
                    Some(ask) = self.requests.recv() => { let _ = ask.send(None); }
                    r = &mut attempt => break r,
                }
            };
            match result {
                Ok(_) => return Ok(()),
                Err(e) if sqlstate(&e) == Some(LOCK_NOT_AVAILABLE) => {
                    if let Err(e) = self.check_holder(conn, &mut watch).await {
                        debug!(error = %e, "election: connection failed");
                        return Err(Ended::Lost);
                    }
                }
                Err(e) => {
                    debug!(error = %e, "election: connection failed");
                    return Err(Ended::Lost);
                }
            }
        }
    }

    /// Between lock waits: learns the epoch, and replaces a holder whose
    /// lease ran out. Advisory locks are per database: only this database's
    /// holder counts (other clusters may share the server).
    async fn check_holder(
        &self,
        conn: &PgConn,
        watch: &mut HolderWatch,
    ) -> Result<(), tokio_postgres::Error> {
        let sql = format!(
            "SELECT l.epoch, \
               (l.renewed_at IS NULL OR l.renewed_at < now() - make_interval(secs => $1::bigint / 1000.0)) AS expired, \
               l.leader_pid, \
               (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = {} \
                  AND objid = {} AND objsubid = 2 AND granted \
                  AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                  LIMIT 1) AS holder \
             FROM leadership l WHERE singleton",
            KEY.0, KEY.1
        );
        let lease_ms = i64::try_from(self.timings.lease.as_millis()).unwrap_or(i64::MAX);
        let row = conn.client.query_one(&sql, &[&lease_ms]).await?;
        let epoch: i64 = row.try_get("epoch")?;
        self.transport
            .observe_epoch(u64::try_from(epoch).unwrap_or(0));
        let holder: Option<i32> = row.try_get("holder")?;
        let Some(holder) = holder else {
            return Ok(()); // released meanwhile: the next wait takes it
        };
        let established = row.try_get::<_, Option<i32>>("leader_pid")? == Some(holder);
        let expired: bool = row.try_get("expired")?;
        if watch.should_replace(holder, established, expired, self.timings.lease) {
            warn!(
                pid = holder,
                epoch, "the leader's lease ran out while it holds the lock; taking over"
            );
            conn.client
                .query_one("SELECT pg_terminate_backend($1)", &[&holder])
                .await?;
        }
        Ok(())
    }

    /// Starts a term on the lock's connection; returns its epoch.
    ///
    /// The row lock waits (`lock_timeout` = `renew`) for the old term's
    /// fenced writes. A deposed leader cut off behind something that keeps
    /// its sessions alive (a proxy, a pooler) or frozen mid-transaction
    /// would hold the row until Postgres's idle-in-transaction timeout
    /// (30 s, measured in the partition drill); so when the wait runs out,
    /// transactions of slim-cp (our `application_name`) idle for longer
    /// than the lease are ended and the term is tried again, for up to two
    /// leases. Ending one is safe: an aborted write of the old term is no
    /// write at all.
    async fn establish(&self, conn: &mut PgConn) -> Result<u64, tokio_postgres::Error> {
        let deadline = Instant::now() + self.timings.lease * 2;
        loop {
            match self.start_term(conn).await {
                Err(e) if sqlstate(&e) == Some(LOCK_NOT_AVAILABLE) && Instant::now() < deadline => {
                    self.end_stale_transactions(conn).await?;
                }
                other => return other,
            }
        }
    }

    /// Terminates slim-cp's sessions idle in a transaction for longer than
    /// the lease (ours are short; such a session's process is gone, frozen
    /// or cut off).
    async fn end_stale_transactions(&self, conn: &PgConn) -> Result<(), tokio_postgres::Error> {
        let lease_ms = i64::try_from(self.timings.lease.as_millis()).unwrap_or(i64::MAX);
        let row = conn
            .client
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid() \
                   AND application_name = current_setting('application_name') \
                   AND state IN ('idle in transaction', 'idle in transaction (aborted)') \
                   AND state_change < now() - make_interval(secs => $1::bigint / 1000.0)",
                &[&lease_ms],
            )
            .await?;
        let ended: i64 = row.try_get(0)?;
        if ended > 0 {
            warn!(
                ended,
                "ended stale transactions holding the leadership row; starting the term"
            );
        }
        Ok(())
    }

    async fn start_term(&self, conn: &mut PgConn) -> Result<u64, tokio_postgres::Error> {
        let me = self.identity.current();
        let seen = i64::try_from(self.transport.highest_epoch()).unwrap_or(i64::MAX);
        let incarnation = i64::try_from(me.incarnation).unwrap_or(i64::MAX);
        let tx = conn.client.transaction().await?;
        // FOR UPDATE waits for the old term's fenced writes (FOR SHARE).
        let row = tx
            .query_one(
                "SELECT epoch FROM leadership WHERE singleton FOR UPDATE",
                &[],
            )
            .await?;
        let epoch = row.try_get::<_, i64>(0)?.max(seen) + 1;
        tx.execute(
            "UPDATE leadership SET epoch = $1, leader = $2, leader_incarnation = $3, \
               leader_pid = pg_backend_pid(), since = now(), renewed_at = now() \
             WHERE singleton",
            &[&epoch, &me.id, &incarnation],
        )
        .await?;
        tx.commit().await?;
        Ok(u64::try_from(epoch).unwrap_or(0))
    }

    async fn lead(&mut self, conn: &mut PgConn, epoch: u64, cancel: &CancellationToken) -> Ended {
        let renew = self.timings.renew;
        let mut next = Instant::now();
        self.leadership
            .promote(epoch, next + self.timings.self_stop());
        self.transport.observe_epoch(epoch);
        info!(epoch, "leading");
        loop {
            next += renew;
            let lease_end = self.leadership.lease_end().unwrap_or(next + renew);
            tokio::select! {
                biased;
                () = cancel.cancelled() => {
                    self.hand_over(conn, epoch).await;
                    return Ended::Cancelled;
                }
                () = sleep_until(lease_end) => {
                    warn!(epoch, "lease ran out before a renewal succeeded; stepping down");
                    self.leadership.demote();
                    return Ended::Lost;
                }
                () = self.leadership.deposed() => return Ended::Lost,
                Some(ask) = self.requests.recv() => {
                    self.hand_over(conn, epoch).await;
                    let _ = ask.send(Some(epoch));
                    return Ended::Resigned;
                }
                () = sleep_until(next) => {
                    if let Err(why) = self.renew(conn, epoch).await {
                        warn!(epoch, why, "stepping down");
                        self.leadership.demote();
                        return Ended::Lost;
                    }
                }
            }
        }
    }

    /// One renewal. A slow one is not an error (the lease decides); a
    /// superseded term or a broken connection is.
    async fn renew(&self, conn: &PgConn, epoch: u64) -> Result<(), &'static str> {
        let sent = Instant::now();
        let epoch_sql = i64::try_from(epoch).unwrap_or(i64::MAX);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&epoch_sql];
        let renewal = conn.client.query_opt(
            "UPDATE leadership SET renewed_at = now() \
             WHERE singleton AND epoch = $1 AND leader_pid = pg_backend_pid() RETURNING epoch",
            &params,
        );
        match timeout(self.timings.renew, renewal).await {
            Ok(Ok(Some(_))) => {
                self.leadership.extend(sent + self.timings.self_stop());
                Ok(())
            }
            Ok(Ok(None)) => Err("another replica took over the term"),
            Ok(Err(_)) => Err("the election connection failed"),
            Err(_) => {
                debug!(epoch, "lease renewal slow; retrying");
                Ok(())
            }
        }
    }

    /// Stops leader work, waits for it, and releases the lock.
    async fn hand_over(&self, conn: &PgConn, epoch: u64) {
        self.leadership.demote();
        let idle = self.leadership.wait_idle();
        if timeout(self.timings.lease, idle).await.is_err() {
            warn!(epoch, "leader work did not stop in time; releasing anyway");
        }
        let epoch_sql = i64::try_from(epoch).unwrap_or(i64::MAX);
        let release = async {
            conn.client
                .execute(
                    "UPDATE leadership SET renewed_at = NULL \
                     WHERE singleton AND epoch = $1 AND leader_pid = pg_backend_pid()",
                    &[&epoch_sql],
                )
                .await?;
            let unlock = format!("SELECT pg_advisory_unlock({}, {})", KEY.0, KEY.1);
            conn.client.simple_query(&unlock).await
        };
        match timeout(self.timings.renew, release).await {
            Ok(Ok(_)) => info!(epoch, "handed leadership over"),
            // The connection goes with the turn, which releases the lock.
            _ => debug!(epoch, "release failed; closing the connection instead"),
        }
    }
}

/// A standby's memory of a lock holder that has not stamped its term yet
/// (it won, or it is a stale session): replaced once it stays so a lease.
#[derive(Default)]
struct HolderWatch {
    unestablished: Option<(i32, Instant)>,
}

impl HolderWatch {
    fn should_replace(
        &mut self,
        pid: i32,
        established: bool,
        expired: bool,
        lease: Duration,
    ) -> bool {
        if established {
            self.unestablished = None;
            return expired;
        }
        let now = Instant::now();
        match self.unestablished {
            Some((p, since)) if p == pid => now.duration_since(since) > lease,
            _ => {
                self.unestablished = Some((pid, now));
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_established_holder_is_replaced_only_once_its_lease_expired() {
        let lease = Duration::from_secs(5);
        let mut w = HolderWatch::default();
        assert!(!w.should_replace(10, true, false, lease));
        assert!(w.should_replace(10, true, true, lease));
    }

    #[tokio::test(start_paused = true)]
    async fn a_fresh_winner_gets_a_whole_lease_to_stamp_its_term() {
        let lease = Duration::from_secs(5);
        let mut w = HolderWatch::default();
        assert!(!w.should_replace(11, false, true, lease), "just won");
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(!w.should_replace(11, false, true, lease));
        assert!(
            !w.should_replace(12, false, true, lease),
            "another winner restarts the clock"
        );
        tokio::time::advance(Duration::from_secs(6)).await;
        assert!(
            w.should_replace(12, false, true, lease),
            "never established"
        );
    }

    #[test]
    fn the_leader_stops_a_renewal_short_of_the_lease() {
        let t = Timings {
            lease: Duration::from_secs(5),
            renew: Duration::from_secs(1),
        };
        assert_eq!(t.self_stop(), Duration::from_secs(4));
    }
}
