//! Every CQL statement the store runs, prepared once at start-up, grouped by the tables they
//! serve. All name fully qualified tables, so the session's keyspace is irrelevant.

use scylla::client::session::Session;
use scylla::frame::types::{Consistency, SerialConsistency};
use scylla::statement::prepared::PreparedStatement;

use super::ScyllaError;
use super::bucket_walk::BUCKET_LIST_PAGE;

/// The prepared statements, one group per set of tables.
pub(super) struct Statements {
    /// A delivery's log (attempts, notes) and the event index of older versions.
    pub(super) attempt: AttemptStatements,
    /// Events, and a tenant's events by minute.
    pub(super) event: EventStatements,
    /// An endpoint's bucketed history and dead letters.
    pub(super) bucket: BucketStatements,
    /// Replay audit rows and the feeds that list them.
    pub(super) replay: ReplayStatements,
    /// Replay marks and claims.
    pub(super) claim: ClaimStatements,
}

impl Statements {
    /// Prepares every statement on `session` for the tables of keyspace `ks`.
    pub(super) async fn prepare(session: &Session, ks: &str) -> Result<Statements, ScyllaError> {
        let p = Preparer { session, ks };
        Ok(Statements {
            attempt: AttemptStatements::prepare(&p).await?,
            event: EventStatements::prepare(&p).await?,
            bucket: BucketStatements::prepare(&p).await?,
            replay: ReplayStatements::prepare(&p).await?,
            claim: ClaimStatements::prepare(&p).await?,
        })
    }
}

/// Prepares statements on one session for one keyspace.
struct Preparer<'s> {
    session: &'s Session,
    ks: &'s str,
}

impl Preparer<'_> {
    /// A statement the driver may retry.
    async fn plain(&self, cql: String) -> Result<PreparedStatement, ScyllaError> {
        let mut st = self
            .session
            .prepare(cql.as_str())
            .await
            .map_err(|e| ScyllaError::Cql(format!("preparing {cql:?}: {e}")))?;
        // Every statement here may run twice with the same effect, which lets the driver
        // retry it after a timeout.
        st.set_is_idempotent(true);
        Ok(st)
    }

    /// A replay claim's lightweight transaction: never retried by the driver (a conditional
    /// write sent twice may report its own first write as a rival's), serial within the local
    /// datacenter.
    async fn serial_write(&self, cql: String) -> Result<PreparedStatement, ScyllaError> {
        let mut st = self.plain(cql).await?;
        st.set_is_idempotent(false);
        st.set_serial_consistency(Some(SerialConsistency::LocalSerial));
        Ok(st)
    }

    /// The read that sees every claim [`Preparer::serial_write`] statements made, including
    /// one whose commit is still on its way to the replicas.
    async fn serial_read(&self, cql: String) -> Result<PreparedStatement, ScyllaError> {
        let mut st = self.serial_write(cql).await?;
        st.set_consistency(Consistency::LocalSerial);
        Ok(st)
    }
}

/// Statements on `attempts_by_delivery`, and the reads of the `deliveries_by_event` rows
/// written before version 7.
pub(super) struct AttemptStatements {
    pub(super) insert_attempt: PreparedStatement,
    /// A note row (attempt 0, note 'parked' or 'dead').
    pub(super) insert_note: PreparedStatement,
    pub(super) select_attempts: PreparedStatement,
    /// The columns delivery state is derived from.
    pub(super) select_state: PreparedStatement,
    pub(super) select_by_event: PreparedStatement,
}

impl AttemptStatements {
    async fn prepare(p: &Preparer<'_>) -> Result<AttemptStatements, ScyllaError> {
        let ks = p.ks;
        Ok(AttemptStatements {
            insert_attempt: p
                .plain(format!(
                    "INSERT INTO {ks}.attempts_by_delivery (delivery_id, started_at, attempt, \
                     event_id, endpoint_id, tenant, event_type, status, latency_ms, \
                     error_class, response_body, signing_key_ids, replay_id, outcome, \
                     next_attempt_at, dead_reason, record_partition, record_offset, \
                     request_headers) VALUES \
                     (:delivery_id, :started_at, :attempt, :event_id, :endpoint_id, :tenant, \
                     :event_type, :status, :latency_ms, :error_class, :response_body, \
                     :signing_key_ids, :replay_id, :outcome, :next_attempt_at, :dead_reason, \
                     :record_partition, :record_offset, :request_headers) USING TTL :ttl"
                ))
                .await?,
            insert_note: p
                .plain(format!(
                    "INSERT INTO {ks}.attempts_by_delivery (delivery_id, started_at, attempt, \
                     event_id, endpoint_id, tenant, event_type, replay_id, note, park_reason, \
                     next_attempt_at, dead_reason) VALUES \
                     (:delivery_id, :started_at, 0, :event_id, :endpoint_id, :tenant, \
                     :event_type, :replay_id, :note, :park_reason, :next_attempt_at, \
                     :dead_reason) USING TTL :ttl"
                ))
                .await?,
            select_attempts: p
                .plain(format!(
                    "SELECT delivery_id, started_at, attempt, event_id, endpoint_id, tenant, \
                     event_type, status, latency_ms, error_class, response_body, \
                     signing_key_ids, replay_id, outcome, next_attempt_at, dead_reason, \
                     record_partition, record_offset, request_headers, note \
                     FROM {ks}.attempts_by_delivery WHERE delivery_id = ?"
                ))
                .await?,
            select_state: p
                .plain(format!(
                    "SELECT delivery_id, started_at, attempt, event_id, endpoint_id, tenant, \
                     event_type, status, error_class, outcome, next_attempt_at, dead_reason, \
                     note, park_reason FROM {ks}.attempts_by_delivery WHERE delivery_id = ?"
                ))
                .await?,
            select_by_event: p
                .plain(format!(
                    "SELECT delivery_id FROM {ks}.deliveries_by_event WHERE event_id = ?"
                ))
                .await?,
        })
    }
}

/// Statements on `events`, `events_by_tenant_bucket` and the `tenant_event_buckets` index that
/// lists a tenant's non-empty buckets.
pub(super) struct EventStatements {
    /// An event's own row (endpoint_id '', with the endpoints it went to).
    pub(super) insert_event: PreparedStatement,
    /// One tenant's rows of an event.
    pub(super) select_event: PreparedStatement,
    /// Every row filed under one event key (one event's, bar a digest collision): where
    /// deliveries' creations and an event's deliveries are read.
    pub(super) select_key_rows: PreparedStatement,
    /// An event's fingerprint and time of receipt, from its own row alone: what tells a
    /// repeat from a reused id.
    pub(super) select_event_mark: PreparedStatement,
    pub(super) insert_tenant_event: PreparedStatement,
    pub(super) insert_tenant_bucket: PreparedStatement,
    /// A tenant's buckets in a range, [`BUCKET_LIST_PAGE`] per page.
    pub(super) select_tenant_buckets: PreparedStatement,
    pub(super) select_tenant_events: PreparedStatement,
    pub(super) select_tenant_events_before: PreparedStatement,
}

impl EventStatements {
    async fn prepare(p: &Preparer<'_>) -> Result<EventStatements, ScyllaError> {
        let ks = p.ks;
        let mut select_tenant_buckets = p
            .plain(format!(
                "SELECT bucket FROM {ks}.tenant_event_buckets WHERE tenant = ? \
                 AND bucket >= ? AND bucket <= ?"
            ))
            .await?;
        select_tenant_buckets.set_page_size(BUCKET_LIST_PAGE);
        Ok(EventStatements {
            insert_event: p
                .plain(format!(
                    "INSERT INTO {ks}.events (event_key, event_id, tenant, endpoint_id, \
                     event_type, occurred_at, received_at, body, fingerprint, endpoints) VALUES \
                     (:event_key, :event_id, :tenant, '', :event_type, :occurred_at, \
                     :received_at, :body, :fingerprint, :endpoints) USING TTL :ttl"
                ))
                .await?,
            select_event: p
                .plain(format!(
                    "SELECT endpoint_id, event_type, occurred_at, received_at, body, \
                     fingerprint, endpoints FROM {ks}.events WHERE event_key = ? AND \
                     event_id = ? AND tenant = ?"
                ))
                .await?,
            select_key_rows: p
                .plain(format!(
                    "SELECT event_id, tenant, endpoint_id, event_type, received_at, endpoints \
                     FROM {ks}.events WHERE event_key = ?"
                ))
                .await?,
            select_event_mark: p
                .plain(format!(
                    "SELECT fingerprint, received_at FROM {ks}.events WHERE event_key = ? AND \
                     event_id = ? AND tenant = ? AND endpoint_id = ''"
                ))
                .await?,
            insert_tenant_event: p
                .plain(format!(
                    "INSERT INTO {ks}.events_by_tenant_bucket (tenant, bucket, received_at, \
                     event_id, event_type) VALUES (:tenant, :bucket, :received_at, :event_id, \
                     :event_type) USING TTL :ttl"
                ))
                .await?,
            insert_tenant_bucket: p
                .plain(format!(
                    "INSERT INTO {ks}.tenant_event_buckets (tenant, bucket) VALUES (?, ?) \
                     USING TTL ?"
                ))
                .await?,
            select_tenant_buckets,
            select_tenant_events: p
                .plain(format!(
                    "SELECT received_at, event_id, event_type FROM \
                     {ks}.events_by_tenant_bucket WHERE tenant = ? AND bucket = ?"
                ))
                .await?,
            select_tenant_events_before: p
                .plain(format!(
                    "SELECT received_at, event_id, event_type FROM \
                     {ks}.events_by_tenant_bucket WHERE tenant = ? AND bucket = ? \
                     AND (received_at, event_id) < (?, ?)"
                ))
                .await?,
        })
    }
}

/// Statements on `deliveries_by_endpoint_bucket`, `dead_letters_by_endpoint_bucket` and the
/// `endpoint_buckets` index that lists their non-empty buckets.
pub(super) struct BucketStatements {
    pub(super) insert_bucket: PreparedStatement,
    /// An endpoint's buckets of one kind in a range, [`BUCKET_LIST_PAGE`] per page.
    pub(super) select_buckets: PreparedStatement,
    pub(super) insert_history: PreparedStatement,
    pub(super) select_history: PreparedStatement,
    pub(super) select_history_before: PreparedStatement,
    pub(super) insert_dead: PreparedStatement,
    pub(super) select_dead: PreparedStatement,
    pub(super) select_dead_before: PreparedStatement,
}

impl BucketStatements {
    async fn prepare(p: &Preparer<'_>) -> Result<BucketStatements, ScyllaError> {
        let ks = p.ks;
        let mut select_buckets = p
            .plain(format!(
                "SELECT bucket FROM {ks}.endpoint_buckets WHERE endpoint_id = ? AND kind = ? \
                 AND bucket >= ? AND bucket <= ?"
            ))
            .await?;
        select_buckets.set_page_size(BUCKET_LIST_PAGE);
        let dead_cols = "dead_at, delivery_id, event_id, tenant, event_type, attempt, reason, \
                         last_status";
        Ok(BucketStatements {
            insert_bucket: p
                .plain(format!(
                    "INSERT INTO {ks}.endpoint_buckets (endpoint_id, kind, bucket) \
                     VALUES (?, ?, ?) USING TTL ?"
                ))
                .await?,
            select_buckets,
            insert_history: p
                .plain(format!(
                    "INSERT INTO {ks}.deliveries_by_endpoint_bucket (endpoint_id, bucket, at, \
                     delivery_id) VALUES (:endpoint_id, :bucket, :at, :delivery_id) \
                     USING TTL :ttl"
                ))
                .await?,
            select_history: p
                .plain(format!(
                    "SELECT at, delivery_id FROM {ks}.deliveries_by_endpoint_bucket \
                     WHERE endpoint_id = ? AND bucket = ?"
                ))
                .await?,
            select_history_before: p
                .plain(format!(
                    "SELECT at, delivery_id FROM {ks}.deliveries_by_endpoint_bucket \
                     WHERE endpoint_id = ? AND bucket = ? AND (at, delivery_id) < (?, ?)"
                ))
                .await?,
            insert_dead: p
                .plain(format!(
                    "INSERT INTO {ks}.dead_letters_by_endpoint_bucket (endpoint_id, bucket, \
                     {dead_cols}) VALUES (:endpoint_id, :bucket, :dead_at, :delivery_id, \
                     :event_id, :tenant, :event_type, :attempt, :reason, :last_status) \
                     USING TTL :ttl"
                ))
                .await?,
            select_dead: p
                .plain(format!(
                    "SELECT {dead_cols} FROM {ks}.dead_letters_by_endpoint_bucket \
                     WHERE endpoint_id = ? AND bucket = ?"
                ))
                .await?,
            select_dead_before: p
                .plain(format!(
                    "SELECT {dead_cols} FROM {ks}.dead_letters_by_endpoint_bucket \
                     WHERE endpoint_id = ? AND bucket = ? AND (dead_at, delivery_id) < (?, ?)"
                ))
                .await?,
        })
    }
}

/// Statements on `replay_audit` and `recent_replays`.
pub(super) struct ReplayStatements {
    pub(super) insert_replay: PreparedStatement,
    pub(super) insert_recent_replay: PreparedStatement,
    pub(super) select_recent_replays: PreparedStatement,
}

impl ReplayStatements {
    async fn prepare(p: &Preparer<'_>) -> Result<ReplayStatements, ScyllaError> {
        let ks = p.ks;
        Ok(ReplayStatements {
            insert_replay: p
                .plain(format!(
                    "INSERT INTO {ks}.replay_audit (replay_id, actor, reason, at, scope, count, \
                     dry_run, tenant, asked_by) VALUES (:replay_id, :actor, :reason, :at, \
                     :scope, :count, :dry_run, :tenant, :asked_by) USING TTL :ttl"
                ))
                .await?,
            insert_recent_replay: p
                .plain(format!(
                    "INSERT INTO {ks}.recent_replays (feed, at, replay_id, actor, reason, \
                     scope, count, dry_run, tenant, asked_by) VALUES (:feed, :at, :replay_id, \
                     :actor, :reason, :scope, :count, :dry_run, :tenant, :asked_by) \
                     USING TTL :ttl"
                ))
                .await?,
            select_recent_replays: p
                .plain(format!(
                    "SELECT replay_id, actor, reason, at, scope, count, dry_run, tenant, \
                     asked_by FROM {ks}.recent_replays WHERE feed = ? LIMIT ?"
                ))
                .await?,
        })
    }
}

/// Statements on `replay_marks` and, as lightweight transactions, `replay_claims`.
pub(super) struct ClaimStatements {
    pub(super) insert_replay_mark: PreparedStatement,
    pub(super) select_replay_mark: PreparedStatement,
    pub(super) select_replay_claim: PreparedStatement,
    pub(super) insert_replay_claim: PreparedStatement,
    pub(super) update_replay_claim: PreparedStatement,
}

impl ClaimStatements {
    async fn prepare(p: &Preparer<'_>) -> Result<ClaimStatements, ScyllaError> {
        let ks = p.ks;
        Ok(ClaimStatements {
            insert_replay_mark: p
                .plain(format!(
                    "INSERT INTO {ks}.replay_marks (delivery_id, replay_id, at) \
                     VALUES (:delivery_id, :replay_id, :at) USING TTL :ttl"
                ))
                .await?,
            select_replay_mark: p
                .plain(format!(
                    "SELECT replay_id, at FROM {ks}.replay_marks WHERE delivery_id = ?"
                ))
                .await?,
            select_replay_claim: p
                .serial_read(format!(
                    "SELECT replay_id, at FROM {ks}.replay_claims WHERE delivery_id = ?"
                ))
                .await?,
            insert_replay_claim: p
                .serial_write(format!(
                    "INSERT INTO {ks}.replay_claims (delivery_id, replay_id, at) \
                     VALUES (:delivery_id, :replay_id, :at) IF NOT EXISTS USING TTL :ttl"
                ))
                .await?,
            update_replay_claim: p
                .serial_write(format!(
                    "UPDATE {ks}.replay_claims USING TTL :ttl SET replay_id = :replay_id, \
                     at = :at WHERE delivery_id = :delivery_id IF replay_id = :over"
                ))
                .await?,
        })
    }
}
