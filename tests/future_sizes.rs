//! What a registration keeps while it waits for its group's commit: in a
//! burst every node of the fleet waits at once (heaptrack at 10,000 nodes
//! on Postgres found 22 MB of the peak in these futures when the late
//! path's transaction sized them: 2.4 KB each in a release build).

mod common;

use common::pg::fresh_pg_db;
use slim_cp::store::model::{Registration, ReplicaRef};
use slim_cp::store::{MemoryStore, Store};

/// Bytes of the future `begin_session` boxes (it does nothing unpolled).
fn registration_future_bytes(store: &dyn Store) -> usize {
    let registration = Registration {
        node_id: "g/n1".into(),
        group: Some("g".into()),
        ..Registration::default()
    };
    let owner = ReplicaRef {
        id: "r".into(),
        incarnation: 1,
    };
    let future = store.begin_session(registration, owner);
    std::mem::size_of_val(&*future)
}

/// Far below the 3.2 KB (debug build) of the future when a transaction's
/// sized it, with room for the registration itself (776 bytes on
/// Postgres, 208 on memory) and a compiler's change of layout.
const BOUND: usize = 1024;

#[tokio::test]
async fn a_waiting_registration_is_small_on_postgres() {
    let db = fresh_pg_db().await;
    let bytes = registration_future_bytes(db.store().as_ref());
    assert!(bytes < BOUND, "{bytes} bytes per waiting registration");
}

#[tokio::test]
async fn a_waiting_registration_is_small_on_memory() {
    let bytes = registration_future_bytes(&MemoryStore::new());
    assert!(bytes < BOUND, "{bytes} bytes per waiting registration");
}
