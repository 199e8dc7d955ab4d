//! Setting the store up: connecting, checking that the keyspace is at this binary's schema,
//! and preparing every statement.
//!
//! At start-up [`ScyllaStore::open`] waits up to `startup_wait` for a cluster that does not
//! answer yet ([`startup`](super::startup)) and refuses at once a keyspace that
//! `hookline migrate` has not brought to this binary's schema.

use std::sync::Arc;

use scylla::client::session::Session;
use tokio::sync::Semaphore;

use super::bucket_index::{self, WrittenBuckets};
use super::entry_index::IndexCommits;
use super::session::connect_session;
use super::statement::Statements;
use super::{MAX_CQL_TTL, ScyllaConfig, ScyllaError, ScyllaStore, migrate, startup};

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
        check_schema(&session, &config.keyspace).await?;
        let st = Statements::prepare(&session, &config.keyspace).await?;
        let bucket_index_ttl = i32::try_from(
            (config.attempt_ttl + bucket_index::SLACK)
                .min(MAX_CQL_TTL)
                .as_secs(),
        )
        .unwrap_or(i32::MAX);
        let permits = Arc::new(Semaphore::new(config.max_concurrent_writes));
        Ok(ScyllaStore {
            index: IndexCommits::new(&session, &st, &permits),
            session,
            st,
            permits,
            attempt_ttl: config.attempt_ttl_secs(),
            bucket_index_ttl,
            audit_ttl: config.audit_ttl_secs(),
            buckets_written: WrittenBuckets::default(),
            tenant_buckets_written: WrittenBuckets::default(),
        })
    }

    /// The session, for callers that share it (tests, the migrator).
    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }
}

/// Refuses keyspace `ks` unless `hookline migrate` has brought it to this binary's schema.
async fn check_schema(session: &Session, ks: &str) -> Result<(), ScyllaError> {
    let found = migrate::applied_versions(session, ks)
        .await
        .map_err(|e| ScyllaError::Cql(e.to_string()))?
        .iter()
        .map(|v| v.version)
        .max()
        .unwrap_or(0);
    let needed = migrate::LATEST_VERSION;
    if found < needed {
        return Err(ScyllaError::SchemaBehind {
            keyspace: ks.to_owned(),
            found,
            needed,
        });
    }
    Ok(())
}
