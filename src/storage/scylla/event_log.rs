//! Recording an event the fan-out produced: the event and its endpoints, their deliveries'
//! history entries, and the tenant's event index.
//!
//! Per event: one row of its `events` partition (the event, with the endpoints it went to as
//! one frozen list), where each delivery's creation is read too (under the event key its id
//! begins with); per delivery a history entry through the group commit
//! ([`entry_index`](super::entry_index)), the only one the delivery gets; per event a row in
//! the tenant's events index, group committed too; bucket-index rows once per bucket and
//! process. All written concurrently; [`ScyllaStore::log_event`] returns `Ok` once all are
//! durable. Every write is a blind insert of values the event determines, so recording an event
//! again (a fan-out repeated after a crash) writes the same rows.

use scylla::SerializeRow;
use scylla::value::CqlTimestamp;
use tokio::time::Instant;

use super::ScyllaStore;
use super::entry_index::{CELL_OVERHEAD, Entry};
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

/// An event's own row of its `events` partition, with the endpoints it went to.
#[derive(SerializeRow)]
struct EventValues<'a> {
    event_key: i64,
    event_id: &'a str,
    tenant: &'a str,
    event_type: &'a str,
    occurred_at: CqlTimestamp,
    received_at: CqlTimestamp,
    body: &'a [u8],
    fingerprint: &'a str,
    endpoints: Vec<&'a str>,
    ttl: i32,
}

impl ScyllaStore {
    /// Writes everything [`EventRow`] records; `Ok` once all of it is durable.
    pub(super) async fn log_event(&self, event: &EventRow) -> Result<(), StoreError> {
        let received = to_cql(event.received_at);
        let bucket = bucket_of(received);
        let deliveries = futures::future::try_join_all(event.endpoints.iter().map(|endpoint| {
            let id = DeliveryId::derive(&event.event_id, endpoint);
            async move {
                self.index_entry(endpoint, &id, received, Entry::Listed, None)
                    .await
            }
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

    /// The event's own row, which lists its endpoints: one single-row write.
    async fn write_event_partition(
        &self,
        event: &EventRow,
        received: CqlTimestamp,
    ) -> Result<(), StoreError> {
        let row = EventValues {
            event_key: event.event_id.key(),
            event_id: event.event_id.as_str(),
            tenant: event.tenant.as_str(),
            event_type: &event.event_type,
            occurred_at: to_cql(event.occurred_at),
            received_at: received,
            body: &event.body,
            fingerprint: &event.fingerprint,
            endpoints: event.endpoints.iter().map(|e| e.as_str()).collect(),
            ttl: self.attempt_ttl,
        };
        self.write(&self.st.event.insert_event, row).await
    }
}
