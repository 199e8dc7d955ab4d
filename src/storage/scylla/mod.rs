//! The CQL store: ScyllaDB in production, Apache Cassandra 5 in this project's tests.
//!
//! Tables are in `schemas/cql/` (applied by [`migrate`]). Writes are prepared
//! statements, token-aware (the driver's default policy, optionally pinned to `local_dc`),
//! bounded by a semaphore of `max_concurrent_writes` requests in flight, each under the
//! `write_timeout` of the session's execution profile. A permit is held only while its request
//! is in flight, never while a caller waits for a batch written by another task, so callers
//! cannot hold every permit while the batches they wait for need one.
//!
//! Differences from the embedded store, by design: times are kept at millisecond precision (CQL
//! `timestamp`); logging the exact same attempt twice stores it once; two attempts started in
//! the same millisecond are ordered by attempt number rather than by logging order; an event's
//! deliveries are those its recorded event lists (and, for events fanned out before schema
//! version 7, those its attempts listed then), where the embedded store also lists a delivery
//! it knows only from attempts or notes.
//!
//! When the cluster is unreachable every call fails with [`StoreError::Unavailable`] after at
//! most `write_timeout` per request it waits for (an index row may first wait for the batch of
//! its partition in flight, so `record_attempt` can take up to twice that, plus waits for a
//! permit); the driver keeps reconnecting, so calls succeed again once it is back.
//!
//! Where things live:
//! - [`session`]: opening a driver session (routing, consistency, login, TLS);
//!   [`setup`]: building the store on it (schema check, [`statement`]s prepared once).
//! - [`attempt_log`], [`note`] and [`event_log`]: writing a delivery's log rows (attempts,
//!   notes) and an event's own partition (where its deliveries' creations are read) and its
//!   tenant's index, and
//!   [`entry_index`]: the index rows that find them, through [`group_commit`] and
//!   [`bucket_index`].
//! - [`delivery`]: a delivery's attempts, the state derived from its log, an event's
//!   deliveries.
//! - [`bucket_walk`]: reading an endpoint's or a tenant's minute buckets newest first, for
//!   [`history`], [`dead_letter`] and [`events_page`] pages.
//! - [`replay_audit`] and [`replay_claim`]: the replay records.
//! - [`row`]: pure conversions between Rust values and CQL columns; [`error`]: failures.

mod attempt_log;
mod bucket_index;
mod bucket_walk;
mod config;
mod dead_letter;
mod delivery;
mod entry_index;
mod error;
mod event_log;
mod events_page;
mod group_commit;
mod history;
pub mod migrate;
mod note;
mod replay_audit;
mod replay_claim;
mod row;
mod session;
mod setup;
pub mod startup;
mod statement;
mod tls;

use std::sync::Arc;

use async_trait::async_trait;
use scylla::client::session::Session;
use scylla::serialize::row::SerializeRow;
use scylla::statement::prepared::PreparedStatement;
use tokio::sync::Semaphore;

use bucket_index::WrittenBuckets;
pub use config::{
    ConfigError, CqlPassword, CqlTls, MAX_CQL_TTL, MAX_NODES, MAX_STARTUP_WAIT, Replication,
    ScyllaConfig, valid_keyspace,
};
pub use dead_letter::{DeadLetter, DeadLetterQuery};
use entry_index::IndexCommits;
pub use error::ScyllaError;
use error::{backend_error, exec_error};
use row::BucketKind;
pub use session::{connect_session, connect_session_with, tls_context};
use statement::Statements;

use super::{
    AttemptRow, DeliveryNote, DeliveryState, DeliveryStore, EventMark, EventQuery, EventRow,
    HistoryQuery, Page, ReplayAudit, ReplayMark, StoreError,
};
use crate::id::{DeliveryId, EndpointId, EventId, Tenant};

/// Most history entries one page request reads before it returns what it has.
pub const MAX_SCANNED: usize = 5_000;
/// Most deliveries `event_deliveries` returns (an event fans out to this many endpoints at most).
pub const MAX_EVENT_DELIVERIES: usize = 10_000;
/// Most attempts `attempts` returns for one delivery.
pub const MAX_ATTEMPTS_READ: usize = 10_000;
/// Most replays `replays` returns.
pub const MAX_REPLAYS_READ: u32 = 1_000;

/// [`DeliveryStore`] on a CQL cluster (ScyllaDB, Apache Cassandra 4/5).
pub struct ScyllaStore {
    session: Arc<Session>,
    st: Statements,
    permits: Arc<Semaphore>,
    /// The group commits of the index tables.
    index: IndexCommits,
    attempt_ttl: i32,
    bucket_index_ttl: i32,
    audit_ttl: i32,
    /// The `endpoint_buckets` rows this process wrote recently.
    buckets_written: WrittenBuckets<(EndpointId, BucketKind)>,
    /// The `tenant_event_buckets` rows this process wrote recently.
    tenant_buckets_written: WrittenBuckets<Tenant>,
}

impl std::fmt::Debug for ScyllaStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScyllaStore")
            .field("attempt_ttl", &self.attempt_ttl)
            .field("available_permits", &self.permits.available_permits())
            .finish_non_exhaustive()
    }
}

impl ScyllaStore {
    /// One of the `max_concurrent_writes` request slots, held while one request is in flight.
    async fn permit(&self) -> Result<tokio::sync::SemaphorePermit<'_>, StoreError> {
        self.permits
            .acquire()
            .await
            .map_err(|_| StoreError::Unavailable("store is shutting down".into()))
    }

    /// The first row `statement` reads with `values`, under one permit; `None` without any.
    async fn read_row<R>(
        &self,
        statement: &PreparedStatement,
        values: impl SerializeRow,
    ) -> Result<Option<R>, StoreError>
    where
        R: for<'f, 'm> scylla::deserialize::row::DeserializeRow<'f, 'm>,
    {
        let _permit = self.permit().await?;
        self.session
            .execute_unpaged(statement, values)
            .await
            .map_err(exec_error)?
            .into_rows_result()
            .map_err(backend_error)?
            .maybe_first_row::<R>()
            .map_err(backend_error)
    }

    /// One plain write under one permit.
    async fn write(
        &self,
        statement: &PreparedStatement,
        values: impl SerializeRow,
    ) -> Result<(), StoreError> {
        let _permit = self.permit().await?;
        self.session
            .execute_unpaged(statement, values)
            .await
            .map(|_| ())
            .map_err(exec_error)
    }
}

#[async_trait]
impl DeliveryStore for ScyllaStore {
    async fn record_attempt(&self, row: &AttemptRow) -> Result<(), StoreError> {
        self.log_attempt(row).await
    }

    async fn record_note(&self, note: &DeliveryNote) -> Result<(), StoreError> {
        self.log_note(note).await
    }

    async fn record_event(&self, event: &EventRow) -> Result<(), StoreError> {
        self.log_event(event).await
    }

    async fn event(&self, tenant: &Tenant, id: &EventId) -> Result<Option<EventRow>, StoreError> {
        self.read_event(tenant, id).await
    }

    async fn event_mark(
        &self,
        tenant: &Tenant,
        id: &EventId,
    ) -> Result<Option<EventMark>, StoreError> {
        self.read_event_mark(tenant, id).await
    }

    async fn events(
        &self,
        tenant: &Tenant,
        query: &EventQuery,
    ) -> Result<Page<EventRow>, StoreError> {
        self.read_events(tenant, query).await
    }

    async fn delivery(&self, id: &DeliveryId) -> Result<Option<DeliveryState>, StoreError> {
        self.read_state(id.as_str()).await
    }

    async fn attempts(&self, id: &DeliveryId) -> Result<Vec<AttemptRow>, StoreError> {
        self.read_attempts(id).await
    }

    async fn endpoint_deliveries(
        &self,
        endpoint: &EndpointId,
        query: &HistoryQuery,
    ) -> Result<Page<DeliveryState>, StoreError> {
        self.read_history(endpoint, query).await
    }

    async fn event_deliveries(&self, event: &EventId) -> Result<Vec<DeliveryState>, StoreError> {
        self.read_event_deliveries(event).await
    }

    async fn record_replay(&self, audit: &ReplayAudit) -> Result<(), StoreError> {
        self.log_replay(audit).await
    }

    async fn replays(
        &self,
        tenant: Option<&Tenant>,
        limit: u32,
    ) -> Result<Vec<ReplayAudit>, StoreError> {
        self.read_replays(tenant, limit).await
    }

    async fn record_replay_mark(&self, mark: &ReplayMark) -> Result<(), StoreError> {
        self.write_mark(mark).await
    }

    async fn replay_mark(&self, id: &DeliveryId) -> Result<Option<ReplayMark>, StoreError> {
        self.read_mark(&self.st.claim.select_replay_mark, id).await
    }

    /// A serial read: it sees every claim a lightweight transaction has made, including one
    /// whose commit is still on its way to the replicas.
    async fn replay_claim(&self, id: &DeliveryId) -> Result<Option<ReplayMark>, StoreError> {
        self.read_mark(&self.st.claim.select_replay_claim, id).await
    }

    /// A lightweight transaction: `INSERT ... IF NOT EXISTS` over no claim, `UPDATE ... IF
    /// replay_id = over` over one.
    async fn claim_replay(
        &self,
        claim: &ReplayMark,
        over: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.try_claim(claim, over).await
    }
}
