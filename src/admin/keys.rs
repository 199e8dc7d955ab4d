//! `/v1/tenants/{tenant}/keys` and `/v1/tenants/{tenant}/portal-links`: the credentials a
//! tenant holds besides the config file's tokens.
//!
//! Who may do what:
//! - operators, for any tenant;
//! - a tenant's own write-scoped config token or API key, for its own tenant: issue, list and
//!   revoke keys (of either scope) and issue portal links (a write key can mint another write
//!   key; the list shows every key, so revoking what a leaked key made is one more call);
//! - a read-scoped key: none of it (403, from the scope check);
//! - a portal link: none of it (403): a link must not outlive its expiry by minting a key or
//!   a fresh link;
//! - any other tenant's credential: 404, as if the tenant did not exist.
//!
//! Keys are written to the registry (the compacted endpoints topic) as hashes; the key itself
//! is in the 201 answer once and nowhere else. Revocation rewrites the record with
//! `revoked_at`, so every instance refuses the key as soon as its view applies it
//! (milliseconds), and the list still shows it.

use std::time::{Duration, SystemTime};

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use crate::id::Tenant;
use crate::tenant::{
    DEFAULT_PORTAL_TTL, MAX_PORTAL_TTL, PortalClaims, PortalSigner, Scope, TenantKey, TenantKeyId,
};

use super::AdminState;
use super::auth::{Caller, Credential};
use super::body::{self, JsonBytes};
use super::endpoints::{short, time};
use super::error::ApiError;

/// What portal links are made with: the signer and the base of their URL.
#[derive(Debug)]
pub struct PortalLinks {
    /// Signs and checks link tokens (its key derived from the master key).
    pub signer: PortalSigner,
    /// `admin.public_url`, or `http://<admin.listen>`; no trailing `/`.
    pub base_url: String,
}

/// The `{tenant}` of a path.
pub(super) fn tenant_in(p: Result<Path<String>, PathRejection>) -> Result<Tenant, ApiError> {
    let raw = super::endpoints::path(p)?;
    Tenant::parse(raw).map_err(|e| ApiError::invalid("tenant", e.to_string()))
}

/// Allows `caller` to manage `tenant`'s credentials (see the module doc), or says why not.
fn manages(caller: &Caller, tenant: &Tenant) -> Result<(), ApiError> {
    caller.acts_for(tenant)?;
    if *caller.credential() == Credential::PortalLink {
        return Err(ApiError::Forbidden(
            "a portal link may not manage API keys or portal links; use an API key or a \
             tenant token"
                .into(),
        ));
    }
    if caller.scope() == Scope::Read {
        return Err(ApiError::Forbidden(
            "scope: this credential's scope is read; managing API keys needs a write-scoped \
             credential"
                .into(),
        ));
    }
    Ok(())
}

/// `POST /v1/tenants/{tenant}/keys` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssueKey {
    /// `read` or `write`.
    pub scope: Scope,
    /// A label for the key's owner.
    pub name: Option<String>,
}

/// A key as listed (never the key itself).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyInfo {
    /// `tk_...`.
    pub id: String,
    /// The tenant it acts for.
    pub tenant: String,
    /// `read` or `write`.
    pub scope: Scope,
    /// Its label.
    pub name: Option<String>,
    /// When it was issued.
    pub created_at: String,
    /// When it was revoked; `null` while it works.
    pub revoked_at: Option<String>,
}

impl KeyInfo {
    fn of(k: &TenantKey) -> KeyInfo {
        KeyInfo {
            id: k.id.to_string(),
            tenant: k.tenant.to_string(),
            scope: k.scope,
            name: k.name.clone(),
            created_at: time(k.created_at),
            revoked_at: k.revoked_at.map(time),
        }
    }
}

/// `POST /v1/tenants/{tenant}/keys` answer: the key, this once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IssuedKey {
    /// The key's record as listed.
    #[serde(flatten)]
    pub info: KeyInfo,
    /// The key (`hlk_...`): shown in this answer only; hookline keeps its hash.
    pub key: String,
}

/// `GET /v1/tenants/{tenant}/keys` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyList {
    /// Oldest first, revoked ones included.
    pub data: Vec<KeyInfo>,
}

/// `POST /v1/tenants/{tenant}/keys` → 201 with the key, once.
pub async fn issue(
    State(state): State<AdminState>,
    caller: Caller,
    tenant: Result<Path<String>, PathRejection>,
    JsonBytes(raw): JsonBytes,
) -> Result<(StatusCode, Json<IssuedKey>), ApiError> {
    let tenant = tenant_in(tenant)?;
    manages(&caller, &tenant)?;
    let req: IssueKey = body::parse(&raw)?;
    let (record, key) = TenantKey::issue(tenant, req.scope, req.name, SystemTime::now())?;
    state.endpoints.put_tenant_key(&record).await?;
    tracing::info!(key_id = %record.id, tenant = %record.tenant, scope = %record.scope,
        by = %caller.asked_by(), "tenant API key issued");
    Ok((
        StatusCode::CREATED,
        Json(IssuedKey {
            info: KeyInfo::of(&record),
            key: key.expose().to_owned(),
        }),
    ))
}

/// `GET /v1/tenants/{tenant}/keys`.
pub async fn list(
    State(state): State<AdminState>,
    caller: Caller,
    tenant: Result<Path<String>, PathRejection>,
) -> Result<Json<KeyList>, ApiError> {
    let tenant = tenant_in(tenant)?;
    manages(&caller, &tenant)?;
    let keys = state.endpoints.view().tenant_keys(&tenant);
    Ok(Json(KeyList {
        data: keys.iter().map(|k| KeyInfo::of(k)).collect(),
    }))
}

/// `DELETE /v1/tenants/{tenant}/keys/{id}` → 204: revoked (again, for one already revoked).
/// 404 for an id that is not one of this tenant's keys.
pub async fn revoke(
    State(state): State<AdminState>,
    caller: Caller,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let Path((tenant, id)) =
        path.map_err(|e| ApiError::BadRequest(format!("path: {}", e.body_text())))?;
    let tenant = Tenant::parse(tenant).map_err(|e| ApiError::invalid("tenant", e.to_string()))?;
    manages(&caller, &tenant)?;
    let key = TenantKeyId::parse(&id)
        .and_then(|id| state.endpoints.view().tenant_key(&id))
        .filter(|k| k.tenant == tenant)
        .ok_or_else(|| ApiError::NotFound(format!("key {} not found", short(&id))))?;
    if key.revoked_at.is_none() {
        let mut revoked = (*key).clone();
        revoked.revoked_at = Some(SystemTime::now());
        state.endpoints.put_tenant_key(&revoked).await?;
        tracing::info!(key_id = %key.id, tenant = %key.tenant, by = %caller.asked_by(),
            "tenant API key revoked");
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/tenants/{tenant}/portal-links` body; both fields may be left out, and so may the
/// body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkParams {
    /// How long the link lives (`"30m"`, `"8h"`): default 1 h, at most 24 h.
    pub ttl: Option<String>,
    /// `read` or `write` (default): what the link may do.
    pub scope: Option<Scope>,
}

/// `POST /v1/tenants/{tenant}/portal-links` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PortalLink {
    /// `<admin.public_url>/portal/#token=<token>`: the token also authenticates API calls as
    /// the tenant (`Authorization: Bearer <token>`) until it expires.
    pub url: String,
    /// When it stops working.
    pub expires_at: String,
    /// What it may do.
    pub scope: Scope,
}

/// Parses a link's `ttl`: a duration of at least a second and at most [`MAX_PORTAL_TTL`].
fn ttl(raw: Option<&str>) -> Result<Duration, ApiError> {
    let Some(raw) = raw else {
        return Ok(DEFAULT_PORTAL_TTL);
    };
    let d = humantime::parse_duration(raw.trim())
        .map_err(|_| ApiError::invalid("ttl", "must be a duration such as \"30m\" or \"8h\""))?;
    if d < Duration::from_secs(1) || d > MAX_PORTAL_TTL {
        return Err(ApiError::invalid(
            "ttl",
            format!("must be from 1s to 24h, got {raw:?}"),
        ));
    }
    Ok(d)
}

/// `POST /v1/tenants/{tenant}/portal-links` → 201 with the link. 503 when this process has no
/// master key to sign links with.
pub async fn portal_link(
    State(state): State<AdminState>,
    caller: Caller,
    tenant: Result<Path<String>, PathRejection>,
    JsonBytes(raw): JsonBytes,
) -> Result<(StatusCode, Json<PortalLink>), ApiError> {
    let tenant = tenant_in(tenant)?;
    manages(&caller, &tenant)?;
    let req: LinkParams = if raw.iter().all(u8::is_ascii_whitespace) {
        LinkParams::default()
    } else {
        body::parse(&raw)?
    };
    let ttl = ttl(req.ttl.as_deref())?;
    let scope = req.scope.unwrap_or(Scope::Write);
    let links = state.portal.as_ref().ok_or_else(|| {
        ApiError::Unavailable("portal links are not available in this process".into())
    })?;
    // Whole seconds: the token carries its expiry to the second.
    let expires_at = SystemTime::UNIX_EPOCH
        + Duration::from_secs(
            (SystemTime::now() + ttl)
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        );
    let token = links.signer.issue(&PortalClaims {
        tenant: tenant.clone(),
        scope,
        expires_at,
    });
    tracing::info!(%tenant, %scope, ttl = %humantime::format_duration(ttl),
        by = %caller.asked_by(), "portal link issued");
    Ok((
        StatusCode::CREATED,
        Json(PortalLink {
            url: format!("{}/portal/#token={token}", links.base_url),
            expires_at: time(expires_at),
            scope,
        }),
    ))
}
