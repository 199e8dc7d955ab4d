//! Bearer-token authentication and the tenant scoping every handler applies.
//!
//! [`authenticate`] runs before any body is read: it resolves `Authorization: Bearer <token>`
//! to a [`Caller`] and stores it in the request; without one, 401 with `WWW-Authenticate:
//! Bearer`. Handlers take [`Caller`] as an extractor, which fails closed (401) if the
//! middleware did not run. A bearer token is, in the order tried:
//! - a config token ([`AdminConfig::principal`](crate::config::AdminConfig::principal),
//!   constant-time comparisons): an operator's, or a tenant's (write scope);
//! - a tenant API key (`hlk_...`): its id names the one record in the endpoint view to compare
//!   its hash with (constant time); refused once revoked, on every instance as soon as its view
//!   applies the revocation;
//! - a portal link's token (`hlp_...`): checked with the key derived from the master key;
//!   refused once expired, saying so.
//!
//! Scopes: a `read` credential may only `GET` and `HEAD`; anything else is 403 naming the
//! scope, before the handler runs.
//!
//! Scoping rules:
//! - reads of something another tenant owns answer 404, exactly as if it did not exist, so a
//!   tenant token cannot probe for other tenants' ids ([`Caller::sees`]);
//! - writes naming another tenant answer 403 ([`Caller::may_write_for`]): the answer is the
//!   same whatever the named tenant, so it reveals nothing about it, and it tells an honest
//!   caller what is wrong instead of pretending the tenant does not exist.
//!
//! Tokens are never logged or echoed.

use std::time::SystemTime;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::config::Principal;
use crate::id::Tenant;
use crate::tenant::{KEY_PREFIX, PORTAL_PREFIX, Scope, TenantKeyId, key_id_of};

use super::AdminState;
use super::endpoints::short;
use super::error::ApiError;

/// Which kind of credential a caller presented.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// One of `admin.operator_tokens`.
    OperatorToken,
    /// One of `admin.tenant_tokens`.
    TenantToken,
    /// A tenant API key.
    Key {
        /// Its id.
        id: TenantKeyId,
        /// Its name, when it has one.
        name: Option<String>,
    },
    /// A portal link.
    PortalLink,
}

/// Who is calling, as established by the bearer token: who, with what scope, by which kind
/// of credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    principal: Principal,
    scope: Scope,
    credential: Credential,
}

impl Caller {
    /// A caller.
    pub fn new(principal: Principal, scope: Scope, credential: Credential) -> Caller {
        Caller {
            principal,
            scope,
            credential,
        }
    }

    /// Who.
    pub fn principal(&self) -> &Principal {
        &self.principal
    }

    /// What the credential may do.
    pub fn scope(&self) -> Scope {
        self.scope
    }

    /// Which kind of credential.
    pub fn credential(&self) -> &Credential {
        &self.credential
    }

    /// The credential as a replay audit records it (`key tk_... (deploy bot)`,
    /// `operator token`, `tenant token`, `portal link (acme)`).
    pub fn asked_by(&self) -> String {
        match (&self.credential, &self.principal) {
            (Credential::OperatorToken, _) => "operator token".into(),
            (Credential::TenantToken, _) => "tenant token".into(),
            (Credential::Key { id, name: Some(n) }, _) => format!("key {id} ({n})"),
            (Credential::Key { id, name: None }, _) => format!("key {id}"),
            (Credential::PortalLink, Principal::Tenant(t)) => format!("portal link ({t})"),
            (Credential::PortalLink, Principal::Operator) => "portal link".into(),
        }
    }

    /// The tenant a tenant credential acts for; `None` for an operator.
    pub fn tenant(&self) -> Option<&Tenant> {
        match &self.principal {
            Principal::Operator => None,
            Principal::Tenant(t) => Some(t),
        }
    }

    /// Allows a request about `tenant` itself (its keys, links, limits), or 404 as if it did
    /// not exist for a tenant credential of another tenant.
    pub fn acts_for(&self, tenant: &Tenant) -> Result<(), ApiError> {
        if self.sees(tenant) {
            Ok(())
        } else {
            Err(ApiError::NotFound(format!(
                "tenant {} not found",
                short(tenant.as_str())
            )))
        }
    }

    /// Whether this caller may see what `owner` owns.
    pub fn sees(&self, owner: &Tenant) -> bool {
        self.tenant().is_none_or(|t| t == owner)
    }

    /// Allows a write for `owner`, or 403.
    pub fn may_write_for(&self, owner: &Tenant) -> Result<(), ApiError> {
        if self.sees(owner) {
            Ok(())
        } else {
            Err(ApiError::Forbidden(
                "tenant: this token may only act for its own tenant".into(),
            ))
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or(ApiError::Unauthorized)
    }
}

/// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive).
fn bearer(req: &Request) -> Option<&str> {
    let value = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Whom `token` belongs to, or why not.
fn resolve(state: &AdminState, token: &str) -> Result<Caller, ApiError> {
    // Config tokens first: an operator may have configured one that looks like a key.
    if let Some(principal) = state.auth.principal(token) {
        let credential = match principal {
            Principal::Operator => Credential::OperatorToken,
            Principal::Tenant(_) => Credential::TenantToken,
        };
        return Ok(Caller::new(principal, Scope::Write, credential));
    }
    if token.starts_with(KEY_PREFIX) {
        let key = key_id_of(token)
            .and_then(|id| state.endpoints.view().tenant_key(&id))
            .filter(|k| k.hash.matches(token))
            .ok_or(ApiError::Unauthorized)?;
        if key.revoked_at.is_some() {
            return Err(ApiError::Unauthenticated(format!(
                "API key {} was revoked; ask for a new key",
                key.id
            )));
        }
        return Ok(Caller::new(
            Principal::Tenant(key.tenant.clone()),
            key.scope,
            Credential::Key {
                id: key.id.clone(),
                name: key.name.clone(),
            },
        ));
    }
    if token.starts_with(PORTAL_PREFIX)
        && let Some(links) = &state.portal
    {
        return match links.signer.verify(token, SystemTime::now()) {
            Ok(claims) => Ok(Caller::new(
                Principal::Tenant(claims.tenant),
                claims.scope,
                Credential::PortalLink,
            )),
            Err(e) => Err(ApiError::Unauthenticated(e.to_string())),
        };
    }
    Err(ApiError::Unauthorized)
}

/// Middleware: resolves the bearer token or answers 401; answers 403 to a read-scoped
/// credential asking for anything but `GET` or `HEAD`.
pub async fn authenticate(
    State(state): State<AdminState>,
    mut req: Request,
    next: Next,
) -> Response {
    let caller = match bearer(&req).map(|token| resolve(&state, token)) {
        Some(Ok(caller)) => caller,
        Some(Err(e)) => return e.into_response(),
        None => return ApiError::Unauthorized.into_response(),
    };
    if caller.scope == Scope::Read && !matches!(*req.method(), Method::GET | Method::HEAD) {
        return ApiError::Forbidden(format!(
            "scope: this credential's scope is read, which may only read (GET, HEAD); {} \
             needs a write-scoped credential",
            req.method()
        ))
        .into_response();
    }
    req.extensions_mut().insert(caller);
    next.run(req).await
}
