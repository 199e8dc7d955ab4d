//! The CQL store: ScyllaDB in production, Apache Cassandra 5 in this project's tests.
//!
//! Tables are in `schemas/cql/` (applied by [`migrate`]). Writes are prepared
//! statements, token-aware (the driver's default policy, optionally pinned to `local_dc`),
//! bounded by a semaphore of `max_concurrent_writes` requests in flight, each under the
//! `write_timeout` of the session's execution profile. A permit is held only while its request
//! is in flight, never while a caller waits for a batch written by another task, so callers
//! cannot hold every permit while the batches they wait for need one.
//!
//! One attempt = 3 to 6 rows written concurrently (attempt row, history entry, event index, the
//! dead letter when the attempt dead-lettered, and the endpoint's bucket-index rows for the
//! entry's and the dead letter's bucket when this process has not written them yet,
//! [`bucket_index`]);
//! `record_attempt` returns `Ok` only when all are durable. The attempt row and the bucket index
//! are plain writes. History entries, event-index rows and dead letters go through
//! [`group_commit`]: rows of one partition (an endpoint's minute, an event) that arrive while a
//! write to it is in flight go together as one single-partition unlogged batch, which the server
//! applies as one mutation, so under load an index row costs a fraction of a write.
//! Every write is a blind, idempotent insert, so the pipeline can simply retry a failed
//! `record_attempt`.
//!
//! A delivery's state is not written at all: it is derived, on read, from the delivery's
//! attempt rows (one partition, oldest first). Their count is the attempt count, the first row
//! the first attempt, and the last row, the latest-started attempt, sets the status. So a
//! duplicate of an attempt (same start and number) is stored once and an older attempt logged
//! late cannot overwrite a newer status, whatever order attempts are logged in; and the state
//! follows what the attempt log still holds as rows expire. The `delivery_state` table of
//! schema version 1 is no longer written or read.
//!
//! Differences from the embedded store, by design: times are kept at millisecond precision (CQL
//! `timestamp`); logging the exact same attempt twice stores it once; two attempts started in
//! the same millisecond are ordered by attempt number rather than by logging order.
//!
//! An endpoint's history and dead letters are partitioned by (endpoint, minute)
//! ([`row::BUCKET_MS`], schema version 2), so one endpoint at 1,000 deliveries/s makes
//! partitions of 60,000 rows instead of one of 86 million a day. The day-partitioned tables of
//! schema version 1 are no longer written or read; their rows expire with their TTL. Readers
//! walk the non-empty buckets that `endpoint_buckets` lists, newest first, reading several
//! buckets at once (a sparse endpoint's page spans many buckets with a few rows each) and
//! stopping as soon as the page is full ([`BucketWalk`]).
//!
//! Each history entry is checked against the delivery's state (one point read per distinct
//! delivery on the page) and kept only if it is the delivery's first attempt; `status` is
//! filtered the same way, client-side. A page reads at most [`MAX_SCANNED`] entries: a rare
//! status over a long history may come back short, with a cursor to continue from.
//!
//! When the cluster is unreachable every call fails with [`StoreError::Unavailable`] after at
//! most `write_timeout` per request it waits for (an index row may first wait for the batch of
//! its partition in flight, so `record_attempt` can take up to twice that, plus waits for a
//! permit); the driver keeps reconnecting, so calls succeed again once it is back.
//! At start-up [`ScyllaStore::open`] waits up to `startup_wait` for a cluster that does not
//! answer yet ([`startup`]) and refuses at once a keyspace that `hookline migrate` has not
//! brought to this binary's schema.

mod bucket_index;
mod config;
mod group_commit;
pub mod migrate;
mod row;
pub mod startup;
mod tls;

use std::collections::{HashMap, VecDeque};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt};
use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::pager::TypedRowStream;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::errors::{
    DbError, ExecutionError, NextRowError, PagerExecutionError, RequestAttemptError,
};
use scylla::frame::types::{Consistency, SerialConsistency};
use scylla::policies::load_balancing::DefaultPolicy;
use scylla::response::PagingState;
use scylla::serialize::row::SerializeRow;
use scylla::statement::batch::{Batch, BatchStatement, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlTimestamp;
use scylla::{DeserializeRow, SerializeRow};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use bucket_index::WrittenBuckets;
use group_commit::{BatchWrite, GroupCommit, PartitionRow};

pub use config::{
    ConfigError, CqlPassword, CqlTls, MAX_CQL_TTL, MAX_NODES, MAX_STARTUP_WAIT, Replication,
    ScyllaConfig, valid_keyspace,
};
use row::{BucketKey, BucketKind, bucket_of, from_cql, to_cql};

use super::{
    AttemptOutcome, AttemptRow, DeliveryState, DeliveryStatus, DeliveryStore, HistoryQuery,
    MAX_PAGE, Page, RecordPosition, ReplayAudit, ReplayMark, StoreError,
};
use crate::attempt::ErrorClass;
use crate::dead_reason::DeadReason;
use crate::id::{DeliveryId, EndpointId, EventId, Tenant};

/// Most history entries one page request reads before it returns what it has.
pub const MAX_SCANNED: usize = 5_000;
/// Most deliveries `event_deliveries` returns (an event fans out to this many endpoints at most).
pub const MAX_EVENT_DELIVERIES: usize = 10_000;
/// Most attempts `attempts` returns for one delivery.
pub const MAX_ATTEMPTS_READ: usize = 10_000;
/// Most replays `replays` returns.
pub const MAX_REPLAYS_READ: u32 = 1_000;
/// History entries resolved against delivery state per round of point reads.
const RESOLVE_CHUNK: usize = 64;
/// Point reads in flight for one history page or event listing.
const READ_FAN_OUT: usize = 16;
/// Most buckets one round of a [`BucketWalk`] reads at once.
const MAX_BUCKETS_IN_FLIGHT: usize = 8;
/// Rows per page of an endpoint's bucket listing: a round takes at most
/// [`MAX_BUCKETS_IN_FLIGHT`] of them, so a larger page would mostly be read for nothing.
const BUCKET_LIST_PAGE: i32 = 64;
/// Fewest history entries resolved together once they could complete a page: resolving the
/// last few entries of a page one by one would be a round trip each.
const RESOLVE_MIN: usize = 8;
/// The partition of `recent_replays`.
const REPLAY_FEED: &str = "all";

/// The partition of `recent_replays` that holds the replays naming `tenant` (schema version 6),
/// besides [`REPLAY_FEED`]; the prefix keeps every tenant's apart from that one.
fn tenant_feed(tenant: &Tenant) -> String {
    format!("tenant:{tenant}")
}

/// Why the CQL store could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ScyllaError {
    /// The `[store.scylla]` settings are unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// No node of the cluster could be reached.
    #[error("cannot connect to CQL nodes {nodes:?}: {detail}")]
    Connect {
        /// The configured contact points.
        nodes: Vec<String>,
        /// The driver's reason.
        detail: String,
    },
    /// The cluster refused hookline's login (or asked for one and none is configured).
    #[error(
        "the CQL nodes {nodes:?} refused hookline's login: {detail}. Check \
         store.scylla.username and store.scylla.password (HOOKLINE_STORE__SCYLLA__PASSWORD)"
    )]
    LoginRefused {
        /// The configured contact points.
        nodes: Vec<String>,
        /// What the cluster or the driver said.
        detail: String,
    },
    /// The keyspace is missing tables this binary needs.
    #[error(
        "keyspace {keyspace:?} is at schema version {found}, this hookline needs {needed}: \
         run `hookline migrate`"
    )]
    SchemaBehind {
        /// The keyspace.
        keyspace: String,
        /// The newest version applied (0: none).
        found: u32,
        /// The newest version this binary knows.
        needed: u32,
    },
    /// A statement could not be prepared or a query failed during set-up.
    #[error("CQL set-up failed: {0}")]
    Cql(String),
    /// [`ScyllaStore::open`] spent its whole `startup_wait` without reaching the cluster.
    #[error(
        "gave up on CQL nodes {nodes:?} (keyspace {keyspace:?}) after {tries} tries in {}s: \
         {last}. Check that the nodes are up and reachable from here; if the keyspace or its \
         tables are missing, run `hookline migrate`",
        waited.as_secs()
    )]
    Unreachable {
        /// The configured contact points.
        nodes: Vec<String>,
        /// The keyspace.
        keyspace: String,
        /// How many connection attempts were made.
        tries: u32,
        /// How long they took, pauses included.
        waited: Duration,
        /// The last attempt's error.
        last: Box<ScyllaError>,
    },
}

impl ScyllaError {
    /// Whether retrying cannot help: the settings are unusable or the schema is behind (only
    /// `hookline migrate` fixes that).
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            ScyllaError::Config(_)
                | ScyllaError::SchemaBehind { .. }
                | ScyllaError::LoginRefused { .. }
        )
    }
}

/// Opens a session on the configured cluster: token-aware routing (within `local_dc` when set),
/// LOCAL_QUORUM, and `write_timeout` on every request.
pub async fn connect_session(config: &ScyllaConfig) -> Result<Session, ScyllaError> {
    connect_session_with(config, tls_context(config)?).await
}

/// The TLS settings `config` asks for (`None`: plain TCP), with its files read. Every connection
/// a session opens (at start-up, and whenever the driver reconnects) uses them, and they read
/// their files again when they change (a rotated CA or client certificate); a task checks the
/// files every minute too, so a rotation that cannot be used is reported at once. Call it
/// within the tokio runtime.
pub fn tls_context(
    config: &ScyllaConfig,
) -> Result<Option<Arc<rustls::ClientConfig>>, ScyllaError> {
    config.validate()?;
    Ok(match &config.tls {
        Some(tls) => {
            let (tls, watch) = tls::client_config(tls)?;
            // Ends once every session using these settings is gone.
            if watch.watches_files() {
                tokio::spawn(watch.run(tls::WATCH_EVERY));
            }
            Some(Arc::new(tls))
        }
        None => None,
    })
}

/// [`connect_session`] with TLS settings from [`tls_context`], which sessions may share.
pub async fn connect_session_with(
    config: &ScyllaConfig,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> Result<Session, ScyllaError> {
    config.validate()?;
    let mut policy = DefaultPolicy::builder().token_aware(true);
    if let Some(dc) = &config.local_dc {
        policy = policy.prefer_datacenter(dc.clone());
    }
    let profile = ExecutionProfile::builder()
        .load_balancing_policy(policy.build())
        .consistency(Consistency::LocalQuorum)
        .request_timeout(Some(config.write_timeout))
        .build();
    let mut builder = SessionBuilder::new()
        .known_nodes(&config.nodes)
        .default_execution_profile_handle(profile.into_handle());
    if let (Some(user), Some(password)) = (&config.username, &config.password) {
        builder = builder.user(user.as_str(), password.expose());
    }
    if let Some(tls) = tls {
        builder = builder.tls_context(Some(tls));
    }
    builder.build().await.map_err(|e| {
        let nodes = config.nodes.clone();
        let detail = e.to_string();
        if login_refused(&e) {
            ScyllaError::LoginRefused { nodes, detail }
        } else {
            ScyllaError::Connect { nodes, detail }
        }
    })
}

/// Whether the session failed because the cluster refused the login, or wanted one and got
/// none: no retry helps, only the settings. The driver reports it as the control connection's
/// last setup error (not through `source()`).
fn login_refused(e: &scylla::errors::NewSessionError) -> bool {
    use scylla::errors::{
        ConnectionError, ConnectionPoolError, ConnectionSetupRequestErrorKind as Kind,
        MetadataError, NewSessionError,
    };
    let NewSessionError::MetadataError(MetadataError::ConnectionPoolError(
        ConnectionPoolError::Broken {
            last_connection_error: ConnectionError::ConnectionSetupRequestError(setup),
        },
    )) = e
    else {
        return false;
    };
    matches!(
        setup.error,
        Kind::DbError(DbError::AuthenticationError, _) | Kind::MissingAuthentication
    )
}

/// The prepared statements, all on fully qualified tables so the session's keyspace is
/// irrelevant.
struct Statements {
    insert_attempt: PreparedStatement,
    insert_history: PreparedStatement,
    insert_bucket: PreparedStatement,
    insert_by_event: PreparedStatement,
    insert_dead: PreparedStatement,
    insert_replay: PreparedStatement,
    insert_recent_replay: PreparedStatement,
    select_attempts: PreparedStatement,
    select_state: PreparedStatement,
    select_buckets: PreparedStatement,
    select_history: PreparedStatement,
    select_history_before: PreparedStatement,
    select_by_event: PreparedStatement,
    select_recent_replays: PreparedStatement,
    insert_replay_mark: PreparedStatement,
    select_replay_mark: PreparedStatement,
    select_replay_claim: PreparedStatement,
    insert_replay_claim: PreparedStatement,
    update_replay_claim: PreparedStatement,
    select_dead: PreparedStatement,
    select_dead_before: PreparedStatement,
}

impl Statements {
    async fn prepare(session: &Session, ks: &str) -> Result<Statements, ScyllaError> {
        let p = |cql: String| async move {
            let mut st = session
                .prepare(cql.as_str())
                .await
                .map_err(|e| ScyllaError::Cql(format!("preparing {cql:?}: {e}")))?;
            // Every statement here may run twice with the same effect, which lets the driver
            // retry it after a timeout.
            st.set_is_idempotent(true);
            Ok::<_, ScyllaError>(st)
        };
        // The replay claims' lightweight transactions, and the read that sees them all: never
        // retried by the driver (a conditional write sent twice may report its own first
        // write as a rival's), serial within the local datacenter.
        let lwt = |cql: String, read: bool| async move {
            let mut st = p(cql).await?;
            st.set_is_idempotent(false);
            st.set_serial_consistency(Some(SerialConsistency::LocalSerial));
            if read {
                st.set_consistency(Consistency::LocalSerial);
            }
            Ok::<_, ScyllaError>(st)
        };
        Ok(Statements {
            insert_attempt: p(format!(
                "INSERT INTO {ks}.attempts_by_delivery (delivery_id, started_at, attempt, \
                 event_id, endpoint_id, tenant, event_type, status, latency_ms, error_class, \
                 response_body, signing_key_ids, replay_id, outcome, next_attempt_at, \
                 dead_reason, record_partition, record_offset) VALUES (:delivery_id, \
                 :started_at, :attempt, :event_id, :endpoint_id, :tenant, :event_type, :status, \
                 :latency_ms, :error_class, :response_body, :signing_key_ids, :replay_id, \
                 :outcome, :next_attempt_at, :dead_reason, :record_partition, :record_offset) \
                 USING TTL :ttl"
            ))
            .await?,
            insert_history: p(format!(
                "INSERT INTO {ks}.deliveries_by_endpoint_bucket (endpoint_id, bucket, at, \
                 delivery_id) VALUES (:endpoint_id, :bucket, :at, :delivery_id) USING TTL :ttl"
            ))
            .await?,
            insert_bucket: p(format!(
                "INSERT INTO {ks}.endpoint_buckets (endpoint_id, kind, bucket) VALUES (?, ?, ?) \
                 USING TTL ?"
            ))
            .await?,
            insert_by_event: p(format!(
                "INSERT INTO {ks}.deliveries_by_event (event_id, delivery_id, endpoint_id) \
                 VALUES (:event_id, :delivery_id, :endpoint_id) USING TTL :ttl"
            ))
            .await?,
            insert_dead: p(format!(
                "INSERT INTO {ks}.dead_letters_by_endpoint_bucket (endpoint_id, bucket, dead_at, \
                 delivery_id, event_id, tenant, event_type, attempt, reason, last_status) \
                 VALUES (:endpoint_id, :bucket, :dead_at, :delivery_id, :event_id, :tenant, \
                 :event_type, :attempt, :reason, :last_status) USING TTL :ttl"
            ))
            .await?,
            insert_replay: p(format!(
                "INSERT INTO {ks}.replay_audit (replay_id, actor, reason, at, scope, count, \
                 dry_run, tenant) VALUES (:replay_id, :actor, :reason, :at, :scope, :count, \
                 :dry_run, :tenant) USING TTL :ttl"
            ))
            .await?,
            insert_recent_replay: p(format!(
                "INSERT INTO {ks}.recent_replays (feed, at, replay_id, actor, reason, scope, \
                 count, dry_run, tenant) VALUES (:feed, :at, :replay_id, :actor, :reason, \
                 :scope, :count, :dry_run, :tenant) USING TTL :ttl"
            ))
            .await?,
            insert_replay_mark: p(format!(
                "INSERT INTO {ks}.replay_marks (delivery_id, replay_id, at) \
                 VALUES (:delivery_id, :replay_id, :at) USING TTL :ttl"
            ))
            .await?,
            select_replay_mark: p(format!(
                "SELECT replay_id, at FROM {ks}.replay_marks WHERE delivery_id = ?"
            ))
            .await?,
            select_replay_claim: lwt(
                format!("SELECT replay_id, at FROM {ks}.replay_claims WHERE delivery_id = ?"),
                true,
            )
            .await?,
            insert_replay_claim: lwt(
                format!(
                    "INSERT INTO {ks}.replay_claims (delivery_id, replay_id, at) \
                     VALUES (:delivery_id, :replay_id, :at) IF NOT EXISTS USING TTL :ttl"
                ),
                false,
            )
            .await?,
            update_replay_claim: lwt(
                format!(
                    "UPDATE {ks}.replay_claims USING TTL :ttl SET replay_id = :replay_id, \
                     at = :at WHERE delivery_id = :delivery_id IF replay_id = :over"
                ),
                false,
            )
            .await?,
            select_attempts: p(format!(
                "SELECT delivery_id, started_at, attempt, event_id, endpoint_id, tenant, \
                 event_type, status, latency_ms, error_class, response_body, signing_key_ids, \
                 replay_id, outcome, next_attempt_at, dead_reason, record_partition, \
                 record_offset FROM {ks}.attempts_by_delivery WHERE delivery_id = ?"
            ))
            .await?,
            select_state: p(format!(
                "SELECT delivery_id, started_at, attempt, event_id, endpoint_id, tenant, \
                 event_type, status, error_class, outcome, next_attempt_at, dead_reason \
                 FROM {ks}.attempts_by_delivery WHERE delivery_id = ?"
            ))
            .await?,
            select_buckets: {
                let mut st = p(format!(
                    "SELECT bucket FROM {ks}.endpoint_buckets WHERE endpoint_id = ? AND kind = ? \
                     AND bucket >= ? AND bucket <= ?"
                ))
                .await?;
                st.set_page_size(BUCKET_LIST_PAGE);
                st
            },
            select_history: p(format!(
                "SELECT at, delivery_id FROM {ks}.deliveries_by_endpoint_bucket \
                 WHERE endpoint_id = ? AND bucket = ?"
            ))
            .await?,
            select_history_before: p(format!(
                "SELECT at, delivery_id FROM {ks}.deliveries_by_endpoint_bucket \
                 WHERE endpoint_id = ? AND bucket = ? AND (at, delivery_id) < (?, ?)"
            ))
            .await?,
            select_by_event: p(format!(
                "SELECT delivery_id FROM {ks}.deliveries_by_event WHERE event_id = ?"
            ))
            .await?,
            select_recent_replays: p(format!(
                "SELECT replay_id, actor, reason, at, scope, count, dry_run, tenant \
                 FROM {ks}.recent_replays WHERE feed = ? LIMIT ?"
            ))
            .await?,
            select_dead: p(format!(
                "SELECT dead_at, delivery_id, event_id, tenant, event_type, attempt, reason, \
                 last_status FROM {ks}.dead_letters_by_endpoint_bucket \
                 WHERE endpoint_id = ? AND bucket = ?"
            ))
            .await?,
            select_dead_before: p(format!(
                "SELECT dead_at, delivery_id, event_id, tenant, event_type, attempt, reason, \
                 last_status FROM {ks}.dead_letters_by_endpoint_bucket \
                 WHERE endpoint_id = ? AND bucket = ? AND (dead_at, delivery_id) < (?, ?)"
            ))
            .await?,
        })
    }
}

/// [`DeliveryStore`] on a CQL cluster (ScyllaDB, Apache Cassandra 4/5).
pub struct ScyllaStore {
    session: Arc<Session>,
    st: Statements,
    permits: Arc<Semaphore>,
    history: GroupCommit<HistoryRow>,
    by_event: GroupCommit<EventIndexRow>,
    dead_letters: GroupCommit<DeadLetterRow>,
    attempt_ttl: i32,
    bucket_index_ttl: i32,
    audit_ttl: i32,
    /// The `endpoint_buckets` rows this process wrote recently.
    buckets_written: WrittenBuckets,
}

impl std::fmt::Debug for ScyllaStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScyllaStore")
            .field("attempt_ttl", &self.attempt_ttl)
            .field("available_permits", &self.permits.available_permits())
            .finish_non_exhaustive()
    }
}

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
    /// When the delivery was dead-lettered (its last attempt's start).
    pub dead_at: SystemTime,
    /// The delivery.
    pub delivery_id: DeliveryId,
    /// The event.
    pub event_id: EventId,
    /// The endpoint's tenant.
    pub tenant: Tenant,
    /// The event's type.
    pub event_type: String,
    /// The attempt that dead-lettered it.
    pub attempt: u32,
    /// Why.
    pub reason: DeadReason,
    /// Its HTTP status, if a response arrived.
    pub last_status: Option<u16>,
}

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

#[derive(SerializeRow)]
struct ReplayValues<'a> {
    replay_id: &'a str,
    actor: &'a str,
    reason: &'a str,
    at: CqlTimestamp,
    scope: &'a str,
    count: i64,
    dry_run: bool,
    tenant: Option<&'a str>,
    ttl: i32,
}

#[derive(SerializeRow)]
struct ReplayMarkValues<'a> {
    delivery_id: &'a str,
    replay_id: &'a str,
    at: CqlTimestamp,
    ttl: i32,
}

#[derive(SerializeRow)]
struct ReplayClaimValues<'a> {
    delivery_id: &'a str,
    replay_id: &'a str,
    at: CqlTimestamp,
    ttl: i32,
}

#[derive(SerializeRow)]
struct ReplayClaimOverValues<'a> {
    delivery_id: &'a str,
    replay_id: &'a str,
    at: CqlTimestamp,
    ttl: i32,
    over: &'a str,
}

/// A replay's row in one partition of `recent_replays`: its `replay_audit` row's values.
#[derive(SerializeRow)]
struct RecentReplayValues<'a> {
    feed: &'a str,
    #[scylla(flatten)]
    audit: &'a ReplayValues<'a>,
}

#[derive(DeserializeRow)]
struct AttemptCols {
    delivery_id: String,
    started_at: CqlTimestamp,
    attempt: i32,
    event_id: Option<String>,
    endpoint_id: Option<String>,
    tenant: Option<String>,
    event_type: Option<String>,
    status: Option<i32>,
    latency_ms: Option<i64>,
    error_class: Option<String>,
    response_body: Option<Vec<u8>>,
    signing_key_ids: Option<Vec<String>>,
    replay_id: Option<String>,
    outcome: Option<String>,
    next_attempt_at: Option<CqlTimestamp>,
    dead_reason: Option<String>,
    record_partition: Option<i32>,
    record_offset: Option<i64>,
}

/// The columns of an attempt row that delivery state is derived from (no body).
#[derive(DeserializeRow)]
struct StateCols {
    delivery_id: String,
    started_at: CqlTimestamp,
    attempt: i32,
    event_id: Option<String>,
    endpoint_id: Option<String>,
    tenant: Option<String>,
    event_type: Option<String>,
    status: Option<i32>,
    error_class: Option<String>,
    outcome: Option<String>,
    next_attempt_at: Option<CqlTimestamp>,
    dead_reason: Option<String>,
}

#[derive(DeserializeRow)]
struct ReplayCols {
    replay_id: String,
    actor: Option<String>,
    reason: Option<String>,
    at: CqlTimestamp,
    scope: Option<String>,
    count: Option<i64>,
    dry_run: Option<bool>,
    tenant: Option<String>,
}

#[derive(DeserializeRow)]
struct ReplayMarkCols {
    replay_id: String,
    at: CqlTimestamp,
}

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

fn corrupt(what: &str, id: &str) -> StoreError {
    StoreError::Backend(format!("unreadable {what} row for {id}"))
}

fn status_col(status: Option<u16>) -> Option<i32> {
    status.map(i32::from)
}

fn status_from_col(status: Option<i32>) -> Option<u16> {
    status.and_then(|s| u16::try_from(s).ok())
}

fn attempt_col(attempt: u32) -> Result<i32, StoreError> {
    i32::try_from(attempt)
        .map_err(|_| StoreError::Backend(format!("attempt number {attempt} exceeds CQL int")))
}

/// Errors that mean "the cluster did not answer in time or at all" become
/// [`StoreError::Unavailable`]; the rest [`StoreError::Backend`]. The pipeline retries both, the
/// distinction is for operators.
fn exec_error(e: ExecutionError) -> StoreError {
    let transient = match &e {
        ExecutionError::EmptyPlan
        | ExecutionError::ConnectionPoolError(_)
        | ExecutionError::RequestTimeout(_) => true,
        ExecutionError::LastAttemptError(a) => transient_attempt(a),
        _ => false,
    };
    if transient {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::Backend(e.to_string())
    }
}

fn transient_attempt(e: &RequestAttemptError) -> bool {
    match e {
        RequestAttemptError::BrokenConnectionError(_)
        | RequestAttemptError::UnableToAllocStreamId => true,
        RequestAttemptError::DbError(db, _) => matches!(
            db,
            DbError::Unavailable { .. }
                | DbError::Overloaded
                | DbError::IsBootstrapping
                | DbError::ReadTimeout { .. }
                | DbError::WriteTimeout { .. }
                | DbError::ReadFailure { .. }
                | DbError::WriteFailure { .. }
                | DbError::ServerError
                | DbError::RateLimitReached { .. }
        ),
        _ => false,
    }
}

fn pager_error(e: PagerExecutionError) -> StoreError {
    match e {
        PagerExecutionError::NextPageError(_) => StoreError::Unavailable(e.to_string()),
        _ => StoreError::Backend(e.to_string()),
    }
}

/// A result the driver could not read as the expected rows and types: [`StoreError::Backend`].
/// Whether a lightweight transaction writing `replay_id` took effect: its `[applied]` column,
/// or, when not applied, whether the row already names `replay_id` (this very claim, made by
/// an earlier try of the same request). Cassandra answers `[applied]` alone when applied and
/// adds the columns its condition read when not; ScyllaDB always adds every column. Read by
/// name for both.
fn lwt_applied(
    result: scylla::response::query_result::QueryResult,
    replay_id: &str,
) -> Result<bool, StoreError> {
    use scylla::value::{CqlValue, Row};
    let rows = result.into_rows_result().map_err(backend_error)?;
    let column = |name: &str| rows.column_specs().iter().position(|c| c.name() == name);
    let (Some(applied), replay_col) = (column("[applied]"), column("replay_id")) else {
        return Err(backend_error(
            "a lightweight transaction's answer has no [applied] column",
        ));
    };
    let Some(row) = rows.maybe_first_row::<Row>().map_err(backend_error)? else {
        return Err(backend_error("a lightweight transaction answered no row"));
    };
    let value = |i: usize| row.columns.get(i).cloned().flatten();
    match value(applied) {
        Some(CqlValue::Boolean(true)) => Ok(true),
        Some(CqlValue::Boolean(false)) => {
            Ok(replay_col.and_then(value) == Some(CqlValue::Text(replay_id.to_owned())))
        }
        other => Err(backend_error(format!(
            "a lightweight transaction's [applied] column holds {other:?}"
        ))),
    }
}

fn backend_error(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

fn row_error(e: NextRowError) -> StoreError {
    match e {
        NextRowError::NextPageError(_) => StoreError::Unavailable(e.to_string()),
        _ => StoreError::Backend(e.to_string()),
    }
}

impl ScyllaStore {
    /// Connects to the configured cluster, checks that the keyspace is migrated and prepares
    /// every statement.
    pub async fn connect(config: &ScyllaConfig) -> Result<ScyllaStore, ScyllaError> {
        let session = connect_session(config).await?;
        ScyllaStore::with_session(Arc::new(session), config).await
    }

    /// [`ScyllaStore::connect`] for start-up: a cluster that does not answer yet is retried with
    /// growing pauses (logged at `warn`) for `config.startup_wait`; bad settings and a keyspace
    /// behind this binary's schema fail at once.
    pub async fn open(config: &ScyllaConfig) -> Result<ScyllaStore, ScyllaError> {
        config.validate()?;
        let outcome = startup::retry_until(
            config.startup_wait,
            || ScyllaStore::connect(config),
            ScyllaError::is_permanent,
            |tries, error, pause| {
                tracing::warn!(
                    nodes = ?config.nodes,
                    keyspace = %config.keyspace,
                    tries,
                    retry_in_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX),
                    %error,
                    "CQL store not reachable yet; retrying"
                );
            },
        )
        .await;
        match outcome {
            Ok(store) => Ok(store),
            Err(startup::GaveUp::Permanent(e)) => Err(e),
            Err(startup::GaveUp::Exhausted {
                tries,
                waited,
                last,
            }) => Err(ScyllaError::Unreachable {
                nodes: config.nodes.clone(),
                keyspace: config.keyspace.clone(),
                tries,
                waited,
                last: Box::new(last),
            }),
        }
    }

    /// Builds the store on an open session (shared with, e.g., the migrator in tests). The
    /// session's own keyspace does not matter: statements name `config.keyspace`.
    pub async fn with_session(
        session: Arc<Session>,
        config: &ScyllaConfig,
    ) -> Result<ScyllaStore, ScyllaError> {
        config.validate()?;
        let ks = &config.keyspace;
        let found = migrate::applied_versions(&session, ks)
            .await
            .map_err(|e| ScyllaError::Cql(e.to_string()))?
            .iter()
            .map(|v| v.version)
            .max()
            .unwrap_or(0);
        let needed = migrate::LATEST_VERSION;
        if found < needed {
            return Err(ScyllaError::SchemaBehind {
                keyspace: ks.clone(),
                found,
                needed,
            });
        }
        let st = Statements::prepare(&session, ks).await?;
        let attempt_ttl = config.attempt_ttl_secs();
        let bucket_index_ttl = i32::try_from(
            (config.attempt_ttl + bucket_index::SLACK)
                .min(MAX_CQL_TTL)
                .as_secs(),
        )
        .unwrap_or(i32::MAX);
        let permits = Arc::new(Semaphore::new(config.max_concurrent_writes));
        let writer = |statement: &PreparedStatement| PartitionWriter {
            session: session.clone(),
            statement: statement.clone(),
        };
        Ok(ScyllaStore {
            history: GroupCommit::new(writer(&st.insert_history), permits.clone()),
            by_event: GroupCommit::new(writer(&st.insert_by_event), permits.clone()),
            dead_letters: GroupCommit::new(writer(&st.insert_dead), permits.clone()),
            session,
            st,
            permits,
            attempt_ttl,
            bucket_index_ttl,
            audit_ttl: config.audit_ttl_secs(),
            buckets_written: WrittenBuckets::default(),
        })
    }

    /// The session, for callers that share it (tests, the migrator).
    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// An endpoint's dead letters, newest first, a page of at most `query.limit` (1..=500);
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

    /// A delivery's replay mark or claim, as `statement` (`SELECT replay_id, at`) reads it.
    async fn read_mark(
        &self,
        statement: &PreparedStatement,
        id: &DeliveryId,
    ) -> Result<Option<ReplayMark>, StoreError> {
        let _permit = self.permit().await?;
        let result = self
            .session
            .execute_unpaged(statement, (id.as_str(),))
            .await
            .map_err(exec_error)?;
        let rows = result.into_rows_result().map_err(backend_error)?;
        let mark = rows
            .maybe_first_row::<ReplayMarkCols>()
            .map_err(backend_error)?
            .map(|r| ReplayMark {
                delivery_id: id.clone(),
                replay_id: r.replay_id,
                at: from_cql(r.at),
            });
        Ok(mark)
    }

    /// One of the `max_concurrent_writes` request slots, held while one request is in flight.
    async fn permit(&self) -> Result<tokio::sync::SemaphorePermit<'_>, StoreError> {
        self.permits
            .acquire()
            .await
            .map_err(|_| StoreError::Unavailable("store is shutting down".into()))
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

    /// A delivery's state, derived from its attempt rows: the count of rows is the attempt
    /// count, the first row (clustering order) the first attempt, the last row the
    /// latest-started attempt, which sets the status. `None` when no row is left (never logged,
    /// or every row expired).
    async fn read_state(&self, id: &str) -> Result<Option<DeliveryState>, StoreError> {
        let _permit = self.permit().await?;
        let mut rows = self
            .session
            .execute_iter(self.st.select_state.clone(), (id,))
            .await
            .map_err(pager_error)?
            .rows_stream::<StateCols>()
            .map_err(backend_error)?;
        let mut first = None;
        let mut latest = None;
        let mut count = 0u32;
        while let Some(cols) = rows.next().await {
            let cols = cols.map_err(row_error)?;
            count = count.saturating_add(1);
            first.get_or_insert(cols.started_at);
            latest = Some(cols);
            if count as usize == MAX_ATTEMPTS_READ {
                break;
            }
        }
        match (first, latest) {
            (Some(first), Some(latest)) => state_from_cols(first, count, latest).map(Some),
            _ => Ok(None),
        }
    }

    /// A walk over `endpoint`'s rows of one bucketed table, newest first: from before `cursor`
    /// (when given) back to the bucket of `since` (when given), `page_rows` rows per request.
    async fn walk<'s, R>(
        &'s self,
        endpoint: &'s EndpointId,
        kind: BucketKind,
        page_rows: usize,
        cursor: Option<BucketKey>,
        since: Option<CqlTimestamp>,
    ) -> Result<BucketWalk<'s, R>, StoreError> {
        let newest = cursor.as_ref().map_or(CqlTimestamp(i64::MAX), |c| c.bucket);
        let oldest = since.map_or(CqlTimestamp(i64::MIN), bucket_of);
        let buckets = {
            let _permit = self.permit().await?;
            self.session
                .execute_iter(
                    self.st.select_buckets.clone(),
                    (endpoint.as_str(), kind.as_str(), oldest, newest),
                )
                .await
                .map_err(pager_error)?
        }
        .rows_stream::<(CqlTimestamp,)>()
        .map_err(backend_error)?;
        let page_rows = i32::try_from(page_rows.max(1)).unwrap_or(i32::MAX);
        let (all, before) = match kind {
            BucketKind::History => (&self.st.select_history, &self.st.select_history_before),
            BucketKind::Dead => (&self.st.select_dead, &self.st.select_dead_before),
        };
        let (mut all, mut before) = (all.clone(), before.clone());
        all.set_page_size(page_rows);
        before.set_page_size(page_rows);
        Ok(BucketWalk {
            reader: BucketReader {
                store: self,
                endpoint: endpoint.as_str(),
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

    /// Resolves a run of history entries against delivery state, appending the entries that are
    /// their delivery's first attempt (and match the status filter) to `found`.
    async fn resolve(
        &self,
        endpoint: &EndpointId,
        status: Option<DeliveryStatus>,
        batch: &mut Vec<BucketKey>,
        states: &mut HashMap<DeliveryId, Option<DeliveryState>>,
        found: &mut Vec<(BucketKey, DeliveryState)>,
    ) -> Result<(), StoreError> {
        let mut missing: Vec<DeliveryId> = batch
            .iter()
            .filter(|k| !states.contains_key(&k.delivery_id))
            .map(|k| k.delivery_id.clone())
            .collect();
        missing.sort();
        missing.dedup();
        let fetched: Vec<(DeliveryId, Option<DeliveryState>)> = futures::stream::iter(missing)
            .map(|id| async move {
                let state = self.read_state(id.as_str()).await?;
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
            let first = &state.endpoint_id == endpoint && to_cql(state.first_attempt_at) == key.at;
            if first && status.is_none_or(|s| s == state.status) {
                found.push((key, state.clone()));
            }
        }
        Ok(())
    }
}

/// One request's worth of one bucket's rows, newest first.
struct BucketPage<R> {
    bucket: CqlTimestamp,
    rows: Vec<R>,
    /// Where the bucket goes on, when this page did not reach its end.
    more: Option<PagingState>,
}

/// Reads pages of an endpoint's buckets of one table, each request under one permit.
struct BucketReader<'s> {
    store: &'s ScyllaStore,
    endpoint: &'s str,
    /// The table's query for a whole bucket.
    all: PreparedStatement,
    /// The table's query for a bucket's rows before a position.
    before: PreparedStatement,
    /// Only rows before this position (older, or as old with a smaller delivery id) are read.
    cursor: Option<BucketKey>,
}

impl BucketReader<'_> {
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
                let values = (self.endpoint, bucket, c.at, c.delivery_id.as_str());
                session
                    .execute_single_page(&self.before, values, from)
                    .await
            }
            _ => {
                session
                    .execute_single_page(&self.all, (self.endpoint, bucket), from)
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

/// Walks an endpoint's non-empty buckets of one table (as `endpoint_buckets` lists them)
/// newest first, and hands out their rows a page at a time, in order: newest bucket first,
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
struct BucketWalk<'s, R> {
    reader: BucketReader<'s>,
    /// The listing of non-empty buckets, newest first.
    buckets: TypedRowStream<(CqlTimestamp,)>,
    listed_all: bool,
    /// Pages read but not handed out yet, in order.
    ready: VecDeque<BucketPage<R>>,
    /// The bucket handed out last, when it has more pages: they come before `ready`.
    rest: Option<(CqlTimestamp, PagingState)>,
    buckets_read: usize,
    rows_read: usize,
}

impl<R> BucketWalk<'_, R>
where
    R: for<'f, 'm> scylla::deserialize::row::DeserializeRow<'f, 'm>,
{
    /// The next page's rows, `None` at the end. `wanted` is how many more rows the caller
    /// expects to need; it only sizes the next round of reads.
    async fn next_page(&mut self, wanted: usize) -> Result<Option<Vec<R>>, StoreError> {
        let page = if let Some((bucket, from)) = self.rest.take() {
            Some(self.reader.page(bucket, from).await?)
        } else {
            if self.ready.is_empty() {
                self.read_round(wanted).await?;
            }
            self.ready.pop_front()
        };
        Ok(page.map(|page| {
            if let Some(from) = page.more {
                self.rest = Some((page.bucket, from));
            }
            page.rows
        }))
    }

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
fn trim_to_page<T>(found: &mut Vec<(BucketKey, T)>, limit: usize) -> Option<String> {
    if found.len() <= limit {
        return None;
    }
    found.truncate(limit);
    found.last().map(|(key, _)| key.encode())
}

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

/// The state after `latest`, the latest-started of `attempts` attempts, the first of which
/// started at `first`: the shared state transition applied to the latest attempt alone.
fn state_from_cols(
    first: CqlTimestamp,
    attempts: u32,
    latest: StateCols,
) -> Result<DeliveryState, StoreError> {
    let latest = attempt_from_cols(AttemptCols {
        delivery_id: latest.delivery_id,
        started_at: latest.started_at,
        attempt: latest.attempt,
        event_id: latest.event_id,
        endpoint_id: latest.endpoint_id,
        tenant: latest.tenant,
        event_type: latest.event_type,
        status: latest.status,
        latency_ms: None,
        error_class: latest.error_class,
        response_body: None,
        signing_key_ids: None,
        replay_id: None,
        outcome: latest.outcome,
        next_attempt_at: latest.next_attempt_at,
        dead_reason: latest.dead_reason,
        record_partition: None,
        record_offset: None,
    })?;
    let mut state = DeliveryState::after(None, &latest);
    state.attempts = attempts;
    state.first_attempt_at = from_cql(first);
    Ok(state)
}

fn attempt_from_cols(c: AttemptCols) -> Result<AttemptRow, StoreError> {
    let bad = || corrupt("attempt", &c.delivery_id);
    let error_class = c
        .error_class
        .as_deref()
        .map(|s| ErrorClass::parse(s).ok_or_else(bad))
        .transpose()?;
    let outcome = row::outcome_from_columns(
        c.outcome.as_deref().ok_or_else(bad)?,
        c.next_attempt_at,
        c.dead_reason.as_deref(),
    )
    .ok_or_else(bad)?;
    Ok(AttemptRow {
        delivery_id: DeliveryId::parse(c.delivery_id.as_str()).map_err(|_| bad())?,
        event_id: EventId::parse(c.event_id.clone().ok_or_else(bad)?).map_err(|_| bad())?,
        endpoint_id: EndpointId::parse(c.endpoint_id.clone().ok_or_else(bad)?)
            .map_err(|_| bad())?,
        tenant: Tenant::parse(c.tenant.clone().ok_or_else(bad)?).map_err(|_| bad())?,
        event_type: c.event_type.clone().ok_or_else(bad)?,
        attempt: u32::try_from(c.attempt).map_err(|_| bad())?,
        started_at: from_cql(c.started_at),
        status: status_from_col(c.status),
        latency_ms: c
            .latency_ms
            .and_then(|l| u32::try_from(l).ok())
            .unwrap_or(0),
        error_class,
        response_body: c.response_body.unwrap_or_default(),
        // CQL stores an empty list as null.
        signing_key_ids: c.signing_key_ids.unwrap_or_default(),
        replay_id: c.replay_id,
        outcome,
        record: c
            .record_partition
            .zip(c.record_offset)
            .map(|(partition, offset)| RecordPosition { partition, offset }),
    })
}

#[async_trait]
impl DeliveryStore for ScyllaStore {
    async fn record_attempt(&self, row: &AttemptRow) -> Result<(), StoreError> {
        let started = to_cql(row.started_at);
        let bucket = bucket_of(started);
        let attempt = attempt_col(row.attempt)?;
        let (outcome, next_col, dead_reason) = row::outcome_columns(&row.outcome);
        let error_class = row.error_class.map(ErrorClass::as_str);
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
            &self.st.insert_attempt,
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
                error_class,
                response_body: &row.response_body,
                signing_key_ids: &row.signing_key_ids,
                replay_id: row.replay_id.as_deref(),
                outcome,
                next_attempt_at: next_col,
                dead_reason,
                record_partition: row.record.map(|r| r.partition),
                record_offset: row.record.map(|r| r.offset),
                ttl: self.attempt_ttl,
            },
        );
        let history = self.history.write(HistoryRow {
            endpoint_id: row.endpoint_id.as_str().to_owned(),
            bucket,
            at: started,
            delivery_id: row.delivery_id.as_str().to_owned(),
            ttl: self.attempt_ttl,
        });
        let by_event = self.by_event.write(EventIndexRow {
            event_id: row.event_id.as_str().to_owned(),
            delivery_id: row.delivery_id.as_str().to_owned(),
            endpoint_id: row.endpoint_id.as_str().to_owned(),
            ttl: self.attempt_ttl,
        });
        let bucket_index = futures::future::try_join_all(index_kinds.iter().map(|kind| {
            self.write(
                &self.st.insert_bucket,
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
            self.dead_letters
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

    async fn delivery(&self, id: &DeliveryId) -> Result<Option<DeliveryState>, StoreError> {
        self.read_state(id.as_str()).await
    }

    async fn attempts(&self, id: &DeliveryId) -> Result<Vec<AttemptRow>, StoreError> {
        let _permit = self.permit().await?;
        let mut stream = self
            .session
            .execute_iter(self.st.select_attempts.clone(), (id.as_str(),))
            .await
            .map_err(pager_error)?
            .rows_stream::<AttemptCols>()
            .map_err(backend_error)?;
        let mut rows = Vec::new();
        while let Some(cols) = stream.next().await {
            rows.push(attempt_from_cols(cols.map_err(row_error)?)?);
            if rows.len() == MAX_ATTEMPTS_READ {
                break;
            }
        }
        Ok(rows)
    }

    async fn endpoint_deliveries(
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

        let mut states = HashMap::new();
        let mut found: Vec<(BucketKey, DeliveryState)> = Vec::new();
        let mut batch: Vec<BucketKey> = Vec::with_capacity(RESOLVE_CHUNK);
        let mut last_scanned: Option<BucketKey> = None;
        let mut scanned = 0usize;
        let mut truncated = false;
        'walk: loop {
            let wanted = (limit + 1).saturating_sub(found.len() + batch.len());
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
                batch.push(key);
                scanned += 1;
                // Resolve as soon as the batch could complete the page: then no further bucket
                // need be read.
                let needed = (limit + 1)
                    .saturating_sub(found.len())
                    .clamp(RESOLVE_MIN, RESOLVE_CHUNK);
                if batch.len() >= needed || scanned == MAX_SCANNED {
                    self.resolve(endpoint, query.status, &mut batch, &mut states, &mut found)
                        .await?;
                    if found.len() > limit {
                        break 'walk;
                    }
                    if scanned == MAX_SCANNED {
                        truncated = true;
                        break 'walk;
                    }
                }
            }
        }
        self.resolve(endpoint, query.status, &mut batch, &mut states, &mut found)
            .await?;
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

    async fn event_deliveries(&self, event: &EventId) -> Result<Vec<DeliveryState>, StoreError> {
        let ids: Vec<String> = {
            let _permit = self.permit().await?;
            let mut stream = self
                .session
                .execute_iter(self.st.select_by_event.clone(), (event.as_str(),))
                .await
                .map_err(pager_error)?
                .rows_stream::<(String,)>()
                .map_err(backend_error)?;
            let mut ids = Vec::new();
            while let Some(row) = stream.next().await {
                ids.push(row.map_err(row_error)?.0);
                if ids.len() == MAX_EVENT_DELIVERIES {
                    break;
                }
            }
            ids
        };
        let states: Vec<Option<DeliveryState>> = futures::stream::iter(ids)
            .map(|id| async move { self.read_state(&id).await })
            .buffered(READ_FAN_OUT)
            .try_collect()
            .await?;
        Ok(states
            .into_iter()
            .flatten()
            .filter(|s| &s.event_id == event)
            .collect())
    }

    async fn record_replay(&self, audit: &ReplayAudit) -> Result<(), StoreError> {
        let values = ReplayValues {
            replay_id: &audit.replay_id,
            actor: &audit.actor,
            reason: &audit.reason,
            at: to_cql(audit.at),
            scope: &audit.scope,
            count: i64::try_from(audit.count).unwrap_or(i64::MAX),
            dry_run: audit.dry_run,
            tenant: audit.tenant.as_ref().map(Tenant::as_str),
            ttl: self.audit_ttl,
        };
        let by_id = self.write(&self.st.insert_replay, &values);
        let in_feed = |feed| {
            self.write(
                &self.st.insert_recent_replay,
                RecentReplayValues {
                    feed,
                    audit: &values,
                },
            )
        };
        let own = audit.tenant.as_ref().map(tenant_feed);
        let tenants = async {
            match &own {
                Some(feed) => in_feed(feed).await,
                None => Ok(()),
            }
        };
        tokio::try_join!(by_id, in_feed(REPLAY_FEED), tenants)?;
        Ok(())
    }

    async fn replays(
        &self,
        tenant: Option<&Tenant>,
        limit: u32,
    ) -> Result<Vec<ReplayAudit>, StoreError> {
        if limit == 0 {
            return Ok(vec![]);
        }
        let limit = i32::try_from(limit.min(MAX_REPLAYS_READ)).unwrap_or(1);
        let feed = tenant.map_or_else(|| REPLAY_FEED.to_owned(), tenant_feed);
        let _permit = self.permit().await?;
        let result = self
            .session
            .execute_unpaged(&self.st.select_recent_replays, (feed.as_str(), limit))
            .await
            .map_err(exec_error)?;
        let rows = result.into_rows_result().map_err(backend_error)?;
        let mut out = Vec::new();
        for r in rows.rows::<ReplayCols>().map_err(backend_error)? {
            let r = r.map_err(backend_error)?;
            out.push(ReplayAudit {
                replay_id: r.replay_id,
                actor: r.actor.unwrap_or_default(),
                reason: r.reason.unwrap_or_default(),
                at: from_cql(r.at),
                scope: r.scope.unwrap_or_default(),
                count: r.count.and_then(|c| u64::try_from(c).ok()).unwrap_or(0),
                dry_run: r.dry_run.unwrap_or(false),
                // Written from a checked tenant; rows from before version 6 have none.
                tenant: r.tenant.and_then(|t| Tenant::parse(t).ok()),
            });
        }
        Ok(out)
    }

    async fn record_replay_mark(&self, mark: &ReplayMark) -> Result<(), StoreError> {
        self.write(
            &self.st.insert_replay_mark,
            ReplayMarkValues {
                delivery_id: mark.delivery_id.as_str(),
                replay_id: &mark.replay_id,
                at: to_cql(mark.at),
                ttl: self.attempt_ttl,
            },
        )
        .await
    }

    async fn replay_mark(&self, id: &DeliveryId) -> Result<Option<ReplayMark>, StoreError> {
        self.read_mark(&self.st.select_replay_mark, id).await
    }

    /// A serial read: it sees every claim a lightweight transaction has made, including one
    /// whose commit is still on its way to the replicas.
    async fn replay_claim(&self, id: &DeliveryId) -> Result<Option<ReplayMark>, StoreError> {
        self.read_mark(&self.st.select_replay_claim, id).await
    }

    /// A lightweight transaction: `INSERT ... IF NOT EXISTS` over no claim, `UPDATE ... IF
    /// replay_id = over` over one.
    async fn claim_replay(
        &self,
        claim: &ReplayMark,
        over: Option<&str>,
    ) -> Result<bool, StoreError> {
        let _permit = self.permit().await?;
        let (delivery_id, replay_id, at) = (
            claim.delivery_id.as_str(),
            claim.replay_id.as_str(),
            to_cql(claim.at),
        );
        let ttl = self.attempt_ttl;
        let result = match over {
            None => {
                let values = ReplayClaimValues {
                    delivery_id,
                    replay_id,
                    at,
                    ttl,
                };
                self.session
                    .execute_unpaged(&self.st.insert_replay_claim, values)
                    .await
            }
            Some(over) => {
                let values = ReplayClaimOverValues {
                    delivery_id,
                    replay_id,
                    at,
                    ttl,
                    over,
                };
                self.session
                    .execute_unpaged(&self.st.update_replay_claim, values)
                    .await
            }
        }
        .map_err(exec_error)?;
        lwt_applied(result, replay_id)
    }
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
