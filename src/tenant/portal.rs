//! Portal links: a stateless bearer token, `hlp_<payload>.<tag>`, where the payload is
//! base64url JSON naming the tenant, the scope and the expiry (Unix seconds), and the tag its
//! HMAC-SHA256 under a key derived from the master key. Every instance shares the master key,
//! so every instance accepts a link any of them issued, with nothing stored. A link cannot be
//! revoked before it expires; that is why it lives at most [`MAX_PORTAL_TTL`].

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::Mac;
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use super::Scope;
use crate::id::Tenant;
use crate::sealed::MasterKey;

/// What every portal-link token starts with.
pub const PORTAL_PREFIX: &str = "hlp_";
/// How long a link lives when the request does not say.
pub const DEFAULT_PORTAL_TTL: Duration = Duration::from_secs(3600);
/// The longest a link may live.
pub const MAX_PORTAL_TTL: Duration = Duration::from_secs(24 * 3600);
/// Longest token looked at; a real one is about 150 characters.
const MAX_TOKEN_LEN: usize = 1024;
const PURPOSE: &str = "hookline portal link v1";

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// What a portal link grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortalClaims {
    /// The tenant it acts for.
    pub tenant: Tenant,
    /// What it may do.
    pub scope: Scope,
    /// When it stops working (whole seconds).
    pub expires_at: SystemTime,
}

/// Why a portal-link token is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortalError {
    /// Not a token this service issued: malformed, or its tag does not match.
    #[error("the portal link is not valid")]
    Invalid,
    /// Issued here, but past its expiry.
    #[error("the portal link expired; ask for a new link")]
    Expired,
}

#[derive(Serialize, Deserialize)]
struct Payload {
    #[serde(rename = "t")]
    tenant: Tenant,
    #[serde(rename = "s")]
    scope: Scope,
    #[serde(rename = "e")]
    expires: u64,
}

/// Issues and checks portal-link tokens. `<redacted>` in `Debug`.
pub struct PortalSigner {
    key: Zeroizing<[u8; 32]>,
}

impl fmt::Debug for PortalSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PortalSigner(<redacted>)")
    }
}

impl PortalSigner {
    /// A signer whose key is derived from `master`.
    pub fn new(master: &MasterKey) -> PortalSigner {
        PortalSigner {
            key: master.derive(PURPOSE),
        }
    }

    fn mac(&self, payload: &str) -> HmacSha256 {
        let mut mac = <HmacSha256 as Mac>::new_from_slice(&self.key[..])
            .expect("HMAC takes a key of any length");
        mac.update(PORTAL_PREFIX.as_bytes());
        mac.update(payload.as_bytes());
        mac
    }

    /// A token granting `claims` (the expiry is rounded down to the second).
    pub fn issue(&self, claims: &PortalClaims) -> String {
        let expires = claims
            .expires_at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let json = serde_json::to_vec(&Payload {
            tenant: claims.tenant.clone(),
            scope: claims.scope,
            expires,
        })
        .expect("a payload always serialises");
        let payload = URL_SAFE_NO_PAD.encode(json);
        let tag = URL_SAFE_NO_PAD.encode(self.mac(&payload).finalize().into_bytes());
        format!("{PORTAL_PREFIX}{payload}.{tag}")
    }

    /// What `token` grants at `now`: the tag is checked (in constant time) before anything in
    /// the payload is believed, then the expiry.
    pub fn verify(&self, token: &str, now: SystemTime) -> Result<PortalClaims, PortalError> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(PortalError::Invalid);
        }
        let (payload, tag) = token
            .strip_prefix(PORTAL_PREFIX)
            .and_then(|rest| rest.split_once('.'))
            .ok_or(PortalError::Invalid)?;
        let tag = URL_SAFE_NO_PAD
            .decode(tag)
            .map_err(|_| PortalError::Invalid)?;
        self.mac(payload)
            .verify_slice(&tag)
            .map_err(|_| PortalError::Invalid)?;
        let json = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| PortalError::Invalid)?;
        let p: Payload = serde_json::from_slice(&json).map_err(|_| PortalError::Invalid)?;
        let expires_at = UNIX_EPOCH + Duration::from_secs(p.expires);
        if now >= expires_at {
            return Err(PortalError::Expired);
        }
        Ok(PortalClaims {
            tenant: p.tenant,
            scope: p.scope,
            expires_at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(expires_at: SystemTime) -> PortalClaims {
        PortalClaims {
            tenant: Tenant::parse("acme").unwrap(),
            scope: Scope::Read,
            expires_at,
        }
    }

    #[test]
    fn a_link_is_accepted_by_every_signer_of_the_same_master_key_until_it_expires() {
        let master = MasterKey::generate();
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let exp = now + DEFAULT_PORTAL_TTL;
        let token = PortalSigner::new(&master).issue(&claims(exp));
        assert!(token.starts_with(PORTAL_PREFIX));
        let other_instance = PortalSigner::new(&master);
        assert_eq!(other_instance.verify(&token, now), Ok(claims(exp)));
        assert_eq!(
            other_instance.verify(&token, exp),
            Err(PortalError::Expired)
        );
        assert_eq!(
            PortalSigner::new(&MasterKey::generate()).verify(&token, now),
            Err(PortalError::Invalid),
            "another master key"
        );
        assert!(!format!("{other_instance:?}").contains(&format!("{:?}", master.derive(PURPOSE))));
    }

    #[test]
    fn forged_and_malformed_tokens_are_invalid() {
        let signer = PortalSigner::new(&MasterKey::generate());
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let token = signer.issue(&claims(now + DEFAULT_PORTAL_TTL));
        let (payload, tag) = token.split_once('.').unwrap();
        // The same tag on a payload naming another tenant with a write scope.
        let forged_payload = URL_SAFE_NO_PAD.encode(
            serde_json::to_vec(
                &serde_json::json!({"t": "globex", "s": "write", "e": 4_000_000_000u64}),
            )
            .unwrap(),
        );
        for bad in [
            format!("{PORTAL_PREFIX}{forged_payload}.{tag}"),
            format!("{payload}.{}", &tag[1..]),
            format!("{payload}.!!"),
            payload.to_owned(),
            "hlp_".to_owned(),
            format!("{token}{}", "A".repeat(MAX_TOKEN_LEN)),
        ] {
            assert_eq!(signer.verify(&bad, now), Err(PortalError::Invalid), "{bad}");
        }
    }
}
