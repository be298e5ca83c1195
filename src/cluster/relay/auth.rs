//! Relay authentication with a cluster secret: each call carries a token
//! derived from the secret (never the secret itself), and the receiver
//! compares it in constant time. Refusals are counted by reason. Never
//! open: a replica without a configured secret uses the one kept in the
//! database, which only replicas that can read the database know.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::{Request, Status};

/// The metadata key of the token.
pub const HEADER: &str = "x-slim-cp-relay-token";

/// What the token proves: knowledge of the secret, for this protocol.
const LABEL: &[u8] = b"slim-cp relay v1";

/// The token for `secret`.
pub fn token(secret: &str) -> String {
    // Any key length is valid for HMAC: the error cannot happen.
    let mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes())
        .map(|m| m.chain_update(LABEL).finalize().into_bytes())
        .unwrap_or_default();
    URL_SAFE_NO_PAD.encode(mac)
}

/// Adds the token to outgoing calls.
#[derive(Clone)]
pub struct Stamp(AsciiMetadataValue);

impl Stamp {
    pub fn new(secret: &str) -> Self {
        // base64url is ASCII.
        Self(
            AsciiMetadataValue::try_from(token(secret))
                .unwrap_or_else(|_| AsciiMetadataValue::from_static("")),
        )
    }

    pub fn apply<T>(&self, request: &mut Request<T>) {
        request.metadata_mut().insert(HEADER, self.0.clone());
    }
}

/// Checks incoming calls and counts refusals.
#[derive(Clone)]
pub struct Guard {
    expected: [u8; 32],
    refused: Arc<Mutex<BTreeMap<String, u64>>>,
}

impl Guard {
    pub fn new(secret: &str) -> Self {
        Self {
            expected: digest(&token(secret)),
            refused: Arc::default(),
        }
    }

    /// Refusals so far, by reason.
    pub fn refused(&self) -> BTreeMap<String, u64> {
        self.refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Counts a refusal for another reason (a stale epoch, say).
    pub fn count(&self, reason: &str) {
        let mut map = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        *map.entry(reason.to_string()).or_default() += 1;
    }

    /// Admits a call whose token matches; refuses others with
    /// `UNAUTHENTICATED`.
    pub fn check(&self, metadata: &MetadataMap) -> Result<(), Status> {
        let Some(given) = metadata.get(HEADER).and_then(|v| v.to_str().ok()) else {
            self.count("no credentials");
            return Err(Status::unauthenticated("relay call without credentials"));
        };
        // Digests make the comparison constant-time whatever the lengths.
        if bool::from(digest(given).ct_eq(&self.expected)) {
            return Ok(());
        }
        self.count("bad credentials");
        Err(Status::unauthenticated("relay credentials rejected"))
    }
}

fn digest(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call_with(stamp: Option<&Stamp>) -> MetadataMap {
        let mut req = Request::new(());
        if let Some(s) = stamp {
            s.apply(&mut req);
        }
        req.metadata().clone()
    }

    #[test]
    fn only_the_right_secret_gets_in_and_refusals_are_counted() {
        let secret = "k".repeat(32);
        let guard = Guard::new(&secret);
        assert!(guard.check(&call_with(Some(&Stamp::new(&secret)))).is_ok());
        let wrong = guard.check(&call_with(Some(&Stamp::new(&"x".repeat(32)))));
        assert_eq!(wrong.unwrap_err().code(), tonic::Code::Unauthenticated);
        let none = guard.check(&call_with(None));
        assert_eq!(none.unwrap_err().code(), tonic::Code::Unauthenticated);
        let refused = guard.refused();
        assert_eq!(refused.get("bad credentials"), Some(&1));
        assert_eq!(refused.get("no credentials"), Some(&1));
    }

    #[test]
    fn the_token_does_not_reveal_the_secret() {
        let secret = "a-secret-of-at-least-32-bytes-long!";
        assert!(!token(secret).contains(secret));
        assert_eq!(token(secret), token(secret));
    }
}
