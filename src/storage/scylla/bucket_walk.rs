//! Reading an endpoint's or a tenant's bucketed rows newest first, a page at a time.
//!
//! An endpoint's history and dead letters are partitioned by (endpoint, minute), a tenant's
//! events by (tenant, minute) ([`row::BUCKET_MS`](super::row::BUCKET_MS)), so a busy
//! partition holds a minute of rows rather than a day's. `endpoint_buckets` and
//! `tenant_event_buckets` list the non-empty buckets; a [`BucketWalk`] reads them newest
//! first, several at once (a sparse owner's page spans many buckets with a few rows each), and
//! stops as soon as the caller has its page.

use std::collections::VecDeque;
use std::ops::ControlFlow;

use futures::StreamExt;
use scylla::client::pager::{QueryPager, TypedRowStream};
use scylla::response::PagingState;
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlTimestamp;

use super::ScyllaStore;
use super::error::{backend_error, exec_error, pager_error, row_error};
use super::row::{BucketKey, BucketKind, bucket_of};
use crate::id::{EndpointId, Tenant};
use crate::storage::StoreError;

/// Most buckets one round of a [`BucketWalk`] reads at once.
const MAX_BUCKETS_IN_FLIGHT: usize = 8;
/// Rows per page of an endpoint's bucket listing: a round takes at most
/// [`MAX_BUCKETS_IN_FLIGHT`] of them, so a larger page would mostly be read for nothing.
pub(super) const BUCKET_LIST_PAGE: i32 = 64;

/// A place in an owner's bucketed rows: a row's bucket, time and id (delivery or event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Position {
    pub(super) bucket: CqlTimestamp,
    pub(super) at: CqlTimestamp,
    pub(super) id: String,
}

impl From<BucketKey> for Position {
    fn from(key: BucketKey) -> Position {
        Position {
            bucket: key.bucket,
            at: key.at,
            id: key.delivery_id.as_str().to_owned(),
        }
    }
}

impl ScyllaStore {
    /// A walk over `endpoint`'s rows of one bucketed table, newest first: from before `cursor`
    /// (when given) back to the bucket of `since` (when given), `page_rows` rows per request.
    pub(super) async fn walk<'s, R>(
        &'s self,
        endpoint: &'s EndpointId,
        kind: BucketKind,
        page_rows: usize,
        cursor: Option<BucketKey>,
        since: Option<CqlTimestamp>,
    ) -> Result<BucketWalk<'s, R>, StoreError> {
        let cursor = cursor.map(Position::from);
        let (newest, oldest) = bucket_range(cursor.as_ref(), since);
        let buckets = {
            let _permit = self.permit().await?;
            self.session
                .execute_iter(
                    self.st.bucket.select_buckets.clone(),
                    (endpoint.as_str(), kind.as_str(), oldest, newest),
                )
                .await
                .map_err(pager_error)?
        };
        let (all, before) = match kind {
            BucketKind::History => (
                &self.st.bucket.select_history,
                &self.st.bucket.select_history_before,
            ),
            BucketKind::Dead => (
                &self.st.bucket.select_dead,
                &self.st.bucket.select_dead_before,
            ),
        };
        self.walk_listed(buckets, endpoint.as_str(), (all, before), page_rows, cursor)
    }

    /// A walk over `tenant`'s events index, newest first: from before `from` (when given)
    /// back to the bucket of `since` (when given), `page_rows` rows per request.
    pub(super) async fn walk_tenant_events<'s, R>(
        &'s self,
        tenant: &'s Tenant,
        page_rows: usize,
        from: Option<Position>,
        since: Option<CqlTimestamp>,
    ) -> Result<BucketWalk<'s, R>, StoreError> {
        let (newest, oldest) = bucket_range(from.as_ref(), since);
        let buckets = {
            let _permit = self.permit().await?;
            self.session
                .execute_iter(
                    self.st.event.select_tenant_buckets.clone(),
                    (tenant.as_str(), oldest, newest),
                )
                .await
                .map_err(pager_error)?
        };
        let queries = (
            &self.st.event.select_tenant_events,
            &self.st.event.select_tenant_events_before,
        );
        self.walk_listed(buckets, tenant.as_str(), queries, page_rows, from)
    }

    /// A walk over the buckets `buckets` lists, read with `queries` (a whole bucket, a
    /// bucket's rows before a position) for `owner`.
    fn walk_listed<'s, R>(
        &'s self,
        buckets: QueryPager,
        owner: &'s str,
        queries: (&PreparedStatement, &PreparedStatement),
        page_rows: usize,
        cursor: Option<Position>,
    ) -> Result<BucketWalk<'s, R>, StoreError> {
        let buckets = buckets
            .rows_stream::<(CqlTimestamp,)>()
            .map_err(backend_error)?;
        let page_rows = i32::try_from(page_rows.max(1)).unwrap_or(i32::MAX);
        let (mut all, mut before) = (queries.0.clone(), queries.1.clone());
        all.set_page_size(page_rows);
        before.set_page_size(page_rows);
        Ok(BucketWalk {
            reader: BucketReader {
                store: self,
                owner,
                all,
                before,
                cursor,
            },
            buckets,
            listed_all: false,
            ready: VecDeque::new(),
            rest: None,
            buckets_read: 0,
            rows_read: 0,
        })
    }
}

/// The newest and oldest bucket a walk from before `from` back to `since` reads.
fn bucket_range(
    from: Option<&Position>,
    since: Option<CqlTimestamp>,
) -> (CqlTimestamp, CqlTimestamp) {
    let newest = from.map_or(CqlTimestamp(i64::MAX), |c| c.bucket);
    let oldest = since.map_or(CqlTimestamp(i64::MIN), bucket_of);
    (newest, oldest)
}

/// One request's worth of one bucket's rows, newest first.
struct BucketPage<R> {
    bucket: CqlTimestamp,
    rows: Vec<R>,
    /// Where the bucket goes on, when this page did not reach its end.
    more: Option<PagingState>,
}

/// Where a bucket handed out in part goes on.
struct BucketRest {
    bucket: CqlTimestamp,
    from: PagingState,
}

/// Reads pages of an owner's buckets of one table, each request under one permit.
struct BucketReader<'s> {
    store: &'s ScyllaStore,
    /// The endpoint or tenant.
    owner: &'s str,
    /// The table's query for a whole bucket.
    all: PreparedStatement,
    /// The table's query for a bucket's rows before a position.
    before: PreparedStatement,
    /// Only rows before this position (older, or as old with a smaller id) are read.
    cursor: Option<Position>,
}

impl BucketReader<'_> {
    /// One page of `bucket`'s rows from `from`, newest first.
    async fn page<R>(
        &self,
        bucket: CqlTimestamp,
        from: PagingState,
    ) -> Result<BucketPage<R>, StoreError>
    where
        R: for<'f, 'm> scylla::deserialize::row::DeserializeRow<'f, 'm>,
    {
        let session = &self.store.session;
        let _permit = self.store.permit().await?;
        let (result, paging) = match &self.cursor {
            Some(c) if c.bucket == bucket => {
                let values = (self.owner, bucket, c.at, c.id.as_str());
                session
                    .execute_single_page(&self.before, values, from)
                    .await
            }
            _ => {
                session
                    .execute_single_page(&self.all, (self.owner, bucket), from)
                    .await
            }
        }
        .map_err(exec_error)?;
        let rows = result
            .into_rows_result()
            .map_err(backend_error)?
            .rows::<R>()
            .map_err(backend_error)?
            .collect::<Result<Vec<R>, _>>()
            .map_err(backend_error)?;
        let more = match paging.into_paging_control_flow() {
            ControlFlow::Continue(state) => Some(state),
            ControlFlow::Break(()) => None,
        };
        Ok(BucketPage { bucket, rows, more })
    }
}

/// Walks an owner's non-empty buckets of one table (as `endpoint_buckets` or
/// `tenant_event_buckets` lists them) newest first, and hands out their rows a page at a time, in order: newest bucket first,
/// each bucket's rows newest first.
///
/// Buckets are read in rounds of several at once: a sparse endpoint's page spans many buckets
/// with a few rows each, and reading them one after the other would cost a round trip per
/// bucket. A round reads as many buckets as the rows per bucket seen so far suggest the caller
/// still wants ([`round_width`]), so a busy endpoint, whose first bucket alone usually fills
/// the page, costs no reads it does not use.
/// A bucket whose first page did not reach its end is continued page by page before the next
/// bucket is handed out. Nothing is left in flight between calls, so a caller doing other reads
/// between pages never waits for a permit held by a read nobody polls.
pub(super) struct BucketWalk<'s, R> {
    reader: BucketReader<'s>,
    /// The listing of non-empty buckets, newest first.
    buckets: TypedRowStream<(CqlTimestamp,)>,
    listed_all: bool,
    /// Pages read but not handed out yet, in order.
    ready: VecDeque<BucketPage<R>>,
    /// The bucket handed out last, when it has more pages: they come before `ready`.
    rest: Option<BucketRest>,
    buckets_read: usize,
    rows_read: usize,
}

impl<R> BucketWalk<'_, R>
where
    R: for<'f, 'm> scylla::deserialize::row::DeserializeRow<'f, 'm>,
{
    /// The next page's rows, `None` at the end. `wanted` is how many more rows the caller
    /// expects to need; it only sizes the next round of reads.
    pub(super) async fn next_page(&mut self, wanted: usize) -> Result<Option<Vec<R>>, StoreError> {
        let page = if let Some(BucketRest { bucket, from }) = self.rest.take() {
            Some(self.reader.page(bucket, from).await?)
        } else {
            if self.ready.is_empty() {
                self.read_round(wanted).await?;
            }
            self.ready.pop_front()
        };
        Ok(page.map(|page| {
            if let Some(from) = page.more {
                self.rest = Some(BucketRest {
                    bucket: page.bucket,
                    from,
                });
            }
            page.rows
        }))
    }

    /// Reads the next round of buckets' first pages into `ready`.
    async fn read_round(&mut self, wanted: usize) -> Result<(), StoreError> {
        let width = round_width(wanted, self.buckets_read, self.rows_read);
        let mut buckets = Vec::with_capacity(width);
        while buckets.len() < width && !self.listed_all {
            match self.buckets.next().await {
                Some(row) => buckets.push(row.map_err(row_error)?.0),
                None => self.listed_all = true,
            }
        }
        let reader = &self.reader;
        let pages = futures::future::try_join_all(
            buckets
                .into_iter()
                .map(|bucket| reader.page::<R>(bucket, PagingState::start())),
        )
        .await?;
        self.buckets_read += pages.len();
        self.rows_read += pages.iter().map(|p| p.rows.len()).sum::<usize>();
        self.ready.extend(pages);
        Ok(())
    }
}

/// How many buckets a [`BucketWalk`] round reads: enough for `wanted` rows at the rows per
/// bucket read so far, one in the first round (nothing is known yet, and a busy endpoint's
/// newest bucket alone usually fills a page), at most [`MAX_BUCKETS_IN_FLIGHT`].
fn round_width(wanted: usize, buckets_read: usize, rows_read: usize) -> usize {
    match rows_read.checked_div(buckets_read) {
        None => 1,
        Some(per_bucket) => wanted
            .div_ceil(per_bucket.max(1))
            .clamp(1, MAX_BUCKETS_IN_FLIGHT),
    }
}

/// Cuts a listing that found one item more than `limit` back to `limit` and returns the cursor
/// of its last item (the extra item proves there is a next page); `None` for a last page.
pub(super) fn trim_to_page<T>(found: &mut Vec<(BucketKey, T)>, limit: usize) -> Option<String> {
    if found.len() <= limit {
        return None;
    }
    found.truncate(limit);
    found.last().map(|(key, _)| key.encode())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_read_as_many_buckets_as_the_rows_wanted_need() {
        // Nothing read yet: one bucket.
        assert_eq!(round_width(50, 0, 0), 1);
        // A sparse endpoint, about one row per bucket: as many as wanted, within the bound.
        assert_eq!(round_width(3, 1, 1), 3);
        assert_eq!(round_width(50, 1, 1), MAX_BUCKETS_IN_FLIGHT);
        // Buckets listed but emptied by TTL count as one row each, not as a division by zero.
        assert_eq!(round_width(5, 4, 0), 5);
        // A busy endpoint: one bucket at a time.
        assert_eq!(round_width(11, 1, 22), 1);
        assert_eq!(round_width(0, 1, 22), 1);
        assert_eq!(round_width(30, 3, 30), 3);
    }
}
