//! JWT trust bundles: a JWKS document per trust domain (a SPIFFE bundle is
//! one too, with `use` telling JWT-SVID keys from X.509 ones), turned into
//! keys `ring` verifies signatures with.

use std::collections::{BTreeMap, HashMap};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature;
use serde::Deserialize;

use super::spiffe_id::trust_domain_of;
use crate::auth::quoted;

/// The signature algorithms of JWT-SVIDs that slim-cp verifies: the
/// SPIFFE JWT-SVID specification's list less ES512, which `ring` lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alg {
    /// ECDSA P-256, SHA-256.
    Es256,
    /// ECDSA P-384, SHA-384.
    Es384,
    /// RSASSA-PKCS1-v1_5, SHA-256.
    Rs256,
    /// RSASSA-PKCS1-v1_5, SHA-384.
    Rs384,
    /// RSASSA-PKCS1-v1_5, SHA-512.
    Rs512,
    /// RSASSA-PSS, SHA-256.
    Ps256,
    /// RSASSA-PSS, SHA-384.
    Ps384,
    /// RSASSA-PSS, SHA-512.
    Ps512,
}

impl Alg {
    /// The algorithm a JWS header names; `None` for anything else
    /// (`none`, HMAC, ES512...).
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "ES256" => Alg::Es256,
            "ES384" => Alg::Es384,
            "RS256" => Alg::Rs256,
            "RS384" => Alg::Rs384,
            "RS512" => Alg::Rs512,
            "PS256" => Alg::Ps256,
            "PS384" => Alg::Ps384,
            "PS512" => Alg::Ps512,
            _ => return None,
        })
    }
}

/// A public key from a bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublicKey {
    /// An EC key: the uncompressed point `04 || x || y`.
    P256(Vec<u8>),
    /// An EC key on P-384, as for P-256.
    P384(Vec<u8>),
    /// An RSA key: big-endian modulus and exponent.
    Rsa {
        /// Modulus.
        n: Vec<u8>,
        /// Public exponent.
        e: Vec<u8>,
    },
}

impl PublicKey {
    /// True when `sig` is this key's `alg` signature of `message`. A key of
    /// another type than `alg` needs never verifies.
    pub fn verifies(&self, alg: Alg, message: &[u8], sig: &[u8]) -> bool {
        use signature::*;
        let ec = |params: &'static EcdsaVerificationAlgorithm, point: &[u8]| {
            UnparsedPublicKey::new(params, point)
                .verify(message, sig)
                .is_ok()
        };
        let rsa = |params: &'static RsaParameters, n: &[u8], e: &[u8]| {
            RsaPublicKeyComponents { n, e }
                .verify(params, message, sig)
                .is_ok()
        };
        match (self, alg) {
            // JWS carries ECDSA signatures as fixed-size r || s.
            (PublicKey::P256(point), Alg::Es256) => ec(&ECDSA_P256_SHA256_FIXED, point),
            (PublicKey::P384(point), Alg::Es384) => ec(&ECDSA_P384_SHA384_FIXED, point),
            (PublicKey::Rsa { n, e }, Alg::Rs256) => rsa(&RSA_PKCS1_2048_8192_SHA256, n, e),
            (PublicKey::Rsa { n, e }, Alg::Rs384) => rsa(&RSA_PKCS1_2048_8192_SHA384, n, e),
            (PublicKey::Rsa { n, e }, Alg::Rs512) => rsa(&RSA_PKCS1_2048_8192_SHA512, n, e),
            (PublicKey::Rsa { n, e }, Alg::Ps256) => rsa(&RSA_PSS_2048_8192_SHA256, n, e),
            (PublicKey::Rsa { n, e }, Alg::Ps384) => rsa(&RSA_PSS_2048_8192_SHA384, n, e),
            (PublicKey::Rsa { n, e }, Alg::Ps512) => rsa(&RSA_PSS_2048_8192_SHA512, n, e),
            _ => false,
        }
    }
}

/// One trust domain's JWT authorities, by key id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustBundle {
    /// A key id may (against the specification) appear twice: every key
    /// under it is an authority of the trust domain, so each is tried.
    keys: HashMap<String, Vec<PublicKey>>,
}

impl TrustBundle {
    /// The keys published under `kid` (empty if none).
    pub fn keys(&self, kid: &str) -> &[PublicKey] {
        self.keys.get(kid).map(Vec::as_slice).unwrap_or_default()
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.keys.values().map(Vec::len).sum()
    }

    /// True when the bundle holds no JWT authority.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Adds `key` under `kid` (for tests and builders).
    pub fn insert(&mut self, kid: impl Into<String>, key: PublicKey) {
        self.keys.entry(kid.into()).or_default().push(key);
    }
}

/// Why a bundle document was not loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BundleError {
    /// Not JSON, or not the expected shape.
    #[error("not a JWKS document: {0}")]
    NotJwks(String),
    /// A trust domain key that is not a trust domain.
    #[error("{0:?} is not a SPIFFE trust domain")]
    BadTrustDomain(String),
    /// A single bundle in a file, but no `trust_domain` configured for it.
    #[error(
        "the file holds one bundle (a `keys` array) but no `trust_domain` is configured for it; \
         set `trust_domain`, or write an object mapping each trust domain to its JWKS"
    )]
    TrustDomainNeeded,
    /// `trust_domain` is configured but the file is not one bundle.
    #[error("`trust_domain` is set but the file is not one JWKS document (no `keys` array)")]
    NotSingleBundle,
}

#[derive(Deserialize)]
struct Jwks {
    keys: Vec<serde_json::Value>,
}

/// The JWK members slim-cp reads; others are ignored.
#[derive(Deserialize)]
struct Jwk {
    kty: String,
    kid: Option<String>,
    #[serde(rename = "use")]
    usage: Option<String>,
    crv: Option<String>,
    x: Option<String>,
    y: Option<String>,
    n: Option<String>,
    e: Option<String>,
}

/// Parses one JWKS document (or SPIFFE bundle). Keys that are not JWT
/// authorities (`use` other than `jwt-svid` or `sig`), that have no `kid`,
/// or that slim-cp cannot use are skipped, so one odd key does not take
/// the trust domain's other authorities down with it.
pub fn parse_jwks(json: &[u8]) -> Result<TrustBundle, BundleError> {
    let jwks: Jwks =
        serde_json::from_slice(json).map_err(|e| BundleError::NotJwks(e.to_string()))?;
    let mut bundle = TrustBundle::default();
    for value in jwks.keys {
        let Ok(jwk) = serde_json::from_value::<Jwk>(value) else {
            continue;
        };
        let jwt_authority = matches!(jwk.usage.as_deref(), None | Some("jwt-svid" | "sig"));
        let Some(kid) = jwk.kid.clone().filter(|k| !k.is_empty()) else {
            continue;
        };
        if let (true, Some(key)) = (jwt_authority, public_key(&jwk)) {
            bundle.insert(kid, key);
        }
    }
    Ok(bundle)
}

fn public_key(jwk: &Jwk) -> Option<PublicKey> {
    let b64 = |v: &Option<String>| v.as_deref().and_then(|s| URL_SAFE_NO_PAD.decode(s).ok());
    match jwk.kty.as_str() {
        "EC" => {
            let (x, y) = (b64(&jwk.x)?, b64(&jwk.y)?);
            let size = match jwk.crv.as_deref()? {
                "P-256" => 32,
                "P-384" => 48,
                _ => return None,
            };
            if x.len() != size || y.len() != size {
                return None;
            }
            let point = [&[4u8][..], &x, &y].concat();
            Some(if size == 32 {
                PublicKey::P256(point)
            } else {
                PublicKey::P384(point)
            })
        }
        "RSA" => Some(PublicKey::Rsa {
            n: b64(&jwk.n)?,
            e: b64(&jwk.e)?,
        }),
        _ => None,
    }
}

/// Parses the Workload API's map of trust domain to JWKS bytes. A bundle
/// that does not parse keeps its trust domain's `previous` one, if any:
/// one broken document must not revoke a domain's working keys.
pub fn parse_bundle_map<'a>(
    bundles: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    previous: &BTreeMap<String, TrustBundle>,
) -> (BTreeMap<String, TrustBundle>, Vec<String>) {
    let mut parsed = BTreeMap::new();
    let mut problems = Vec::new();
    for (name, json) in bundles {
        let Some(td) = trust_domain_of(name) else {
            problems.push(BundleError::BadTrustDomain(quoted(name)).to_string());
            continue;
        };
        match parse_jwks(json) {
            Ok(bundle) => {
                parsed.insert(td.to_string(), bundle);
            }
            Err(e) => {
                problems.push(format!("trust domain {td:?}: {e}"));
                if let Some(old) = previous.get(td) {
                    parsed.insert(td.to_string(), old.clone());
                }
            }
        }
    }
    (parsed, problems)
}

/// Parses a bundle file: one JWKS (or SPIFFE bundle) for `trust_domain`,
/// or, without it, an object mapping each trust domain to its JWKS.
pub fn parse_bundle_file(
    json: &[u8],
    trust_domain: Option<&str>,
) -> Result<BTreeMap<String, TrustBundle>, BundleError> {
    let doc: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(json).map_err(|e| BundleError::NotJwks(e.to_string()))?;
    let single = doc.contains_key("keys");
    match (single, trust_domain) {
        (true, Some(td)) => Ok(BTreeMap::from([(td.to_string(), parse_jwks(json)?)])),
        (true, None) => Err(BundleError::TrustDomainNeeded),
        (false, Some(_)) => Err(BundleError::NotSingleBundle),
        (false, None) => {
            let mut out = BTreeMap::new();
            for (name, jwks) in doc {
                let td = trust_domain_of(&name)
                    .ok_or_else(|| BundleError::BadTrustDomain(quoted(&name)))?;
                let bytes = serde_json::to_vec(&jwks)
                    .map_err(|e| BundleError::NotJwks(format!("trust domain {td:?}: {e}")))?;
                let bundle = parse_jwks(&bytes)
                    .map_err(|e| BundleError::NotJwks(format!("trust domain {td:?}: {e}")))?;
                out.insert(td.to_string(), bundle);
            }
            Ok(out)
        }
    }
}
