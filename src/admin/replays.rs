//! The replay audit trail: who replayed what, why, when and how many, newest first. Replays are
//! started by `hookline replay` (by DLQ offsets) and `POST /v1/deliveries/{id}/replay`; the
//! trail is for operators, since an entry may cover many tenants' deliveries.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};

use crate::storage::ReplayAudit;

use super::AdminState;
use super::auth::Caller;
use super::body::ApiQuery;
use super::endpoints::{limit, time};
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
        }
    }
}

/// `GET /v1/replays` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayList {
    /// Newest first.
    pub data: Vec<ReplayEntry>,
}

/// `GET /v1/replays?limit=`: the latest replays, newest first; operators only (403 for a
/// tenant token).
pub async fn list(
    State(state): State<AdminState>,
    caller: Caller,
    q: Result<ApiQuery<ReplaysParams>, ApiError>,
) -> Result<Json<ReplayList>, ApiError> {
    if caller.tenant().is_some() {
        return Err(ApiError::Forbidden(
            "the replay audit trail is for operator tokens: an entry may cover many tenants".into(),
        ));
    }
    let ApiQuery(params) = q?;
    let limit = limit(
        params.limit.as_deref(),
        DEFAULT_REPLAYS_LIMIT,
        MAX_REPLAYS_LIMIT,
    )?;
    let audits = state
        .deliveries
        .replays(u32::try_from(limit).unwrap_or(u32::MAX))
        .await?;
    Ok(Json(ReplayList {
        data: audits.iter().map(ReplayEntry::of).collect(),
    }))
}
