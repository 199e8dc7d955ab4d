//! Replaying dead letters: republishing a range of DLQ offsets to the deliveries topic with a
//! fresh retry window and a replay id that receivers see (`hookline-replay-id`), through the
//! same lanes and limits as any delivery, with an audit entry of who, why, what and how many.
//! Each delivery is claimed before it is republished, and one that another replay is sending
//! at that moment is left to it, so that two replays at once send it once.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use rdkafka::ClientContext;
use rdkafka::client::DefaultClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{Message, Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use crate::id::{EndpointId, Tenant};
use crate::kafka::{client_config, producer_config, refused_for_good};
use crate::record::DeliveryRecord;
use crate::stage::outgoing;
use crate::stage::{Produced, produce_unless_refused};
use crate::storage::{DeliveryStore, ReplayAudit, ReplayMark, StoreError};
use crate::telemetry;

mod api;
mod scan;

pub use api::{
    ApiReplayer, CLAIM_LIMIT, DeliveryReplay, DlqPosition, ENDPOINT_SCAN_LIMIT, EndpointReplay,
    EndpointReplayRequest, KafkaReplayer, LOCATE_LIMIT, Standing, locate, refusal, replay_delivery,
    replay_endpoint, standing,
};

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
    pub client: crate::kafka::ClientProperties,
    /// The DLQ topic.
    pub dlq: String,
    /// The deliveries topic.
    pub deliveries: String,
}

/// What a replay did (the admin API answers with it).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReplaySummary {
    /// The replay id receivers see.
    pub replay_id: String,
    /// DLQ records read in the range.
    pub scanned: u64,
    /// Records republished (or, in a dry run, that would be).
    pub replayed: u64,
    /// Records skipped by the endpoint filter.
    pub filtered: u64,
    /// Records in the range that are not hookline DLQ records (left alone); named as
    /// `hookline replay` prints it.
    #[serde(rename = "skipped_not_dead_letters")]
    pub undecodable: u64,
    /// Records whose delivery another replay was sending at that moment (republished by it
    /// and not attempted yet, or claimed by it): left to that replay, so that it is sent once.
    pub skipped_being_replayed: u64,
    /// The range's last offset as replayed: `to_offset`, or the partition's last record when
    /// the replay began if that came first. A replay that stops short of it is an error,
    /// [`ReplayError::Incomplete`], never a summary.
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
    /// A dead delivery's DLQ record was not found where it should be.
    #[error(
        "the dead letter of delivery {delivery} is not in {dlq}: it is past the topic's \
         retention, or the delivery stage stopped before writing it (it then sends the delivery \
         again when it restarts)"
    )]
    DeadLetterGone {
        /// The delivery.
        delivery: String,
        /// The DLQ topic.
        dlq: String,
    },
    /// Looking for a dead delivery's DLQ record took too long.
    #[error(
        "looking for the dead letter of delivery {delivery} in {dlq} took over {}s: the brokers \
         are slow or the DLQ is large around that time; retry, or replay by offset with \
         `hookline replay`",
        .limit.as_secs()
    )]
    NotLocated {
        /// The delivery.
        delivery: String,
        /// The DLQ topic.
        dlq: String,
        /// How long it looked.
        limit: Duration,
    },
    /// The replay stopped before the end of its range (a read failed or went quiet, or a
    /// record was not acknowledged); what it republished up to there is in its audit entry.
    #[error(transparent)]
    Incomplete(Box<Incomplete>),
    /// hookline did not log where a delivered delivery's record is (attempts logged before it
    /// kept that), so it cannot be sent again.
    #[error(
        "delivery {delivery} was delivered before hookline logged where each attempt's record \
         is in the deliveries topic, so it cannot be sent again"
    )]
    RecordNotKept {
        /// The delivery.
        delivery: String,
    },
    /// A delivered delivery's record is no longer in the deliveries topic.
    #[error(
        "the record delivery {delivery} was last sent from ({topic} partition {} offset {}) is \
         past the topic's retention: a delivered delivery can be sent again only while its \
         record is kept",
        .at.partition, .at.offset
    )]
    RecordGone {
        /// The delivery.
        delivery: String,
        /// The deliveries topic.
        topic: String,
        /// Where the record was.
        at: crate::storage::RecordPosition,
    },
    /// One record did not arrive in time.
    #[error("{what} took over {}s: the brokers are slow or away; retry", .limit.as_secs())]
    NotRead {
        /// What replay was reading.
        what: String,
        /// How long it waited.
        limit: Duration,
    },
    /// The deliveries topic refused a republished record for good (larger than it takes, say);
    /// its claim holds the delivery until [`CLAIM_LIMIT`].
    #[error(
        "{topic} refused the replayed record ({source}), and would refuse it again: nothing \
         was written; the error names what the topic or the brokers do not take"
    )]
    RefusedByTopic {
        /// The deliveries topic.
        topic: String,
        /// librdkafka's error (boxed: it is large, and this is not a hot path).
        source: Box<KafkaError>,
    },
    /// The deliveries topic did not acknowledge a republished record in time.
    #[error(
        "{topic} did not acknowledge the replayed record within {}s: it may still arrive; the \
         delivery's attempts will show it, and it can be replayed again in {}s",
        .deadline.as_secs(),
        CLAIM_LIMIT.as_secs()
    )]
    NotAcknowledged {
        /// The deliveries topic.
        topic: String,
        /// How long replay waited.
        deadline: Duration,
    },
    /// The delivery cannot be replayed now: it is not dead, or another replay is sending it
    /// (the message says which, and when to ask again).
    #[error("{0}")]
    Refused(String),
    /// The attempt log did not answer while replay checked or claimed a delivery; nothing was
    /// republished.
    #[error("the attempt log did not answer, so nothing was replayed: {0}")]
    Store(StoreError),
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

/// A replay that stopped before the end of its range. Its message says where it stopped, why,
/// what was republished (and audited), and the flags that replay the rest.
#[derive(Debug)]
pub struct Incomplete {
    /// The replay's id.
    pub replay_id: String,
    /// The DLQ topic.
    pub dlq: String,
    /// The DLQ partition.
    pub partition: i32,
    /// The first offset asked for.
    pub from_offset: i64,
    /// The last offset asked for.
    pub to_offset: i64,
    /// The first offset not replayed: everything before it in the range was read and
    /// republished (or filtered, or skipped as not a dead letter); a new replay resumes here.
    pub resume_from: i64,
    /// Records republished before the stop (in a dry run, counted), `replayed_past` included.
    pub replayed: u64,
    /// Of those, the records after `resume_from`: a replay sends several records at once, and
    /// those that were on their way when one failed were republished all the same. A replay
    /// resumed at `resume_from` sends them again (with the same `webhook-id`) unless their
    /// first replay's attempts are still to come.
    pub replayed_past: u64,
    /// Whether this was a dry run.
    pub dry_run: bool,
    /// Why it stopped.
    pub cause: StopCause,
    /// The audit store's error, if it did not take the entry either.
    pub audit_error: Option<StoreError>,
}

/// Why a replay stopped before the end of its range.
#[derive(Debug)]
pub enum StopCause {
    /// No record arrived for this long (the partition's leader moving, a slow broker).
    Idle(Duration),
    /// The DLQ consumer reported an error.
    Read {
        /// The bootstrap servers.
        bootstrap: String,
        /// librdkafka's error.
        source: KafkaError,
    },
    /// The attempt log did not answer when replay claimed the delivery at `resume_from`.
    Claim(StoreError),
    /// The deliveries topic did not acknowledge the record at `resume_from` in time.
    Publish {
        /// The deliveries topic.
        topic: String,
        /// How long the record was given.
        deadline: Duration,
    },
    /// The deliveries topic refused the record at `resume_from` for good (larger than it
    /// takes, say); nothing was written for it.
    Refused {
        /// The deliveries topic.
        topic: String,
        /// librdkafka's error.
        source: KafkaError,
    },
}

impl StopCause {
    /// The cause in a few words, for the audit entry's scope, given the offset it stopped at.
    fn describe(&self, at: i64) -> String {
        match self {
            StopCause::Idle(limit) => format!(
                "no record arrived for {}: the partition's leader may be moving or its broker slow",
                humantime::format_duration(*limit)
            ),
            StopCause::Read { bootstrap, source } => {
                format!("reading it from Kafka at {bootstrap} failed: {source}")
            }
            StopCause::Claim(e) => format!(
                "the attempt log did not answer when offset {at}'s delivery was claimed ({e}); \
                 nothing was sent for it"
            ),
            StopCause::Publish { topic, deadline } => format!(
                "{topic} did not acknowledge offset {at} within {}",
                humantime::format_duration(*deadline)
            ),
            StopCause::Refused { topic, source } => format!(
                "{topic} refused offset {at} ({source}), and would refuse it again; nothing was \
                 written for it"
            ),
        }
    }
}

impl fmt::Display for Incomplete {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Incomplete {
            replay_id,
            dlq,
            partition,
            from_offset,
            to_offset,
            resume_from,
            replayed,
            replayed_past,
            dry_run,
            cause,
            audit_error,
        } = self;
        write!(
            f,
            "replay {replay_id} of {dlq} partition {partition} offsets {from_offset}..={to_offset} \
             stopped before offset {resume_from}: {}",
            cause.describe(*resume_from)
        )?;
        if let StopCause::Publish { .. } = cause {
            // Timed out is not refused: the broker may still write it.
            f.write_str(
                " (the producer's errors are logged above; should the record be written late \
                 after all, resuming delivers it twice, with the same webhook-id); ",
            )?;
        } else {
            f.write_str("; ")?;
        }
        let (verb, prep) = if *dry_run {
            ("counted", "to replay in")
        } else {
            ("republished", "from")
        };
        let before = replayed - replayed_past;
        if resume_from > from_offset {
            write!(
                f,
                "it {verb} {before} records {prep} offsets {from_offset}..={}",
                resume_from - 1
            )?;
        } else if *replayed_past == 0 {
            write!(f, "it {verb} nothing")?;
        } else {
            write!(f, "it {verb} nothing before it")?;
        }
        if *replayed_past > 0 {
            write!(
                f,
                " and {}, under way when it stopped",
                past_count(*replayed_past, *resume_from)
            )?;
        }
        match audit_error {
            None => f.write_str(", as its audit entry records")?,
            Some(e) => write!(
                f,
                ", but its audit entry could not be written ({e}): keep this message as the \
                 record of it"
            )?,
        }
        if *replayed_past > 0 {
            write!(
                f,
                ". Offsets {resume_from}..={to_offset} were not all replayed; to replay them, run \
                 it again with --partition {partition} --from-offset {resume_from} --to-offset \
                 {to_offset} (what it republished after offset {resume_from} is sent again, with \
                 the same webhook-id, unless its attempts are still to come)"
            )
        } else {
            write!(
                f,
                ". Offsets {resume_from}..={to_offset} were not replayed; to replay them, run it \
                 again with --partition {partition} --from-offset {resume_from} --to-offset \
                 {to_offset}"
            )
        }
    }
}

impl std::error::Error for Incomplete {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.cause {
            StopCause::Read { source, .. } | StopCause::Refused { source, .. } => Some(source),
            StopCause::Claim(source) => Some(source),
            _ => self
                .audit_error
                .as_ref()
                .map(|e| e as &(dyn std::error::Error + 'static)),
        }
    }
}

/// How long replay waits for the brokers to answer a metadata or offsets request.
const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);

/// How long replay waits for the DLQ's next record before it stops and reports the range
/// incomplete, unless [`Checked::idle_limit`] says otherwise.
pub const IDLE_LIMIT: Duration = Duration::from_secs(10);

/// How long one republished record may take to be acknowledged by the deliveries topic before
/// replay stops, unless [`Checked::publish_deadline`] says otherwise.
pub const PUBLISH_DEADLINE: Duration = Duration::from_secs(60);

/// The longest one poll of the DLQ consumer blocks, so the idle limit is noticed on time.
const POLL_WAIT: Duration = Duration::from_millis(500);

/// How many dead letters a replay of a range claims and republishes at once, unless
/// [`Checked::window`] says otherwise. One at a time, each record waits for its claim (a
/// lightweight transaction in the CQL store), the broker's acknowledgement and its note in
/// the store, one after the other.
pub const WINDOW: usize = 64;

/// How far past the lowest offset still being sent the reader may go, in windows: a failure
/// then leaves at most this many windows of records sent past the offset a resumed replay
/// starts at.
const SPAN_WINDOWS: usize = 4;

/// How long the reader waits for a send to finish when the DLQ has nothing for it at once.
const SEND_STEP: Duration = Duration::from_millis(5);

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
fn dlq_partitions(consumer: &DlqConsumer, target: &ReplayTarget) -> Result<i32, ReplayError> {
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
fn read_error_is_final(e: &KafkaError) -> bool {
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
    /// See [`Checked::idle_limit`].
    idle_limit: Duration,
    /// See [`Checked::publish_deadline`].
    publish_deadline: Duration,
    /// See [`Checked::window`].
    window: usize,
}

/// Checks `request` locally ([`ReplayRequest::validate`]), then with the brokers: the DLQ topic
/// and partition exist and hold `from_offset`.
pub async fn check<'a>(
    target: &'a ReplayTarget,
    request: &'a ReplayRequest,
) -> Result<Checked<'a>, ReplayError> {
    request.validate()?;
    let kafka = |action: String| kafka_failure(target, action);
    let consumer = dlq_consumer(target)?;
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
        idle_limit: IDLE_LIMIT,
        publish_deadline: PUBLISH_DEADLINE,
        window: WINDOW,
    })
}

/// A consumer of the DLQ that commits nothing (its group is its own).
fn dlq_consumer(target: &ReplayTarget) -> Result<DlqConsumer, ReplayError> {
    let group = format!("hookline-replay-{}", uuid::Uuid::new_v4().simple());
    client_config(&target.bootstrap, &target.client)
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create_with_context(ReplayContext::default())
        .map_err(kafka_failure(target, "creating the DLQ consumer".into()))
}

/// What replay is doing while it reads the DLQ, for its errors.
fn reading(target: &ReplayTarget, request: &ReplayRequest) -> String {
    format!("reading {} partition {}", target.dlq, request.partition)
}

impl Checked<'_> {
    /// Sets how long replay waits for the DLQ's next record (the partition's leader moving, a
    /// slow broker) before it stops and reports the range incomplete; [`IDLE_LIMIT`] unless set.
    pub fn idle_limit(mut self, limit: Duration) -> Self {
        self.idle_limit = limit;
        self
    }

    /// Sets how long one record may take to be acknowledged by the deliveries topic before
    /// replay stops and reports the range incomplete; [`PUBLISH_DEADLINE`] unless set.
    pub fn publish_deadline(mut self, deadline: Duration) -> Self {
        self.publish_deadline = deadline;
        self
    }

    /// Sets how many records replay claims and republishes at once; [`WINDOW`] unless set, 1
    /// to send them one after the other.
    pub fn window(mut self, records: usize) -> Self {
        self.window = records.max(1);
        self
    }

    /// Republishes the checked range (unless a dry run) and records the audit entry in `store`.
    /// A replay that stops short of the range's end fails with [`ReplayError::Incomplete`],
    /// after recording an audit entry for the part it covered.
    pub async fn run<P: Progress + ?Sized>(
        self,
        store: &dyn DeliveryStore,
        progress: &mut P,
    ) -> Result<ReplaySummary, ReplayError> {
        let Checked {
            target,
            request,
            consumer,
            last,
            total,
            idle_limit,
            publish_deadline,
            window,
        } = self;
        let replay_id = new_replay_id();
        let republisher = Republisher::new(target)?;
        let mut summary = ReplaySummary {
            replay_id: replay_id.clone(),
            scanned: 0,
            replayed: 0,
            filtered: 0,
            undecodable: 0,
            skipped_being_replayed: 0,
            last_offset: last,
        };
        // The first offset the reader has not read: past every record read, each of them
        // covered (filtered, skipped, counted) or among `window`'s sends.
        let mut next = request.from_offset;
        let mut heard_at = Instant::now();
        let mut covered = Covered::default();
        let mut window = Window::new(window);
        let mut sends = FuturesUnordered::new();
        // The latest error the consumer reported since the last record: librdkafka goes on
        // fetching after most of them, so they stop the replay only once it has gone idle.
        let mut failing: Option<KafkaError> = None;
        let read_stop = loop {
            // Take in the sends that finished; after a failed one, read no further.
            while let Some(Some((offset, sent))) = sends.next().now_or_never() {
                window.settle(offset, sent, &mut summary, &mut covered);
            }
            if window.failed.is_some() || next > last {
                break None;
            }
            if window.is_full(next) {
                // Waiting for a send is not waiting for the DLQ: it does not count towards the
                // idle limit.
                let waiting = Instant::now();
                if let Some((offset, sent)) = sends.next().await {
                    window.settle(offset, sent, &mut summary, &mut covered);
                }
                heard_at += waiting.elapsed();
                continue;
            }
            let busy = !sends.is_empty();
            let wait = if busy {
                Duration::ZERO
            } else {
                idle_limit.saturating_sub(heard_at.elapsed()).min(POLL_WAIT)
            };
            // The consumer's poll blocks; keep it off the async workers' backs.
            let read_failed = |source| StopCause::Read {
                bootstrap: target.bootstrap.clone(),
                source,
            };
            let msg = match tokio::task::block_in_place(|| consumer.poll(wait)) {
                Some(Ok(m)) => m,
                Some(Err(source)) if read_error_is_final(&source) => {
                    break Some(read_failed(source));
                }
                // Nothing yet; the end of partition before `last`, which is the end of what the
                // replica being read holds so far (a follower behind its leader); or an error
                // librdkafka retries by itself. The rest of the range may still come, within
                // the idle limit; past it, the replay stops on the last such error, if any.
                polled => {
                    if let Some(Err(source)) = polled
                        && !matches!(source, KafkaError::PartitionEOF(_))
                    {
                        tracing::warn!(error = %source, partition = request.partition, offset = next,
                            "reading the DLQ failed; retrying");
                        failing = Some(source);
                    }
                    if heard_at.elapsed() >= idle_limit {
                        break Some(
                            failing
                                .take()
                                .map_or(StopCause::Idle(idle_limit), read_failed),
                        );
                    }
                    if busy {
                        // Nothing to read at once: give the sends a moment instead.
                        let step = idle_limit.saturating_sub(heard_at.elapsed()).min(SEND_STEP);
                        if let Ok(Some((offset, sent))) =
                            tokio::time::timeout(step, sends.next()).await
                        {
                            window.settle(offset, sent, &mut summary, &mut covered);
                        }
                    }
                    continue;
                }
            };
            heard_at = Instant::now();
            failing = None;
            next = msg.offset() + 1;
            if msg.offset() > last {
                break None;
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
            if request.dry_run {
                summary.replayed += 1;
                covered.add(&record.tenant);
                continue;
            }
            let offset = msg.offset();
            window.in_flight.insert(offset);
            let (republisher, replay_id) = (&republisher, replay_id.as_str());
            sends.push(async move {
                let sent = send(store, republisher, record, replay_id, publish_deadline).await;
                (offset, sent)
            });
        };
        // Let the sends under way finish: each was claimed, and may already be on its way.
        while let Some((offset, sent)) = sends.next().await {
            window.settle(offset, sent, &mut summary, &mut covered);
        }
        drop(sends);
        // A failed send stops the replay at its offset, below anything the reader reached.
        let (stop, past) = match window.failed.take() {
            Some((offset, cause)) => {
                next = offset;
                let past = window.sent_past(offset);
                (Some(cause), past)
            }
            None => (read_stop, 0),
        };
        if !request.dry_run {
            telemetry::replayed(summary.replayed);
        }
        let audit = ReplayAudit {
            replay_id: replay_id.clone(),
            actor: request.actor.clone(),
            reason: request.reason.clone(),
            at: SystemTime::now(),
            scope: scope(
                target,
                request,
                last,
                stop.as_ref().map(|cause| (cause, next, past)),
            ),
            count: summary.replayed,
            dry_run: request.dry_run,
            // A range of DLQ offsets may hold many tenants' deliveries: it is theirs to read
            // only when it held one tenant's alone (an endpoint's, say).
            tenant: covered.tenant(),
        };
        let recorded = record_audit(store, &audit).await;
        match (stop, recorded) {
            (None, Ok(())) => Ok(summary),
            (None, Err(source)) => Err(ReplayError::Audit {
                replay_id,
                replayed: summary.replayed,
                source,
            }),
            (Some(cause), recorded) => Err(ReplayError::Incomplete(Box::new(Incomplete {
                replay_id,
                dlq: target.dlq.clone(),
                partition: request.partition,
                from_offset: request.from_offset,
                to_offset: request.to_offset,
                resume_from: next,
                replayed: summary.replayed,
                replayed_past: past,
                dry_run: request.dry_run,
                cause,
                audit_error: recorded.err(),
            }))),
        }
    }
}

/// The tenants whose deliveries a replay of a range republished (or, in a dry run, counted).
#[derive(Debug, Default)]
enum Covered {
    /// None yet.
    #[default]
    Nobody,
    /// One tenant's alone.
    One(Tenant),
    /// More than one tenant's.
    Several,
}

impl Covered {
    fn add(&mut self, tenant: &Tenant) {
        match self {
            Covered::Nobody => *self = Covered::One(tenant.clone()),
            Covered::One(one) if one != tenant => *self = Covered::Several,
            _ => {}
        }
    }

    /// The tenant the audit entry names: the one whose deliveries alone it covered.
    fn tenant(self) -> Option<Tenant> {
        match self {
            Covered::One(tenant) => Some(tenant),
            Covered::Nobody | Covered::Several => None,
        }
    }
}

/// How one dead letter's send ended.
enum Sent {
    /// Claimed and republished, for this tenant.
    Replayed(Tenant),
    /// Another replay is sending it: left to that one.
    LeftToAnother,
    /// The claim or the republish failed: the replay stops at this record.
    Failed(StopCause),
}

/// Claims `record`'s delivery for replay `replay_id` and republishes it.
async fn send(
    store: &dyn DeliveryStore,
    republisher: &Republisher,
    record: DeliveryRecord,
    replay_id: &str,
    deadline: Duration,
) -> Sent {
    match api::claim_in_range(store, &record.delivery_id, replay_id).await {
        Ok(true) => {}
        Ok(false) => {
            tracing::info!(delivery = %record.delivery_id, replay_id,
                "another replay is sending this delivery; left to it");
            return Sent::LeftToAnother;
        }
        Err(e) => return Sent::Failed(StopCause::Claim(e)),
    }
    let tenant = record.tenant.clone();
    let topic = || republisher.deliveries.to_string();
    match republisher
        .republish(record, replay_id, deadline, store)
        .await
    {
        Republished::Yes => Sent::Replayed(tenant),
        Republished::Refused(source) => Sent::Failed(StopCause::Refused {
            topic: topic(),
            source,
        }),
        Republished::NotAcknowledged => Sent::Failed(StopCause::Publish {
            topic: topic(),
            deadline,
        }),
    }
}

/// The sends of a replay of a range that are under way, by DLQ offset.
struct Window {
    /// At most this many at once.
    limit: usize,
    /// And none this far or further past the lowest under way.
    span: i64,
    in_flight: BTreeSet<i64>,
    /// Republished offsets above an offset still in flight, or above one that failed: sent
    /// past where the replay may stop. Fewer than `span` of them.
    ahead: BTreeSet<i64>,
    /// The lowest offset whose send failed, and why.
    failed: Option<(i64, StopCause)>,
}

impl Window {
    /// Room for `limit` sends at once (at least 1).
    fn new(limit: usize) -> Window {
        let limit = limit.max(1);
        Window {
            limit,
            span: i64::try_from(limit.saturating_mul(SPAN_WINDOWS)).unwrap_or(i64::MAX),
            in_flight: BTreeSet::new(),
            ahead: BTreeSet::new(),
            failed: None,
        }
    }

    /// Whether the reader waits for a send to finish before it reads the record at `next`.
    fn is_full(&self, next: i64) -> bool {
        self.in_flight.len() >= self.limit
            || self
                .in_flight
                .first()
                .is_some_and(|&lowest| next - lowest >= self.span)
    }

    /// Counts the send of the record at `offset`.
    fn settle(
        &mut self,
        offset: i64,
        sent: Sent,
        summary: &mut ReplaySummary,
        covered: &mut Covered,
    ) {
        self.in_flight.remove(&offset);
        match sent {
            Sent::Replayed(tenant) => {
                summary.replayed += 1;
                covered.add(&tenant);
                self.ahead.insert(offset);
            }
            Sent::LeftToAnother => summary.skipped_being_replayed += 1,
            Sent::Failed(cause) => {
                if self.failed.as_ref().is_none_or(|(at, _)| offset < *at) {
                    self.failed = Some((offset, cause));
                }
            }
        }
        // Everything below the lowest offset still in flight went through: no failure can
        // come before it any more.
        if self.failed.is_none() {
            let floor = self.in_flight.first().copied().unwrap_or(i64::MAX);
            self.ahead = self.ahead.split_off(&floor);
        }
    }

    /// How many records after `offset` were republished.
    fn sent_past(&self, offset: i64) -> u64 {
        self.ahead.range(offset + 1..).count() as u64
    }
}

/// Republishes dead letters to the deliveries topic as replays.
struct Republisher {
    producer: crate::kafka::Producer,
    deliveries: Arc<str>,
    never: CancellationToken,
}

impl Republisher {
    fn new(target: &ReplayTarget) -> Result<Republisher, ReplayError> {
        // One record per produce request: a replay sends many records at once, and the broker
        // refuses a batch whole, so a record it refuses (larger than the deliveries topic
        // takes, say) would take the records batched with it down too, retry after retry.
        let producer = producer_config(&target.bootstrap, &target.client)
            .set("batch.num.messages", "1")
            .create_with_context(crate::kafka::ProducerLog::default())
            .map_err(kafka_failure(target, "creating the producer".into()))?;
        Ok(Republisher {
            producer,
            deliveries: Arc::from(target.deliveries.as_str()),
            never: CancellationToken::new(),
        })
    }

    /// Republishes `record` as replay `replay_id` (a fresh window); whether the deliveries
    /// topic acknowledged it within `deadline`. Once it did, notes the replay in `store`
    /// ([`ReplayMark`]) so that another replay leaves the delivery alone until this one's
    /// attempt is logged. A mark the store does not take is logged and counted, not fatal:
    /// the record is on its way all the same, and the worst it leads to is a second replay
    /// sending it twice, with the same `webhook-id`.
    async fn republish(
        &self,
        record: DeliveryRecord,
        replay_id: &str,
        deadline: Duration,
        store: &dyn DeliveryStore,
    ) -> Republished {
        let delivery_id = record.delivery_id.clone();
        let out = outgoing(self.deliveries.clone(), &record.for_replay(replay_id));
        let sent = tokio::time::timeout(
            deadline,
            produce_unless_refused(&self.producer, out, &self.never, refused_for_good),
        )
        .await;
        match sent {
            Ok(Produced::Acked) => {}
            Ok(Produced::Refused(e)) => return Republished::Refused(e),
            Ok(Produced::Stopped) | Err(_) => return Republished::NotAcknowledged,
        }
        let mark = ReplayMark {
            delivery_id,
            replay_id: replay_id.to_owned(),
            at: SystemTime::now(),
        };
        if let Err(error) = store.record_replay_mark(&mark).await {
            telemetry::replay_mark_failed();
            tracing::warn!(delivery = %mark.delivery_id, replay_id, %error,
                "replayed, but the store did not take the replay's mark: a second replay before \
                 this one's attempt is logged would send the delivery again");
        }
        Republished::Yes
    }
}

/// Whether [`Republisher::republish`] got its record into the deliveries topic.
enum Republished {
    /// Acknowledged (and noted).
    Yes,
    /// Refused with an error that sending it again meets the same way (larger than the topic
    /// takes, say); nothing was written.
    Refused(KafkaError),
    /// Not acknowledged in time: it may still be written.
    NotAcknowledged,
}

/// Records a replay's audit entry in `store`, and logs it once recorded.
async fn record_audit(store: &dyn DeliveryStore, audit: &ReplayAudit) -> Result<(), StoreError> {
    store.record_replay(audit).await?;
    tracing::info!(replay_id = %audit.replay_id, actor = %audit.actor,
        reason = %audit.reason, scope = %audit.scope, count = audit.count,
        dry_run = audit.dry_run, "replay recorded");
    Ok(())
}

/// `n` records republished after `offset`, in words.
fn past_count(n: u64, offset: i64) -> String {
    let records = if n == 1 { "record" } else { "records" };
    format!("{n} {records} after offset {offset}")
}

/// The audit entry's account of what a replay covered: `from_offset..=last` when it reached
/// the end of its range; else, given why it stopped and the first offset it did not cover,
/// the offsets before that one, what was asked, and why it stopped.
fn scope(
    target: &ReplayTarget,
    request: &ReplayRequest,
    last: i64,
    stopped: Option<(&StopCause, i64, u64)>,
) -> String {
    let from = request.from_offset;
    let to = request.to_offset;
    let mut scope = format!("{} partition {}", target.dlq, request.partition);
    match stopped {
        None => {
            scope.push_str(&format!(" offsets {from}..={last}"));
            if to > last {
                scope.push_str(&format!(" (asked up to {to}; the partition ended there)"));
            }
        }
        Some((cause, resume_from, past)) => {
            if resume_from > from {
                scope.push_str(&format!(" offsets {from}..={}", resume_from - 1));
            } else {
                scope.push_str(" no offsets");
            }
            if past > 0 {
                scope.push_str(&format!(
                    " and {} (under way when it stopped)",
                    past_count(past, resume_from)
                ));
            }
            scope.push_str(&format!(
                " (asked {from}..={to}; incomplete, stopped before offset {resume_from}: {})",
                cause.describe(resume_from)
            ));
        }
    }
    if let Some(endpoint) = &request.endpoint {
        scope.push_str(&format!(", endpoint {endpoint}"));
    }
    scope
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stage::produce_until_acked;

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

    /// A replay of `hookline.dlq` partition 3, offsets 1200..=1450, stopped before `resume_from`
    /// with every record before it republished.
    fn stopped(cause: StopCause, resume_from: i64, audit_error: Option<StoreError>) -> Incomplete {
        Incomplete {
            replay_id: "rpl_1".into(),
            dlq: "hookline.dlq".into(),
            partition: 3,
            from_offset: 1200,
            to_offset: 1450,
            resume_from,
            replayed: u64::try_from(resume_from - 1200).unwrap(),
            replayed_past: 0,
            dry_run: false,
            cause,
            audit_error,
        }
    }

    #[test]
    fn an_incomplete_replay_says_where_it_stopped_what_it_republished_and_how_to_resume() {
        assert_eq!(
            stopped(StopCause::Idle(Duration::from_secs(10)), 1300, None).to_string(),
            "replay rpl_1 of hookline.dlq partition 3 offsets 1200..=1450 stopped before offset \
             1300: no record arrived for 10s: the partition's leader may be moving or its broker \
             slow; it republished 100 records from offsets 1200..=1299, as its audit entry \
             records. Offsets 1300..=1450 were not replayed; to replay them, run it again with \
             --partition 3 --from-offset 1300 --to-offset 1450"
        );
    }

    #[test]
    fn a_replay_stopped_by_the_attempt_log_says_nothing_was_sent_for_that_offset() {
        let cause = StopCause::Claim(StoreError::Unavailable("no CQL node answered".into()));
        assert_eq!(
            stopped(cause, 1210, None).to_string(),
            "replay rpl_1 of hookline.dlq partition 3 offsets 1200..=1450 stopped before offset \
             1210: the attempt log did not answer when offset 1210's delivery was claimed (store \
             unavailable: no CQL node answered); nothing was sent for it; it republished 10 \
             records from offsets 1200..=1209, as its audit entry records. Offsets 1210..=1450 \
             were not replayed; to replay them, run it again with --partition 3 --from-offset \
             1210 --to-offset 1450"
        );
    }

    /// A failure with records after it already republished (sent together with it) says how
    /// many, and that resuming sends them again.
    #[test]
    fn an_incomplete_replay_counts_what_it_sent_past_its_stop() {
        let cause = StopCause::Publish {
            topic: "hookline.deliveries".into(),
            deadline: Duration::from_secs(60),
        };
        let mut stop = stopped(cause, 1300, None);
        stop.replayed += 3;
        stop.replayed_past = 3;
        let text = stop.to_string();
        assert!(
            text.contains(
                "it republished 100 records from offsets 1200..=1299 and 3 records after offset \
                 1300, under way when it stopped, as its audit entry records. Offsets \
                 1300..=1450 were not all replayed; to replay them, run it again with \
                 --partition 3 --from-offset 1300 --to-offset 1450 (what it republished after \
                 offset 1300 is sent again, with the same webhook-id, unless its attempts are \
                 still to come)"
            ),
            "{text}"
        );
    }

    /// The window stops at the lowest failed offset, whichever send finished first, and
    /// counts the records republished after it; with no failure it keeps no record of them
    /// once everything below them went through.
    #[test]
    fn the_window_stops_at_the_lowest_failure_and_counts_what_went_past_it() {
        let acme = Tenant::parse("acme").unwrap();
        let claim_failed =
            || Sent::Failed(StopCause::Claim(StoreError::Unavailable("down".into())));
        let mut summary = ReplaySummary {
            replay_id: "rpl_1".into(),
            scanned: 0,
            replayed: 0,
            filtered: 0,
            undecodable: 0,
            skipped_being_replayed: 0,
            last_offset: 0,
        };
        let mut covered = Covered::default();
        let mut w = Window::new(WINDOW);
        w.in_flight.extend(10..20);
        assert!(!w.is_full(20));
        assert!(w.is_full(10 + w.span), "the reader stays within the span");
        for offset in [11, 15, 19] {
            w.settle(
                offset,
                Sent::Replayed(acme.clone()),
                &mut summary,
                &mut covered,
            );
        }
        w.settle(16, claim_failed(), &mut summary, &mut covered);
        w.settle(13, claim_failed(), &mut summary, &mut covered);
        w.settle(12, Sent::LeftToAnother, &mut summary, &mut covered);
        for offset in [10, 14, 17, 18] {
            w.settle(
                offset,
                Sent::Replayed(acme.clone()),
                &mut summary,
                &mut covered,
            );
        }
        assert!(w.in_flight.is_empty());
        assert_eq!(w.failed.as_ref().map(|(at, _)| *at), Some(13));
        assert_eq!(w.sent_past(13), 5, "14, 15, 17, 18 and 19");
        assert_eq!((summary.replayed, summary.skipped_being_replayed), (7, 1));

        let mut w = Window::new(WINDOW);
        w.in_flight.extend(0..4);
        for offset in [3, 1, 0, 2] {
            w.settle(
                offset,
                Sent::Replayed(acme.clone()),
                &mut summary,
                &mut covered,
            );
        }
        assert!(w.failed.is_none());
        assert!(w.ahead.is_empty(), "{:?}", w.ahead);
    }

    /// Fails every claim after the first `0`.
    struct ClaimsFailAfter(std::sync::atomic::AtomicUsize);

    #[async_trait::async_trait]
    impl crate::storage::hooked::Hooks for ClaimsFailAfter {
        async fn before_claim_replay(&self) -> Result<(), StoreError> {
            let left = self.0.load(Ordering::SeqCst);
            if left == 0 {
                return Err(StoreError::Unavailable("no CQL node answered".into()));
            }
            self.0.store(left - 1, Ordering::SeqCst);
            Ok(())
        }
    }

    /// Dead letter `n`, of a tenant's `order.created` event.
    fn dead_letter(n: usize) -> DeliveryRecord {
        crate::storage::conformance::dead_letter(&format!("evt_{n}"), 0)
    }

    /// A mock cluster whose DLQ (one partition) holds `letters` from offset 0, and a replay
    /// target on it.
    async fn mock_dlq(
        letters: &[DeliveryRecord],
    ) -> (
        rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
        ReplayTarget,
    ) {
        let mock = rdkafka::mocking::MockCluster::new(1).unwrap();
        let target = ReplayTarget {
            bootstrap: mock.bootstrap_servers(),
            client: std::collections::BTreeMap::new().into(),
            dlq: "t.dlq".into(),
            deliveries: "t.deliveries".into(),
        };
        mock.create_topic(&target.dlq, 1, 1).unwrap();
        mock.create_topic(&target.deliveries, 1, 1).unwrap();
        let producer: crate::kafka::Producer = producer_config(&target.bootstrap, &target.client)
            .create_with_context(crate::kafka::ProducerLog::default())
            .unwrap();
        let never = CancellationToken::new();
        for letter in letters {
            let out = outgoing(Arc::from(target.dlq.as_str()), letter);
            assert!(produce_until_acked(&producer, out, &never).await);
        }
        (mock, target)
    }

    /// A claim the attempt log does not answer stops a range at that offset before anything is
    /// sent for it, with the records before it republished and audited.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_the_attempt_log_does_not_answer_stops_the_range_there() {
        let letters: Vec<DeliveryRecord> = (0..3).map(dead_letter).collect();
        let (_mock, target) = mock_dlq(&letters).await;
        let store = crate::storage::hooked::Hooked::new(
            ClaimsFailAfter(std::sync::atomic::AtomicUsize::new(1)),
            16,
        );
        let request = ReplayRequest {
            partition: 0,
            from_offset: 0,
            to_offset: 2,
            ..request()
        };
        let result = check(&target, &request)
            .await
            .unwrap()
            .run(&store, &mut |_, _| {})
            .await;
        let Err(ReplayError::Incomplete(stop)) = result else {
            panic!("the replay stops: {result:?}");
        };
        assert!(matches!(stop.cause, StopCause::Claim(_)), "{stop}");
        assert_eq!((stop.resume_from, stop.replayed), (1, 1), "{stop}");
        let audits = store.replays(None, 10).await.unwrap();
        assert_eq!(audits.len(), 1, "{audits:?}");
        assert_eq!(audits[0].count, 1);
        assert!(audits[0].scope.contains("claimed"), "{}", audits[0].scope);
        assert_eq!(
            audits[0].tenant.as_ref().map(Tenant::as_str),
            Some("acme"),
            "what it republished was one tenant's"
        );
    }

    /// A range longer than the window is sent whole, each delivery once: a delivery whose
    /// dead letter is in the range twice (dead again after a replay) is claimed by one of its
    /// two sends, which run at the same time, and left alone by the other.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_range_longer_than_the_window_sends_each_delivery_once() {
        use rdkafka::consumer::BaseConsumer;
        let count = SPAN_WINDOWS * WINDOW + WINDOW + 10;
        let mut letters: Vec<DeliveryRecord> = (0..count).map(dead_letter).collect();
        // The same delivery's dead letter again, next to the first.
        letters.insert(8, letters[7].clone());
        let (_mock, target) = mock_dlq(&letters).await;
        // The store holds each delivery, dead (the in-memory store keeps claims only for the
        // deliveries it holds).
        let store = crate::storage::memory::MemoryStore::default();
        for (_, letter) in letters.iter().enumerate().filter(|(i, _)| *i != 8) {
            let row = crate::storage::conformance::dead_attempt(letter);
            store.record_attempt(&row).await.unwrap();
        }
        let request = ReplayRequest {
            partition: 0,
            from_offset: 0,
            to_offset: i64::try_from(letters.len()).unwrap() - 1,
            ..request()
        };
        let summary = check(&target, &request)
            .await
            .unwrap()
            .run(&store, &mut |_, _| {})
            .await
            .expect("the whole range is replayed");
        assert_eq!(
            (
                summary.scanned,
                summary.replayed,
                summary.skipped_being_replayed
            ),
            (count as u64 + 1, count as u64, 1),
            "{summary:?}"
        );
        let consumer: BaseConsumer = client_config(&target.bootstrap, &target.client)
            .set("group.id", "check")
            .set("auto.offset.reset", "earliest")
            .create()
            .unwrap();
        consumer.subscribe(&[&target.deliveries]).unwrap();
        let mut sent = BTreeSet::new();
        let mut records = 0;
        let deadline = Instant::now() + Duration::from_secs(20);
        while records < count && Instant::now() < deadline {
            if let Some(Ok(m)) =
                tokio::task::block_in_place(|| consumer.poll(Duration::from_millis(100)))
            {
                let r = DeliveryRecord::from_message(&m).unwrap();
                assert_eq!(r.replay_id.as_deref(), Some(summary.replay_id.as_str()));
                sent.insert(r.delivery_id);
                records += 1;
            }
        }
        // Nothing more comes.
        let extra = tokio::task::block_in_place(|| consumer.poll(Duration::from_millis(500)));
        assert!(extra.is_none_or(|m| m.is_err()), "a record sent twice");
        let expected: BTreeSet<_> = letters.iter().map(|l| l.delivery_id.clone()).collect();
        assert_eq!((records, sent), (count, expected));
    }

    /// An endpoint's replay sends its dead letters side by side; when the attempt log stops
    /// answering, the sends under way finish, what went out is counted and audited, and the
    /// answer says where to resume and why.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_endpoint_replay_whose_claims_fail_says_where_to_resume() {
        let endpoint = EndpointId::generate();
        let letters: Vec<DeliveryRecord> = (0..3)
            .map(|n| crate::storage::conformance::dead_letter_to(&format!("evt_{n}"), &endpoint, 0))
            .collect();
        let since = SystemTime::now() - Duration::from_secs(60);
        let (_mock, target) = mock_dlq(&letters).await;
        let store = crate::storage::hooked::Hooked::new(
            ClaimsFailAfter(std::sync::atomic::AtomicUsize::new(1)),
            16,
        );
        for letter in &letters {
            let row = crate::storage::conformance::dead_attempt(letter);
            store.record_attempt(&row).await.unwrap();
        }
        let request = EndpointReplayRequest {
            endpoint: endpoint.clone(),
            tenant: Tenant::parse("acme").unwrap(),
            since,
            until: SystemTime::now() + Duration::from_secs(60),
            actor: "acme's API token".into(),
            reason: "receiver fixed".into(),
        };
        let done = replay_endpoint(&target, &store, &request).await.unwrap();
        assert_eq!((done.replayed, done.skipped), (1, 0), "{done:?}");
        let resume = done.resume_since.expect("it stopped short");
        assert!(resume >= since && resume <= SystemTime::now(), "{done:?}");
        assert!(
            done.stopped
                .as_deref()
                .is_some_and(|s| s.starts_with("the attempt log did not answer")),
            "{done:?}"
        );
        let audits = store.replays(None, 10).await.unwrap();
        assert_eq!(audits.len(), 1, "{audits:?}");
        assert_eq!(audits[0].count, 1, "{audits:?}");
    }

    #[test]
    fn a_range_names_its_tenant_only_when_it_covered_one_alone() {
        let (acme, globex) = (
            Tenant::parse("acme").unwrap(),
            Tenant::parse("globex").unwrap(),
        );
        assert_eq!(Covered::default().tenant(), None, "nothing republished");
        let mut one = Covered::default();
        one.add(&acme);
        one.add(&acme);
        assert_eq!(one.tenant(), Some(acme.clone()));
        let mut two = Covered::default();
        for t in [&acme, &globex, &acme] {
            two.add(t);
        }
        assert_eq!(two.tenant(), None, "several tenants'");
    }

    #[test]
    fn an_incomplete_replay_whose_audit_entry_failed_says_so() {
        let cause = StopCause::Publish {
            topic: "hookline.deliveries".into(),
            deadline: Duration::from_secs(60),
        };
        let audit_error = StoreError::Unavailable("no CQL node answered".into());
        assert_eq!(
            stopped(cause, 1200, Some(audit_error)).to_string(),
            "replay rpl_1 of hookline.dlq partition 3 offsets 1200..=1450 stopped before offset \
             1200: hookline.deliveries did not acknowledge offset 1200 within 1m (the producer's \
             errors are logged above; should the record be written late after all, resuming \
             delivers it twice, with the same webhook-id); it republished nothing, but its audit \
             entry could not be written (store unavailable: no CQL node answered): keep this \
             message as the record of it. Offsets 1200..=1450 were not replayed; to replay them, \
             run it again with --partition 3 --from-offset 1200 --to-offset 1450"
        );
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
