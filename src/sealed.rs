//! Secrets at rest: endpoint signing secrets are sealed under the service's master key before they
//! reach the endpoints topic, so a topic dump, a backup or a debug consumer never shows them.
//!
//! Format: `v1.` + base64url(nonce || ciphertext || tag), no padding, with XChaCha20-Poly1305 and a
//! random 24-byte nonce per seal (192-bit nonces make random draws safe without a counter). The
//! caller's associated data is authenticated but not stored: an endpoint seals with its own id (and
//! the key id), so a sealed value copied onto another endpoint fails to open rather than signing
//! for the wrong receiver. The version prefix leaves room to change the algorithm or rotate the
//! master key without guessing what an old value is.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand_core::{OsRng, RngCore};
use serde::{Deserialize, Deserializer};
use zeroize::{Zeroize, ZeroizeOnDrop};

/// Length of the master key in bytes.
pub const KEY_LEN: usize = 32;
const NONCE_LEN: usize = 24;
const TAG_LEN: usize = 16;
const PREFIX: &str = "v1.";
/// Longest sealed string [`open`] looks at; signing secrets are tiny, so anything longer is
/// corrupt or hostile and is refused before decoding.
pub const MAX_SEALED_LEN: usize = 4096;

/// Why a master key could not be read, or a sealed value could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// The master key is not valid base64.
    #[error("master key is not valid base64")]
    KeyNotBase64,
    /// The master key decodes to the wrong number of bytes.
    #[error("master key must be {KEY_LEN} bytes, got {0}")]
    KeyLength(usize),
    /// The sealed value does not start with a version this build knows.
    #[error("sealed value has an unknown version (expected \"v1.\")")]
    UnknownVersion,
    /// The sealed value is not valid base64url, too short or too long.
    #[error("sealed value is malformed")]
    Malformed,
    /// Authentication failed: wrong key, wrong associated data, or the value was altered.
    #[error("sealed value does not open with this key and context")]
    Unauthentic,
}

/// The 32-byte key every sealed secret is encrypted under. Its bytes are wiped on drop and never
/// printed.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct MasterKey([u8; KEY_LEN]);

impl MasterKey {
    /// Reads a key given as standard base64 of exactly 32 bytes (surrounding whitespace ignored).
    pub fn from_base64(s: &str) -> Result<MasterKey, SealError> {
        let mut bytes = STANDARD
            .decode(s.trim())
            .map_err(|_| SealError::KeyNotBase64)?;
        let result = <[u8; KEY_LEN]>::try_from(bytes.as_slice())
            .map(MasterKey)
            .map_err(|_| SealError::KeyLength(bytes.len()));
        bytes.zeroize();
        result
    }

    /// Wraps raw key bytes.
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> MasterKey {
        MasterKey(bytes)
    }

    /// A fresh random key from the OS RNG: `hookline dev` uses one per process, and operators can
    /// print one with [`MasterKey::to_base64`] to configure `run`.
    pub fn generate() -> MasterKey {
        let mut bytes = [0u8; KEY_LEN];
        OsRng.fill_bytes(&mut bytes);
        MasterKey(bytes)
    }

    /// The key as standard base64, the form `security.master_key` takes. Only for showing a
    /// freshly generated key to an operator.
    pub fn to_base64(&self) -> String {
        STANDARD.encode(self.0)
    }

    /// A 32-byte key for one `purpose` (`hookline portal link v1`), derived from this key with
    /// HMAC-SHA256: every instance configured with the same master key derives the same key,
    /// and a key derived for one purpose reveals nothing of the master key or of another's.
    pub fn derive(&self, purpose: &str) -> zeroize::Zeroizing<[u8; KEY_LEN]> {
        use hmac::Mac;
        let mut mac = <hmac::Hmac<sha2::Sha256> as Mac>::new_from_slice(&self.0)
            .expect("HMAC takes a key of any length");
        mac.update(purpose.as_bytes());
        zeroize::Zeroizing::new(mac.finalize().into_bytes().into())
    }

    fn cipher(&self) -> XChaCha20Poly1305 {
        XChaCha20Poly1305::new((&self.0).into())
    }
}

impl fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MasterKey(<redacted>)")
    }
}

impl<'de> Deserialize<'de> for MasterKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut s = String::deserialize(d)?;
        let key = MasterKey::from_base64(&s);
        s.zeroize();
        key.map_err(|e| serde::de::Error::custom(format!("is not usable: {e}")))
    }
}

/// Encrypts `plaintext` under `key`, bound to `aad`, as a `v1.` string.
pub fn seal(key: &MasterKey, plaintext: &[u8], aad: &[u8]) -> String {
    let mut nonce = [0u8; NONCE_LEN];
    OsRng.fill_bytes(&mut nonce);
    let ciphertext = key
        .cipher()
        .encrypt(
            XNonce::from_slice(&nonce),
            Payload {
                msg: plaintext,
                aad,
            },
        )
        // Encryption only fails for plaintexts beyond ~256 GiB.
        .expect("XChaCha20-Poly1305 encryption cannot fail for small inputs");
    let mut out = Vec::with_capacity(NONCE_LEN + ciphertext.len());
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&ciphertext);
    format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(out))
}

/// Decrypts a value made by [`seal`] with the same key and associated data. The plaintext comes
/// back in a buffer that is wiped on drop.
pub fn open(
    key: &MasterKey,
    sealed: &str,
    aad: &[u8],
) -> Result<zeroize::Zeroizing<Vec<u8>>, SealError> {
    let body = sealed
        .strip_prefix(PREFIX)
        .ok_or(SealError::UnknownVersion)?;
    if body.len() > MAX_SEALED_LEN {
        return Err(SealError::Malformed);
    }
    let raw = URL_SAFE_NO_PAD
        .decode(body)
        .map_err(|_| SealError::Malformed)?;
    if raw.len() < NONCE_LEN + TAG_LEN {
        return Err(SealError::Malformed);
    }
    let (nonce, ciphertext) = raw.split_at(NONCE_LEN);
    key.cipher()
        .decrypt(
            XNonce::from_slice(nonce),
            Payload {
                msg: ciphertext,
                aad,
            },
        )
        .map(zeroize::Zeroizing::new)
        .map_err(|_| SealError::Unauthentic)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> MasterKey {
        MasterKey::from_bytes([b; KEY_LEN])
    }

    #[test]
    fn round_trip() {
        let k = key(1);
        let s = seal(&k, b"whsec material", b"ep_1");
        assert!(s.starts_with("v1."));
        assert!(!s.contains("whsec"));
        assert_eq!(open(&k, &s, b"ep_1").unwrap().as_slice(), b"whsec material");
        // Random nonces: sealing twice never repeats.
        assert_ne!(s, seal(&k, b"whsec material", b"ep_1"));
        assert_eq!(open(&k, &seal(&k, b"", b""), b"").unwrap().len(), 0);
    }

    #[test]
    fn wrong_key_wrong_aad_and_tampering_fail() {
        let s = seal(&key(1), b"secret", b"ep_1");
        assert_eq!(open(&key(2), &s, b"ep_1"), Err(SealError::Unauthentic));
        assert_eq!(open(&key(1), &s, b"ep_2"), Err(SealError::Unauthentic));
        // Flip one bit in every position of the decoded body: each must be refused.
        let raw = URL_SAFE_NO_PAD.decode(&s[3..]).unwrap();
        for i in 0..raw.len() {
            let mut t = raw.clone();
            t[i] ^= 0x01;
            let tampered = format!("v1.{}", URL_SAFE_NO_PAD.encode(&t));
            assert_eq!(
                open(&key(1), &tampered, b"ep_1"),
                Err(SealError::Unauthentic)
            );
        }
        let truncated = format!("v1.{}", URL_SAFE_NO_PAD.encode(&raw[..raw.len() - 1]));
        assert_eq!(
            open(&key(1), &truncated, b"ep_1"),
            Err(SealError::Unauthentic)
        );
        assert_eq!(open(&key(1), "v2.abc", b""), Err(SealError::UnknownVersion));
        assert_eq!(open(&key(1), "v1.!!", b""), Err(SealError::Malformed));
        assert_eq!(open(&key(1), "v1.AAAA", b""), Err(SealError::Malformed));
        let huge = format!("v1.{}", "A".repeat(MAX_SEALED_LEN + 1));
        assert_eq!(open(&key(1), &huge, b""), Err(SealError::Malformed));
    }

    #[test]
    fn derived_keys_depend_on_the_master_key_and_the_purpose() {
        let (a, b) = (key(1), key(2));
        assert_eq!(
            *a.derive("x"),
            *key(1).derive("x"),
            "the same on every instance"
        );
        assert_ne!(*a.derive("x"), *a.derive("y"));
        assert_ne!(*a.derive("x"), *b.derive("x"));
        assert_ne!(
            &*a.derive("x"),
            &[1u8; KEY_LEN],
            "not the master key itself"
        );
    }

    #[test]
    fn master_key_parsing_and_redaction() {
        let k = MasterKey::generate();
        let b64 = k.to_base64();
        let again = MasterKey::from_base64(&format!(" {b64}\n")).unwrap();
        assert_eq!(
            open(&again, &seal(&k, b"x", b"a"), b"a")
                .unwrap()
                .as_slice(),
            b"x"
        );
        assert_eq!(format!("{k:?}"), "MasterKey(<redacted>)");
        assert!(!format!("{k:?}").contains(&b64));
        assert_eq!(
            MasterKey::from_base64("not base64!").unwrap_err(),
            SealError::KeyNotBase64
        );
        assert_eq!(
            MasterKey::from_base64(&STANDARD.encode([0u8; 16])).unwrap_err(),
            SealError::KeyLength(16)
        );
        let parsed: MasterKey = serde_json::from_str(&format!("\"{b64}\"")).unwrap();
        assert_eq!(parsed.to_base64(), b64);
        let err = serde_json::from_str::<MasterKey>("\"AAAA\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("32 bytes"), "{err}");
    }
}
