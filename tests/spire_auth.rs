//! SPIRE registration auth end to end: a replica started from the
//! `type: spire` configuration (a trust bundle file the test writes, with
//! keys it generates) admits a node whose JWT-SVID is valid for its group
//! and refuses, as the shared-secret path does (`success: false`, the
//! stream ended UNAUTHENTICATED, nothing recorded), every other token.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::{RawNode, mk_register, start_replica, stored_node_ids};
use slim_cp::auth::spire::agent::{BundleAgent, Bundles};
use slim_cp::auth::spire::mint::{JwtSigner, jwks};
use slim_cp::auth::spire::{SpireAuth, Timing};
use slim_cp::config::{RegistrationAuthConfig, SpireBundleSource};
use slim_cp::proto::sb;
use slim_cp::server::{Options, Running};
use tonic::Code;

/// A directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("slim-cp-spire-e2e-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A bundle file for trust domain `a` with `keys`.
struct BundleFile(TempDir);

impl BundleFile {
    fn new(keys: &[&JwtSigner]) -> Self {
        let file = BundleFile(TempDir::new());
        std::fs::write(file.path(), jwks(keys).to_string()).unwrap();
        file
    }

    fn path(&self) -> PathBuf {
        self.0.0.join("bundle.json")
    }
}

async fn mk_spire_replica(bundle: &BundleFile) -> Running {
    let cfg = RegistrationAuthConfig::Spire {
        bundles: SpireBundleSource::File {
            path: bundle.path().display().to_string(),
            trust_domain: Some("a".into()),
        },
        audience: "slim".into(),
    };
    let auth = slim_cp::auth::authenticator(Some(&cfg), None).expect("spire auth starts");
    start_replica(Options {
        auth,
        ..Options::loopback()
    })
    .await
}

fn svid(key: &JwtSigner, spiffe_id: &str) -> String {
    let now = u64::try_from(slim_cp::clock::unix_now()).unwrap();
    key.mint(spiffe_id, &["slim"], now + 300)
}

fn request(group: &str, node: &str, credentials: String) -> sb::RegisterNodeRequest {
    sb::RegisterNodeRequest {
        credentials,
        ..mk_register(group, node)
    }
}

#[tokio::test]
async fn a_valid_jwt_svid_registers_and_a_bad_one_is_refused() {
    let (trusted, impostor) = (JwtSigner::es256("k1"), JwtSigner::es256("k1"));
    let bundle = BundleFile::new(&[&trusted]);
    let cp = mk_spire_replica(&bundle).await;

    let mut good = RawNode::open(&cp).await.unwrap();
    let token = svid(&trusted, "spiffe://a/slim/n1");
    assert!(good.register(request("a", "n1", token)).await.success);

    let cases = [
        ("n2", svid(&impostor, "spiffe://a/slim/n2"), "signature"),
        ("n3", String::new(), "no credentials"),
        ("n4", "not-a-jwt".to_string(), "malformed"),
    ];
    for (node, token, reason) in cases {
        let mut bad = RawNode::open(&cp).await.unwrap();
        assert!(!bad.register(request("a", node, token)).await.success);
        bad.expect_end(Code::Unauthenticated, reason).await;
    }
    assert_eq!(stored_node_ids(&cp).await, vec!["a/n1".to_string()]);
}

#[tokio::test]
async fn a_jwt_svid_of_another_trust_domain_cannot_join_the_group() {
    let key = JwtSigner::es256("k1");
    let bundle = BundleFile::new(&[&key]);
    let cp = mk_spire_replica(&bundle).await;
    // Authentic for trust domain a, presented by a node claiming group b.
    let mut node = RawNode::open(&cp).await.unwrap();
    let token = svid(&key, "spiffe://a/slim/n1");
    assert!(!node.register(request("b", "n1", token)).await.success);
    node.expect_end(Code::Unauthenticated, "must equal the group")
        .await;
    assert!(stored_node_ids(&cp).await.is_empty());
}

/// The same through the SPIRE agent's Workload API socket, and a rotation
/// the agent streams: the removed key's tokens are refused from then on.
#[tokio::test]
async fn a_replica_following_the_spire_agent_admits_valid_svids_only() {
    let dir = TempDir::new();
    let socket = dir.0.join("agent.sock");
    let (old, new) = (JwtSigner::es256("old"), JwtSigner::es256("new"));
    let bundle = |key: &JwtSigner| Bundles::from([("a".into(), jwks(&[key]).to_string().into())]);
    let agent = BundleAgent::serve(&socket, bundle(&old)).unwrap();
    let source = SpireBundleSource::WorkloadApi {
        socket_path: socket.display().to_string(),
    };
    let auth = Arc::new(SpireAuth::start(&source, "slim", Timing::default()).unwrap());
    let arrived = |generation| {
        tokio::time::timeout(
            Duration::from_secs(10),
            auth.bundles().wait_for_generation(generation),
        )
    };
    arrived(1).await.expect("the agent's bundles arrive");
    let cp = start_replica(Options {
        auth: auth.clone(),
        ..Options::loopback()
    })
    .await;

    let mut first = RawNode::open(&cp).await.unwrap();
    let token = svid(&old, "spiffe://a/slim/n1");
    assert!(first.register(request("a", "n1", token)).await.success);

    agent.publish(bundle(&new));
    arrived(2).await.expect("the rotated bundle arrives");
    let mut second = RawNode::open(&cp).await.unwrap();
    let token = svid(&new, "spiffe://a/slim/n2");
    assert!(second.register(request("a", "n2", token)).await.success);
    let mut stale = RawNode::open(&cp).await.unwrap();
    let token = svid(&old, "spiffe://a/slim/n3");
    assert!(!stale.register(request("a", "n3", token)).await.success);
    stale.expect_end(Code::Unauthenticated, "no JWT key").await;
    assert_eq!(stored_node_ids(&cp).await, vec!["a/n1", "a/n2"]);
}
