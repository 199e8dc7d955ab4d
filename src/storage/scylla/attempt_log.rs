//! Logging an attempt: its row in the delivery's attempt log and the index rows that find it.
//!
//! One attempt is 3 to 6 rows written concurrently: the attempt row, the history entry, the
//! event index row, the dead letter when the attempt dead-lettered, and the endpoint's
//! bucket-index rows for the entry's and the dead letter's bucket when this process has not
//! written them yet ([`bucket_index`](super::bucket_index)). [`ScyllaStore::log_attempt`]
//! returns `Ok` only when all are durable. The attempt row and the bucket index are plain
//! writes. History entries, event-index rows and dead letters go through
//! [`group_commit`](super::group_commit): rows of one partition (an endpoint's minute, an
//! event) that arrive while a write to it is in flight go together as one single-partition
//! unlogged batch, which the server applies as one mutation, so under load an index row costs
//! a fraction of a write. Every write is a blind, idempotent insert, so the pipeline can simply
//! retry a failed attempt log.

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
use super::group_commit::{BatchWrite, GroupCommit, PartitionRow};
use super::row::{self, BucketKind, attempt_col, bucket_of, status_col, to_cql};
use super::statement::Statements;
use crate::attempt::ErrorClass;
use crate::storage::{AttemptOutcome, AttemptRow, StoreError};

/// An `attempts_by_delivery` row.
#[derive(SerializeRow)]
struct AttemptValues<'a> {
    delivery_id: &'a str,
    started_at: CqlTimestamp,
    attempt: i32,
    event_id: &'a str,
    endpoint_id: &'a str,
    tenant: &'a str,
    event_type: &'a str,
    status: Option<i32>,
    latency_ms: i64,
    error_class: Option<&'static str>,
    response_body: &'a [u8],
    signing_key_ids: &'a [String],
    replay_id: Option<&'a str>,
    outcome: &'static str,
    next_attempt_at: Option<CqlTimestamp>,
    dead_reason: Option<&'static str>,
    record_partition: Option<i32>,
    record_offset: Option<i64>,
    ttl: i32,
}

/// Bytes of write time and TTL the server counts per cell (and per row's liveness) when it
/// sizes a batch.
const CELL_OVERHEAD: usize = 16;

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

/// A `deliveries_by_event` row; partition = the event.
#[derive(SerializeRow)]
struct EventIndexRow {
    event_id: String,
    delivery_id: String,
    endpoint_id: String,
    ttl: i32,
}

impl PartitionRow for EventIndexRow {
    type Key = String;
    fn partition(&self) -> String {
        self.event_id.clone()
    }
    fn size(&self) -> usize {
        self.delivery_id.len() + self.endpoint_id.len() + 2 * CELL_OVERHEAD
    }
}

/// A `dead_letters_by_endpoint_bucket` row; partition (endpoint, bucket).
#[derive(SerializeRow)]
struct DeadLetterRow {
    endpoint_id: String,
    bucket: CqlTimestamp,
    dead_at: CqlTimestamp,
    delivery_id: String,
    event_id: String,
    tenant: String,
    event_type: String,
    attempt: i32,
    reason: &'static str,
    last_status: Option<i32>,
    ttl: i32,
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
    by_event: GroupCommit<EventIndexRow>,
    dead_letters: GroupCommit<DeadLetterRow>,
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
            by_event: GroupCommit::new(writer(&st.attempt.insert_by_event), permits.clone()),
            dead_letters: GroupCommit::new(writer(&st.bucket.insert_dead), permits.clone()),
        }
    }
}

impl<'a> AttemptValues<'a> {
    /// The columns of `row`, which started at `started`, as attempt number `attempt`.
    fn new(row: &'a AttemptRow, started: CqlTimestamp, attempt: i32, ttl: i32) -> Self {
        let (outcome, next_attempt_at, dead_reason) = row::outcome_columns(&row.outcome);
        AttemptValues {
            delivery_id: row.delivery_id.as_str(),
            started_at: started,
            attempt,
            event_id: row.event_id.as_str(),
            endpoint_id: row.endpoint_id.as_str(),
            tenant: row.tenant.as_str(),
            event_type: &row.event_type,
            status: status_col(row.status),
            latency_ms: i64::from(row.latency_ms),
            error_class: row.error_class.map(ErrorClass::as_str),
            response_body: &row.response_body,
            signing_key_ids: &row.signing_key_ids,
            replay_id: row.replay_id.as_deref(),
            outcome,
            next_attempt_at,
            dead_reason,
            record_partition: row.record.map(|r| r.partition),
            record_offset: row.record.map(|r| r.offset),
            ttl,
        }
    }
}

impl ScyllaStore {
    /// Writes `row`, its history entry, event index row, dead letter (when it dead-lettered)
    /// and the bucket-index rows not written yet, concurrently; `Ok` once all are durable.
    pub(super) async fn log_attempt(&self, row: &AttemptRow) -> Result<(), StoreError> {
        let started = to_cql(row.started_at);
        let bucket = bucket_of(started);
        let attempt = attempt_col(row.attempt)?;
        let dead = match row.outcome {
            AttemptOutcome::Dead { reason } => Some(reason),
            _ => None,
        };
        let now = Instant::now();
        // The bucket-index rows this process has not written yet: the history entry's, and the
        // dead letter's (same bucket, other kind).
        let index_kinds: Vec<BucketKind> = [BucketKind::History, BucketKind::Dead]
            .into_iter()
            .filter(|&kind| kind == BucketKind::History || dead.is_some())
            .filter(|&kind| {
                self.buckets_written
                    .needs_write(&row.endpoint_id, kind, bucket, now)
            })
            .collect();

        let attempt_row = self.write(
            &self.st.attempt.insert_attempt,
            AttemptValues::new(row, started, attempt, self.attempt_ttl),
        );
        let history = self.index.history.write(HistoryRow {
            endpoint_id: row.endpoint_id.as_str().to_owned(),
            bucket,
            at: started,
            delivery_id: row.delivery_id.as_str().to_owned(),
            ttl: self.attempt_ttl,
        });
        let by_event = self.index.by_event.write(EventIndexRow {
            event_id: row.event_id.as_str().to_owned(),
            delivery_id: row.delivery_id.as_str().to_owned(),
            endpoint_id: row.endpoint_id.as_str().to_owned(),
            ttl: self.attempt_ttl,
        });
        let bucket_index = futures::future::try_join_all(index_kinds.iter().map(|kind| {
            self.write(
                &self.st.bucket.insert_bucket,
                (
                    row.endpoint_id.as_str(),
                    kind.as_str(),
                    bucket,
                    self.bucket_index_ttl,
                ),
            )
        }));
        let dead_letter = async {
            let Some(reason) = dead else {
                return Ok(());
            };
            self.index
                .dead_letters
                .write(DeadLetterRow {
                    endpoint_id: row.endpoint_id.as_str().to_owned(),
                    bucket,
                    dead_at: started,
                    delivery_id: row.delivery_id.as_str().to_owned(),
                    event_id: row.event_id.as_str().to_owned(),
                    tenant: row.tenant.as_str().to_owned(),
                    event_type: row.event_type.clone(),
                    attempt,
                    reason: reason.as_str(),
                    last_status: status_col(row.status),
                    ttl: self.attempt_ttl,
                })
                .await
        };
        tokio::try_join!(attempt_row, history, by_event, bucket_index, dead_letter)?;
        for kind in index_kinds {
            self.buckets_written
                .record(&row.endpoint_id, kind, bucket, now);
        }
        Ok(())
    }
}
