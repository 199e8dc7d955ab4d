//! Bearer-token authentication and the tenant scoping every handler applies.
//!
//! [`authenticate`] runs before any body is read: it resolves `Authorization: Bearer <token>`
//! to a [`Principal`] through [`AdminConfig::principal`] (constant-time comparisons) and stores
//! a [`Caller`] in the request; without one, 401 with `WWW-Authenticate: Bearer`. Handlers take
//! [`Caller`] as an extractor, which fails closed (401) if the middleware did not run.
//!
//! Scoping rules:
//! - reads of something another tenant owns answer 404, exactly as if it did not exist, so a
//!   tenant token cannot probe for other tenants' ids ([`Caller::sees`]);
//! - writes naming another tenant answer 403 ([`Caller::may_write_for`]): the answer is the
//!   same whatever the named tenant, so it reveals nothing about it, and it tells an honest
//!   caller what is wrong instead of pretending the tenant does not exist.
//!
//! Tokens are never logged or echoed.

use axum::extract::{FromRequestParts, Request, State};
use axum::http::header;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::config::Principal;
use crate::id::Tenant;

use super::AdminState;
use super::error::ApiError;

/// Who is calling, as established by the bearer token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller(pub Principal);

impl Caller {
    /// The tenant a tenant token acts for; `None` for an operator.
    pub fn tenant(&self) -> Option<&Tenant> {
        match &self.0 {
            Principal::Operator => None,
            Principal::Tenant(t) => Some(t),
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

/// Middleware: resolves the bearer token or answers 401.
pub async fn authenticate(
    State(state): State<AdminState>,
    mut req: Request,
    next: Next,
) -> Response {
    let principal = bearer(&req).and_then(|token| state.auth.principal(token));
    match principal {
        Some(p) => {
            req.extensions_mut().insert(Caller(p));
            next.run(req).await
        }
        None => ApiError::Unauthorized.into_response(),
    }
}
