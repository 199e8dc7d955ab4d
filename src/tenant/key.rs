//! Tenant API keys: `hlk_<id>_<secret>`, where `<id>` is the key id's 32 hex digits and
//! `<secret>` 32 random bytes (base64url). The id in the key lets the API find the one record
//! to compare with instead of hashing against every key; the record holds the key's SHA-256
//! hash only, compared in constant time. A key carries 256 random bits, so a plain hash is as
//! strong as a slow one would be, and the check costs microseconds.

use std::fmt;
use std::time::SystemTime;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand_core::{OsRng, RngCore};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use super::{Scope, TenantError, invalid};
use crate::id::Tenant;

/// What every tenant API key starts with.
pub const KEY_PREFIX: &str = "hlk_";
/// Longest key name.
pub const MAX_KEY_NAME: usize = 100;
const ID_PREFIX: &str = "tk_";
const ID_HEX: usize = 32;
const SECRET_BYTES: usize = 32;

/// A key's id: `tk_` and 32 lowercase hex digits (a UUIDv7, so ids sort by creation). Not
/// secret: it is listed, logged and recorded in replay audits.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TenantKeyId(String);

impl TenantKeyId {
    /// A fresh id.
    pub fn generate() -> TenantKeyId {
        TenantKeyId(format!("{ID_PREFIX}{}", uuid::Uuid::now_v7().simple()))
    }

    /// Reads an id; `None` unless it is `tk_` and 32 lowercase hex digits.
    pub fn parse(s: &str) -> Option<TenantKeyId> {
        let hex = s.strip_prefix(ID_PREFIX)?;
        is_hex(hex).then(|| TenantKeyId(s.to_owned()))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn hex(&self) -> &str {
        &self.0[ID_PREFIX.len()..]
    }
}

fn is_hex(s: &str) -> bool {
    s.len() == ID_HEX && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl TryFrom<String> for TenantKeyId {
    type Error = TenantError;
    fn try_from(s: String) -> Result<TenantKeyId, TenantError> {
        TenantKeyId::parse(&s)
            .ok_or_else(|| invalid("id", "is not a key id (tk_ and 32 hex digits)"))
    }
}

impl From<TenantKeyId> for String {
    fn from(k: TenantKeyId) -> String {
        k.0
    }
}

impl fmt::Display for TenantKeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for TenantKeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TenantKeyId({:?})", self.0)
    }
}

/// The id a presented bearer token names, when it has the shape of a tenant API key.
pub fn key_id_of(presented: &str) -> Option<TenantKeyId> {
    let rest = presented.strip_prefix(KEY_PREFIX)?;
    let (hex, secret) = rest.split_at_checked(ID_HEX)?;
    let secret = secret.strip_prefix('_')?;
    (!secret.is_empty() && is_hex(hex)).then(|| TenantKeyId(format!("{ID_PREFIX}{hex}")))
}

/// A tenant API key itself, handed to its owner once. Wiped on drop, `<redacted>` in `Debug`.
pub struct ApiKey(Zeroizing<String>);

impl ApiKey {
    /// A fresh key for `id`.
    fn generate(id: &TenantKeyId) -> ApiKey {
        let mut secret = Zeroizing::new([0u8; SECRET_BYTES]);
        OsRng.fill_bytes(&mut secret[..]);
        ApiKey(Zeroizing::new(format!(
            "{KEY_PREFIX}{}_{}",
            id.hex(),
            URL_SAFE_NO_PAD.encode(&secret[..])
        )))
    }

    /// The key, for the one answer that shows it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// The SHA-256 of a key, the only form stored; lowercase hex in the record. `<redacted>` in
/// `Debug`, as it is of no use to a reader of logs.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct KeyHash([u8; 32]);

impl KeyHash {
    /// The hash of `presented`.
    pub fn of(presented: &str) -> KeyHash {
        KeyHash(Sha256::digest(presented.as_bytes()).into())
    }

    /// Whether `presented` hashes to this, compared in constant time.
    pub fn matches(&self, presented: &str) -> bool {
        KeyHash::of(presented).0.ct_eq(&self.0).into()
    }
}

impl fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyHash(<redacted>)")
    }
}

impl TryFrom<String> for KeyHash {
    type Error = TenantError;
    fn try_from(s: String) -> Result<KeyHash, TenantError> {
        let bad = || invalid("hash", "is not 64 hex digits");
        if s.len() != 64 {
            return Err(bad());
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(s.get(2 * i..2 * i + 2).ok_or_else(bad)?, 16)
                .map_err(|_| bad())?;
        }
        Ok(KeyHash(out))
    }
}

impl From<KeyHash> for String {
    fn from(h: KeyHash) -> String {
        h.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// A tenant API key as the registry keeps it (the JSON value of its record): never the key.
/// Unknown fields are tolerated, so an older instance reads a newer one's records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantKey {
    /// `tk_...`.
    pub id: TenantKeyId,
    /// The tenant it acts for.
    pub tenant: Tenant,
    /// What it may do.
    pub scope: Scope,
    /// Its owner's label for it.
    #[serde(default)]
    pub name: Option<String>,
    /// SHA-256 of the key.
    pub hash: KeyHash,
    /// When it was issued.
    #[serde(with = "humantime_serde")]
    pub created_at: SystemTime,
    /// When it was revoked; refused from then on.
    #[serde(default, with = "humantime_serde")]
    pub revoked_at: Option<SystemTime>,
}

impl TenantKey {
    /// A new key for `tenant`: its record and the key itself (to be shown once, then dropped).
    /// The name, when given, is 1 to [`MAX_KEY_NAME`] characters without control characters.
    pub fn issue(
        tenant: Tenant,
        scope: Scope,
        name: Option<String>,
        now: SystemTime,
    ) -> Result<(TenantKey, ApiKey), TenantError> {
        check_name(name.as_deref())?;
        let id = TenantKeyId::generate();
        let key = ApiKey::generate(&id);
        let record = TenantKey {
            hash: KeyHash::of(key.expose()),
            id,
            tenant,
            scope,
            name,
            created_at: now,
            revoked_at: None,
        };
        Ok((record, key))
    }

    /// Whether `presented` is this key and it is not revoked.
    pub fn accepts(&self, presented: &str) -> bool {
        // Hash and compare first, so a revoked key takes as long to refuse as a wrong one.
        self.hash.matches(presented) && self.revoked_at.is_none()
    }

    /// Checks a stored record's fields.
    pub fn validate(&self) -> Result<(), TenantError> {
        check_name(self.name.as_deref())
    }
}

fn check_name(name: Option<&str>) -> Result<(), TenantError> {
    match name {
        Some(n) if n.trim().is_empty() => Err(invalid("name", "must not be blank when given")),
        Some(n) if n.chars().count() > MAX_KEY_NAME => Err(invalid(
            "name",
            format!("must be at most {MAX_KEY_NAME} characters"),
        )),
        Some(n) if n.chars().any(char::is_control) => {
            Err(invalid("name", "must not contain control characters"))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acme() -> Tenant {
        Tenant::parse("acme").unwrap()
    }

    #[test]
    fn a_key_names_its_id_and_only_its_hash_is_kept() {
        let now = SystemTime::now();
        let (record, key) = TenantKey::issue(acme(), Scope::Read, Some("ci".into()), now).unwrap();
        assert!(key.expose().starts_with("hlk_"));
        assert_eq!(key_id_of(key.expose()), Some(record.id.clone()));
        assert!(record.accepts(key.expose()));
        assert!(!record.accepts(&format!("{}x", key.expose())));
        let json = serde_json::to_string(&record).unwrap();
        assert!(!json.contains(key.expose()), "{json}");
        let back: TenantKey = serde_json::from_str(&json).unwrap();
        assert_eq!(back, record);
        for shown in [format!("{key:?}"), format!("{record:?}")] {
            assert!(!shown.contains(key.expose()), "{shown}");
            assert!(
                !shown.contains(&String::from(record.hash.clone())),
                "{shown}"
            );
        }
        let mut revoked = record.clone();
        revoked.revoked_at = Some(now);
        assert!(!revoked.accepts(key.expose()));
    }

    #[test]
    fn ids_and_keys_of_the_wrong_shape_are_refused() {
        let id = TenantKeyId::generate();
        assert_eq!(TenantKeyId::parse(id.as_str()), Some(id.clone()));
        for bad in ["", "tk_", "tk_0123", "ep_0123456789abcdef0123456789abcdef"] {
            assert_eq!(TenantKeyId::parse(bad), None, "{bad}");
        }
        let hex = id.hex();
        assert_eq!(key_id_of(&format!("hlk_{hex}_s3cret")), Some(id.clone()));
        for bad in [
            format!("hlk_{hex}_"),
            format!("hlk_{hex}"),
            format!("hlk_{}_x", &hex[..31]),
            format!("hlx_{hex}_x"),
            "hlk_".to_owned(),
            "hlk_é".to_owned(),
        ] {
            assert_eq!(key_id_of(&bad), None, "{bad}");
        }
        assert!(serde_json::from_str::<KeyHash>("\"zz\"").is_err());
    }

    #[test]
    fn names_are_checked() {
        let now = SystemTime::now();
        for (name, expected) in [
            (" ", "name: must not be blank when given"),
            ("a\nb", "name: must not contain control characters"),
        ] {
            let err = TenantKey::issue(acme(), Scope::Write, Some(name.into()), now).unwrap_err();
            assert_eq!(err.to_string(), expected);
        }
        let long = "x".repeat(MAX_KEY_NAME + 1);
        assert!(TenantKey::issue(acme(), Scope::Write, Some(long), now).is_err());
        assert!(TenantKey::issue(acme(), Scope::Write, None, now).is_ok());
    }
}
