//! The CQL store: ScyllaDB in production, Apache Cassandra 5 in this project's tests.
//!
//! Tables are in `schemas/cql/` (applied by [`crate::migrate`]). Writes are prepared
//! statements, token-aware (the driver's default policy, optionally pinned to `local_dc`),
//! bounded by a semaphore of `max_concurrent_writes` requests in flight, each under the
//! `write_timeout` of the session's execution profile. A permit is held only while its request
//! is in flight, never while a caller waits for a batch written by another task, so callers
//! cannot hold every permit while the batches they wait for need one.
//!
//! One attempt = 3 to 5 rows written concurrently (attempt row, history entry, event index, the
//! endpoint's day index when not written recently, the dead letter when the attempt
//! dead-lettered); `record_attempt` returns `Ok` only when all are durable. The attempt row and
//! the day index are plain writes. History entries, event-index rows and dead letters go
//! through [`group_commit`]: rows of one partition (an endpoint's day, an event) that arrive
//! while a write to it is in flight go together as one single-partition unlogged batch, which
//! the server applies as one mutation, so under load an index row costs a fraction of a write.
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
//! History pages walk an endpoint's day buckets newest first (`endpoint_days` lists the
//! non-empty ones). Each history entry is checked against the delivery's state (one point read
//! per distinct delivery on the page) and kept only if it is the delivery's first attempt;
//! `status` is filtered the same way, client-side. A page reads at most [`MAX_SCANNED`] entries:
//! a rare status over a long history may come back short, with a cursor to continue from.
//!
//! When the cluster is unreachable every call fails with [`StoreError::Unavailable`] after at
//! most `write_timeout` per request it waits for (an index row may first wait for the batch of
//! its partition in flight, so `record_attempt` can take up to twice that, plus waits for a
//! permit); the driver keeps reconnecting, so calls succeed again once it is back.
//! At start-up [`ScyllaStore::open`] waits up to `startup_wait` for a cluster that does not
//! answer yet ([`startup`]) and refuses at once a keyspace that `hookline migrate` has not
//! brought to this binary's schema.

mod config;
mod group_commit;
mod row;
pub mod startup;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt};
use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::errors::{
    DbError, ExecutionError, NextRowError, PagerExecutionError, RequestAttemptError,
};
use scylla::frame::types::Consistency;
use scylla::policies::load_balancing::DefaultPolicy;
use scylla::serialize::row::SerializeRow;
use scylla::statement::batch::{Batch, BatchStatement, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlTimestamp;
use scylla::{DeserializeRow, SerializeRow};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use group_commit::{BatchWrite, GroupCommit, PartitionRow};

pub use config::{
    ConfigError, MAX_CQL_TTL, MAX_NODES, MAX_STARTUP_WAIT, Replication, ScyllaConfig,
    valid_keyspace,
};
use row::{HistoryKey, day_of, from_cql, to_cql};

use super::{
    AttemptOutcome, AttemptRow, DeliveryState, DeliveryStatus, DeliveryStore, HistoryQuery,
    MAX_PAGE, Page, ReplayAudit, StoreError,
};
use crate::attempt::ErrorClass;
use crate::id::{DeliveryId, EndpointId, EventId, Tenant};
use crate::retry_policy::DeadReason;

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
/// An endpoint's day index is rewritten at most this often per (endpoint, day) and process;
/// its TTL is [`DAY_INDEX_SLACK`] longer than the entries' so it outlives every entry written
/// while the cached write is trusted.
const DAY_INDEX_REFRESH: Duration = Duration::from_secs(86_400);
const DAY_INDEX_SLACK: Duration = Duration::from_secs(2 * 86_400);
/// Bound on the cache of recently written (endpoint, day) pairs.
const DAY_CACHE_CAPACITY: usize = 65_536;
/// The partition of `recent_replays`.
const REPLAY_FEED: &str = "all";

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
            ScyllaError::Config(_) | ScyllaError::SchemaBehind { .. }
        )
    }
}

/// Opens a session on the configured cluster: token-aware routing (within `local_dc` when set),
/// LOCAL_QUORUM, and `write_timeout` on every request.
pub async fn connect_session(config: &ScyllaConfig) -> Result<Session, ScyllaError> {
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
    SessionBuilder::new()
        .known_nodes(&config.nodes)
        .default_execution_profile_handle(profile.into_handle())
        .build()
        .await
        .map_err(|e| ScyllaError::Connect {
            nodes: config.nodes.clone(),
            detail: e.to_string(),
        })
}

/// The prepared statements, all on fully qualified tables so the session's keyspace is
/// irrelevant.
struct Statements {
    insert_attempt: PreparedStatement,
    insert_history: PreparedStatement,
    insert_day: PreparedStatement,
    insert_by_event: PreparedStatement,
    insert_dead: PreparedStatement,
    insert_replay: PreparedStatement,
    insert_recent_replay: PreparedStatement,
    select_attempts: PreparedStatement,
    select_state: PreparedStatement,
    select_days: PreparedStatement,
    select_history: PreparedStatement,
    select_history_before: PreparedStatement,
    select_by_event: PreparedStatement,
    select_recent_replays: PreparedStatement,
    select_dead: PreparedStatement,
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
        Ok(Statements {
            insert_attempt: p(format!(
                "INSERT INTO {ks}.attempts_by_delivery (delivery_id, started_at, attempt, \
                 event_id, endpoint_id, tenant, event_type, status, latency_ms, error_class, \
                 response_body, signing_key_ids, replay_id, outcome, next_attempt_at, \
                 dead_reason) VALUES (:delivery_id, :started_at, :attempt, :event_id, \
                 :endpoint_id, :tenant, :event_type, :status, :latency_ms, :error_class, \
                 :response_body, :signing_key_ids, :replay_id, :outcome, :next_attempt_at, \
                 :dead_reason) USING TTL :ttl"
            ))
            .await?,
            insert_history: p(format!(
                "INSERT INTO {ks}.deliveries_by_endpoint (endpoint_id, day, at, delivery_id) \
                 VALUES (:endpoint_id, :day, :at, :delivery_id) USING TTL :ttl"
            ))
            .await?,
            insert_day: p(format!(
                "INSERT INTO {ks}.endpoint_days (endpoint_id, day) VALUES (?, ?) USING TTL ?"
            ))
            .await?,
            insert_by_event: p(format!(
                "INSERT INTO {ks}.deliveries_by_event (event_id, delivery_id, endpoint_id) \
                 VALUES (:event_id, :delivery_id, :endpoint_id) USING TTL :ttl"
            ))
            .await?,
            insert_dead: p(format!(
                "INSERT INTO {ks}.dead_letters_by_endpoint (endpoint_id, day, dead_at, \
                 delivery_id, event_id, tenant, event_type, attempt, reason, last_status) \
                 VALUES (:endpoint_id, :day, :dead_at, :delivery_id, :event_id, :tenant, \
                 :event_type, :attempt, :reason, :last_status) USING TTL :ttl"
            ))
            .await?,
            insert_replay: p(format!(
                "INSERT INTO {ks}.replay_audit (replay_id, actor, reason, at, scope, count, \
                 dry_run) VALUES (:replay_id, :actor, :reason, :at, :scope, :count, :dry_run) \
                 USING TTL :ttl"
            ))
            .await?,
            insert_recent_replay: p(format!(
                "INSERT INTO {ks}.recent_replays (feed, at, replay_id, actor, reason, scope, \
                 count, dry_run) VALUES (:feed, :at, :replay_id, :actor, :reason, :scope, \
                 :count, :dry_run) USING TTL :ttl"
            ))
            .await?,
            select_attempts: p(format!(
                "SELECT delivery_id, started_at, attempt, event_id, endpoint_id, tenant, \
                 event_type, status, latency_ms, error_class, response_body, signing_key_ids, \
                 replay_id, outcome, next_attempt_at, dead_reason \
                 FROM {ks}.attempts_by_delivery WHERE delivery_id = ?"
            ))
            .await?,
            select_state: p(format!(
                "SELECT delivery_id, started_at, attempt, event_id, endpoint_id, tenant, \
                 event_type, status, error_class, outcome, next_attempt_at, dead_reason \
                 FROM {ks}.attempts_by_delivery WHERE delivery_id = ?"
            ))
            .await?,
            select_days: p(format!(
                "SELECT day FROM {ks}.endpoint_days WHERE endpoint_id = ? AND day >= ? AND day <= ?"
            ))
            .await?,
            select_history: p(format!(
                "SELECT at, delivery_id FROM {ks}.deliveries_by_endpoint \
                 WHERE endpoint_id = ? AND day = ?"
            ))
            .await?,
            select_history_before: p(format!(
                "SELECT at, delivery_id FROM {ks}.deliveries_by_endpoint \
                 WHERE endpoint_id = ? AND day = ? AND (at, delivery_id) < (?, ?)"
            ))
            .await?,
            select_by_event: p(format!(
                "SELECT delivery_id FROM {ks}.deliveries_by_event WHERE event_id = ?"
            ))
            .await?,
            select_recent_replays: p(format!(
                "SELECT replay_id, actor, reason, at, scope, count, dry_run \
                 FROM {ks}.recent_replays WHERE feed = ? LIMIT ?"
            ))
            .await?,
            select_dead: p(format!(
                "SELECT dead_at, delivery_id, event_id, tenant, event_type, attempt, reason, \
                 last_status FROM {ks}.dead_letters_by_endpoint \
                 WHERE endpoint_id = ? AND day = ? LIMIT ?"
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
    day_index_ttl: i32,
    audit_ttl: i32,
    /// (endpoint, day) pairs whose day-index row this process wrote recently.
    days_written: Mutex<HashMap<(EndpointId, i32), Instant>>,
}

impl std::fmt::Debug for ScyllaStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScyllaStore")
            .field("attempt_ttl", &self.attempt_ttl)
            .field("available_permits", &self.permits.available_permits())
            .finish_non_exhaustive()
    }
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
    ttl: i32,
}

/// Bytes of write time and TTL the server counts per cell (and per row's liveness) when it
/// sizes a batch.
const CELL_OVERHEAD: usize = 16;

/// A `deliveries_by_endpoint` entry; partition (endpoint, day).
#[derive(SerializeRow)]
struct HistoryRow {
    endpoint_id: String,
    day: i32,
    at: CqlTimestamp,
    delivery_id: String,
    ttl: i32,
}

impl PartitionRow for HistoryRow {
    type Key = (String, i32);
    fn partition(&self) -> (String, i32) {
        (self.endpoint_id.clone(), self.day)
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

/// A `dead_letters_by_endpoint` row; partition (endpoint, day).
#[derive(SerializeRow)]
struct DeadLetterRow {
    endpoint_id: String,
    day: i32,
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
    type Key = (String, i32);
    fn partition(&self) -> (String, i32) {
        (self.endpoint_id.clone(), self.day)
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
    ttl: i32,
}

#[derive(SerializeRow)]
struct RecentReplayValues<'a> {
    feed: &'static str,
    replay_id: &'a str,
    actor: &'a str,
    reason: &'a str,
    at: CqlTimestamp,
    scope: &'a str,
    count: i64,
    dry_run: bool,
    ttl: i32,
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
        let found = crate::migrate::applied_versions(&session, ks)
            .await
            .map_err(|e| ScyllaError::Cql(e.to_string()))?
            .iter()
            .map(|v| v.version)
            .max()
            .unwrap_or(0);
        let needed = crate::migrate::LATEST_VERSION;
        if found < needed {
            return Err(ScyllaError::SchemaBehind {
                keyspace: ks.clone(),
                found,
                needed,
            });
        }
        let st = Statements::prepare(&session, ks).await?;
        let attempt_ttl = config.attempt_ttl_secs();
        let day_index_ttl = i32::try_from(
            (config.attempt_ttl + DAY_INDEX_SLACK)
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
            day_index_ttl,
            audit_ttl: config.audit_ttl_secs(),
            days_written: Mutex::new(HashMap::new()),
        })
    }

    /// The session, for callers that share it (tests, the migrator).
    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// An endpoint's dead letters of one UTC day, newest first, at most `limit` (1..=500).
    pub async fn dead_letters(
        &self,
        endpoint: &EndpointId,
        day: SystemTime,
        limit: u32,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        let limit = i32::try_from(limit.clamp(1, MAX_PAGE)).unwrap_or(1);
        let _permit = self.permit().await?;
        let result = self
            .session
            .execute_unpaged(
                &self.st.select_dead,
                (endpoint.as_str(), day_of(to_cql(day)), limit),
            )
            .await
            .map_err(exec_error)?;
        let rows = result
            .into_rows_result()
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        let mut out = Vec::new();
        for r in rows
            .rows::<DeadCols>()
            .map_err(|e| StoreError::Backend(e.to_string()))?
        {
            let r = r.map_err(|e| StoreError::Backend(e.to_string()))?;
            let bad = || corrupt("dead letter", &r.delivery_id);
            out.push(DeadLetter {
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
            });
        }
        Ok(out)
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

    /// Whether this (endpoint, day) still needs its day-index row written by this process.
    fn day_needs_write(&self, endpoint: &EndpointId, day: i32) -> bool {
        let cache = self.days_written.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .get(&(endpoint.clone(), day))
            .is_none_or(|at| at.elapsed() >= DAY_INDEX_REFRESH)
    }

    fn day_written(&self, endpoint: &EndpointId, day: i32, at: Instant) {
        let mut cache = self.days_written.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= DAY_CACHE_CAPACITY {
            // Forgetting only costs a redundant idempotent write per pair.
            cache.clear();
        }
        cache.insert((endpoint.clone(), day), at);
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
            .map_err(|e| StoreError::Backend(e.to_string()))?;
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

    /// An endpoint's non-empty day buckets in `min..=max`, newest first.
    async fn history_days(
        &self,
        endpoint: &EndpointId,
        min: i32,
        max: i32,
    ) -> Result<Vec<i32>, StoreError> {
        let _permit = self.permit().await?;
        let mut stream = self
            .session
            .execute_iter(self.st.select_days.clone(), (endpoint.as_str(), min, max))
            .await
            .map_err(pager_error)?
            .rows_stream::<(i32,)>()
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        let mut days = Vec::new();
        // CQL's TTL limit bounds the number of days with rows to about 7300.
        while let Some(row) = stream.next().await {
            days.push(row.map_err(row_error)?.0);
        }
        Ok(days)
    }

    /// Resolves a run of history entries against delivery state, appending the entries that are
    /// their delivery's first attempt (and match the status filter) to `found`.
    async fn resolve(
        &self,
        endpoint: &EndpointId,
        status: Option<DeliveryStatus>,
        batch: &mut Vec<HistoryKey>,
        states: &mut HashMap<DeliveryId, Option<DeliveryState>>,
        found: &mut Vec<(HistoryKey, DeliveryState)>,
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
    })
}

#[async_trait]
impl DeliveryStore for ScyllaStore {
    async fn record_attempt(&self, row: &AttemptRow) -> Result<(), StoreError> {
        let started = to_cql(row.started_at);
        let day = day_of(started);
        let attempt = attempt_col(row.attempt)?;
        let (outcome, next_col, dead_reason) = row::outcome_columns(&row.outcome);
        let error_class = row.error_class.map(ErrorClass::as_str);
        let dead = match row.outcome {
            AttemptOutcome::Dead { reason } => Some(reason),
            _ => None,
        };
        let write_day = self.day_needs_write(&row.endpoint_id, day);
        let now = Instant::now();

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
                ttl: self.attempt_ttl,
            },
        );
        let history = self.history.write(HistoryRow {
            endpoint_id: row.endpoint_id.as_str().to_owned(),
            day,
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
        let day_index = async {
            if write_day {
                self.write(
                    &self.st.insert_day,
                    (row.endpoint_id.as_str(), day, self.day_index_ttl),
                )
                .await
            } else {
                Ok(())
            }
        };
        let dead_letter = async {
            let Some(reason) = dead else {
                return Ok(());
            };
            self.dead_letters
                .write(DeadLetterRow {
                    endpoint_id: row.endpoint_id.as_str().to_owned(),
                    day,
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
        tokio::try_join!(attempt_row, history, by_event, day_index, dead_letter)?;
        if write_day {
            self.day_written(&row.endpoint_id, day, now);
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
            .map_err(|e| StoreError::Backend(e.to_string()))?;
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
        let cursor = query
            .cursor
            .as_deref()
            .map(HistoryKey::decode)
            .transpose()?;
        let since = query.since.map(to_cql);
        let max_day = cursor.as_ref().map_or(i32::MAX, |c| c.day);
        let min_day = since.map_or(i32::MIN, day_of);
        let days = self.history_days(endpoint, min_day, max_day).await?;

        let mut states = HashMap::new();
        let mut found: Vec<(HistoryKey, DeliveryState)> = Vec::new();
        let mut batch: Vec<HistoryKey> = Vec::with_capacity(RESOLVE_CHUNK);
        let mut last_scanned: Option<HistoryKey> = None;
        let mut scanned = 0usize;
        let mut truncated = false;
        'days: for day in days {
            let pager = {
                let _permit = self.permit().await?;
                match &cursor {
                    Some(c) if c.day == day => {
                        self.session
                            .execute_iter(
                                self.st.select_history_before.clone(),
                                (endpoint.as_str(), day, c.at, c.delivery_id.as_str()),
                            )
                            .await
                    }
                    _ => {
                        self.session
                            .execute_iter(self.st.select_history.clone(), (endpoint.as_str(), day))
                            .await
                    }
                }
                .map_err(pager_error)?
            };
            let mut entries = pager
                .rows_stream::<(CqlTimestamp, String)>()
                .map_err(|e| StoreError::Backend(e.to_string()))?;
            let mut past_since = false;
            while let Some(entry) = entries.next().await {
                let (at, id) = entry.map_err(row_error)?;
                if since.is_some_and(|s| at.0 < s.0) {
                    past_since = true;
                    break;
                }
                let delivery_id =
                    DeliveryId::parse(id.as_str()).map_err(|_| corrupt("history", &id))?;
                let key = HistoryKey {
                    day,
                    at,
                    delivery_id,
                };
                last_scanned = Some(key.clone());
                batch.push(key);
                scanned += 1;
                if batch.len() == RESOLVE_CHUNK || scanned == MAX_SCANNED {
                    self.resolve(endpoint, query.status, &mut batch, &mut states, &mut found)
                        .await?;
                    if found.len() > limit {
                        break 'days;
                    }
                    if scanned == MAX_SCANNED {
                        truncated = true;
                        break 'days;
                    }
                }
            }
            self.resolve(endpoint, query.status, &mut batch, &mut states, &mut found)
                .await?;
            if found.len() > limit || past_since {
                break;
            }
        }
        // One more matching entry than the page holds proves there is a next page.
        let next_cursor = if found.len() > limit {
            found.truncate(limit);
            found.last().map(|(k, _)| k.encode())
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
                .map_err(|e| StoreError::Backend(e.to_string()))?;
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
        let at = to_cql(audit.at);
        let count = i64::try_from(audit.count).unwrap_or(i64::MAX);
        let by_id = self.write(
            &self.st.insert_replay,
            ReplayValues {
                replay_id: &audit.replay_id,
                actor: &audit.actor,
                reason: &audit.reason,
                at,
                scope: &audit.scope,
                count,
                dry_run: audit.dry_run,
                ttl: self.audit_ttl,
            },
        );
        let recent = self.write(
            &self.st.insert_recent_replay,
            RecentReplayValues {
                feed: REPLAY_FEED,
                replay_id: &audit.replay_id,
                actor: &audit.actor,
                reason: &audit.reason,
                at,
                scope: &audit.scope,
                count,
                dry_run: audit.dry_run,
                ttl: self.audit_ttl,
            },
        );
        tokio::try_join!(by_id, recent)?;
        Ok(())
    }

    async fn replays(&self, limit: u32) -> Result<Vec<ReplayAudit>, StoreError> {
        if limit == 0 {
            return Ok(vec![]);
        }
        let limit = i32::try_from(limit.min(MAX_REPLAYS_READ)).unwrap_or(1);
        let _permit = self.permit().await?;
        let result = self
            .session
            .execute_unpaged(&self.st.select_recent_replays, (REPLAY_FEED, limit))
            .await
            .map_err(exec_error)?;
        let rows = result
            .into_rows_result()
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        let mut out = Vec::new();
        for r in rows
            .rows::<ReplayCols>()
            .map_err(|e| StoreError::Backend(e.to_string()))?
        {
            let r = r.map_err(|e| StoreError::Backend(e.to_string()))?;
            out.push(ReplayAudit {
                replay_id: r.replay_id,
                actor: r.actor.unwrap_or_default(),
                reason: r.reason.unwrap_or_default(),
                at: from_cql(r.at),
                scope: r.scope.unwrap_or_default(),
                count: r.count.and_then(|c| u64::try_from(c).ok()).unwrap_or(0),
                dry_run: r.dry_run.unwrap_or(false),
            });
        }
        Ok(out)
    }
}
