//! Turning one input Kafka record into an event, or into a reason it cannot be one.
//!
//! Two formats arrive on input topics:
//! - Debezium Outbox Event Router records: key = aggregate id, header `id` = event id, event type
//!   and tenant in further headers (names configurable, defaults `eventType` and `tenant`), value =
//!   the payload JSON itself (`table.expand.json.payload=true` with schemas off), or that payload
//!   as Kafka Connect's JSON converter and Debezium's defaults wrap it (see [`outbox_payload`]).
//! - The native envelope `{"id"?, "tenant", "type", "occurred_at"?, "payload"}` written by
//!   `POST /v1/events` or any producer; see `schemas/native-event.schema.json`.
//!
//! Anything else becomes [`InvalidInput`] with a short machine reason; the fan-out stage forwards
//! the record to `hookline.invalid` with [`INVALID_REASON_HEADER`] so nothing is dropped and the
//! partition never stalls. Everything here is pure: no Kafka I/O, no clock reads.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use rdkafka::message::Message;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::event_type::EventType;
use crate::id::{EventId, Tenant};
use crate::record::{HeaderPairs, Origin, UnixMillis, build_body, message_headers};

/// Header carrying the machine reason on records forwarded to `hookline.invalid`.
pub const INVALID_REASON_HEADER: &str = "hookline-invalid-reason";
/// Header carrying the human detail on records forwarded to `hookline.invalid`.
pub const INVALID_DETAIL_HEADER: &str = "hookline-invalid-detail";

/// Default payload size limit: 256 KiB.
pub const DEFAULT_MAX_PAYLOAD: usize = 256 * 1024;
/// Room allowed for the native envelope around its payload before the size check rejects the
/// record without parsing it (ids, tenant, type, time and whitespace fit easily).
const ENVELOPE_SLACK: usize = 4096;
/// Longest field or header name quoted back in a reason, so reasons stay short and bounded.
const MAX_NAME_IN_REASON: usize = 64;
/// Most fields read from a native envelope before it is rejected (it has five).
const MAX_ENVELOPE_FIELDS: usize = 16;

/// One event, validated and ready for fan-out.
#[derive(Debug, Clone)]
pub struct InputEvent {
    /// The event id (`webhook-id`).
    pub id: EventId,
    /// The owning tenant.
    pub tenant: Tenant,
    /// The event type.
    pub event_type: EventType,
    /// When the event happened, truncated to the millisecond (the resolution of record headers,
    /// so the body's `timestamp` and the event-time header always agree).
    pub occurred_at: SystemTime,
    /// The payload exactly as the producer wrote it.
    pub payload: Box<RawValue>,
}

impl InputEvent {
    /// The body sent to every subscribed endpoint. Call it once per event and share the bytes
    /// among its delivery records.
    pub fn body_bytes(&self) -> Bytes {
        build_body(
            &self.id,
            &self.event_type,
            UnixMillis::from_system_time(self.occurred_at),
            &self.payload,
        )
    }

    /// The event's [`fingerprint`], lowercase hex: what the store keeps to tell a repeat of
    /// this event from a different event with the same id.
    pub fn fingerprint_hex(&self) -> String {
        fingerprint(&self.tenant, &self.event_type, &self.payload)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// What makes two copies of one event id the same event: tenant, type and payload bytes.
/// `POST /v1/events` and the fan-out compute it alike, so a repeat is told from a different
/// event that reuses the id.
pub fn fingerprint(tenant: &Tenant, event_type: &EventType, payload: &RawValue) -> [u8; 32] {
    let mut h = Sha256::new();
    for part in [tenant.as_str(), event_type.as_str(), payload.get()] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().into()
}

/// Which format an input topic carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputFormat {
    /// Outbox if the record has the `id` header, native envelope otherwise.
    #[default]
    Auto,
    /// Debezium Outbox Event Router records only.
    Outbox,
    /// Native envelopes only.
    Native,
}

/// How input records are read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InputConfig {
    /// Which format to expect.
    pub format: InputFormat,
    /// Outbox header holding the event type (`...additional.placement=type:header:eventType`).
    pub type_header: String,
    /// Outbox header holding the tenant (`...additional.placement=tenant_id:header:tenant`).
    pub tenant_header: String,
    /// Largest payload accepted, in bytes.
    pub max_payload: usize,
    /// Largest record hookline's producers write (`message.max.bytes`): an invalid record
    /// forwarded with its value would be larger leaves the value out.
    #[serde(skip)]
    pub max_record: usize,
}

impl Default for InputConfig {
    fn default() -> InputConfig {
        InputConfig {
            format: InputFormat::Auto,
            type_header: "eventType".to_owned(),
            tenant_header: "tenant".to_owned(),
            max_payload: DEFAULT_MAX_PAYLOAD,
            max_record: crate::limits::DEFAULT_MESSAGE_MAX_BYTES as usize,
        }
    }
}

/// The outbox header carrying the event id (fixed by Debezium's Event Router).
pub const OUTBOX_ID_HEADER: &str = "id";

/// One input record as plain data, independent of rdkafka.
#[derive(Debug, Clone, Copy)]
pub struct InputRecord<'a> {
    /// Topic it was read from.
    pub topic: &'a str,
    /// Partition it was read from.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// The Kafka record timestamp, if any: the event time when the format has none.
    pub timestamp: Option<SystemTime>,
    /// The key (the aggregate id for outbox records; unused otherwise).
    pub key: Option<&'a [u8]>,
    /// Headers in order; a null value reads as empty.
    pub headers: &'a [(&'a str, &'a [u8])],
    /// The value.
    pub payload: Option<&'a [u8]>,
}

impl InputRecord<'_> {
    /// Where this record sits, for delivery-record headers and fallback ids.
    pub fn origin(&self) -> Origin {
        Origin {
            topic: self.topic.to_owned(),
            partition: self.partition,
            offset: self.offset,
        }
    }
}

/// Why an input record is not an event: what the stage writes into [`INVALID_REASON_HEADER`].
#[derive(Debug, Clone, PartialEq, Eq, strum::EnumIter, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum InvalidReason {
    /// No value, an empty one, or only whitespace (e.g. a tombstone).
    EmptyValue,
    /// The value (or payload) is not UTF-8 JSON.
    NotJson,
    /// The native envelope is JSON but not an object.
    NotObject,
    /// A required outbox header is missing.
    MissingHeader(String),
    /// An outbox header is present but unreadable (not UTF-8, or a bad JSON-quoted string).
    BadHeader(String),
    /// A required envelope field is missing.
    MissingField(String),
    /// The envelope has a field it does not define.
    UnknownField(String),
    /// The envelope repeats a field.
    DuplicateField(String),
    /// The event id is unusable.
    BadEventId,
    /// The event type is unusable.
    BadEventType,
    /// The tenant is unusable.
    BadTenant,
    /// `occurred_at` is not an RFC 3339 time.
    BadOccurredAt,
    /// The payload exceeds the configured limit.
    PayloadTooLarge,
    /// The event reuses the id of a different event (another type or payload) of its tenant
    /// fanned out within `ingest.dedupe_window`.
    ReusedId,
}

impl InvalidReason {
    /// Every [`InvalidReason::kind`], in declaration order, for registering the metric's series
    /// at start-up.
    pub fn kinds() -> impl Iterator<Item = &'static str> {
        <InvalidReason as strum::IntoEnumIterator>::iter().map(|r| r.kind())
    }

    /// The reason without the field or header name: a bounded metric label (the variant's name
    /// in snake case).
    pub fn kind(&self) -> &'static str {
        self.into()
    }

    /// The field or header the reason names, if it names one.
    fn name(&self) -> Option<&str> {
        match self {
            InvalidReason::MissingHeader(n)
            | InvalidReason::BadHeader(n)
            | InvalidReason::MissingField(n)
            | InvalidReason::UnknownField(n)
            | InvalidReason::DuplicateField(n) => Some(n),
            InvalidReason::EmptyValue
            | InvalidReason::NotJson
            | InvalidReason::NotObject
            | InvalidReason::BadEventId
            | InvalidReason::BadEventType
            | InvalidReason::BadTenant
            | InvalidReason::BadOccurredAt
            | InvalidReason::PayloadTooLarge
            | InvalidReason::ReusedId => None,
        }
    }

    /// The short machine form: the kind, then the name it concerns (cut to
    /// `MAX_NAME_IN_REASON` characters, control characters dropped), e.g.
    /// `missing_header:eventType`.
    pub fn code(&self) -> String {
        match self.name() {
            None => self.kind().to_owned(),
            Some(name) => {
                let mut n: String = name.chars().take(MAX_NAME_IN_REASON).collect();
                n.retain(|c| !c.is_control());
                format!("{}:{n}", self.kind())
            }
        }
    }
}

impl fmt::Display for InvalidReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.code())
    }
}

/// An input record that is not a valid event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid input ({reason}): {detail}")]
pub struct InvalidInput {
    /// Machine reason.
    pub reason: InvalidReason,
    /// Human detail for operators.
    pub detail: String,
}

impl InvalidInput {
    /// The detail is cut to [`MAX_DETAIL`] bytes: it may quote a field name of any length, and
    /// it goes to a header and the log.
    pub fn new(reason: InvalidReason, detail: impl Into<String>) -> InvalidInput {
        InvalidInput {
            reason,
            detail: cut(&detail.into(), MAX_DETAIL),
        }
    }

    /// The headers the fan-out adds when it forwards the original record to `hookline.invalid`.
    pub fn headers(&self) -> [(&'static str, String); 2] {
        [
            (INVALID_REASON_HEADER, self.reason.code()),
            (INVALID_DETAIL_HEADER, self.detail.clone()),
        ]
    }

    /// Adds `more`, hookline's own words, to the detail.
    pub fn and(mut self, more: &str) -> InvalidInput {
        self.detail.push_str("; ");
        self.detail.push_str(more);
        self
    }
}

/// Longest detail taken from a record (field and header names are quoted in it), in bytes.
pub const MAX_DETAIL: usize = 1024;

/// `s` cut to at most `max` bytes at a character boundary, marked with `…` when cut.
fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max - '…'.len_utf8();
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// The id given to an event that arrived without one: derived from where it sits in Kafka, so
/// reprocessing the same record yields the same id (and the same delivery ids).
pub fn fallback_event_id(topic: &str, partition: i32, offset: i64) -> EventId {
    // Fixed random namespace; changing it would change every fallback id.
    const NAMESPACE: Uuid = Uuid::from_u128(0x0b7e_52c4_39d1_4f0a_a6e8_5c2d_91f3_7a64);
    let mut name = Vec::with_capacity(topic.len() + 32);
    name.extend_from_slice(topic.as_bytes());
    name.push(0);
    name.extend_from_slice(partition.to_string().as_bytes());
    name.push(0);
    name.extend_from_slice(offset.to_string().as_bytes());
    EventId::parse(format!("msg_{}", Uuid::new_v5(&NAMESPACE, &name).simple()))
        .expect("a generated id is valid")
}

/// Parses one input record. `now` is the event time of last resort, when neither the envelope
/// nor the Kafka record carries one.
pub fn parse(
    config: &InputConfig,
    record: &InputRecord<'_>,
    now: SystemTime,
) -> Result<InputEvent, InvalidInput> {
    let value = record.payload.unwrap_or(&[]);
    if value.iter().all(u8::is_ascii_whitespace) {
        return Err(InvalidInput::new(
            InvalidReason::EmptyValue,
            "the record has no value",
        ));
    }
    let outbox = match config.format {
        InputFormat::Outbox => true,
        InputFormat::Native => false,
        InputFormat::Auto => header(record.headers, OUTBOX_ID_HEADER).is_some(),
    };
    let fallback_time = record.timestamp.unwrap_or(now);
    if outbox {
        parse_outbox(config, record, value, fallback_time)
    } else {
        parse_native(config, record, value, fallback_time)
    }
}

/// Parses one rdkafka message (see [`parse`]).
pub fn parse_message<M>(
    config: &InputConfig,
    msg: &M,
    now: SystemTime,
) -> Result<InputEvent, InvalidInput>
where
    M: Message,
    M::Headers: HeaderPairs,
{
    let headers = message_headers(msg).map_err(|e| {
        InvalidInput::new(
            InvalidReason::BadHeader(format!("#{}", e.index)),
            e.to_string(),
        )
    })?;
    let record = InputRecord {
        topic: msg.topic(),
        partition: msg.partition(),
        offset: msg.offset(),
        timestamp: msg
            .timestamp()
            .to_millis()
            .and_then(|ms| u64::try_from(ms).ok())
            .map(|ms| UNIX_EPOCH + Duration::from_millis(ms)),
        key: msg.key(),
        headers: &headers,
        payload: msg.payload(),
    };
    parse(config, &record, now)
}

fn header<'a>(headers: &[(&str, &'a [u8])], name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .rev()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| *v)
}

/// Reads an outbox header as a string. Kafka Connect's SimpleHeaderConverter writes strings raw;
/// a JSON converter would write them quoted, so a value that is a JSON string is unquoted.
fn outbox_header(headers: &[(&str, &[u8])], name: &str) -> Result<String, InvalidInput> {
    let raw = header(headers, name).ok_or_else(|| {
        InvalidInput::new(
            InvalidReason::MissingHeader(name.to_owned()),
            format!("outbox record lacks the {name:?} header"),
        )
    })?;
    let bad = |why: &str| {
        InvalidInput::new(
            InvalidReason::BadHeader(name.to_owned()),
            format!("header {name:?} {why}"),
        )
    };
    let text = std::str::from_utf8(raw).map_err(|_| bad("is not UTF-8"))?;
    if text.len() >= 2 && text.starts_with('"') && text.ends_with('"') {
        return serde_json::from_str::<String>(text).map_err(|_| bad("is a malformed JSON string"));
    }
    Ok(text.to_owned())
}

fn parse_outbox(
    config: &InputConfig,
    record: &InputRecord<'_>,
    value: &[u8],
    fallback_time: SystemTime,
) -> Result<InputEvent, InvalidInput> {
    let id = outbox_header(record.headers, OUTBOX_ID_HEADER)?;
    let id = EventId::parse(id)
        .map_err(|e| InvalidInput::new(InvalidReason::BadEventId, format!("header \"id\": {e}")))?;
    let event_type = check_type(outbox_header(record.headers, &config.type_header)?)?;
    let tenant = check_tenant(outbox_header(record.headers, &config.tenant_header)?)?;
    check_size(config, value.len())?;
    let payload = outbox_payload(value)?;
    Ok(InputEvent {
        id,
        tenant,
        event_type,
        occurred_at: truncate_to_millis(fallback_time),
        payload,
    })
}

/// Kafka Connect's JSON converter with schemas enabled (its default): the value is
/// `{"schema": {...}, "payload": ...}`, and only the payload is the event's.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConnectEnvelope {
    /// Required (a missing field is not `None` here): a `null` or a [`ConnectSchema`].
    schema: Box<RawValue>,
    payload: Box<RawValue>,
}

/// The part of a Connect schema that says how to read the payload.
#[derive(Deserialize)]
struct ConnectSchema {
    #[serde(rename = "type")]
    _kind: String,
    #[serde(default)]
    name: Option<String>,
}

/// The semantic type Debezium gives a JSON column it emits as a string.
const DEBEZIUM_JSON: &str = "io.debezium.data.Json";

/// The event payload in an outbox record's value, read the way Debezium's Outbox Event Router
/// writes it under each common converter setting:
/// - the payload JSON itself (`table.expand.json.payload=true`, schemas off): as is;
/// - wrapped by Kafka Connect's JSON converter with schemas on, `{"schema": .., "payload": ..}`
///   (exactly those two fields, the schema an object with a `type`): the payload;
/// - the JSON column as a JSON string (`table.expand.json.payload=false`, Debezium's default):
///   the JSON inside the string, when the schema names it `io.debezium.data.Json` or, with no
///   schema, when the string holds a JSON object or array. Any other string is the payload.
///
/// Receivers so get the application's JSON in `data` whatever the connector's converters, not
/// a converter's wrapper or an escaped string.
fn outbox_payload(value: &[u8]) -> Result<Box<RawValue>, InvalidInput> {
    let not_json = |what: &str, e: serde_json::Error| {
        InvalidInput::new(InvalidReason::NotJson, format!("{what}: {e}"))
    };
    let raw: Box<RawValue> = serde_json::from_slice(value).map_err(|e| not_json("value", e))?;
    let (inner, declared_json) = if raw.get().starts_with('{') {
        let envelope = serde_json::from_str::<ConnectEnvelope>(raw.get())
            .ok()
            .and_then(|e| {
                let schema = serde_json::from_str::<Option<ConnectSchema>>(e.schema.get()).ok()?;
                Some((e.payload, schema))
            });
        match envelope {
            Some((payload, schema)) => {
                let declared = schema.is_some_and(|s| s.name.as_deref() == Some(DEBEZIUM_JSON));
                (payload, declared)
            }
            None => (raw, false),
        }
    } else {
        (raw, false)
    };
    if !inner.get().starts_with('"') {
        return Ok(inner);
    }
    let text: String = serde_json::from_str(inner.get()).map_err(|e| not_json("value", e))?;
    if declared_json {
        return serde_json::from_str(&text)
            .map_err(|e| not_json("payload (a string its schema declares JSON)", e));
    }
    let looks_structured = matches!(text.trim_start().as_bytes().first(), Some(b'{' | b'['));
    match serde_json::from_str::<Box<RawValue>>(&text) {
        Ok(json) if looks_structured => Ok(json),
        _ => Ok(inner),
    }
}

fn parse_native(
    config: &InputConfig,
    record: &InputRecord<'_>,
    value: &[u8],
    fallback_time: SystemTime,
) -> Result<InputEvent, InvalidInput> {
    // Reject oversized values before parsing, so the work per record stays bounded.
    if value.len() > config.max_payload.saturating_add(ENVELOPE_SLACK) {
        return Err(too_large(config, value.len()));
    }
    let fields: EnvelopeFields<'_> = serde_json::from_slice(value).map_err(|e| {
        if e.is_data() {
            InvalidInput::new(InvalidReason::NotObject, "the value is not a JSON object")
        } else {
            InvalidInput::new(InvalidReason::NotJson, format!("value: {e}"))
        }
    })?;
    if fields.0.len() > MAX_ENVELOPE_FIELDS {
        return Err(InvalidInput::new(
            InvalidReason::UnknownField(fields.0[MAX_ENVELOPE_FIELDS].0.clone()),
            "the envelope has far more fields than it defines",
        ));
    }
    let mut id = None;
    let mut tenant = None;
    let mut event_type = None;
    let mut occurred_at = None;
    let mut payload = None;
    for (name, raw) in &fields.0 {
        let slot = match name.as_str() {
            "id" => &mut id,
            "tenant" => &mut tenant,
            "type" => &mut event_type,
            "occurred_at" => &mut occurred_at,
            "payload" => &mut payload,
            other => {
                return Err(InvalidInput::new(
                    InvalidReason::UnknownField(other.to_owned()),
                    format!(
                        "unknown field {other:?}; the envelope has id, tenant, type, occurred_at and payload"
                    ),
                ));
            }
        };
        if slot.replace(*raw).is_some() {
            return Err(InvalidInput::new(
                InvalidReason::DuplicateField(name.clone()),
                format!("field {name:?} appears more than once"),
            ));
        }
    }
    let missing = |name: &str| {
        InvalidInput::new(
            InvalidReason::MissingField(name.to_owned()),
            format!("the envelope lacks {name:?}"),
        )
    };
    let tenant = tenant.ok_or_else(|| missing("tenant"))?;
    let event_type = event_type.ok_or_else(|| missing("type"))?;
    let payload = payload.ok_or_else(|| missing("payload"))?;

    let id = match id.filter(|raw| raw.get() != "null") {
        None => fallback_event_id(record.topic, record.partition, record.offset),
        Some(raw) => {
            let s = json_string(raw).ok_or_else(|| {
                InvalidInput::new(InvalidReason::BadEventId, "\"id\" must be a string")
            })?;
            EventId::parse(s)
                .map_err(|e| InvalidInput::new(InvalidReason::BadEventId, format!("\"id\": {e}")))?
        }
    };
    let tenant = check_tenant(json_string(tenant).ok_or_else(|| {
        InvalidInput::new(InvalidReason::BadTenant, "\"tenant\" must be a string")
    })?)?;
    let event_type = check_type(json_string(event_type).ok_or_else(|| {
        InvalidInput::new(InvalidReason::BadEventType, "\"type\" must be a string")
    })?)?;
    let occurred_at = match occurred_at.filter(|raw| raw.get() != "null") {
        None => fallback_time,
        Some(raw) => json_string(raw)
            .as_deref()
            .and_then(parse_rfc3339)
            .ok_or_else(|| {
                InvalidInput::new(
                    InvalidReason::BadOccurredAt,
                    "\"occurred_at\" must be an RFC 3339 time after 1970, e.g. 2026-03-01T12:00:00Z",
                )
            })?,
    };
    check_size(config, payload.get().len())?;
    Ok(InputEvent {
        id,
        tenant,
        event_type,
        occurred_at: truncate_to_millis(occurred_at),
        payload: payload.to_owned(),
    })
}

fn json_string(raw: &RawValue) -> Option<String> {
    serde_json::from_str::<String>(raw.get()).ok()
}

fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let dt = chrono::DateTime::parse_from_rfc3339(s).ok()?;
    let ms = u64::try_from(dt.timestamp_millis()).ok()?;
    Some(UNIX_EPOCH + Duration::from_millis(ms))
}

fn truncate_to_millis(t: SystemTime) -> SystemTime {
    UnixMillis::from_system_time(t).to_system_time()
}

fn check_type(s: String) -> Result<EventType, InvalidInput> {
    EventType::parse(s).map_err(|e| InvalidInput::new(InvalidReason::BadEventType, e.to_string()))
}

fn check_tenant(s: String) -> Result<Tenant, InvalidInput> {
    Tenant::parse(s).map_err(|e| InvalidInput::new(InvalidReason::BadTenant, e.to_string()))
}

fn check_size(config: &InputConfig, len: usize) -> Result<(), InvalidInput> {
    if len > config.max_payload {
        return Err(too_large(config, len));
    }
    Ok(())
}

fn too_large(config: &InputConfig, len: usize) -> InvalidInput {
    InvalidInput::new(
        InvalidReason::PayloadTooLarge,
        format!(
            "payload is {len} bytes; at most {} are accepted",
            config.max_payload
        ),
    )
}

/// The envelope's fields in order, values unparsed, duplicates kept (so they can be refused:
/// two `payload`s would let different readers see different events).
struct EnvelopeFields<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for EnvelopeFields<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct FieldsVisitor;
        impl<'de> Visitor<'de> for FieldsVisitor {
            type Value = EnvelopeFields<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut fields = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    // Keep one past the limit so the caller can name it; skip the rest.
                    if fields.len() > MAX_ENVELOPE_FIELDS {
                        map.next_value::<de::IgnoredAny>()?;
                        continue;
                    }
                    fields.push((key, map.next_value::<&'de RawValue>()?));
                }
                Ok(EnvelopeFields(fields))
            }
        }
        d.deserialize_map(FieldsVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kinds are hookline's interface (the invalid topic's reason header, metric labels):
    /// pinned here.
    #[test]
    fn kinds_are_stable() {
        let kinds: Vec<&str> = InvalidReason::kinds().collect();
        assert_eq!(
            kinds,
            [
                "empty_value",
                "not_json",
                "not_object",
                "missing_header",
                "bad_header",
                "missing_field",
                "unknown_field",
                "duplicate_field",
                "bad_event_id",
                "bad_event_type",
                "bad_tenant",
                "bad_occurred_at",
                "payload_too_large",
                "reused_id",
            ]
        );
        assert_eq!(
            InvalidReason::UnknownField("x".into()).kind(),
            "unknown_field"
        );
    }
    use proptest::prelude::*;

    const T0_MS: u64 = 1_700_000_000_000;

    fn t0() -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(T0_MS)
    }

    fn rec<'a>(headers: &'a [(&'a str, &'a [u8])], value: &'a [u8]) -> InputRecord<'a> {
        InputRecord {
            topic: "events",
            partition: 2,
            offset: 17,
            timestamp: Some(t0()),
            key: Some(b"order-1"),
            headers,
            payload: Some(value),
        }
    }

    fn run(headers: &[(&str, &[u8])], value: &[u8]) -> Result<InputEvent, InvalidInput> {
        parse(&InputConfig::default(), &rec(headers, value), UNIX_EPOCH)
    }

    fn reason(headers: &[(&str, &[u8])], value: &[u8]) -> String {
        run(headers, value).unwrap_err().reason.code()
    }

    const OUTBOX: &[(&str, &[u8])] = &[
        ("id", b"3f1c-aa"),
        ("eventType", b"order.created"),
        ("tenant", b"acme"),
    ];

    #[test]
    fn outbox_record_becomes_an_event() {
        let ev = run(OUTBOX, br#" {"order":1, "total": 9.90} "#).unwrap();
        assert_eq!(ev.id.as_str(), "3f1c-aa");
        assert_eq!(ev.tenant.as_str(), "acme");
        assert_eq!(ev.event_type.as_str(), "order.created");
        assert_eq!(
            ev.occurred_at,
            t0(),
            "the record timestamp is the event time"
        );
        assert_eq!(ev.payload.get(), r#"{"order":1, "total": 9.90}"#);
        assert_eq!(
            &ev.body_bytes()[..],
            br#"{"id":"3f1c-aa","type":"order.created","timestamp":"2023-11-14T22:13:20.000Z","data":{"order":1, "total": 9.90}}"#
        );
    }

    /// The payload as Debezium's outbox route writes it under each common converter setting
    /// (the shapes of Kafka Connect's JsonConverter): receivers get the application's JSON.
    #[test]
    fn outbox_payloads_are_taken_out_of_connect_wrappers_and_json_strings() {
        let payload = |value: &[u8]| run(OUTBOX, value).unwrap().payload.get().to_owned();
        // Schemas on, JSON column expanded: the struct is the payload.
        assert_eq!(
            payload(
                br#"{"schema":{"type":"struct","fields":[{"field":"order","type":"int32"}],"optional":false},"payload":{"order":1}}"#
            ),
            r#"{"order":1}"#
        );
        // Schemas on, JSON column not expanded: a string its schema names io.debezium.data.Json.
        assert_eq!(
            payload(
                br#"{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1},"payload":"{\"order\": 1, \"note\": \"\u00fc\"}"}"#
            ),
            r#"{"order": 1, "note": "ü"}"#
        );
        // Declared JSON but a scalar inside: still JSON.
        assert_eq!(
            payload(
                br#"{"schema":{"type":"string","name":"io.debezium.data.Json"},"payload":"42"}"#
            ),
            "42"
        );
        // Schemas off, JSON column not expanded: a JSON string holding an object or an array.
        assert_eq!(payload(br#""{\"order\": 1}""#), r#"{"order": 1}"#);
        assert_eq!(payload(br#"" [1, 2]""#), "[1, 2]");
        // Any other string is the payload itself, quotes and all.
        assert_eq!(payload(br#""hello""#), r#""hello""#);
        assert_eq!(payload(br#""{not json""#), r#""{not json""#);
        assert_eq!(payload(br#"{"schema":null,"payload":"text"}"#), r#""text""#);
        // Objects that are not exactly a Connect envelope are payloads.
        for value in [
            &br#"{"schema":{"type":"string"},"payload":1,"more":2}"#[..],
            br#"{"payload":{"order":1}}"#,
            br#"{"schema":"v2","payload":{"order":1}}"#,
            br#"{"schema":{"name":"x"},"payload":{"order":1}}"#,
        ] {
            assert_eq!(payload(value), std::str::from_utf8(value).unwrap());
        }
        // A string declared JSON that is not is refused, naming why.
        let err = run(
            OUTBOX,
            br#"{"schema":{"type":"string","name":"io.debezium.data.Json"},"payload":"{oops"}"#,
        )
        .unwrap_err();
        assert_eq!(err.reason.code(), "not_json");
        assert!(
            err.detail
                .starts_with("payload (a string its schema declares JSON): "),
            "{}",
            err.detail
        );
        // The body carries the payload's bytes exactly.
        let ev = run(OUTBOX, br#""{\"a\":[1,2.50]}""#).unwrap();
        assert!(ev.body_bytes().ends_with(br#","data":{"a":[1,2.50]}}"#));
    }

    #[test]
    fn outbox_headers_may_be_json_quoted_and_names_configurable() {
        let headers: &[(&str, &[u8])] = &[
            ("id", br#""evt-\"q\"""#),
            ("type", br#""user.deleted""#),
            ("tenant_id", br#""globex""#),
        ];
        let config = InputConfig {
            format: InputFormat::Outbox,
            type_header: "type".into(),
            tenant_header: "tenant_id".into(),
            ..InputConfig::default()
        };
        let ev = parse(&config, &rec(headers, b"[1,2]"), UNIX_EPOCH).unwrap();
        assert_eq!(ev.id.as_str(), r#"evt-"q""#);
        assert_eq!(ev.event_type.as_str(), "user.deleted");
        assert_eq!(ev.tenant.as_str(), "globex");
        // A bare `"` is not a JSON string: taken as is, then refused by the type check.
        let h: &[(&str, &[u8])] = &[("id", b"1"), ("eventType", b"\""), ("tenant", b"a")];
        assert_eq!(reason(h, b"1"), "bad_event_type");
    }

    #[test]
    fn native_envelope_becomes_an_event() {
        let v = br#"{"id":"evt_9","tenant":"acme","type":"invoice.paid","occurred_at":"2026-03-01T13:00:00.250123+01:00","payload":{"n": 1e3}}"#;
        let ev = run(&[], v).unwrap();
        assert_eq!(ev.id.as_str(), "evt_9");
        assert_eq!(ev.event_type.as_str(), "invoice.paid");
        assert_eq!(
            UnixMillis::from_system_time(ev.occurred_at),
            UnixMillis(1_772_366_400_250)
        );
        assert_eq!(ev.payload.get(), r#"{"n": 1e3}"#);
        let body: serde_json::Value = serde_json::from_slice(&ev.body_bytes()).unwrap();
        assert_eq!(body["timestamp"], "2026-03-01T12:00:00.250Z");
    }

    #[test]
    fn native_without_id_or_time_falls_back_deterministically() {
        let v = br#"{"tenant":"acme","type":"a","payload":null,"id":null}"#;
        let a = run(&[], v).unwrap();
        let b = run(&[], v).unwrap();
        assert_eq!(a.id, b.id);
        assert_eq!(a.id, fallback_event_id("events", 2, 17));
        assert_ne!(a.id, fallback_event_id("events", 2, 18));
        assert_ne!(fallback_event_id("a", 12, 3), fallback_event_id("a1", 2, 3));
        assert_eq!(a.occurred_at, t0());
        assert_eq!(a.payload.get(), "null");
        // No record timestamp either: the caller's clock, to the millisecond.
        let mut r = rec(&[], v);
        r.timestamp = None;
        let now = UNIX_EPOCH + Duration::new(5, 123_456_789);
        let ev = parse(&InputConfig::default(), &r, now).unwrap();
        assert_eq!(ev.occurred_at, UNIX_EPOCH + Duration::from_millis(5_123));
    }

    #[test]
    fn every_invalid_reason() {
        let ok_h = OUTBOX;
        assert_eq!(reason(ok_h, b""), "empty_value");
        assert_eq!(reason(ok_h, b"  \n"), "empty_value");
        let mut r = rec(ok_h, b"");
        r.payload = None;
        assert_eq!(
            parse(&InputConfig::default(), &r, t0()).unwrap_err().reason,
            InvalidReason::EmptyValue
        );
        assert_eq!(reason(ok_h, b"{nope"), "not_json");
        assert_eq!(reason(ok_h, b"\xff\xfe"), "not_json");
        assert_eq!(reason(&[], b"{nope"), "not_json");
        assert_eq!(reason(&[], b"[1]"), "not_object");
        assert_eq!(reason(&[], b"\"s\""), "not_object");
        assert_eq!(
            reason(&[("id", b"1"), ("tenant", b"a")], b"{}"),
            "missing_header:eventType"
        );
        assert_eq!(
            reason(&[("id", b"1"), ("eventType", b"a")], b"{}"),
            "missing_header:tenant"
        );
        let no_id = InputConfig {
            format: InputFormat::Outbox,
            ..InputConfig::default()
        };
        assert_eq!(
            parse(&no_id, &rec(&[], b"{}"), t0())
                .unwrap_err()
                .reason
                .code(),
            "missing_header:id"
        );
        assert_eq!(
            reason(
                &[("id", b"1"), ("eventType", b"\xff"), ("tenant", b"a")],
                b"{}"
            ),
            "bad_header:eventType"
        );
        assert_eq!(
            reason(
                &[("id", br#""\x""#), ("eventType", b"a"), ("tenant", b"a")],
                b"{}"
            ),
            "bad_header:id"
        );
        assert_eq!(
            reason(
                &[("id", b"a b"), ("eventType", b"a"), ("tenant", b"a")],
                b"{}"
            ),
            "bad_event_id"
        );
        assert_eq!(
            reason(
                &[("id", b"1"), ("eventType", b"a b"), ("tenant", b"a")],
                b"{}"
            ),
            "bad_event_type"
        );
        assert_eq!(
            reason(&[("id", b"1"), ("eventType", b"a"), ("tenant", b"")], b"{}"),
            "bad_tenant"
        );
        let native = |v: &str| reason(&[], v.as_bytes());
        assert_eq!(
            native(r#"{"type":"a","payload":1}"#),
            "missing_field:tenant"
        );
        assert_eq!(
            native(r#"{"tenant":"t","payload":1}"#),
            "missing_field:type"
        );
        assert_eq!(
            native(r#"{"tenant":"t","type":"a"}"#),
            "missing_field:payload"
        );
        let err = run(&[], br#"{"tenant":"t","type":"a","payload":1,"data":2}"#).unwrap_err();
        assert_eq!(err.reason.code(), "unknown_field:data");
        assert!(err.detail.contains("\"data\""));
        assert_eq!(
            native(r#"{"tenant":"t","type":"a","payload":1,"payload":2}"#),
            "duplicate_field:payload"
        );
        assert_eq!(
            native(r#"{"id":7,"tenant":"t","type":"a","payload":1}"#),
            "bad_event_id"
        );
        assert_eq!(
            native(r#"{"tenant":"t","type":"","payload":1}"#),
            "bad_event_type"
        );
        assert_eq!(
            native(&format!(
                r#"{{"tenant":"t","type":"{}","payload":1}}"#,
                "a".repeat(257)
            )),
            "bad_event_type"
        );
        assert_eq!(
            native(r#"{"tenant":"t","type":"a/b","payload":1}"#),
            "bad_event_type"
        );
        assert_eq!(
            native(r#"{"tenant":["t"],"type":"a","payload":1}"#),
            "bad_tenant"
        );
        assert_eq!(
            native(r#"{"tenant":"t t","type":"a","payload":1}"#),
            "bad_tenant"
        );
        for when in [r#""yesterday""#, r#""1969-12-31T23:59:59Z""#, "17"] {
            assert_eq!(
                native(&format!(
                    r#"{{"tenant":"t","type":"a","occurred_at":{when},"payload":1}}"#
                )),
                "bad_occurred_at"
            );
        }
    }

    #[test]
    fn payload_size_is_limited() {
        let config = InputConfig {
            max_payload: 10,
            ..InputConfig::default()
        };
        let r = |h, v| parse(&config, &rec(h, v), t0()).map_err(|e| e.reason);
        assert!(r(OUTBOX, b"\"12345678\"").is_ok());
        assert_eq!(
            r(OUTBOX, b"\"123456789\"").unwrap_err(),
            InvalidReason::PayloadTooLarge
        );
        assert!(r(&[], br#"{"tenant":"t","type":"a","payload":"12345678"}"#).is_ok());
        assert_eq!(
            r(&[], br#"{"tenant":"t","type":"a","payload":"123456789"}"#).unwrap_err(),
            InvalidReason::PayloadTooLarge
        );
        // Far too large: refused before parsing, even when it is not JSON.
        let huge = vec![b'x'; 10 + ENVELOPE_SLACK + 1];
        assert_eq!(r(&[], &huge).unwrap_err(), InvalidReason::PayloadTooLarge);
        // Default limit is 256 KiB.
        let big = format!("\"{}\"", "x".repeat(DEFAULT_MAX_PAYLOAD));
        assert_eq!(reason(OUTBOX, big.as_bytes()), "payload_too_large");
    }

    #[test]
    fn reasons_are_bounded_and_go_into_headers() {
        let long = "f".repeat(500);
        let err = run(
            &[],
            format!(r#"{{"tenant":"t","type":"a","payload":1,"{long}\n":2}}"#).as_bytes(),
        )
        .unwrap_err();
        let code = err.reason.code();
        assert_eq!(code.len(), "unknown_field:".len() + MAX_NAME_IN_REASON);
        let [(k1, v1), (k2, _)] = err.headers();
        assert_eq!((k1, v1.as_str()), (INVALID_REASON_HEADER, code.as_str()));
        assert_eq!(k2, INVALID_DETAIL_HEADER);
        assert!(err.to_string().starts_with("invalid input (unknown_field:"));
        // The detail quotes the name too, and is cut at a character boundary: a field name of
        // 100,000 bytes must not double the forwarded record or flood the log.
        let huge = "é".repeat(50_000);
        let err = run(
            &[],
            format!(r#"{{"tenant":"t","type":"a","payload":1,"{huge}":2}}"#).as_bytes(),
        )
        .unwrap_err();
        assert!(err.detail.len() <= MAX_DETAIL, "{}", err.detail.len());
        assert!(err.detail.starts_with("unknown field"), "{}", err.detail);
        assert!(
            err.detail.ends_with("é…"),
            "{}",
            &err.detail[err.detail.len() - 8..]
        );
    }

    #[test]
    fn format_can_be_forced() {
        let native_cfg = InputConfig {
            format: InputFormat::Native,
            ..InputConfig::default()
        };
        // An `id` header on a native envelope is ignored when the topic is declared native.
        let v = br#"{"tenant":"t","type":"a","payload":{}}"#;
        assert!(parse(&native_cfg, &rec(OUTBOX, v), t0()).is_ok());
        let cfg: InputConfig =
            serde_json::from_str(r#"{"format":"outbox","type_header":"type"}"#).unwrap();
        assert_eq!(cfg.format, InputFormat::Outbox);
        assert_eq!(cfg.tenant_header, "tenant");
        assert_eq!(cfg.max_payload, DEFAULT_MAX_PAYLOAD);
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(
            value in proptest::collection::vec(any::<u8>(), 0..400),
            hv in proptest::collection::vec(any::<u8>(), 0..20),
            which in 0usize..4,
        ) {
            let name = ["id", "eventType", "tenant", "other"][which];
            let headers: Vec<(&str, &[u8])> = vec![(name, hv.as_slice())];
            for format in [InputFormat::Auto, InputFormat::Outbox, InputFormat::Native] {
                let config = InputConfig { format, ..InputConfig::default() };
                let _ = parse(&config, &rec(&headers, &value), t0());
            }
        }

        #[test]
        fn json_like_values_never_panic(
            s in r#"\{("(id|tenant|type|occurred_at|payload|x)":("[a-z]{0,3}"|[0-9]|null|\[\]|\{\}),?){0,6}\}"#,
        ) {
            let _ = parse(&InputConfig::default(), &rec(&[], s.as_bytes()), t0());
        }

        #[test]
        fn valid_native_payloads_are_kept_verbatim(
            payload in r#"(\{"[a-z]{1,5}" ?: ?(0|[1-9][0-9]{0,3})(\.[0-9]{1,3})?\}|\[ ?1 ?, ?"x" ?\]|"[ -!#-\[\]-~]{0,10}"|true|-0\.0e7)"#,
        ) {
            let v = format!(r#"{{"payload":{payload},"tenant":"t","type":"a"}}"#);
            let ev = parse(&InputConfig::default(), &rec(&[], v.as_bytes()), t0()).unwrap();
            prop_assert_eq!(ev.payload.get(), payload.as_str());
            let body = ev.body_bytes();
            let suffix = format!(",\"data\":{payload}}}");
            prop_assert!(body.ends_with(suffix.as_bytes()));
        }
    }
}
