//! The index rows that find a delivery's log entries: the entry's place in its endpoint's
//! history, its dead letter when it dead-lettered the delivery, and the endpoint's bucket-index
//! rows for both when this process has not written them yet
//! ([`bucket_index`](super::bucket_index)).
//!
//! A delivery has one history entry, at its creation: the fan-out writes it with the event
//! ([`event_log`](super::event_log)). A delivery whose id does not begin with its event's key
//! was fanned out before version 7 recorded events; each of its attempts and notes writes an
//! entry at its own time, and the history reader keeps the one at the delivery's creation time
//! (its earliest entry) and skips the others, whatever order they were written in.
//!
//! History entries, dead letters and a tenant's event index rows go through
//! [`group_commit`](super::group_commit): rows of one partition (an endpoint's or a tenant's
//! minute) that arrive while a write to it is in flight go together as one single-partition
//! unlogged batch, one mutation on the server, so under load an index row costs a fraction of
//! a write.

use std::sync::Arc;

use async_trait::async_trait;
use scylla::SerializeRow;
use scylla::client::session::Session;
use scylla::serialize::row::SerializeRow;
use scylla::statement::batch::{Batch, BatchStatement, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlTimestamp;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::ScyllaStore;
use super::error::exec_error;
use super::event_log::TenantEventRow;
use super::group_commit::{BatchWrite, GroupCommit, PartitionRow};
use super::row::{BucketKind, bucket_of};
use super::statement::Statements;
use crate::id::{DeliveryId, EndpointId, EventId};
use crate::storage::StoreError;

/// Bytes of write time and TTL the server counts per cell (and per row's liveness) when it
/// sizes a batch.
pub(super) const CELL_OVERHEAD: usize = 16;

/// A `deliveries_by_endpoint_bucket` entry; partition (endpoint, bucket).
#[derive(SerializeRow)]
struct HistoryRow {
    endpoint_id: String,
    bucket: CqlTimestamp,
    at: CqlTimestamp,
    delivery_id: String,
    ttl: i32,
}

impl PartitionRow for HistoryRow {
    type Key = (String, CqlTimestamp);
    fn partition(&self) -> (String, CqlTimestamp) {
        (self.endpoint_id.clone(), self.bucket)
    }
    fn size(&self) -> usize {
        8 + self.delivery_id.len() + CELL_OVERHEAD
    }
}

/// A `dead_letters_by_endpoint_bucket` row; partition (endpoint, bucket).
#[derive(SerializeRow)]
pub(super) struct DeadLetterRow {
    pub(super) endpoint_id: String,
    pub(super) bucket: CqlTimestamp,
    pub(super) dead_at: CqlTimestamp,
    pub(super) delivery_id: String,
    pub(super) event_id: String,
    pub(super) tenant: String,
    pub(super) event_type: String,
    /// The attempt that dead-lettered it; 0 when none was made.
    pub(super) attempt: i32,
    pub(super) reason: &'static str,
    pub(super) last_status: Option<i32>,
    pub(super) ttl: i32,
}

impl PartitionRow for DeadLetterRow {
    type Key = (String, CqlTimestamp);
    fn partition(&self) -> (String, CqlTimestamp) {
        (self.endpoint_id.clone(), self.bucket)
    }
    fn size(&self) -> usize {
        8 + self.delivery_id.len()
            + self.event_id.len()
            + self.tenant.len()
            + self.event_type.len()
            + 4
            + self.reason.len()
            + 4
            + 7 * CELL_OVERHEAD
    }
}

/// Writes rows of one partition of one table: a lone row as a plain write, several as one
/// unlogged batch (one mutation on the server).
struct PartitionWriter {
    session: Arc<Session>,
    statement: PreparedStatement,
}

#[async_trait]
impl<R: PartitionRow + SerializeRow + Sync> BatchWrite<R> for PartitionWriter {
    async fn write(&self, rows: Vec<R>) -> Result<(), StoreError> {
        let result = if let [row] = rows.as_slice() {
            self.session.execute_unpaged(&self.statement, row).await
        } else {
            let statement = BatchStatement::PreparedStatement(self.statement.clone());
            let mut batch =
                Batch::new_with_statements(BatchType::Unlogged, vec![statement; rows.len()]);
            batch.set_is_idempotent(true);
            self.session.batch(&batch, &rows).await
        };
        result.map(|_| ()).map_err(exec_error)
    }
}

/// The group commits of the index tables, one per table.
pub(super) struct IndexCommits {
    history: GroupCommit<HistoryRow>,
    dead_letters: GroupCommit<DeadLetterRow>,
    pub(super) tenant_events: GroupCommit<TenantEventRow>,
}

impl IndexCommits {
    /// Group commits writing with `st` on `session`, each batch under one of `permits`.
    pub(super) fn new(
        session: &Arc<Session>,
        st: &Statements,
        permits: &Arc<Semaphore>,
    ) -> IndexCommits {
        let writer = |statement: &PreparedStatement| PartitionWriter {
            session: session.clone(),
            statement: statement.clone(),
        };
        IndexCommits {
            history: GroupCommit::new(writer(&st.bucket.insert_history), permits.clone()),
            dead_letters: GroupCommit::new(writer(&st.bucket.insert_dead), permits.clone()),
            tenant_events: GroupCommit::new(writer(&st.event.insert_tenant_event), permits.clone()),
        }
    }
}

/// Which index rows a log entry writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Entry {
    /// A history entry at the entry's time: a creation, or an attempt or note of a delivery
    /// fanned out before version 7.
    Listed,
    /// No history entry: the delivery's creation has it.
    Unlisted,
}

impl Entry {
    /// The index rows of an attempt's or note's entry for `delivery` of `event`: none when
    /// the fan-out wrote the delivery's entry as it recorded the event, which it has for every
    /// id that begins with its event's key ([`DeliveryId::event_key`]), as ids derived since
    /// version 7 do.
    pub(super) fn of_log(delivery: &DeliveryId, event: &EventId) -> Entry {
        if delivery.event_key() == Some(event.key()) {
            Entry::Unlisted
        } else {
            Entry::Listed
        }
    }
}

impl ScyllaStore {
    /// Writes the history entry at `at` of a log entry of `delivery` to `endpoint` (when
    /// `entry` is [`Entry::Listed`]), `dead` (its dead letter, when the entry dead-lettered
    /// the delivery), and the bucket-index rows this process has not written yet,
    /// concurrently; `Ok` once all are durable.
    pub(super) async fn index_entry(
        &self,
        endpoint: &EndpointId,
        delivery: &DeliveryId,
        at: CqlTimestamp,
        entry: Entry,
        dead: Option<DeadLetterRow>,
    ) -> Result<(), StoreError> {
        let bucket = bucket_of(at);
        let now = Instant::now();
        let listed = entry == Entry::Listed;
        // The history entry's bucket, and the dead letter's (same bucket, other kind).
        let index_kinds: Vec<(EndpointId, BucketKind)> = [BucketKind::History, BucketKind::Dead]
            .into_iter()
            .filter(|&kind| match kind {
                BucketKind::History => listed,
                BucketKind::Dead => dead.is_some(),
            })
            .map(|kind| (endpoint.clone(), kind))
            .filter(|owner| self.buckets_written.needs_write(owner, bucket, now))
            .collect();
        let history = async {
            if !listed {
                return Ok(());
            }
            self.index
                .history
                .write(HistoryRow {
                    endpoint_id: endpoint.as_str().to_owned(),
                    bucket,
                    at,
                    delivery_id: delivery.as_str().to_owned(),
                    ttl: self.attempt_ttl,
                })
                .await
        };
        let bucket_index = futures::future::try_join_all(index_kinds.iter().map(|(_, kind)| {
            self.write(
                &self.st.bucket.insert_bucket,
                (
                    endpoint.as_str(),
                    kind.as_str(),
                    bucket,
                    self.bucket_index_ttl,
                ),
            )
        }));
        let dead_letter = async {
            match dead {
                Some(row) => self.index.dead_letters.write(row).await,
                None => Ok(()),
            }
        };
        tokio::try_join!(history, bucket_index, dead_letter)?;
        for owner in &index_kinds {
            self.buckets_written.record(owner, bucket, now);
        }
        Ok(())
    }
}
