//! Replays through the API and their audit trail.
//!
//! A tenant (or an operator) sends again one dead or delivered delivery (`POST
//! /v1/deliveries/{id}/replay`) or every dead delivery of one endpoint within a time range
//! (`POST /v1/endpoints/{id}/replay`), as a customer's dashboard would once the receiver is
//! fixed: same `webhook-id`, a fresh retry window, the replay id in `hookline-replay-id`, one
//! audit entry per request, naming the tenant. `GET /v1/replays` lists the audit trail (who
//! replayed what, why, when and how many, newest first): all of it for operators, and a
//! tenant's own replays for its tokens, since one `hookline replay` may cover many tenants'
//! deliveries.

use std::sync::Arc;
use std::time::SystemTime;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use crate::id::EndpointId;
use crate::replay::{
    ApiReplayer, Asked, EndpointReplayRequest, ReplayError, ReplayRequest, ReplaySummary, refusal,
    standing,
};
use crate::storage::ReplayAudit;

use super::AdminState;
use super::auth::Caller;
use super::body::{ApiJson, ApiQuery, OptionalJson};
use super::endpoints::{limit, path, time};
use super::error::ApiError;

/// Default number of entries.
pub const DEFAULT_REPLAYS_LIMIT: usize = 50;
/// Most entries one request returns (the CQL store reads at most this many).
pub const MAX_REPLAYS_LIMIT: usize = crate::storage::scylla::MAX_REPLAYS_READ as usize;

/// `GET /v1/replays` query.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplaysParams {
    /// How many, 1 to [`MAX_REPLAYS_LIMIT`], default [`DEFAULT_REPLAYS_LIMIT`].
    pub limit: Option<String>,
}

/// One replay as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayEntry {
    /// `rpl_...`, the `hookline-replay-id` receivers saw.
    pub replay_id: String,
    /// Who asked for it.
    pub actor: String,
    /// Why.
    pub reason: String,
    /// When it ran (RFC 3339).
    pub at: String,
    /// What it covered (DLQ topic, partition, offsets, endpoint).
    pub scope: String,
    /// Records republished (in a dry run, counted).
    pub count: u64,
    /// Whether nothing was republished on purpose.
    pub dry_run: bool,
    /// The tenant whose deliveries it covered, when it covered one tenant's alone; `null` for a
    /// range of DLQ offsets that held several tenants' (or republished none), and for entries
    /// written before schema version 6.
    pub tenant: Option<String>,
    /// Which credential asked (`key tk_... (name)`, `tenant token`, `operator token`, `portal
    /// link (acme)`, `cli`), as hookline established it; `actor` is what the caller said of
    /// itself. `null` for entries written before hookline recorded it.
    pub asked_by: Option<String>,
}

impl ReplayEntry {
    fn of(a: &ReplayAudit) -> ReplayEntry {
        ReplayEntry {
            replay_id: a.replay_id.clone(),
            actor: a.actor.clone(),
            reason: a.reason.clone(),
            at: time(a.at),
            scope: a.scope.clone(),
            count: a.count,
            dry_run: a.dry_run,
            tenant: a.tenant.as_ref().map(ToString::to_string),
            asked_by: a.asked_by.clone(),
        }
    }
}

/// `GET /v1/replays` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayList {
    /// Newest first.
    pub data: Vec<ReplayEntry>,
}

/// `POST /v1/replays` body: a range of DLQ offsets, as `hookline replay` takes it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RangeReplayParams {
    /// The DLQ partition.
    pub partition: i32,
    /// First offset, inclusive.
    pub from_offset: i64,
    /// Last offset, inclusive; past the partition's end, up to its last record.
    pub to_offset: i64,
    /// Only this endpoint's records.
    pub endpoint: Option<String>,
    /// Who asks; recorded with the token's kind.
    pub actor: Option<String>,
    /// Why.
    pub reason: Option<String>,
    /// Count what would be replayed, republish nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// `POST /v1/replays` answer: 202 (200 for a dry run).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeReplayed {
    /// What it did.
    #[serde(flatten)]
    pub summary: ReplaySummary,
    /// Whether nothing was republished on purpose.
    pub dry_run: bool,
}

/// `POST /v1/replays`: what `hookline replay` does, for operators who reach the API and not a
/// shell: republishes a range of DLQ offsets (optionally one endpoint's records) with a fresh
/// window and a replay id, audited. Operator tokens only (403 for a tenant's: a range holds
/// many tenants' deliveries). 422 names the field at fault (a partition the DLQ does not have,
/// offsets not in it); 503 when Kafka does not answer, or a replay stops short of its range
/// (the detail says where, and what it republished).
pub async fn replay_range(
    State(state): State<AdminState>,
    caller: Caller,
    ApiJson(req): ApiJson<RangeReplayParams>,
) -> Result<(StatusCode, Json<RangeReplayed>), ApiError> {
    if caller.tenant().is_some() {
        return Err(ApiError::Forbidden(
            "replaying DLQ offsets is for operator tokens: a range holds many tenants' \
             deliveries; replay a delivery or an endpoint's instead"
                .into(),
        ));
    }
    if req.partition < 0 {
        return Err(ApiError::invalid("partition", "must be 0 or more"));
    }
    if req.from_offset < 0 {
        return Err(ApiError::invalid("from_offset", "must be 0 or more"));
    }
    if req.to_offset < req.from_offset {
        return Err(ApiError::invalid("to_offset", "is before from_offset"));
    }
    let endpoint = req
        .endpoint
        .as_deref()
        .map(|e| EndpointId::parse(e).map_err(|e| ApiError::invalid("endpoint", e.to_string())))
        .transpose()?;
    let (actor, reason) = who_and_why(&caller, req.actor, req.reason)?;
    let request = ReplayRequest {
        partition: req.partition,
        from_offset: req.from_offset,
        to_offset: req.to_offset,
        endpoint,
        actor,
        reason,
        dry_run: req.dry_run,
    };
    let asked_by = caller.asked_by();
    let done = on_replayer(&state, move |r| async move {
        r.replay_range(&request, asked_by).await
    })
    .await?;
    tracing::info!(replay_id = %done.replay_id, replayed = done.replayed, dry_run = req.dry_run,
        "DLQ range replayed");
    let status = if req.dry_run {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((
        status,
        Json(RangeReplayed {
            summary: done,
            dry_run: req.dry_run,
        }),
    ))
}

/// `GET /v1/replays?limit=`: the latest replays, newest first. An operator token reads every
/// one; a tenant token those that covered its own deliveries alone (by delivery id, by
/// endpoint, or a range of DLQ offsets that held its deliveries alone), since a range may hold
/// many tenants' deliveries.
pub async fn list(
    State(state): State<AdminState>,
    caller: Caller,
    q: Result<ApiQuery<ReplaysParams>, ApiError>,
) -> Result<Json<ReplayList>, ApiError> {
    let ApiQuery(params) = q?;
    let limit = limit(
        params.limit.as_deref(),
        DEFAULT_REPLAYS_LIMIT,
        MAX_REPLAYS_LIMIT,
    )?;
    let audits = state
        .deliveries
        .replays(caller.tenant(), u32::try_from(limit).unwrap_or(u32::MAX))
        .await?;
    Ok(Json(ReplayList {
        data: audits.iter().map(ReplayEntry::of).collect(),
    }))
}

/// Longest `actor` or `reason` of a replay.
pub const MAX_REPLAY_TEXT: usize = 500;

/// `POST /v1/deliveries/{id}/replay` body; both fields may be left out, and so may the body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayParams {
    /// Who asks (a dashboard's user, say); the audit entry records it with the token's kind.
    pub actor: Option<String>,
    /// Why; recorded in the audit entry.
    pub reason: Option<String>,
}

/// The audit entry's actor and reason from a request's `actor` and `reason`, each checked
/// when given: the actor is recorded with the kind of token that asked.
fn who_and_why(
    caller: &Caller,
    actor: Option<String>,
    reason: Option<String>,
) -> Result<(String, String), ApiError> {
    let text = |field: &str, value: Option<String>| -> Result<Option<String>, ApiError> {
        match value {
            Some(v) if v.trim().is_empty() => {
                Err(ApiError::invalid(field, "must not be blank when given"))
            }
            Some(v) if v.chars().count() > MAX_REPLAY_TEXT => Err(ApiError::invalid(
                field,
                format!("is longer than {MAX_REPLAY_TEXT} characters"),
            )),
            Some(v) if v.chars().any(char::is_control) => Err(ApiError::invalid(
                field,
                "must not contain control characters",
            )),
            v => Ok(v),
        }
    };
    let actor = text("actor", actor)?;
    let reason = text("reason", reason)?;
    let token = match caller.tenant() {
        Some(t) => format!("tenant {t}'s API token"),
        None => "an operator's API token".to_owned(),
    };
    let actor = match actor {
        Some(a) => format!("{a} (with {token})"),
        None => format!("with {token}"),
    };
    let reason = reason.unwrap_or_else(|| "replayed through the admin API".into());
    Ok((actor, reason))
}

/// 409 unless `endpoint` would take a replay: deleted or disabled, it would be dead-lettered
/// again.
fn takes_replays(state: &AdminState, endpoint: &EndpointId) -> Result<(), ApiError> {
    match state.endpoints.view().get(endpoint) {
        None => Err(ApiError::Conflict(format!(
            "endpoint {endpoint} was deleted: a replay would be dead-lettered again"
        ))),
        Some(e) if !e.enabled => Err(ApiError::Conflict(format!(
            "endpoint {endpoint} is disabled ({}): a replay would be dead-lettered again; \
             re-enable it first (PATCH /v1/endpoints/{endpoint} {{\"enabled\": true}})",
            e.disabled_reason.as_deref().unwrap_or("no reason given")
        ))),
        Some(_) => Ok(()),
    }
}

/// Runs `replay` with the process's replayer (503 without one) on a task of its own: a
/// request cut at the API's deadline, or dropped by its client, must not stop a replay halfway,
/// with records republished and no audit entry; the task finishes and records it.
async fn on_replayer<T, F>(
    state: &AdminState,
    replay: impl FnOnce(Arc<dyn ApiReplayer>) -> F,
) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: Future<Output = Result<T, ReplayError>> + Send + 'static,
{
    let replayer = state
        .replayer
        .clone()
        .ok_or_else(|| ApiError::Unavailable("replay is not available in this process".into()))?;
    tokio::spawn(replay(replayer))
        .await
        .map_err(|e| ApiError::Internal(format!("the replay task failed: {e}")))?
        .map_err(replay_failed)
}

/// A failed replay as the API answers it: 410 for a dead letter past the DLQ's retention, 422
/// for a DLQ range that is not there, 500 for a record the deliveries topic refuses for good,
/// 503 for everything else (Kafka slow or away, a replay stopped short, the audit entry not
/// written), with what happened.
fn replay_failed(e: ReplayError) -> ApiError {
    match e {
        gone @ (ReplayError::DeadLetterGone { .. }
        | ReplayError::RecordGone { .. }
        | ReplayError::RecordNotKept { .. }) => ApiError::Gone(gone.to_string()),
        // Not dead after all, or another replay got to it first (checked before, and again
        // as the replay claimed it).
        ReplayError::Refused(why) => ApiError::Conflict(why),
        // A range the DLQ does not hold is the caller's mistake, not an outage.
        ReplayError::NoPartition {
            topic,
            partitions,
            partition,
        } => ApiError::invalid(
            "partition",
            format!(
                "{partition} is not a partition of {topic}, which has {partitions} (0 to {})",
                partitions - 1
            ),
        ),
        ReplayError::OutOfRange {
            partition,
            low,
            high,
            from,
            to,
        } => ApiError::invalid(
            "from_offset",
            format!(
                "{from}..={to} is not in DLQ partition {partition}, which holds offsets \
                 {low}..{high} (exclusive end)"
            ),
        ),
        // Not an outage: asking again is refused the same way.
        refused @ ReplayError::RefusedByTopic { .. } => ApiError::Internal(refused.to_string()),
        other => ApiError::Unavailable(other.to_string()),
    }
}

/// `POST /v1/deliveries/{id}/replay` answer (202).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replayed {
    /// The replay's id, sent to the receiver as `hookline-replay-id`.
    pub replay_id: String,
    /// The delivery replayed.
    pub delivery_id: String,
    /// Where the record sent again was read.
    pub from: ReplayedFrom,
}

/// Where a replayed record was read: its dead letter in the DLQ topic, or, for a delivered
/// delivery, the record its last attempt sent in the deliveries topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayedFrom {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The record's offset.
    pub offset: i64,
}

/// `POST /v1/deliveries/{id}/replay`: sends a dead-lettered or a delivered delivery again, with
/// a fresh retry window and the same `webhook-id`, through the same lanes and limits as any
/// delivery. A dead one's DLQ record is republished as `hookline replay` does; a delivered
/// one's record is read where its last attempt logged it in the deliveries topic; either with
/// an audit entry. 409 when the delivery is being retried or not attempted yet, is on its way
/// from an earlier replay whose attempt is not logged yet, is claimed by another replay that
/// has not republished it yet (two requests at once: one sends it), or its endpoint cannot take
/// it (deleted, disabled); 410 when its record is past its topic's retention (or, for a
/// delivered one, its place was not logged); 503 when Kafka does not answer in time.
pub async fn replay_delivery(
    State(state): State<AdminState>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
    OptionalJson(req): OptionalJson<ReplayParams>,
) -> Result<(StatusCode, Json<Replayed>), ApiError> {
    let raw = path(id)?;
    let (actor, reason) = who_and_why(&caller, req.actor, req.reason)?;
    let delivery = super::deliveries::visible(&state, &caller, &raw).await?;
    let id = &delivery.delivery_id;
    let standing = standing(state.deliveries.as_ref(), &delivery).await?;
    if let Some(why) = refusal(id, &standing) {
        return Err(ApiError::Conflict(why));
    }
    takes_replays(&state, &delivery.endpoint_id)?;
    let id = id.clone();
    let asked = Asked {
        actor,
        reason,
        asked_by: Some(caller.asked_by()),
    };
    let done = on_replayer(
        &state,
        move |r| async move { r.replay(&delivery, asked).await },
    )
    .await?;
    tracing::info!(delivery = %id, replay_id = %done.replay_id, "delivery replayed");
    Ok((
        StatusCode::ACCEPTED,
        Json(Replayed {
            replay_id: done.replay_id,
            delivery_id: id.to_string(),
            from: ReplayedFrom {
                topic: done.topic,
                partition: done.from.partition,
                offset: done.from.offset,
            },
        }),
    ))
}

/// `POST /v1/endpoints/{id}/replay` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointReplayParams {
    /// RFC 3339: dead letters written at or after it.
    pub since: String,
    /// RFC 3339: and at or before it; now when left out.
    pub until: Option<String>,
    /// As for one delivery.
    pub actor: Option<String>,
    /// As for one delivery.
    pub reason: Option<String>,
}

/// `POST /v1/endpoints/{id}/replay` answer (202).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointReplayed {
    /// The replay's id, sent to the receiver as `hookline-replay-id`.
    pub replay_id: String,
    /// The endpoint.
    pub endpoint_id: String,
    /// Deliveries sent again.
    pub replayed: u64,
    /// Dead letters in range whose delivery is no longer dead (delivered or being retried
    /// since), is on its way from an earlier replay, or is claimed by another replay; left
    /// alone.
    pub skipped: u64,
    /// Whether the whole range was covered.
    pub complete: bool,
    /// When not: ask again with this as `since` to cover the rest.
    pub resume_since: Option<String>,
    /// When not: why it stopped short.
    pub detail: Option<String>,
}

/// `POST /v1/endpoints/{id}/replay`: sends again every dead delivery of an endpoint whose dead
/// letter was written within `since..=until` and that is still dead, as a customer does after
/// fixing a receiver that was down. Each is sent once, with the same `webhook-id` and one replay
/// id. One request reads the DLQ for at most 15 s; a range it could not cover answers
/// `complete: false` with the `resume_since` to ask again with. 404 for an endpoint the caller
/// does not see, 409 for one disabled, 503 when Kafka does not answer.
pub async fn replay_endpoint(
    State(state): State<AdminState>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
    ApiJson(req): ApiJson<EndpointReplayParams>,
) -> Result<(StatusCode, Json<EndpointReplayed>), ApiError> {
    let raw = path(id)?;
    let now = SystemTime::now();
    let at = |field: &str, s: &str| {
        super::events::parse_time(s).ok_or_else(|| {
            ApiError::invalid(field, "must be an RFC 3339 time, e.g. 2026-03-01T12:00:00Z")
        })
    };
    let since = at("since", &req.since)?;
    let until = match &req.until {
        Some(u) => at("until", u)?,
        None => now,
    };
    if since > now {
        return Err(ApiError::invalid("since", "is in the future"));
    }
    if until < since {
        return Err(ApiError::invalid("until", "is before since"));
    }
    let (actor, reason) = who_and_why(&caller, req.actor, req.reason)?;
    let endpoint = super::endpoints::visible(&state, &caller, &raw)?;
    takes_replays(&state, &endpoint.id)?;
    let request = EndpointReplayRequest {
        endpoint: endpoint.id.clone(),
        tenant: endpoint.tenant.clone(),
        since,
        until,
        actor,
        reason,
        asked_by: Some(caller.asked_by()),
    };
    let done = on_replayer(
        &state,
        move |r| async move { r.replay_endpoint(&request).await },
    )
    .await?;
    tracing::info!(endpoint = %endpoint.id, replay_id = %done.replay_id,
        replayed = done.replayed, complete = done.resume_since.is_none(), "endpoint replayed");
    Ok((
        StatusCode::ACCEPTED,
        Json(EndpointReplayed {
            replay_id: done.replay_id,
            endpoint_id: endpoint.id.to_string(),
            replayed: done.replayed,
            skipped: done.skipped,
            complete: done.resume_since.is_none(),
            resume_since: done.resume_since.map(time),
            detail: done.stopped,
        }),
    ))
}
