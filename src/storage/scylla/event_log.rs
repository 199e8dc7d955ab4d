//! Recording an event the fan-out produced: the event and its endpoints, their deliveries'
//! history entries, and the tenant's event index.
//!
//! Per event: its `events` partition (the event's own row and one row per endpoint) as one
//! single-partition unlogged batch, one mutation, which is also where each delivery's creation
//! is read (under the event key its id begins with); per delivery a history entry through the
//! group commit ([`entry_index`](super::entry_index)); per event a row in the tenant's events
//! index,
//! group committed too; bucket-index rows once per bucket and process. All written
//! concurrently; [`ScyllaStore::log_event`] returns `Ok` once all are durable. Every write is
//! a blind insert of values the event determines, so recording an event again (a fan-out
//! repeated after a crash) writes the same rows.

use scylla::SerializeRow;
use scylla::statement::batch::{Batch, BatchStatement, BatchType};
use scylla::value::{CqlTimestamp, MaybeUnset};
use tokio::time::Instant;

use super::ScyllaStore;
use super::entry_index::CELL_OVERHEAD;
use super::error::exec_error;
use super::group_commit::PartitionRow;
use super::row::{bucket_of, to_cql};
use crate::id::DeliveryId;
use crate::storage::{EventRow, StoreError};

/// An `events_by_tenant_bucket` row; partition (tenant, bucket).
#[derive(SerializeRow)]
pub(super) struct TenantEventRow {
    tenant: String,
    bucket: CqlTimestamp,
    received_at: CqlTimestamp,
    event_id: String,
    event_type: String,
    ttl: i32,
}

impl PartitionRow for TenantEventRow {
    type Key = (String, CqlTimestamp);
    fn partition(&self) -> (String, CqlTimestamp) {
        (self.tenant.clone(), self.bucket)
    }
    fn size(&self) -> usize {
        8 + self.event_id.len() + self.event_type.len() + 2 * CELL_OVERHEAD
    }
}

/// A row of an event's `events` partition: the event's own row (endpoint '', every column
/// set), or an endpoint's (the event's columns left unset, so they are not written again).
#[derive(SerializeRow)]
struct EventValues<'a> {
    event_key: i64,
    event_id: &'a str,
    tenant: &'a str,
    endpoint_id: &'a str,
    event_type: MaybeUnset<&'a str>,
    occurred_at: MaybeUnset<CqlTimestamp>,
    received_at: MaybeUnset<CqlTimestamp>,
    body: MaybeUnset<&'a [u8]>,
    fingerprint: MaybeUnset<&'a str>,
    ttl: i32,
}

impl ScyllaStore {
    /// Writes everything [`EventRow`] records; `Ok` once all of it is durable.
    pub(super) async fn log_event(&self, event: &EventRow) -> Result<(), StoreError> {
        let received = to_cql(event.received_at);
        let bucket = bucket_of(received);
        let deliveries = futures::future::try_join_all(event.endpoints.iter().map(|endpoint| {
            let id = DeliveryId::derive(&event.event_id, endpoint);
            async move { self.index_entry(endpoint, &id, received, None).await }
        }));
        let tenant_index = self.index.tenant_events.write(TenantEventRow {
            tenant: event.tenant.as_str().to_owned(),
            bucket,
            received_at: received,
            event_id: event.event_id.as_str().to_owned(),
            event_type: event.event_type.clone(),
            ttl: self.attempt_ttl,
        });
        let now = Instant::now();
        let new_bucket = self
            .tenant_buckets_written
            .needs_write(&event.tenant, bucket, now);
        let tenant_bucket = async {
            if !new_bucket {
                return Ok(());
            }
            self.write(
                &self.st.event.insert_tenant_bucket,
                (event.tenant.as_str(), bucket, self.bucket_index_ttl),
            )
            .await
        };
        tokio::try_join!(
            self.write_event_partition(event, received),
            deliveries,
            tenant_index,
            tenant_bucket
        )?;
        if new_bucket {
            self.tenant_buckets_written
                .record(&event.tenant, bucket, now);
        }
        Ok(())
    }

    /// The event's `events` partition, as one batch (a lone write without endpoints).
    async fn write_event_partition(
        &self,
        event: &EventRow,
        received: CqlTimestamp,
    ) -> Result<(), StoreError> {
        let event_key = event.event_id.key();
        let head = EventValues {
            event_key,
            event_id: event.event_id.as_str(),
            tenant: event.tenant.as_str(),
            endpoint_id: "",
            event_type: MaybeUnset::Set(&event.event_type),
            occurred_at: MaybeUnset::Set(to_cql(event.occurred_at)),
            received_at: MaybeUnset::Set(received),
            body: MaybeUnset::Set(&event.body),
            fingerprint: MaybeUnset::Set(&event.fingerprint),
            ttl: self.attempt_ttl,
        };
        let statement = &self.st.event.insert_event;
        if event.endpoints.is_empty() {
            return self.write(statement, head).await;
        }
        let rows: Vec<EventValues<'_>> = std::iter::once(head)
            .chain(event.endpoints.iter().map(|endpoint| EventValues {
                event_key,
                event_id: event.event_id.as_str(),
                tenant: event.tenant.as_str(),
                endpoint_id: endpoint.as_str(),
                event_type: MaybeUnset::Unset,
                occurred_at: MaybeUnset::Unset,
                received_at: MaybeUnset::Unset,
                body: MaybeUnset::Unset,
                fingerprint: MaybeUnset::Unset,
                ttl: self.attempt_ttl,
            }))
            .collect();
        let mut batch = Batch::new_with_statements(
            BatchType::Unlogged,
            vec![BatchStatement::PreparedStatement(statement.clone()); rows.len()],
        );
        batch.set_is_idempotent(true);
        let _permit = self.permit().await?;
        self.session
            .batch(&batch, &rows)
            .await
            .map(|_| ())
            .map_err(exec_error)
    }
}
