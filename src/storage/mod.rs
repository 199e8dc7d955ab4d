//! Where attempts, delivery state, dead letters and replay audits are kept.
//!
//! The pipeline talks to [`DeliveryStore`] only. Two implementations: [`memory::MemoryStore`]
//! (embedded, bounded; `hookline dev` and tests) and [`scylla::ScyllaStore`] (ScyllaDB /
//! Cassandra) for production. [`conformance`] is one behavioural suite both must pass;
//! [`state`] derives a delivery's state from its entries the same way for both.
//!
//! Contract that the delivery stage relies on: when `record_attempt` returns `Ok`, the attempt
//! and the delivery state it implies are durable. A Kafka record is settled only after that.

use std::time::SystemTime;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::attempt::ErrorClass;
use crate::dead_reason::DeadReason;
use crate::id::{DeliveryId, EndpointId, EventId, Tenant};
use crate::park_reason::ParkReason;

pub mod conformance;
#[cfg(test)]
pub mod hooked;
pub mod memory;
pub mod scylla;
pub mod state;

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryStatus {
    /// Fanned out, not attempted and not parked yet.
    Pending,
    /// Waiting in a delay tier: a retry after a failed attempt, or parked
    /// ([`DeliveryState::scheduled`] says why and until when).
    Scheduled,
    /// A 2xx was received.
    Succeeded,
    /// Dead-lettered, after attempts or without one ([`DeliveryState::dead_reason`] says why).
    Dead,
}

impl DeliveryStatus {
    /// Every status, in the order a delivery moves through them.
    pub const ALL: [DeliveryStatus; 4] = [
        DeliveryStatus::Pending,
        DeliveryStatus::Scheduled,
        DeliveryStatus::Succeeded,
        DeliveryStatus::Dead,
    ];

    /// The stable string form (API, CQL).
    pub const fn as_str(self) -> &'static str {
        match self {
            DeliveryStatus::Pending => "pending",
            DeliveryStatus::Scheduled => "scheduled",
            DeliveryStatus::Succeeded => "succeeded",
            DeliveryStatus::Dead => "dead",
        }
    }

    /// Parses the string form; `failed`, the name a scheduled retry had before parked
    /// deliveries were shown, is read as [`DeliveryStatus::Scheduled`].
    pub fn parse(s: &str) -> Option<DeliveryStatus> {
        if s == "failed" {
            return Some(DeliveryStatus::Scheduled);
        }
        Self::ALL.into_iter().find(|v| v.as_str() == s)
    }
}

/// Why a scheduled delivery waits in a delay tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScheduleReason {
    /// Its last attempt failed and a retry is due.
    Retry,
    /// The delivery stage parked it without attempting it.
    Parked(ParkReason),
}

impl ScheduleReason {
    /// The stable string form (API, CQL): `retry`, or the park reason (`breaker_open`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ScheduleReason::Retry => "retry",
            ScheduleReason::Parked(p) => p.as_str(),
        }
    }

    /// Parses the string form.
    pub fn parse(s: &str) -> Option<ScheduleReason> {
        if s == "retry" {
            return Some(ScheduleReason::Retry);
        }
        ParkReason::parse(s).map(ScheduleReason::Parked)
    }
}

/// When a scheduled delivery is due again, and why it waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheduled {
    /// Why it waits.
    pub reason: ScheduleReason,
    /// When it is due.
    pub next_attempt_at: SystemTime,
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
    /// The request's headers as sent (name, value), in order; empty when nothing was sent,
    /// and in rows logged before hookline kept them. Holds no secret: signatures only.
    pub request_headers: Vec<(String, String)>,
}

/// A record's place in a topic hookline knows by its role (the deliveries topic, the DLQ).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecordPosition {
    /// The partition.
    pub partition: i32,
    /// The record's offset.
    pub offset: i64,
}

/// A delivery's current state: one per (event, endpoint), derived from what the store holds of
/// it (its creation at fan-out, its attempts, the notes the delivery stage left).
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
    /// HTTP attempts made so far (all replays included); notes are not attempts.
    pub attempts: u32,
    /// When the store first heard of it: its fan-out, or (for deliveries fanned out before
    /// hookline recorded that) its first attempt or note. Orders the endpoint's history.
    pub created_at: SystemTime,
    /// When its state last changed (the latest attempt or note).
    pub updated_at: SystemTime,
    /// When the first attempt started; `None` before any.
    pub first_attempt_at: Option<SystemTime>,
    /// When the latest attempt started; `None` before any.
    pub last_attempt_at: Option<SystemTime>,
    /// Status [`DeliveryStatus::Scheduled`]: why it waits and until when.
    pub scheduled: Option<Scheduled>,
    /// Status [`DeliveryStatus::Dead`]: why it was dead-lettered.
    pub dead_reason: Option<DeadReason>,
    /// The latest HTTP status, if any.
    pub last_status: Option<u16>,
    /// The latest error class, if any.
    pub last_error_class: Option<ErrorClass>,
}

/// What the delivery stage noted about a delivery without attempting it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoteKind {
    /// Parked in a delay tier until `next_attempt_at`.
    Parked {
        /// Why.
        reason: ParkReason,
        /// When it is due again.
        next_attempt_at: SystemTime,
    },
    /// Dead-lettered without being sent (endpoint deleted or disabled, window spent while
    /// parked, no signing secret).
    Dead {
        /// Why.
        reason: DeadReason,
    },
}

/// A change of a delivery's state that no attempt made: the delivery stage parked it, or
/// dead-lettered it without sending it. Durable when [`DeliveryStore::record_note`] returns `Ok`.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryNote {
    /// The delivery.
    pub delivery_id: DeliveryId,
    /// The event.
    pub event_id: EventId,
    /// The endpoint.
    pub endpoint_id: EndpointId,
    /// The endpoint's tenant.
    pub tenant: Tenant,
    /// The event's type.
    pub event_type: String,
    /// When it happened.
    pub at: SystemTime,
    /// What happened.
    pub kind: NoteKind,
    /// Set when the delivery belongs to a replay.
    pub replay_id: Option<String>,
}

/// An event as the fan-out produced it: written once every delivery record made from it is
/// acknowledged, before its input offset settles. The store also creates each delivery as
/// [`DeliveryStatus::Pending`] and its entry in its endpoint's history.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRow {
    /// Owner of the event.
    pub tenant: Tenant,
    /// The event's id (`webhook-id`).
    pub event_id: EventId,
    /// The event's type.
    pub event_type: String,
    /// The event's own time (the body's `timestamp`).
    pub occurred_at: SystemTime,
    /// When hookline received it: the input record's Kafka timestamp, the same every time the
    /// record is read, so a fan-out repeated after a crash writes the same row. Orders the
    /// events API.
    pub received_at: SystemTime,
    /// The body sent to receivers, exactly as serialised at fan-out (`{"id","type",
    /// "timestamp","data"}`).
    pub body: bytes::Bytes,
    /// What identifies the event's content, to tell a repeat from a different event with the
    /// same id ([`crate::input`] computes it the same for `POST /v1/events` and the fan-out).
    pub fingerprint: String,
    /// The endpoints it was fanned out to (one delivery each, id from event and endpoint).
    pub endpoints: Vec<EndpointId>,
}

/// What [`DeliveryStore::event_mark`] reads of a kept event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventMark {
    /// [`EventRow::fingerprint`].
    pub fingerprint: String,
    /// [`EventRow::received_at`].
    pub received_at: SystemTime,
}

/// An events page request: newest first (by `received_at`), `cursor` from the previous page.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventQuery {
    /// Only events of this exact type.
    pub event_type: Option<String>,
    /// Only events received at or after this time.
    pub since: Option<SystemTime>,
    /// Only events received before this time.
    pub until: Option<SystemTime>,
    /// Opaque cursor returned by the previous page.
    pub cursor: Option<String>,
    /// Page size (clamped by the store to 1..=500).
    pub limit: u32,
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
    /// Which credential asked for it, as the API established it (`key tk_... (name)`,
    /// `operator token`, `cli`): the caller's free-text `actor` is what it says of itself.
    /// `None` in entries written before hookline recorded it.
    pub asked_by: Option<String>,
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
    /// Only deliveries created at or after this time.
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
    /// Records a state change no attempt made (parked, dead-lettered unsent). Durable when it
    /// returns `Ok`; idempotent.
    async fn record_note(&self, note: &DeliveryNote) -> Result<(), StoreError>;
    /// Records an event the fan-out produced, each of its deliveries as pending, and their
    /// history entries. Durable when it returns `Ok`; idempotent.
    async fn record_event(&self, event: &EventRow) -> Result<(), StoreError>;
    /// The tenant's event with this id, if kept.
    async fn event(&self, tenant: &Tenant, id: &EventId) -> Result<Option<EventRow>, StoreError>;
    /// What tells a repeat of the tenant's event with this id from another event reusing it,
    /// if the event is kept: [`DeliveryStore::event`] without the body and endpoints, which a
    /// store may read at less cost.
    async fn event_mark(
        &self,
        tenant: &Tenant,
        id: &EventId,
    ) -> Result<Option<EventMark>, StoreError> {
        Ok(self.event(tenant, id).await?.map(|e| EventMark {
            fingerprint: e.fingerprint,
            received_at: e.received_at,
        }))
    }
    /// A tenant's events, newest first, paged. New events arriving between pages never shift
    /// them.
    async fn events(
        &self,
        tenant: &Tenant,
        query: &EventQuery,
    ) -> Result<Page<EventRow>, StoreError>;
    /// The delivery's state, if the store holds anything of it.
    async fn delivery(&self, id: &DeliveryId) -> Result<Option<DeliveryState>, StoreError>;
    /// Every attempt of a delivery, oldest first.
    async fn attempts(&self, id: &DeliveryId) -> Result<Vec<AttemptRow>, StoreError>;
    /// An endpoint's deliveries, newest first (by creation), paged.
    async fn endpoint_deliveries(
        &self,
        endpoint: &EndpointId,
        query: &HistoryQuery,
    ) -> Result<Page<DeliveryState>, StoreError>;
    /// Every delivery of one event (one per endpoint it fanned out to), every tenant's.
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
