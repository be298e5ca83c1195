//! A failpoint layer over any store, for drills and tests: while "down",
//! every call fails with [`StoreError::Unavailable`] as it would when the
//! database is unreachable, without touching the store underneath.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use async_trait::async_trait;
use uuid::Uuid;

use super::model::{
    DepartureKind, DesiredState, Domain, Link, LinkAnswer, Name, NodeRecord, Registration,
    ReplicaRef, Route, RouteMark, Segment, Template,
};
use super::{ChangeSet, SessionStart, Store, StoreError};

/// A store that can be made unreachable.
pub struct FaultyStore {
    inner: Arc<dyn Store>,
    down: AtomicBool,
    refused: AtomicU64,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            down: AtomicBool::new(false),
            refused: AtomicU64::new(0),
        }
    }

    /// Makes every call fail (`true`) or pass through again (`false`).
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// Calls refused while down.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::SeqCst)
    }

    fn check(&self) -> Result<(), StoreError> {
        if self.down.load(Ordering::SeqCst) {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::Unavailable("failpoint: store down".into()));
        }
        Ok(())
    }
}

/// Each method checks the failpoint, then delegates.
macro_rules! delegate {
    ($( fn $name:ident(&self $(, $arg:ident: $ty:ty)*) -> $ret:ty; )*) => {
        #[async_trait]
        impl Store for FaultyStore {
            $(
                async fn $name(&self $(, $arg: $ty)*) -> Result<$ret, StoreError> {
                    self.check()?;
                    self.inner.$name($($arg),*).await
                }
            )*
        }
    };
}

delegate! {
    fn begin_session(&self, registration: Registration, owner: ReplicaRef) -> SessionStart;
    fn mark_ready(&self, node: &str, session: Uuid) -> bool;
    fn end_session(&self, node: &str, session: Uuid, kind: DepartureKind) -> bool;
    fn record_announcements(&self, node: &str, session: Uuid, set: &[Name], withdraw: &[Name]) -> ();
    fn record_received(&self, node: &str, session: Uuid, link_ids: &[String]) -> ();
    fn now(&self) -> i64;
    fn now_millis(&self) -> i64;
    fn get_node(&self, node: &str) -> Option<NodeRecord>;
    fn list_nodes(&self) -> Vec<NodeRecord>;
    fn get_nodes(&self, ids: &[String]) -> Vec<NodeRecord>;
    fn forget_node(&self, node: &str, generation: u64) -> bool;
    fn list_templates(&self) -> Vec<Template>;
    fn templates_of(&self, nodes: &[String]) -> Vec<Template>;
    fn drop_templates_before(&self, node: &str, generation: u64) -> usize;
    fn put_link(&self, link: Link) -> ();
    fn delete_link(&self, link_id: &str) -> bool;
    fn list_links(&self) -> Vec<Link>;
    fn get_links(&self, ids: &[String]) -> Vec<Link>;
    fn put_route(&self, route: Route) -> ();
    fn delete_route(&self, id: &str) -> bool;
    fn list_routes(&self) -> Vec<Route>;
    fn desired_for_node(&self, node: &str) -> DesiredState;
    fn list_segments(&self) -> Vec<Segment>;
    fn add_segment(&self, name: &str) -> bool;
    fn remove_segment(&self, name: &str) -> bool;
    fn add_segment_edge(&self, segment: &str, a: &str, b: &str) -> bool;
    fn remove_segment_edge(&self, segment: &str, a: &str, b: &str) -> bool;
    fn list_domains(&self) -> Vec<Domain>;
    fn put_domain(&self, domain: Domain) -> bool;
    fn remove_domain(&self, name: &str) -> bool;
    fn apply_shared(&self, changes: Arc<ChangeSet>) -> ();
    fn links_touching(&self, node: &str) -> Vec<Link>;
    fn routes_sourced(&self, node: &str) -> Vec<Route>;
    fn mark_links_sent(&self, source: &str, answers: &[LinkAnswer]) -> usize;
    fn mark_routes(&self, marks: &[RouteMark]) -> usize;
    fn end_earlier_incarnations(&self, replica: &ReplicaRef) -> Vec<String>;
}
