//! Standard Webhooks signatures: what hookline puts on every attempt and what receivers check.
//!
//! The signed content is `{webhook-id}.{webhook-timestamp}.{body}` over the exact body bytes that
//! travel in the Kafka record. Symmetric keys (`whsec_`) give `v1,<base64 HMAC-SHA256>`; asymmetric
//! keys (`whsk_` to sign, `whpk_` to verify) give `v1a,<base64 Ed25519>`. One signature per active
//! key, space separated, so a receiver keeps working while a secret is rotated.
//!
//! - [`SigningKey`], [`VerificationKey`] and the concrete [`SigningSecret`],
//!   [`Ed25519SigningKey`], [`Ed25519VerifyingKey`]: parsed from and exposed as their prefixed
//!   string form; `Debug`/`Display` never show key material.
//! - [`Signer`]: the keys active for one endpoint, prepared once, signing every attempt.
//! - [`Verifier`]: the receiver side (also a public API for Rust receivers).
//!
//! Timestamps are Unix seconds as `u64` throughout: the header cannot carry anything before 1970,
//! and using an unsigned type means hookline can never sign a timestamp it would refuse to verify.

mod key;
mod signer;
mod verify;

pub(crate) use key::KEY_BASE64;
pub use key::{
    Ed25519SigningKey, Ed25519VerifyingKey, KeyParseError, SigningKey, SigningSecret,
    VerificationKey,
};
pub use signer::{NoActiveKey, Signer, SignerKey, WebhookHeaders};
pub use verify::{DEFAULT_TOLERANCE, FormatError, SignedHeaders, Verifier, VerifyError, verify};

/// Header carrying the message id: the event id, stable across retries, replays and endpoints.
pub const HEADER_ID: &str = "webhook-id";
/// Header carrying the attempt time in Unix seconds; fresh on every attempt.
pub const HEADER_TIMESTAMP: &str = "webhook-timestamp";
/// Header carrying the space-separated `v1,...` / `v1a,...` signatures.
pub const HEADER_SIGNATURE: &str = "webhook-signature";

/// The current time in Unix seconds, the unit of `webhook-timestamp`.
///
/// A clock before 1970 reads as 0, which any verifier will then call stale: a loud failure rather
/// than a panic in the delivery path.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// Decimal digits of `n` in a stack buffer, so signing never allocates to format the timestamp.
fn timestamp_digits(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut start = buf.len();
    loop {
        start -= 1;
        // The remainder is below 10, so the cast cannot truncate.
        buf[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buf[start..]
}

/// HMAC-SHA256 of the signed content, fed piecewise into a clone of a pre-keyed state: no
/// concatenated copy of the body, and the key's two padding blocks are not hashed again.
fn hmac_tag(keyed: &HmacSha256, id: &[u8], timestamp: &[u8], body: &[u8]) -> [u8; 32] {
    use hmac::Mac;
    let mut mac = keyed.clone();
    mac.update(id);
    mac.update(b".");
    mac.update(timestamp);
    mac.update(b".");
    mac.update(body);
    mac.finalize().into_bytes().into()
}

/// The signed content as one buffer, for Ed25519, whose message is hashed twice and therefore
/// cannot be streamed.
fn signed_content(id: &[u8], timestamp: &[u8], body: &[u8]) -> Vec<u8> {
    let mut content = Vec::with_capacity(id.len() + timestamp.len() + body.len() + 2);
    content.extend_from_slice(id);
    content.push(b'.');
    content.extend_from_slice(timestamp);
    content.push(b'.');
    content.extend_from_slice(body);
    content
}

#[cfg(test)]
mod tests;
