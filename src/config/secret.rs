//! Per-group shared secrets for registration authentication.
//!
//! A secret must never reach a log or an error message: `Debug` is
//! redacted, there is no `Display`, and parse errors describe the value
//! without quoting it.

use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer};

/// An HMAC secret of at least [`SharedSecret::MIN_LEN`] bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct SharedSecret(String);

impl SharedSecret {
    /// The reference's (slim-auth's) minimum; shorter keys are refused by
    /// the nodes too, so accepting them here would only defer the failure.
    pub const MIN_LEN: usize = 32;

    /// Wraps `secret` if it is long enough. The error never contains it.
    pub fn new(secret: impl Into<String>) -> Result<Self, String> {
        let secret = secret.into();
        if secret.len() < Self::MIN_LEN {
            return Err(format!(
                "shared secret is too short ({} bytes; at least {} are required)",
                secret.len(),
                Self::MIN_LEN
            ));
        }
        Ok(Self(secret))
    }

    /// The secret itself, for building verifiers. Do not log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SharedSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SharedSecret(<redacted>)")
    }
}

impl<'de> Deserialize<'de> for SharedSecret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(SecretVisitor)
    }
}

struct SecretVisitor;

impl SecretVisitor {
    /// serde's default messages quote the value; these do not.
    fn not_a_string<E: de::Error>(what: &str) -> E {
        E::custom(format!(
            "the shared secret must be a string, not {what} (quote it)"
        ))
    }
}

impl<'de> Visitor<'de> for SecretVisitor {
    type Value = SharedSecret;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a string of at least {} bytes", SharedSecret::MIN_LEN)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<SharedSecret, E> {
        SharedSecret::new(v).map_err(E::custom)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<SharedSecret, E> {
        Err(Self::not_a_string("a boolean"))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<SharedSecret, E> {
        Err(Self::not_a_string("a number"))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<SharedSecret, E> {
        Err(Self::not_a_string("a number"))
    }

    fn visit_i128<E: de::Error>(self, _: i128) -> Result<SharedSecret, E> {
        Err(Self::not_a_string("a number"))
    }

    fn visit_u128<E: de::Error>(self, _: u128) -> Result<SharedSecret, E> {
        Err(Self::not_a_string("a number"))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<SharedSecret, E> {
        Err(Self::not_a_string("a number"))
    }

    fn visit_unit<E: de::Error>(self) -> Result<SharedSecret, E> {
        Err(Self::not_a_string("empty"))
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<SharedSecret, A::Error> {
        Err(Self::not_a_string("a list"))
    }

    fn visit_map<A: de::MapAccess<'de>>(self, _: A) -> Result<SharedSecret, A::Error> {
        Err(Self::not_a_string("a mapping"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn length_is_enforced_and_never_echoed() {
        assert_eq!(SharedSecret::new(GOOD).unwrap().expose(), GOOD);
        let err = SharedSecret::new("short-secret-xyz").unwrap_err();
        assert!(err.contains("too short"), "{err}");
        assert!(!err.contains("short-secret-xyz"), "{err}");
        for number in [
            "123456789012345678901234567890123",
            "1234567890123",
            "-12345678901",
            "1.2345678901",
        ] {
            let err = yaml_serde::from_str::<SharedSecret>(number)
                .unwrap_err()
                .to_string();
            assert!(!err.contains("2345678901"), "{err}");
            assert!(err.contains("must be a string"), "{err}");
        }
    }

    #[test]
    fn debug_is_redacted() {
        let secret = SharedSecret::new(GOOD).unwrap();
        let shown = format!("{secret:?}");
        assert!(!shown.contains(GOOD), "{shown}");
        assert!(shown.contains("redacted"));
    }
}
