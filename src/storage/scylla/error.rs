//! How the CQL store's failures are told: [`ScyllaError`] when the store cannot be set up, and
//! the mapping of the driver's request errors onto [`StoreError`], which tells a cluster that
//! did not answer ([`StoreError::Unavailable`]) from one that answered wrongly
//! ([`StoreError::Backend`]).

use std::time::Duration;

use scylla::errors::{
    DbError, ExecutionError, NextRowError, PagerExecutionError, RequestAttemptError,
};

use super::ConfigError;
use crate::storage::StoreError;

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

/// A row this store wrote that it cannot read back.
pub(super) fn corrupt(what: &str, id: &str) -> StoreError {
    StoreError::Backend(format!("unreadable {what} row for {id}"))
}

/// Errors that mean "the cluster did not answer in time or at all" become
/// [`StoreError::Unavailable`]; the rest [`StoreError::Backend`]. The pipeline retries both, the
/// distinction is for operators.
pub(super) fn exec_error(e: ExecutionError) -> StoreError {
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

/// Whether one attempt of a request failed for want of an answer rather than with one.
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

/// A paged read that failed: a page that did not come is [`StoreError::Unavailable`].
pub(super) fn pager_error(e: PagerExecutionError) -> StoreError {
    match e {
        PagerExecutionError::NextPageError(_) => StoreError::Unavailable(e.to_string()),
        _ => StoreError::Backend(e.to_string()),
    }
}

/// A result the driver could not read as the expected rows and types: [`StoreError::Backend`].
pub(super) fn backend_error(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

/// A failed row of a paged read: a page that did not come is [`StoreError::Unavailable`].
pub(super) fn row_error(e: NextRowError) -> StoreError {
    match e {
        NextRowError::NextPageError(_) => StoreError::Unavailable(e.to_string()),
        _ => StoreError::Backend(e.to_string()),
    }
}
