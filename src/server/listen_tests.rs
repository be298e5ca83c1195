use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;

use super::{Listeners, bind_wide, gated, listen_on, take_backlog};
use crate::ops::Health;

/// More than the acceptor's channel holds, so that the rest wait in the
/// kernel's backlog while nobody reads the accepted connections.
const CLIENTS: usize = 100;
const PATIENCE: Duration = Duration::from_secs(20);

/// Dials `addr` `CLIENTS` times; each connect returns once the kernel has
/// the connection, accepted or not.
async fn dial_all(addr: std::net::SocketAddr) -> Vec<TcpStream> {
    let mut clients = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        clients.push(TcpStream::connect(addr).await.expect("connects"));
    }
    clients
}

/// Each client reads the byte its server side wrote: `Err` says how the
/// connection failed instead (a reset when its backlog slot was closed).
async fn hear_back(clients: Vec<TcpStream>) -> Vec<Result<u8, String>> {
    let mut heard = Vec::with_capacity(clients.len());
    for mut c in clients {
        let mut byte = [0u8; 1];
        let got = tokio::time::timeout(PATIENCE, c.read_exact(&mut byte)).await;
        heard.push(match got {
            Ok(Ok(_)) => Ok(byte[0]),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("nothing heard".into()),
        });
    }
    heard
}

#[tokio::test]
async fn taking_the_backlog_keeps_every_waiting_connection() {
    let listener = listen_on("127.0.0.1:0".parse().expect("addr")).expect("listens");
    let addr = listener.local_addr().expect("addr");
    let clients = dial_all(addr).await;
    let mut taken = take_backlog(listener);
    assert_eq!(taken.len(), CLIENTS, "every connection waiting was taken");
    for s in &mut taken {
        s.write_all(b"k").await.expect("writes");
    }
    let heard = hear_back(clients).await;
    assert!(heard.iter().all(|h| h == &Ok(b'k')), "{heard:?}");
    let refused = TcpStream::connect(addr).await;
    assert!(refused.is_err(), "closed afterwards: {refused:?}");
}

/// Regression: a drain (or a database outage) closed the node listener
/// with connections in its backlog; the kernel reset them, and a node
/// whose dial meets a reset gives up for good (CI lost one of 300 nodes
/// that way in `ops::a_drain_moves_every_node_in_batches`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_node_listener_serves_its_backlog() {
    let listener = listen_on("127.0.0.1:0".parse().expect("addr")).expect("listens");
    let addr = listener.local_addr().expect("addr");
    let health = Health::new();
    let end = CancellationToken::new();
    let mut listeners = Listeners::default();
    let mut accepted = gated(listener, addr, Arc::clone(&health), &end, &mut listeners);
    // Nobody reads `accepted` yet: the acceptor stops once its channel is
    // full, and the rest of the clients wait in the backlog.
    let clients = dial_all(addr).await;
    let first = tokio::time::timeout(PATIENCE, accepted.next()).await;
    let mut served = vec![first.expect("accepts").expect("open").expect("accepted")];
    assert!(health.is_listening());
    health.set_draining();
    while health.is_listening() {
        let next = tokio::time::timeout(PATIENCE, accepted.next()).await;
        let stream = next.expect("the acceptor goes on").expect("open");
        served.push(stream.expect("accepted"));
    }
    // Closed: what it took from its backlog is all it will hand over.
    end.cancel();
    let rest: Vec<_> = tokio::time::timeout(PATIENCE, accepted.collect())
        .await
        .expect("ends once cancelled");
    served.extend(rest.into_iter().map(|s| s.expect("accepted")));
    for s in &mut served {
        s.write_all(b"k").await.expect("writes");
    }
    let heard = hear_back(clients).await;
    let lost: Vec<_> = heard.iter().filter(|h| h != &&Ok(b'k')).collect();
    assert!(
        lost.is_empty(),
        "{} of {CLIENTS} lost: {lost:?}",
        lost.len()
    );
    assert_eq!(served.len(), CLIENTS);
}

/// Regression: the simulated balancer listened with tokio's default
/// backlog (128); 300 nodes dialling at once while its runtime was busy
/// overflowed it, the kernel fell back to SYN cookies, and a node whose
/// first data segment failed the cookie check was reset and gave up for
/// good (`ops::a_drain_moves_every_node_in_batches`, about 1 run in 30).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wide_listener_holds_a_burst_nobody_accepts_yet() {
    const BURST: usize = 600;
    let listener = bind_wide("127.0.0.1:0".parse().expect("addr")).expect("listens");
    let addr = listener.local_addr().expect("addr");
    let mut clients = Vec::with_capacity(BURST);
    for _ in 0..BURST {
        let mut c = TcpStream::connect(addr).await.expect("connects");
        // A node speaks first (the HTTP/2 preface).
        c.write_all(b"p").await.expect("writes");
        clients.push(c);
    }
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut byte = [0u8; 1];
                if s.read_exact(&mut byte).await.is_ok() {
                    let _ = s.write_all(b"k").await;
                }
            });
        }
    });
    let heard = hear_back(clients).await;
    let lost: Vec<_> = heard.iter().filter(|h| h != &&Ok(b'k')).collect();
    assert!(lost.is_empty(), "{} of {BURST} lost: {lost:?}", lost.len());
}
