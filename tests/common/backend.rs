//! Running one scenario on each store backend. A scenario written with
//! [`on_both_backends!`] runs twice, as `<name>::memory` and
//! `<name>::postgres` (a fresh database each); replicas it starts through
//! [`super::start_replica`] use the backend of the run.

use std::future::Future;
use std::sync::Arc;

use slim_cp::store::{MemoryStore, Store};

/// Where a scenario's replicas keep their state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Memory,
    Postgres,
}

tokio::task_local! {
    static BACKEND: Backend;
}

/// Runs `scenario` with `backend` as the backend of its replicas.
pub async fn scoped<F: Future<Output = ()>>(backend: Backend, scenario: F) {
    BACKEND.scope(backend, scenario).await;
}

/// The backend of the running scenario (memory outside any).
pub fn current() -> Backend {
    BACKEND.try_with(|b| *b).unwrap_or(Backend::Memory)
}

/// A fresh store of the current backend.
pub async fn fresh_store() -> Arc<dyn Store> {
    match current() {
        Backend::Memory => Arc::new(MemoryStore::new()),
        Backend::Postgres => super::pg::fresh_pg_store().await,
    }
}

/// Declares a scenario that runs once per backend.
#[macro_export]
macro_rules! on_both_backends {
    ($(#[$meta:meta])* async fn $name:ident() $body:block) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn scenario() $body

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn memory() {
                $crate::common::backend::scoped($crate::common::backend::Backend::Memory, scenario()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                $crate::common::backend::scoped($crate::common::backend::Backend::Postgres, scenario()).await;
            }
        }
    };
}
