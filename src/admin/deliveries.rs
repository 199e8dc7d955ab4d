//! Delivery history: one delivery with every attempt, an endpoint's deliveries newest first,
//! and the deliveries of one event.
//!
//! Tenant scoping answers 404 for anything another tenant owns, exactly as for what does not
//! exist. An endpoint's history is readable after the endpoint was deleted (history outlives
//! endpoints): ownership is then read from the history rows themselves, and an endpoint with
//! neither a registration nor visible rows is 404. An event whose deliveries are all another
//! tenant's, or that has no recorded delivery yet, is 404 too (the two must look the same).
//!
//! Every delivery the fan-out recorded is listed, in every state: pending (not attempted yet),
//! scheduled (a retry, or parked, with its reason and time), succeeded, dead (with its reason,
//! attempted or not). A delivery fanned out before hookline recorded fan-outs shows from its
//! first attempt or note on. One delivery also shows the request it sent ([`super::sent`]).

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};

use crate::id::{DeliveryId, EndpointId, EventId};
use crate::storage::{AttemptOutcome, AttemptRow, DeliveryState, DeliveryStatus, HistoryQuery};

use super::AdminState;
use super::auth::Caller;
use super::body::ApiQuery;
use super::endpoints::{limit, path, short, time};
use super::error::ApiError;
use super::sent::{SentRequest, sent};

/// Default page size of an endpoint's history.
pub const DEFAULT_HISTORY_LIMIT: usize = 50;
/// Largest page size of an endpoint's history (the store's own ceiling).
pub const MAX_HISTORY_LIMIT: usize = crate::storage::MAX_PAGE as usize;

/// A delivery's state as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryBody {
    /// `dlv_...`, derived from (event id, endpoint id).
    pub id: String,
    /// The event (`webhook-id`).
    pub event_id: String,
    /// The endpoint.
    pub endpoint_id: String,
    /// The owner.
    pub tenant: String,
    /// The event type.
    pub event_type: String,
    /// `pending` (not attempted yet), `scheduled` (waiting in a delay tier), `succeeded` or
    /// `dead`.
    pub state: String,
    /// Why it is scheduled (`retry`, `breaker_open`, ...) or dead (`window_exhausted`, ...);
    /// `null` while pending or once succeeded.
    pub reason: Option<String>,
    /// Attempts made so far, replays included.
    pub attempts: u32,
    /// When hookline created it (its fan-out).
    pub created_at: String,
    /// When its state last changed.
    pub updated_at: String,
    /// When the first attempt started; `null` before any.
    pub first_attempt_at: Option<String>,
    /// When the latest attempt started; `null` before any.
    pub last_attempt_at: Option<String>,
    /// When it is due again, while scheduled.
    pub next_attempt_at: Option<String>,
    /// The latest HTTP status, if a response arrived.
    pub last_status: Option<u16>,
    /// The latest error class (`timeout`, `http_status`, ...), if the attempt failed.
    pub last_error_class: Option<String>,
}

impl DeliveryBody {
    /// The public form of `s`.
    pub fn of(s: &DeliveryState) -> DeliveryBody {
        let reason = match s.status {
            DeliveryStatus::Scheduled => s.scheduled.map(|x| x.reason.as_str().to_owned()),
            DeliveryStatus::Dead => s.dead_reason.map(|r| r.as_str().to_owned()),
            DeliveryStatus::Pending | DeliveryStatus::Succeeded => None,
        };
        DeliveryBody {
            id: s.delivery_id.to_string(),
            event_id: s.event_id.to_string(),
            endpoint_id: s.endpoint_id.to_string(),
            tenant: s.tenant.to_string(),
            event_type: s.event_type.clone(),
            state: s.status.as_str().to_owned(),
            reason,
            attempts: s.attempts,
            created_at: time(s.created_at),
            updated_at: time(s.updated_at),
            first_attempt_at: s.first_attempt_at.map(time),
            last_attempt_at: s.last_attempt_at.map(time),
            next_attempt_at: s
                .scheduled
                .filter(|_| s.status == DeliveryStatus::Scheduled)
                .map(|x| time(x.next_attempt_at)),
            last_status: s.last_status,
            last_error_class: s.last_error_class.map(|c| c.as_str().to_owned()),
        }
    }
}

/// One attempt as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptBody {
    /// 1 for the first attempt (counting again from 1 in a replay).
    pub attempt: u32,
    /// When it started.
    pub started_at: String,
    /// The HTTP status, `null` when no response arrived.
    pub status: Option<u16>,
    /// How long it took.
    pub latency_ms: u32,
    /// The error class, `null` for a 2xx.
    pub error_class: Option<String>,
    /// The first bytes of the response body (at most 4 KiB), as UTF-8 with invalid sequences
    /// replaced.
    pub response_body: String,
    /// Ids of the keys whose signatures were sent.
    pub signing_key_ids: Vec<String>,
    /// The replay this attempt belongs to, if any.
    pub replay_id: Option<String>,
    /// `succeeded`, `retry_scheduled` or `dead`.
    pub outcome: String,
    /// For `retry_scheduled`: when the next attempt is due.
    pub next_attempt_at: Option<String>,
    /// For `dead`: why (`http_status`, `gone`, `window_exhausted`, ...).
    pub dead_reason: Option<String>,
}

impl AttemptBody {
    /// The public form of `r`.
    pub fn of(r: &AttemptRow) -> AttemptBody {
        let (outcome, next_attempt_at, dead_reason) = match r.outcome {
            AttemptOutcome::Succeeded => ("succeeded", None, None),
            AttemptOutcome::RetryScheduled { next_attempt_at } => {
                ("retry_scheduled", Some(time(next_attempt_at)), None)
            }
            AttemptOutcome::Dead { reason } => ("dead", None, Some(reason.as_str().to_owned())),
        };
        AttemptBody {
            attempt: r.attempt,
            started_at: time(r.started_at),
            status: r.status,
            latency_ms: r.latency_ms,
            error_class: r.error_class.map(|c| c.as_str().to_owned()),
            response_body: String::from_utf8_lossy(&r.response_body).into_owned(),
            signing_key_ids: r.signing_key_ids.clone(),
            replay_id: r.replay_id.clone(),
            outcome: outcome.to_owned(),
            next_attempt_at,
            dead_reason,
        }
    }
}

/// `GET /v1/deliveries/{id}` answer.
#[derive(Debug, Clone, Serialize)]
pub struct DeliveryDetail {
    /// Where it stands.
    pub delivery: DeliveryBody,
    /// Every attempt, oldest first.
    pub attempts: Vec<AttemptBody>,
    /// What it sent (or will send): `null` when the store no longer holds the event's body.
    pub request: Option<SentRequest>,
    /// Why `request` is `null`; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_unavailable: Option<&'static str>,
}

/// A list of deliveries, with a cursor when paged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryList {
    /// The deliveries.
    pub data: Vec<DeliveryBody>,
    /// Pass as `cursor` for the next page; `null` at the end (absent where there is no paging).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<Option<String>>,
}

/// The delivery `raw` names, if the caller may see it; else 404, the same for a malformed id,
/// an unknown one and another tenant's.
pub(super) async fn visible(
    state: &AdminState,
    caller: &Caller,
    raw: &str,
) -> Result<DeliveryState, ApiError> {
    let not_found = || ApiError::NotFound(format!("delivery {} not found", short(raw)));
    let Ok(id) = DeliveryId::parse(raw) else {
        return Err(not_found());
    };
    state
        .deliveries
        .delivery(&id)
        .await?
        .filter(|d| caller.sees(&d.tenant))
        .ok_or_else(not_found)
}

/// `GET /v1/deliveries/{id}`.
pub async fn get(
    State(state): State<AdminState>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<DeliveryDetail>, ApiError> {
    let delivery = visible(&state, &caller, &path(id)?).await?;
    let attempts = state.deliveries.attempts(&delivery.delivery_id).await?;
    let sent = sent(state.deliveries.as_ref(), &delivery, &attempts).await?;
    Ok(Json(DeliveryDetail {
        delivery: DeliveryBody::of(&delivery),
        attempts: attempts.iter().map(AttemptBody::of).collect(),
        request_unavailable: sent.as_ref().err().copied(),
        request: sent.ok(),
    }))
}

/// What `state=` accepts, as the 422 lists it.
const STATE_VALUES: &str =
    "must be pending, scheduled, succeeded or dead (failed is read as scheduled)";

/// `GET /v1/endpoints/{id}/deliveries` query.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryParams {
    /// `pending`, `scheduled` (or `failed`), `succeeded` or `dead`.
    pub state: Option<String>,
    /// RFC 3339: only deliveries created at or after it.
    pub since: Option<String>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// Page size, 1 to 500, default 50.
    pub limit: Option<String>,
}

impl HistoryParams {
    /// The store query these parameters ask for; errors name the parameter.
    pub fn to_query(&self) -> Result<HistoryQuery, ApiError> {
        let status = self
            .state
            .as_deref()
            .map(|s| {
                DeliveryStatus::parse(s).ok_or_else(|| ApiError::invalid("state", STATE_VALUES))
            })
            .transpose()?;
        let since = time_param("since", self.since.as_deref())?;
        let cursor = cursor_param(self.cursor.as_deref())?;
        let limit = limit(
            self.limit.as_deref(),
            DEFAULT_HISTORY_LIMIT,
            MAX_HISTORY_LIMIT,
        )?;
        Ok(HistoryQuery {
            status,
            since,
            cursor,
            limit: limit as u32,
        })
    }
}

/// The query parameter `field`, an RFC 3339 time, if given; the error names `field`.
pub(super) fn time_param(
    field: &str,
    raw: Option<&str>,
) -> Result<Option<std::time::SystemTime>, ApiError> {
    raw.map(|s| {
        super::events::parse_time(s).ok_or_else(|| {
            ApiError::invalid(field, "must be an RFC 3339 time, e.g. 2026-03-01T12:00:00Z")
        })
    })
    .transpose()
}

/// A page cursor, if given: refused here when it cannot be one this API issued, and by the
/// store when it is not one it issued.
pub(super) fn cursor_param(raw: Option<&str>) -> Result<Option<String>, ApiError> {
    match raw {
        Some("") => Err(ApiError::invalid("cursor", "must not be empty")),
        Some(c) if c.len() > 512 => Err(ApiError::invalid(
            "cursor",
            "is not a cursor returned by this API",
        )),
        c => Ok(c.map(str::to_owned)),
    }
}

/// `GET /v1/endpoints/{id}/deliveries?state=&since=&cursor=&limit=`: newest first.
pub async fn by_endpoint(
    State(state): State<AdminState>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
    q: Result<ApiQuery<HistoryParams>, ApiError>,
) -> Result<Json<DeliveryList>, ApiError> {
    let raw = path(id)?;
    let ApiQuery(params) = q?;
    let not_found = || ApiError::NotFound(format!("endpoint {} not found", short(&raw)));
    let Ok(id) = EndpointId::parse(raw.as_str()) else {
        return Err(not_found());
    };
    let registered = state.endpoints.view().get(&id);
    if let Some(e) = &registered
        && !caller.sees(&e.tenant)
    {
        return Err(not_found());
    }
    let page = state
        .deliveries
        .endpoint_deliveries(&id, &params.to_query()?)
        .await?;
    if registered.is_none() {
        // Deleted (or never registered): the rows say whose it was.
        if page.items.is_empty() || page.items.iter().any(|d| !caller.sees(&d.tenant)) {
            return Err(not_found());
        }
    }
    Ok(Json(DeliveryList {
        data: page.items.iter().map(DeliveryBody::of).collect(),
        next_cursor: Some(page.next_cursor),
    }))
}

/// `GET /v1/events/{id}/deliveries`: one row per endpoint the event went to, ordered by
/// endpoint id.
pub async fn by_event(
    State(state): State<AdminState>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<DeliveryList>, ApiError> {
    let raw = path(id)?;
    let not_found = || {
        ApiError::NotFound(format!(
            "no deliveries of event {} are recorded",
            short(&raw)
        ))
    };
    let Ok(id) = EventId::parse(raw.as_str()) else {
        return Err(not_found());
    };
    let mut rows: Vec<DeliveryState> = state
        .deliveries
        .event_deliveries(&id)
        .await?
        .into_iter()
        .filter(|d| caller.sees(&d.tenant))
        .collect();
    if rows.is_empty() {
        return Err(not_found());
    }
    rows.sort_by(|a, b| a.endpoint_id.cmp(&b.endpoint_id));
    Ok(Json(DeliveryList {
        data: rows.iter().map(DeliveryBody::of).collect(),
        next_cursor: None,
    }))
}
