//! Starts the admin API next to the stages, with a readiness signal that follows Kafka.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::producer::{BaseProducer, Producer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admin::events::KafkaEventSink;
use crate::admin::{self, AdminState, UrlRules};
use crate::config::Config;
use crate::replay::KafkaReplayer;
use crate::service::{Handles, ServiceError};
use crate::ssrf::Policy;

/// How often Kafka reachability is checked for `GET /v1/health/ready`.
const PROBE_EVERY: Duration = Duration::from_secs(5);

/// Keeps `ready` at "the cluster answered a metadata request within 3 s".
fn probe_kafka(
    config: &Config,
    ready: watch::Sender<bool>,
    shutdown: CancellationToken,
    tasks: &TaskTracker,
) -> Result<(), ServiceError> {
    // The probe loses the broker with everyone else; its context logs that as the producers'
    // do, held back as it repeats.
    let probe: BaseProducer<crate::kafka::ProducerLog> =
        crate::kafka::client_config(&config.kafka.bootstrap_servers, &config.kafka.client)
            .create_with_context(crate::kafka::ProducerLog::default())?;
    let probe = Arc::new(probe);
    tasks.spawn(async move {
        loop {
            let p = probe.clone();
            let ok = tokio::task::spawn_blocking(move || {
                p.client()
                    .fetch_metadata(None, Duration::from_secs(3))
                    .is_ok()
            })
            .await
            .unwrap_or(false);
            if *ready.borrow() != ok {
                if ok {
                    tracing::info!("kafka is reachable");
                } else {
                    tracing::warn!("kafka is not reachable; readiness reports not ready");
                }
            }
            ready.send_replace(ok);
            tokio::select! {
                () = tokio::time::sleep(PROBE_EVERY) => {}
                () = shutdown.cancelled() => break,
            }
        }
    });
    Ok(())
}

/// Binds the admin API's address. Done before Kafka and the stages start, so an address in use
/// is the first and only thing said.
pub(super) fn bind(config: &Config) -> Result<TcpListener, ServiceError> {
    crate::listen::listen(config.admin.listen).map_err(|e| ServiceError::Admin {
        addr: config.admin.listen,
        detail: e.to_string(),
    })
}

/// Serves the admin API on `listener` (from [`bind`]) until `shutdown`.
pub(super) async fn serve(
    config: &Config,
    listener: TcpListener,
    handles: &Handles,
    shutdown: &CancellationToken,
    tasks: &TaskTracker,
) -> Result<(), ServiceError> {
    let (ready_tx, ready_rx) = watch::channel(false);
    probe_kafka(config, ready_tx, shutdown.clone(), tasks)?;
    let sink =
        KafkaEventSink::new(&config.kafka).map_err(|e| ServiceError::Sender(e.to_string()))?;
    let state = AdminState::new(
        handles.endpoints.clone(),
        handles.store.clone(),
        Arc::new(sink),
        config.admin.clone(),
        ready_rx,
    )
    .with_max_payload_bytes(usize::try_from(config.http.max_payload_bytes).unwrap_or(usize::MAX))
    .with_dedupe_window(config.ingest.dedupe_window)
    .with_url_rules(UrlRules {
        policy: Policy::with_allowed(config.http.allow_cidrs.iter().copied()),
        allow_http: config.http.dangerous_allow_http,
    })
    .with_replayer(Arc::new(KafkaReplayer {
        target: config.replay_target(),
        store: handles.store.clone(),
    }));
    let shutdown = shutdown.clone();
    tasks.spawn(async move {
        if let Err(e) = admin::serve(listener, state, shutdown).await {
            tracing::error!(error = %e, "admin API stopped");
        }
    });
    Ok(())
}
