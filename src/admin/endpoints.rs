//! `/v1/endpoints`: register, list, read, change, delete endpoints and rotate their secrets.
//!
//! Writes go through the [`EndpointStore`](crate::registry::EndpointStore), which returns only
//! once this instance's view shows the write, so a read right after a write sees it.
//!
//! Secrets: the `whsec_` secret is in the response of a create and of a rotation, once; every
//! other answer lists key ids with their creation and expiry only.
//!
//! Tenant rules: a tenant token may omit `tenant` on create (it defaults to its own) and may not
//! name another (403); endpoints of other tenants are 404 to it, as if absent. `GET
//! /v1/endpoints` lists the token's tenant, or for an operator the `tenant` given, or all.
//!
//! Ceilings: a tenant credential's create and change are checked against its tenant's
//! ceilings (`max_endpoints`, `max_in_flight`, `rate_limit_per_s`; see [`crate::tenant`]), 422
//! naming the field and the ceiling; operators' are not. An endpoint is shown as it applies,
//! its limits lowered to the ceilings; a change starts from what was written.
//!
//! The URL is checked for shape (http(s), host, no credentials) and, where the service passes
//! its [`UrlRules`](super::UrlRules), against what the sender would refuse without DNS: plain
//! http while it is not allowed, and literal IP hosts in blocked ranges. Host names are not
//! resolved here, since DNS answers change: the sender checks every resolved address at send
//! time.

use std::sync::Arc;
use std::time::SystemTime;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use crate::endpoint::{CreateEndpoint, Endpoint, PatchEndpoint, RotateSecret, Secret, SecretKind};
use crate::id::{EndpointId, Tenant};
use crate::record::{UnixMillis, rfc3339_millis};
use crate::subscription::parse_filters;

use super::AdminState;
use super::auth::Caller;
use super::body::{self, ApiJson, ApiQuery, JsonBytes, OptionalJson, UniqueObject};
use super::error::{ApiError, filter_error};

/// Default page size of `GET /v1/endpoints`.
pub const DEFAULT_LIST_LIMIT: usize = 100;
/// Largest page size of `GET /v1/endpoints`.
pub const MAX_LIST_LIMIT: usize = 1000;

/// RFC 3339 in UTC to the millisecond, as every time in the API is written.
pub fn time(t: SystemTime) -> String {
    rfc3339_millis(UnixMillis::from_system_time(t))
}

/// A secret as the API shows it: never the material.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SecretInfo {
    /// The key id receivers see.
    pub key_id: String,
    /// `hmac` or `ed25519`.
    pub kind: SecretKind,
    /// When it was added.
    pub created_at: String,
    /// When it stops signing; `null` while current.
    pub expires_at: Option<String>,
    /// Whether it signs now.
    pub active: bool,
}

impl SecretInfo {
    fn of(s: &Secret, now: SystemTime) -> SecretInfo {
        SecretInfo {
            key_id: s.key_id.to_string(),
            kind: s.kind,
            created_at: time(s.created_at),
            expires_at: s.expires_at.map(time),
            active: s.is_active(now),
        }
    }
}

/// An endpoint as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointBody {
    /// `ep_...`.
    pub id: String,
    /// The owner.
    pub tenant: String,
    /// Where deliveries go.
    pub url: String,
    /// Event-type filters.
    pub event_types: Vec<String>,
    /// Concurrency ceiling; `null` means the service default.
    pub max_in_flight: Option<u32>,
    /// Requests per second; `null` means unlimited.
    pub rate_limit_per_s: Option<f64>,
    /// Whether deliveries are made.
    pub enabled: bool,
    /// Why not (`gone` after a 410, `manual`), `null` while enabled.
    pub disabled_reason: Option<String>,
    /// Creation time.
    pub created_at: String,
    /// Last change.
    pub updated_at: String,
    /// Bumped on every change.
    pub version: u64,
    /// Key ids and lifetimes of the signing secrets, oldest first.
    pub secrets: Vec<SecretInfo>,
    /// The new `whsec_` secret: only in the answer to a create.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

impl EndpointBody {
    /// The public view of `e` (no secret material).
    pub fn of(e: &Endpoint, now: SystemTime) -> EndpointBody {
        EndpointBody {
            id: e.id.to_string(),
            tenant: e.tenant.to_string(),
            url: e.url.clone(),
            event_types: e.event_types.clone(),
            max_in_flight: e.max_in_flight,
            rate_limit_per_s: e.rate_limit_per_s,
            enabled: e.enabled,
            disabled_reason: e.disabled_reason.clone(),
            created_at: time(e.created_at),
            updated_at: time(e.updated_at),
            version: e.version,
            secrets: e.secrets.iter().map(|s| SecretInfo::of(s, now)).collect(),
            secret: None,
        }
    }
}

/// `GET /v1/endpoints` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointList {
    /// Endpoints ordered by id (creation order).
    pub data: Vec<EndpointBody>,
    /// Pass as `cursor` for the next page; `null` at the end.
    pub next_cursor: Option<String>,
}

/// `POST /v1/endpoints/{id}/secrets` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rotated {
    /// The endpoint.
    pub id: String,
    /// The new secret's key id.
    pub key_id: String,
    /// The new `whsec_` secret, shown this once.
    pub secret: String,
    /// Every secret kept, with expiries (the previous ones expire when the request said).
    pub secrets: Vec<SecretInfo>,
}

/// The endpoint `raw` if it exists and `caller` may see it; 404 otherwise (one answer for both,
/// so other tenants' ids cannot be probed).
pub(super) fn visible(
    state: &AdminState,
    caller: &Caller,
    raw: &str,
) -> Result<Arc<Endpoint>, ApiError> {
    EndpointId::parse(raw)
        .ok()
        .and_then(|id| state.endpoints.view().get(&id))
        .filter(|e| caller.sees(&e.tenant))
        .ok_or_else(|| ApiError::NotFound(format!("endpoint {} not found", short(raw))))
}

/// Quotes at most 64 characters of a client-supplied id back, so errors stay bounded.
pub(super) fn short(raw: &str) -> String {
    let mut s: String = raw.chars().take(64).collect();
    s.retain(|c| !c.is_control());
    s
}

pub(super) fn path(p: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    p.map(|Path(s)| s)
        .map_err(|e| ApiError::BadRequest(format!("path: {}", e.body_text())))
}

fn check_filters(types: &[String]) -> Result<(), ApiError> {
    parse_filters(types).map(|_| ()).map_err(filter_error)
}

/// `POST /v1/endpoints` → 201 with the endpoint and its `secret`.
pub async fn create(
    State(state): State<AdminState>,
    caller: Caller,
    ApiJson(UniqueObject(mut body)): ApiJson<UniqueObject>,
) -> Result<(StatusCode, Json<EndpointBody>), ApiError> {
    if let (None, Some(own)) = (body.get("tenant"), caller.tenant()) {
        body.insert("tenant".into(), own.as_str().into());
    }
    let req: CreateEndpoint = body::from_value(serde_json::Value::Object(body))?;
    caller.may_write_for(&req.tenant)?;
    check_filters(&req.event_types)?;
    let now = SystemTime::now();
    let endpoint = Endpoint::create(req, now)?;
    if caller.tenant().is_some() {
        let view = state.endpoints.view();
        let ceilings = view.ceilings(&endpoint.tenant);
        ceilings.check_max_in_flight(&endpoint.tenant, endpoint.max_in_flight)?;
        ceilings.check_rate(&endpoint.tenant, endpoint.rate_limit_per_s, false)?;
        ceilings.check_count(&endpoint.tenant, view.count(&endpoint.tenant))?;
    }
    check_url(&state, &endpoint.url)?;
    let stored = state.endpoints.put(&endpoint).await?;
    let mut out = EndpointBody::of(&stored, now);
    out.secret = stored
        .secrets
        .last()
        .map(|s| s.material.to_whsec().to_string());
    tracing::info!(endpoint = %stored.id, tenant = %stored.tenant, "endpoint created");
    Ok((StatusCode::CREATED, Json(out)))
}

/// `GET /v1/endpoints` query.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// Whose endpoints (operators; a tenant token may only name its own).
    pub tenant: Option<String>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// Page size, 1 to [`MAX_LIST_LIMIT`], default [`DEFAULT_LIST_LIMIT`].
    pub limit: Option<String>,
}

/// Parses a `limit` query parameter.
pub(super) fn limit(raw: Option<&str>, default: usize, max: usize) -> Result<usize, ApiError> {
    match raw {
        None => Ok(default),
        Some(s) => s
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| ApiError::invalid("limit", format!("must be a number from 1 to {max}"))),
    }
}

/// `GET /v1/endpoints?tenant=&cursor=&limit=`.
pub async fn list(
    State(state): State<AdminState>,
    caller: Caller,
    q: Result<ApiQuery<ListParams>, ApiError>,
) -> Result<Json<EndpointList>, ApiError> {
    let ApiQuery(params) = q?;
    let limit = limit(params.limit.as_deref(), DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT)?;
    let tenant = match params.tenant {
        Some(t) => Some(Tenant::parse(t).map_err(|e| ApiError::invalid("tenant", e.to_string()))?),
        None => caller.tenant().cloned(),
    };
    if let Some(t) = &tenant
        && !caller.sees(t)
    {
        return Err(ApiError::NotFound(format!(
            "tenant {} not found",
            short(t.as_str())
        )));
    }
    let after = params
        .cursor
        .map(|c| {
            EndpointId::parse(c)
                .ok()
                .filter(EndpointId::is_generated)
                .ok_or_else(|| ApiError::invalid("cursor", "is not a cursor returned by this API"))
        })
        .transpose()?;
    let view = state.endpoints.view();
    let all = match &tenant {
        Some(t) => view.list(t),
        None => view.all(),
    };
    let now = SystemTime::now();
    let mut page = all
        .iter()
        .filter(|e| after.as_ref().is_none_or(|a| &e.id > a))
        .take(limit + 1);
    let data: Vec<EndpointBody> = page
        .by_ref()
        .take(limit)
        .map(|e| EndpointBody::of(e, now))
        .collect();
    let next_cursor = page.next().and(data.last()).map(|e| e.id.clone());
    Ok(Json(EndpointList { data, next_cursor }))
}

/// `GET /v1/endpoints/{id}`.
pub async fn get(
    State(state): State<AdminState>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<EndpointBody>, ApiError> {
    let endpoint = visible(&state, &caller, &path(id)?)?;
    Ok(Json(EndpointBody::of(&endpoint, SystemTime::now())))
}

/// `PATCH /v1/endpoints/{id}`: partial; `"enabled": true` re-enables (clearing the reason).
pub async fn patch(
    State(state): State<AdminState>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
    JsonBytes(raw): JsonBytes,
) -> Result<Json<EndpointBody>, ApiError> {
    // The endpoint first: an unknown id is 404 whatever the body says.
    let current = visible(&state, &caller, &path(id)?)?;
    let req: PatchEndpoint = body::parse(&raw)?;
    if let Some(types) = &req.event_types {
        check_filters(types)?;
    }
    if caller.tenant().is_some() {
        let ceilings = state.endpoints.view().ceilings(&current.tenant);
        if let Some(m) = req.max_in_flight {
            ceilings.check_max_in_flight(&current.tenant, m)?;
        }
        if let Some(r) = req.rate_limit_per_s {
            ceilings.check_rate(&current.tenant, r, r.is_none())?;
        }
    }
    let now = SystemTime::now();
    let mut next = (*as_written(&state, current.clone())).clone();
    next.apply_patch(req, now)?;
    if next.url != current.url {
        check_url(&state, &next.url)?;
    }
    let stored = state.endpoints.put(&next).await?;
    tracing::info!(endpoint = %stored.id, version = stored.version, "endpoint changed");
    Ok(Json(EndpointBody::of(&stored, now)))
}

/// `endpoint` as it was written, its own limits rather than those lowered to its tenant's
/// ceilings: a change keeps them, so raising a ceiling later gives them back.
fn as_written(state: &AdminState, endpoint: Arc<Endpoint>) -> Arc<Endpoint> {
    state
        .endpoints
        .view()
        .written(&endpoint.id)
        .unwrap_or(endpoint)
}

/// Applies the service's URL rules, when it gave any.
fn check_url(state: &AdminState, url: &str) -> Result<(), ApiError> {
    state
        .url_rules
        .as_ref()
        .map_or(Ok(()), |rules| rules.check(url))
}

/// `DELETE /v1/endpoints/{id}` → 204.
pub async fn delete(
    State(state): State<AdminState>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let endpoint = visible(&state, &caller, &path(id)?)?;
    state.endpoints.delete(&endpoint.id).await?;
    tracing::info!(endpoint = %endpoint.id, "endpoint deleted");
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/endpoints/{id}/secrets` (body optional: `secret`, `old_expires_in` or
/// `old_expires_at`) → 201 with the new secret once.
pub async fn rotate(
    State(state): State<AdminState>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
    OptionalJson(req): OptionalJson<RotateSecret>,
) -> Result<(StatusCode, Json<Rotated>), ApiError> {
    let current = visible(&state, &caller, &path(id)?)?;
    let now = SystemTime::now();
    let mut next = (*as_written(&state, current)).clone();
    let key_id = next.rotate(req, now)?;
    let stored = state.endpoints.put(&next).await?;
    let secret = stored
        .secrets
        .iter()
        .find(|s| s.key_id == key_id)
        .map(|s| s.material.to_whsec().to_string())
        .ok_or_else(|| {
            ApiError::Internal("the rotated secret is missing after the write".into())
        })?;
    tracing::info!(endpoint = %stored.id, key_id = %key_id, "endpoint secret rotated");
    Ok((
        StatusCode::CREATED,
        Json(Rotated {
            id: stored.id.to_string(),
            key_id: key_id.to_string(),
            secret,
            secrets: stored
                .secrets
                .iter()
                .map(|s| SecretInfo::of(s, now))
                .collect(),
        }),
    ))
}
