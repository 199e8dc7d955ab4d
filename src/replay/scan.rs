//! Reading the DLQ by time: every partition's records from a moment on, up to a later moment or
//! the partition's end when the scan began, found through the brokers' timestamp index.
//!
//! A broker that cannot look offsets up by time (librdkafka's mock cluster, under
//! `hookline dev`) answers "no record since then" for every partition. So a partition with that
//! answer is probed at its newest record first: older than the start, the answer was right and
//! the partition is done; otherwise the partition is read from its start, and records before the
//! start are skipped.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::OwnedMessage;
use rdkafka::{Message, Offset, TopicPartitionList};

use super::consumer::{
    DlqConsumer, KAFKA_TIMEOUT, POLL_WAIT, dlq_consumer, dlq_partitions, read_error_is_final,
};
use super::error::kafka_failure;
use super::{ReplayError, ReplayTarget};

/// Milliseconds since the Unix epoch, as Kafka timestamps count (0 before it).
pub fn unix_millis(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// How far before the last timestamp handed out a resumed scan starts: producers stamp records
/// as they send them, so a partition's timestamps may go back a little.
const RESUME_MARGIN: i64 = 1_000;

/// What is left to read of a partition.
enum Left {
    /// Only its newest record (`last`) is assigned so far; `low` is its first offset.
    Probe { low: i64, last: i64 },
    /// Read on up to `last`, the newest record when the scan began.
    Scan { last: i64 },
}

/// A scan of the DLQ's records whose timestamps lie in `from..=until` (Unix milliseconds).
pub struct DlqScan {
    consumer: DlqConsumer,
    target: ReplayTarget,
    from: i64,
    until: i64,
    left: BTreeMap<i32, Left>,
    /// Per partition, the timestamp of the newest in-range record handed out.
    reached: BTreeMap<i32, i64>,
    deadline: Instant,
}

/// Why [`DlqScan::next`] returned no record.
#[derive(Debug)]
pub enum ScanEnd {
    /// Every partition was read to `until` or to its end.
    Done,
    /// The time limit passed first. Every record before `resume_from` (Unix milliseconds) was
    /// handed out; records at or after it may not have been.
    TimedOut {
        /// Where a later scan resumes.
        resume_from: i64,
    },
}

impl DlqScan {
    /// Starts a scan of `target`'s DLQ over `from..=until`, which gives up after `limit`.
    pub fn start(
        target: &ReplayTarget,
        from: i64,
        until: i64,
        limit: Duration,
    ) -> Result<DlqScan, ReplayError> {
        let consumer = dlq_consumer(target)?;
        let partitions = dlq_partitions(&consumer, target)?;
        consumer.context().answered.store(true, Ordering::Relaxed);
        let reading = || format!("reading {} by time", target.dlq);
        let mut asked = TopicPartitionList::new();
        for p in 0..partitions {
            asked
                .add_partition_offset(&target.dlq, p, Offset::Offset(from))
                .map_err(kafka_failure(target, reading()))?;
        }
        let starts =
            tokio::task::block_in_place(|| consumer.offsets_for_times(asked, KAFKA_TIMEOUT))
                .map_err(kafka_failure(target, reading()))?;
        let mut left = BTreeMap::new();
        let mut assign = TopicPartitionList::new();
        for e in starts.elements() {
            let p = e.partition();
            let (low, high) = tokio::task::block_in_place(|| {
                consumer.fetch_watermarks(&target.dlq, p, KAFKA_TIMEOUT)
            })
            .map_err(kafka_failure(target, reading()))?;
            if low >= high {
                continue;
            }
            let (start, state) = match e.offset() {
                Offset::Offset(start) if start < high => (start, Left::Scan { last: high - 1 }),
                Offset::Offset(_) => continue,
                _ => (
                    high - 1,
                    Left::Probe {
                        low,
                        last: high - 1,
                    },
                ),
            };
            left.insert(p, state);
            assign
                .add_partition_offset(&target.dlq, p, Offset::Offset(start))
                .map_err(kafka_failure(target, reading()))?;
        }
        if !left.is_empty() {
            consumer
                .assign(&assign)
                .map_err(kafka_failure(target, reading()))?;
        }
        Ok(DlqScan {
            consumer,
            target: target.clone(),
            from,
            until,
            left,
            reached: BTreeMap::new(),
            deadline: Instant::now() + limit,
        })
    }

    /// Where a later scan resumes to cover what this one has not handed out yet: the earliest,
    /// over the partitions not done, of the newest timestamp handed out (or the start), less
    /// [`RESUME_MARGIN`] for timestamps a little out of order. What it hands out again was
    /// handed out before.
    pub fn resume_from(&self) -> i64 {
        let earliest = self
            .left
            .keys()
            .map(|p| self.reached.get(p).copied().unwrap_or(self.from))
            .min()
            .unwrap_or(self.until);
        earliest.saturating_sub(RESUME_MARGIN).max(self.from)
    }

    /// The next record in range, in no particular order across partitions; `Err(ScanEnd)` when
    /// there is none left, or no time.
    pub fn next(&mut self) -> Result<Result<OwnedMessage, ScanEnd>, ReplayError> {
        loop {
            if let Some(next) = self.next_within(POLL_WAIT)? {
                return Ok(next);
            }
        }
    }

    /// [`next`](Self::next), waiting at most `longest` for the brokers to hand a record over:
    /// `None` when none came in that time.
    pub fn next_within(
        &mut self,
        longest: Duration,
    ) -> Result<Option<Result<OwnedMessage, ScanEnd>>, ReplayError> {
        let reading = || format!("reading {} by time", self.target.dlq);
        while !self.left.is_empty() {
            let wait = self.deadline.saturating_duration_since(Instant::now());
            if wait.is_zero() {
                return Ok(Some(Err(ScanEnd::TimedOut {
                    resume_from: self.resume_from(),
                })));
            }
            let consumer = &self.consumer;
            let wait = wait.min(POLL_WAIT).min(longest);
            let msg = match tokio::task::block_in_place(|| consumer.poll(wait)) {
                Some(Ok(m)) => m.detach(),
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    if matches!(self.left.get(&p), Some(Left::Scan { .. })) {
                        self.left.remove(&p);
                    }
                    continue;
                }
                Some(Err(source)) if read_error_is_final(&source) => {
                    return Err(kafka_failure(&self.target, reading())(source));
                }
                Some(Err(_)) => continue,
                None => return Ok(None),
            };
            let (p, at) = (msg.partition(), msg.timestamp().to_millis());
            let in_range = at.is_some_and(|t| (self.from..=self.until).contains(&t));
            match self.left.get(&p) {
                Some(Left::Probe { low, last }) if at.is_some_and(|t| t >= self.from) => {
                    let (low, last) = (*low, *last);
                    if low < last {
                        tokio::task::block_in_place(|| {
                            self.consumer.seek(
                                &self.target.dlq,
                                p,
                                Offset::Offset(low),
                                KAFKA_TIMEOUT,
                            )
                        })
                        .map_err(kafka_failure(&self.target, reading()))?;
                        self.left.insert(p, Left::Scan { last });
                        // Its newest record comes again, in order.
                        continue;
                    }
                    self.left.remove(&p);
                }
                Some(Left::Probe { .. }) => {
                    self.left.remove(&p);
                }
                Some(Left::Scan { last })
                    if at.is_some_and(|t| t > self.until) || msg.offset() >= *last =>
                {
                    self.left.remove(&p);
                }
                Some(Left::Scan { .. }) => {}
                // A revoked partition cannot come; a record after its partition was done can.
                None => continue,
            }
            if in_range {
                if let Some(t) = at {
                    self.reached.insert(p, t);
                }
                return Ok(Some(Ok(msg)));
            }
        }
        Ok(Some(Err(ScanEnd::Done)))
    }
}
