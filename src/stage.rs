//! Plumbing every Kafka stage shares: learning about rebalances, tracking which records are
//! settled per partition, storing only settled offsets, pausing partitions whose window is full,
//! producing a record until the broker acknowledges it, and writing to the store until it takes
//! the write.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use rdkafka::consumer::stream_consumer::StreamPartitionQueue;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use rdkafka::statistics::Statistics;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use crate::input::{INVALID_DETAIL_HEADER, INVALID_REASON_HEADER};
use crate::offsets::{OffsetError, OffsetTracker};
use crate::record::DeliveryRecord;
use crate::telemetry;

/// A topic-partition: where a record was read from, or where an offset is committed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tp {
    /// The topic's name.
    pub topic: Arc<str>,
    /// The partition's number.
    pub partition: i32,
}

impl Tp {
    /// Partition `partition` of `topic`.
    pub fn new(topic: impl Into<Arc<str>>, partition: i32) -> Tp {
        Tp {
            topic: topic.into(),
            partition,
        }
    }
}

/// Whether the record produced for the record at `offset` of `tp` (a retry, a dead letter, a
/// parked or forwarded copy) was acknowledged: only then does that offset settle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The partition the settling record was read from.
    pub tp: Tp,
    /// Its offset there.
    pub offset: i64,
    /// Whether the broker acknowledged what was produced for it.
    pub acked: bool,
}

/// A partition assignment change, as the stage loop learns of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RebalanceEvent {
    /// These partitions were assigned.
    Assigned(Vec<Tp>),
    /// These partitions were revoked (librdkafka has committed their stored offsets).
    Revoked(Vec<Tp>),
}

/// Consumer context that records rebalances for the stage loop to apply between records,
/// optionally gives each newly assigned partition its own queue (see
/// [`split_partitions`](StageContext::split_partitions)), and reports the stage's consumer lag
/// from librdkafka's statistics (`statistics.interval.ms`).
#[derive(Clone)]
pub struct StageContext {
    stage: &'static str,
    events: Arc<Mutex<Vec<RebalanceEvent>>>,
    split: Arc<Split>,
    outage: Arc<crate::kafka::OutageLog>,
}

/// A partition's own queue, split off the consumer's queue.
pub type PartitionQueue = StreamPartitionQueue<StageContext>;

/// What partition splitting needs: the consumer (set once it is in an `Arc`; weak, as the
/// consumer owns this context) and the queues split since the stage last took them.
#[derive(Default)]
struct Split {
    consumer: OnceLock<Weak<StageConsumer>>,
    queues: Mutex<Vec<(Tp, PartitionQueue)>>,
}

impl Split {
    /// Splits the queues of partitions about to be assigned. librdkafka marks a split queue as
    /// the application's, and the assignment's fetch start then leaves it in place, so every
    /// record of the assignment arrives on it (none reach the consumer's queue first, where
    /// they could be handled out of order with the split queue's).
    fn assigning(&self, tpl: &TopicPartitionList) {
        let Some(consumer) = self.consumer.get().and_then(Weak::upgrade) else {
            return;
        };
        let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        for e in tpl.elements() {
            match consumer.split_partition_queue(e.topic(), e.partition()) {
                Some(q) => queues.push((Tp::new(e.topic(), e.partition()), q)),
                // Its records then come through the consumer's queue, as for a stage that
                // does not split.
                None => tracing::warn!(
                    topic = e.topic(),
                    partition = e.partition(),
                    "could not split the partition's queue; it shares the consumer's"
                ),
            }
        }
    }

    /// Drops split queues not yet taken whose partitions are being revoked.
    fn revoking(&self, tpl: &TopicPartitionList) {
        let revoked = partitions(tpl);
        self.queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(tp, _)| !revoked.contains(tp));
    }
}

fn partitions(tpl: &TopicPartitionList) -> Vec<Tp> {
    tpl.elements()
        .iter()
        .map(|e| Tp::new(e.topic(), e.partition()))
        .collect()
}

/// Pauses (`paused`) or resumes `tps` in one call to librdkafka; an empty list asks nothing.
/// Stages go through [`Settlements::set_pause_reason`], which keeps every reason a partition
/// is paused for.
fn set_paused<C: Consumer<StageContext>>(
    consumer: &C,
    tps: &[Tp],
    paused: bool,
) -> rdkafka::error::KafkaResult<()> {
    if tps.is_empty() {
        return Ok(());
    }
    let mut tpl = TopicPartitionList::new();
    for tp in tps {
        tpl.add_partition(&tp.topic, tp.partition);
    }
    if paused {
        consumer.pause(&tpl)
    } else {
        consumer.resume(&tpl)
    }
}

impl ClientContext for StageContext {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        use rdkafka::error::RDKafkaErrorCode;
        match error.rdkafka_error_code() {
            // A pattern subscription (e.g. `^outbox\.event\..*`) that matches no topic yet is
            // normal until the first outbox topic exists.
            Some(RDKafkaErrorCode::UnknownTopicOrPartition)
                if reason.contains("Subscribed topic not available: ^") =>
            {
                tracing::debug!(
                    stage = self.stage,
                    reason,
                    "no topic matches the input pattern yet"
                );
            }
            _ if crate::kafka_error::is_broker_outage(&error) => {
                if let Some(held_back) = self.outage.admit(std::time::Instant::now()) {
                    tracing::error!(
                        stage = self.stage,
                        error = %error,
                        reason,
                        held_back,
                        "kafka client error"
                    );
                }
            }
            _ => tracing::error!(stage = self.stage, error = %error, reason, "kafka client error"),
        }
    }

    fn stats(&self, statistics: Statistics) {
        let lag: i64 = statistics
            .topics
            .values()
            .flat_map(|t| t.partitions.values())
            // Partition -1 is librdkafka's internal unassigned queue; -1 lag means unknown.
            .filter(|p| p.partition >= 0 && p.consumer_lag > 0)
            .map(|p| p.consumer_lag)
            .sum();
        telemetry::consumer_lag(self.stage, lag);
    }
}

impl ConsumerContext for StageContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => self.split.assigning(tpl),
            Rebalance::Revoke(tpl) => self.split.revoking(tpl),
            Rebalance::Error(_) => {}
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let event = match rebalance {
            Rebalance::Assign(tpl) => RebalanceEvent::Assigned(partitions(tpl)),
            Rebalance::Revoke(tpl) => RebalanceEvent::Revoked(partitions(tpl)),
            Rebalance::Error(e) => {
                tracing::warn!(error = %e, "rebalance error");
                return;
            }
        };
        tracing::info!(?event, "rebalance");
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(event);
    }
}

impl StageContext {
    /// A context for `stage` (`fanout`, `deliver`, `delay`): the metric label of its lag.
    pub fn new(stage: &'static str) -> StageContext {
        StageContext {
            stage,
            events: Arc::default(),
            split: Arc::default(),
            outage: Arc::default(),
        }
    }

    /// Takes the rebalance events that happened since the last call, oldest first.
    pub fn drain(&self) -> Vec<RebalanceEvent> {
        std::mem::take(&mut *self.events.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// From now on, every partition assigned to `consumer` (whose context this is) gets its
    /// own queue; [`take_split`](Self::take_split) hands them out. Call it before the
    /// consumer's first poll: partitions assigned earlier keep sharing the consumer's queue.
    pub fn split_partitions(&self, consumer: &Arc<StageConsumer>) {
        let _ = self.split.consumer.set(Arc::downgrade(consumer));
    }

    /// The queues split since the last call, in assignment order.
    pub fn take_split(&self) -> Vec<(Tp, PartitionQueue)> {
        std::mem::take(&mut *self.split.queues.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// A stage's consumer.
pub type StageConsumer = StreamConsumer<StageContext>;

/// How many times `max_window` the span of a partition (records held from its lowest unsettled
/// one on) may grow while a few old records are unsettled. A hanging attempt pins its partition's
/// lowest offset for the whole HTTP timeout; at the default window (1000) this is 128k records,
/// half a minute of a 4k/s partition, in 1 MiB of tracker.
pub const SPAN_FACTOR: usize = 128;

/// Per-partition settlement: offsets are tracked as records are handed to the stage, settled as
/// their work completes in any order, and only the contiguous settled prefix is stored for
/// commit.
///
/// A partition is paused when it holds `max_window` unsettled records, or when the span from its
/// lowest unsettled offset to its newest reaches [`SPAN_FACTOR`] times that; it resumes once the
/// unsettled records have drained to half and the span has room for another window, and no other
/// [`PauseReason`] holds it (a stage pauses partitions for reasons of its own through
/// [`set_pause_reason`](Self::set_pause_reason), never by calling the consumer). (The span
/// only shrinks when its oldest record settles: waiting for it to halve would hold the partition
/// until that record's attempt ends, however fast the rest flows.) Bounding the unsettled count
/// (not the span) is what keeps one slow record from stalling its partition: an attempt hanging
/// for its whole timeout pins the commit frontier, but the records behind it keep flowing (the
/// tracker costs 8 bytes per settled offset, bounded by the span limit).
pub struct Settlements {
    stage: &'static str,
    trackers: HashMap<Tp, OffsetTracker>,
    pauses: Pauses,
    max_window: usize,
}

/// Why a partition is paused. librdkafka keeps one paused flag per partition, so every reason a
/// stage has goes through one [`Settlements`], which pauses a partition at its first reason and
/// resumes it only once none is left: a reason that ends never un-pauses a partition that
/// another reason still holds (a delay tier's due head never reads past a full window).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PauseReason {
    /// Its window of unsettled records is full ([`Settlements`]' own flow control).
    Window,
    /// The stage takes no more of its records for now: a delay tier partition whose held
    /// records are due too far ahead, or fill its bounds.
    Hold,
}

impl PauseReason {
    fn bit(self) -> u8 {
        match self {
            PauseReason::Window => 1,
            PauseReason::Hold => 2,
        }
    }
}

/// The reasons each partition is paused for; a partition with none is not paused.
#[derive(Default)]
struct Pauses {
    reasons: HashMap<Tp, u8>,
}

impl Pauses {
    fn holds(&self, tp: &Tp, reason: PauseReason) -> bool {
        self.reasons.get(tp).is_some_and(|r| r & reason.bit() != 0)
    }

    /// Those of `tps` whose paused state changes when `reason` is set (`on`) or cleared: the
    /// ones paused for no reason before it is set, or for no other reason once it is cleared.
    fn flips(&self, tps: &[Tp], reason: PauseReason, on: bool) -> Vec<Tp> {
        tps.iter()
            .filter(|tp| {
                let r = self.reasons.get(*tp).copied().unwrap_or(0);
                if on { r == 0 } else { r == reason.bit() }
            })
            .cloned()
            .collect()
    }

    fn set(&mut self, tp: &Tp, reason: PauseReason, on: bool) {
        if on {
            *self.reasons.entry(tp.clone()).or_default() |= reason.bit();
        } else if let Some(r) = self.reasons.get_mut(tp) {
            *r &= !reason.bit();
            if *r == 0 {
                self.reasons.remove(tp);
            }
        }
    }

    fn forget(&mut self, tp: &Tp) {
        self.reasons.remove(tp);
    }
}

impl Settlements {
    /// Tracking for one stage; `max_window` bounds the records held per partition.
    pub fn new(stage: &'static str, max_window: usize) -> Settlements {
        Settlements {
            stage,
            trackers: HashMap::new(),
            pauses: Pauses::default(),
            max_window: max_window.max(1),
        }
    }

    /// A record was handed to the stage. False when the stage already took this offset in the
    /// partition's current assignment: the caller drops the record, which it has in hand or
    /// has settled.
    ///
    /// librdkafka hands a record out again when a pause races its reading: the pause sets the
    /// partition's fetch position to the offset after the last record handed out, and a record
    /// taken from the partition's queue on another thread at that moment is handed out
    /// without having moved that position yet, so the fetch after the resume starts at it.
    /// (The delivery stage reads each partition on a task of its own while its loop pauses
    /// them: the likely cause of a rare duplicate request in the pipeline tests.) No
    /// stage seeks, and a re-assignment starts a fresh tracker ([`apply`](Self::apply)), so an
    /// offset at or below one taken is such a record: Kafka rewrites no offset a consumer has
    /// read (it reads only what every in-sync replica has) unless an unclean leader election
    /// loses records anyway.
    #[must_use = "a record the stage already took must be dropped"]
    pub fn track(&mut self, tp: &Tp, offset: i64) -> bool {
        let tracker = self.trackers.entry(tp.clone()).or_default();
        match tracker.track(offset) {
            Ok(()) => true,
            Err(OffsetError::NotIncreasing { highest, .. }) => {
                tracing::debug!(stage = self.stage, topic = %tp.topic, partition = tp.partition, offset,
                    highest, "record read again after a pause; the stage already took it");
                false
            }
            // A negative offset (librdkafka hands none out), which no tracker takes. The record
            // is handled all the same, so nothing is lost, and the tracker is left as it is:
            // emptying it would forget the records in flight, and the next settle could then
            // commit past them.
            Err(e) => {
                tracing::warn!(stage = self.stage, topic = %tp.topic, partition = tp.partition, offset,
                    error = %e, "an offset that cannot be tracked; the record is handled, its offset never committed");
                true
            }
        }
    }

    /// A record's work is done. Unknown partitions (revoked meanwhile) are ignored: their new
    /// owner re-reads from the last committed offset.
    pub fn settle(&mut self, tp: &Tp, offset: i64) {
        if let Some(tracker) = self.trackers.get_mut(tp)
            && let Err(e) = tracker.settle(offset)
        {
            tracing::debug!(stage = self.stage, topic = %tp.topic, partition = tp.partition, offset, error = %e,
                "settle of an untracked offset ignored");
        }
    }

    /// Records held for `tp` (from its lowest unsettled offset on).
    pub fn window(&self, tp: &Tp) -> usize {
        self.trackers.get(tp).map_or(0, OffsetTracker::window_len)
    }

    /// Records not yet settled, over all partitions.
    pub fn in_flight(&self) -> usize {
        self.trackers.values().map(OffsetTracker::in_flight).sum()
    }

    /// Forgets revoked partitions.
    pub fn revoke(&mut self, tps: &[Tp]) {
        for tp in tps {
            self.trackers.remove(tp);
            self.pauses.forget(tp);
        }
    }

    /// Takes the consumer's pending rebalance events and applies them; returns them for the
    /// stage's own clean-up. Call it before handling each record: librdkafka reports a
    /// rebalance from inside the poll that precedes the new assignment's first record, so
    /// applying events first keeps a stale tracker from swallowing fresh offsets.
    pub fn sync<C: Consumer<StageContext>>(&mut self, consumer: &C) -> Vec<RebalanceEvent> {
        let events = consumer.context().drain();
        self.apply(&events);
        // librdkafka keeps a pause across a revoke and a later re-assignment of the same
        // partition, and no stage holds anything of a partition that moved: one paused when it
        // moved away would come back paused with nothing to resume it. Resuming a partition
        // that is not paused does nothing.
        let back: Vec<Tp> = events
            .iter()
            .filter_map(|e| match e {
                RebalanceEvent::Assigned(tps) => Some(tps),
                RebalanceEvent::Revoked(_) => None,
            })
            .flatten()
            .cloned()
            .collect();
        if let Err(e) = set_paused(consumer, &back, false) {
            tracing::warn!(stage = self.stage, error = %e, "resuming assigned partitions failed");
        }
        events
    }

    /// The periodic work of a stage: apply rebalances, store settled offsets, pause or resume
    /// partitions. Returns the rebalance events for the stage's own clean-up.
    pub fn maintain<C: Consumer<StageContext>>(&mut self, consumer: &C) -> Vec<RebalanceEvent> {
        let events = self.sync(consumer);
        self.store(consumer);
        self.flow_control(consumer);
        events
    }

    /// Applies rebalance events.
    pub fn apply(&mut self, events: &[RebalanceEvent]) {
        for e in events {
            match e {
                RebalanceEvent::Revoked(tps) => self.revoke(tps),
                // A fresh assignment starts from the committed offset: old tracking is void.
                RebalanceEvent::Assigned(tps) => self.revoke(tps),
            }
        }
    }

    /// Stores the committable offset of every partition that moved (librdkafka commits them).
    pub fn store<C: Consumer<StageContext>>(&mut self, consumer: &C) {
        let mut tpl = TopicPartitionList::new();
        let mut moved = vec![];
        for (tp, tracker) in &self.trackers {
            if let Some(next) = tracker.committable() {
                let _ = tpl.add_partition_offset(&tp.topic, tp.partition, Offset::Offset(next));
                moved.push((tp.clone(), next));
            }
        }
        if moved.is_empty() {
            return;
        }
        match consumer.store_offsets(&tpl) {
            Ok(()) => {
                for (tp, next) in moved {
                    if let Some(t) = self.trackers.get_mut(&tp) {
                        let _ = t.mark_committed(next);
                    }
                }
            }
            // A partition revoked a moment ago: the next rebalance event forgets it.
            Err(e) => tracing::debug!(stage = self.stage, error = %e, "storing offsets failed"),
        }
    }

    /// Whether `tracker` holds as much as a partition may: `max_window` unsettled records, or
    /// an offset span of `SPAN_FACTOR` times that.
    fn full(&self, tracker: &OffsetTracker) -> bool {
        tracker.in_flight() >= self.max_window
            || tracker.window_len() >= self.max_window.saturating_mul(SPAN_FACTOR)
    }

    /// Whether a paused partition has drained enough to resume: half the unsettled bound, and
    /// a window's worth of room in the span.
    fn drained(&self, tracker: &OffsetTracker) -> bool {
        tracker.in_flight() <= self.max_window / 2
            && tracker.window_len() <= self.max_window.saturating_mul(SPAN_FACTOR - 1)
    }

    /// True when `tp` is full and not paused for it yet: the caller should run
    /// [`flow_control`](Self::flow_control) now rather than at its next tick, so a burst cannot
    /// overshoot the bound by a tick's worth of records.
    pub fn needs_pause(&self, tp: &Tp) -> bool {
        !self.pauses.holds(tp, PauseReason::Window)
            && self.trackers.get(tp).is_some_and(|t| self.full(t))
    }

    /// Pauses partitions that are full and lets those drained to half go, each resumed unless
    /// another reason still holds it.
    pub fn flow_control<C: Consumer<StageContext>>(&mut self, consumer: &C) {
        let mut pause = vec![];
        let mut resume = vec![];
        for (tp, tracker) in &self.trackers {
            let paused = self.pauses.holds(tp, PauseReason::Window);
            if !paused && self.full(tracker) {
                pause.push(tp.clone());
            } else if paused && self.drained(tracker) {
                resume.push(tp.clone());
            }
        }
        // A failure leaves the reasons as they were: the next call asks again.
        let _ = self.set_pause_reason(consumer, &pause, PauseReason::Window, true);
        let _ = self.set_pause_reason(consumer, &resume, PauseReason::Window, false);
    }

    /// Sets (`on`) or clears `reason` for `tps`, pausing each partition that had no reason
    /// before and resuming each left with none; the others' paused state stays as it is. When
    /// librdkafka refuses, the partitions it was asked about keep their old reasons.
    pub fn set_pause_reason<C: Consumer<StageContext>>(
        &mut self,
        consumer: &C,
        tps: &[Tp],
        reason: PauseReason,
        on: bool,
    ) -> rdkafka::error::KafkaResult<()> {
        let flips = self.pauses.flips(tps, reason, on);
        let result = set_paused(consumer, &flips, on);
        if let Err(e) = &result {
            tracing::warn!(stage = self.stage, paused = on, ?reason, error = %e,
                "pausing or resuming partitions failed");
        }
        for tp in tps {
            if result.is_ok() || !flips.contains(tp) {
                self.pauses.set(tp, reason, on);
            }
        }
        result
    }

    /// The partitions tracked now (assigned, and handed at least one record).
    pub fn partitions(&self) -> impl Iterator<Item = &Tp> {
        self.trackers.keys()
    }

    /// Whether `reason` holds `tp` paused.
    pub fn paused_for(&self, tp: &Tp, reason: PauseReason) -> bool {
        self.pauses.holds(tp, reason)
    }

    /// True when every tracked record is settled.
    pub fn is_idle(&self) -> bool {
        self.trackers.values().all(OffsetTracker::is_idle)
    }
}

/// Drops a stage's per-partition state for partitions that moved: their new owner re-reads
/// from the committed offset.
pub fn forget_moved<V>(state: &mut HashMap<Tp, V>, events: &[RebalanceEvent]) {
    for e in events {
        let (RebalanceEvent::Revoked(tps) | RebalanceEvent::Assigned(tps)) = e;
        for tp in tps {
            state.remove(tp);
        }
    }
}

/// A record to produce, owned so it can be retried.
#[derive(Clone)]
pub struct Outgoing {
    /// Target topic.
    pub topic: Arc<str>,
    /// Key bytes.
    pub key: Vec<u8>,
    /// Headers.
    pub headers: OwnedHeaders,
    /// Value bytes.
    pub payload: bytes::Bytes,
}

/// The Kafka record for `record` on `topic`.
pub fn outgoing(topic: Arc<str>, record: &DeliveryRecord) -> Outgoing {
    Outgoing {
        topic,
        key: record.key().to_vec(),
        headers: record.to_owned_headers(),
        payload: record.body.clone(),
    }
}

/// The invalid topic's reason for a record in the deliveries topic or a delay tier that is not a
/// delivery record.
pub const BAD_DELIVERY_RECORD: &str = "bad_delivery_record";

/// The record forwarded to the invalid topic `topic` in place of one a stage cannot read: the
/// original's `key`, `headers` and `payload`, with [`INVALID_REASON_HEADER`] (`reason`, for
/// machines) and [`INVALID_DETAIL_HEADER`] (`detail`, for operators) added after its headers.
pub fn invalid_forward(
    topic: Arc<str>,
    key: Vec<u8>,
    headers: OwnedHeaders,
    payload: bytes::Bytes,
    reason: &str,
    detail: &str,
) -> Outgoing {
    let headers = headers
        .insert(Header {
            key: INVALID_REASON_HEADER,
            value: Some(reason),
        })
        .insert(Header {
            key: INVALID_DETAIL_HEADER,
            value: Some(detail),
        });
    Outgoing {
        topic,
        key,
        headers,
        payload,
    }
}

/// Produces `record` and waits for the broker's acknowledgement, retrying with backoff until it
/// is acknowledged or `shutdown` fires (then `false`: the caller must not settle).
///
/// Takes the record by value: its headers move into the first `FutureRecord` instead of being
/// copied per attempt (a header copy is one C allocation per header, on the hottest path).
/// On failure rdkafka hands the message back and the headers are taken back out of it.
pub async fn produce_until_acked(
    producer: &crate::kafka::Producer,
    record: Outgoing,
    shutdown: &CancellationToken,
) -> bool {
    matches!(
        produce_unless_refused(producer, record, shutdown, |_| false).await,
        Produced::Acked
    )
}

/// How [`produce_unless_refused`] ended.
#[derive(Debug)]
pub enum Produced {
    /// The broker acknowledged the record.
    Acked,
    /// The record was refused with an error that says trying again is refused the same way.
    Refused(KafkaError),
    /// `shutdown` fired first.
    Stopped,
}

/// [`produce_until_acked`], except that an error `for_good` says will not pass ends it at once
/// (see [`crate::kafka::refused_for_good`]).
pub async fn produce_unless_refused(
    producer: &crate::kafka::Producer,
    record: Outgoing,
    shutdown: &CancellationToken,
    for_good: impl Fn(&KafkaError) -> bool,
) -> Produced {
    let Outgoing {
        topic,
        key,
        headers,
        payload,
    } = record;
    let mut headers = Some(headers);
    let mut backoff = Duration::from_millis(100);
    loop {
        let mut future_record = FutureRecord::to(&topic).key(&key[..]).payload(&payload[..]);
        if let Some(h) = headers.take() {
            future_record = future_record.headers(h);
        }
        let send = producer.send(future_record, Duration::from_secs(5));
        // `biased`: polled in order, without drawing a random number for every record.
        let result = tokio::select! {
            biased;
            r = send => r,
            () = shutdown.cancelled() => return Produced::Stopped,
        };
        match result {
            Ok(_) => return Produced::Acked,
            Err((e, mut returned)) => {
                // Not produced again: the caller reports the refusal, and the retry count and
                // its "retrying" log stay with the records that are retried.
                if for_good(&e) {
                    return Produced::Refused(e);
                }
                crate::telemetry::produce_failed(&topic, &e);
                // Both of rdkafka's failure paths (enqueue and delivery report) return the
                // headers with the message.
                headers = returned.detach_headers();
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = shutdown.cancelled() => return Produced::Stopped,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Makes the store call `call` (named `what` in the log: `attempt`, `note`, `event`, `event
/// lookup`) until the store answers `Ok`, backing off between tries, or `shutdown` fires (then
/// `None`: the caller must not settle). Every failure is counted and logged, as
/// [`telemetry::store_error`] allows.
pub async fn until_stored<T, F, Fut>(
    what: &'static str,
    shutdown: &CancellationToken,
    mut call: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, crate::storage::StoreError>>,
{
    let mut backoff = Duration::from_millis(50);
    loop {
        match call().await {
            Ok(answer) => return Some(answer),
            Err(e) => {
                telemetry::store_error(what, e.kind(), &e);
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = shutdown.cancelled() => return None,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp() -> Tp {
        Tp::new("deliveries", 0)
    }

    #[test]
    fn an_invalid_forward_keeps_the_original_and_adds_reason_then_detail() {
        use rdkafka::message::Headers as _;
        let original = OwnedHeaders::new().insert(Header {
            key: "traceparent",
            value: Some("00-abc"),
        });
        let out = invalid_forward(
            Arc::from("hookline.invalid"),
            b"k".to_vec(),
            original,
            bytes::Bytes::from_static(b"{"),
            "bad_delivery_record",
            "EOF while parsing",
        );
        let headers: Vec<(&str, &[u8])> = out
            .headers
            .iter()
            .map(|h| (h.key, h.value.unwrap_or_default()))
            .collect();
        assert_eq!(
            headers,
            [
                ("traceparent", &b"00-abc"[..]),
                (INVALID_REASON_HEADER, b"bad_delivery_record"),
                (INVALID_DETAIL_HEADER, b"EOF while parsing"),
            ]
        );
        assert_eq!(
            (&*out.topic, &out.key[..], &out.payload[..]),
            ("hookline.invalid", &b"k"[..], &b"{"[..])
        );
    }

    #[test]
    fn one_stuck_record_does_not_fill_the_partition_until_the_span_limit() {
        let mut s = Settlements::new("deliver", 4);
        assert!(s.track(&tp(), 0));
        // Offset 0 hangs; everything behind it settles at once.
        for offset in 1..(4 * SPAN_FACTOR as i64 - 1) {
            assert!(s.track(&tp(), offset));
            s.settle(&tp(), offset);
            assert!(!s.needs_pause(&tp()), "paused at offset {offset}");
        }
        assert!(s.track(&tp(), 4 * SPAN_FACTOR as i64 - 1));
        assert!(s.needs_pause(&tp()), "the span is bounded too");
    }

    #[test]
    fn a_partition_paused_on_its_span_resumes_once_a_window_fits_again() {
        let mut s = Settlements::new("deliver", 4);
        let limit = 4 * SPAN_FACTOR as i64;
        assert!(s.track(&tp(), 0));
        for offset in 1..limit {
            assert!(s.track(&tp(), offset));
            s.settle(&tp(), offset);
        }
        let drained = |s: &Settlements| s.drained(&s.trackers[&tp()]);
        assert!(s.needs_pause(&tp()));
        assert!(!drained(&s), "offset 0 still pins the span at its limit");
        s.settle(&tp(), 0);
        assert!(drained(&s));
        // Unsettled records drain to half; the span needs room for one more window, not half.
        for offset in limit..limit + 4 {
            assert!(s.track(&tp(), offset));
        }
        assert!(s.needs_pause(&tp()));
        assert!(!drained(&s));
        s.settle(&tp(), limit + 3);
        assert!(!drained(&s), "three of four still unsettled");
        s.settle(&tp(), limit + 2);
        assert!(drained(&s));
    }

    fn tp1() -> Tp {
        Tp::new("deliveries", 1)
    }

    #[test]
    fn a_partition_stays_paused_while_any_reason_holds_it() {
        use PauseReason::{Hold, Window};
        let mut p = Pauses::default();
        assert_eq!(
            p.flips(&[tp()], Hold, true),
            [tp()],
            "the first reason pauses"
        );
        p.set(&tp(), Hold, true);
        assert!(
            p.flips(&[tp()], Window, true).is_empty(),
            "already paused: a second reason asks librdkafka nothing"
        );
        p.set(&tp(), Window, true);
        assert!(
            p.flips(&[tp()], Hold, false).is_empty(),
            "the hold ends, the window still holds it"
        );
        p.set(&tp(), Hold, false);
        assert!(p.holds(&tp(), Window) && !p.holds(&tp(), Hold));
        assert_eq!(
            p.flips(&[tp()], Window, false),
            [tp()],
            "the last reason resumes"
        );
        p.set(&tp(), Window, false);
        assert!(p.reasons.is_empty());

        // The other way round, and per partition.
        p.set(&tp(), Window, true);
        p.set(&tp(), Hold, true);
        p.set(&tp1(), Window, true);
        assert_eq!(
            p.flips(&[tp(), tp1()], Window, false),
            [tp1()],
            "tp's window drains while its hold lasts; tp1 has no other reason"
        );
    }

    #[test]
    fn clearing_a_reason_that_does_not_hold_resumes_nothing() {
        let mut p = Pauses::default();
        assert!(p.flips(&[tp()], PauseReason::Window, false).is_empty());
        p.set(&tp(), PauseReason::Hold, true);
        assert!(p.flips(&[tp()], PauseReason::Window, false).is_empty());
        p.set(&tp(), PauseReason::Window, false);
        assert!(p.holds(&tp(), PauseReason::Hold));
    }

    /// A record handed out again (librdkafka re-reads a partition from before a record it had
    /// handed out when a pause races the reading) is not taken twice, whether it is still in
    /// hand, settled, or committed; a new assignment of the partition takes it again.
    #[test]
    fn a_record_read_again_in_the_same_assignment_is_not_taken_twice() {
        let mut s = Settlements::new("deliver", 8);
        for offset in 0..4 {
            assert!(s.track(&tp(), offset));
        }
        s.settle(&tp(), 0);
        s.settle(&tp(), 2);
        for again in 0..4 {
            assert!(!s.track(&tp(), again), "offset {again} taken twice");
        }
        assert_eq!(s.in_flight(), 2, "what is in hand stays tracked as it was");
        s.settle(&tp(), 1);
        assert!(!s.track(&tp(), 1), "a settled offset is not taken again");
        assert!(s.track(&tp(), 4), "the partition goes on");
        // After a re-assignment the partition is read from its committed offset: taken anew.
        s.apply(&[RebalanceEvent::Assigned(vec![tp()])]);
        assert!(s.track(&tp(), 2));
    }

    /// A record with an offset no tracker takes (librdkafka hands out none below 0) is still
    /// handled, and the records in flight beside it stay tracked: the partition's commit
    /// frontier waits for them as before.
    #[test]
    fn an_offset_that_cannot_be_tracked_forgets_nothing_in_flight() {
        let mut s = Settlements::new("deliver", 8);
        for offset in 0..3 {
            assert!(s.track(&tp(), offset));
        }
        s.settle(&tp(), 1);
        assert!(s.track(&tp(), -1), "the record is handled, not dropped");
        assert_eq!(s.in_flight(), 2, "offsets 0 and 2 are still in flight");
        assert!(s.track(&tp(), 3));
        s.settle(&tp(), 3);
        let frontier = |s: &Settlements| s.trackers[&tp()].frontier();
        assert_eq!(frontier(&s), Some(0), "offset 0 holds the frontier");
        s.settle(&tp(), 0);
        s.settle(&tp(), 2);
        assert_eq!(frontier(&s), Some(4));
    }

    #[test]
    fn max_window_unsettled_records_fill_the_partition() {
        let mut s = Settlements::new("deliver", 4);
        for offset in 0..3 {
            assert!(s.track(&tp(), offset));
        }
        assert!(!s.needs_pause(&tp()));
        assert!(s.track(&tp(), 3));
        assert!(s.needs_pause(&tp()));
        s.settle(&tp(), 1);
        assert!(!s.needs_pause(&tp()), "three unsettled are below the bound");
    }
}

#[cfg(test)]
mod rebalance_tests {
    use super::*;
    use crate::kafka::{EmbeddedKafka, TopicSpec, consumer_config, producer_config};
    use rdkafka::Message;
    use rdkafka::producer::FutureRecord;
    use std::collections::BTreeMap;

    /// Polls `consumer` (which runs its rebalance callbacks) until `settlements` has seen an
    /// event that `want` accepts, or 30 s pass. Records read meanwhile are returned.
    async fn until_event(
        consumer: &StageConsumer,
        settlements: &mut Settlements,
        want: impl Fn(&RebalanceEvent) -> bool,
    ) -> Vec<RebalanceEvent> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let mut seen = vec![];
        while tokio::time::Instant::now() < deadline {
            let _ = tokio::time::timeout(Duration::from_millis(200), consumer.recv()).await;
            let events = settlements.sync(consumer);
            let done = events.iter().any(&want);
            seen.extend(events);
            if done {
                return seen;
            }
        }
        panic!("no such rebalance within 30 s; saw {seen:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_partition_paused_before_it_moved_away_is_fetched_when_it_comes_back() {
        let kafka = EmbeddedKafka::start(&[TopicSpec {
            name: "t".into(),
            partitions: 2,
            compacted: false,
        }])
        .unwrap();
        let none = BTreeMap::new();
        let a: StageConsumer = consumer_config(kafka.bootstrap_servers(), "g", &none)
            .create_with_context(StageContext::new("delay"))
            .unwrap();
        a.subscribe(&["t"]).unwrap();
        let mut sa = Settlements::new("delay", 100);
        until_event(
            &a,
            &mut sa,
            |e| matches!(e, RebalanceEvent::Assigned(t) if t.len() == 2),
        )
        .await;
        // A stage pauses both partitions (held records, a full window).
        let mut both = TopicPartitionList::new();
        both.add_partition("t", 0);
        both.add_partition("t", 1);
        a.pause(&both).unwrap();

        // A second member takes one partition, then leaves: it comes back to the first.
        let b: StageConsumer = consumer_config(kafka.bootstrap_servers(), "g", &none)
            .create_with_context(StageContext::new("delay"))
            .unwrap();
        b.subscribe(&["t"]).unwrap();
        let revoked = until_event(&a, &mut sa, |e| matches!(e, RebalanceEvent::Revoked(_))).await;
        let moved = revoked
            .iter()
            .find_map(|e| match e {
                RebalanceEvent::Revoked(t) => t.first().cloned(),
                RebalanceEvent::Assigned(_) => None,
            })
            .unwrap();
        let _ = tokio::time::timeout(Duration::from_secs(3), b.recv()).await;
        drop(b);
        until_event(
            &a,
            &mut sa,
            |e| matches!(e, RebalanceEvent::Assigned(t) if t.contains(&moved)),
        )
        .await;

        let producer: crate::kafka::Producer = producer_config(kafka.bootstrap_servers(), &none)
            .create_with_context(crate::kafka::ProducerLog::default())
            .unwrap();
        producer
            .send(
                FutureRecord::to("t")
                    .partition(moved.partition)
                    .key("k")
                    .payload("back"),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        let got = tokio::time::timeout(Duration::from_secs(15), async {
            loop {
                if let Ok(m) = a.recv().await
                    && m.partition() == moved.partition
                {
                    return m.offset();
                }
            }
        })
        .await;
        assert!(
            got.is_ok(),
            "partition {moved:?} came back to its old member still paused: nothing read in 15 s"
        );
    }
}
