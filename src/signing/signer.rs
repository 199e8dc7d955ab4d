//! The sending side: an endpoint's active keys, prepared once and used on every attempt.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ed25519_dalek::Signer as _;
use hmac::Mac as _;

use super::key::SigningKey;
use super::{
    HEADER_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP, HmacSha256, hmac_tag, signed_content,
    timestamp_digits,
};

/// One of an endpoint's keys: the key, the id the attempt log and DLQ record for it, and when it
/// stops signing (rotation keeps the old key signing alongside the new one until then).
#[derive(Clone, Debug)]
pub struct SignerKey {
    /// Stable identifier of the key (not secret), recorded with attempts.
    pub key_id: String,
    /// The key itself.
    pub key: SigningKey,
    /// Unix seconds from which the key no longer signs; `None` signs until removed.
    pub expires_at: Option<u64>,
}

impl SignerKey {
    /// A key that does not expire.
    pub fn new(key_id: impl Into<String>, key: impl Into<SigningKey>) -> Self {
        Self {
            key_id: key_id.into(),
            key: key.into(),
            expires_at: None,
        }
    }

    /// The same key, signing only before `expires_at` (Unix seconds).
    pub fn expiring_at(mut self, expires_at: u64) -> Self {
        self.expires_at = Some(expires_at);
        self
    }

    /// Whether the key signs at `now` (Unix seconds): the expiry instant itself is already out.
    pub fn is_active_at(&self, now: u64) -> bool {
        self.expires_at.is_none_or(|at| now < at)
    }
}

/// Returned when a [`Signer`] would have no key: sending an unsigned webhook is never what an
/// endpoint asked for, so the caller has to decide what to do (dead-letter, disable, alert).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no signing key is active for this endpoint")]
pub struct NoActiveKey;

enum Prepared {
    // The keyed inner/outer SHA-256 states, computed once. They are as sensitive as the secret but
    // sha2 0.10 cannot zeroize them; they live exactly as long as the endpoint's Signer.
    Hmac(HmacSha256),
    Ed25519(ed25519_dalek::SigningKey),
}

struct PreparedKey {
    key_id: String,
    prepared: Prepared,
}

/// The keys that sign an endpoint's attempts, in the order their signatures appear in the header.
/// Always holds at least one key. Cheap to use from many tasks at once (`&self`, no locking).
pub struct Signer {
    keys: Vec<PreparedKey>,
    /// Exact length of one header value, so every signing allocates at most once.
    header_len: usize,
}

/// `v1,` + base64 of 32 bytes.
const V1_LEN: usize = 3 + 44;
/// `v1a,` + base64 of 64 bytes.
const V1A_LEN: usize = 4 + 88;

impl Signer {
    /// A signer using every given key, regardless of expiry (the pipeline passes only the keys
    /// active at send time; see [`Signer::active_at`] to filter here instead).
    pub fn new<'a>(keys: impl IntoIterator<Item = &'a SignerKey>) -> Result<Self, NoActiveKey> {
        let keys: Vec<PreparedKey> = keys
            .into_iter()
            .map(|k| PreparedKey {
                key_id: k.key_id.clone(),
                prepared: match &k.key {
                    SigningKey::Hmac(secret) => Prepared::Hmac(
                        HmacSha256::new_from_slice(secret.expose_bytes())
                            .expect("HMAC accepts keys of any length"),
                    ),
                    SigningKey::Ed25519(key) => Prepared::Ed25519(key.dalek().clone()),
                },
            })
            .collect();
        if keys.is_empty() {
            return Err(NoActiveKey);
        }
        let header_len = keys
            .iter()
            .map(|k| match k.prepared {
                Prepared::Hmac(_) => V1_LEN,
                Prepared::Ed25519(_) => V1A_LEN,
            })
            .sum::<usize>()
            + keys.len()
            - 1;
        Ok(Self { keys, header_len })
    }

    /// A signer using the keys active at `now` (Unix seconds).
    pub fn active_at<'a>(
        keys: impl IntoIterator<Item = &'a SignerKey>,
        now: u64,
    ) -> Result<Self, NoActiveKey> {
        Self::new(keys.into_iter().filter(|k| k.is_active_at(now)))
    }

    /// Ids of the keys that sign, in header order (for the attempt log and DLQ headers).
    pub fn key_ids(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|k| k.key_id.as_str())
    }

    /// Appends the `webhook-signature` value for (`id`, `timestamp`, `body`) to `out`. Reusing
    /// `out` across attempts makes signing allocation-free for HMAC keys.
    pub fn sign_into(&self, id: &str, timestamp: u64, body: &[u8], out: &mut String) {
        let mut digits = [0u8; 20];
        let ts = timestamp_digits(timestamp, &mut digits);
        out.reserve(self.header_len);
        // Ed25519 needs the content in one piece; build it at most once per call.
        let mut content: Option<Vec<u8>> = None;
        for (i, key) in self.keys.iter().enumerate() {
            if i > 0 {
                out.push(' ');
            }
            match &key.prepared {
                Prepared::Hmac(keyed) => {
                    out.push_str("v1,");
                    STANDARD.encode_string(hmac_tag(keyed, id.as_bytes(), ts, body), out);
                }
                Prepared::Ed25519(key) => {
                    let content =
                        content.get_or_insert_with(|| signed_content(id.as_bytes(), ts, body));
                    out.push_str("v1a,");
                    STANDARD.encode_string(key.sign(content).to_bytes(), out);
                }
            }
        }
    }

    /// The `webhook-signature` value for (`id`, `timestamp`, `body`).
    pub fn sign(&self, id: &str, timestamp: u64, body: &[u8]) -> String {
        let mut out = String::with_capacity(self.header_len);
        self.sign_into(id, timestamp, body, &mut out);
        out
    }

    /// All three Standard Webhooks headers for one attempt. `id` must be a valid header value
    /// (the event id); `timestamp` should be the attempt's send time.
    pub fn headers(&self, id: &str, timestamp: u64, body: &[u8]) -> WebhookHeaders {
        WebhookHeaders {
            id: id.to_owned(),
            timestamp: timestamp.to_string(),
            signature: self.sign(id, timestamp, body),
        }
    }
}

impl fmt::Debug for Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.keys.iter().map(|k| {
                let kind = match k.prepared {
                    Prepared::Hmac(_) => "v1",
                    Prepared::Ed25519(_) => "v1a",
                };
                (k.key_id.as_str(), kind)
            }))
            .finish()
    }
}

/// The three headers of one signed attempt, as values ready to put on the request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookHeaders {
    /// `webhook-id` value.
    pub id: String,
    /// `webhook-timestamp` value (Unix seconds, decimal).
    pub timestamp: String,
    /// `webhook-signature` value.
    pub signature: String,
}

impl WebhookHeaders {
    /// `(name, value)` pairs in the conventional order id, timestamp, signature.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            (HEADER_ID, self.id.as_str()),
            (HEADER_TIMESTAMP, self.timestamp.as_str()),
            (HEADER_SIGNATURE, self.signature.as_str()),
        ]
        .into_iter()
    }
}
