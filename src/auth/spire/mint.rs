//! JWT-SVIDs as a SPIRE server mints them, for tests and simulated nodes:
//! an EC key pair generated on the spot, its public half as a JWK for a
//! trust bundle, and ES256/ES384 tokens signed with it.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{
    ECDSA_P256_SHA256_FIXED_SIGNING, ECDSA_P384_SHA384_FIXED_SIGNING, EcdsaKeyPair,
    EcdsaSigningAlgorithm, KeyPair,
};
use serde_json::{Value, json};

/// A JWT authority: a key pair and its key id.
pub struct JwtSigner {
    kid: String,
    alg: &'static str,
    crv: &'static str,
    key: EcdsaKeyPair,
    rng: SystemRandom,
}

impl JwtSigner {
    /// A fresh P-256 key signing ES256, published as `kid`.
    pub fn es256(kid: &str) -> Self {
        Self::generate(kid, &ECDSA_P256_SHA256_FIXED_SIGNING, "ES256", "P-256")
    }

    /// A fresh P-384 key signing ES384, published as `kid`.
    pub fn es384(kid: &str) -> Self {
        Self::generate(kid, &ECDSA_P384_SHA384_FIXED_SIGNING, "ES384", "P-384")
    }

    fn generate(
        kid: &str,
        params: &'static EcdsaSigningAlgorithm,
        alg: &'static str,
        crv: &'static str,
    ) -> Self {
        let rng = SystemRandom::new();
        // Key generation fails only without an OS random source; a test
        // cannot go on without one.
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(params, &rng).expect("OS randomness");
        let key = EcdsaKeyPair::from_pkcs8(params, pkcs8.as_ref(), &rng)
            .expect("ring parses the PKCS#8 it generated");
        JwtSigner {
            kid: kid.to_string(),
            alg,
            crv,
            key,
            rng,
        }
    }

    /// The public key as a JWK, as a SPIFFE bundle lists a JWT authority.
    pub fn jwk(&self) -> Value {
        // The public key is the uncompressed point 04 || x || y.
        let point = self.key.public_key().as_ref();
        let half = (point.len() - 1) / 2;
        json!({
            "kty": "EC",
            "crv": self.crv,
            "kid": self.kid,
            "use": "jwt-svid",
            "x": URL_SAFE_NO_PAD.encode(&point[1..=half]),
            "y": URL_SAFE_NO_PAD.encode(&point[half + 1..]),
        })
    }

    /// A compact JWS of `claims` with this key's `kid` and algorithm.
    pub fn sign(&self, claims: &Value) -> String {
        let header = json!({ "alg": self.alg, "kid": self.kid, "typ": "JWT" });
        let signed = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let sig = self
            .key
            .sign(&self.rng, signed.as_bytes())
            .expect("ECDSA signing fails only without OS randomness");
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(sig))
    }

    /// A JWT-SVID for `spiffe_id`, valid for `audiences` until `exp` (Unix
    /// seconds).
    pub fn mint(&self, spiffe_id: &str, audiences: &[&str], exp: u64) -> String {
        self.sign(&json!({ "sub": spiffe_id, "aud": audiences, "exp": exp }))
    }
}

/// A JWKS document of these authorities.
pub fn jwks(signers: &[&JwtSigner]) -> Value {
    json!({ "keys": signers.iter().map(|s| s.jwk()).collect::<Vec<_>>() })
}
