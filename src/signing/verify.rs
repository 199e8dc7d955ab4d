//! The receiving side: check a webhook's headers and body against trusted keys.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::Mac as _;
use subtle::ConstantTimeEq as _;

use super::key::VerificationKey;
use super::{
    HEADER_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP, HmacSha256, hmac_tag, signed_content,
    timestamp_digits,
};

/// Accepted clock difference when none is given: 5 minutes, as the reference verifiers use.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

/// More entries than any rotation needs; the cap stops one request from costing a receiver
/// thousands of Ed25519 verifications.
const MAX_SIGNATURES: usize = 32;

/// What is malformed in a webhook's headers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// `webhook-timestamp` is not plain decimal Unix seconds (digits only, no leading zero).
    #[error("webhook-timestamp is not decimal Unix seconds")]
    Timestamp,
    /// A signature entry has no `,` between version and signature.
    #[error("webhook-signature entry is not `version,signature`")]
    Entry,
    /// A `v1`/`v1a` signature is not standard base64.
    #[error("{version} signature is not valid base64")]
    Base64 {
        /// The entry's version.
        version: &'static str,
    },
    /// A `v1`/`v1a` signature decodes to the wrong number of bytes.
    #[error("{version} signature has {len} bytes, expected {expected}")]
    Length {
        /// The entry's version.
        version: &'static str,
        /// Decoded length.
        len: usize,
        /// Length of that version's signatures.
        expected: usize,
    },
    /// More signatures than any legitimate sender would attach.
    #[error("webhook-signature has more than {MAX_SIGNATURES} entries")]
    TooMany,
}

/// Why a webhook was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// A required header is absent or empty.
    #[error("missing header {0}")]
    MissingHeader(&'static str),
    /// A header is present but malformed (and no other signature matched).
    #[error("malformed header: {0}")]
    BadFormat(#[from] FormatError),
    /// The timestamp is older than the tolerance allows (possible replay).
    #[error("timestamp is {age_secs} s old, beyond the {tolerance_secs} s tolerance")]
    Stale {
        /// Seconds between the timestamp and now.
        age_secs: u64,
        /// The tolerance in force.
        tolerance_secs: u64,
    },
    /// The timestamp is further in the future than the tolerance allows.
    #[error("timestamp is {ahead_secs} s in the future, beyond the {tolerance_secs} s tolerance")]
    Future {
        /// Seconds between now and the timestamp.
        ahead_secs: u64,
        /// The tolerance in force.
        tolerance_secs: u64,
    },
    /// The headers are well formed but no signature matches any key.
    #[error("no signature matches any of the keys")]
    NoMatch,
}

/// The three header values of a received webhook, borrowed from the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignedHeaders<'a> {
    /// `webhook-id` value.
    pub id: &'a str,
    /// `webhook-timestamp` value.
    pub timestamp: &'a str,
    /// `webhook-signature` value.
    pub signature: &'a str,
}

impl<'a> SignedHeaders<'a> {
    /// Reads the three headers through `lookup` (called with the lower-case header names), e.g.
    /// `|name| request.headers().get(name)?.to_str().ok()`. Absent or empty values are
    /// [`VerifyError::MissingHeader`].
    pub fn from_lookup(
        mut lookup: impl FnMut(&'static str) -> Option<&'a str>,
    ) -> Result<Self, VerifyError> {
        let mut get = |name| {
            lookup(name)
                .filter(|v| !v.is_empty())
                .ok_or(VerifyError::MissingHeader(name))
        };
        Ok(Self {
            id: get(HEADER_ID)?,
            timestamp: get(HEADER_TIMESTAMP)?,
            signature: get(HEADER_SIGNATURE)?,
        })
    }
}

/// Checks webhooks against a set of trusted keys. Build it once per endpoint; HMAC keys are
/// prepared up front so each check hashes only the message.
#[derive(Clone)]
pub struct Verifier {
    hmac: Vec<HmacSha256>,
    ed25519: Vec<ed25519_dalek::VerifyingKey>,
    tolerance: Duration,
}

impl Verifier {
    /// A verifier accepting a signature by any of `keys`, with [`DEFAULT_TOLERANCE`].
    pub fn new<'a>(keys: impl IntoIterator<Item = &'a VerificationKey>) -> Self {
        let mut hmac = Vec::new();
        let mut ed25519 = Vec::new();
        for key in keys {
            match key {
                VerificationKey::Hmac(secret) => hmac.push(
                    HmacSha256::new_from_slice(secret.expose_bytes())
                        .expect("HMAC accepts keys of any length"),
                ),
                VerificationKey::Ed25519(key) => ed25519.push(*key.dalek()),
            }
        }
        Self {
            hmac,
            ed25519,
            tolerance: DEFAULT_TOLERANCE,
        }
    }

    /// The same verifier accepting timestamps up to `tolerance` away from now, in both
    /// directions (whole seconds; the sub-second part is ignored).
    pub fn with_tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// The tolerance in force.
    pub fn tolerance(&self) -> Duration {
        self.tolerance
    }

    /// Checks `headers` and `body` at `now` (Unix seconds): `Ok(())` if the timestamp is within
    /// tolerance and any known-version signature matches any key. Unknown versions are skipped.
    pub fn verify(
        &self,
        headers: &SignedHeaders<'_>,
        body: &[u8],
        now: u64,
    ) -> Result<(), VerifyError> {
        for (name, value) in [
            (HEADER_ID, headers.id),
            (HEADER_TIMESTAMP, headers.timestamp),
            (HEADER_SIGNATURE, headers.signature),
        ] {
            if value.is_empty() {
                return Err(VerifyError::MissingHeader(name));
            }
        }
        let timestamp = parse_timestamp(headers.timestamp)?;
        self.check_time(timestamp, now)?;
        let entries = Entries::parse(headers.signature)?;

        // The timestamp is canonical, so its digits are exactly the header's bytes.
        let mut digits = [0u8; 20];
        let ts = timestamp_digits(timestamp, &mut digits);
        let id = headers.id.as_bytes();

        if !entries.v1.is_empty() {
            for keyed in &self.hmac {
                let tag = hmac_tag(keyed, id, ts, body);
                // Early return only tells the sender which of its own signatures matched; each
                // comparison itself is constant-time so the expected tag is never leaked.
                if entries.v1.iter().any(|sig| bool::from(sig.ct_eq(&tag))) {
                    return Ok(());
                }
            }
        }
        if !entries.v1a.is_empty() && !self.ed25519.is_empty() {
            let content = signed_content(id, ts, body);
            for key in &self.ed25519 {
                for sig in &entries.v1a {
                    let sig = ed25519_dalek::Signature::from_bytes(sig);
                    if key.verify_strict(&content, &sig).is_ok() {
                        return Ok(());
                    }
                }
            }
        }
        Err(entries
            .malformed
            .map_or(VerifyError::NoMatch, VerifyError::BadFormat))
    }

    /// [`Verifier::verify`] reading the headers through `lookup`; see
    /// [`SignedHeaders::from_lookup`].
    pub fn verify_lookup<'a>(
        &self,
        lookup: impl FnMut(&'static str) -> Option<&'a str>,
        body: &[u8],
        now: u64,
    ) -> Result<(), VerifyError> {
        self.verify(&SignedHeaders::from_lookup(lookup)?, body, now)
    }

    fn check_time(&self, timestamp: u64, now: u64) -> Result<(), VerifyError> {
        let tolerance_secs = self.tolerance.as_secs();
        if timestamp < now {
            let age_secs = now - timestamp;
            if age_secs > tolerance_secs {
                return Err(VerifyError::Stale {
                    age_secs,
                    tolerance_secs,
                });
            }
        } else {
            let ahead_secs = timestamp - now;
            if ahead_secs > tolerance_secs {
                return Err(VerifyError::Future {
                    ahead_secs,
                    tolerance_secs,
                });
            }
        }
        Ok(())
    }
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("hmac_keys", &self.hmac.len())
            .field("ed25519_keys", &self.ed25519.len())
            .field("tolerance", &self.tolerance)
            .finish()
    }
}

/// One-shot form of [`Verifier::verify`] for callers that do not keep a [`Verifier`].
pub fn verify(
    headers: &SignedHeaders<'_>,
    body: &[u8],
    keys: &[VerificationKey],
    tolerance: Duration,
    now: u64,
) -> Result<(), VerifyError> {
    Verifier::new(keys)
        .with_tolerance(tolerance)
        .verify(headers, body, now)
}

/// Only canonical decimal is accepted, so that the bytes hookline hashes are both the header as
/// sent and the integer every other verifier re-formats it to.
fn parse_timestamp(s: &str) -> Result<u64, FormatError> {
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if !canonical {
        return Err(FormatError::Timestamp);
    }
    s.parse().map_err(|_| FormatError::Timestamp)
}

/// The known-version signatures of a `webhook-signature` value, decoded.
struct Entries {
    v1: Vec<[u8; 32]>,
    v1a: Vec<[u8; 64]>,
    /// The first malformed entry, reported only if nothing else matches: one bad entry must not
    /// veto a good one, as newer senders may add entries older receivers cannot read.
    malformed: Option<FormatError>,
}

impl Entries {
    fn parse(header: &str) -> Result<Self, FormatError> {
        let mut entries = Entries {
            v1: Vec::new(),
            v1a: Vec::new(),
            malformed: None,
        };
        // Split on any run of spaces: a doubled space is sloppy, not a different signature.
        for (n, entry) in header.split(' ').filter(|e| !e.is_empty()).enumerate() {
            if n == MAX_SIGNATURES {
                return Err(FormatError::TooMany);
            }
            let Some((version, sig)) = entry.split_once(',') else {
                entries.malformed.get_or_insert(FormatError::Entry);
                continue;
            };
            let result = match version {
                "v1" => decode_sig::<32>("v1", sig).map(|s| entries.v1.push(s)),
                "v1a" => decode_sig::<64>("v1a", sig).map(|s| entries.v1a.push(s)),
                // Unknown versions belong to schemes this receiver does not know: skip them.
                _ => Ok(()),
            };
            if let Err(e) = result {
                entries.malformed.get_or_insert(e);
            }
        }
        Ok(entries)
    }
}

fn decode_sig<const N: usize>(version: &'static str, sig: &str) -> Result<[u8; N], FormatError> {
    // Room for the longest signature (v1a, 88 base64 characters); longer input fails below.
    let mut buf = [0u8; 66];
    let len = STANDARD.decode_slice(sig, &mut buf).map_err(|e| match e {
        base64::DecodeSliceError::OutputSliceTooSmall => FormatError::Length {
            version,
            len: base64::decoded_len_estimate(sig.len()),
            expected: N,
        },
        base64::DecodeSliceError::DecodeError(_) => FormatError::Base64 { version },
    })?;
    buf[..len].try_into().map_err(|_| FormatError::Length {
        version,
        len,
        expected: N,
    })
}
