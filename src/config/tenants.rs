//! `[tenants]`: the ceilings every tenant's endpoints have unless an operator sets the
//! tenant's own (`PUT /v1/tenants/{tenant}/limits`). Operators' own endpoint writes are not
//! checked against them; a tenant's are, and what applies at delivery never exceeds them.

use serde::Deserialize;

use super::error::{ConfigError, invalid};
use crate::endpoint::{MAX_IN_FLIGHT_CEILING, MAX_RATE_PER_S, MIN_RATE_PER_S};
use crate::tenant::{Ceilings, MAX_ENDPOINTS_CEILING};

/// Default `tenants.max_endpoints`.
pub const DEFAULT_MAX_ENDPOINTS: u32 = 1000;
/// Default `tenants.max_in_flight`.
pub const DEFAULT_TENANT_MAX_IN_FLIGHT: u32 = 100;

/// `[tenants]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantsConfig {
    /// Most endpoints a tenant may hold.
    pub max_endpoints: u32,
    /// Highest `max_in_flight` a tenant's endpoint may have.
    pub max_in_flight: u32,
    /// Highest `rate_limit_per_s` a tenant's endpoint may have; unset, no ceiling.
    pub rate_limit_per_s: Option<f64>,
}

impl Default for TenantsConfig {
    fn default() -> Self {
        TenantsConfig {
            max_endpoints: DEFAULT_MAX_ENDPOINTS,
            max_in_flight: DEFAULT_TENANT_MAX_IN_FLIGHT,
            rate_limit_per_s: None,
        }
    }
}

impl TenantsConfig {
    /// The ceilings as the registry applies them.
    pub fn ceilings(&self) -> Ceilings {
        Ceilings {
            max_endpoints: Some(self.max_endpoints),
            max_in_flight: Some(self.max_in_flight),
            rate_limit_per_s: self.rate_limit_per_s,
        }
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.max_endpoints > MAX_ENDPOINTS_CEILING {
            return Err(invalid(
                "tenants.max_endpoints",
                format!(
                    "= {} must be at most {MAX_ENDPOINTS_CEILING}",
                    self.max_endpoints
                ),
            ));
        }
        if !(1..=MAX_IN_FLIGHT_CEILING).contains(&self.max_in_flight) {
            return Err(invalid(
                "tenants.max_in_flight",
                format!(
                    "= {} must be between 1 and {MAX_IN_FLIGHT_CEILING}",
                    self.max_in_flight
                ),
            ));
        }
        if let Some(r) = self.rate_limit_per_s
            && !(MIN_RATE_PER_S..=MAX_RATE_PER_S).contains(&r)
        {
            return Err(invalid(
                "tenants.rate_limit_per_s",
                format!("= {r} must be between {MIN_RATE_PER_S} and {MAX_RATE_PER_S}"),
            ));
        }
        Ok(())
    }
}
