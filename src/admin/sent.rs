//! What a delivery sent, as `GET /v1/deliveries/{id}` shows it under `request`.
//!
//! The headers are those of the delivery's latest attempt, as the store logged them (`{}` before
//! any attempt, and for attempts logged before hookline kept them). The body is the event's
//! body as the fan-out serialised it, byte for byte the same for every endpoint and attempt: it
//! is read from the stored event, so it is there as long as the store keeps the event
//! (`store.scylla.attempt_ttl` with CQL, the newest `store.memory.capacity` in memory). When the
//! store no longer has it, the answer says so in a sentence instead of leaving it out silently.
//!
//! A JSON body is shown as JSON, its bytes kept (key order, number forms); any other UTF-8 as a
//! string; anything else as `body_base64` (with `body` null).

use base64::Engine;
use serde::Serialize;
use serde::ser::SerializeMap;
use serde_json::value::RawValue;

use crate::storage::{AttemptRow, DeliveryState, DeliveryStore, StoreError};

/// Why `request` is `null`: the store no longer holds the event's body.
pub const UNAVAILABLE: &str = "hookline no longer holds this event's body: the CQL store keeps \
     events for store.scylla.attempt_ttl and the memory store only its most recent \
     (store.memory.capacity); events fanned out before hookline kept them have none";

/// The request a delivery sent.
#[derive(Debug, Clone, Serialize)]
pub struct SentRequest {
    /// The latest attempt's request headers, name to value.
    pub headers: SentHeaders,
    /// The body: JSON as JSON, other UTF-8 as a string, `null` when it is not UTF-8.
    pub body: Box<RawValue>,
    /// The body in standard base64, only when it is not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_base64: Option<String>,
}

/// Request headers in the order they were sent, a repeated name's values joined with `, ` (as
/// HTTP reads them), written as one JSON object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SentHeaders(Vec<(String, String)>);

impl SentHeaders {
    /// `pairs` as sent, repeated names merged into their first place.
    pub fn new(pairs: &[(String, String)]) -> SentHeaders {
        let mut merged: Vec<(String, String)> = Vec::with_capacity(pairs.len());
        for (name, value) in pairs {
            match merged
                .iter_mut()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
            {
                Some((_, v)) => {
                    v.push_str(", ");
                    v.push_str(value);
                }
                None => merged.push((name.clone(), value.clone())),
            }
        }
        SentHeaders(merged)
    }
}

impl Serialize for SentHeaders {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (name, value) in &self.0 {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

/// The body's JSON form and, when it is not UTF-8, its base64 (see the module doc).
pub fn shown_body(bytes: &[u8]) -> (Box<RawValue>, Option<String>) {
    let null = || RawValue::from_string("null".to_owned()).expect("null is JSON");
    match std::str::from_utf8(bytes) {
        Err(_) => (
            null(),
            Some(base64::engine::general_purpose::STANDARD.encode(bytes)),
        ),
        Ok(text) => match serde_json::from_str::<Box<RawValue>>(text) {
            Ok(json) => (json, None),
            Err(_) => (
                serde_json::value::to_raw_value(text).unwrap_or_else(|_| null()),
                None,
            ),
        },
    }
}

/// What `delivery` sent, or why that is no longer known: its latest attempt's headers (of
/// `attempts`, oldest first) and its event's body from `store`.
pub async fn sent(
    store: &dyn DeliveryStore,
    delivery: &DeliveryState,
    attempts: &[AttemptRow],
) -> Result<Result<SentRequest, &'static str>, StoreError> {
    let Some(event) = store.event(&delivery.tenant, &delivery.event_id).await? else {
        return Ok(Err(UNAVAILABLE));
    };
    let headers = attempts
        .last()
        .map(|a| SentHeaders::new(&a.request_headers))
        .unwrap_or_default();
    let (body, body_base64) = shown_body(&event.body);
    Ok(Ok(SentRequest {
        headers,
        body,
        body_base64,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn headers_keep_their_order_and_merge_a_repeated_name() {
        let h = SentHeaders::new(&pairs(&[
            ("webhook-id", "msg_1"),
            ("content-type", "application/json"),
            ("X-Extra", "a"),
            ("x-extra", "b"),
        ]));
        assert_eq!(
            serde_json::to_string(&h).unwrap(),
            r#"{"webhook-id":"msg_1","content-type":"application/json","X-Extra":"a, b"}"#
        );
        assert_eq!(
            serde_json::to_string(&SentHeaders::default()).unwrap(),
            "{}"
        );
    }

    #[test]
    fn a_body_is_json_text_or_base64_as_it_can_be() {
        let (json, b64) = shown_body(br#"{"b":1.50,"a":[true]}"#);
        assert_eq!((json.get(), b64), (r#"{"b":1.50,"a":[true]}"#, None));
        let (text, b64) = shown_body(b"plain \"text\"");
        assert_eq!((text.get(), b64), (r#""plain \"text\"""#, None));
        let (raw, b64) = shown_body(b"\xff\x00ok");
        assert_eq!((raw.get(), b64.as_deref()), ("null", Some("/wBvaw==")));
    }
}
