//! Per-tenant ceilings on endpoints: how many a tenant may hold, and the highest
//! `max_in_flight` and `rate_limit_per_s` its endpoints may ask for.
//!
//! The config file gives defaults for every tenant; an operator overrides them per tenant
//! ([`TenantLimits`], a record in the registry). A tenant's own endpoint writes are checked
//! against the ceilings (the admin API); what applies to an endpoint at delivery is
//! [`effective`]: its own values, lowered to the ceilings, so that lowering a ceiling lowers
//! existing endpoints at once, and raising it gives them back what they asked for.

use std::time::SystemTime;

use serde::{Deserialize, Deserializer, Serialize};

use super::{TenantError, invalid};
use crate::endpoint::{Endpoint, MAX_IN_FLIGHT_CEILING, MAX_RATE_PER_S, MIN_RATE_PER_S};
use crate::id::Tenant;

/// Most endpoints a `max_endpoints` ceiling may allow.
pub const MAX_ENDPOINTS_CEILING: u32 = 1_000_000;

/// Ceilings for one tenant; `None` is no ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Ceilings {
    /// Most endpoints it may hold.
    pub max_endpoints: Option<u32>,
    /// Highest `max_in_flight` of any of its endpoints.
    pub max_in_flight: Option<u32>,
    /// Highest `rate_limit_per_s` of any of its endpoints (so an endpoint's rate may not be
    /// unlimited while it is set).
    pub rate_limit_per_s: Option<f64>,
}

/// What every tenant gets unless an operator said otherwise, and the concurrency an endpoint
/// without its own `max_in_flight` gets (`delivery.max_in_flight`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TenantDefaults {
    /// The config file's `[tenants]` ceilings.
    pub ceilings: Ceilings,
    /// `delivery.max_in_flight`.
    pub default_max_in_flight: u32,
}

impl Default for TenantDefaults {
    /// No ceilings; 16 in flight per endpoint, as `delivery.max_in_flight` defaults to.
    fn default() -> Self {
        TenantDefaults {
            ceilings: Ceilings::default(),
            default_max_in_flight: 16,
        }
    }
}

/// A tenant's ceilings as an operator set them (the JSON value of its registry record). For
/// each field: absent, the config default applies; `null`, no ceiling; a number, that ceiling.
/// Unknown fields are tolerated, so an older instance reads a newer one's records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantLimits {
    /// Whose.
    pub tenant: Tenant,
    /// See [`Ceilings::max_endpoints`].
    #[serde(
        default,
        deserialize_with = "some",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_endpoints: Option<Option<u32>>,
    /// See [`Ceilings::max_in_flight`].
    #[serde(
        default,
        deserialize_with = "some",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_in_flight: Option<Option<u32>>,
    /// See [`Ceilings::rate_limit_per_s`].
    #[serde(
        default,
        deserialize_with = "some",
        skip_serializing_if = "Option::is_none"
    )]
    pub rate_limit_per_s: Option<Option<f64>>,
    /// When an operator set them.
    #[serde(with = "humantime_serde")]
    pub updated_at: SystemTime,
}

/// Tells "field absent" (outer `None`, via `default`) from "field is null" (`Some(None)`).
fn some<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

impl TenantLimits {
    /// Checks each ceiling set; the error names the field.
    pub fn validate(&self) -> Result<(), TenantError> {
        if let Some(Some(n)) = self.max_endpoints
            && n > MAX_ENDPOINTS_CEILING
        {
            return Err(invalid(
                "max_endpoints",
                format!("must be at most {MAX_ENDPOINTS_CEILING}"),
            ));
        }
        if let Some(Some(m)) = self.max_in_flight
            && !(1..=MAX_IN_FLIGHT_CEILING).contains(&m)
        {
            return Err(invalid(
                "max_in_flight",
                format!("must be between 1 and {MAX_IN_FLIGHT_CEILING}"),
            ));
        }
        if let Some(Some(r)) = self.rate_limit_per_s
            && !(MIN_RATE_PER_S..=MAX_RATE_PER_S).contains(&r)
        {
            return Err(invalid(
                "rate_limit_per_s",
                format!(
                    "must be between {MIN_RATE_PER_S} and {MAX_RATE_PER_S} requests per second"
                ),
            ));
        }
        Ok(())
    }
}

impl Ceilings {
    /// These defaults with what `set` overrides.
    pub fn overridden_by(&self, set: Option<&TenantLimits>) -> Ceilings {
        let Some(set) = set else { return *self };
        Ceilings {
            max_endpoints: set.max_endpoints.unwrap_or(self.max_endpoints),
            max_in_flight: set.max_in_flight.unwrap_or(self.max_in_flight),
            rate_limit_per_s: set.rate_limit_per_s.unwrap_or(self.rate_limit_per_s),
        }
    }

    /// Refuses one more endpoint for `tenant`, which holds `existing`, at its ceiling.
    pub fn check_count(&self, tenant: &Tenant, existing: usize) -> Result<(), TenantError> {
        match self.max_endpoints {
            Some(max) if existing >= max as usize => Err(invalid(
                "tenant",
                format!(
                    "tenant {tenant} holds {existing} endpoints, its ceiling (max_endpoints) \
                     of {max}; delete one, or ask an operator to raise the ceiling"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Refuses a `max_in_flight` above the ceiling (`None`, the service default, passes: it is
    /// lowered to the ceiling where it applies, see [`effective`]).
    pub fn check_max_in_flight(
        &self,
        tenant: &Tenant,
        value: Option<u32>,
    ) -> Result<(), TenantError> {
        match (value, self.max_in_flight) {
            (Some(v), Some(c)) if v > c => Err(invalid(
                "max_in_flight",
                format!("{v} is above tenant {tenant}'s ceiling of {c}"),
            )),
            _ => Ok(()),
        }
    }

    /// Refuses a `rate_limit_per_s` above the ceiling, and clearing it (`cleared`: an explicit
    /// `null`, asking for no limit) while there is one. Left out on a create, the ceiling
    /// applies (see [`effective`]).
    pub fn check_rate(
        &self,
        tenant: &Tenant,
        value: Option<f64>,
        cleared: bool,
    ) -> Result<(), TenantError> {
        match (value, self.rate_limit_per_s) {
            (Some(v), Some(c)) if v > c => Err(invalid(
                "rate_limit_per_s",
                format!("{v} is above tenant {tenant}'s ceiling of {c}"),
            )),
            (None, Some(c)) if cleared => Err(invalid(
                "rate_limit_per_s",
                format!(
                    "cannot be cleared (no limit) under tenant {tenant}'s ceiling of {c}; set \
                     a rate of at most {c}"
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// `endpoint` as it applies under `ceilings`: its `max_in_flight` (or the service default)
/// and its `rate_limit_per_s` (or no limit) lowered to the ceilings. `None` when nothing is
/// lowered, so the caller keeps sharing the endpoint as it is.
pub fn effective(
    endpoint: &Endpoint,
    ceilings: &Ceilings,
    default_max_in_flight: u32,
) -> Option<Endpoint> {
    let max_in_flight = match (endpoint.max_in_flight, ceilings.max_in_flight) {
        (Some(v), Some(c)) if v > c => Some(c),
        (None, Some(c)) if default_max_in_flight > c => Some(c),
        (own, _) => own,
    };
    let rate_limit_per_s = match (endpoint.rate_limit_per_s, ceilings.rate_limit_per_s) {
        (Some(v), Some(c)) if v > c => Some(c),
        (None, Some(c)) => Some(c),
        (own, _) => own,
    };
    if max_in_flight == endpoint.max_in_flight && rate_limit_per_s == endpoint.rate_limit_per_s {
        return None;
    }
    let mut lowered = endpoint.clone();
    lowered.max_in_flight = max_in_flight;
    lowered.rate_limit_per_s = rate_limit_per_s;
    Some(lowered)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::CreateEndpoint;

    fn acme() -> Tenant {
        Tenant::parse("acme").unwrap()
    }

    fn endpoint(max_in_flight: Option<u32>, rate: Option<f64>) -> Endpoint {
        let req: CreateEndpoint = serde_json::from_value(serde_json::json!({
            "tenant": "acme", "url": "https://example.com/hook", "event_types": ["*"],
            "max_in_flight": max_in_flight, "rate_limit_per_s": rate,
        }))
        .unwrap();
        Endpoint::create(req, SystemTime::now()).unwrap()
    }

    const CEILINGS: Ceilings = Ceilings {
        max_endpoints: Some(2),
        max_in_flight: Some(16),
        rate_limit_per_s: Some(50.0),
    };

    #[test]
    fn checks_name_the_field_and_the_ceiling() {
        let t = acme();
        assert_eq!(
            CEILINGS
                .check_max_in_flight(&t, Some(64))
                .unwrap_err()
                .to_string(),
            "max_in_flight: 64 is above tenant acme's ceiling of 16"
        );
        CEILINGS.check_max_in_flight(&t, Some(16)).unwrap();
        CEILINGS.check_max_in_flight(&t, None).unwrap();
        assert_eq!(
            CEILINGS
                .check_rate(&t, Some(51.0), false)
                .unwrap_err()
                .to_string(),
            "rate_limit_per_s: 51 is above tenant acme's ceiling of 50"
        );
        let cleared = CEILINGS.check_rate(&t, None, true).unwrap_err().to_string();
        assert!(
            cleared.starts_with("rate_limit_per_s: cannot be cleared"),
            "{cleared}"
        );
        CEILINGS.check_rate(&t, None, false).unwrap();
        CEILINGS.check_count(&t, 1).unwrap();
        let full = CEILINGS.check_count(&t, 2).unwrap_err().to_string();
        assert!(full.contains("max_endpoints) of 2"), "{full}");
        let none = Ceilings::default();
        none.check_count(&t, 1 << 20).unwrap();
        none.check_rate(&t, None, true).unwrap();
        none.check_max_in_flight(&t, Some(10_000)).unwrap();
    }

    #[test]
    fn what_applies_is_lowered_to_the_ceiling_and_never_raised() {
        let applies = |e: &Endpoint, default: u32| {
            let got = effective(e, &CEILINGS, default).unwrap_or_else(|| e.clone());
            (got.max_in_flight, got.rate_limit_per_s)
        };
        assert_eq!(
            applies(&endpoint(Some(64), Some(100.0)), 16),
            (Some(16), Some(50.0))
        );
        assert_eq!(
            applies(&endpoint(Some(4), Some(5.0)), 16),
            (Some(4), Some(5.0))
        );
        // No value of its own: the service default, unless the ceiling is lower.
        assert_eq!(applies(&endpoint(None, None), 8), (None, Some(50.0)));
        assert_eq!(applies(&endpoint(None, None), 32), (Some(16), Some(50.0)));
        assert!(effective(&endpoint(Some(4), Some(5.0)), &CEILINGS, 16).is_none());
        assert!(effective(&endpoint(None, None), &Ceilings::default(), 16).is_none());
    }

    #[test]
    fn overrides_distinguish_absent_null_and_a_value() {
        let set: TenantLimits = serde_json::from_value(serde_json::json!({
            "tenant": "acme", "max_in_flight": 4, "rate_limit_per_s": null,
            "updated_at": "2026-01-01T00:00:00Z",
        }))
        .unwrap();
        let got = CEILINGS.overridden_by(Some(&set));
        assert_eq!(
            got,
            Ceilings {
                max_endpoints: Some(2),
                max_in_flight: Some(4),
                rate_limit_per_s: None,
            }
        );
        let json = serde_json::to_value(&set).unwrap();
        assert!(json.get("max_endpoints").is_none(), "{json}");
        assert!(json["rate_limit_per_s"].is_null(), "{json}");
        let back: TenantLimits = serde_json::from_value(json).unwrap();
        assert_eq!(back, set);
        let bad = TenantLimits {
            max_in_flight: Some(Some(0)),
            ..set
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .starts_with("max_in_flight:")
        );
    }
}
