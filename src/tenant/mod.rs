//! What a tenant may do through the admin API besides holding endpoints: its API keys, its
//! portal links, and the ceilings an operator sets on its endpoints. Pure rules; the registry
//! stores the keys and ceilings, and the admin API enforces them.
//!
//! - `key`: tenant API keys (`hlk_...`): their ids, their SHA-256 hashes (the only form ever
//!   stored) and the record the registry keeps of each.
//! - `portal`: stateless portal-link tokens (`hlp_...`), HMAC-signed under a key derived from
//!   the master key, so that every instance accepts what any instance issued.
//! - `ceiling`: per-tenant ceilings (number of endpoints, `max_in_flight`, `rate_limit_per_s`),
//!   the checks a tenant's endpoint writes pass, and the values that apply to an endpoint.
//!
//! A credential's [`Scope`] says what it may do: `read` only reads (`GET`, `HEAD`), `write`
//! also changes things.

mod ceiling;
mod key;
mod portal;

use serde::{Deserialize, Serialize};

pub use ceiling::{Ceilings, MAX_ENDPOINTS_CEILING, TenantDefaults, TenantLimits, effective};
pub use key::{ApiKey, KEY_PREFIX, KeyHash, MAX_KEY_NAME, TenantKey, TenantKeyId, key_id_of};
pub use portal::{
    DEFAULT_PORTAL_TTL, MAX_PORTAL_TTL, PORTAL_PREFIX, PortalClaims, PortalError, PortalSigner,
};

/// What a credential may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Reads only: delivery history, events, endpoints.
    Read,
    /// Reads and writes: also endpoints, secrets, replays, ingest.
    Write,
}

impl Scope {
    /// `read` or `write`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Write => "write",
        }
    }

    /// Parses `read` or `write`.
    pub fn parse(s: &str) -> Option<Scope> {
        match s {
            "read" => Some(Scope::Read),
            "write" => Some(Scope::Write),
            _ => None,
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A rule a tenant's key, link or ceiling breaks, naming the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct TenantError {
    /// The field, as the API names it (`name`, `max_in_flight`).
    pub field: String,
    /// What is wrong, for a human.
    pub reason: String,
}

pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> TenantError {
    TenantError {
        field: field.into(),
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_parse_print_and_order() {
        for s in [Scope::Read, Scope::Write] {
            assert_eq!(Scope::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        assert_eq!(Scope::parse("admin"), None);
        assert!(Scope::Read < Scope::Write);
    }
}
