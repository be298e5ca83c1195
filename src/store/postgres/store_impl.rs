//! [`Store`] for [`PgStore`]: each method names its operation, picks how
//! it runs (read, fact or operator write, fenced derivation) and hands its
//! body to the transaction helper. The bodies live in the per-table modules.

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use uuid::Uuid;

use super::records::Record;
use super::tx::{Db, Mode, Op, TxError, query_one, relaxed};
use super::{PgStore, changes, domains, links, nodes, notify, routes, templates, topology};
use crate::store::model::{
    DepartureKind, DesiredState, Domain, Link, LinkAnswer, LinkState, Name, NodeRecord,
    Registration, ReplicaRef, Route, RouteMark, Segment, Session, Template,
};
use crate::store::{ChangeSet, SessionStart, Store, StoreError};
use crate::task::Owned;

impl PgStore {
    /// A leader's derivation: fenced when this store carries an epoch.
    pub(super) fn derive(&self, name: &'static str) -> Op {
        Op::new(name, Mode::Derive(self.fence))
    }

    /// A late registration (recorded after the store was away): its
    /// refusal takes back the row it may have created, so it is a
    /// transaction of its own rather than part of a group.
    async fn begin_late_session(
        &self,
        registration: Registration,
        owner: ReplicaRef,
    ) -> Result<SessionStart, StoreError> {
        let args = (registration, owner);
        self.tx
            .run(write("begin_late_session"), args, |db, (reg, owner)| {
                Box::pin(async move {
                    let started = nodes::begin_session(db, reg, owner).await?;
                    // As in a group's registrations (`replacing`).
                    notified(db, &reg.node_id, started.replaced.is_some()).await?;
                    Ok(started)
                })
            })
            .await
    }
}

pub(super) fn read(name: &'static str) -> Op {
    Op::new(name, Mode::Read)
}

/// A read of independent statements (see [`Mode::Statement`]).
pub(super) fn statement(name: &'static str) -> Op {
    Op::new(name, Mode::Statement)
}

/// A read of a whole table (see [`Op::bulk`]).
pub(super) fn bulk_read(name: &'static str) -> Op {
    Op {
        bulk: true,
        ..read(name)
    }
}

pub(super) fn write(name: &'static str) -> Op {
    Op::new(name, Mode::Write)
}

/// Wakes the leader for `node` if the fact changed it.
async fn notified(db: &Db<'_>, node: &str, changed: bool) -> Result<bool, TxError> {
    if changed {
        notify::node_changed(db, node).await?;
    }
    Ok(changed)
}

/// Wakes the leader for a full resync if the topology changed.
async fn topology_changed(db: &Db<'_>, changed: bool) -> Result<bool, TxError> {
    if changed {
        notify::resync(db).await?;
    }
    Ok(changed)
}

#[async_trait]
impl Store for PgStore {
    async fn begin_session(
        &self,
        registration: Registration,
        owner: ReplicaRef,
    ) -> Result<SessionStart, StoreError> {
        if registration.stale_after.is_none() {
            return self.facts.begin_session(registration, owner).await;
        }
        // Boxed: a transaction's future is about 2 KB, and inline it would
        // size every registration's future, the 10,000 of a burst waiting
        // for their group's commit included (22 MB of a 10,000-node peak).
        Box::pin(self.begin_late_session(registration, owner)).await
    }

    async fn mark_ready(&self, node: &str, session: Uuid) -> Result<bool, StoreError> {
        self.facts.mark_ready(node, session).await
    }

    async fn end_session(
        &self,
        node: &str,
        session: Uuid,
        kind: DepartureKind,
    ) -> Result<bool, StoreError> {
        self.tx
            .run(
                write("end_session"),
                (node, session, kind),
                |db, (n, s, k)| {
                    Box::pin(async move {
                        notified(db, n, nodes::end_session(db, n, *s, *k).await?).await
                    })
                },
            )
            .await
    }

    async fn record_announcements(
        &self,
        node: &str,
        session: Uuid,
        set: &[Name],
        withdraw: &[Name],
    ) -> Result<(), StoreError> {
        self.facts
            .record_announcements(node, session, set, withdraw)
            .await
    }

    async fn record_received(
        &self,
        node: &str,
        session: Uuid,
        link_ids: &[String],
    ) -> Result<(), StoreError> {
        self.facts.record_received(node, session, link_ids).await
    }

    async fn now(&self) -> Result<i64, StoreError> {
        // Floored like every stamp column is read, so a stamp written
        // before this call never reads as later than its result.
        const SQL: &str = "SELECT floor(extract(epoch FROM now()))::bigint";
        self.tx
            .run(statement("now"), (), |db, _| {
                Box::pin(async move { Ok(query_one(db, SQL, &[]).await?.try_get(0)?) })
            })
            .await
    }

    async fn now_millis(&self) -> Result<i64, StoreError> {
        // The transaction's start: earlier than the answer's arrival.
        const SQL: &str = "SELECT floor(extract(epoch FROM now()) * 1000)::bigint";
        self.tx
            .run(statement("now_millis"), (), |db, _| {
                Box::pin(async move { Ok(query_one(db, SQL, &[]).await?.try_get(0)?) })
            })
            .await
    }

    async fn get_node(&self, node: &str) -> Result<Option<NodeRecord>, StoreError> {
        self.tx
            .run(statement("get_node"), node, |db, n| {
                Box::pin(nodes::get(db, n))
            })
            .await
    }

    async fn list_nodes(&self) -> Result<Vec<NodeRecord>, StoreError> {
        self.tx
            .run(bulk_read("list_nodes"), (), |db, _| {
                Box::pin(nodes::list(db))
            })
            .await
    }

    async fn get_nodes(&self, ids: &[String]) -> Result<Vec<NodeRecord>, StoreError> {
        self.tx
            .run(statement("get_nodes"), ids, |db, ids| {
                Box::pin(nodes::get_many(db, ids))
            })
            .await
    }

    async fn sessions_of(&self, ids: &[String]) -> Result<Vec<(String, Session)>, StoreError> {
        self.tx
            .run(statement("sessions_of"), ids, |db, ids| {
                Box::pin(nodes::sessions_of(db, ids))
            })
            .await
    }

    async fn forget_node(&self, node: &str, generation: u64) -> Result<bool, StoreError> {
        self.tx
            .run(
                self.derive("forget_node"),
                (node, generation),
                |db, (n, g)| Box::pin(nodes::forget(db, n, *g)),
            )
            .await
    }

    async fn list_templates(&self) -> Result<Vec<Template>, StoreError> {
        self.tx
            .run(bulk_read("list_templates"), (), |db, _| {
                Box::pin(templates::list(db))
            })
            .await
    }

    async fn templates_of(&self, nodes: &[String]) -> Result<Vec<Template>, StoreError> {
        self.tx
            .run(statement("templates_of"), nodes, |db, n| {
                Box::pin(templates::of_nodes(db, n))
            })
            .await
    }

    async fn drop_templates_before(
        &self,
        node: &str,
        generation: u64,
    ) -> Result<usize, StoreError> {
        let op = self.derive("drop_templates_before");
        self.tx
            .run(op, (node, generation), |db, (n, g)| {
                Box::pin(templates::drop_before(db, n, *g))
            })
            .await
    }

    async fn put_link(&self, link: Link) -> Result<(), StoreError> {
        self.tx
            .run(self.derive("put_link"), link, |db, l| {
                Box::pin(async move { links::put(db, &[l], &BTreeSet::new()).await })
            })
            .await
    }

    async fn delete_link(&self, link_id: &str) -> Result<bool, StoreError> {
        let ids = [link_id.to_string()];
        self.tx
            .run(self.derive("delete_link"), ids, |db, ids| {
                Box::pin(async move { Ok(links::delete(db, ids).await? > 0) })
            })
            .await
    }

    async fn list_links(&self) -> Result<Vec<Link>, StoreError> {
        self.tx
            .run(bulk_read("list_links"), (), |db, _| {
                Box::pin(links::list(db))
            })
            .await
    }

    async fn get_links(&self, ids: &[String]) -> Result<Vec<Link>, StoreError> {
        self.tx
            .run(statement("get_links"), ids, |db, ids| {
                Box::pin(links::get_many(db, ids))
            })
            .await
    }

    async fn link_states(&self, ids: &[String]) -> Result<Vec<LinkState>, StoreError> {
        self.tx
            .run(statement("link_states"), ids, |db, ids| {
                Box::pin(links::states(db, ids))
            })
            .await
    }

    async fn put_route(&self, route: Route) -> Result<(), StoreError> {
        self.tx
            .run(self.derive("put_route"), route, |db, r| {
                Box::pin(async move { routes::put(db, &[r], &BTreeSet::new()).await })
            })
            .await
    }

    async fn delete_route(&self, id: &str) -> Result<bool, StoreError> {
        let ids = [id.to_string()];
        self.tx
            .run(self.derive("delete_route"), ids, |db, ids| {
                Box::pin(async move { Ok(routes::delete(db, ids).await? > 0) })
            })
            .await
    }

    async fn list_routes(&self) -> Result<Vec<Route>, StoreError> {
        self.tx
            .run(bulk_read("list_routes"), (), |db, _| {
                Box::pin(routes::list(db))
            })
            .await
    }

    async fn desired_for_node(&self, node: &str) -> Result<DesiredState, StoreError> {
        self.tx
            .run(read("desired_for_node"), node, |db, n| {
                Box::pin(async move {
                    let mut desired = nodes::desired(db, &[n]).await?;
                    Ok(desired.remove(*n).unwrap_or_default())
                })
            })
            .await
    }

    async fn list_segments(&self) -> Result<Vec<Segment>, StoreError> {
        self.tx
            .run(read("list_segments"), (), |db, _| {
                Box::pin(topology::list(db))
            })
            .await
    }

    async fn add_segment(&self, name: &str) -> Result<bool, StoreError> {
        self.tx
            .run(write("add_segment"), name, |db, n| {
                Box::pin(async move { topology_changed(db, topology::add(db, n).await?).await })
            })
            .await
    }

    async fn remove_segment(&self, name: &str) -> Result<bool, StoreError> {
        self.tx
            .run(write("remove_segment"), name, |db, n| {
                Box::pin(async move { topology_changed(db, topology::remove(db, n).await?).await })
            })
            .await
    }

    async fn add_segment_edge(&self, segment: &str, a: &str, b: &str) -> Result<bool, StoreError> {
        self.tx
            .run(
                write("add_segment_edge"),
                (segment, a, b),
                |db, (s, a, b)| {
                    Box::pin(async move {
                        topology_changed(db, topology::add_edge(db, s, a, b).await?).await
                    })
                },
            )
            .await
    }

    async fn remove_segment_edge(
        &self,
        segment: &str,
        a: &str,
        b: &str,
    ) -> Result<bool, StoreError> {
        let args = (segment, a, b);
        self.tx
            .run(write("remove_segment_edge"), args, |db, (s, a, b)| {
                Box::pin(async move {
                    topology_changed(db, topology::remove_edge(db, s, a, b).await?).await
                })
            })
            .await
    }

    async fn list_domains(&self) -> Result<Vec<Domain>, StoreError> {
        self.tx
            .run(read("list_domains"), (), |db, _| {
                Box::pin(domains::list(db))
            })
            .await
    }

    async fn put_domain(&self, domain: Domain) -> Result<bool, StoreError> {
        self.tx
            .run(write("put_domain"), domain, |db, d| {
                Box::pin(domains::put(db, d))
            })
            .await
    }

    async fn remove_domain(&self, name: &str) -> Result<bool, StoreError> {
        self.tx
            .run(write("remove_domain"), name, |db, n| {
                Box::pin(domains::remove(db, n))
            })
            .await
    }

    async fn apply_shared(&self, changes: Arc<ChangeSet>) -> Result<(), StoreError> {
        if changes.is_empty() {
            return Ok(());
        }
        // Never bulk, however large: its statements are of bounded size
        // (see `WRITE_CHUNK`). On a task of its own, so that each statement
        // goes out as the one before it is answered, whatever the caller
        // does meanwhile.
        let (tx, op) = (self.tx.clone(), self.derive("apply"));
        let write = Owned::spawn(async move {
            tx.run(op, changes, |db, c| Box::pin(changes::apply(db, c)))
                .await
        });
        write
            .await
            .map_err(|e| StoreError::Unavailable(format!("the write's task ended: {e}")))?
    }

    async fn links_touching(&self, node: &str) -> Result<Vec<Link>, StoreError> {
        self.tx
            .run(statement("links_touching"), node, |db, n| {
                Box::pin(links::touching(db, n))
            })
            .await
    }

    async fn routes_sourced(&self, node: &str) -> Result<Vec<Route>, StoreError> {
        self.tx
            .run(statement("routes_sourced"), node, |db, n| {
                Box::pin(routes::sourced(db, n))
            })
            .await
    }

    async fn reconcile_view(&self, node: &str) -> Result<(Vec<Link>, Vec<Route>), StoreError> {
        // Both statements on one connection, pipelined: a reconcile's reads
        // cost one checkout and one wait, not two.
        self.tx
            .run(statement("reconcile_view"), node, |db, n| {
                Box::pin(
                    async move { tokio::try_join!(links::touching(db, n), routes::sourced(db, n)) },
                )
            })
            .await
    }

    async fn mark_links_sent(
        &self,
        source: &str,
        answers: &[LinkAnswer],
    ) -> Result<usize, StoreError> {
        if answers.is_empty() {
            return Ok(0);
        }
        self.tx
            .run(
                self.derive("mark_links_sent"),
                [(source, answers)],
                |db, answered| Box::pin(relaxed(db, links::mark_sent(db, answered))),
            )
            .await
    }

    async fn record_acknowledgement(
        &self,
        source: &str,
        answers: &[LinkAnswer],
        marks: &[RouteMark],
        forgotten: &[String],
    ) -> Result<(), StoreError> {
        if answers.is_empty() && marks.is_empty() && forgotten.is_empty() {
            return Ok(());
        }
        let record = Record {
            fence: self.fence,
            source: source.to_string(),
            answers: answers.to_vec(),
            marks: marks.to_vec(),
            forgotten: forgotten.to_vec(),
        };
        self.records.call(record).await
    }

    async fn mark_routes(&self, marks: &[RouteMark]) -> Result<usize, StoreError> {
        if marks.is_empty() {
            return Ok(0);
        }
        self.tx
            .run(self.derive("mark_routes"), marks, |db, m| {
                Box::pin(relaxed(db, routes::mark(db, *m)))
            })
            .await
    }

    async fn end_earlier_incarnations(
        &self,
        replica: &ReplicaRef,
    ) -> Result<Vec<String>, StoreError> {
        let incarnation = i64::try_from(replica.incarnation).unwrap_or(i64::MAX);
        let args = (replica.id.as_str(), incarnation);
        self.tx
            .run(write("end_earlier_incarnations"), args, |db, (o, i)| {
                Box::pin(async move {
                    let ended = nodes::end_earlier_incarnations(db, o, *i).await?;
                    if !ended.is_empty() {
                        notify::resync(db).await?;
                    }
                    Ok(ended)
                })
            })
            .await
    }
}
