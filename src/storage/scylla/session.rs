//! Opening a driver session on the configured cluster: routing, consistency, timeouts, login
//! and TLS. The store and the migrator both start here.

use std::sync::Arc;

use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::errors::DbError;
use scylla::frame::types::Consistency;
use scylla::policies::load_balancing::DefaultPolicy;

use super::{ScyllaConfig, ScyllaError, tls};

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
