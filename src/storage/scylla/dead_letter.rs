//! Listing an endpoint's dead letters, newest first, a page at a time.

use std::time::SystemTime;

use scylla::DeserializeRow;
use scylla::value::CqlTimestamp;

use super::ScyllaStore;
use super::bucket_walk::trim_to_page;
use super::error::corrupt;
use super::row::{BucketKey, BucketKind, from_cql, status_from_col, to_cql};
use crate::dead_reason::DeadReason;
use crate::id::{DeliveryId, EndpointId, EventId, Tenant};
use crate::storage::{MAX_PAGE, Page, StoreError};

/// Which dead letters [`ScyllaStore::dead_letters`] lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadLetterQuery {
    /// Page size, clamped to 1..=[`MAX_PAGE`].
    pub limit: u32,
    /// The `next_cursor` of the previous page: the page goes on after it.
    pub cursor: Option<String>,
    /// Only dead letters from this time on.
    pub since: Option<SystemTime>,
}

/// One dead letter, as listed by [`ScyllaStore::dead_letters`].
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetter {
    /// When the delivery was dead-lettered (its last attempt's start, or the time of the note
    /// that dead-lettered it unsent).
    pub dead_at: SystemTime,
    /// The delivery.
    pub delivery_id: DeliveryId,
    /// The event.
    pub event_id: EventId,
    /// The endpoint's tenant.
    pub tenant: Tenant,
    /// The event's type.
    pub event_type: String,
    /// The attempt that dead-lettered it; 0 when it was dead-lettered without one.
    pub attempt: u32,
    /// Why.
    pub reason: DeadReason,
    /// Its HTTP status, if a response arrived.
    pub last_status: Option<u16>,
}

/// A `dead_letters_by_endpoint_bucket` row as read.
#[derive(DeserializeRow)]
struct DeadCols {
    dead_at: CqlTimestamp,
    delivery_id: String,
    event_id: Option<String>,
    tenant: Option<String>,
    event_type: Option<String>,
    attempt: Option<i32>,
    reason: Option<String>,
    last_status: Option<i32>,
}

impl ScyllaStore {
    /// An endpoint's dead letters, newest first, a page of at most `query.limit` (1..=[`MAX_PAGE`]);
    /// pass a page's `next_cursor` back for the page after it.
    pub async fn dead_letters(
        &self,
        endpoint: &EndpointId,
        query: &DeadLetterQuery,
    ) -> Result<Page<DeadLetter>, StoreError> {
        let limit = query.limit.clamp(1, MAX_PAGE) as usize;
        let cursor = query.cursor.as_deref().map(BucketKey::decode).transpose()?;
        let since = query.since.map(to_cql);
        let mut walk = self
            .walk::<DeadCols>(endpoint, BucketKind::Dead, limit + 1, cursor, since)
            .await?;
        let mut found: Vec<(BucketKey, DeadLetter)> = Vec::new();
        'walk: while found.len() <= limit {
            let Some(rows) = walk.next_page(limit + 1 - found.len()).await? else {
                break;
            };
            for r in rows {
                if since.is_some_and(|s| r.dead_at < s) {
                    break 'walk;
                }
                let letter = dead_letter_from_cols(r)?;
                let key = BucketKey::new(to_cql(letter.dead_at), letter.delivery_id.clone());
                found.push((key, letter));
                if found.len() > limit {
                    break 'walk;
                }
            }
        }
        let next_cursor = trim_to_page(&mut found, limit);
        Ok(Page {
            items: found.into_iter().map(|(_, d)| d).collect(),
            next_cursor,
        })
    }
}

/// A dead letter as the store's type; a row missing a column it needs is corrupt.
fn dead_letter_from_cols(r: DeadCols) -> Result<DeadLetter, StoreError> {
    let bad = || corrupt("dead letter", &r.delivery_id);
    Ok(DeadLetter {
        dead_at: from_cql(r.dead_at),
        delivery_id: DeliveryId::parse(r.delivery_id.as_str()).map_err(|_| bad())?,
        event_id: EventId::parse(r.event_id.clone().ok_or_else(bad)?).map_err(|_| bad())?,
        tenant: Tenant::parse(r.tenant.clone().ok_or_else(bad)?).map_err(|_| bad())?,
        event_type: r.event_type.clone().unwrap_or_default(),
        attempt: r.attempt.and_then(|a| u32::try_from(a).ok()).unwrap_or(0),
        reason: r
            .reason
            .as_deref()
            .and_then(DeadReason::parse)
            .ok_or_else(bad)?,
        last_status: status_from_col(r.last_status),
    })
}
