//! `POST /v1/events`: native event ingest, idempotent on the event id.
//!
//! The handler validates the request, then hands a [`NativeEvent`] to an [`EventSink`] and
//! answers 202 only after the sink confirmed it: [`KafkaEventSink`] produces the native envelope
//! (`schemas/native-event.schema.json`) to `kafka.topics.events` with key = event id through an
//! idempotent `acks=all` producer and waits for the broker's acknowledgement;
//! [`MemoryEventSink`] keeps events in memory for tests.
//!
//! # Idempotency
//! The same (tenant, `id`) posted twice within `ingest.dedupe_window` is one event, whichever
//! instance takes each copy and across restarts. Three layers make it so:
//! - [`RecentIds`]: this API instance remembers recently accepted (tenant, id) pairs (bounded in
//!   count, and in age by the window). A repeat answers 202 with the same id without publishing
//!   again; a repeat that arrives while the first is still being published waits for it. A
//!   repeat with a different type or payload is 409 `conflict`: it is a different event under a
//!   reused id, and accepting it silently would lose it.
//! - The store: before publishing, the handler reads the (tenant, id) the fan-out recorded.
//!   Received within the window with the same fingerprint ([`crate::input::fingerprint`]), the
//!   post answers 202 as the first did without publishing; with another, 409. This covers
//!   repeats sent to another instance or after a restart, once the first copy was fanned out.
//!   When the store does not answer, the event is published: ingest stays up while the
//!   history store is away, and the fan-out's own check below still applies.
//! - The fan-out checks the store too, and drops a repeat that reached it before the first copy
//!   was recorded (two posts at once to two instances, or a producer retry's duplicate).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::FutureRecord;
use rdkafka::util::Timeout;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::config::KafkaConfig;
use crate::event_type::EventType;
use crate::id::{EventId, Tenant};
use crate::input::fingerprint;
use crate::record::{UnixMillis, rfc3339_millis};

use super::AdminState;
use super::auth::Caller;
use super::body::ApiJson;
use super::error::ApiError;

/// How many (tenant, id) pairs [`RecentIds`] remembers by default.
pub const DEFAULT_RECENT_IDS: usize = 100_000;
/// How long [`RecentIds`] remembers an id by default.
pub const DEFAULT_RECENT_TTL: Duration = Duration::from_secs(24 * 3600);
/// How long [`KafkaEventSink`] waits for the broker's acknowledgement by default.
pub const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// One event accepted by the API, ready to be written as a native envelope.
#[derive(Debug, Clone)]
pub struct NativeEvent {
    /// The event id (`webhook-id`), given or generated.
    pub id: EventId,
    /// The owner.
    pub tenant: Tenant,
    /// The event type.
    pub event_type: EventType,
    /// When it happened (given, or the time the API accepted it), to the millisecond.
    pub occurred_at: SystemTime,
    /// The payload, byte for byte as the client sent it.
    pub payload: Box<RawValue>,
}

#[derive(Serialize)]
struct Envelope<'a> {
    id: &'a str,
    tenant: &'a str,
    #[serde(rename = "type")]
    event_type: &'a str,
    occurred_at: String,
    payload: &'a RawValue,
}

impl NativeEvent {
    /// The native envelope `{"id","tenant","type","occurred_at","payload"}`, payload bytes kept.
    pub fn to_envelope(&self) -> Vec<u8> {
        serde_json::to_vec(&Envelope {
            id: self.id.as_str(),
            tenant: self.tenant.as_str(),
            event_type: self.event_type.as_str(),
            occurred_at: rfc3339_millis(UnixMillis::from_system_time(self.occurred_at)),
            payload: &self.payload,
        })
        .expect("an envelope of strings and raw JSON always serialises")
    }
}

/// Why an event was not published.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The broker could not be reached or refused for a reason that may pass.
    #[error("event sink unavailable: {0}")]
    Unavailable(String),
    /// No acknowledgement in time; the event may or may not have been written.
    #[error("no acknowledgement within {0:?}")]
    Timeout(Duration),
    /// The broker refused this record for good (e.g. larger than it accepts).
    #[error("event refused: {0}")]
    Rejected(String),
}

impl From<SinkError> for ApiError {
    fn from(e: SinkError) -> ApiError {
        match e {
            SinkError::Unavailable(_) | SinkError::Timeout(_) => {
                tracing::warn!(error = %e, "event not published");
                ApiError::Unavailable(
                    "the event was not accepted by Kafka; retry with the same id".to_owned(),
                )
            }
            // The producer or broker refused the record's size: the envelope around the
            // payload is more than `message.max.bytes` (the producer's or the topic's) allows.
            SinkError::Rejected(detail) => ApiError::PayloadTooLarge(format!(
                "the event is too large for its Kafka record ({detail}); send a smaller payload"
            )),
        }
    }
}

/// Where accepted events go. Object-safe so the API holds an `Arc<dyn EventSink>`.
#[async_trait]
pub trait EventSink: Send + Sync + 'static {
    /// Writes the event durably; `Ok` only once it is acknowledged.
    async fn publish(&self, event: &NativeEvent) -> Result<(), SinkError>;
}

/// Produces native envelopes to the events topic and waits for `acks=all`.
pub struct KafkaEventSink {
    producer: crate::kafka::Producer,
    topic: String,
    timeout: Duration,
}

impl std::fmt::Debug for KafkaEventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaEventSink")
            .field("topic", &self.topic)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl KafkaEventSink {
    /// A sink with its own idempotent `acks=all` producer ([`crate::kafka::producer_config`])
    /// writing to `config.topics.events`.
    pub fn new(config: &KafkaConfig) -> Result<KafkaEventSink, SinkError> {
        let producer: crate::kafka::Producer =
            crate::kafka::producer_config(&config.bootstrap_servers, &config.client)
                .create_with_context(crate::kafka::ProducerLog::default())
                .map_err(|e| SinkError::Unavailable(e.to_string()))?;
        Ok(KafkaEventSink::from_producer(
            producer,
            config.topics.events.clone(),
            DEFAULT_PUBLISH_TIMEOUT,
        ))
    }

    /// A sink over an existing producer (which should be idempotent with `acks=all`).
    pub fn from_producer(
        producer: crate::kafka::Producer,
        topic: String,
        timeout: Duration,
    ) -> KafkaEventSink {
        KafkaEventSink {
            producer,
            topic,
            timeout,
        }
    }
}

#[async_trait]
impl EventSink for KafkaEventSink {
    async fn publish(&self, event: &NativeEvent) -> Result<(), SinkError> {
        let value = event.to_envelope();
        // Key = event id: every copy of an event lands on one partition, where the fan-out
        // drops repeats.
        let record = FutureRecord::to(&self.topic)
            .key(event.id.as_str())
            .payload(&value);
        let send = self.producer.send(record, Timeout::After(self.timeout));
        match tokio::time::timeout(self.timeout, send).await {
            Err(_) => Err(SinkError::Timeout(self.timeout)),
            Ok(Ok(_)) => Ok(()),
            Ok(Err((e, _))) => Err(match e {
                KafkaError::MessageProduction(
                    code @ (RDKafkaErrorCode::MessageSizeTooLarge
                    | RDKafkaErrorCode::InvalidMessageSize),
                ) => SinkError::Rejected(code.to_string()),
                other => SinkError::Unavailable(other.to_string()),
            }),
        }
    }
}

/// Keeps published events in memory (tests, `hookline dev` without Kafka). Bounded: beyond
/// `capacity` the oldest are forgotten. [`MemoryEventSink::set_available`] simulates an outage.
#[derive(Debug)]
pub struct MemoryEventSink {
    events: Mutex<VecDeque<NativeEvent>>,
    capacity: usize,
    available: std::sync::atomic::AtomicBool,
}

impl Default for MemoryEventSink {
    fn default() -> Self {
        MemoryEventSink::with_capacity(10_000)
    }
}

impl MemoryEventSink {
    /// A sink keeping at most `capacity` events (at least 1).
    pub fn with_capacity(capacity: usize) -> MemoryEventSink {
        MemoryEventSink {
            events: Mutex::new(VecDeque::new()),
            capacity: capacity.max(1),
            available: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// The events published so far, oldest first.
    pub fn events(&self) -> Vec<NativeEvent> {
        self.lock().iter().cloned().collect()
    }

    /// While `false`, every publish fails with [`SinkError::Unavailable`].
    pub fn set_available(&self, available: bool) {
        self.available
            .store(available, std::sync::atomic::Ordering::SeqCst);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<NativeEvent>> {
        // Each update is one push or pop: a poisoned lock is still consistent.
        self.events.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl EventSink for MemoryEventSink {
    async fn publish(&self, event: &NativeEvent) -> Result<(), SinkError> {
        if !self.available.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(SinkError::Unavailable("memory sink switched off".into()));
        }
        let mut events = self.lock();
        if events.len() == self.capacity {
            events.pop_front();
        }
        events.push_back(event.clone());
        Ok(())
    }
}

/// What [`RecentIds::claim`] found.
#[derive(Debug, Clone)]
pub enum Claim {
    /// Publish through this cell (`get_or_try_init`): the first caller publishes, concurrent
    /// repeats wait for it, later repeats find it done. After a failed publish the next caller
    /// tries again.
    Slot(Arc<OnceCell<()>>),
    /// The id was taken by an event with different content.
    Mismatch,
}

type IdKey = (Tenant, EventId);

struct Slot {
    fingerprint: [u8; 32],
    cell: Arc<OnceCell<()>>,
    inserted: Instant,
    seq: u64,
}

#[derive(Default)]
struct Recent {
    slots: HashMap<IdKey, Slot>,
    /// Insertion order with each slot's `seq`, so a replaced slot's old entry is recognised.
    order: VecDeque<(IdKey, u64)>,
    seq: u64,
}

/// The bounded memory of recently ingested (tenant, event id) pairs: at most `capacity`
/// entries, each forgotten after `ttl` (oldest first when full).
pub struct RecentIds {
    inner: Mutex<Recent>,
    capacity: usize,
    ttl: Duration,
}

impl std::fmt::Debug for RecentIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecentIds")
            .field("len", &self.len())
            .field("capacity", &self.capacity)
            .field("ttl", &self.ttl)
            .finish()
    }
}

impl Default for RecentIds {
    fn default() -> Self {
        RecentIds::new(DEFAULT_RECENT_IDS, DEFAULT_RECENT_TTL)
    }
}

impl RecentIds {
    /// Remembers at most `capacity` ids (at least 1), each for `ttl`.
    pub fn new(capacity: usize, ttl: Duration) -> RecentIds {
        RecentIds {
            inner: Mutex::new(Recent::default()),
            capacity: capacity.max(1),
            ttl,
        }
    }

    /// How many ids are remembered.
    pub fn len(&self) -> usize {
        self.lock().slots.len()
    }

    /// Whether none are.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recent> {
        // Updates keep `slots` and `order` consistent before any call that could panic.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets (`tenant`, `id`) if its slot is still `cell` and nothing was published through
    /// it, so that a claim made for content the store refused does not stand for the id.
    pub fn forget(&self, tenant: &Tenant, id: &EventId, cell: &Arc<OnceCell<()>>) {
        let key = (tenant.clone(), id.clone());
        let mut r = self.lock();
        if r.slots
            .get(&key)
            .is_some_and(|s| Arc::ptr_eq(&s.cell, cell) && !s.cell.initialized())
        {
            r.slots.remove(&key);
        }
    }

    /// Finds or creates the slot of (`tenant`, `id`) for an event whose content hashes to
    /// `fingerprint`.
    pub fn claim(&self, tenant: &Tenant, id: &EventId, fingerprint: [u8; 32]) -> Claim {
        let now = Instant::now();
        let key = (tenant.clone(), id.clone());
        let mut r = self.lock();
        // Forget what is too old: insertion order is age order, so the old ones are in front.
        while let Some((k, seq)) = r.order.front().cloned() {
            let live = r
                .slots
                .get(&k)
                .filter(|s| s.seq == seq)
                .map(|s| now.duration_since(s.inserted) < self.ttl);
            match live {
                Some(true) => break,
                Some(false) => {
                    r.slots.remove(&k);
                    r.order.pop_front();
                }
                None => {
                    r.order.pop_front();
                }
            }
        }
        if let Some(slot) = r.slots.get(&key) {
            return if slot.fingerprint == fingerprint {
                Claim::Slot(Arc::clone(&slot.cell))
            } else {
                Claim::Mismatch
            };
        }
        // Make room for one more, oldest first.
        while r.slots.len() >= self.capacity {
            let Some((k, seq)) = r.order.pop_front() else {
                break;
            };
            if r.slots.get(&k).is_some_and(|s| s.seq == seq) {
                r.slots.remove(&k);
            }
        }
        r.seq += 1;
        let seq = r.seq;
        let cell = Arc::new(OnceCell::new());
        r.slots.insert(
            key.clone(),
            Slot {
                fingerprint,
                cell: Arc::clone(&cell),
                inserted: now,
                seq,
            },
        );
        r.order.push_back((key, seq));
        Claim::Slot(cell)
    }
}

/// `POST /v1/events` body. `tenant` may be omitted with a tenant token (it defaults to the
/// token's tenant).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngestEvent {
    /// Event id; generated (`msg_...`) when absent.
    #[serde(default)]
    pub id: Option<String>,
    /// The owner.
    #[serde(default)]
    pub tenant: Option<String>,
    /// The event type.
    #[serde(default, rename = "type")]
    pub event_type: Option<String>,
    /// RFC 3339; the time of acceptance when absent.
    #[serde(default)]
    pub occurred_at: Option<String>,
    /// Any JSON value, `null` included; required.
    #[serde(default, deserialize_with = "present")]
    pub payload: Option<Box<RawValue>>,
}

/// Keeps a present `null` as `Some("null")`, so "absent" and "null payload" differ.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

/// `202 {"id"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accepted {
    /// The event id (the given one, or the generated one).
    pub id: String,
}

impl IngestEvent {
    /// Checks every field for `caller` and builds the event; errors name the field.
    pub fn validate(
        self,
        caller: &Caller,
        max_payload: usize,
        now: SystemTime,
    ) -> Result<NativeEvent, ApiError> {
        let tenant = match (self.tenant, caller.tenant()) {
            (Some(t), _) => {
                Tenant::parse(t).map_err(|e| ApiError::invalid("tenant", e.to_string()))?
            }
            (None, Some(own)) => own.clone(),
            (None, None) => return Err(ApiError::invalid("tenant", "is required")),
        };
        caller.may_write_for(&tenant)?;
        let event_type = EventType::parse(
            self.event_type
                .ok_or_else(|| ApiError::invalid("type", "is required"))?,
        )
        .map_err(|e| ApiError::invalid("type", e.to_string()))?;
        let id = match self.id {
            Some(id) => EventId::parse(id).map_err(|e| ApiError::invalid("id", e.to_string()))?,
            None => EventId::generate(),
        };
        let occurred_at = match self.occurred_at {
            Some(s) => parse_time(&s).ok_or_else(|| {
                ApiError::invalid(
                    "occurred_at",
                    "must be an RFC 3339 time after 1970, e.g. 2026-03-01T12:00:00Z",
                )
            })?,
            None => now,
        };
        let payload = self
            .payload
            .ok_or_else(|| ApiError::invalid("payload", "is required (any JSON value)"))?;
        if payload.get().len() > max_payload {
            return Err(ApiError::PayloadTooLarge(format!(
                "payload: is {} bytes; at most {max_payload} are accepted",
                payload.get().len()
            )));
        }
        Ok(NativeEvent {
            id,
            tenant,
            event_type,
            occurred_at: UnixMillis::from_system_time(occurred_at).to_system_time(),
            payload,
        })
    }
}

/// RFC 3339 (any offset) at or after 1970, to the millisecond.
pub(crate) fn parse_time(s: &str) -> Option<SystemTime> {
    let dt = chrono::DateTime::parse_from_rfc3339(s).ok()?;
    let ms = u64::try_from(dt.timestamp_millis()).ok()?;
    Some(UNIX_EPOCH + Duration::from_millis(ms))
}

/// `POST /v1/events`.
pub async fn ingest(
    State(state): State<AdminState>,
    caller: Caller,
    ApiJson(body): ApiJson<IngestEvent>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    let event = body.validate(&caller, state.max_payload_bytes, SystemTime::now())?;
    let fp = fingerprint(&event.tenant, &event.event_type, &event.payload);
    match state.recent_ids.claim(&event.tenant, &event.id, fp) {
        Claim::Mismatch => Err(reused(&event.id)),
        Claim::Slot(cell) => {
            match cell
                .get_or_try_init(|| publish_once(&state, &event, fp))
                .await
            {
                Ok(()) => {}
                Err(e @ ApiError::Conflict(_)) => {
                    // The stored event owns the id: its own repeats must not meet this slot.
                    state.recent_ids.forget(&event.tenant, &event.id, &cell);
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
            Ok((
                StatusCode::ACCEPTED,
                Json(Accepted {
                    id: event.id.to_string(),
                }),
            ))
        }
    }
}

/// The 409 for an id already taken by a different event.
fn reused(id: &EventId) -> ApiError {
    ApiError::Conflict(format!(
        "id: event {id} was already ingested with a different type or payload; use a new id"
    ))
}

/// Publishes `event` unless the store already holds it, received within the dedupe window:
/// then the same content is a repeat (nothing to publish), a different one a conflict. The
/// store sees what every instance ingested before and since a restart; the fan-out checks
/// again, for repeats that reach it before their first copy was recorded.
async fn publish_once(
    state: &AdminState,
    event: &NativeEvent,
    fp: [u8; 32],
) -> Result<(), ApiError> {
    let stored = match state.deliveries.event_mark(&event.tenant, &event.id).await {
        Ok(stored) => stored,
        // Ingest does not wait on the history store: the event is safe in Kafka, and the
        // fan-out checks the store again before it sends the event anywhere.
        Err(e) => {
            tracing::warn!(error = %e, "the delivery store did not answer an ingest check; publishing");
            None
        }
    };
    // A received_at ahead of this clock (another instance's) counts as within.
    let within = |at: SystemTime| {
        SystemTime::now()
            .duration_since(at)
            .ok()
            .is_none_or(|age| age <= state.dedupe_window)
    };
    match stored {
        Some(first) if within(first.received_at) => {
            let hex: String = fp.iter().map(|b| format!("{b:02x}")).collect();
            if first.fingerprint == hex {
                Ok(())
            } else {
                Err(reused(&event.id))
            }
        }
        _ => Ok(state.events.publish(event).await?),
    }
}
