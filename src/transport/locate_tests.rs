//! Where a clustered transport finds sessions: this replica's own streams
//! without a store lookup, every other node through [`Remote`].

use std::sync::Mutex;

use async_trait::async_trait;
use tokio::sync::mpsc;

use super::*;
use crate::store::model::ReplicaRef;

/// Knows one session on another replica (`far`) and records what it was
/// asked to locate.
#[derive(Default)]
struct Counting {
    asked: Mutex<Vec<Vec<String>>>,
}

impl Counting {
    fn asked(&self) -> Vec<Vec<String>> {
        self.asked.lock().unwrap().clone()
    }
}

#[async_trait]
impl Remote for Counting {
    async fn locate_all(&self, nodes: &[String]) -> Result<Vec<Location>, TransportError> {
        self.asked.lock().unwrap().push(nodes.to_vec());
        let far = nodes.iter().filter(|n| *n == "g/far").map(|n| Location {
            node: n.clone(),
            owner: ReplicaRef {
                id: "other".into(),
                incarnation: 1,
            },
            session: Uuid::nil(),
            local: false,
        });
        Ok(far.collect())
    }

    async fn forward(&self, _: &Location, _: Forwarded) -> Result<Reply, TransportError> {
        Err(TransportError::UnexpectedReply)
    }
}

/// A clustered transport holding streams of `g/here` (recorded),
/// `g/unrecorded` (answered while the store was away) and `g/closed`.
fn transport() -> (Transport, Arc<Counting>) {
    let registry = Arc::new(Registry::new());
    for (node, generation) in [("g/here", 7), ("g/unrecorded", 0), ("g/closed", 8)] {
        let (out, _) = mpsc::channel(1);
        let stream = NodeStream::new(node.into(), Uuid::new_v4(), generation, out, Arc::default());
        registry.insert(Arc::new(stream));
    }
    if let Some(s) = registry.get("g/closed") {
        s.close();
    }
    let remote = Arc::new(Counting::default());
    let t = Transport::clustered(registry, Duration::from_secs(1), remote.clone());
    (t, remote)
}

#[tokio::test]
async fn a_recorded_stream_of_this_replica_is_found_without_the_store() {
    let (t, remote) = transport();
    assert!(matches!(t.target("g/here").await, Ok(Target::Local(_))));
    assert!(remote.asked().is_empty(), "asked {:?}", remote.asked());
    assert!(matches!(t.target("g/far").await, Ok(Target::Remote(_))));
    assert_eq!(remote.asked(), [vec!["g/far".to_string()]]);
}

#[tokio::test]
async fn an_unrecorded_or_closed_stream_is_looked_up_in_the_store() {
    let (t, remote) = transport();
    for node in ["g/unrecorded", "g/closed"] {
        let found = t.target(node).await;
        assert!(
            matches!(found, Err(TransportError::NotConnected(_))),
            "{node}"
        );
    }
    let asked = ["g/unrecorded", "g/closed"].map(|n| vec![n.to_string()]);
    assert_eq!(remote.asked(), asked);
}

#[tokio::test]
async fn only_nodes_not_streamed_here_are_looked_up_for_connected() {
    let (t, remote) = transport();
    let nodes = ["g/here", "g/far", "g/gone"].map(String::from);
    let connected = t.connected(&nodes).await.unwrap();
    let expected: BTreeSet<String> = ["g/far", "g/here"].map(String::from).into();
    assert_eq!(connected, expected);
    assert_eq!(
        remote.asked(),
        [vec!["g/far".to_string(), "g/gone".to_string()]]
    );
    let here = t.connected(&["g/here".to_string()]).await.unwrap();
    assert_eq!(here.len(), 1);
    assert_eq!(
        remote.asked().len(),
        1,
        "nothing asked for a node streamed here"
    );
}
