//! `/v1/tenants/{tenant}/limits`: the ceilings on a tenant's endpoints.
//!
//! `GET` answers the ceilings that apply (the config's `[tenants]` defaults with what an
//! operator set), what the operator set, and how many endpoints the tenant holds; operators
//! read any tenant's, a tenant's credentials (any scope) their own, and another tenant's are
//! 404. `PUT` is for operators: it replaces what was set for the tenant, each field a number
//! (that ceiling), `null` (no ceiling) or left out (the config default); a tenant's own
//! credential is refused (403), another's 404.
//!
//! The ceilings are a record in the registry, so every instance applies them within
//! milliseconds: a tenant's endpoint writes above them are refused with a 422 naming the field
//! and the ceiling, and what applies at delivery to its existing endpoints is lowered to them
//! at once (the endpoint view serves each endpoint so; raising the ceiling again gives each
//! endpoint back what it was written with).

use std::time::SystemTime;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use serde::{Deserialize, Deserializer, Serialize};

use crate::id::Tenant;
use crate::tenant::{Ceilings, TenantLimits};

use super::AdminState;
use super::auth::Caller;
use super::body::{self, JsonBytes};
use super::endpoints::time;
use super::error::ApiError;
use super::keys::tenant_in;

/// `PUT /v1/tenants/{tenant}/limits` body: for each field a number, `null` (no ceiling), or
/// left out (the config default).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetLimits {
    /// Most endpoints the tenant may hold.
    #[serde(default, deserialize_with = "some")]
    pub max_endpoints: Option<Option<u32>>,
    /// Highest `max_in_flight` of its endpoints.
    #[serde(default, deserialize_with = "some")]
    pub max_in_flight: Option<Option<u32>>,
    /// Highest `rate_limit_per_s` of its endpoints.
    #[serde(default, deserialize_with = "some")]
    pub rate_limit_per_s: Option<Option<f64>>,
}

/// Tells "field absent" (outer `None`, via `default`) from "field is null" (`Some(None)`).
fn some<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// What an operator set for a tenant, as shown: only the fields set (`null`: no ceiling).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SetByOperator {
    /// See [`SetLimits::max_endpoints`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_endpoints: Option<Option<u32>>,
    /// See [`SetLimits::max_in_flight`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<Option<u32>>,
    /// See [`SetLimits::rate_limit_per_s`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit_per_s: Option<Option<f64>>,
}

/// `GET` and `PUT /v1/tenants/{tenant}/limits` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LimitsBody {
    /// Whose.
    pub tenant: String,
    /// The ceilings that apply (`null`: none).
    #[serde(flatten)]
    pub ceilings: Ceilings,
    /// How many endpoints the tenant holds now.
    pub endpoints: usize,
    /// What an operator set (the rest are the config's defaults).
    pub set: SetByOperator,
    /// When an operator last set them; `null` when the defaults apply throughout.
    pub updated_at: Option<String>,
}

fn body_of(state: &AdminState, tenant: &Tenant) -> LimitsBody {
    let view = state.endpoints.view();
    let set = view.tenant_limits(tenant);
    LimitsBody {
        tenant: tenant.to_string(),
        ceilings: view.ceilings(tenant),
        endpoints: view.count(tenant),
        set: set
            .as_ref()
            .map(|s| SetByOperator {
                max_endpoints: s.max_endpoints,
                max_in_flight: s.max_in_flight,
                rate_limit_per_s: s.rate_limit_per_s,
            })
            .unwrap_or_default(),
        updated_at: set.map(|s| time(s.updated_at)),
    }
}

/// `GET /v1/tenants/{tenant}/limits`.
pub async fn get(
    State(state): State<AdminState>,
    caller: Caller,
    tenant: Result<Path<String>, PathRejection>,
) -> Result<Json<LimitsBody>, ApiError> {
    let tenant = tenant_in(tenant)?;
    caller.acts_for(&tenant)?;
    Ok(Json(body_of(&state, &tenant)))
}

/// `PUT /v1/tenants/{tenant}/limits`: operators only.
pub async fn put(
    State(state): State<AdminState>,
    caller: Caller,
    tenant: Result<Path<String>, PathRejection>,
    JsonBytes(raw): JsonBytes,
) -> Result<Json<LimitsBody>, ApiError> {
    let tenant = tenant_in(tenant)?;
    caller.acts_for(&tenant)?;
    if caller.tenant().is_some() {
        return Err(ApiError::Forbidden(
            "a tenant's limits are set by operators; a tenant credential may only read them".into(),
        ));
    }
    let req: SetLimits = body::parse(&raw)?;
    let limits = TenantLimits {
        tenant: tenant.clone(),
        max_endpoints: req.max_endpoints,
        max_in_flight: req.max_in_flight,
        rate_limit_per_s: req.rate_limit_per_s,
        updated_at: SystemTime::now(),
    };
    state.endpoints.put_tenant_limits(&limits).await?;
    tracing::info!(%tenant, ?limits, "tenant limits set");
    Ok(Json(body_of(&state, &tenant)))
}
