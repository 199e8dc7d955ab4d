//! Why a replay failed ([`ReplayError`]), and how a replay of a range that stopped short
//! says where, why, and how to resume ([`Incomplete`]).

use std::fmt;
use std::time::Duration;

use rdkafka::error::KafkaError;

use super::{CLAIM_LIMIT, ReplayTarget};
use crate::storage::StoreError;

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
    /// The attempt log holds no note of where a delivered delivery's record is (its attempts
    /// were logged without one), so it cannot be sent again.
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
    pub(super) fn describe(&self, at: i64) -> String {
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

/// Turns a librdkafka error into [`ReplayError::Kafka`], naming the brokers and what replay
/// was doing (`action`).
pub(super) fn kafka_failure(
    target: &ReplayTarget,
    action: String,
) -> impl FnOnce(KafkaError) -> ReplayError {
    let bootstrap = target.bootstrap.clone();
    move |source| ReplayError::Kafka {
        bootstrap,
        action,
        source: Box::new(source),
    }
}

/// `n` records republished after `offset`, in words.
pub(super) fn past_count(n: u64, offset: i64) -> String {
    let records = if n == 1 { "record" } else { "records" };
    format!("{n} {records} after offset {offset}")
}

#[cfg(test)]
mod tests {
    use super::*;
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
}
