//! Conformance for the southbound revision a node registered in: it is
//! kept with the record (what is sent to the node depends on it), the 3.x
//! listener fields are kept whole, and the latest registration decides.

use super::{mk_registration, owner};
use crate::store::Store;
use crate::store::model::{ConnectionDetail, NodeRecord, Registration, Revision};

fn mk_v3_registration(id: &str) -> Registration {
    Registration {
        revision: Revision::V3,
        connection_details: vec![ConnectionDetail {
            endpoint: "10.0.0.3:46357".into(),
            tls_required: true,
            auth_method: 1,
            spire_trust_domain: Some("edge.example".into()),
            ..Default::default()
        }],
        ..mk_registration(id)
    }
}

/// Registers `reg` and reads its record back.
async fn register(store: &dyn Store, reg: Registration) -> NodeRecord {
    let id = reg.node_id.clone();
    store.begin_session(reg, owner()).await.unwrap();
    store.get_node(&id).await.unwrap().expect("record")
}

pub async fn the_revision_and_3x_details_round_trip(store: &dyn Store) {
    let v3 = mk_v3_registration("a/n3");
    let rec = register(store, v3.clone()).await;
    assert_eq!(rec.revision, Revision::V3);
    assert_eq!(rec.connection_details, v3.connection_details);
    let rec = register(store, mk_registration("a/n2")).await;
    assert_eq!(rec.revision, Revision::V2, "the default");
}

pub async fn a_reregistration_replaces_the_revision(store: &dyn Store) {
    register(store, mk_v3_registration("a/n1")).await;
    let rec = register(store, mk_registration("a/n1")).await;
    assert_eq!(rec.revision, Revision::V2, "downgraded in place");
    assert!(!rec.connection_details.iter().any(|d| d.tls_required));
    store
        .begin_session(mk_v3_registration("a/n1"), owner())
        .await
        .unwrap();
    let listed = store.list_nodes().await.unwrap();
    let n1 = listed.iter().find(|n| n.id == "a/n1").expect("listed");
    assert_eq!(n1.revision, Revision::V3, "and upgraded again");
}
