//! The JWT-SVID check itself, pure: a token, the trust bundles, the
//! configured audience, the group the node claims and the time in; the
//! node's SPIFFE id or the reason for refusing out.
//!
//! Order: the token's trust domain picks the bundle and its `kid` the key;
//! the signature is checked before any claim is believed, so only an
//! authentic token earns a precise reason (expired, audience, group).

use std::collections::BTreeMap;

use super::jwks::{Alg, TrustBundle};
use super::jwt::{Jwt, seconds};
use super::spiffe_id::SpiffeId;
use crate::auth::{CLOCK_SKEW_SECS, quoted};

/// At most this many audiences are quoted in a refusal.
const MAX_AUDIENCES_QUOTED: usize = 4;

/// Why a JWT-SVID was refused. Each reason reads on its own in a log line;
/// none quotes the token or its signature.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Auth is on but the node named no group.
    #[error("the node sent no group name; SPIRE registration auth needs one")]
    NoGroup,
    /// The node sent no token.
    #[error("the node sent no credentials, but SPIRE registration auth is on for group {0:?}")]
    NoCredentials(String),
    /// Not a JWT-SVID in form.
    #[error("malformed JWT-SVID: {0}")]
    Malformed(&'static str),
    /// `alg` is none of those SPIFFE allows and slim-cp verifies.
    #[error(
        "JWT-SVID algorithm {0:?} is not accepted (ES256, ES384, RS256, RS384, RS512, PS256, \
         PS384, PS512 are)"
    )]
    UnsupportedAlgorithm(String),
    /// No trust bundle for the token's trust domain (yet).
    #[error(
        "no trust bundle for trust domain {0:?} (none received yet, or the bundle source \
         does not hold that domain: is the SPIRE agent reachable, does it federate with it?)"
    )]
    UnknownTrustDomain(String),
    /// The trust domain's bundle has no key with the token's `kid`.
    #[error(
        "trust domain {trust_domain:?} has no JWT key with id {kid:?} (an unknown key, or one \
         rotated out of the bundle)"
    )]
    UnknownKeyId {
        /// The token's trust domain.
        trust_domain: String,
        /// The token's key id.
        kid: String,
    },
    /// The signature does not verify with the key its `kid` names.
    #[error("JWT-SVID signature does not verify with key {kid:?} of trust domain {trust_domain:?}")]
    BadSignature {
        /// The token's trust domain.
        trust_domain: String,
        /// The token's key id.
        kid: String,
    },
    /// `exp` is past, beyond the tolerated skew.
    #[error("JWT-SVID expired {0} s ago (at most {CLOCK_SKEW_SECS} s of clock skew is tolerated)")]
    Expired(u64),
    /// `nbf` is ahead of our clock beyond the tolerated skew.
    #[error(
        "JWT-SVID is not valid for another {0} s (at most {CLOCK_SKEW_SECS} s of clock skew is \
         tolerated; check the clocks)"
    )]
    NotYetValid(u64),
    /// `aud` lacks the configured audience.
    #[error("JWT-SVID audience {got:?} does not include {expected:?}")]
    WrongAudience {
        /// The configured audience.
        expected: String,
        /// The token's audiences (the first few, cut to length).
        got: Vec<String>,
    },
    /// The SPIFFE id's trust domain is not the group the node claims.
    #[error(
        "JWT-SVID for {spiffe_id:?} is from trust domain {trust_domain:?}, but the node claims \
         group {group:?} (the trust domain must equal the group name)"
    )]
    GroupMismatch {
        /// The group the node claimed.
        group: String,
        /// The token's trust domain.
        trust_domain: String,
        /// The token's subject.
        spiffe_id: String,
    },
}

/// What a token is checked against.
pub struct Expectations<'a> {
    /// The trust bundles by trust domain.
    pub bundles: &'a BTreeMap<String, TrustBundle>,
    /// The audience the token must carry.
    pub audience: &'a str,
    /// Now, in Unix seconds.
    pub now: u64,
}

/// Checks that `credentials` is a JWT-SVID, valid now, for the configured
/// audience, whose trust domain is `group`.
pub fn check(
    expect: &Expectations<'_>,
    group: Option<&str>,
    credentials: &str,
) -> Result<SpiffeId, Refusal> {
    let group = group.filter(|g| !g.is_empty()).ok_or(Refusal::NoGroup)?;
    if credentials.is_empty() {
        return Err(Refusal::NoCredentials(quoted(group)));
    }
    let jwt = Jwt::parse(credentials).map_err(Refusal::Malformed)?;
    let alg = Alg::from_name(&jwt.header.alg)
        .ok_or_else(|| Refusal::UnsupportedAlgorithm(quoted(&jwt.header.alg)))?;
    if !matches!(jwt.header.typ.as_deref(), None | Some("JWT" | "JOSE")) {
        return Err(Refusal::Malformed(
            "the header's `typ` is neither JWT nor JOSE",
        ));
    }
    let kid = jwt
        .header
        .kid
        .as_deref()
        .filter(|k| !k.is_empty())
        .ok_or(Refusal::Malformed("the header has no `kid`"))?;
    let sub = jwt
        .claims
        .sub
        .as_deref()
        .ok_or(Refusal::Malformed("no `sub` claim"))?;
    let id = SpiffeId::parse(sub).map_err(Refusal::Malformed)?;
    check_signature(expect.bundles, &jwt, alg, &id, kid)?;
    check_times(&jwt, expect.now)?;
    check_audience(&jwt, expect.audience)?;
    if id.trust_domain() != group {
        return Err(Refusal::GroupMismatch {
            group: quoted(group),
            trust_domain: id.trust_domain().to_string(),
            spiffe_id: quoted(sub),
        });
    }
    Ok(id)
}

fn check_signature(
    bundles: &BTreeMap<String, TrustBundle>,
    jwt: &Jwt<'_>,
    alg: Alg,
    id: &SpiffeId,
    kid: &str,
) -> Result<(), Refusal> {
    let td = id.trust_domain();
    let bundle = bundles
        .get(td)
        .ok_or_else(|| Refusal::UnknownTrustDomain(td.to_string()))?;
    let keys = bundle.keys(kid);
    if keys.is_empty() {
        return Err(Refusal::UnknownKeyId {
            trust_domain: td.to_string(),
            kid: quoted(kid),
        });
    }
    let signed = jwt.signed.as_bytes();
    if keys.iter().any(|k| k.verifies(alg, signed, &jwt.signature)) {
        return Ok(());
    }
    Err(Refusal::BadSignature {
        trust_domain: td.to_string(),
        kid: quoted(kid),
    })
}

/// `exp` is required (the JWT-SVID specification); `nbf` is optional.
fn check_times(jwt: &Jwt<'_>, now: u64) -> Result<(), Refusal> {
    let exp = jwt
        .claims
        .exp
        .as_ref()
        .ok_or(Refusal::Malformed("no `exp` claim"))?;
    let exp = seconds(exp).ok_or(Refusal::Malformed("`exp` is not a number of seconds"))?;
    if now > exp.saturating_add(CLOCK_SKEW_SECS) {
        return Err(Refusal::Expired(now - exp));
    }
    if let Some(nbf) = jwt.claims.nbf.as_ref() {
        let nbf = seconds(nbf).ok_or(Refusal::Malformed("`nbf` is not a number of seconds"))?;
        if nbf > now.saturating_add(CLOCK_SKEW_SECS) {
            return Err(Refusal::NotYetValid(nbf - now));
        }
    }
    Ok(())
}

/// The node also lists a `slim-claims:` audience (its MLS key) beside the
/// configured one, so membership is checked, not equality.
fn check_audience(jwt: &Jwt<'_>, audience: &str) -> Result<(), Refusal> {
    let got = jwt
        .claims
        .aud
        .as_ref()
        .map(|a| a.as_slice())
        .unwrap_or_default();
    if got.iter().any(|a| a == audience) {
        return Ok(());
    }
    Err(Refusal::WrongAudience {
        expected: audience.to_string(),
        got: got
            .iter()
            .take(MAX_AUDIENCES_QUOTED)
            .map(|a| quoted(a))
            .collect(),
    })
}
