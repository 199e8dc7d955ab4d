//! Replaying a range of DLQ offsets (`hookline replay`, and the admin API's range replay):
//! [`check`] confirms the range with the brokers, then [`Checked::run`] republishes it, a
//! window of records at a time, and records the audit entry.

use std::sync::atomic::Ordering;
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};

use super::consumer::{DlqConsumer, KAFKA_TIMEOUT, check_partition, dlq_consumer};
use super::error::kafka_failure;
use super::{ReplayError, ReplayRequest, ReplaySummary, ReplayTarget};
use crate::storage::DeliveryStore;

mod run;
mod window;

pub(super) use window::SEND_STEP;
pub use window::WINDOW;

/// How long replay waits for the DLQ's next record before it stops and reports the range
/// incomplete, unless [`Checked::idle_limit`] says otherwise.
pub const IDLE_LIMIT: Duration = Duration::from_secs(10);

/// How long one republished record may take to be acknowledged by the deliveries topic before
/// replay stops, unless [`Checked::publish_deadline`] says otherwise.
pub const PUBLISH_DEADLINE: Duration = Duration::from_secs(60);

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
    /// See [`Checked::asked_by`].
    asked_by: Option<String>,
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
        asked_by: None,
    })
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

    /// Records which credential asked for the replay (`cli`, `operator token`) in its audit
    /// entry; unset, none is recorded.
    pub fn asked_by(mut self, credential: impl Into<String>) -> Self {
        self.asked_by = Some(credential.into());
        self
    }
}
