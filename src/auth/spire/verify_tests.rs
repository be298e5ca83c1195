//! The JWT-SVID check against bundles the tests build from keys they
//! generate; one refusal reason per test.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::rand::SystemRandom;
use ring::signature::{
    RSA_PKCS1_SHA256, RSA_PKCS1_SHA384, RSA_PKCS1_SHA512, RSA_PSS_SHA256, RSA_PSS_SHA384,
    RSA_PSS_SHA512, RsaEncoding, RsaKeyPair,
};
use serde_json::json;

use super::jwks::{TrustBundle, parse_jwks};
use super::mint::{JwtSigner, jwks};
use super::{BundleStore, Refusal, SpireAuth};
use crate::auth::CLOCK_SKEW_SECS;

const NOW: u64 = 1_800_000_000;
const AUD: &str = "slim";

fn bundle_of(signers: &[&JwtSigner]) -> TrustBundle {
    parse_jwks(jwks(signers).to_string().as_bytes()).unwrap()
}

/// An authenticator trusting `domains` (trust domain, its authorities).
fn mk_auth(domains: &[(&str, &[&JwtSigner])]) -> SpireAuth {
    mk_auth_with(
        domains
            .iter()
            .map(|(td, signers)| (td.to_string(), bundle_of(signers)))
            .collect(),
    )
}

fn mk_auth_with(bundles: BTreeMap<String, TrustBundle>) -> SpireAuth {
    let store = Arc::new(BundleStore::new());
    store.publish(bundles);
    SpireAuth::new(store, AUD)
}

fn b64(v: serde_json::Value) -> String {
    URL_SAFE_NO_PAD.encode(v.to_string())
}

fn svid(signer: &JwtSigner, td: &str) -> String {
    signer.mint(&format!("spiffe://{td}/slim/node-1"), &[AUD], NOW + 300)
}

#[test]
fn a_valid_token_is_accepted_and_names_the_node() {
    let (k256, k384) = (JwtSigner::es256("k1"), JwtSigner::es384("k2"));
    let auth = mk_auth(&[("a", &[&k256, &k384])]);
    let id = auth.check(Some("a"), &svid(&k256, "a"), NOW).unwrap();
    assert_eq!(id.to_string(), "spiffe://a/slim/node-1");
    assert!(auth.check(Some("a"), &svid(&k384, "a"), NOW).is_ok());
    // Upstream nodes add their MLS key as a `slim-claims:` audience.
    let token = k256.mint("spiffe://a/n", &["slim-claims:e30=", AUD], NOW + 1);
    assert!(auth.check(Some("a"), &token, NOW).is_ok());
    // `aud` may be a single string.
    let token = k256.sign(&json!({"sub": "spiffe://a/n", "aud": AUD, "exp": NOW + 1}));
    assert!(auth.check(Some("a"), &token, NOW).is_ok());
}

#[test]
fn an_expired_token_is_refused_beyond_the_skew() {
    let key = JwtSigner::es256("k1");
    let auth = mk_auth(&[("a", &[&key])]);
    let just = key.mint("spiffe://a/n", &[AUD], NOW - CLOCK_SKEW_SECS);
    assert!(auth.check(Some("a"), &just, NOW).is_ok());
    let late = key.mint("spiffe://a/n", &[AUD], NOW - 60);
    assert_eq!(auth.check(Some("a"), &late, NOW), Err(Refusal::Expired(60)));
    assert!(Refusal::Expired(60).to_string().contains("expired"));
}

#[test]
fn a_token_not_yet_valid_is_refused() {
    let key = JwtSigner::es256("k1");
    let auth = mk_auth(&[("a", &[&key])]);
    let claims = json!({"sub": "spiffe://a/n", "aud": [AUD], "exp": NOW + 900, "nbf": NOW + 600});
    let err = auth.check(Some("a"), &key.sign(&claims), NOW).unwrap_err();
    assert_eq!(err, Refusal::NotYetValid(600));
}

#[test]
fn a_token_for_another_audience_is_refused() {
    let key = JwtSigner::es256("k1");
    let auth = mk_auth(&[("a", &[&key])]);
    let token = key.mint("spiffe://a/n", &["vault"], NOW + 60);
    let err = auth.check(Some("a"), &token, NOW).unwrap_err();
    assert_eq!(
        err,
        Refusal::WrongAudience {
            expected: AUD.into(),
            got: vec!["vault".into()]
        }
    );
    assert!(err.to_string().contains("audience"), "{err}");
    let none = key.sign(&json!({"sub": "spiffe://a/n", "exp": NOW + 60}));
    assert!(matches!(
        auth.check(Some("a"), &none, NOW),
        Err(Refusal::WrongAudience { .. })
    ));
}

#[test]
fn a_token_signed_by_another_key_under_a_known_kid_is_refused() {
    let (trusted, impostor) = (JwtSigner::es256("k1"), JwtSigner::es256("k1"));
    let auth = mk_auth(&[("a", &[&trusted])]);
    let err = auth
        .check(Some("a"), &svid(&impostor, "a"), NOW)
        .unwrap_err();
    assert!(matches!(err, Refusal::BadSignature { .. }), "{err}");
    assert!(err.to_string().contains("signature"), "{err}");
}

#[test]
fn altered_claims_break_the_signature() {
    let key = JwtSigner::es256("k1");
    let auth = mk_auth(&[("a", &[&key]), ("b", &[&key])]);
    let token = svid(&key, "a");
    let mut parts: Vec<&str> = token.split('.').collect();
    let forged = b64(json!({"sub": "spiffe://b/n", "aud": [AUD], "exp": NOW + 300}));
    parts[1] = &forged;
    let err = auth.check(Some("b"), &parts.join("."), NOW).unwrap_err();
    assert!(matches!(err, Refusal::BadSignature { .. }), "{err}");
}

#[test]
fn an_unknown_key_id_is_refused() {
    let (known, unknown) = (JwtSigner::es256("k1"), JwtSigner::es256("k9"));
    let auth = mk_auth(&[("a", &[&known])]);
    let err = auth
        .check(Some("a"), &svid(&unknown, "a"), NOW)
        .unwrap_err();
    assert_eq!(
        err,
        Refusal::UnknownKeyId {
            trust_domain: "a".into(),
            kid: "k9".into()
        }
    );
}

#[test]
fn a_token_of_another_group_or_trust_domain_is_refused() {
    let (ka, kb) = (JwtSigner::es256("ka"), JwtSigner::es256("kb"));
    let auth = mk_auth(&[("a", &[&ka]), ("b", &[&kb])]);
    // Authentic, but from trust domain b while the node claims group a.
    let err = auth.check(Some("a"), &svid(&kb, "b"), NOW).unwrap_err();
    assert!(
        matches!(&err, Refusal::GroupMismatch { group, trust_domain, .. }
            if group == "a" && trust_domain == "b"),
        "{err}"
    );
    assert!(err.to_string().contains("must equal the group"), "{err}");
    // A trust domain slim-cp holds no bundle for.
    let err = auth.check(Some("c"), &svid(&ka, "c"), NOW).unwrap_err();
    assert_eq!(err, Refusal::UnknownTrustDomain("c".into()));
    // Group a's key cannot vouch for trust domain b.
    let err = auth.check(Some("b"), &ka.mint("spiffe://b/n", &[AUD], NOW + 9), NOW);
    assert!(matches!(err, Err(Refusal::UnknownKeyId { .. })), "{err:?}");
}

#[test]
fn no_group_or_no_token_is_refused() {
    let key = JwtSigner::es256("k1");
    let auth = mk_auth(&[("a", &[&key])]);
    assert_eq!(
        auth.check(None, &svid(&key, "a"), NOW),
        Err(Refusal::NoGroup)
    );
    assert_eq!(auth.check(Some(""), "x", NOW), Err(Refusal::NoGroup));
    assert_eq!(
        auth.check(Some("a"), "", NOW),
        Err(Refusal::NoCredentials("a".into()))
    );
}

#[test]
fn malformed_tokens_are_refused_as_such() {
    let key = JwtSigner::es256("k1");
    let auth = mk_auth(&[("a", &[&key])]);
    let claims = b64(json!({"sub": "spiffe://a/n", "aud": [AUD], "exp": NOW + 60}));
    let cases = [
        "not a jwt".to_string(),
        "a.b".to_string(),
        "a.b.c.d.e".to_string(),
        format!("{}.{claims}.!!", b64(json!({"alg": "ES256", "kid": "k1"}))),
        format!("{}.{claims}.", b64(json!({"alg": "ES256"}))),
        format!(
            "{}.{claims}.",
            b64(json!({"alg": "ES256", "kid": "k1", "typ": "JWE"}))
        ),
        key.sign(&json!({"aud": [AUD], "exp": NOW + 60})),
        key.sign(&json!({"sub": "https://a/n", "aud": [AUD], "exp": NOW + 60})),
        key.sign(&json!({"sub": "spiffe://a/n", "aud": [AUD]})),
        key.sign(&json!({"sub": "spiffe://a/n", "aud": [AUD], "exp": "soon"})),
        "x".repeat(super::jwt::MAX_TOKEN_LEN + 1),
    ];
    for token in cases {
        let err = auth.check(Some("a"), &token, NOW).unwrap_err();
        assert!(matches!(err, Refusal::Malformed(_)), "{token:.60}: {err}");
    }
    for alg in ["none", "HS256", "ES512"] {
        let token = format!("{}.{claims}.", b64(json!({"alg": alg, "kid": "k1"})));
        let err = auth.check(Some("a"), &token, NOW).unwrap_err();
        assert_eq!(err, Refusal::UnsupportedAlgorithm(alg.into()));
    }
}

#[test]
fn refusals_quote_node_text_within_bounds() {
    let key = JwtSigner::es256("k1");
    let auth = mk_auth(&[("a", &[&key])]);
    let long_kid = JwtSigner::es256(&"k".repeat(500));
    let err = auth
        .check(Some("a"), &svid(&long_kid, "a"), NOW)
        .unwrap_err();
    assert!(err.to_string().len() < 300, "{err}");
    let token = svid(&key, "a");
    assert!(!err.to_string().contains(&token));
}

#[test]
fn bundles_keep_only_usable_jwt_authorities() {
    let key = JwtSigner::es256("k1");
    let mut x509 = key.jwk();
    x509["use"] = json!("x509-svid");
    x509["kid"] = json!("x");
    let doc = json!({"keys": [
        key.jwk(),
        x509,
        {"kty": "EC", "crv": "P-521", "kid": "p521", "x": "AA", "y": "AA"},
        {"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"},
        {"kty": "RSA", "kid": "rsa", "n": "AQAB", "e": "AQAB"},
        {"kty": "EC", "crv": "P-256", "x": "AA", "y": "AA"},
        "not an object"
    ], "spiffe_sequence": 7});
    let bundle = parse_jwks(doc.to_string().as_bytes()).unwrap();
    assert_eq!(bundle.len(), 2, "{bundle:?}");
    assert_eq!(bundle.keys("k1").len(), 1);
    assert_eq!(bundle.keys("rsa").len(), 1);
    assert!(bundle.keys("x").is_empty());
    assert!(parse_jwks(b"{\"nokeys\": []}").is_err());
}

/// ring cannot generate RSA keys, so these tokens are signed with a
/// throwaway key kept in `testdata/` (see its README).
#[test]
fn rsa_tokens_verify_with_pkcs1_and_pss() {
    let der = STANDARD
        .decode(include_str!("testdata/rsa2048.der.b64").trim())
        .unwrap();
    let key = RsaKeyPair::from_der(&der).unwrap();
    let jwk: serde_json::Value =
        serde_json::from_str(include_str!("testdata/rsa2048.jwk.json")).unwrap();
    let bundle = parse_jwks(json!({ "keys": [jwk] }).to_string().as_bytes()).unwrap();
    let auth = mk_auth_with(BTreeMap::from([("a".to_string(), bundle)]));
    let rng = SystemRandom::new();
    let sign = |alg: &str, encoding: &'static dyn RsaEncoding| {
        let claims = json!({"sub": "spiffe://a/n", "aud": [AUD], "exp": NOW + 60});
        let signed = format!("{}.{}", b64(json!({"alg": alg, "kid": "rsa"})), b64(claims));
        let mut sig = vec![0; key.public().modulus_len()];
        key.sign(encoding, &rng, signed.as_bytes(), &mut sig)
            .unwrap();
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(sig))
    };
    let algs: [(&str, &'static dyn RsaEncoding); 6] = [
        ("RS256", &RSA_PKCS1_SHA256),
        ("RS384", &RSA_PKCS1_SHA384),
        ("RS512", &RSA_PKCS1_SHA512),
        ("PS256", &RSA_PSS_SHA256),
        ("PS384", &RSA_PSS_SHA384),
        ("PS512", &RSA_PSS_SHA512),
    ];
    for (alg, encoding) in algs {
        let token = sign(alg, encoding);
        assert!(auth.check(Some("a"), &token, NOW).is_ok(), "{alg}");
    }
    // A PKCS#1 signature relabelled PSS, or an RSA key asked for ECDSA.
    for (alg, encoding) in [
        ("PS256", &RSA_PKCS1_SHA256 as _),
        ("ES256", &RSA_PKCS1_SHA256 as _),
    ] {
        let err = auth
            .check(Some("a"), &sign(alg, encoding), NOW)
            .unwrap_err();
        assert!(matches!(err, Refusal::BadSignature { .. }), "{alg}: {err}");
    }
}
