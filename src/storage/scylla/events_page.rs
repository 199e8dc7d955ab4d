//! Reading events: one by its tenant and id (its `events` partition's rows of that tenant),
//! and a tenant's events newest first, a page at a time, from the tenant's events index.
//!
//! A page walks the tenant's minute buckets newest first ([`bucket_walk`](super::bucket_walk)),
//! filters the index rows by type client-side, and reads the events it keeps. The cursor is
//! the last event's (bucket, received_at, event_id): events received later are before it and
//! never shift a page. `until` starts the walk as a cursor would, at (until, ''), before every
//! event received at `until`. A page reads at most [`MAX_SCANNED`] index rows: a rare type over
//! a long span may come back short, with a cursor to continue from.

use futures::{StreamExt, TryStreamExt};
use scylla::DeserializeRow;
use scylla::value::CqlTimestamp;

use super::bucket_walk::Position;
use super::delivery::READ_FAN_OUT;
use super::error::{backend_error, corrupt, pager_error, row_error};
use super::row::{EventKey, bucket_of, from_cql, to_cql};
use super::{MAX_EVENT_DELIVERIES, MAX_SCANNED, ScyllaStore};
use crate::id::{EndpointId, EventId, Tenant};
use crate::storage::{EventMark, EventQuery, EventRow, MAX_PAGE, Page, StoreError};

/// A row of one tenant's part of an event's `events` partition.
#[derive(DeserializeRow)]
struct EventCols {
    endpoint_id: String,
    event_type: Option<String>,
    occurred_at: Option<CqlTimestamp>,
    received_at: Option<CqlTimestamp>,
    body: Option<Vec<u8>>,
    fingerprint: Option<String>,
    /// The endpoints the event went to, on its own row (since version 8).
    endpoints: Option<Vec<String>>,
}

impl ScyllaStore {
    /// `tenant`'s event `id`: its own row, with the endpoints it lists and those of the
    /// endpoint rows version 7 wrote; `None` without its own row.
    pub(super) async fn read_event(
        &self,
        tenant: &Tenant,
        id: &EventId,
    ) -> Result<Option<EventRow>, StoreError> {
        let _permit = self.permit().await?;
        let mut rows = self
            .session
            .execute_iter(
                self.st.event.select_event.clone(),
                (id.key(), id.as_str(), tenant.as_str()),
            )
            .await
            .map_err(pager_error)?
            .rows_stream::<EventCols>()
            .map_err(backend_error)?;
        let bad = || corrupt("event", id.as_str());
        let mut head = None;
        let mut endpoints = Vec::new();
        while let Some(cols) = rows.next().await {
            let cols = cols.map_err(row_error)?;
            if !cols.endpoint_id.is_empty() {
                // Version 7's row of an endpoint; an event recorded again by version 8 lists
                // it in its own row too.
                let endpoint = EndpointId::parse(cols.endpoint_id).map_err(|_| bad())?;
                if !endpoints.contains(&endpoint) {
                    endpoints.push(endpoint);
                }
                if endpoints.len() >= MAX_EVENT_DELIVERIES {
                    break;
                }
                continue;
            }
            for endpoint in cols.endpoints.into_iter().flatten() {
                endpoints.push(EndpointId::parse(endpoint).map_err(|_| bad())?);
            }
            endpoints.truncate(MAX_EVENT_DELIVERIES);
            head = Some(EventRow {
                tenant: tenant.clone(),
                event_id: id.clone(),
                event_type: cols.event_type.ok_or_else(bad)?,
                occurred_at: from_cql(cols.occurred_at.ok_or_else(bad)?),
                received_at: from_cql(cols.received_at.ok_or_else(bad)?),
                // CQL stores an empty blob as it is, but a null as null: either is no body.
                body: cols.body.unwrap_or_default().into(),
                fingerprint: cols.fingerprint.unwrap_or_default(),
                endpoints: vec![],
            });
        }
        Ok(head.map(|event| EventRow { endpoints, ..event }))
    }

    /// `tenant`'s event `id`'s fingerprint and time of receipt, one row's two cells.
    pub(super) async fn read_event_mark(
        &self,
        tenant: &Tenant,
        id: &EventId,
    ) -> Result<Option<EventMark>, StoreError> {
        let row: Option<(Option<String>, Option<CqlTimestamp>)> = self
            .read_row(
                &self.st.event.select_event_mark,
                (id.key(), id.as_str(), tenant.as_str()),
            )
            .await?;
        let Some((fingerprint, received_at)) = row else {
            return Ok(None);
        };
        let received_at = received_at.ok_or_else(|| corrupt("event", id.as_str()))?;
        Ok(Some(EventMark {
            fingerprint: fingerprint.unwrap_or_default(),
            received_at: from_cql(received_at),
        }))
    }

    /// A page of `tenant`'s events, newest first, as `query` asks.
    pub(super) async fn read_events(
        &self,
        tenant: &Tenant,
        query: &EventQuery,
    ) -> Result<Page<EventRow>, StoreError> {
        let limit = query.limit.clamp(1, MAX_PAGE) as usize;
        let cursor = query.cursor.as_deref().map(EventKey::decode).transpose()?;
        let since = query.since.map(to_cql);
        let from = start(cursor, query.until.map(to_cql));
        // Rows of other types are read and skipped: read more than a page per request.
        let page_rows = if query.event_type.is_some() {
            (4 * (limit + 1)).min(MAX_SCANNED)
        } else {
            limit + 1
        };
        let mut walk = self
            .walk_tenant_events::<(CqlTimestamp, String, Option<String>)>(
                tenant, page_rows, from, since,
            )
            .await?;
        let mut found: Vec<EventKey> = Vec::new();
        let mut last_scanned = None;
        let mut scanned = 0usize;
        let mut truncated = false;
        'walk: while found.len() <= limit {
            let Some(rows) = walk.next_page(limit + 1 - found.len()).await? else {
                break;
            };
            for (at, id, event_type) in rows {
                if since.is_some_and(|s| at < s) {
                    break 'walk;
                }
                let key = EventKey::new(
                    at,
                    EventId::parse(id.as_str()).map_err(|_| corrupt("events index", &id))?,
                );
                scanned += 1;
                last_scanned = Some(key.clone());
                let wanted = query
                    .event_type
                    .as_deref()
                    .is_none_or(|t| event_type.as_deref() == Some(t));
                if wanted {
                    found.push(key);
                    if found.len() > limit {
                        break 'walk;
                    }
                }
                if scanned == MAX_SCANNED {
                    truncated = true;
                    break 'walk;
                }
            }
        }
        // One more match than the page holds proves there is a next page.
        let next_cursor = if found.len() > limit {
            found.truncate(limit);
            found.last().map(EventKey::encode)
        } else if truncated {
            last_scanned.map(|k| k.encode())
        } else {
            None
        };
        let events: Vec<Option<EventRow>> = futures::stream::iter(found)
            .map(|key| async move { self.read_event(tenant, &key.event_id).await })
            .buffered(READ_FAN_OUT)
            .try_collect()
            .await?;
        Ok(Page {
            // An event whose row expired before its index row is left out.
            items: events.into_iter().flatten().collect(),
            next_cursor,
        })
    }
}

/// Where a page starts: before the cursor's event, and before anything received at `until`,
/// whichever comes first (newest first).
fn start(cursor: Option<EventKey>, until: Option<CqlTimestamp>) -> Option<Position> {
    let cursor = cursor.map(|c| Position {
        bucket: c.bucket,
        at: c.at,
        id: c.event_id.as_str().to_owned(),
    });
    // No event id is empty, so (until, '') is before every event received at `until`.
    let until = until.map(|at| Position {
        bucket: bucket_of(at),
        at,
        id: String::new(),
    });
    match (cursor, until) {
        (Some(c), Some(u)) => Some(if u.at <= c.at { u } else { c }),
        (c, u) => c.or(u),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_starts_before_the_earlier_of_cursor_and_until() {
        let key = |at| EventKey::new(CqlTimestamp(at), EventId::parse("evt_b").unwrap());
        let pos = |at, id: &str| Position {
            bucket: bucket_of(CqlTimestamp(at)),
            at: CqlTimestamp(at),
            id: id.into(),
        };
        assert_eq!(start(None, None), None);
        assert_eq!(start(Some(key(120_000)), None), Some(pos(120_000, "evt_b")));
        assert_eq!(start(None, Some(CqlTimestamp(5))), Some(pos(5, "")));
        assert_eq!(
            start(Some(key(120_000)), Some(CqlTimestamp(180_000))),
            Some(pos(120_000, "evt_b")),
            "the cursor is earlier"
        );
        assert_eq!(
            start(Some(key(120_000)), Some(CqlTimestamp(60_000))),
            Some(pos(60_000, "")),
            "until is earlier"
        );
        assert_eq!(
            start(Some(key(120_000)), Some(CqlTimestamp(120_000))),
            Some(pos(120_000, "")),
            "at the same time, until excludes the cursor's event too"
        );
    }
}
