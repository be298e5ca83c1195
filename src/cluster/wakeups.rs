//! The leader's listener for fact wake-ups (`NOTIFY` from fact
//! transactions on any replica) on a dedicated connection. Notifications
//! sent while nobody listened are gone, so a read of every fact must
//! follow each `LISTEN`: the first of a term opens the gate the leader's
//! initial full read waits behind (a second full read in the middle of a
//! registration burst cost a 1,000-node fleet 0.13 s); every later one,
//! after a reconnect, asks for a full resync. A closed connection is
//! noticed at once; a ping notices a silent server.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::{interval, sleep, timeout};
use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::signals::{Inbox, Signals};
use crate::store::postgres::{FACTS_CHANNEL, PgConnector, RESYNC, SEPARATOR};
use crate::task::Owned;

/// How often the listener checks that the server still answers.
const PING: Duration = Duration::from_secs(5);

/// Listens until `cancel`, reconnecting as needed; `first` hears of the
/// first `LISTEN` in place.
pub async fn listen(
    target: PgConnector,
    inbox: Arc<Inbox>,
    first: oneshot::Sender<()>,
    cancel: CancellationToken,
) {
    let mut first = Some(first);
    loop {
        match listening(&target, &inbox, &mut first, &cancel).await {
            Ok(()) => return,
            Err(why) => debug!(why, "wake-up listener lost; reconnecting"),
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = sleep(Duration::from_millis(500)) => {}
        }
    }
}

/// One connection's life; `Ok` only when cancelled.
async fn listening(
    target: &PgConnector,
    inbox: &Arc<Inbox>,
    first: &mut Option<oneshot::Sender<()>>,
    cancel: &CancellationToken,
) -> Result<(), String> {
    let (client, mut connection) = target.connect().await.map_err(|e| e.to_string())?;
    let target = inbox.clone();
    let mut driver = Owned::spawn(async move {
        while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(AsyncMessage::Notification(n)) if n.payload() == RESYNC => target.resync(),
                Ok(AsyncMessage::Notification(n)) => n
                    .payload()
                    .split(SEPARATOR)
                    .for_each(|node| target.node_changed(node)),
                Ok(_) => {}
                Err(_) => break,
            }
        }
    });
    let listen = format!("LISTEN {FACTS_CHANNEL}");
    client
        .batch_execute(&listen)
        .await
        .map_err(|e| e.to_string())?;
    // A leader that stopped waiting read before this LISTEN: it resyncs.
    if first.take().is_none_or(|gate| gate.send(()).is_err()) {
        inbox.resync();
    }
    let mut ping = interval(PING);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return Ok(()),
            // A closed connection (a terminated backend, a restarted
            // server) is noticed now, not at the next ping: signals sent
            // until then would wait for the resync of the reconnect.
            _ = &mut driver => return Err("the connection closed".into()),
            _ = ping.tick() => {
                match timeout(PING, client.simple_query("SELECT 1")).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return Err(e.to_string()),
                    Err(_) => return Err("the database did not answer a ping".into()),
                }
            }
        }
    }
}
