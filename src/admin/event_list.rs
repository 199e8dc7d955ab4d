//! `GET /v1/events?tenant=&type=&since=&until=&cursor=&limit=`: one tenant's events, newest
//! first (by when hookline received them), each with its payload and how many of its
//! deliveries stand in each state. A receiver that was down pages through what it missed.
//!
//! The store keeps events as long as the attempt log (`store.scylla.attempt_ttl`; the memory
//! store its most recent). Its cursor is stable while new events arrive: they come before the
//! first page, never between pages, so paging on shows no event twice and skips none.
//!
//! A tenant token lists its own events (`tenant=` may name it; another tenant is 404, as if
//! absent). An operator token must name the tenant: events are kept per tenant.
//!
//! Counting a page's deliveries takes one store read per event, at most
//! [`COUNT_READS_AT_ONCE`] at a time, so a page of 500 costs 500 bounded reads.

use axum::Json;
use axum::extract::State;
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::event_type::EventType;
use crate::id::Tenant;
use crate::storage::{DeliveryStatus, DeliveryStore, EventQuery, EventRow, StoreError};

use super::AdminState;
use super::auth::Caller;
use super::body::ApiQuery;
use super::deliveries::{cursor_param, time_param};
use super::endpoints::{limit, short, time};
use super::error::ApiError;

/// Default page size of `GET /v1/events`.
pub const DEFAULT_EVENTS_LIMIT: usize = 50;
/// Largest page size of `GET /v1/events` (the store's own ceiling).
pub const MAX_EVENTS_LIMIT: usize = crate::storage::MAX_PAGE as usize;
/// Store reads in flight at once while a page's deliveries are counted.
pub const COUNT_READS_AT_ONCE: usize = 16;

/// `GET /v1/events` query.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventListParams {
    /// Whose events; required with an operator token, the token's own tenant otherwise.
    pub tenant: Option<String>,
    /// Only events of this exact type.
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    /// RFC 3339: only events received at or after it.
    pub since: Option<String>,
    /// RFC 3339: only events received before it.
    pub until: Option<String>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// Page size, 1 to 500, default 50.
    pub limit: Option<String>,
}

impl EventListParams {
    /// The tenant whose events `caller` asks for; errors name `tenant`.
    pub fn tenant_for(&self, caller: &Caller) -> Result<Tenant, ApiError> {
        let tenant = match (&self.tenant, caller.tenant()) {
            (Some(t), _) => {
                Tenant::parse(t.as_str()).map_err(|e| ApiError::invalid("tenant", e.to_string()))?
            }
            (None, Some(own)) => own.clone(),
            (None, None) => {
                return Err(ApiError::invalid(
                    "tenant",
                    "is required with an operator token: events are listed per tenant",
                ));
            }
        };
        if !caller.sees(&tenant) {
            return Err(ApiError::NotFound(format!(
                "tenant {} not found",
                short(tenant.as_str())
            )));
        }
        Ok(tenant)
    }

    /// The store query these parameters ask for; errors name the parameter.
    pub fn to_query(&self) -> Result<EventQuery, ApiError> {
        let event_type = self
            .event_type
            .as_deref()
            .map(|t| {
                EventType::parse(t)
                    .map(|t| t.as_str().to_owned())
                    .map_err(|e| ApiError::invalid("type", e.to_string()))
            })
            .transpose()?;
        let since = time_param("since", self.since.as_deref())?;
        let until = time_param("until", self.until.as_deref())?;
        if let (Some(s), Some(u)) = (since, until)
            && u <= s
        {
            return Err(ApiError::invalid("until", "must be later than since"));
        }
        let cursor = cursor_param(self.cursor.as_deref())?;
        let limit = limit(
            self.limit.as_deref(),
            DEFAULT_EVENTS_LIMIT,
            MAX_EVENTS_LIMIT,
        )?;
        Ok(EventQuery {
            event_type,
            since,
            until,
            cursor,
            limit: limit as u32,
        })
    }
}

/// How many of an event's deliveries stand in each state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryCounts {
    /// Not attempted yet.
    pub pending: u32,
    /// Waiting in a delay tier (a retry, or parked).
    pub scheduled: u32,
    /// Delivered.
    pub succeeded: u32,
    /// Dead-lettered.
    pub dead: u32,
}

impl DeliveryCounts {
    /// Counts one delivery in `status`.
    pub fn add(&mut self, status: DeliveryStatus) {
        let n = match status {
            DeliveryStatus::Pending => &mut self.pending,
            DeliveryStatus::Scheduled => &mut self.scheduled,
            DeliveryStatus::Succeeded => &mut self.succeeded,
            DeliveryStatus::Dead => &mut self.dead,
        };
        *n += 1;
    }
}

/// One event as the list shows it.
#[derive(Debug, Clone, Serialize)]
pub struct EventBody {
    /// The event id (`webhook-id`).
    pub id: String,
    /// The event type.
    #[serde(rename = "type")]
    pub event_type: String,
    /// The event's own time.
    pub occurred_at: String,
    /// When hookline received it (the order of the list).
    pub received_at: String,
    /// The payload (the sent body's `data`), as JSON, its bytes kept.
    pub payload: Box<RawValue>,
    /// Its deliveries by state.
    pub deliveries: DeliveryCounts,
}

/// A page of events.
#[derive(Debug, Clone, Serialize)]
pub struct EventList {
    /// The events, newest first.
    pub data: Vec<EventBody>,
    /// Pass as `cursor` for the next page; `null` at the end.
    pub next_cursor: Option<String>,
}

/// The `data` of a body serialised at fan-out (`{"id","type","timestamp","data"}`); `null` if
/// the body has none.
pub fn payload(body: &[u8]) -> Box<RawValue> {
    #[derive(Deserialize)]
    struct Sent<'a> {
        #[serde(borrow)]
        data: Option<&'a RawValue>,
    }
    serde_json::from_slice::<Sent<'_>>(body)
        .ok()
        .and_then(|s| s.data.map(RawValue::to_owned))
        .unwrap_or_else(|| RawValue::from_string("null".to_owned()).expect("null is JSON"))
}

/// The states of `event`'s deliveries to `tenant`'s endpoints.
async fn counts(
    store: &dyn DeliveryStore,
    tenant: &Tenant,
    event: &EventRow,
) -> Result<DeliveryCounts, StoreError> {
    let mut counts = DeliveryCounts::default();
    for d in store.event_deliveries(&event.event_id).await? {
        if &d.tenant == tenant {
            counts.add(d.status);
        }
    }
    Ok(counts)
}

/// `GET /v1/events`.
pub async fn list(
    State(state): State<AdminState>,
    caller: Caller,
    q: Result<ApiQuery<EventListParams>, ApiError>,
) -> Result<Json<EventList>, ApiError> {
    let ApiQuery(params) = q?;
    let tenant = params.tenant_for(&caller)?;
    let query = params.to_query()?;
    let store = state.deliveries.as_ref();
    let page = store.events(&tenant, &query).await?;
    // Made before the stream: a closure mapping borrowed rows inside it makes the handler's
    // future fail the router's higher-ranked lifetime bound.
    let reads: Vec<_> = page
        .items
        .iter()
        .map(|e| counts(store, &tenant, e))
        .collect();
    let counts: Vec<DeliveryCounts> = futures::stream::iter(reads)
        .buffered(COUNT_READS_AT_ONCE)
        .try_collect()
        .await?;
    let data = page
        .items
        .iter()
        .zip(counts)
        .map(|(e, deliveries)| EventBody {
            id: e.event_id.to_string(),
            event_type: e.event_type.clone(),
            occurred_at: time(e.occurred_at),
            received_at: time(e.received_at),
            payload: payload(&e.body),
            deliveries,
        })
        .collect();
    Ok(Json(EventList {
        data,
        next_cursor: page.next_cursor,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_payload_is_the_bodys_data_byte_for_byte() {
        let body = br#"{"id":"msg_1","type":"a.b","timestamp":"2026-01-01T00:00:00Z","data":{"z":1.50,"a":null}}"#;
        assert_eq!(payload(body).get(), r#"{"z":1.50,"a":null}"#);
        assert_eq!(payload(br#"{"id":"msg_1"}"#).get(), "null");
        assert_eq!(payload(b"\xff").get(), "null");
    }

    #[test]
    fn counts_add_up_by_state() {
        let mut c = DeliveryCounts::default();
        for s in DeliveryStatus::ALL {
            c.add(s);
        }
        c.add(DeliveryStatus::Dead);
        assert_eq!(
            c,
            DeliveryCounts {
                pending: 1,
                scheduled: 1,
                succeeded: 1,
                dead: 2
            }
        );
    }
}
