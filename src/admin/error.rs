//! The admin API's one error type and its JSON form `{"code","detail"}`.
//!
//! Every handler returns [`ApiError`]; the errors of the modules it calls (registry, store,
//! event sink, endpoint rules) are mapped here, in one place, to a status and a stable `code`.
//! Details name the field or parameter at fault and never carry secrets, tokens or internals:
//! an [`ApiError::Internal`] is logged in full and answered with a fixed sentence.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::endpoint::EndpointError;
use crate::registry::RegistryError;
use crate::storage::StoreError;
use crate::subscription::FilterError;

/// What the admin API answers when a request does not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400 `bad_request`: the body is not JSON or cannot be read, or a path cannot be read.
    /// (JSON or a query string of the wrong shape is 422 [`ApiError::Invalid`].)
    #[error("{0}")]
    BadRequest(String),
    /// 401 `unauthorized`: no bearer token, or one that is not configured.
    #[error("a valid bearer token is required")]
    Unauthorized,
    /// 401 `unauthorized` with a detail: a credential that was valid and no longer is (an
    /// expired portal link, a revoked key), or a portal link that is not valid.
    #[error("{0}")]
    Unauthenticated(String),
    /// 403 `forbidden`: a tenant token writing under another tenant's name.
    #[error("{0}")]
    Forbidden(String),
    /// 404 `not_found`: absent, or belonging to a tenant the caller does not act for (the two
    /// are indistinguishable on purpose).
    #[error("{0}")]
    NotFound(String),
    /// 405 `method_not_allowed`: the route exists, the method does not.
    #[error("this route does not accept that method")]
    MethodNotAllowed,
    /// 409 `conflict`: a concurrent write won, or an event id reused for a different event.
    #[error("{0}")]
    Conflict(String),
    /// 410 `gone`: it existed, but what the request needs of it is gone for good (a dead
    /// letter past the DLQ's retention).
    #[error("{0}")]
    Gone(String),
    /// 413 `payload_too_large`.
    #[error("{0}")]
    PayloadTooLarge(String),
    /// 415 `unsupported_media_type`: a body that says it is not JSON.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// 422 `invalid`: well-formed but breaks a rule; `field` names the field or parameter.
    #[error("{field}: {reason}")]
    Invalid {
        /// The field (`url`, `event_types[2]`) or query parameter (`limit`).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// 503 `unavailable`: Kafka, the store or the endpoint view did not answer in time.
    #[error("{0}")]
    Unavailable(String),
    /// 500 `internal`: logged with this detail, answered without it.
    #[error("internal error: {0}")]
    Internal(String),
}

/// The JSON body of every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ErrorBody {
    /// Stable, machine-readable code (`invalid`, `not_found`, ...).
    pub code: String,
    /// A sentence for humans; names the field when one is at fault.
    pub detail: String,
}

impl ApiError {
    /// A 422 naming `field`. A reason that starts with the field's own name (an id's error,
    /// `tenant must not be empty`) drops it, so the detail reads `tenant: must not be empty`.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ApiError {
        let (field, reason) = (field.into(), reason.into());
        let reason = match reason.strip_prefix(field.as_str()) {
            Some(rest) if rest.starts_with(' ') && !rest.trim().is_empty() => {
                rest.trim_start().to_owned()
            }
            _ => reason,
        };
        ApiError::Invalid { field, reason }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized | ApiError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Gone(_) => StatusCode::GONE,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The stable `code` of the JSON body.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "bad_request",
            ApiError::Unauthorized | ApiError::Unauthenticated(_) => "unauthorized",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::Conflict(_) => "conflict",
            ApiError::Gone(_) => "gone",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::UnsupportedMediaType(_) => "unsupported_media_type",
            ApiError::Invalid { .. } => "invalid",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::Internal(_) => "internal",
        }
    }

    /// The body sent to the client (internal details withheld).
    pub fn body(&self) -> ErrorBody {
        let detail = match self {
            ApiError::Internal(_) => "internal error; the server log has the details".to_owned(),
            other => other.to_string(),
        };
        ErrorBody {
            code: self.code().to_owned(),
            detail,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match &self {
            ApiError::Internal(detail) => tracing::error!(%detail, "admin API internal error"),
            ApiError::Unavailable(detail) => tracing::warn!(%detail, "admin API unavailable"),
            _ => {}
        }
        let mut response = (self.status(), Json(self.body())).into_response();
        if matches!(self, ApiError::Unauthorized | ApiError::Unauthenticated(_)) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<EndpointError> for ApiError {
    fn from(e: EndpointError) -> ApiError {
        match e {
            EndpointError::Invalid { field, reason } => ApiError::Invalid { field, reason },
            // A stored secret that does not open is the server's problem, not the caller's.
            sealed @ EndpointError::Sealed { .. } => ApiError::Internal(sealed.to_string()),
        }
    }
}

impl From<crate::tenant::TenantError> for ApiError {
    fn from(e: crate::tenant::TenantError) -> ApiError {
        ApiError::Invalid {
            field: e.field,
            reason: e.reason,
        }
    }
}

/// Maps a filter error onto the `event_types` field it came from.
pub fn filter_error(e: FilterError) -> ApiError {
    match e {
        FilterError::InList { index, source } => {
            ApiError::invalid(format!("event_types[{index}]"), source.to_string())
        }
        other => ApiError::invalid("event_types", other.to_string()),
    }
}

impl From<RegistryError> for ApiError {
    fn from(e: RegistryError) -> ApiError {
        match e {
            RegistryError::Timeout { .. } | RegistryError::Closed | RegistryError::Kafka(_) => {
                tracing::warn!(error = %e, "endpoint registry write failed");
                ApiError::Unavailable(
                    "the endpoint registry did not confirm the write; read the endpoint and retry"
                        .to_owned(),
                )
            }
            RegistryError::Conflict { id, .. } => ApiError::Conflict(format!(
                "endpoint {id} was changed concurrently; read it again and retry"
            )),
            RegistryError::Invalid(e) => e.into(),
            RegistryError::Tenant(e) => e.into(),
            // Raised at start-up only, never by a write.
            RegistryError::Unopened { .. } => ApiError::Internal(e.to_string()),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        match e {
            StoreError::Unavailable(detail) => {
                tracing::warn!(%detail, "delivery store unavailable");
                ApiError::Unavailable("the delivery store is unavailable".to_owned())
            }
            StoreError::BadCursor => {
                ApiError::invalid("cursor", "is not a cursor returned by this API")
            }
            StoreError::Backend(detail) => ApiError::Internal(format!("delivery store: {detail}")),
        }
    }
}
