//! Compact JWS parsing for JWT-SVIDs: `header.claims.signature`, each part
//! base64url without padding. Nothing here trusts the contents; the
//! verifier checks the signature before it acts on a claim.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;

/// Longest token read. A JWT-SVID is well under 2 KiB; the bound keeps a
/// hostile node from making us decode megabytes per registration.
pub const MAX_TOKEN_LEN: usize = 16 * 1024;

/// A token split and decoded, not yet verified.
#[derive(Debug)]
pub struct Jwt<'a> {
    /// `header.claims`, which the signature covers.
    pub signed: &'a str,
    pub header: Header,
    pub claims: Claims,
    pub signature: Vec<u8>,
}

/// The JOSE header fields a JWT-SVID verifier reads.
#[derive(Debug, Deserialize)]
pub struct Header {
    pub alg: String,
    pub kid: Option<String>,
    pub typ: Option<String>,
}

/// The registered claims a JWT-SVID verifier reads.
#[derive(Debug, Deserialize)]
pub struct Claims {
    pub sub: Option<String>,
    pub aud: Option<Audience>,
    pub exp: Option<serde_json::Number>,
    pub nbf: Option<serde_json::Number>,
}

/// `aud` is one string or an array of them (RFC 7519).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Audience {
    One(String),
    Many(Vec<String>),
}

impl Audience {
    pub fn as_slice(&self) -> &[String] {
        match self {
            Audience::One(a) => std::slice::from_ref(a),
            Audience::Many(all) => all,
        }
    }
}

impl<'a> Jwt<'a> {
    /// Splits and decodes `token`; `Err` says what is malformed.
    pub fn parse(token: &'a str) -> Result<Self, &'static str> {
        if token.len() > MAX_TOKEN_LEN {
            return Err("the token is longer than 16 KiB");
        }
        let (signed, signature) = token
            .rsplit_once('.')
            .ok_or("not a compact JWT (header.claims.signature)")?;
        let (header, claims) = signed
            .split_once('.')
            .ok_or("not a compact JWT (header.claims.signature)")?;
        if claims.contains('.') {
            return Err("not a compact JWT: more than three parts (an encrypted JWT?)");
        }
        let header = decode_json(header).ok_or("the header is not base64url-encoded JSON")?;
        let claims = decode_json(claims).ok_or(
            "the claims are not base64url-encoded JSON, or `sub`, `aud`, `exp` or `nbf` has the \
             wrong type",
        )?;
        let signature = URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|_| "the signature is not base64url without padding")?;
        Ok(Jwt {
            signed,
            header,
            claims,
            signature,
        })
    }
}

fn decode_json<T: serde::de::DeserializeOwned>(part: &str) -> Option<T> {
    let bytes = URL_SAFE_NO_PAD.decode(part).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// A NumericDate as whole seconds; fractions are cut (RFC 7519 allows
/// them), negatives count as 0, and absurdly large values saturate.
pub fn seconds(n: &serde_json::Number) -> Option<u64> {
    if let Some(s) = n.as_u64() {
        return Some(s);
    }
    if n.as_i64().is_some() {
        return Some(0);
    }
    // `as` saturates on float to integer casts: exactly the wanted clamp.
    n.as_f64()
        .filter(|f| f.is_finite())
        .map(|f| f.max(0.0) as u64)
}
