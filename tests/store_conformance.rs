//! The store contract, run against every backend.

mod memory {
    use std::sync::Arc;

    use slim_cp::store::MemoryStore;

    slim_cp::store_conformance_tests!(async { Arc::new(MemoryStore::new()) });
}
