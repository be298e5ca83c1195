//! Registration-auth domains through the SLIM 3.x operator API, over real
//! gRPC on both stores: add, list and remove; secrets never listed and
//! never stored in clear; a stored domain's secret admits its nodes; bad
//! calls get a code and a message that says what to fix.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{RawNode, mk_register, start_replica};
use slim_cp::auth::sealing::SealKey;
use slim_cp::auth::{Domains, mint_token};
use slim_cp::config::{AdjacencyEntry, RegistrationAuthConfig, SharedSecret, TopologyConfig};
use slim_cp::proto::nb::control_plane_service_client::ControlPlaneServiceClient;
use slim_cp::proto::{nb, sb};
use slim_cp::server::{Options, Running};
use tonic::Code;
use tonic::transport::Channel;

const CONFIGURED: &str = "configured-secret-0123456789abcdef";
const STORED: &str = "stored-secret-of-blue-0123456789abcdef";
const ROTATED: &str = "rotated-secret-of-blue-0123456789abcdef";

type Client = ControlPlaneServiceClient<Channel>;

/// Shared-secret auth with one configured group (`cfg`) and domains sealed
/// under `key`.
fn mk_auth_options(topology: TopologyConfig, key: SealKey) -> Options {
    let secrets = BTreeMap::from([("cfg".to_string(), SharedSecret::new(CONFIGURED).unwrap())]);
    let cfg = RegistrationAuthConfig::SharedSecret { secrets };
    let domains = slim_cp::auth::domains(Some(&cfg), Some(key));
    let auth = slim_cp::auth::authenticator(Some(&cfg), domains.clone()).unwrap();
    Options {
        topology,
        auth,
        domains,
        ..Options::loopback()
    }
}

async fn mk_auth_replica() -> Running {
    start_replica(mk_auth_options(TopologyConfig::Api, SealKey::random())).await
}

async fn mk_client(cp: &Running) -> Client {
    ControlPlaneServiceClient::connect(format!("http://{}", cp.northbound_addr))
        .await
        .expect("northbound reachable")
}

async fn add(client: &mut Client, name: &str, secret: &str) -> Result<(), tonic::Status> {
    let req = nb::AddDomainRequest {
        domain_name: name.into(),
        secret: secret.into(),
    };
    client.add_domain(req).await.map(|_| ())
}

async fn remove(client: &mut Client, name: &str) -> Result<(), tonic::Status> {
    let req = nb::RemoveDomainRequest {
        domain_name: name.into(),
    };
    client.remove_domain(req).await.map(|_| ())
}

async fn list(client: &mut Client) -> nb::ListDomainsResponse {
    client
        .list_domains(nb::ListDomainsRequest {})
        .await
        .expect("ListDomains answers")
        .into_inner()
}

/// Domain names with their nodes.
async fn listed(client: &mut Client) -> Vec<(String, Vec<String>)> {
    let resp = list(client).await;
    resp.domains
        .into_iter()
        .map(|d| (d.domain_name, d.nodes))
        .collect()
}

fn code<T>(r: Result<T, tonic::Status>) -> Code {
    r.err().map_or(Code::Ok, |s| s.code())
}

fn now() -> u64 {
    u64::try_from(slim_cp::clock::unix_now()).unwrap()
}

/// `group/node` registering with a token minted under `secret`.
async fn register(cp: &Running, group: &str, node: &str, secret: &str) -> (RawNode, bool) {
    let mut raw = RawNode::open(cp).await.expect("stream opens");
    let req = sb::RegisterNodeRequest {
        credentials: mint_token(group, node, secret, now()),
        ..mk_register(group, node)
    };
    let accepted = raw.register(req).await.success;
    (raw, accepted)
}

/// Reads (answering list requests) until the control plane ends the stream.
async fn until_closed(raw: &mut RawNode) {
    while let Ok(Some(msg)) = raw.recv().await {
        raw.answer(msg).await;
    }
}

on_both_backends! {
    /// Scenario: an operator adds `blue`; it lists beside the configured
    /// group with no secret anywhere in the reply; a blue node registers
    /// with a token under the stored secret and is listed under blue;
    /// removing blue closes its stream and its next registration is
    /// refused; removing it again is NOT_FOUND.
    async fn domains_are_added_listed_and_removed() {
        let cp = mk_auth_replica().await;
        let mut client = mk_client(&cp).await;
        assert_eq!(listed(&mut client).await, vec![("cfg".into(), vec![])]);
        add(&mut client, "blue", STORED).await.expect("AddDomain");
        let resp = list(&mut client).await;
        let wire = prost::Message::encode_to_vec(&resp);
        assert!(!wire.windows(STORED.len()).any(|w| w == STORED.as_bytes()));
        assert!(!format!("{resp:?}").contains(STORED));
        let (mut node, accepted) = register(&cp, "blue", "n1", STORED).await;
        assert!(accepted, "the stored secret admits blue's nodes");
        assert_eq!(
            listed(&mut client).await,
            vec![("blue".into(), vec!["blue/n1".into()]), ("cfg".into(), vec![])]
        );
        remove(&mut client, "blue").await.expect("RemoveDomain");
        until_closed(&mut node).await;
        let (_, accepted) = register(&cp, "blue", "n1", STORED).await;
        assert!(!accepted, "no secret for blue any more");
        assert_eq!(code(remove(&mut client, "blue").await), Code::NotFound);
        let err = remove(&mut client, "cfg").await.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition);
        assert!(err.message().contains("configuration file"), "{}", err.message());
    }
}

on_both_backends! {
    /// Scenario: adding an existing domain replaces its secret (the
    /// reference's upsert), and the store holds it sealed, not in clear.
    async fn adding_again_rotates_the_secret_which_is_sealed_at_rest() {
        let cp = mk_auth_replica().await;
        let mut client = mk_client(&cp).await;
        add(&mut client, "blue", STORED).await.unwrap();
        add(&mut client, "blue", ROTATED).await.expect("an upsert");
        let (_, accepted) = register(&cp, "blue", "n1", ROTATED).await;
        assert!(accepted, "the new secret admits");
        let (_, accepted) = register(&cp, "blue", "n2", STORED).await;
        assert!(!accepted, "the replaced one does not");
        let stored = cp.store.list_domains().await.unwrap();
        assert_eq!(stored.len(), 1);
        let sealed = &stored[0].sealed;
        assert!(!sealed.windows(ROTATED.len()).any(|w| w == ROTATED.as_bytes()));
        let (_, accepted) = register(&cp, "cfg", "n1", CONFIGURED).await;
        assert!(accepted, "configured secrets still admit");
    }
}

on_both_backends! {
    /// Scenario: another replica with the same key learns a domain from the
    /// store on its next reload; one with another key leaves it out.
    async fn replicas_with_the_same_key_share_stored_domains() {
        let key = [9u8; 32];
        let sealed_with = || SealKey::from_bytes(&key).unwrap();
        let cp = start_replica(mk_auth_options(TopologyConfig::Api, sealed_with())).await;
        let mut client = mk_client(&cp).await;
        add(&mut client, "blue", STORED).await.unwrap();
        let stored = cp.store.list_domains().await.unwrap();
        let peer = Domains::new(Default::default(), Some(sealed_with()));
        peer.reload(&stored);
        assert_eq!(peer.stored_names(), vec!["blue".to_string()]);
        let stranger = Domains::new(Default::default(), Some(SealKey::random()));
        stranger.reload(&stored);
        assert!(stranger.stored_names().is_empty());
    }
}

/// Every bad call names what is wrong, and never quotes the secret.
#[tokio::test]
async fn bad_domain_calls_are_refused_with_a_reason() {
    let cp = mk_auth_replica().await;
    let mut client = mk_client(&cp).await;
    let long_name = "d".repeat(slim_cp::limits::MAX_ID_BYTES + 1);
    let long_secret = "s".repeat(slim_cp::limits::MAX_SECRET_BYTES + 1);
    let cases = [
        ("", STORED, "domain_name"),
        ("a/b", STORED, "'/'"),
        ("a b", STORED, "whitespace"),
        (long_name.as_str(), STORED, "bytes long"),
        ("blue", "", "secret must not be empty"),
        ("blue", "too-short", "too short"),
        ("blue", long_secret.as_str(), "secret is 1025 bytes long"),
    ];
    for (name, secret, why) in cases {
        let err = add(&mut client, name, secret).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{name:?}: {err:?}");
        assert!(err.message().contains(why), "{name:?}: {}", err.message());
        assert!(secret.is_empty() || !err.message().contains(secret));
    }
    let err = remove(&mut client, "").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(cp.store.list_domains().await.unwrap().is_empty());
}

/// Without shared-secret auth there is nothing to add a secret to (the
/// reference answers UNIMPLEMENTED too), but listing still shows the
/// groups of registered nodes; in config mode the API changes nothing and
/// stored secrets admit nobody.
#[tokio::test]
async fn domains_need_shared_secret_auth_and_api_mode() {
    let cp = start_replica(Options::loopback()).await;
    let mut client = mk_client(&cp).await;
    let _node = RawNode::connect(&cp, "edge", "n1").await;
    let err = add(&mut client, "blue", STORED).await.unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    assert!(err.message().contains("shared_secret"), "{}", err.message());
    assert_eq!(code(remove(&mut client, "blue").await), Code::Unimplemented);
    assert_eq!(
        listed(&mut client).await,
        vec![("edge".into(), vec!["edge/n1".into()])]
    );
    let star = vec![AdjacencyEntry {
        group: "cloud".into(),
        neighbors: vec!["*".into()],
    }];
    let key = [3u8; 32];
    let config_mode = mk_auth_options(
        TopologyConfig::Links(star),
        SealKey::from_bytes(&key).unwrap(),
    );
    let cp = start_replica(config_mode).await;
    let mut client = mk_client(&cp).await;
    let err = add(&mut client, "blue", STORED).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert_eq!(listed(&mut client).await, vec![("cfg".into(), vec![])]);
    // One stored while the topology was managed through the API is listed
    // but, the file being the only source of secrets now, admits nobody.
    let sealer = Domains::new(Default::default(), Some(SealKey::from_bytes(&key).unwrap()));
    let stored = sealer
        .seal("blue", &SharedSecret::new(STORED).unwrap())
        .unwrap();
    cp.store.put_domain(stored).await.unwrap();
    tokio::time::sleep(slim_cp::auth::domains::RELOAD_PERIOD + Duration::from_millis(500)).await;
    let (_, accepted) = register(&cp, "blue", "n1", STORED).await;
    assert!(!accepted, "stored secrets admit nobody in config mode");
    assert_eq!(
        listed(&mut client).await,
        vec![("blue".into(), vec![]), ("cfg".into(), vec![])]
    );
}

/// On a store with no key to seal with, a secret is never stored in clear:
/// AddDomain says which setting is missing.
#[tokio::test]
async fn without_a_seal_key_no_domain_is_added() {
    let secrets = BTreeMap::new();
    let cfg = RegistrationAuthConfig::SharedSecret { secrets };
    let domains = slim_cp::auth::domains(Some(&cfg), None);
    let cp = start_replica(Options {
        auth: slim_cp::auth::authenticator(Some(&cfg), domains.clone()).unwrap(),
        domains,
        ..Options::loopback()
    })
    .await;
    let mut client = mk_client(&cp).await;
    let err = add(&mut client, "blue", STORED).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains(slim_cp::auth::sealing::KEY_ENV),
        "{}",
        err.message()
    );
}

/// Scenario: two replicas on one database with the same key; a domain
/// added through the first admits a node on the second once it reloads
/// (every `RELOAD_PERIOD`); removed through the first, the second closes
/// that node's stream and admits no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_added_on_one_replica_admits_nodes_on_another() {
    let store = common::pg::fresh_pg_store().await;
    let key = [5u8; 32];
    let mk = |id: &str| {
        let mut opts = mk_auth_options(TopologyConfig::Api, SealKey::from_bytes(&key).unwrap());
        opts.replica.id = id.into();
        opts
    };
    let a = slim_cp::server::start(mk("replica-a"), store.clone())
        .await
        .expect("replica a starts");
    let b = slim_cp::server::start(mk("replica-b"), store)
        .await
        .expect("replica b starts");
    add(&mut mk_client(&a).await, "blue", STORED).await.unwrap();
    let mut node = common::wait_for("replica b admits blue", || async {
        let (raw, accepted) = register(&b, "blue", "n1", STORED).await;
        accepted.then_some(raw).ok_or_else(|| "refused".to_string())
    })
    .await;
    remove(&mut mk_client(&a).await, "blue").await.unwrap();
    tokio::time::timeout(common::PATIENCE, until_closed(&mut node))
        .await
        .expect("replica b closes the stream of blue's node");
    common::wait_for("replica b refuses blue", || async {
        let (_, accepted) = register(&b, "blue", "n2", STORED).await;
        (!accepted)
            .then_some(())
            .ok_or_else(|| "still admitted".to_string())
    })
    .await;
}
