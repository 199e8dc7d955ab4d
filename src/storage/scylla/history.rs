//! An endpoint's delivery history, a page at a time.
//!
//! A delivery's history entry is written with its event at fan-out; a delivery fanned out
//! before version 7 has one per attempt instead. The page lists deliveries, so each entry is
//! checked against its delivery's state (one point read per distinct delivery on the page) and
//! kept only if it is at the delivery's creation (its first attempt, for the older ones);
//! `status` is filtered the same way, client-side. A page reads at most [`MAX_SCANNED`]
//! entries: a rare status over a long history may come back short, with a cursor to continue
//! from.

use std::collections::HashMap;

use futures::{StreamExt, TryStreamExt};
use scylla::value::CqlTimestamp;

use super::bucket_walk::trim_to_page;
use super::delivery::READ_FAN_OUT;
use super::error::corrupt;
use super::row::{BucketKey, BucketKind, to_cql};
use super::{MAX_SCANNED, ScyllaStore};
use crate::id::{DeliveryId, EndpointId};
use crate::storage::{DeliveryState, DeliveryStatus, HistoryQuery, MAX_PAGE, Page, StoreError};

/// History entries resolved against delivery state per round of point reads.
const RESOLVE_CHUNK: usize = 64;
/// Fewest history entries resolved together once they could complete a page: resolving the
/// last few entries of a page one by one would be a round trip each.
const RESOLVE_MIN: usize = 8;

impl ScyllaStore {
    /// A page of `endpoint`'s deliveries, newest first, as `query` asks.
    pub(super) async fn read_history(
        &self,
        endpoint: &EndpointId,
        query: &HistoryQuery,
    ) -> Result<Page<DeliveryState>, StoreError> {
        let limit = query.limit.clamp(1, MAX_PAGE) as usize;
        let cursor = query.cursor.as_deref().map(BucketKey::decode).transpose()?;
        let since = query.since.map(to_cql);
        // Entries of retries and of other statuses are read and skipped: read more than a page
        // per request.
        let page_rows = (2 * (limit + 1)).min(MAX_SCANNED);
        let mut walk = self
            .walk::<(CqlTimestamp, String)>(endpoint, BucketKind::History, page_rows, cursor, since)
            .await?;

        let mut scan = HistoryScan {
            endpoint,
            status: query.status,
            batch: Vec::with_capacity(RESOLVE_CHUNK),
            states: HashMap::new(),
            found: Vec::new(),
        };
        let mut last_scanned: Option<BucketKey> = None;
        let mut scanned = 0usize;
        let mut truncated = false;
        'walk: loop {
            let wanted = (limit + 1).saturating_sub(scan.found.len() + scan.batch.len());
            let Some(entries) = walk.next_page(wanted).await? else {
                break;
            };
            for (at, id) in entries {
                // Only the oldest bucket, that of `since`, holds older entries; all of them
                // come after the ones to list.
                if since.is_some_and(|s| at < s) {
                    break 'walk;
                }
                let delivery_id =
                    DeliveryId::parse(id.as_str()).map_err(|_| corrupt("history", &id))?;
                let key = BucketKey::new(at, delivery_id);
                last_scanned = Some(key.clone());
                scan.batch.push(key);
                scanned += 1;
                // Resolve as soon as the batch could complete the page: then no further bucket
                // need be read.
                let needed = (limit + 1)
                    .saturating_sub(scan.found.len())
                    .clamp(RESOLVE_MIN, RESOLVE_CHUNK);
                if scan.batch.len() >= needed || scanned == MAX_SCANNED {
                    scan.resolve(self).await?;
                    if scan.found.len() > limit {
                        break 'walk;
                    }
                    if scanned == MAX_SCANNED {
                        truncated = true;
                        break 'walk;
                    }
                }
            }
        }
        scan.resolve(self).await?;
        let mut found = scan.found;
        // One more matching entry than the page holds proves there is a next page.
        let next_cursor = if found.len() > limit {
            trim_to_page(&mut found, limit)
        } else if truncated {
            last_scanned.map(|k| k.encode())
        } else {
            None
        };
        Ok(Page {
            items: found.into_iter().map(|(_, s)| s).collect(),
            next_cursor,
        })
    }
}

/// What a history page's scan holds between rounds of point reads.
struct HistoryScan<'q> {
    endpoint: &'q EndpointId,
    /// The status filter.
    status: Option<DeliveryStatus>,
    /// Entries read but not resolved yet.
    batch: Vec<BucketKey>,
    /// The states read so far (`None`: no attempt row left), each read once per page.
    states: HashMap<DeliveryId, Option<DeliveryState>>,
    /// The entries kept, in order.
    found: Vec<(BucketKey, DeliveryState)>,
}

impl HistoryScan<'_> {
    /// Resolves the batch of history entries against delivery state, appending the entries
    /// that are at their delivery's creation (and match the status filter) to `found`.
    async fn resolve(&mut self, store: &ScyllaStore) -> Result<(), StoreError> {
        let HistoryScan {
            endpoint,
            status,
            batch,
            states,
            found,
        } = self;
        let mut missing: Vec<DeliveryId> = batch
            .iter()
            .filter(|k| !states.contains_key(&k.delivery_id))
            .map(|k| k.delivery_id.clone())
            .collect();
        missing.sort();
        missing.dedup();
        let fetched: Vec<(DeliveryId, Option<DeliveryState>)> = futures::stream::iter(missing)
            .map(|id| async move {
                let state = store.read_state(id.as_str()).await?;
                Ok::<_, StoreError>((id, state))
            })
            .buffer_unordered(READ_FAN_OUT)
            .try_collect()
            .await?;
        states.extend(fetched);
        for key in batch.drain(..) {
            let Some(Some(state)) = states.get(&key.delivery_id) else {
                continue;
            };
            let first = &state.endpoint_id == *endpoint && to_cql(state.created_at) == key.at;
            if first && status.is_none_or(|s| s == state.status) {
                found.push((key, state.clone()));
            }
        }
        Ok(())
    }
}
