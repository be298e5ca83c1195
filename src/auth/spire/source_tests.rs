//! The bundle sources, end to end: a real Workload API server
//! ([`BundleAgent`]: tonic, on a unix socket in a directory the test owns)
//! standing in for the SPIRE agent, and a bundle file the test rewrites. Tests wait on the bundle
//! generation, never on a sleep.

use std::path::PathBuf;
use std::time::Duration;

use super::agent::{BundleAgent, Bundles};
use super::mint::{JwtSigner, jwks};
use super::{Backoff, Refusal, SpireAuth, Timing};
use crate::config::SpireBundleSource;

const AUD: &str = "slim";
/// Bounds every wait: a hang fails the test instead of stalling the run.
const PATIENCE: Duration = Duration::from_secs(10);

/// A directory removed with the test.
struct TempDir(PathBuf);

impl TempDir {
    fn new(test: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("slim-cp-spire-{test}-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn fast() -> Timing {
    Timing {
        file_poll: Duration::from_millis(20),
        backoff: Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(200),
        },
    }
}

fn now() -> u64 {
    u64::try_from(crate::clock::unix_now()).unwrap()
}

fn svid(key: &JwtSigner, td: &str) -> String {
    key.mint(&format!("spiffe://{td}/node"), &[AUD], now() + 300)
}

fn jwks_bytes(keys: &[&JwtSigner]) -> Vec<u8> {
    jwks(keys).to_string().into_bytes()
}

async fn wait_generation(auth: &SpireAuth, generation: u64) {
    tokio::time::timeout(PATIENCE, auth.bundles().wait_for_generation(generation))
        .await
        .unwrap_or_else(|_| panic!("bundle generation {generation} never came: {auth:?}"));
}

#[tokio::test]
async fn workload_api_bundles_admit_tokens_and_follow_rotation() {
    let dir = TempDir::new("rotation");
    let socket = dir.0.join("agent.sock");
    let (old, new) = (JwtSigner::es256("old"), JwtSigner::es384("new"));
    let agent = BundleAgent::serve(
        &socket,
        Bundles::from([
            ("spiffe://a".to_string(), jwks_bytes(&[&old])),
            ("b".to_string(), jwks_bytes(&[&new])),
        ]),
    )
    .unwrap();
    let source = SpireBundleSource::WorkloadApi {
        socket_path: format!("unix://{}", socket.display()),
    };
    let auth = SpireAuth::start(&source, AUD, fast()).unwrap();
    wait_generation(&auth, 1).await;
    assert!(auth.check(Some("a"), &svid(&old, "a"), now()).is_ok());
    assert!(auth.check(Some("b"), &svid(&new, "b"), now()).is_ok());

    // Rotation: the new key is published for a and the old one removed.
    agent.publish(Bundles::from([("a".to_string(), jwks_bytes(&[&new]))]));
    wait_generation(&auth, 2).await;
    assert!(auth.check(Some("a"), &svid(&new, "a"), now()).is_ok());
    let err = auth.check(Some("a"), &svid(&old, "a"), now()).unwrap_err();
    assert!(matches!(err, Refusal::UnknownKeyId { .. }), "{err}");
    // And b, gone from the agent's answer, is no longer trusted.
    let err = auth.check(Some("b"), &svid(&new, "b"), now()).unwrap_err();
    assert_eq!(err, Refusal::UnknownTrustDomain("b".into()));
}

#[tokio::test]
async fn workload_api_is_dialled_again_until_the_agent_comes_up() {
    let dir = TempDir::new("redial");
    let socket = dir.0.join("agent.sock");
    let key = JwtSigner::es256("k");
    let source = SpireBundleSource::WorkloadApi {
        socket_path: socket.display().to_string(),
    };
    let auth = SpireAuth::start(&source, AUD, fast()).unwrap();
    // No agent yet: nothing is trusted.
    let err = auth.check(Some("a"), &svid(&key, "a"), now()).unwrap_err();
    assert_eq!(err, Refusal::UnknownTrustDomain("a".into()));
    let bundles = Bundles::from([("a".to_string(), jwks_bytes(&[&key]))]);
    let _agent = BundleAgent::serve(&socket, bundles).unwrap();
    wait_generation(&auth, 1).await;
    assert!(auth.check(Some("a"), &svid(&key, "a"), now()).is_ok());
}

#[tokio::test]
async fn bundle_file_is_reloaded_when_it_changes_and_a_broken_one_is_ignored() {
    let dir = TempDir::new("file");
    let path = dir.0.join("bundle.json");
    let (k1, k2, k3) = (
        JwtSigner::es256("k1"),
        JwtSigner::es256("k2"),
        JwtSigner::es256("k3"),
    );
    std::fs::write(&path, jwks_bytes(&[&k1])).unwrap();
    let source = SpireBundleSource::File {
        path: path.display().to_string(),
        trust_domain: Some("a".into()),
    };
    let auth = SpireAuth::start(&source, AUD, fast()).unwrap();
    assert_eq!(auth.bundles().current().generation, 1, "loaded at start");
    assert!(auth.check(Some("a"), &svid(&k1, "a"), now()).is_ok());

    std::fs::write(&path, jwks_bytes(&[&k2])).unwrap();
    wait_generation(&auth, 2).await;
    assert!(auth.check(Some("a"), &svid(&k2, "a"), now()).is_ok());
    assert!(auth.check(Some("a"), &svid(&k1, "a"), now()).is_err());

    // A broken rewrite publishes nothing: the next good one is generation
    // 3, and until then k2 stays trusted.
    std::fs::write(&path, b"{ not json").unwrap();
    assert!(auth.check(Some("a"), &svid(&k2, "a"), now()).is_ok());
    std::fs::write(&path, jwks_bytes(&[&k3])).unwrap();
    wait_generation(&auth, 3).await;
    assert_eq!(auth.bundles().current().generation, 3);
    assert!(auth.check(Some("a"), &svid(&k3, "a"), now()).is_ok());
}

#[tokio::test]
async fn bundle_file_may_map_trust_domains_to_their_jwks() {
    let dir = TempDir::new("map");
    let path = dir.0.join("bundles.json");
    let (ka, kb) = (JwtSigner::es256("ka"), JwtSigner::es256("kb"));
    let doc = serde_json::json!({"a": jwks(&[&ka]), "spiffe://b": jwks(&[&kb])});
    std::fs::write(&path, doc.to_string()).unwrap();
    let source = SpireBundleSource::File {
        path: path.display().to_string(),
        trust_domain: None,
    };
    let auth = SpireAuth::start(&source, AUD, fast()).unwrap();
    assert!(auth.check(Some("a"), &svid(&ka, "a"), now()).is_ok());
    assert!(auth.check(Some("b"), &svid(&kb, "b"), now()).is_ok());
    // A single bundle needs its trust domain named, and the start says so.
    std::fs::write(&path, jwks_bytes(&[&ka])).unwrap();
    let err = SpireAuth::start(&source, AUD, fast()).unwrap_err();
    assert!(err.to_string().contains("trust_domain"), "{err}");
}
