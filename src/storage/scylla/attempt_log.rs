//! Logging an attempt: its row in the delivery's log and the index rows that find it.
//!
//! One attempt is 1 to 5 rows written concurrently: the attempt row, the dead letter when the
//! attempt dead-lettered, a history entry only for a delivery fanned out before version 7
//! (every other delivery's entry was written with its event), and the endpoint's bucket-index
//! rows for those when this process has not written them yet
//! ([`entry_index`](super::entry_index)). [`ScyllaStore::log_attempt`] returns `Ok` only when
//! all are durable. The attempt row is a plain write; the index rows go through the group
//! commit. Every write is a blind, idempotent insert, so the pipeline can simply retry a
//! failed attempt log. The event's deliveries are listed from its `events` partition, written
//! once per event ([`event_log`](super::event_log)), not from a row per attempt.

use scylla::SerializeRow;
use scylla::value::CqlTimestamp;

use super::ScyllaStore;
use super::entry_index::{DeadLetterRow, Entry};
use super::row::{self, attempt_col, bucket_of, status_col, to_cql};
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
    request_headers: &'a [(String, String)],
    ttl: i32,
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
            request_headers: &row.request_headers,
            ttl,
        }
    }
}

impl ScyllaStore {
    /// Writes `row`, its dead letter (when it dead-lettered), its history entry (a delivery
    /// fanned out before version 7) and the bucket-index rows not written yet, concurrently;
    /// `Ok` once all are durable.
    pub(super) async fn log_attempt(&self, row: &AttemptRow) -> Result<(), StoreError> {
        let started = to_cql(row.started_at);
        let attempt = attempt_col(row.attempt)?;
        let dead = match row.outcome {
            AttemptOutcome::Dead { reason } => Some(DeadLetterRow {
                endpoint_id: row.endpoint_id.as_str().to_owned(),
                bucket: bucket_of(started),
                dead_at: started,
                delivery_id: row.delivery_id.as_str().to_owned(),
                event_id: row.event_id.as_str().to_owned(),
                tenant: row.tenant.as_str().to_owned(),
                event_type: row.event_type.clone(),
                attempt,
                reason: reason.as_str(),
                last_status: status_col(row.status),
                ttl: self.attempt_ttl,
            }),
            _ => None,
        };
        let attempt_row = self.write(
            &self.st.attempt.insert_attempt,
            AttemptValues::new(row, started, attempt, self.attempt_ttl),
        );
        let entry = Entry::of_log(&row.delivery_id, &row.event_id);
        let index = self.index_entry(&row.endpoint_id, &row.delivery_id, started, entry, dead);
        tokio::try_join!(attempt_row, index)?;
        Ok(())
    }
}
