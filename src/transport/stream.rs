//! One node's control stream as seen by the replica that owns it: the
//! outbound half, the waiters for correlated replies, the registering/ready
//! phase, and the per-node epoch gate.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tonic::Status;
use uuid::Uuid;

use super::TransportError;
use crate::limits::MAX_ENTRIES;
use crate::proto::sb;
use crate::proto::sb::control_message::Payload;

/// Outbound messages to the node; an `Err` ends the stream with that status.
/// Boxed: a channel allocates its first 32 slots at once, and every node
/// holds one for its whole life (32 unboxed messages were 5 KiB a node).
pub type Outbound = mpsc::Sender<Result<Box<sb::ControlMessage>, Status>>;

/// A node's correlated reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    CommandAck(sb::ConfigurationCommandAck),
    Connections(Vec<sb::ConnectionEntry>),
    Routes(Vec<sb::RouteEntry>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Registering,
    Ready,
    Closed,
}

/// Bytes one multi-message list reply may gather (as encoded): far above
/// any real node's tables, far below what would hurt the replica.
pub const MAX_LIST_REPLY_BYTES: usize = 64 << 20;

const TOO_BIG: &str = "the node's list reply exceeds the entry or byte cap; dropped";

type ReplyTx = oneshot::Sender<Result<Reply, TransportError>>;

/// A waiter, with the list entries gathered so far for multi-message replies.
enum Waiter {
    Command(ReplyTx),
    Connections(Gathered<sb::ConnectionEntry>, ReplyTx),
    Routes(Gathered<sb::RouteEntry>, ReplyTx),
}

/// The parts of a list reply received so far, bounded in entries and bytes
/// so a node that never says `done`, or says too much, cannot grow it.
#[derive(Default)]
struct Gathered<T> {
    entries: Vec<T>,
    bytes: usize,
}

impl<T: prost::Message> Gathered<T> {
    fn add(&mut self, part: Vec<T>) -> Added {
        self.bytes += part.iter().map(prost::Message::encoded_len).sum::<usize>();
        let count = self.entries.len() + part.len();
        if count > MAX_ENTRIES || self.bytes > MAX_LIST_REPLY_BYTES {
            return Added::TooBig;
        }
        self.entries.extend(part);
        Added::Kept
    }
}

/// What adding one part of a list reply came to.
enum Added {
    Kept,
    WrongKind,
    TooBig,
}

/// Waiters by the `message_id` of their request. `None` once closed, so a
/// request racing the close cannot register a waiter nobody will fail.
type Pending = Option<HashMap<String, Waiter>>;

pub struct NodeStream {
    node: String,
    session: Uuid,
    generation: u64,
    out: Outbound,
    phase: watch::Sender<Phase>,
    pending: Mutex<Pending>,
    gate: Arc<Gate>,
}

/// The highest epoch of a command sent to a node, across its sessions on
/// this replica; held while sending, so commands leave in gate order.
pub type Gate = tokio::sync::Mutex<u64>;

impl NodeStream {
    /// A stream in the registering phase; `gate` is the node's (see
    /// [`super::Registry::gate`]).
    pub fn new(
        node: String,
        session: Uuid,
        generation: u64,
        out: Outbound,
        gate: Arc<Gate>,
    ) -> Self {
        Self {
            node,
            session,
            generation,
            out,
            phase: watch::Sender::new(Phase::Registering),
            pending: Mutex::new(Some(HashMap::new())),
            gate,
        }
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    pub fn session(&self) -> Uuid {
        self.session
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    fn pending(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The registration reply is on its way: requests may flow.
    pub fn set_ready(&self) {
        self.phase.send_if_modified(|p| {
            let change = *p == Phase::Registering;
            if change {
                *p = Phase::Ready;
            }
            change
        });
    }

    /// Ends the session on this replica: every waiter fails at once and no
    /// new request is accepted. Idempotent.
    pub fn close(&self) {
        self.phase.send_replace(Phase::Closed);
        // Dropping the senders wakes each waiter with an error.
        self.pending().take();
    }

    pub fn is_closed(&self) -> bool {
        *self.phase.borrow() == Phase::Closed
    }

    /// Resolves once the stream is closed by the control plane.
    pub async fn closed(&self) {
        let mut rx = self.phase.subscribe();
        let _ = rx.wait_for(|p| *p == Phase::Closed).await;
    }

    /// Sends a message to the node outside any correlation (registration
    /// and deregistration replies). Returns false if the stream is gone.
    pub async fn send(&self, msg: sb::ControlMessage) -> bool {
        self.out.send(Ok(Box::new(msg))).await.is_ok()
    }

    /// Sends a request and waits for its reply.
    pub async fn request(
        &self,
        payload: Payload,
        timeout: Duration,
    ) -> Result<Reply, TransportError> {
        tokio::time::timeout(timeout, async {
            self.wait_ready().await?;
            self.dispatch(payload).await?.outcome().await
        })
        .await
        .map_err(|_| TransportError::Timeout(timeout))?
    }

    /// Sends a command through the epoch gate and waits for its ack.
    /// `still_valid` is asked inside the gate, right before the command
    /// leaves: a sender whose leadership lapsed while it waited sends
    /// nothing.
    pub async fn command(
        &self,
        command: sb::ConfigurationCommand,
        epoch: u64,
        timeout: Duration,
        still_valid: &(dyn Fn() -> bool + Sync),
    ) -> Result<Reply, TransportError> {
        let result = tokio::time::timeout(timeout, async {
            self.wait_ready().await?;
            let waiting = {
                let mut highest = self.gate.lock().await;
                if epoch < *highest {
                    let highest = *highest;
                    return Err(TransportError::Fenced { epoch, highest });
                }
                if !still_valid() {
                    return Err(TransportError::NotLeader(epoch));
                }
                *highest = epoch;
                tracing::debug!(node = %self.node, epoch, "command sent");
                self.dispatch(Payload::ConfigCommand(command)).await?
            };
            waiting.outcome().await
        })
        .await;
        result.map_err(|_| TransportError::Timeout(timeout))?
    }

    async fn wait_ready(&self) -> Result<(), TransportError> {
        let mut rx = self.phase.subscribe();
        match rx.wait_for(|p| *p != Phase::Registering).await {
            Ok(p) if *p == Phase::Ready => Ok(()),
            _ => Err(TransportError::SessionEnded),
        }
    }

    /// Requests waiting for their reply at this moment.
    pub fn waiting(&self) -> usize {
        self.pending().as_ref().map_or(0, HashMap::len)
    }

    async fn dispatch(&self, payload: Payload) -> Result<Waiting<'_>, TransportError> {
        let id = Uuid::new_v4().to_string();
        let (tx, rx) = oneshot::channel();
        let waiter = match payload {
            Payload::ConnectionListRequest(_) => Waiter::Connections(Gathered::default(), tx),
            Payload::RouteListRequest(_) => Waiter::Routes(Gathered::default(), tx),
            _ => Waiter::Command(tx),
        };
        match self.pending().as_mut() {
            Some(map) => map.insert(id.clone(), waiter),
            None => return Err(TransportError::SessionEnded),
        };
        let msg = sb::ControlMessage {
            message_id: id.clone(),
            payload: Some(payload),
        };
        // From here the waiter leaves the map however the wait ends,
        // a timeout or a cancelled caller included.
        let waiting = Waiting {
            stream: self,
            id,
            rx,
        };
        if !self.send(msg).await {
            return Err(TransportError::SessionEnded);
        }
        Ok(waiting)
    }

    fn forget(&self, id: &str) {
        if let Some(map) = self.pending().as_mut() {
            map.remove(id);
        }
    }

    /// Hands a reply from the node to its waiter. Returns false when no
    /// waiter knows the id (the node acks things the control plane never
    /// asked, e.g. after applying its registration reply): the caller
    /// tolerates it.
    pub fn deliver(&self, payload: Payload) -> bool {
        let mut guard = self.pending();
        let Some(map) = guard.as_mut() else {
            return false;
        };
        match payload {
            Payload::ConfigCommandAck(ack) => match map.remove(&ack.original_message_id) {
                Some(Waiter::Command(tx)) => tx.send(Ok(Reply::CommandAck(ack))).is_ok(),
                Some(other) => fail(other, "a command ack answered a list request"),
                None => false,
            },
            Payload::Ack(ack) => match map.remove(&ack.original_message_id) {
                Some(waiter) => deliver_plain_ack(waiter, ack),
                None => false,
            },
            Payload::ConnectionListResponse(r) => {
                gather(map, r.original_message_id, r.done, |w| match w {
                    Waiter::Connections(acc, _) => acc.add(r.entries),
                    _ => Added::WrongKind,
                })
            }
            Payload::RouteListResponse(r) => {
                gather(map, r.original_message_id, r.done, |w| match w {
                    Waiter::Routes(acc, _) => acc.add(r.entries),
                    _ => Added::WrongKind,
                })
            }
            _ => false,
        }
    }
}

/// A plain `Ack`: a refusal fails the waiter with the node's messages; a
/// success answers a command with an empty per-item ack.
fn deliver_plain_ack(waiter: Waiter, ack: sb::Ack) -> bool {
    let text = ack.messages.join("; ");
    match waiter {
        Waiter::Command(tx) if ack.success => tx
            .send(Ok(Reply::CommandAck(sb::ConfigurationCommandAck {
                original_message_id: ack.original_message_id,
                ..Default::default()
            })))
            .is_ok(),
        other if !ack.success => fail(other, &text),
        other => fail(other, "a plain ack answered a list request"),
    }
}

fn fail(waiter: Waiter, why: &str) -> bool {
    let err = Err(TransportError::Refused(why.to_string()));
    match waiter {
        Waiter::Command(tx) | Waiter::Connections(_, tx) | Waiter::Routes(_, tx) => {
            tx.send(err).is_ok()
        }
    }
}

/// Adds one part of a multi-message list reply (`add` says whether the
/// waiter was of the matching kind); the part marked `done` completes the
/// waiter with everything gathered.
fn gather(
    map: &mut HashMap<String, Waiter>,
    id: String,
    done: bool,
    add: impl FnOnce(&mut Waiter) -> Added,
) -> bool {
    let Some(waiter) = map.get_mut(&id) else {
        return false;
    };
    let why = match add(waiter) {
        Added::Kept if !done => return true,
        Added::Kept => None,
        Added::WrongKind => Some("a list reply of the wrong kind"),
        Added::TooBig => Some(TOO_BIG),
    };
    if let Some(why) = why {
        return map.remove(&id).is_some_and(|w| fail(w, why));
    }
    match map.remove(&id) {
        Some(Waiter::Connections(acc, tx)) => tx.send(Ok(Reply::Connections(acc.entries))).is_ok(),
        Some(Waiter::Routes(acc, tx)) => tx.send(Ok(Reply::Routes(acc.entries))).is_ok(),
        Some(other) => fail(other, "a list reply of the wrong kind"),
        None => false,
    }
}

/// A request on the wire, waiting for its reply; dropping it, whether the
/// reply came or not, takes its waiter out of the stream's map.
struct Waiting<'a> {
    stream: &'a NodeStream,
    id: String,
    rx: oneshot::Receiver<Result<Reply, TransportError>>,
}

impl Waiting<'_> {
    async fn outcome(mut self) -> Result<Reply, TransportError> {
        (&mut self.rx)
            .await
            .unwrap_or(Err(TransportError::SessionEnded))
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.stream.forget(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready_stream() -> (
        Arc<NodeStream>,
        mpsc::Receiver<Result<Box<sb::ControlMessage>, Status>>,
    ) {
        let (out, rx) = mpsc::channel(8);
        let s = NodeStream::new("g/n".into(), Uuid::new_v4(), 1, out, Arc::default());
        s.set_ready();
        (Arc::new(s), rx)
    }

    fn routes_request() -> Payload {
        Payload::RouteListRequest(sb::RouteListRequest {})
    }

    #[tokio::test]
    async fn a_timed_out_request_leaves_no_waiter() {
        let (s, mut rx) = ready_stream();
        let wait = Duration::from_millis(20);
        let got = s.request(routes_request(), wait).await;
        assert_eq!(got, Err(TransportError::Timeout(wait)));
        assert!(rx.recv().await.is_some(), "the request went out");
        assert_eq!(s.waiting(), 0);
    }

    #[tokio::test]
    async fn a_cancelled_request_leaves_no_waiter() {
        let (s, mut rx) = ready_stream();
        let caller = {
            let s = s.clone();
            tokio::spawn(async move { s.request(routes_request(), Duration::from_secs(60)).await })
        };
        assert!(rx.recv().await.is_some(), "the request went out");
        assert_eq!(s.waiting(), 1);
        caller.abort();
        let _ = caller.await;
        assert_eq!(s.waiting(), 0);
    }

    #[tokio::test]
    async fn a_list_reply_past_the_cap_fails_its_waiter() {
        let (s, mut rx) = ready_stream();
        let caller = {
            let s = s.clone();
            tokio::spawn(async move { s.request(routes_request(), Duration::from_secs(60)).await })
        };
        let id = match rx.recv().await {
            Some(Ok(msg)) => msg.message_id,
            other => panic!("expected the request, got {other:?}"),
        };
        let part = |n: usize| {
            Payload::RouteListResponse(sb::RouteListResponse {
                original_message_id: id.clone(),
                entries: vec![sb::RouteEntry::default(); n],
                done: false,
            })
        };
        assert!(s.deliver(part(MAX_ENTRIES / 2)), "first part kept");
        s.deliver(part(MAX_ENTRIES / 2 + 1));
        match caller.await {
            Ok(Err(TransportError::Refused(why))) => assert!(why.contains("exceeds"), "{why}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert_eq!(s.waiting(), 0);
        assert!(!s.deliver(part(1)), "later parts find no waiter");
    }
}
