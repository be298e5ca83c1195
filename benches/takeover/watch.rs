//! Watching the leadership row and the election lock from a dedicated
//! connection, polled every millisecond: a takeover is timed by when the
//! database shows it, not by what any replica says about itself. The
//! polls run on a thread and runtime of their own, so that the fleet's
//! burst of reconnections after a kill does not delay them.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::{Client, Statement};

use crate::common::database::connect;

/// Pause between two polls; with the round trip, an observation is at
/// most about 1-2 ms late.
const POLL: Duration = Duration::from_millis(1);

/// The row, and whether `$1` (the pid of the term's lock holder before the
/// drill) still holds the election lock of this database: the advisory
/// lock (classid "slim", objid 2) that src/cluster/election.rs takes.
const TERM: &str = "SELECT l.epoch, l.leader, l.leader_pid, EXISTS ( \
      SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND classid = 1936484717 \
        AND objid = 2 AND objsubid = 2 AND granted AND pid = $1 \
        AND database = (SELECT oid FROM pg_database WHERE datname = current_database())) \
    FROM leadership l WHERE singleton";

/// The standing term.
#[derive(Clone, Debug)]
pub struct Term {
    pub epoch: i64,
    pub leader: String,
    /// The leader's election connection (its backend pid).
    pub pid: i32,
}

/// When, after the drill's start, the database showed the takeover.
pub struct Takeover {
    /// A new epoch committed.
    pub epoch: Duration,
    /// The old term's holder no longer holds the election lock.
    pub released: Duration,
    pub term: Term,
    /// The longest gap between two observations: how late either time
    /// may be (a busy machine stretches the 1 ms polls).
    pub worst_gap: Duration,
}

/// What the bench asks of the polling thread.
enum Ask {
    Term(oneshot::Sender<Result<Term>>),
    Takeover(Term, Instant, Duration, oneshot::Sender<Result<Takeover>>),
}

/// A handle on the polling thread; it ends when this is dropped.
pub struct Observer {
    asks: mpsc::UnboundedSender<Ask>,
}

impl Observer {
    /// Starts the thread, connected to `url`.
    pub async fn start(url: &str) -> Result<Observer> {
        let (asks, mut rx) = mpsc::unbounded_channel();
        let (ready, connected) = oneshot::channel();
        let url = url.to_string();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            let serve = async move {
                let poller = match Poller::connect(&url).await {
                    Ok(p) => p,
                    Err(e) => {
                        let _ = ready.send(Err(e));
                        return;
                    }
                };
                let _ = ready.send(Ok(()));
                while let Some(ask) = rx.recv().await {
                    poller.answer(ask).await;
                }
            };
            rt.map(|rt| rt.block_on(serve))
        });
        connected.await.context("the polling thread ended")??;
        Ok(Observer { asks })
    }

    pub async fn term(&self) -> Result<Term> {
        let (tx, rx) = oneshot::channel();
        self.asks
            .send(Ask::Term(tx))
            .ok()
            .context("polling thread gone")?;
        rx.await?
    }

    /// Polls until a term after `old` stands and `old`'s holder has let
    /// the lock go; times both from `t0`.
    pub async fn takeover(&self, old: &Term, t0: Instant, bound: Duration) -> Result<Takeover> {
        let (tx, rx) = oneshot::channel();
        let ask = Ask::Takeover(old.clone(), t0, bound, tx);
        self.asks.send(ask).ok().context("polling thread gone")?;
        rx.await?
    }
}

/// The polling connection, on the polling thread.
struct Poller {
    client: Client,
    term: Statement,
}

impl Poller {
    async fn connect(url: &str) -> Result<Poller> {
        let client = connect(url).await?;
        let term = client.prepare(TERM).await?;
        Ok(Poller { client, term })
    }

    async fn answer(&self, ask: Ask) {
        match ask {
            Ask::Term(reply) => drop(reply.send(self.term().await)),
            Ask::Takeover(old, t0, bound, reply) => {
                drop(reply.send(self.takeover(&old, t0, bound).await));
            }
        }
    }

    /// The standing term, and whether `holder` holds the election lock.
    async fn read(&self, holder: i32) -> Result<(Term, bool)> {
        let row = self.client.query_one(&self.term, &[&holder]).await?;
        let leader: Option<String> = row.get(1);
        let pid: Option<i32> = row.get(2);
        let term = Term {
            epoch: row.get(0),
            leader: leader.unwrap_or_default(),
            pid: pid.unwrap_or(0),
        };
        Ok((term, row.get(3)))
    }

    async fn term(&self) -> Result<Term> {
        Ok(self.read(0).await?.0)
    }

    async fn takeover(&self, old: &Term, t0: Instant, bound: Duration) -> Result<Takeover> {
        let (mut epoch, mut released) = (None, None);
        let (mut last, mut worst_gap) = (Duration::ZERO, Duration::ZERO);
        loop {
            let (term, held) = self.read(old.pid).await?;
            let at = t0.elapsed();
            (last, worst_gap) = (at, worst_gap.max(at - last));
            if term.epoch > old.epoch {
                epoch.get_or_insert(at);
            }
            if !held {
                released.get_or_insert(at);
            }
            if let (Some(epoch), Some(released)) = (epoch, released) {
                return Ok(Takeover {
                    epoch,
                    released,
                    term,
                    worst_gap,
                });
            }
            if at > bound {
                bail!("no takeover from {old:?} in {bound:?} (now {term:?}, lock held {held})");
            }
            tokio::time::sleep(POLL).await;
        }
    }
}
