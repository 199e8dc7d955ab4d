//! Key newtypes: parsing from and exposing as the prefixed string forms, generation from the OS
//! RNG, and redacted `Debug`/`Display`.

use std::fmt;
use std::str::FromStr;

use base64::Engine as _;
use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use rand_core::{OsRng, RngCore};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

const WHSEC: &str = "whsec_";
const WHSK: &str = "whsk_";
const WHPK: &str = "whpk_";

/// Standard alphabet that accepts keys with or without `=` padding: the Standard Webhooks
/// reference libraries accept both, and a 24-byte secret has no padding at all.
pub(crate) const KEY_BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Why a key string was refused. Messages name the problem and never echo the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyParseError {
    /// The string does not start with a prefix this kind of key accepts.
    #[error("secret must start with {expected}")]
    MissingPrefix {
        /// The accepted prefix(es), e.g. `whsec_` or `whsec_ or whsk_`.
        expected: &'static str,
    },
    /// What follows the prefix is not standard base64.
    #[error("secret is not valid base64 after its {prefix} prefix")]
    NotBase64 {
        /// The prefix that was recognised.
        prefix: &'static str,
    },
    /// An HMAC secret shorter than the Standard Webhooks minimum.
    #[error("secret decodes to {len} bytes; at least {min} are required")]
    TooShort {
        /// Decoded length.
        len: usize,
        /// Minimum accepted length.
        min: usize,
    },
    /// An Ed25519 key of the wrong size.
    #[error("{prefix} key decodes to {len} bytes; {expected} are expected")]
    WrongLength {
        /// The prefix that was recognised.
        prefix: &'static str,
        /// Decoded length.
        len: usize,
        /// The accepted sizes, in words.
        expected: &'static str,
    },
    /// A 64-byte `whsk_` whose public half is not derived from its seed half.
    #[error("whsk_ key pair's public half does not belong to its secret half")]
    KeypairMismatch,
    /// 32 bytes that are not a point on the Ed25519 curve.
    #[error("whpk_ key is not a valid Ed25519 public key")]
    InvalidPublicKey,
}

/// Decodes the base64 after `prefix` into a buffer that is zeroized on drop. The buffer is sized
/// up front so decoding never reallocates and leaves an unzeroized copy behind.
fn decode_key(s: &str, prefix: &'static str) -> Result<Zeroizing<Vec<u8>>, KeyParseError> {
    let b64 = s
        .strip_prefix(prefix)
        .ok_or(KeyParseError::MissingPrefix { expected: prefix })?;
    let mut bytes = Zeroizing::new(Vec::with_capacity(base64::decoded_len_estimate(b64.len())));
    KEY_BASE64
        .decode_vec(b64, &mut bytes)
        .map_err(|_| KeyParseError::NotBase64 { prefix })?;
    Ok(bytes)
}

/// `prefix` + base64, in a string that is zeroized on drop.
fn encode_key(prefix: &str, bytes: &[u8]) -> Zeroizing<String> {
    let mut s = Zeroizing::new(String::with_capacity(
        prefix.len() + base64::encoded_len(bytes.len(), true).unwrap_or(0),
    ));
    s.push_str(prefix);
    base64::engine::general_purpose::STANDARD.encode_string(bytes, &mut s);
    s
}

/// First 4 bytes (8 hex digits) of a domain-separated SHA-256: enough for an operator to tell keys
/// apart in logs, useless for recovering a secret of 24+ random bytes.
fn fingerprint(bytes: &[u8]) -> String {
    let digest = Sha256::new()
        .chain_update(b"hookline key fingerprint\0")
        .chain_update(bytes)
        .finalize();
    digest[..4].iter().map(|b| format!("{b:02x}")).collect()
}

/// A symmetric Standard Webhooks secret (`whsec_` + base64), the HMAC-SHA256 key of `v1`
/// signatures. Zeroized on drop; `Debug` and `Display` show only a fingerprint.
#[derive(Clone)]
pub struct SigningSecret {
    bytes: Zeroizing<Vec<u8>>,
}

impl SigningSecret {
    /// Bytes in a freshly generated secret (256 bits, the HMAC-SHA256 block-size sweet spot).
    pub const GENERATED_LEN: usize = 32;
    /// Shortest secret accepted, the Standard Webhooks minimum (192 bits), so secrets made by
    /// other Standard Webhooks senders can be imported.
    pub const MIN_LEN: usize = 24;

    /// A new random secret of [`Self::GENERATED_LEN`] bytes from the operating system's RNG.
    pub fn generate() -> Self {
        let mut bytes = Zeroizing::new(vec![0u8; Self::GENERATED_LEN]);
        OsRng.fill_bytes(&mut bytes);
        Self { bytes }
    }

    /// A secret from raw bytes (at least [`Self::MIN_LEN`]). The caller's copy is not zeroized.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, KeyParseError> {
        Self::from_zeroizing(Zeroizing::new(bytes.to_vec()))
    }

    fn from_zeroizing(bytes: Zeroizing<Vec<u8>>) -> Result<Self, KeyParseError> {
        // No upper bound: the spec suggests at most 64 bytes, but HMAC takes any key length and
        // refusing a longer secret would only block importing an endpoint from another sender.
        if bytes.len() < Self::MIN_LEN {
            return Err(KeyParseError::TooShort {
                len: bytes.len(),
                min: Self::MIN_LEN,
            });
        }
        Ok(Self { bytes })
    }

    /// The `whsec_...` string form, for storing (encrypted) or showing to the endpoint's owner
    /// once. Named `expose` so every place that reveals a secret is easy to find.
    pub fn expose_whsec(&self) -> Zeroizing<String> {
        encode_key(WHSEC, &self.bytes)
    }

    /// Short fingerprint of the key bytes (8 hex digits), safe for logs.
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.bytes)
    }

    pub(super) fn expose_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl FromStr for SigningSecret {
    type Err = KeyParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::from_zeroizing(decode_key(s, WHSEC)?)
    }
}

impl fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SigningSecret(whsec_<redacted> fp={})",
            self.fingerprint()
        )
    }
}

impl fmt::Display for SigningSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "whsec_<redacted fp={}>", self.fingerprint())
    }
}

/// An Ed25519 signing key (`whsk_` + base64), producing `v1a` signatures.
///
/// The spec says only "standard ed25519 key pair". hookline writes the 64-byte key pair (32-byte
/// seed followed by the 32-byte public key, the RFC 8032 / libsodium layout that Svix also uses)
/// and reads either that or a bare 32-byte seed. Zeroized on drop (ed25519-dalek does it);
/// `Debug`/`Display` show only the public key's fingerprint.
#[derive(Clone)]
pub struct Ed25519SigningKey {
    key: ed25519_dalek::SigningKey,
}

impl Ed25519SigningKey {
    /// A new random key pair from the operating system's RNG.
    pub fn generate() -> Self {
        Self {
            key: ed25519_dalek::SigningKey::generate(&mut OsRng),
        }
    }

    /// The public half, to hand to receivers as `whpk_...`.
    pub fn verifying_key(&self) -> Ed25519VerifyingKey {
        Ed25519VerifyingKey {
            key: self.key.verifying_key(),
        }
    }

    /// The `whsk_...` string form (64-byte key pair). See [`SigningSecret::expose_whsec`].
    pub fn expose_whsk(&self) -> Zeroizing<String> {
        let pair = Zeroizing::new(self.key.to_keypair_bytes());
        encode_key(WHSK, pair.as_slice())
    }

    /// Fingerprint of the public key (8 hex digits), matching its [`Ed25519VerifyingKey`].
    pub fn fingerprint(&self) -> String {
        fingerprint(self.key.verifying_key().as_bytes())
    }

    pub(super) fn dalek(&self) -> &ed25519_dalek::SigningKey {
        &self.key
    }
}

impl FromStr for Ed25519SigningKey {
    type Err = KeyParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::from_bytes(&decode_key(s, WHSK)?)
    }
}

impl Ed25519SigningKey {
    /// A key from its raw bytes: a 32-byte seed or a 64-byte key pair (seed then public key).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, KeyParseError> {
        let key = match bytes.len() {
            32 => {
                let mut seed = Zeroizing::new([0u8; 32]);
                seed.copy_from_slice(bytes);
                ed25519_dalek::SigningKey::from_bytes(&seed)
            }
            64 => {
                let mut pair = Zeroizing::new([0u8; 64]);
                pair.copy_from_slice(bytes);
                ed25519_dalek::SigningKey::from_keypair_bytes(&pair)
                    .map_err(|_| KeyParseError::KeypairMismatch)?
            }
            len => {
                return Err(KeyParseError::WrongLength {
                    prefix: WHSK,
                    len,
                    expected: "32 (seed) or 64 (key pair)",
                });
            }
        };
        Ok(Self { key })
    }
}

impl fmt::Debug for Ed25519SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Ed25519SigningKey(whsk_<redacted> fp={})",
            self.fingerprint()
        )
    }
}

impl fmt::Display for Ed25519SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "whsk_<redacted fp={}>", self.fingerprint())
    }
}

/// An Ed25519 public key (`whpk_` + base64 of 32 bytes) that checks `v1a` signatures. Not a
/// secret: `Display` is the full `whpk_...` form receivers are given.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Ed25519VerifyingKey {
    key: ed25519_dalek::VerifyingKey,
}

impl Ed25519VerifyingKey {
    /// Fingerprint (8 hex digits), the same as the signing key it belongs to.
    pub fn fingerprint(&self) -> String {
        fingerprint(self.key.as_bytes())
    }

    pub(super) fn dalek(&self) -> &ed25519_dalek::VerifyingKey {
        &self.key
    }
}

impl FromStr for Ed25519VerifyingKey {
    type Err = KeyParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bytes = decode_key(s, WHPK)?;
        let raw: [u8; 32] =
            bytes
                .as_slice()
                .try_into()
                .map_err(|_| KeyParseError::WrongLength {
                    prefix: WHPK,
                    len: bytes.len(),
                    expected: "32",
                })?;
        let key = ed25519_dalek::VerifyingKey::from_bytes(&raw)
            .map_err(|_| KeyParseError::InvalidPublicKey)?;
        Ok(Self { key })
    }
}

impl fmt::Display for Ed25519VerifyingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&encode_key(WHPK, self.key.as_bytes()))
    }
}

impl fmt::Debug for Ed25519VerifyingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ed25519VerifyingKey({self})")
    }
}

/// A key hookline signs with, chosen by its prefix: `whsec_` (HMAC, `v1`) or `whsk_` (Ed25519,
/// `v1a`). `Debug` is redacted by the inner types.
#[derive(Clone, Debug)]
pub enum SigningKey {
    /// Symmetric HMAC-SHA256 secret.
    Hmac(SigningSecret),
    /// Asymmetric Ed25519 key pair.
    Ed25519(Ed25519SigningKey),
}

impl SigningKey {
    /// The key a receiver needs to check this key's signatures (the same secret for HMAC, the
    /// public half for Ed25519).
    pub fn verification_key(&self) -> VerificationKey {
        match self {
            Self::Hmac(secret) => VerificationKey::Hmac(secret.clone()),
            Self::Ed25519(key) => VerificationKey::Ed25519(key.verifying_key()),
        }
    }

    /// The prefixed string form (`whsec_...` or `whsk_...`). See [`SigningSecret::expose_whsec`].
    pub fn expose(&self) -> Zeroizing<String> {
        match self {
            Self::Hmac(secret) => secret.expose_whsec(),
            Self::Ed25519(key) => key.expose_whsk(),
        }
    }

    /// Fingerprint of the key (8 hex digits), safe for logs.
    pub fn fingerprint(&self) -> String {
        match self {
            Self::Hmac(secret) => secret.fingerprint(),
            Self::Ed25519(key) => key.fingerprint(),
        }
    }
}

impl FromStr for SigningKey {
    type Err = KeyParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.starts_with(WHSEC) {
            s.parse().map(Self::Hmac)
        } else if s.starts_with(WHSK) {
            s.parse().map(Self::Ed25519)
        } else {
            Err(KeyParseError::MissingPrefix {
                expected: "whsec_ or whsk_",
            })
        }
    }
}

impl fmt::Display for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Hmac(secret) => fmt::Display::fmt(secret, f),
            Self::Ed25519(key) => fmt::Display::fmt(key, f),
        }
    }
}

impl From<SigningSecret> for SigningKey {
    fn from(secret: SigningSecret) -> Self {
        Self::Hmac(secret)
    }
}

impl From<Ed25519SigningKey> for SigningKey {
    fn from(key: Ed25519SigningKey) -> Self {
        Self::Ed25519(key)
    }
}

/// A key a receiver checks signatures with: `whsec_` (HMAC, `v1`) or `whpk_` (Ed25519, `v1a`).
/// A `whsk_` string is accepted too and reduced to its public half, which is convenient for
/// `hookline verify` and never weaker than the public key alone.
#[derive(Clone, Debug)]
pub enum VerificationKey {
    /// Symmetric HMAC-SHA256 secret.
    Hmac(SigningSecret),
    /// Ed25519 public key.
    Ed25519(Ed25519VerifyingKey),
}

impl FromStr for VerificationKey {
    type Err = KeyParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.starts_with(WHSEC) {
            s.parse().map(Self::Hmac)
        } else if s.starts_with(WHPK) {
            s.parse().map(Self::Ed25519)
        } else if s.starts_with(WHSK) {
            s.parse::<Ed25519SigningKey>()
                .map(|k| Self::Ed25519(k.verifying_key()))
        } else {
            Err(KeyParseError::MissingPrefix {
                expected: "whsec_ or whpk_",
            })
        }
    }
}

impl From<SigningSecret> for VerificationKey {
    fn from(secret: SigningSecret) -> Self {
        Self::Hmac(secret)
    }
}

impl From<Ed25519VerifyingKey> for VerificationKey {
    fn from(key: Ed25519VerifyingKey) -> Self {
        Self::Ed25519(key)
    }
}
