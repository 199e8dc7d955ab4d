//! Replaying dead letters: republishing a range of DLQ offsets to the deliveries topic with a
//! fresh retry window and a replay id that receivers see (`hookline-replay-id`), through the
//! same lanes and limits as any delivery, with an audit entry of who, why, what and how many.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use rdkafka::ClientContext;
use rdkafka::client::DefaultClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{Message, Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use crate::deliver::outgoing;
use crate::id::EndpointId;
use crate::kafka::{client_config, producer_config};
use crate::record::DeliveryRecord;
use crate::stage::produce_until_acked;
use crate::storage::{DeliveryStore, ReplayAudit, StoreError};
use crate::telemetry;

/// What to replay.
#[derive(Debug, Clone)]
pub struct ReplayRequest {
    /// DLQ partition.
    pub partition: i32,
    /// First offset, inclusive.
    pub from_offset: i64,
    /// Last offset, inclusive.
    pub to_offset: i64,
    /// Only records for this endpoint.
    pub endpoint: Option<EndpointId>,
    /// Who asks.
    pub actor: String,
    /// Why.
    pub reason: String,
    /// Count what would be replayed, publish nothing.
    pub dry_run: bool,
}

impl ReplayRequest {
    /// Checks what needs no server: a non-negative partition, an offset range, and an actor and
    /// a reason that are not blank. Callers run it before connecting to anything, so a typo
    /// fails at once instead of after a store or broker timeout; [`replay`] runs it too.
    pub fn validate(&self) -> Result<(), ReplayError> {
        if self.partition < 0 {
            return Err(ReplayError::BadRequest(format!(
                "--partition {} is negative; DLQ partitions are numbered from 0",
                self.partition
            )));
        }
        if self.from_offset < 0 || self.to_offset < self.from_offset {
            return Err(ReplayError::BadRequest(format!(
                "--from-offset {} .. --to-offset {} is not a range (from must be >= 0 and <= to)",
                self.from_offset, self.to_offset
            )));
        }
        for (flag, value) in [("--actor", &self.actor), ("--reason", &self.reason)] {
            if value.trim().is_empty() {
                return Err(ReplayError::BadRequest(format!(
                    "{flag} must not be blank: it is recorded in the audit trail"
                )));
            }
        }
        Ok(())
    }
}

/// Where replay reads and writes.
#[derive(Debug, Clone)]
pub struct ReplayTarget {
    /// Bootstrap servers.
    pub bootstrap: String,
    /// Client overrides (`kafka.client`; secret ones redacted in `Debug`).
    pub client: crate::config::ClientProperties,
    /// The DLQ topic.
    pub dlq: String,
    /// The deliveries topic.
    pub deliveries: String,
}

/// What a replay did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplaySummary {
    /// The replay id receivers see.
    pub replay_id: String,
    /// DLQ records read in the range.
    pub scanned: u64,
    /// Records republished (or, in a dry run, that would be).
    pub replayed: u64,
    /// Records skipped by the endpoint filter.
    pub filtered: u64,
    /// Records in the range that are not hookline DLQ records (left alone).
    pub undecodable: u64,
    /// The range's last offset as replayed: `to_offset`, or the partition's last record when
    /// the replay began if that came first.
    pub last_offset: i64,
}

/// Why a replay failed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The request is inconsistent.
    #[error("{0}")]
    BadRequest(String),
    /// No broker answered.
    #[error(
        "no Kafka broker at {bootstrap} answered ({source}); {}",
        crate::kafka::UNREACHABLE_ADVICE
    )]
    Unreachable {
        /// The bootstrap servers tried.
        bootstrap: String,
        /// librdkafka's error.
        source: KafkaError,
    },
    /// Something answered at the address, but not as a broker's client listener.
    #[error("{}", crate::kafka::not_a_broker_listener(bootstrap))]
    NotABrokerListener {
        /// The bootstrap servers tried.
        bootstrap: String,
    },
    /// The brokers do not know the DLQ topic.
    #[error("DLQ topic {topic} does not exist at {bootstrap} (kafka.topics.dlq names it)")]
    NoDlqTopic {
        /// The DLQ topic.
        topic: String,
        /// The bootstrap servers asked.
        bootstrap: String,
    },
    /// The requested partition is beyond the DLQ topic's partitions.
    #[error(
        "DLQ topic {topic} has {partitions} partitions, 0 to {}; --partition {partition} does not exist",
        .partitions - 1
    )]
    NoPartition {
        /// The DLQ topic.
        topic: String,
        /// How many partitions it has (at least 1).
        partitions: i32,
        /// The partition asked for.
        partition: i32,
    },
    /// Any other Kafka failure, with what replay was doing.
    #[error("kafka at {bootstrap}: {action}: {source}")]
    Kafka {
        /// The bootstrap servers.
        bootstrap: String,
        /// What failed, e.g. "reading hookline.dlq partition 3".
        action: String,
        /// librdkafka's error (boxed: it is large, and this is not a hot path).
        source: Box<KafkaError>,
    },
    /// The DLQ partition does not hold the requested offsets.
    #[error(
        "dlq partition {partition} holds offsets {low}..{high} (exclusive end); the range {from}..={to} is not in it"
    )]
    OutOfRange {
        /// Partition.
        partition: i32,
        /// Lowest offset present.
        low: i64,
        /// Next offset to be written.
        high: i64,
        /// Requested start.
        from: i64,
        /// Requested end.
        to: i64,
    },
    /// A record could not be republished before the deadline.
    #[error("republishing to {topic} failed; {done} records were republished before it")]
    Publish {
        /// Target topic.
        topic: String,
        /// How many made it.
        done: u64,
    },
    /// The audit entry could not be written (the records were republished).
    #[error(
        "replay {replay_id} republished {replayed} records but its audit entry failed: {source}"
    )]
    Audit {
        /// The replay's id.
        replay_id: String,
        /// How many were republished.
        replayed: u64,
        /// The store's error.
        source: StoreError,
    },
}

/// How long replay waits for the brokers to answer a metadata or offsets request.
const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);

/// Turns a librdkafka error into [`ReplayError::Kafka`], naming the brokers and what replay
/// was doing (`action`).
fn kafka_failure(target: &ReplayTarget, action: String) -> impl FnOnce(KafkaError) -> ReplayError {
    let bootstrap = target.bootstrap.clone();
    move |source| ReplayError::Kafka {
        bootstrap,
        action,
        source: Box::new(source),
    }
}

/// The DLQ consumer's context. Until the brokers have answered, librdkafka's reports that
/// none can be reached (errors, and FAIL log lines) are logged at debug only: replay says so
/// itself, once, as [`ReplayError::Unreachable`], and the same news at ERROR level ahead of it
/// only repeated it. Once they have answered, losing them is news and is logged as a warning;
/// other client errors and log lines go to rdkafka's default context, as they did before.
#[derive(Default)]
struct ReplayContext {
    answered: AtomicBool,
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
type DlqConsumer = BaseConsumer<ReplayContext>;

/// Asks the brokers about the DLQ topic: that they answer, that the topic exists, and that it
/// has `partition`. Without this a wrong partition shows up as librdkafka's bare
/// `UnknownPartition` and a broker that is down as `AllBrokersDown`, neither naming anything.
fn check_partition(
    consumer: &DlqConsumer,
    target: &ReplayTarget,
    partition: i32,
) -> Result<(), ReplayError> {
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
    let partitions = i32::try_from(partitions).unwrap_or(i32::MAX);
    if partition >= partitions {
        return Err(ReplayError::NoPartition {
            topic: target.dlq.clone(),
            partitions,
            partition,
        });
    }
    Ok(())
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

/// Progress reports, one per record read.
pub trait Progress {
    /// `done` of `total` records read.
    fn update(&mut self, done: u64, total: u64);
}

impl<F: FnMut(u64, u64)> Progress for F {
    fn update(&mut self, done: u64, total: u64) {
        self(done, total)
    }
}

/// A fresh replay id (`rpl_` + UUIDv7).
pub fn new_replay_id() -> String {
    format!("rpl_{}", uuid::Uuid::now_v7().simple())
}

/// Replays `request` and records its audit entry in `store`: [`check`], then [`Checked::run`].
pub async fn replay(
    target: &ReplayTarget,
    request: &ReplayRequest,
    store: &dyn DeliveryStore,
    progress: &mut dyn Progress,
) -> Result<ReplaySummary, ReplayError> {
    check(target, request).await?.run(store, progress).await
}

/// A replay whose range the brokers confirmed, with its DLQ consumer assigned to the first
/// offset. The command line opens the store between [`check`] and [`Checked::run`], so a wrong
/// partition or offset is named at once even when the store would take its whole start-up
/// wait to answer, and the audit entry's store is known to open before anything is
/// republished.
pub struct Checked<'a> {
    target: &'a ReplayTarget,
    request: &'a ReplayRequest,
    consumer: DlqConsumer,
    /// The last offset to read: `to_offset`, or the partition's last record if that is lower.
    last: i64,
    /// How many offsets lie in `from_offset..=last`.
    total: u64,
}

/// Checks `request` locally ([`ReplayRequest::validate`]), then with the brokers: the DLQ topic
/// and partition exist and hold `from_offset`.
pub async fn check<'a>(
    target: &'a ReplayTarget,
    request: &'a ReplayRequest,
) -> Result<Checked<'a>, ReplayError> {
    request.validate()?;
    let group = format!("hookline-replay-{}", uuid::Uuid::new_v4().simple());
    let kafka = |action: String| kafka_failure(target, action);
    let consumer: DlqConsumer = client_config(&target.bootstrap, &target.client)
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create_with_context(ReplayContext::default())
        .map_err(kafka("creating the DLQ consumer".into()))?;
    check_partition(&consumer, target, request.partition)?;
    consumer.context().answered.store(true, Ordering::Relaxed);
    let (low, high) = tokio::task::block_in_place(|| {
        consumer.fetch_watermarks(&target.dlq, request.partition, KAFKA_TIMEOUT)
    })
    .map_err(kafka(format!(
        "reading the offsets of {} partition {}",
        target.dlq, request.partition
    )))?;
    if request.from_offset < low || request.from_offset >= high {
        return Err(ReplayError::OutOfRange {
            partition: request.partition,
            low,
            high,
            from: request.from_offset,
            to: request.to_offset,
        });
    }
    let last = request.to_offset.min(high - 1);
    let total = u64::try_from(last - request.from_offset + 1).unwrap_or(0);
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(
        &target.dlq,
        request.partition,
        Offset::Offset(request.from_offset),
    )
    .and_then(|()| consumer.assign(&tpl))
    .map_err(kafka(reading(target, request)))?;
    Ok(Checked {
        target,
        request,
        consumer,
        last,
        total,
    })
}

/// What replay is doing while it reads the DLQ, for its errors.
fn reading(target: &ReplayTarget, request: &ReplayRequest) -> String {
    format!("reading {} partition {}", target.dlq, request.partition)
}

impl Checked<'_> {
    /// Republishes the checked range (unless a dry run) and records the audit entry in `store`.
    pub async fn run(
        self,
        store: &dyn DeliveryStore,
        progress: &mut dyn Progress,
    ) -> Result<ReplaySummary, ReplayError> {
        let Checked {
            target,
            request,
            consumer,
            last,
            total,
        } = self;
        let replay_id = new_replay_id();
        let kafka = |action: String| kafka_failure(target, action);
        let reading = reading(target, request);
        let producer: crate::kafka::Producer = producer_config(&target.bootstrap, &target.client)
            .create_with_context(crate::kafka::ProducerLog::default())
            .map_err(kafka("creating the producer".into()))?;
        let deliveries: Arc<str> = Arc::from(target.deliveries.as_str());
        let never = CancellationToken::new();
        let publish_deadline = Duration::from_secs(60);
        let mut summary = ReplaySummary {
            replay_id: replay_id.clone(),
            scanned: 0,
            replayed: 0,
            filtered: 0,
            undecodable: 0,
            last_offset: last,
        };
        let mut next = request.from_offset;
        let mut idle_polls = 0;
        while next <= last {
            // The consumer's poll blocks; keep it off the async workers' backs.
            let polled = tokio::task::block_in_place(|| consumer.poll(Duration::from_millis(500)));
            let Some(polled) = polled else {
                idle_polls += 1;
                if idle_polls > 20 {
                    break;
                }
                continue;
            };
            idle_polls = 0;
            let msg = match polled {
                Ok(m) => m,
                Err(KafkaError::PartitionEOF(_)) => break,
                Err(e) => return Err(kafka(reading)(e)),
            };
            next = msg.offset() + 1;
            if msg.offset() > last {
                break;
            }
            summary.scanned += 1;
            progress.update(summary.scanned, total);
            let record = match DeliveryRecord::from_message(&msg) {
                Ok(r) if r.dead.is_some() => r,
                _ => {
                    summary.undecodable += 1;
                    continue;
                }
            };
            if request
                .endpoint
                .as_ref()
                .is_some_and(|e| *e != record.endpoint_id)
            {
                summary.filtered += 1;
                continue;
            }
            summary.replayed += 1;
            if request.dry_run {
                continue;
            }
            let out = outgoing(deliveries.clone(), &record.for_replay(replay_id.clone()));
            let sent = tokio::time::timeout(
                publish_deadline,
                produce_until_acked(&producer, out, &never),
            )
            .await;
            if !matches!(sent, Ok(true)) {
                return Err(ReplayError::Publish {
                    topic: target.deliveries.clone(),
                    done: summary.replayed - 1,
                });
            }
        }
        if !request.dry_run {
            telemetry::replayed(summary.replayed);
        }
        let scope = format!(
            "{} partition {} offsets {}..={}{}{}",
            target.dlq,
            request.partition,
            request.from_offset,
            last,
            if request.to_offset > last {
                format!(
                    " (asked up to {}; the partition ended there)",
                    request.to_offset
                )
            } else {
                String::new()
            },
            request
                .endpoint
                .as_ref()
                .map(|e| format!(", endpoint {e}"))
                .unwrap_or_default()
        );
        let audit = ReplayAudit {
            replay_id: replay_id.clone(),
            actor: request.actor.clone(),
            reason: request.reason.clone(),
            at: SystemTime::now(),
            scope,
            count: summary.replayed,
            dry_run: request.dry_run,
        };
        store
            .record_replay(&audit)
            .await
            .map_err(|source| ReplayError::Audit {
                replay_id,
                replayed: summary.replayed,
                source,
            })?;
        tracing::info!(replay_id = %audit.replay_id, actor = %audit.actor, reason = %audit.reason,
            scope = %audit.scope, count = audit.count, dry_run = audit.dry_run, "replay recorded");
        Ok(summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> ReplayRequest {
        ReplayRequest {
            partition: 3,
            from_offset: 10,
            to_offset: 20,
            endpoint: None,
            actor: "oncall".into(),
            reason: "receiver fixed".into(),
            dry_run: false,
        }
    }

    fn problem(request: ReplayRequest) -> String {
        request
            .validate()
            .expect_err("the request should be refused")
            .to_string()
    }

    #[test]
    fn the_target_keeps_secret_client_properties_out_of_debug() {
        let target = ReplayTarget {
            bootstrap: "kafka:9092".into(),
            client: std::collections::BTreeMap::from([
                ("sasl.password".to_owned(), "supersecret_sasl".to_owned()),
                ("sasl.username".to_owned(), "replayer".to_owned()),
            ])
            .into(),
            dlq: "hookline.dlq".into(),
            deliveries: "hookline.deliveries".into(),
        };
        let dbg = format!("{target:?}");
        assert!(!dbg.contains("supersecret"), "{dbg}");
        assert!(dbg.contains("\"sasl.password\": \"<redacted>\""), "{dbg}");
        assert!(dbg.contains("\"sasl.username\": \"replayer\""), "{dbg}");
    }

    #[test]
    fn a_sound_request_passes_including_a_single_offset() {
        request().validate().unwrap();
        ReplayRequest {
            partition: 0,
            from_offset: 0,
            to_offset: 0,
            ..request()
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn each_local_mistake_is_named() {
        for (broken, expected) in [
            (
                ReplayRequest {
                    partition: -1,
                    ..request()
                },
                "--partition -1 is negative; DLQ partitions are numbered from 0",
            ),
            (
                ReplayRequest {
                    from_offset: 5,
                    to_offset: 1,
                    ..request()
                },
                "--from-offset 5 .. --to-offset 1 is not a range (from must be >= 0 and <= to)",
            ),
            (
                ReplayRequest {
                    from_offset: -2,
                    ..request()
                },
                "--from-offset -2 .. --to-offset 20 is not a range (from must be >= 0 and <= to)",
            ),
            (
                ReplayRequest {
                    actor: " \t".into(),
                    ..request()
                },
                "--actor must not be blank: it is recorded in the audit trail",
            ),
            (
                ReplayRequest {
                    reason: String::new(),
                    ..request()
                },
                "--reason must not be blank: it is recorded in the audit trail",
            ),
        ] {
            assert_eq!(problem(broken), expected);
        }
    }
}
