//! Per-group shared-secret tokens, as upstream `slim` nodes mint them.
//!
//! A token is `id:ts:nonce:claims:mac`: `id` is `{group}/{node}_` plus 8
//! random alphanumerics, `ts` Unix seconds, `nonce` 12 random bytes and
//! `claims` a JSON object, both base64url without padding, and `mac` the
//! HMAC-SHA256 of everything before the last `:` under the group's secret.
//! Rejection messages go to the operator's log and to the refused node, so
//! they never quote the secret, the MAC or the whole token.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use hmac::{Hmac, Mac};
use rand::Rng;
use rand::distr::Alphanumeric;
use sha2::Sha256;

use super::domains::Domains;
use super::quoted;
use crate::config::SharedSecret;
use crate::proto::sb;
use crate::southbound::auth::Authenticator;
use crate::southbound::handshake::group_of;

pub(crate) type HmacSha256 = Hmac<Sha256>;

/// How far a token's timestamp may be ahead of our clock (the nodes'
/// verifier tolerates the same skew).
pub const CLOCK_SKEW_SECS: u64 = 5;
/// How long a token is valid after its timestamp.
pub const TOKEN_VALIDITY_SECS: u64 = 3600;

/// Bytes in an HMAC-SHA256 tag.
const TAG_LEN: usize = 32;

/// Why a registration token was refused. Each reason reads on its own in a
/// log line; none carries the secret or the full token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// Auth is on but the node named no group to pick a secret by.
    #[error("the node sent no group name; registration auth needs one to pick the group's secret")]
    NoGroup,
    /// The node sent no token (2.0.0-alpha.2 nodes never do).
    #[error("the node sent no credentials, but registration auth is on for group {0:?}")]
    NoCredentials(String),
    /// No secret is configured or stored (`AddDomain`) for the group.
    #[error("no shared secret is configured or added as a domain for group {0:?}")]
    UnknownGroup(String),
    /// The token does not have the `id:ts:nonce:claims:mac` shape.
    #[error("malformed token: {0}")]
    Malformed(&'static str),
    /// The MAC does not verify under the claimed group's secret.
    #[error(
        "token signature does not verify with the secret of group {0:?} \
         (a wrong secret, or a token minted for another group)"
    )]
    BadSignature(String),
    /// The timestamp is ahead of our clock by more than the allowed skew.
    #[error(
        "token timestamp is {0} s in the future (at most {CLOCK_SKEW_SECS} s of clock skew \
         is tolerated; check the node's clock)"
    )]
    FromTheFuture(u64),
    /// The token is older than its validity window.
    #[error("token expired: minted {0} s ago, valid for {TOKEN_VALIDITY_SECS} s")]
    Expired(u64),
    /// The token was minted for another node (or group sharing the secret).
    #[error(
        "token identity {got:?} is not node {expected:?} (nor it followed by `_` and a suffix)"
    )]
    IdentityMismatch {
        /// `{group}/{node}` as the node claimed it.
        expected: String,
        /// The token's id (not secret: it names the minter).
        got: String,
    },
}

/// Verifies tokens against the secrets of each group: the configured one
/// and, when domains are managed through the API, the stored one. A token
/// that verifies under either is accepted (two secrets for one group let
/// an operator rotate without restarting nodes all at once).
pub struct SharedSecretAuth {
    /// The HMAC state keyed with each group's secret, ready to clone.
    keys: BTreeMap<String, HmacSha256>,
    stored: Option<Arc<Domains>>,
}

impl fmt::Debug for SharedSecretAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedSecretAuth")
            .field("groups", &self.keys.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl SharedSecretAuth {
    /// An authenticator for these groups; any other group is refused.
    pub fn new(secrets: BTreeMap<String, SharedSecret>) -> Self {
        let keys = secrets
            .into_iter()
            .map(|(group, secret)| (group, keyed(secret.expose().as_bytes())))
            .collect();
        Self { keys, stored: None }
    }

    /// Also accept the secrets of the domains stored through the API.
    pub fn with_domains(mut self, domains: Arc<Domains>) -> Self {
        self.stored = Some(domains);
        self
    }

    /// Checks that `credentials` prove `node` belongs to `group`, as of
    /// `now` (Unix seconds). An empty group counts as none.
    pub fn check(
        &self,
        group: Option<&str>,
        node: &str,
        credentials: &str,
        now: u64,
    ) -> Result<(), Rejection> {
        let group = group.filter(|g| !g.is_empty()).ok_or(Rejection::NoGroup)?;
        if credentials.is_empty() {
            return Err(Rejection::NoCredentials(quoted(group)));
        }
        let keys: Vec<HmacSha256> = self
            .keys
            .get(group)
            .cloned()
            .into_iter()
            .chain(self.stored.as_ref().and_then(|d| d.key(group)))
            .collect();
        if keys.is_empty() {
            return Err(Rejection::UnknownGroup(quoted(group)));
        }
        let token = Token::parse(credentials)?;
        // Signature first: only an authentic token earns a precise reason.
        token.check_mac_any(&keys, group)?;
        check_age(token.ts, now)?;
        check_identity(token.id, group, node)?;
        check_claims(token.claims)
    }
}

impl Authenticator for SharedSecretAuth {
    fn verify(&self, request: &sb::RegisterNodeRequest) -> Result<(), String> {
        let now = u64::try_from(crate::clock::unix_now()).unwrap_or(0);
        self.check(
            group_of(request),
            &request.node_id,
            &request.credentials,
            now,
        )
        .map_err(|r| r.to_string())
    }
}

/// A token split into its fields, borrowing from the credentials.
struct Token<'a> {
    /// Everything the MAC covers: `id:ts:nonce:claims`.
    signed: &'a str,
    id: &'a str,
    ts: u64,
    claims: &'a str,
    mac: &'a str,
}

impl<'a> Token<'a> {
    fn parse(token: &'a str) -> Result<Self, Rejection> {
        const SHAPE: &str = "expected five `:`-separated fields (id:ts:nonce:claims:mac)";
        let (signed, mac) = token.rsplit_once(':').ok_or(Rejection::Malformed(SHAPE))?;
        let mut fields = signed.split(':');
        let (Some(id), Some(ts), Some(_nonce), Some(claims), None) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            return Err(Rejection::Malformed(SHAPE));
        };
        // Digits only: `u64::from_str` would also take a leading `+`.
        if ts.is_empty() || !ts.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Rejection::Malformed("the timestamp is not a number"));
        }
        let ts = ts
            .parse()
            .map_err(|_| Rejection::Malformed("the timestamp is out of range"))?;
        Ok(Token {
            signed,
            id,
            ts,
            claims,
            mac,
        })
    }

    /// The MAC verifies under one of `keys`.
    fn check_mac_any(&self, keys: &[HmacSha256], group: &str) -> Result<(), Rejection> {
        let mut last = Rejection::BadSignature(quoted(group));
        for key in keys {
            match self.check_mac(key, group) {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Constant-time comparison (`verify_slice`), so that response timing
    /// does not leak how much of a forged MAC was right.
    fn check_mac(&self, key: &HmacSha256, group: &str) -> Result<(), Rejection> {
        let tag = URL_SAFE_NO_PAD
            .decode(self.mac)
            .map_err(|_| Rejection::Malformed("the MAC is not base64url without padding"))?;
        if tag.len() != TAG_LEN {
            return Err(Rejection::Malformed(
                "the MAC is not a 32-byte HMAC-SHA256 tag",
            ));
        }
        let mut mac = key.clone();
        mac.update(self.signed.as_bytes());
        mac.verify_slice(&tag)
            .map_err(|_| Rejection::BadSignature(quoted(group)))
    }
}

fn check_age(ts: u64, now: u64) -> Result<(), Rejection> {
    if ts > now {
        let ahead = ts - now;
        if ahead > CLOCK_SKEW_SECS {
            return Err(Rejection::FromTheFuture(ahead));
        }
    } else if now - ts > TOKEN_VALIDITY_SECS {
        return Err(Rejection::Expired(now - ts));
    }
    Ok(())
}

/// The token must name this very node: an exact `{group}/{node}`, or that
/// followed by `_` (so `node-10`'s token never passes for `node-1`).
fn check_identity(id: &str, group: &str, node: &str) -> Result<(), Rejection> {
    let expected = format!("{group}/{node}");
    let suffixed = id
        .strip_prefix(expected.as_str())
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('_'));
    if suffixed {
        return Ok(());
    }
    Err(Rejection::IdentityMismatch {
        expected: quoted(&expected),
        got: quoted(id),
    })
}

/// Nodes put their MLS public key there; the contents are not ours to
/// judge, but a signed token whose claims do not decode is broken.
fn check_claims(claims: &str) -> Result<(), Rejection> {
    if claims.is_empty() {
        return Ok(());
    }
    URL_SAFE_NO_PAD
        .decode(claims)
        .ok()
        .and_then(|json| serde_json::from_slice::<serde_json::Value>(&json).ok())
        .map(|_| ())
        .ok_or(Rejection::Malformed(
            "the claims are not base64url-encoded JSON",
        ))
}

/// A token as an upstream node mints it for `{group}/{node}` at `now_unix`:
/// for tests and for simulated nodes' credentials. The claims carry a
/// random stand-in for the node's MLS public key.
pub fn mint_token(group: &str, node: &str, secret: &str, now_unix: u64) -> String {
    let mut rng = rand::rng();
    let suffix: String = (&mut rng)
        .sample_iter(Alphanumeric)
        .take(8)
        .map(char::from)
        .collect();
    let nonce: [u8; 12] = rng.random();
    let pubkey: [u8; 32] = rng.random();
    let claims = serde_json::json!({ "pubkey": STANDARD.encode(pubkey) }).to_string();
    let signed = format!(
        "{group}/{node}_{suffix}:{now_unix}:{}:{}",
        URL_SAFE_NO_PAD.encode(nonce),
        URL_SAFE_NO_PAD.encode(claims)
    );
    let mut mac = keyed(secret.as_bytes());
    mac.update(signed.as_bytes());
    let tag = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    format!("{signed}:{tag}")
}

pub(crate) fn keyed(secret: &[u8]) -> HmacSha256 {
    // HMAC hashes long keys and pads short ones: no length is refused.
    HmacSha256::new_from_slice(secret).expect("HMAC-SHA256 accepts keys of any length")
}

#[cfg(test)]
#[path = "shared_secret_tests.rs"]
mod tests;
