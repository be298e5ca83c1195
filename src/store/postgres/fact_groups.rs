//! The facts written with group commit (see [`super::group`]): the four
//! that every node sends in a burst, its registration, its readiness
//! right after the reply, the names its apps announce and its link claims
//! as its peers dial it.

use uuid::Uuid;

use super::group::{Group, WriteFuture};
use super::registrations::{Begin, begin_all};
use super::store_impl::write;
use super::templates::{Announced, record_announcements_all};
use super::tx::Tx;
use super::{nodes, notify};
use crate::store::model::{Name, Registration, ReplicaRef};
use crate::store::{SessionStart, StoreError};

/// `(node, session)`.
type Ready = (String, Uuid);
/// `(node, session, link ids)`.
type Received = (String, Uuid, Vec<String>);

/// The groups of one store; clones share them.
#[derive(Clone)]
pub(super) struct FactGroups {
    pub begin: Group<Begin, SessionStart>,
    pub ready: Group<Ready, bool>,
    pub received: Group<Received, ()>,
    pub announced: Group<Announced, ()>,
}

impl FactGroups {
    pub(super) fn spawn(tx: &Tx) -> Self {
        let (t0, t1, t2, t3) = (tx.clone(), tx.clone(), tx.clone(), tx.clone());
        Self {
            begin: Group::spawn(
                move |calls| begin_sessions(t0.clone(), calls),
                |(reg, _)| &reg.node_id,
            ),
            ready: Group::spawn(move |calls| mark_ready(t1.clone(), calls), |(n, _)| n),
            received: Group::spawn(
                move |calls| record_received(t2.clone(), calls),
                |(n, _, _)| n,
            ),
            announced: Group::spawn(
                move |calls| record_announcements(t3.clone(), calls),
                |(n, ..)| n,
            ),
        }
    }
}

fn begin_sessions(tx: Tx, calls: Vec<Begin>) -> WriteFuture<SessionStart> {
    Box::pin(async move {
        tx.run(write("begin_session"), &calls, |db, calls| {
            Box::pin(begin_all(db, calls))
        })
        .await
    })
}

fn mark_ready(tx: Tx, calls: Vec<Ready>) -> WriteFuture<bool> {
    Box::pin(async move {
        let marked = tx
            .run(write("mark_ready"), &calls, |db, calls| {
                Box::pin(async move {
                    let marked = nodes::mark_ready_all(db, calls).await?;
                    let woken: Vec<&str> = calls
                        .iter()
                        .zip(&marked)
                        .filter(|(_, m)| **m)
                        .map(|((n, _), _)| n.as_str())
                        .collect();
                    notify::nodes_changed(db, &woken).await?;
                    Ok(marked)
                })
            })
            .await?;
        Ok(marked.into_iter().map(Ok).collect())
    })
}

fn record_received(tx: Tx, calls: Vec<Received>) -> WriteFuture<()> {
    Box::pin(async move {
        tx.run(write("record_received"), &calls, |db, calls| {
            Box::pin(async move {
                let answers = nodes::record_received_all(db, calls).await?;
                notify::nodes_changed(db, &accepted(calls, &answers, |(n, ..)| n)).await?;
                Ok(answers)
            })
        })
        .await
    })
}

fn record_announcements(tx: Tx, calls: Vec<Announced>) -> WriteFuture<()> {
    Box::pin(async move {
        tx.run(write("record_announcements"), &calls, |db, calls| {
            Box::pin(async move {
                let answers = record_announcements_all(db, calls).await?;
                notify::nodes_changed(db, &accepted(calls, &answers, |(n, ..)| n)).await?;
                Ok(answers)
            })
        })
        .await
    })
}

/// The nodes of the calls whose answer is a success: they have news.
fn accepted<'c, Q>(
    calls: &'c [Q],
    answers: &[Result<(), StoreError>],
    node: fn(&Q) -> &String,
) -> Vec<&'c str> {
    calls
        .iter()
        .zip(answers)
        .filter(|(_, a)| a.is_ok())
        .map(|(c, _)| node(c).as_str())
        .collect()
}

impl FactGroups {
    /// One registration (not a late one), written with whatever else is
    /// waiting. Not an `async fn`: a layer of its own would hold another
    /// copy of the registration while it waits (see `tests/future_sizes.rs`).
    pub(super) fn begin_session(
        &self,
        registration: Registration,
        owner: ReplicaRef,
    ) -> impl Future<Output = Result<SessionStart, StoreError>> + Send + '_ {
        self.begin.call((registration, owner))
    }

    /// One node's readiness, written with whatever else is waiting.
    pub(super) async fn mark_ready(&self, node: &str, session: Uuid) -> Result<bool, StoreError> {
        self.ready.call((node.to_string(), session)).await
    }

    /// One node's announcement, written with whatever else is waiting.
    pub(super) async fn record_announcements(
        &self,
        node: &str,
        session: Uuid,
        set: &[Name],
        withdraw: &[Name],
    ) -> Result<(), StoreError> {
        let call = (node.to_string(), session, set.to_vec(), withdraw.to_vec());
        self.announced.call(call).await
    }

    /// One node's claims, written with whatever else is waiting.
    pub(super) async fn record_received(
        &self,
        node: &str,
        session: Uuid,
        links: &[String],
    ) -> Result<(), StoreError> {
        let call = (node.to_string(), session, links.to_vec());
        self.received.call(call).await
    }
}
