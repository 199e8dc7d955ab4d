//! The delivery record: one (event, endpoint) pair as it travels through `hookline.deliveries`,
//! every delay tier (`hookline.retry.<tier>`) and the DLQ (`hookline.dlq`).
//!
//! The Kafka value is the body sent to receivers, serialised once at fan-out by [`build_body`] and
//! carried byte-exact from then on: nothing here parses or rewrites it, because a signature covers
//! exactly those bytes. Everything hookline needs to schedule and account for the delivery rides
//! in `hookline-*` headers (see `schemas/kafka-records.md`). The key is the endpoint id, so all
//! deliveries for one endpoint land in one partition and one worker owns its lane and breaker.
//!
//! Encoding works on plain `(&str, &[u8])` header lists so the logic is testable without Kafka;
//! [`DeliveryRecord::to_owned_headers`] and [`DeliveryRecord::from_message`] adapt to rdkafka.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use std::ffi::{CStr, c_char, c_void};

use rdkafka::bindings::{
    rd_kafka_header_cnt, rd_kafka_header_get_all, rd_kafka_headers_t, rd_kafka_resp_err_t,
};
use rdkafka::message::{BorrowedHeaders, Header, Message, OwnedHeaders};
use serde_json::value::RawValue;

use crate::attempt::ErrorClass;
use crate::dead_reason::DeadReason;
use crate::event_type::{EventType, EventTypeError};
use crate::id::{DeliveryId, EndpointId, EventId, IdError, MAX_ID_LEN, Tenant};

/// Header names. They are part of hookline's on-the-wire interface: changing one strands every
/// record already sitting in a delay tier or the DLQ.
pub mod header {
    /// Format version of the headers below; bumped on any incompatible change.
    pub const VERSION: &str = "hookline-version";
    /// Delivery id (`dlv_...`), derived from (event id, endpoint id).
    pub const DELIVERY_ID: &str = "hookline-delivery-id";
    /// Event id: `webhook-id` on the wire.
    pub const EVENT_ID: &str = "hookline-event-id";
    /// Endpoint id; equal to the record key.
    pub const ENDPOINT_ID: &str = "hookline-endpoint-id";
    /// Tenant that owns the event and the endpoint.
    pub const TENANT: &str = "hookline-tenant";
    /// Event type.
    pub const EVENT_TYPE: &str = "hookline-event-type";
    /// Attempts made so far in the current window (0 for a fresh or replayed delivery).
    pub const ATTEMPTS: &str = "hookline-attempts";
    /// Unix milliseconds of the first attempt of the current window; absent before it.
    pub const FIRST_ATTEMPT_AT: &str = "hookline-first-attempt-at";
    /// Unix milliseconds before which the record must not be attempted; absent means now.
    pub const NOT_BEFORE: &str = "hookline-not-before";
    /// Unix milliseconds of the event's own time (event-to-delivery latency).
    pub const EVENT_TIME: &str = "hookline-event-time";
    /// Replay id, present on records republished from the DLQ.
    pub const REPLAY_ID: &str = "hookline-replay-id";
    /// Input topic the event was read from.
    pub const ORIGIN_TOPIC: &str = "hookline-origin-topic";
    /// Input partition the event was read from.
    pub const ORIGIN_PARTITION: &str = "hookline-origin-partition";
    /// Input offset the event was read from.
    pub const ORIGIN_OFFSET: &str = "hookline-origin-offset";
    /// DLQ only: why the delivery was dead-lettered ([`DeadReason::as_str`](crate::dead_reason::DeadReason::as_str)).
    pub const DEAD_REASON: &str = "hookline-dead-reason";
    /// DLQ only: HTTP status of the last attempt, when one came back.
    pub const LAST_STATUS: &str = "hookline-last-status";
    /// DLQ only: error class of the last attempt ([`ErrorClass::as_str`](crate::attempt::ErrorClass::as_str)).
    pub const LAST_ERROR: &str = "hookline-last-error";
    /// DLQ only: Unix milliseconds of the last attempt.
    pub const LAST_ATTEMPT_AT: &str = "hookline-last-attempt-at";
    /// DLQ only: comma-separated ids of the signing keys the last attempt was signed with.
    pub const SIGNING_KEY_IDS: &str = "hookline-signing-key-ids";
}

/// The header format version this build writes and reads.
pub const FORMAT_VERSION: &str = "1";

/// Most signing key ids a DLQ record carries (an endpoint has a handful of active secrets).
pub const MAX_SIGNING_KEY_IDS: usize = 16;

/// A point in time as Unix milliseconds: the resolution of every time on the wire, so a record
/// decodes to exactly what was encoded.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UnixMillis(pub u64);

impl UnixMillis {
    /// The given time, truncated to the millisecond; times before 1970 become 0.
    pub fn from_system_time(t: SystemTime) -> UnixMillis {
        let ms = t
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        UnixMillis(u64::try_from(ms).unwrap_or(u64::MAX))
    }

    /// The same instant as a [`SystemTime`].
    pub fn to_system_time(self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.0)
    }
}

impl From<SystemTime> for UnixMillis {
    fn from(t: SystemTime) -> UnixMillis {
        UnixMillis::from_system_time(t)
    }
}

impl From<UnixMillis> for SystemTime {
    fn from(t: UnixMillis) -> SystemTime {
        t.to_system_time()
    }
}

impl fmt::Debug for UnixMillis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UnixMillis({})", self.0)
    }
}

impl fmt::Display for UnixMillis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Where the event was read from: topic, partition and offset of the input record.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Origin {
    /// Input topic.
    pub topic: String,
    /// Input partition.
    pub partition: i32,
    /// Input offset.
    pub offset: i64,
}

/// Why a delivery is in the DLQ and how its last attempt went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadInfo {
    /// Why it was dead-lettered.
    pub reason: DeadReason,
    /// HTTP status of the last attempt, if a response came back.
    pub last_status: Option<u16>,
    /// Error class of the last attempt (`None` only if it somehow was a success).
    pub last_error: Option<ErrorClass>,
    /// When the last attempt was made.
    pub last_attempt_at: UnixMillis,
    /// Ids of the signing keys the last attempt was signed with (no commas inside an id).
    pub signing_key_ids: Vec<String>,
}

/// One delivery: an event's body for one endpoint, with its scheduling state.
///
/// Builder methods (`for_retry`, `for_park`, `for_dlq`, `for_replay`) are the only transitions
/// the stages make; each keeps the body untouched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryRecord {
    /// Derived from (event id, endpoint id).
    pub delivery_id: DeliveryId,
    /// The event's id (`webhook-id`).
    pub event_id: EventId,
    /// The endpoint this delivery goes to; also the Kafka key.
    pub endpoint_id: EndpointId,
    /// Owner of the event and the endpoint.
    pub tenant: Tenant,
    /// The event's type.
    pub event_type: EventType,
    /// Attempts made so far in the current window.
    pub attempts: u32,
    /// First attempt of the current window; `None` until one is made.
    pub first_attempt_at: Option<UnixMillis>,
    /// Not to be attempted before this time; `None` means due now.
    pub not_before: Option<UnixMillis>,
    /// The event's own time.
    pub event_time: UnixMillis,
    /// Set on records republished from the DLQ.
    pub replay_id: Option<String>,
    /// Input record the event came from, when known.
    pub origin: Option<Origin>,
    /// Set on records in the DLQ.
    pub dead: Option<DeadInfo>,
    /// The body sent to receivers, exactly as serialised at fan-out.
    pub body: Bytes,
}

/// Why a record from a hookline topic cannot be decoded. Names the header at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// A required header is absent.
    #[error("header {0} is missing")]
    MissingHeader(&'static str),
    /// A header is present but its value is unusable.
    #[error("header {name} is invalid: {detail}")]
    BadHeader {
        /// Which header.
        name: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// The record was written by an incompatible version of hookline.
    #[error("header hookline-version is {0:?}; this build reads version {FORMAT_VERSION}")]
    UnsupportedVersion(String),
    /// The record has no key.
    #[error("record has no key (the endpoint id)")]
    MissingKey,
    /// The key and the endpoint id header disagree.
    #[error("record key {key:?} differs from header hookline-endpoint-id {header:?}")]
    KeyMismatch {
        /// The key, lossily decoded.
        key: String,
        /// The header value.
        header: String,
    },
    /// The record has no value (the body).
    #[error("record has no body")]
    MissingBody,
    /// A header's name is not UTF-8 (the header's position).
    #[error("header {0} has a name that is not UTF-8")]
    BadHeaderName(usize),
}

/// Builds the body sent to receivers: `{"id":..,"type":..,"timestamp":..,"data":..}` with `data`
/// copied byte for byte from the producer's payload. Called once per event at fan-out.
pub fn build_body(
    event_id: &EventId,
    event_type: &EventType,
    time: UnixMillis,
    data: &RawValue,
) -> Bytes {
    let timestamp = rfc3339_millis(time);
    let data = data.get();
    let mut out = Vec::with_capacity(
        48 + event_id.as_str().len() + event_type.as_str().len() + timestamp.len() + data.len(),
    );
    out.extend_from_slice(b"{\"id\":");
    push_json_string(&mut out, event_id.as_str());
    out.extend_from_slice(b",\"type\":");
    push_json_string(&mut out, event_type.as_str());
    out.extend_from_slice(b",\"timestamp\":\"");
    out.extend_from_slice(timestamp.as_bytes());
    out.extend_from_slice(b"\",\"data\":");
    out.extend_from_slice(data.as_bytes());
    out.push(b'}');
    Bytes::from(out)
}

fn push_json_string(out: &mut Vec<u8>, s: &str) {
    // Writing a &str into a Vec cannot fail.
    serde_json::to_writer(&mut *out, s).expect("serialising a string into a Vec");
}

/// RFC 3339 in UTC with millisecond precision, e.g. `2026-03-01T12:00:00.250Z`.
pub fn rfc3339_millis(t: UnixMillis) -> String {
    let ms = i64::try_from(t.0).unwrap_or(i64::MAX);
    match chrono::DateTime::from_timestamp_millis(ms) {
        Some(dt) => dt.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        // Beyond chrono's range (year 262143); cannot come from a parsed time.
        None => "9999-12-31T23:59:59.999Z".to_owned(),
    }
}

impl DeliveryRecord {
    /// A fresh delivery of an event to an endpoint, as the fan-out creates it: no attempts yet,
    /// due now, delivery id derived.
    pub fn new(
        event_id: EventId,
        endpoint_id: EndpointId,
        tenant: Tenant,
        event_type: EventType,
        event_time: UnixMillis,
        origin: Option<Origin>,
        body: Bytes,
    ) -> DeliveryRecord {
        DeliveryRecord {
            delivery_id: DeliveryId::derive(&event_id, &endpoint_id),
            event_id,
            endpoint_id,
            tenant,
            event_type,
            attempts: 0,
            first_attempt_at: None,
            not_before: None,
            event_time,
            replay_id: None,
            origin,
            dead: None,
            body,
        }
    }

    /// The Kafka key: the endpoint id.
    pub fn key(&self) -> &[u8] {
        self.endpoint_id.as_str().as_bytes()
    }

    /// When the record may be attempted; `None` means now.
    pub fn due_at(&self) -> Option<SystemTime> {
        self.not_before.map(UnixMillis::to_system_time)
    }

    /// Whether the record may be attempted at `now`.
    pub fn is_due(&self, now: SystemTime) -> bool {
        self.due_at().is_none_or(|t| t <= now)
    }

    /// Records the first attempt of the window at `at`, unless one is already recorded (the
    /// window is measured from the first attempt, so later attempts never move it).
    pub fn with_first_attempt_at(mut self, at: SystemTime) -> DeliveryRecord {
        if self.first_attempt_at.is_none() {
            self.first_attempt_at = Some(at.into());
        }
        self
    }

    /// The record to put into a delay tier after a retryable failure: `attempts` made so far,
    /// not to be tried before `not_before`.
    pub fn for_retry(mut self, attempts: u32, not_before: SystemTime) -> DeliveryRecord {
        self.attempts = attempts;
        self.not_before = Some(not_before.into());
        self.dead = None;
        self
    }

    /// The record to park in a delay tier because its lane is full or its breaker open. Parking
    /// spends no retry budget: the attempt count is unchanged.
    pub fn for_park(mut self, not_before: SystemTime) -> DeliveryRecord {
        self.not_before = Some(not_before.into());
        self
    }

    /// The record to write to the DLQ. `attempts` should already count the last attempt.
    pub fn for_dlq(mut self, dead: DeadInfo) -> DeliveryRecord {
        self.not_before = None;
        self.dead = Some(dead);
        self
    }

    /// The record to republish from the DLQ: a fresh window (no attempts, no first-attempt
    /// time), due now, tagged with the replay id. Body and ids are unchanged, so receivers see
    /// the same `webhook-id`.
    pub fn for_replay(mut self, replay_id: impl Into<String>) -> DeliveryRecord {
        self.attempts = 0;
        self.first_attempt_at = None;
        self.not_before = None;
        self.dead = None;
        self.replay_id = Some(replay_id.into());
        self
    }

    /// The headers describing this record, in a fixed order.
    pub fn encode_headers(&self) -> Vec<(&'static str, String)> {
        self.fold_headers(Vec::with_capacity(20), |mut h, key, value| {
            h.push((key, value.to_owned()));
            h
        })
    }

    /// The headers as rdkafka's [`OwnedHeaders`], ready for a `FutureRecord`.
    pub fn to_owned_headers(&self) -> OwnedHeaders {
        // Straight into rdkafka (which copies each value) without a `String` per header: this
        // runs once per delivery record, where an allocation per header adds up.
        self.fold_headers(OwnedHeaders::new_with_capacity(20), |acc, key, value| {
            acc.insert(Header {
                key,
                value: Some(value),
            })
        })
    }

    /// Feeds every header, in the fixed order, to `put`; numbers are formatted on the stack.
    fn fold_headers<A>(&self, init: A, mut put: impl FnMut(A, &'static str, &str) -> A) -> A {
        let mut num = itoa::Buffer::new();
        let mut h = init;
        h = put(h, header::VERSION, FORMAT_VERSION);
        h = put(h, header::DELIVERY_ID, self.delivery_id.as_str());
        h = put(h, header::EVENT_ID, self.event_id.as_str());
        h = put(h, header::ENDPOINT_ID, self.endpoint_id.as_str());
        h = put(h, header::TENANT, self.tenant.as_str());
        h = put(h, header::EVENT_TYPE, self.event_type.as_str());
        h = put(h, header::ATTEMPTS, num.format(self.attempts));
        if let Some(t) = self.first_attempt_at {
            h = put(h, header::FIRST_ATTEMPT_AT, num.format(t.0));
        }
        if let Some(t) = self.not_before {
            h = put(h, header::NOT_BEFORE, num.format(t.0));
        }
        h = put(h, header::EVENT_TIME, num.format(self.event_time.0));
        if let Some(r) = &self.replay_id {
            h = put(h, header::REPLAY_ID, r);
        }
        if let Some(o) = &self.origin {
            h = put(h, header::ORIGIN_TOPIC, &o.topic);
            h = put(h, header::ORIGIN_PARTITION, num.format(o.partition));
            h = put(h, header::ORIGIN_OFFSET, num.format(o.offset));
        }
        if let Some(d) = &self.dead {
            h = put(h, header::DEAD_REASON, d.reason.as_str());
            if let Some(s) = d.last_status {
                h = put(h, header::LAST_STATUS, num.format(s));
            }
            if let Some(c) = d.last_error {
                h = put(h, header::LAST_ERROR, c.as_str());
            }
            h = put(h, header::LAST_ATTEMPT_AT, num.format(d.last_attempt_at.0));
            // Dead records are rare; one allocation for the joined list is fine.
            h = put(h, header::SIGNING_KEY_IDS, &d.signing_key_ids.join(","));
        }
        h
    }

    /// Decodes a record read from a hookline topic. Unknown headers are ignored; when a header
    /// repeats, the last one wins (Kafka's convention).
    pub fn decode(
        key: Option<&[u8]>,
        headers: &[(&str, &[u8])],
        payload: Bytes,
    ) -> Result<DeliveryRecord, RecordError> {
        let h = HeaderView(headers);
        let version = h.required_str(header::VERSION)?;
        if version != FORMAT_VERSION {
            return Err(RecordError::UnsupportedVersion(version.to_owned()));
        }
        let endpoint_id = h.id(header::ENDPOINT_ID, EndpointId::parse)?;
        let key = key.ok_or(RecordError::MissingKey)?;
        if key != endpoint_id.as_str().as_bytes() {
            return Err(RecordError::KeyMismatch {
                key: String::from_utf8_lossy(key).into_owned(),
                header: endpoint_id.to_string(),
            });
        }
        if payload.is_empty() {
            return Err(RecordError::MissingBody);
        }
        let event_type = EventType::parse(h.required_str(header::EVENT_TYPE)?).map_err(
            |e: EventTypeError| RecordError::BadHeader {
                name: header::EVENT_TYPE,
                detail: e.to_string(),
            },
        )?;
        let origin = match h.optional_str(header::ORIGIN_TOPIC)? {
            None => None,
            Some(topic) => Some(Origin {
                topic: topic.to_owned(),
                partition: h.required_num(header::ORIGIN_PARTITION)?,
                offset: h.required_num(header::ORIGIN_OFFSET)?,
            }),
        };
        let dead = match h.optional_str(header::DEAD_REASON)? {
            None => None,
            Some(reason) => Some(DeadInfo {
                reason: DeadReason::parse(reason).ok_or_else(|| RecordError::BadHeader {
                    name: header::DEAD_REASON,
                    detail: format!("unknown dead reason {reason:?}"),
                })?,
                last_status: h.optional_num(header::LAST_STATUS)?,
                last_error: match h.optional_str(header::LAST_ERROR)? {
                    None => None,
                    Some(c) => {
                        Some(ErrorClass::parse(c).ok_or_else(|| RecordError::BadHeader {
                            name: header::LAST_ERROR,
                            detail: format!("unknown error class {c:?}"),
                        })?)
                    }
                },
                last_attempt_at: UnixMillis(h.required_num(header::LAST_ATTEMPT_AT)?),
                signing_key_ids: h.key_ids()?,
            }),
        };
        Ok(DeliveryRecord {
            delivery_id: h.id(header::DELIVERY_ID, DeliveryId::parse)?,
            event_id: h.id(header::EVENT_ID, EventId::parse)?,
            endpoint_id,
            tenant: h.id(header::TENANT, Tenant::parse)?,
            event_type,
            attempts: h.required_num(header::ATTEMPTS)?,
            first_attempt_at: h.optional_num(header::FIRST_ATTEMPT_AT)?.map(UnixMillis),
            not_before: h.optional_num(header::NOT_BEFORE)?.map(UnixMillis),
            event_time: UnixMillis(h.required_num(header::EVENT_TIME)?),
            replay_id: h
                .optional_str(header::REPLAY_ID)?
                .map(|r| check_replay_id(r).map(str::to_owned))
                .transpose()?,
            origin,
            dead,
            body: payload,
        })
    }

    /// Decodes a record straight from an rdkafka message (copies the payload once).
    pub fn from_message<M>(msg: &M) -> Result<DeliveryRecord, RecordError>
    where
        M: Message,
        M::Headers: HeaderPairs,
    {
        let headers = message_headers(msg).map_err(|e| RecordError::BadHeaderName(e.index))?;
        let payload = msg.payload().ok_or(RecordError::MissingBody)?;
        DeliveryRecord::decode(msg.key(), &headers, Bytes::copy_from_slice(payload))
    }
}

/// A header whose name is not UTF-8. Kafka does not require names to be, and producers other
/// than Java's can write any bytes; hookline's own headers always are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("header {index} has a name that is not UTF-8")]
pub struct BadHeaderName {
    /// The header's position in the record.
    pub index: usize,
}

/// A header list that can be read as `(name, value)` pairs.
pub trait HeaderPairs {
    /// The pairs in order; a null value reads as empty, and a name that is not UTF-8 is an error
    /// rather than a panic.
    fn pairs(&self) -> Result<Vec<(&str, &[u8])>, BadHeaderName>;
}

impl HeaderPairs for BorrowedHeaders {
    // Read through librdkafka's C API rather than `Headers::try_get`, which panics on a name
    // that is not UTF-8: one such record would stop the stage reading it, on every instance the
    // partition moved to.
    fn pairs(&self) -> Result<Vec<(&str, &[u8])>, BadHeaderName> {
        // rdkafka hands out a `&BorrowedHeaders` by casting librdkafka's `rd_kafka_headers_t`
        // pointer (and casts it back for every call): its address is that pointer.
        let native = std::ptr::from_ref(self).cast::<rd_kafka_headers_t>();
        // SAFETY: `native` is a live header list for as long as `self` is borrowed.
        let count = unsafe { rd_kafka_header_cnt(native) };
        let mut pairs = Vec::with_capacity(count);
        for index in 0..count {
            let mut name: *const c_char = std::ptr::null();
            let mut value: *const c_void = std::ptr::null();
            let mut size = 0usize;
            // SAFETY: as above; the out-pointers are valid locals, and `index < count`.
            let err =
                unsafe { rd_kafka_header_get_all(native, index, &mut name, &mut value, &mut size) };
            if err != rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
                continue;
            }
            // SAFETY: librdkafka stores every name NUL-terminated, and the name and value live
            // in the header list, which outlives the borrow of `self` the pairs carry.
            let name = unsafe { CStr::from_ptr(name) }
                .to_str()
                .map_err(|_| BadHeaderName { index })?;
            let value: &[u8] = if value.is_null() {
                &[]
            } else {
                // SAFETY: librdkafka gives `size` bytes at `value`, owned by the header list.
                unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) }
            };
            pairs.push((name, value));
        }
        Ok(pairs)
    }
}

impl HeaderPairs for OwnedHeaders {
    fn pairs(&self) -> Result<Vec<(&str, &[u8])>, BadHeaderName> {
        self.as_borrowed().pairs()
    }
}

/// A message's headers as [`HeaderPairs::pairs`] reads them; none when it has none.
pub fn message_headers<M>(msg: &M) -> Result<Vec<(&str, &[u8])>, BadHeaderName>
where
    M: Message,
    M::Headers: HeaderPairs,
{
    Ok(msg
        .headers()
        .map(HeaderPairs::pairs)
        .transpose()?
        .unwrap_or_default())
}

fn check_replay_id(r: &str) -> Result<&str, RecordError> {
    if r.is_empty() || r.len() > MAX_ID_LEN || !r.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(RecordError::BadHeader {
            name: header::REPLAY_ID,
            detail: format!("must be 1 to {MAX_ID_LEN} bytes of printable ASCII"),
        });
    }
    Ok(r)
}

/// Read access to a plain header list, with errors that name the header.
struct HeaderView<'a>(&'a [(&'a str, &'a [u8])]);

impl<'a> HeaderView<'a> {
    fn raw(&self, name: &str) -> Option<&'a [u8]> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
    }

    fn optional_str(&self, name: &'static str) -> Result<Option<&'a str>, RecordError> {
        self.raw(name)
            .map(|v| {
                std::str::from_utf8(v).map_err(|_| RecordError::BadHeader {
                    name,
                    detail: "not UTF-8".to_owned(),
                })
            })
            .transpose()
    }

    fn required_str(&self, name: &'static str) -> Result<&'a str, RecordError> {
        self.optional_str(name)?
            .ok_or(RecordError::MissingHeader(name))
    }

    fn optional_num<T: std::str::FromStr>(
        &self,
        name: &'static str,
    ) -> Result<Option<T>, RecordError> {
        self.optional_str(name)?
            .map(|s| {
                // Only plain ASCII digits (and a sign for signed types) are written; reject
                // anything FromStr would tolerate beyond that, like a leading '+'.
                let plain = !s.is_empty()
                    && s.bytes()
                        .enumerate()
                        .all(|(i, b)| b.is_ascii_digit() || (i == 0 && b == b'-' && s.len() > 1));
                plain
                    .then(|| s.parse::<T>().ok())
                    .flatten()
                    .ok_or_else(|| RecordError::BadHeader {
                        name,
                        detail: format!("{s:?} is not a number in range"),
                    })
            })
            .transpose()
    }

    fn required_num<T: std::str::FromStr>(&self, name: &'static str) -> Result<T, RecordError> {
        self.optional_num(name)?
            .ok_or(RecordError::MissingHeader(name))
    }

    fn id<T>(
        &self,
        name: &'static str,
        parse: fn(String) -> Result<T, IdError>,
    ) -> Result<T, RecordError> {
        parse(self.required_str(name)?.to_owned()).map_err(|e| RecordError::BadHeader {
            name,
            detail: e.to_string(),
        })
    }

    fn key_ids(&self) -> Result<Vec<String>, RecordError> {
        let name = header::SIGNING_KEY_IDS;
        let Some(list) = self.optional_str(name)? else {
            return Ok(Vec::new());
        };
        if list.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<String> = list.split(',').map(str::to_owned).collect();
        if ids.len() > MAX_SIGNING_KEY_IDS {
            return Err(RecordError::BadHeader {
                name,
                detail: format!("more than {MAX_SIGNING_KEY_IDS} key ids"),
            });
        }
        if ids.iter().any(|k| k.is_empty()) {
            return Err(RecordError::BadHeader {
                name,
                detail: "empty key id".to_owned(),
            });
        }
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> DeliveryRecord {
        let event_id = EventId::parse("evt_1").unwrap();
        let event_type = EventType::parse("order.created").unwrap();
        let data = RawValue::from_string(r#"{ "b":1,  "a":[1.50, "\u00e9"] }"#.to_owned()).unwrap();
        let body = build_body(&event_id, &event_type, UnixMillis(1_700_000_000_123), &data);
        DeliveryRecord::new(
            event_id,
            EndpointId::parse("ep_a").unwrap(),
            Tenant::parse("acme").unwrap(),
            event_type,
            UnixMillis(1_700_000_000_123),
            Some(Origin {
                topic: "outbox.event.order".to_owned(),
                partition: 3,
                offset: 42,
            }),
            body,
        )
    }

    fn roundtrip(r: &DeliveryRecord) -> Result<DeliveryRecord, RecordError> {
        let enc = r.encode_headers();
        let headers: Vec<(&str, &[u8])> = enc.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        DeliveryRecord::decode(Some(r.key()), &headers, r.body.clone())
    }

    #[test]
    fn body_keeps_the_payload_bytes_and_formats_the_time() {
        let r = sample();
        assert_eq!(
            std::str::from_utf8(&r.body).unwrap(),
            r#"{"id":"evt_1","type":"order.created","timestamp":"2023-11-14T22:13:20.123Z","data":{ "b":1,  "a":[1.50, "\u00e9"] }}"#
        );
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["data"]["a"][1], "é");
    }

    #[test]
    fn ids_with_quotes_are_escaped_in_the_body() {
        let id = EventId::parse(r#"a"b\c"#).unwrap();
        let ty = EventType::parse("x").unwrap();
        let data = RawValue::from_string("null".to_owned()).unwrap();
        let body = build_body(&id, &ty, UnixMillis(0), &data);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["id"], r#"a"b\c"#);
        assert_eq!(v["timestamp"], "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn fresh_retry_park_dlq_and_replay_round_trip() {
        let t0 = UNIX_EPOCH + Duration::from_millis(1_700_000_100_000);
        let fresh = sample();
        assert_eq!(roundtrip(&fresh).unwrap(), fresh);
        assert!(fresh.is_due(UNIX_EPOCH));

        let retry = fresh
            .clone()
            .with_first_attempt_at(t0)
            .for_retry(1, t0 + Duration::from_secs(5));
        assert_eq!(retry.attempts, 1);
        assert_eq!(retry.due_at(), Some(t0 + Duration::from_secs(5)));
        assert!(!retry.is_due(t0));
        assert!(retry.is_due(t0 + Duration::from_secs(5)));
        assert_eq!(roundtrip(&retry).unwrap(), retry);

        // A later attempt never moves the window's start.
        let again = retry
            .clone()
            .with_first_attempt_at(t0 + Duration::from_secs(9));
        assert_eq!(again.first_attempt_at, retry.first_attempt_at);

        let parked = retry.clone().for_park(t0 + Duration::from_secs(60));
        assert_eq!(parked.attempts, 1, "parking spends no retry budget");
        assert_eq!(roundtrip(&parked).unwrap(), parked);

        let dead = parked.clone().for_retry(7, t0).for_dlq(DeadInfo {
            reason: DeadReason::WindowExhausted,
            last_status: Some(503),
            last_error: Some(ErrorClass::HttpStatus),
            last_attempt_at: UnixMillis(1_700_000_200_000),
            signing_key_ids: vec!["key_1".into(), "key_2".into()],
        });
        assert_eq!(dead.due_at(), None);
        assert_eq!(roundtrip(&dead).unwrap(), dead);

        let replay = dead.clone().for_replay("rpl_9");
        assert_eq!(replay.attempts, 0);
        assert_eq!(replay.first_attempt_at, None);
        assert_eq!(replay.dead, None);
        assert_eq!(replay.replay_id.as_deref(), Some("rpl_9"));
        assert_eq!(replay.body, fresh.body);
        assert_eq!(replay.delivery_id, fresh.delivery_id);
        assert_eq!(roundtrip(&replay).unwrap(), replay);
    }

    #[test]
    fn rdkafka_adapter_round_trips() {
        let r = sample().for_dlq(DeadInfo {
            reason: DeadReason::Gone,
            last_status: Some(410),
            last_error: Some(ErrorClass::HttpStatus),
            last_attempt_at: UnixMillis(5),
            signing_key_ids: vec![],
        });
        let owned = r.to_owned_headers();
        let headers = owned.pairs().unwrap();
        assert_eq!(headers.len(), r.encode_headers().len());
        let back = DeliveryRecord::decode(Some(r.key()), &headers, r.body.clone()).unwrap();
        assert_eq!(back, r);
    }

    /// A header list as librdkafka holds one, with names of any bytes (rdkafka's own API only
    /// writes UTF-8 names), read through [`HeaderPairs::pairs`].
    fn with_native_headers<T>(
        headers: &[(&[u8], Option<&[u8]>)],
        read: impl FnOnce(&BorrowedHeaders) -> T,
    ) -> T {
        use rdkafka::bindings::{
            rd_kafka_header_add, rd_kafka_headers_destroy, rd_kafka_headers_new,
        };
        // SAFETY: the list is built, borrowed and destroyed here; names and values are copied
        // into it by `rd_kafka_header_add`.
        unsafe {
            let native = rd_kafka_headers_new(headers.len());
            for (name, value) in headers {
                let (v, len) = value.map_or((std::ptr::null(), 0), |v| (v.as_ptr(), v.len()));
                let err = rd_kafka_header_add(
                    native,
                    name.as_ptr().cast(),
                    isize::try_from(name.len()).unwrap(),
                    v.cast(),
                    isize::try_from(len).unwrap(),
                );
                assert_eq!(err, rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR);
            }
            let out = read(&*native.cast::<BorrowedHeaders>());
            rd_kafka_headers_destroy(native);
            out
        }
    }

    #[test]
    fn a_header_name_that_is_not_utf8_is_an_error_not_a_panic() {
        let pairs = with_native_headers(
            &[(b"eventType", Some(b"order.created")), (b"empty", None)],
            |h| {
                h.pairs().map(|v| {
                    v.into_iter()
                        .map(|(k, v)| (k.to_owned(), v.to_vec()))
                        .collect::<Vec<_>>()
                })
            },
        );
        assert_eq!(
            pairs,
            Ok(vec![
                ("eventType".to_owned(), b"order.created".to_vec()),
                ("empty".to_owned(), vec![]),
            ])
        );
        let bad = with_native_headers(
            &[
                (b"eventType", Some(b"order.created")),
                (b"\xff\xfe", Some(b"x")),
            ],
            |h| h.pairs().map(|v| v.len()),
        );
        assert_eq!(bad, Err(BadHeaderName { index: 1 }));
        assert_eq!(
            bad.unwrap_err().to_string(),
            "header 1 has a name that is not UTF-8"
        );
    }

    fn decode_with(
        edit: impl FnOnce(&mut Vec<(&'static str, String)>),
    ) -> Result<DeliveryRecord, RecordError> {
        let r = sample();
        let mut enc = r.encode_headers();
        edit(&mut enc);
        let headers: Vec<(&str, &[u8])> = enc.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        DeliveryRecord::decode(Some(r.key()), &headers, r.body.clone())
    }

    #[test]
    fn errors_name_the_header() {
        let drop = |name: &'static str| {
            move |h: &mut Vec<(&'static str, String)>| h.retain(|(k, _)| *k != name)
        };
        for name in [
            header::VERSION,
            header::DELIVERY_ID,
            header::EVENT_ID,
            header::ENDPOINT_ID,
            header::TENANT,
            header::EVENT_TYPE,
            header::ATTEMPTS,
            header::EVENT_TIME,
            header::ORIGIN_PARTITION,
            header::ORIGIN_OFFSET,
        ] {
            let err = decode_with(drop(name)).unwrap_err();
            assert_eq!(err, RecordError::MissingHeader(name));
            assert!(err.to_string().contains(name));
        }
        let set = |name: &'static str, v: &'static str| {
            move |h: &mut Vec<(&'static str, String)>| h.push((name, v.to_owned()))
        };
        for (name, bad) in [
            (header::ATTEMPTS, "-1"),
            (header::ATTEMPTS, "+1"),
            (header::ATTEMPTS, "1.0"),
            (header::NOT_BEFORE, ""),
            (header::EVENT_TIME, "99999999999999999999999"),
            (header::TENANT, ""),
            (header::EVENT_TYPE, "has space"),
            (header::REPLAY_ID, "a b"),
            (header::DEAD_REASON, "bored"),
        ] {
            match decode_with(set(name, bad)).unwrap_err() {
                RecordError::BadHeader { name: n, .. } => assert_eq!(n, name, "{bad}"),
                other => panic!("{name}={bad}: {other:?}"),
            }
        }
        assert!(matches!(
            decode_with(set(header::VERSION, "2")),
            Err(RecordError::UnsupportedVersion(v)) if v == "2"
        ));
        assert!(matches!(
            decode_with(set(header::ENDPOINT_ID, "ep_b")),
            Err(RecordError::KeyMismatch { .. })
        ));
        let r = sample();
        let enc = r.encode_headers();
        let headers: Vec<(&str, &[u8])> = enc.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        assert_eq!(
            DeliveryRecord::decode(None, &headers, r.body.clone()),
            Err(RecordError::MissingKey)
        );
        assert_eq!(
            DeliveryRecord::decode(Some(r.key()), &headers, Bytes::new()),
            Err(RecordError::MissingBody)
        );
        // Foreign headers are ignored.
        assert_eq!(decode_with(set("traceparent", "00-x")).unwrap(), r);
    }

    fn arb_id() -> impl Strategy<Value = String> {
        "[!-~]{1,40}"
    }

    prop_compose! {
        fn arb_dead()(
            reason in proptest::sample::select(DeadReason::all().collect::<Vec<_>>()),
            last_status in proptest::option::of(100u16..600),
            last_error in proptest::option::of(
                proptest::sample::select(ErrorClass::all().collect::<Vec<_>>()),
            ),
            last_attempt_at in any::<u64>(),
            signing_key_ids in proptest::collection::vec("[a-zA-Z0-9_]{1,20}", 0..4),
        ) -> DeadInfo {
            DeadInfo { reason, last_status, last_error, last_attempt_at: UnixMillis(last_attempt_at), signing_key_ids }
        }
    }

    prop_compose! {
        fn arb_record()(
            event_id in arb_id(),
            endpoint_id in arb_id(),
            tenant in arb_id(),
            event_type in "[A-Za-z0-9._:-]{1,60}",
            attempts in any::<u32>(),
            first in proptest::option::of(any::<u64>()),
            not_before in proptest::option::of(any::<u64>()),
            event_time in any::<u64>(),
            replay_id in proptest::option::of(arb_id()),
            origin in proptest::option::of(("[a-zA-Z0-9._-]{1,50}", any::<i32>(), any::<i64>())),
            dead in proptest::option::of(arb_dead()),
            body in proptest::collection::vec(any::<u8>(), 1..300),
        ) -> DeliveryRecord {
            let event_id = EventId::parse(event_id).unwrap();
            let endpoint_id = EndpointId::parse(endpoint_id).unwrap();
            DeliveryRecord {
                delivery_id: DeliveryId::derive(&event_id, &endpoint_id),
                event_id,
                endpoint_id,
                tenant: Tenant::parse(tenant).unwrap(),
                event_type: EventType::parse(event_type).unwrap(),
                attempts,
                first_attempt_at: first.map(UnixMillis),
                not_before: not_before.map(UnixMillis),
                event_time: UnixMillis(event_time),
                replay_id,
                origin: origin.map(|(topic, partition, offset)| Origin { topic, partition, offset }),
                dead,
                body: Bytes::from(body),
            }
        }
    }

    proptest! {
        #[test]
        fn any_record_round_trips_with_its_body_untouched(r in arb_record()) {
            let back = roundtrip(&r).unwrap();
            prop_assert_eq!(&back.body, &r.body);
            prop_assert_eq!(back, r);
        }

        #[test]
        fn transitions_keep_body_and_ids(r in arb_record(), t in any::<u32>(), n in any::<u32>()) {
            let at = UNIX_EPOCH + Duration::from_millis(u64::from(t));
            for next in [
                r.clone().for_retry(n, at),
                r.clone().for_park(at),
                r.clone().for_replay("rpl_1"),
            ] {
                prop_assert_eq!(&next.body, &r.body);
                prop_assert_eq!(&next.delivery_id, &r.delivery_id);
                prop_assert_eq!(roundtrip(&next).unwrap(), next.clone());
            }
            prop_assert_eq!(r.clone().for_park(at).attempts, r.attempts);
        }

        #[test]
        fn garbage_headers_never_panic(
            headers in proptest::collection::vec((
                proptest::sample::select(vec![
                    header::VERSION, header::ATTEMPTS, header::EVENT_TIME, header::DEAD_REASON,
                    header::SIGNING_KEY_IDS, header::ORIGIN_TOPIC, header::ENDPOINT_ID,
                ]),
                proptest::collection::vec(any::<u8>(), 0..20),
            ), 0..12),
        ) {
            let hs: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_slice())).collect();
            let _ = DeliveryRecord::decode(Some(b"ep_a"), &hs, Bytes::from_static(b"{}"));
        }
    }
}
