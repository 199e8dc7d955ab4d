//! Where attempts, delivery state, dead letters and replay audits are kept.
//!
//! The pipeline talks to [`DeliveryStore`] only. Two implementations: [`memory::MemoryStore`]
//! (embedded, bounded; `hookline dev` and tests) and [`scylla::ScyllaStore`] (ScyllaDB /
//! Cassandra) for production. [`conformance`] is one behavioural suite both must pass.
//!
//! Contract that the delivery stage relies on: when `record_attempt` returns `Ok`, the attempt
//! and the delivery state it implies are durable. A Kafka record is settled only after that.

use std::time::SystemTime;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::attempt::ErrorClass;
use crate::dead_reason::DeadReason;
use crate::id::{DeliveryId, EndpointId, EventId, Tenant};

pub mod conformance;
#[cfg(test)]
pub mod hooked;
pub mod memory;
pub mod scylla;

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryStatus {
    /// Fanned out, no attempt finished yet (or parked before its first attempt).
    Pending,
    /// A 2xx was received.
    Succeeded,
    /// The last attempt failed and a retry is scheduled.
    Failed,
    /// Dead-lettered.
    Dead,
}

impl DeliveryStatus {
    /// The stable string form (API, CQL).
    pub const fn as_str(self) -> &'static str {
        match self {
            DeliveryStatus::Pending => "pending",
            DeliveryStatus::Succeeded => "succeeded",
            DeliveryStatus::Failed => "failed",
            DeliveryStatus::Dead => "dead",
        }
    }

    /// Parses the string form.
    pub fn parse(s: &str) -> Option<DeliveryStatus> {
        [Self::Pending, Self::Succeeded, Self::Failed, Self::Dead]
            .into_iter()
            .find(|v| v.as_str() == s)
    }
}

/// What an attempt led to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// 2xx: delivered.
    Succeeded,
    /// A retry is scheduled at `next_attempt_at`.
    RetryScheduled {
        /// When the next attempt is due.
        next_attempt_at: SystemTime,
    },
    /// Dead-lettered.
    Dead {
        /// Why.
        reason: DeadReason,
    },
}

/// One HTTP attempt, as logged.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptRow {
    /// The delivery this attempt belongs to.
    pub delivery_id: DeliveryId,
    /// The event (`webhook-id`).
    pub event_id: EventId,
    /// The endpoint.
    pub endpoint_id: EndpointId,
    /// The endpoint's tenant.
    pub tenant: Tenant,
    /// The event's type.
    pub event_type: String,
    /// 1 for the first attempt; counts from 1 again after a replay.
    pub attempt: u32,
    /// When the attempt started.
    pub started_at: SystemTime,
    /// The HTTP status, `None` when no response arrived (timeout, connect error, ...).
    pub status: Option<u16>,
    /// How long the attempt took, in milliseconds.
    pub latency_ms: u32,
    /// The error class, `None` for a 2xx.
    pub error_class: Option<ErrorClass>,
    /// The first bytes of the response body (at most 4096).
    pub response_body: Vec<u8>,
    /// Ids of the keys whose signatures were sent.
    pub signing_key_ids: Vec<String>,
    /// Set when this attempt is part of a replay.
    pub replay_id: Option<String>,
    /// What the attempt led to.
    pub outcome: AttemptOutcome,
    /// Where in the deliveries topic the record this attempt sent was read: a delivered
    /// delivery is sent again from there. `None` in rows logged before hookline kept it.
    pub record: Option<RecordPosition>,
}

/// A record's place in a topic hookline knows by its role (the deliveries topic, the DLQ).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecordPosition {
    /// The partition.
    pub partition: i32,
    /// The record's offset.
    pub offset: i64,
}

/// A delivery's current state: one row per (event, endpoint).
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryState {
    /// Deterministic id of (event, endpoint).
    pub delivery_id: DeliveryId,
    /// The event.
    pub event_id: EventId,
    /// The endpoint.
    pub endpoint_id: EndpointId,
    /// The endpoint's tenant.
    pub tenant: Tenant,
    /// The event's type.
    pub event_type: String,
    /// Where it stands.
    pub status: DeliveryStatus,
    /// Attempts made so far (all replays included).
    pub attempts: u32,
    /// When the first attempt started.
    pub first_attempt_at: SystemTime,
    /// When the latest attempt started.
    pub last_attempt_at: SystemTime,
    /// When the next attempt is due, if one is scheduled.
    pub next_attempt_at: Option<SystemTime>,
    /// The latest HTTP status, if any.
    pub last_status: Option<u16>,
    /// The latest error class, if any.
    pub last_error_class: Option<ErrorClass>,
}

/// One replay, for the audit trail.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayAudit {
    /// The replay's id (also sent to receivers in the replay header).
    pub replay_id: String,
    /// Who asked for it.
    pub actor: String,
    /// Why.
    pub reason: String,
    /// When it ran.
    pub at: SystemTime,
    /// What was replayed, human-readable (`dlq partition 0 offsets 10..20, endpoint ep_...`).
    pub scope: String,
    /// How many records were republished.
    pub count: u64,
    /// True when nothing was republished on purpose (`--dry-run`).
    pub dry_run: bool,
    /// The tenant whose deliveries it covered, when it covered one tenant's alone: a replay by
    /// delivery id or by endpoint, or a range of DLQ offsets whose republished records were all
    /// one tenant's (one endpoint's, say); `None` for a range that held several tenants' (or
    /// none). A tenant reads the entries that name it.
    pub tenant: Option<Tenant>,
}

/// The latest replay that republished a delivery (a mark), or that set out to (a claim). A
/// replay marks it once the deliveries topic has the record, so that a second replay asked for
/// before that record's first attempt is logged (the attempt log still shows the delivery as it
/// was) can tell that it is already on its way and does not send it twice. It is settled once
/// an attempt carrying its `replay_id` is logged. A claim, made before the record is sent,
/// keeps two replays asked for at the same moment from both sending it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayMark {
    /// The delivery republished.
    pub delivery_id: DeliveryId,
    /// The replay that republished it.
    pub replay_id: String,
    /// When.
    pub at: SystemTime,
}

/// A history page request: newest first, `cursor` from the previous page.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistoryQuery {
    /// Only deliveries in this state.
    pub status: Option<DeliveryStatus>,
    /// Only deliveries whose first attempt is at or after this time.
    pub since: Option<SystemTime>,
    /// Opaque cursor returned by the previous page.
    pub cursor: Option<String>,
    /// Page size (clamped by the store to 1..=500).
    pub limit: u32,
}

/// One page of history.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    /// The items, newest first.
    pub items: Vec<T>,
    /// Pass this as `cursor` to get the next page; `None` at the end.
    pub next_cursor: Option<String>,
}

/// Largest page a store returns.
pub const MAX_PAGE: u32 = 500;

/// Store failures. The pipeline treats every variant as "not durable": it does not settle, and
/// tries again.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The store cannot be reached or timed out.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The cursor is not one this store issued.
    #[error("invalid cursor")]
    BadCursor,
    /// Anything else the backend reported.
    #[error("store error: {0}")]
    Backend(String),
}

impl StoreError {
    /// The error's kind, without its detail: a bounded label (`unavailable`, `bad_cursor`,
    /// `backend`).
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Unavailable(_) => "unavailable",
            StoreError::BadCursor => "bad_cursor",
            StoreError::Backend(_) => "backend",
        }
    }
}

/// Everything the pipeline and the admin API keep about deliveries.
#[async_trait]
pub trait DeliveryStore: Send + Sync + 'static {
    /// Logs one attempt and updates its delivery's state. Durable when it returns `Ok`.
    async fn record_attempt(&self, row: &AttemptRow) -> Result<(), StoreError>;
    /// The delivery's state, if any attempt was logged for it.
    async fn delivery(&self, id: &DeliveryId) -> Result<Option<DeliveryState>, StoreError>;
    /// Every attempt of a delivery, oldest first.
    async fn attempts(&self, id: &DeliveryId) -> Result<Vec<AttemptRow>, StoreError>;
    /// An endpoint's deliveries, newest first (by first attempt), paged.
    async fn endpoint_deliveries(
        &self,
        endpoint: &EndpointId,
        query: &HistoryQuery,
    ) -> Result<Page<DeliveryState>, StoreError>;
    /// Every delivery of one event (one per endpoint it fanned out to).
    async fn event_deliveries(&self, event: &EventId) -> Result<Vec<DeliveryState>, StoreError>;
    /// Records a replay in the audit trail.
    async fn record_replay(&self, audit: &ReplayAudit) -> Result<(), StoreError>;
    /// The most recent replays, newest first: every one, or only those that name `tenant`
    /// ([`ReplayAudit::tenant`]).
    async fn replays(
        &self,
        tenant: Option<&Tenant>,
        limit: u32,
    ) -> Result<Vec<ReplayAudit>, StoreError>;
    /// Notes that a replay republished a delivery; a later mark of the same delivery replaces
    /// it.
    async fn record_replay_mark(&self, mark: &ReplayMark) -> Result<(), StoreError>;
    /// A delivery's latest replay mark, if any is kept.
    async fn replay_mark(&self, id: &DeliveryId) -> Result<Option<ReplayMark>, StoreError>;
    /// The replay that claimed a delivery last ([`DeliveryStore::claim_replay`]), if any claim
    /// is kept. Reads what every claim made so far wrote.
    async fn replay_claim(&self, id: &DeliveryId) -> Result<Option<ReplayMark>, StoreError>;
    /// Claims `claim.delivery_id` for replay `claim.replay_id`, atomically, if the delivery's
    /// latest claim is still the one named `over` (`None`: it has none). `Ok(true)` when
    /// `claim` is now the latest; `Ok(false)` when another replay's claim came in between, and
    /// this one was not written. Of several replays that read the same claim and race to
    /// replace it, one wins.
    async fn claim_replay(
        &self,
        claim: &ReplayMark,
        over: Option<&str>,
    ) -> Result<bool, StoreError>;
}

impl DeliveryState {
    /// The state a delivery is in after `row`, given its previous state. Attempts may be logged
    /// out of order (a duplicate after a crash): the latest-started attempt sets the status.
    pub fn after(previous: Option<&DeliveryState>, row: &AttemptRow) -> DeliveryState {
        if let Some(p) = previous.filter(|p| p.last_attempt_at > row.started_at) {
            let mut kept = p.clone();
            kept.attempts += 1;
            kept.first_attempt_at = kept.first_attempt_at.min(row.started_at);
            return kept;
        }
        let (status, next_attempt_at) = match row.outcome {
            AttemptOutcome::Succeeded => (DeliveryStatus::Succeeded, None),
            AttemptOutcome::RetryScheduled { next_attempt_at } => {
                (DeliveryStatus::Failed, Some(next_attempt_at))
            }
            AttemptOutcome::Dead { .. } => (DeliveryStatus::Dead, None),
        };
        let first_attempt_at =
            previous.map_or(row.started_at, |p| p.first_attempt_at.min(row.started_at));
        DeliveryState {
            delivery_id: row.delivery_id.clone(),
            event_id: row.event_id.clone(),
            endpoint_id: row.endpoint_id.clone(),
            tenant: row.tenant.clone(),
            event_type: row.event_type.clone(),
            status,
            attempts: previous.map_or(0, |p| p.attempts) + 1,
            first_attempt_at,
            last_attempt_at: row.started_at,
            next_attempt_at,
            last_status: row.status,
            last_error_class: row.error_class,
        }
    }
}
