//! Sealing of domain secrets kept in the store.
//!
//! A registration token is an HMAC under the domain's secret, so verifying
//! one needs the secret itself: a one-way hash at rest would make the
//! stored domains useless for registration. Secrets are therefore stored
//! encrypted with AES-256-GCM (ring, already in the tree) under a key that
//! never enters the database: whoever reads a dump or a backup learns the
//! domain names, not their secrets.
//!
//! Sealed form: one version byte, a random 96-bit nonce, then ciphertext
//! and tag. The domain name is the associated data, so a sealed secret
//! copied onto another domain's row does not open.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};

/// The environment variable the binary reads the key from: 32 bytes,
/// base64 (standard alphabet, padded), e.g. `openssl rand -base64 32`.
pub const KEY_ENV: &str = "SLIM_CP_DOMAIN_SECRET_KEY";

/// Bytes in a key.
pub const KEY_LEN: usize = 32;

/// The format of what [`SealKey::seal`] writes; a later one (another
/// cipher, a key id for rotation) gets a new number.
const VERSION: u8 = 1;

/// Why a key or a sealed secret is unusable. No variant carries key or
/// secret material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("{KEY_ENV} is not base64 (standard alphabet with padding)")]
    KeyNotBase64,
    #[error("{KEY_ENV} decodes to {0} bytes; exactly {KEY_LEN} are needed")]
    KeyLength(usize),
    #[error("the sealed secret is of an unknown format (version byte {0})")]
    UnknownVersion(u8),
    #[error("the sealed secret is truncated")]
    Truncated,
    #[error(
        "the sealed secret does not open with this key (sealed under another \
         {KEY_ENV}, or for another domain)"
    )]
    WrongKey,
}

/// The AES-256-GCM key domain secrets are sealed with.
pub struct SealKey(LessSafeKey);

impl fmt::Debug for SealKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SealKey(<redacted>)")
    }
}

impl SealKey {
    /// The key from its base64 text (surrounding whitespace ignored, so a
    /// file's trailing newline does not matter).
    pub fn from_base64(text: &str) -> Result<Self, SealError> {
        let bytes = STANDARD
            .decode(text.trim())
            .map_err(|_| SealError::KeyNotBase64)?;
        Self::from_bytes(&bytes)
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, SealError> {
        if bytes.len() != KEY_LEN {
            return Err(SealError::KeyLength(bytes.len()));
        }
        // ring refuses only a key of the wrong length, checked above.
        let key =
            UnboundKey::new(&AES_256_GCM, bytes).map_err(|_| SealError::KeyLength(bytes.len()))?;
        Ok(Self(LessSafeKey::new(key)))
    }

    /// A key for this process only: enough for the memory store, whose
    /// domains end with the process anyway.
    pub fn random() -> Self {
        let bytes: [u8; KEY_LEN] = rand::random();
        // A 32-byte slice is always a valid AES-256 key.
        match Self::from_bytes(&bytes) {
            Ok(key) => key,
            Err(e) => unreachable!("a {KEY_LEN}-byte key was refused: {e}"),
        }
    }

    /// `secret` sealed for `domain`.
    pub fn seal(&self, domain: &str, secret: &[u8]) -> Vec<u8> {
        let nonce: [u8; NONCE_LEN] = rand::random();
        let mut out = Vec::with_capacity(1 + NONCE_LEN + secret.len() + 16);
        out.push(VERSION);
        out.extend_from_slice(&nonce);
        let mut body = secret.to_vec();
        // Sealing fails only past GCM's 64 GiB message limit.
        if let Err(e) = self.0.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(domain.as_bytes()),
            &mut body,
        ) {
            unreachable!("AES-GCM refused a {}-byte secret: {e}", secret.len());
        }
        out.extend_from_slice(&body);
        out
    }

    /// The secret `sealed` holds for `domain`.
    pub fn open(&self, domain: &str, sealed: &[u8]) -> Result<Vec<u8>, SealError> {
        let (&version, rest) = sealed.split_first().ok_or(SealError::Truncated)?;
        if version != VERSION {
            return Err(SealError::UnknownVersion(version));
        }
        if rest.len() < NONCE_LEN {
            return Err(SealError::Truncated);
        }
        let (nonce, body) = rest.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| SealError::Truncated)?;
        let mut body = body.to_vec();
        let plain = self
            .0
            .open_in_place(nonce, Aad::from(domain.as_bytes()), &mut body)
            .map_err(|_| SealError::WrongKey)?;
        Ok(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_secret_opens_only_for_its_domain_and_key() {
        let key = SealKey::random();
        let sealed = key.seal("blue", b"0123456789abcdef0123456789abcdef");
        assert!(!sealed.windows(16).any(|w| w == b"0123456789abcdef"));
        assert_eq!(
            key.open("blue", &sealed).as_deref(),
            Ok(&b"0123456789abcdef0123456789abcdef"[..])
        );
        assert_eq!(key.open("red", &sealed), Err(SealError::WrongKey));
        assert_eq!(
            SealKey::random().open("blue", &sealed),
            Err(SealError::WrongKey)
        );
        assert_eq!(key.open("blue", &sealed[..5]), Err(SealError::Truncated));
        let mut future = sealed.clone();
        future[0] = 9;
        assert_eq!(key.open("blue", &future), Err(SealError::UnknownVersion(9)));
    }

    #[test]
    fn keys_are_32_bytes_of_base64() {
        let text = STANDARD.encode([7u8; KEY_LEN]);
        assert!(SealKey::from_base64(&format!("{text}\n")).is_ok());
        assert_eq!(
            SealKey::from_base64(&STANDARD.encode([7u8; 16])).err(),
            Some(SealError::KeyLength(16))
        );
        assert_eq!(
            SealKey::from_base64("not base64!").err(),
            Some(SealError::KeyNotBase64)
        );
        let shown = format!("{:?}", SealKey::random());
        assert_eq!(shown, "SealKey(<redacted>)");
    }
}
