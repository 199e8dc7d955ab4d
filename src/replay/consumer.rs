//! Replay's consumer of the DLQ: a client that commits nothing, asks the brokers about the
//! topic first so that a wrong partition or an unreachable broker is named, and tells the read
//! errors that end a replay from those librdkafka retries by itself.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::ClientContext;
use rdkafka::client::DefaultClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::error::kafka_failure;
use super::{ReplayError, ReplayTarget};
use crate::kafka::client_config;

/// How long replay waits for the brokers to answer a metadata or offsets request.
pub(super) const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest one poll of the DLQ consumer blocks, so the idle limit is noticed on time.
pub(super) const POLL_WAIT: Duration = Duration::from_millis(500);

/// The DLQ consumer's context. Until the brokers have answered, librdkafka's reports that
/// none can be reached (errors, and FAIL log lines) are logged at debug only: replay says so
/// itself, once, as [`ReplayError::Unreachable`], and the same news at ERROR level ahead of it
/// would only repeat it. Once they have answered, losing them is news and is logged as a
/// warning; other client errors and log lines go to rdkafka's default context.
#[derive(Default)]
pub(super) struct ReplayContext {
    /// Whether the brokers have answered.
    pub(super) answered: AtomicBool,
}

impl ClientContext for ReplayContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        // Before the brokers have answered, a failed connection (facility FAIL) is the same
        // news as the error replay is about to report.
        if fac == "FAIL" && !self.answered.load(Ordering::Relaxed) {
            tracing::debug!(target: "librdkafka", "{fac} {log_message}");
        } else {
            DefaultClientContext.log(level, fac, log_message);
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if !is_unreachable(&error) {
            DefaultClientContext.error(error, reason);
        } else if self.answered.load(Ordering::Relaxed) {
            tracing::warn!(error = %error, reason, "kafka brokers unreachable");
        } else {
            tracing::debug!(error = %error, reason, "kafka brokers not reachable yet");
        }
    }
}

impl ConsumerContext for ReplayContext {}

/// Replay's DLQ consumer.
pub(super) type DlqConsumer = BaseConsumer<ReplayContext>;

/// Asks the brokers about the DLQ topic: that they answer, that the topic exists, and that it
/// has `partition`. Without this a wrong partition shows up as librdkafka's bare
/// `UnknownPartition` and a broker that is down as `AllBrokersDown`, neither naming anything.
pub(super) fn check_partition(
    consumer: &DlqConsumer,
    target: &ReplayTarget,
    partition: i32,
) -> Result<(), ReplayError> {
    let partitions = dlq_partitions(consumer, target)?;
    if partition >= partitions {
        return Err(ReplayError::NoPartition {
            topic: target.dlq.clone(),
            partitions,
            partition,
        });
    }
    Ok(())
}

/// Asks the brokers how many partitions the DLQ topic has (at least 1), with the errors of
/// [`check_partition`].
pub(super) fn dlq_partitions(
    consumer: &DlqConsumer,
    target: &ReplayTarget,
) -> Result<i32, ReplayError> {
    let metadata_error =
        |source| kafka_failure(target, format!("reading the metadata of {}", target.dlq))(source);
    let metadata =
        tokio::task::block_in_place(|| consumer.fetch_metadata(Some(&target.dlq), KAFKA_TIMEOUT))
            .map_err(|source| {
            if is_unreachable(&source) {
                ReplayError::Unreachable {
                    bootstrap: target.bootstrap.clone(),
                    source,
                }
            } else if crate::kafka::is_not_a_broker_listener(&source) {
                ReplayError::NotABrokerListener {
                    bootstrap: target.bootstrap.clone(),
                }
            } else {
                metadata_error(source)
            }
        })?;
    let missing = || ReplayError::NoDlqTopic {
        topic: target.dlq.clone(),
        bootstrap: target.bootstrap.clone(),
    };
    let topic = metadata
        .topics()
        .iter()
        .find(|t| t.name() == target.dlq)
        .ok_or_else(missing)?;
    match topic.error().map(RDKafkaErrorCode::from) {
        None => {}
        Some(RDKafkaErrorCode::UnknownTopicOrPartition) => return Err(missing()),
        Some(code) => return Err(metadata_error(KafkaError::MetadataFetch(code))),
    }
    let partitions = topic.partitions().len();
    if partitions == 0 {
        return Err(missing());
    }
    Ok(i32::try_from(partitions).unwrap_or(i32::MAX))
}

/// Whether `e` means no broker could be reached (down, wrong address, name not resolving).
fn is_unreachable(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::AllBrokersDown
                | RDKafkaErrorCode::BrokerTransportFailure
                | RDKafkaErrorCode::OperationTimedOut
                | RDKafkaErrorCode::Resolve
        )
    )
}

/// Whether a read error from the DLQ consumer ends the replay at once: the partition is gone,
/// its offsets are no longer in the log, or the replay may not read it. librdkafka backs off
/// and fetches again after any other error it reports (a broker's storage or request error,
/// a timeout), so replay waits for those, up to its idle limit.
pub(super) fn read_error_is_final(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::GroupAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed
                | RDKafkaErrorCode::OffsetOutOfRange
                | RDKafkaErrorCode::AutoOffsetReset
                | RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::UnknownPartition
        )
    )
}

/// A consumer of the DLQ that commits nothing (its group is its own).
pub(super) fn dlq_consumer(target: &ReplayTarget) -> Result<DlqConsumer, ReplayError> {
    let group = format!("hookline-replay-{}", uuid::Uuid::new_v4().simple());
    client_config(&target.bootstrap, &target.client)
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create_with_context(ReplayContext::default())
        .map_err(kafka_failure(target, "creating the DLQ consumer".into()))
}
