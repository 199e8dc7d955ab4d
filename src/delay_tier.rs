//! Delay tiers: fixed topics (`hookline.retry.5s`, `hookline.retry.30s`, ...) that hold records
//! until their `not_before`, then put them back on the deliveries topic.
//!
//! A retry due in `d` goes to the largest tier not longer than `d` with its exact due time in a
//! header. The tier consumer reads each partition a little ahead of the clock into memory and
//! forwards each record when it is due, never before, in offset order: a record due earlier
//! than one ahead of it in the same partition waits for that one. A record goes back at most
//! [`HOLD_BATCH`] after its due time, together with every record of its partition due by then.
//!
//! It pauses a partition (while still polling, so the group keeps it) once the last record it
//! holds from it is due more than [`READ_AHEAD`] from now, and resumes it once that record is
//! due within [`RESUME_AHEAD`]. librdkafka drops a paused partition's prefetched records and
//! fetches a resumed one only when its broker thread next wakes: at the consumer's next fetch
//! response (every idle fetch wait of the other partitions) or, with every partition paused,
//! after up to a second. Resumed that far ahead, the records behind are in memory by the time
//! they are due; read ahead that far, a burst due milliseconds apart costs one pause and one
//! resume per second of due times, not per record. Memory stays bounded: at most [`MAX_HELD`]
//! records per partition, and [`MAX_HELD_BYTES`] of bodies over all partitions beyond one
//! record per partition; a partition over either pauses until it has forwarded half of it.
//! Records forwarded and not yet acknowledged count against the partition's offset window
//! ([`MAX_WINDOW`]) with those held. These pauses are reasons kept by [`Settlements`]
//! ([`PauseReason::Hold`] here, [`PauseReason::Window`] there): a partition resumes only once
//! neither holds, so a due head never reads past a full window, nor a drained window past the
//! read-ahead.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use rdkafka::Message;
use rdkafka::consumer::Consumer;
use rdkafka::message::OwnedHeaders;
use tokio_util::sync::CancellationToken;

use crate::record::DeliveryRecord;
use crate::stage::{
    Outgoing, PauseReason, Settlements, StageConsumer, Tp, Written, forget_moved, invalid_forward,
    produce_until_acked,
};

/// One delay tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tier {
    /// How long records in it wait, at most.
    pub delay: Duration,
    /// Short name (`5s`, `2m`, `1h`), also the metric label.
    pub name: String,
    /// Its topic.
    pub topic: Arc<str>,
}

/// The configured tiers, shortest first.
#[derive(Debug, Clone)]
pub struct Tiers {
    tiers: Vec<Tier>,
}

impl Tiers {
    /// Tiers with topics `{prefix}{name}`. Durations are sorted and de-duplicated; at least one
    /// is required (the configuration validates that).
    pub fn new(prefix: &str, delays: &[Duration]) -> Tiers {
        let mut delays = delays.to_vec();
        delays.sort();
        delays.dedup();
        assert!(!delays.is_empty(), "at least one delay tier is configured");
        Tiers {
            tiers: delays
                .into_iter()
                .map(|delay| {
                    let name = tier_name(delay);
                    Tier {
                        delay,
                        topic: Arc::from(format!("{prefix}{name}")),
                        name,
                    }
                })
                .collect(),
        }
    }

    /// The tier for a record due in `delay`: the largest not longer than it, or the shortest.
    pub fn for_delay(&self, delay: Duration) -> &Tier {
        self.tiers
            .iter()
            .rev()
            .find(|t| t.delay <= delay)
            .unwrap_or(&self.tiers[0])
    }

    /// The shortest tier at least `delay` long, or the longest: where a record goes that must
    /// not come back before `delay`, without holding up the records behind it in its tier.
    pub fn at_least(&self, delay: Duration) -> &Tier {
        self.tiers
            .iter()
            .find(|t| t.delay >= delay)
            .unwrap_or(self.longest())
    }

    /// Every tier, shortest first.
    pub fn all(&self) -> &[Tier] {
        &self.tiers
    }

    /// The shortest tier.
    pub fn shortest(&self) -> &Tier {
        &self.tiers[0]
    }

    /// The longest tier.
    pub fn longest(&self) -> &Tier {
        &self.tiers[self.tiers.len() - 1]
    }
}

/// Where the delay stage reads and writes.
#[derive(Debug, Clone)]
pub struct DelayTopics {
    /// Where due records go back to.
    pub deliveries: Arc<str>,
    /// Where undecodable records go (with a reason header).
    pub invalid: Arc<str>,
}

/// A record read from a tier partition and not yet forwarded.
struct Held {
    due: SystemTime,
    offset: i64,
    outgoing: Outgoing,
}

/// What the stage holds from one tier partition, in offset order, and whether it holds the
/// partition paused ([`PauseReason::Hold`]; its window may pause it as well).
#[derive(Default)]
struct Partition {
    held: VecDeque<Held>,
    bytes: usize,
    paused: bool,
}

impl Partition {
    fn push(&mut self, held: Held) {
        self.bytes += held.outgoing.payload.len();
        self.held.push_back(held);
    }

    /// The front record if it is due at `now`.
    fn pop_due(&mut self, now: SystemTime) -> Option<Held> {
        if self.held.front()?.due > now {
            return None;
        }
        let held = self.held.pop_front()?;
        self.bytes -= held.outgoing.payload.len();
        Some(held)
    }

    /// Whether the partition should be paused at `now`, with `all_bytes` held over every
    /// partition. A paused partition resumes only once it is well under each bound, so that
    /// a burst costs a pause and a resume per stretch of due times, not per record.
    fn wants_pause(&self, all_bytes: usize, now: SystemTime) -> bool {
        let Some(last) = self.held.back() else {
            return false;
        };
        // Over these a partition pauses; a paused one resumes at or under the latter ones.
        let (ahead, records, bytes) = if self.paused {
            (RESUME_AHEAD, MAX_HELD / 2, MAX_HELD_BYTES / 2)
        } else {
            (READ_AHEAD, MAX_HELD - 1, MAX_HELD_BYTES)
        };
        last.due > now + ahead
            || self.held.len() > records
            || (all_bytes > bytes && self.held.len() > 1)
    }

    /// When the stage should next look at this partition: [`HOLD_BATCH`] after its front record
    /// is due (to forward it with every record due by then), or when it may resume.
    fn wake_at(&self, now: SystemTime) -> Option<SystemTime> {
        let forward = self.held.front().map(|h| h.due + HOLD_BATCH);
        [forward, self.resume_at(now)].into_iter().flatten().min()
    }

    /// When a paused partition may resume by the clock alone, if that is still ahead of `now`
    /// (its other bounds change only as it forwards, which its front's due time wakes for).
    fn resume_at(&self, now: SystemTime) -> Option<SystemTime> {
        let last = self.held.back()?;
        let at = last.due.checked_sub(RESUME_AHEAD).unwrap_or(last.due);
        (self.paused && at > now).then_some(at)
    }
}

/// Records a tier partition may have read and not yet had acknowledged (held, or forwarded and
/// waiting for the broker): its offset window. A full window pauses the partition until half of
/// them are acknowledged, whatever its held records' due times.
pub const MAX_WINDOW: usize = 10_000;

/// A partition is paused once the last record held from it is due further ahead than this.
pub const READ_AHEAD: Duration = Duration::from_secs(3);

/// A paused partition resumes once the last record held from it is due within this: longer
/// than librdkafka takes to fetch a resumed partition (up to a second, see the module doc).
pub const RESUME_AHEAD: Duration = Duration::from_millis(1500);

/// How long past its due time a record may wait so that it goes back with the records due
/// right behind it: a burst due milliseconds apart goes back in a few produce requests, not one
/// per record. Small beside the shortest tier (seconds).
pub const HOLD_BATCH: Duration = Duration::from_millis(100);

/// Records held per partition at most (a partition with this many pauses). Under the offset
/// window ([`MAX_WINDOW`]), whose flow control would otherwise pause the partition first; half
/// of it must last out a resume (up to a second), so bursts due up to about 2,000 records a
/// second per partition go back on time.
pub const MAX_HELD: usize = 4_000;

/// Bodies held over all partitions at most, beyond one record per partition.
pub const MAX_HELD_BYTES: usize = 32 * 1024 * 1024;

/// The delay stage: consumes every tier topic (group `hookline-delay`) and forwards due records.
pub async fn run(
    consumer: StageConsumer,
    producer: crate::kafka::Producer,
    topics: DelayTopics,
    shutdown: CancellationToken,
) {
    stage(&consumer, producer, topics, shutdown).await;
}

/// [`run`] on a borrowed consumer, which a test can ask where the stage has read to.
async fn stage(
    consumer: &StageConsumer,
    producer: crate::kafka::Producer,
    topics: DelayTopics,
    shutdown: CancellationToken,
) {
    let mut settlements = Settlements::new("delay", MAX_WINDOW);
    let mut parts: HashMap<Tp, Partition> = HashMap::new();
    let mut forwards = FuturesUnordered::new();
    let forward = |tp: Tp, offset: i64, out: Outgoing| {
        let producer = producer.clone();
        let shutdown = shutdown.clone();
        async move {
            let acked = produce_until_acked(&producer, out, &shutdown).await;
            Written { tp, offset, acked }
        }
    };
    let mut store_tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        let now = SystemTime::now();
        let next_wake = parts.values().filter_map(|p| p.wake_at(now)).min();
        let sleep_for = next_wake.map(|at| at.duration_since(now).unwrap_or(Duration::ZERO));
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            Some(Written { tp, offset, acked }) = forwards.next() => {
                if acked {
                    settlements.settle(&tp, offset);
                }
            }
            () = sleep_or_never(sleep_for) => {
                let now = SystemTime::now();
                for (tp, p) in &mut parts {
                    while let Some(h) = p.pop_due(now) {
                        forwards.push(forward(tp.clone(), h.offset, h.outgoing));
                    }
                }
                pause_or_resume(consumer, &mut settlements, &mut parts, None, now);
            }
            _ = store_tick.tick() => {
                // What is held from a partition that moved is re-read by its new owner.
                forget_moved(&mut parts, &settlements.maintain(consumer));
            }
            msg = consumer.recv() => {
                let msg = match msg {
                    Ok(m) => m,
                    Err(e) => {
                        crate::telemetry::consumer_error("delay", &e);
                        continue;
                    }
                };
                forget_moved(&mut parts, &settlements.sync(consumer));
                let tp = Tp::new(msg.topic(), msg.partition());
                let offset = msg.offset();
                if !settlements.track(&tp, offset) {
                    continue;
                }
                // Paused at the record that fills the window rather than at the next tick: a
                // burst due at once is forwarded as fast as it is read, and would overshoot.
                if settlements.needs_pause(&tp) {
                    settlements.flow_control(consumer);
                }
                let headers = msg.headers().map(|h| h.detach()).unwrap_or_else(OwnedHeaders::new);
                let payload = bytes::Bytes::copy_from_slice(msg.payload().unwrap_or_default());
                let key = msg.key().unwrap_or_default().to_vec();
                let now = SystemTime::now();
                let (out, due) = match DeliveryRecord::from_message(&msg) {
                    // Forward the bytes exactly as they are: nothing re-serialises them.
                    Ok(record) => (
                        Outgoing { topic: topics.deliveries.clone(), key, headers, payload },
                        record.due_at().unwrap_or(now),
                    ),
                    Err(e) => {
                        tracing::warn!(topic = %tp.topic, partition = tp.partition, offset, error = %e,
                            "undecodable record in a delay tier; sending it to the invalid topic");
                        let out = invalid_forward(topics.invalid.clone(), key, headers, payload,
                            crate::stage::BAD_DELIVERY_RECORD, &e.to_string());
                        (out, now)
                    }
                };
                let part = parts.entry(tp.clone()).or_default();
                if due <= now && part.held.is_empty() {
                    forwards.push(forward(tp, offset, out));
                } else {
                    part.push(Held { due, offset, outgoing: out });
                    pause_or_resume(consumer, &mut settlements, &mut parts, Some(&tp), now);
                }
            }
        }
    }
    drain(consumer, &mut settlements, &mut forwards).await;
}

/// Sets or clears this stage's [`PauseReason::Hold`] as [`Partition::wants_pause`] says: for
/// `only` the one that just took a record, or every one (after forwarding, which frees room for
/// all). A partition whose hold ends stays paused while its window is full. Forgets the
/// partitions that hold nothing and are not held paused.
fn pause_or_resume(
    consumer: &StageConsumer,
    settlements: &mut Settlements,
    parts: &mut HashMap<Tp, Partition>,
    only: Option<&Tp>,
    now: SystemTime,
) {
    let all_bytes = parts.values().map(|p| p.bytes).sum();
    let mut pause = vec![];
    let mut resume = vec![];
    for (tp, p) in parts.iter() {
        if only.is_some_and(|o| o != tp) {
            continue;
        }
        match (p.paused, p.wants_pause(all_bytes, now)) {
            (false, true) => pause.push(tp.clone()),
            (true, false) => resume.push(tp.clone()),
            _ => {}
        }
    }
    for (tps, paused) in [(pause, true), (resume, false)] {
        // A refusal is logged there and leaves the reason as it was: the next look asks again.
        let _ = settlements.set_pause_reason(consumer, &tps, PauseReason::Hold, paused);
        for tp in &tps {
            if let Some(p) = parts.get_mut(tp) {
                p.paused = settlements.paused_for(tp, PauseReason::Hold);
            }
        }
    }
    parts.retain(|_, p| p.paused || !p.held.is_empty());
}

async fn sleep_or_never(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// Waits (bounded) for forwards already under way, then stores what settled and commits.
async fn drain<F>(
    consumer: &StageConsumer,
    settlements: &mut Settlements,
    forwards: &mut FuturesUnordered<F>,
) where
    F: std::future::Future<Output = Written>,
{
    let deadline = tokio::time::sleep(Duration::from_secs(10));
    tokio::pin!(deadline);
    while !forwards.is_empty() {
        tokio::select! {
            Some(w) = forwards.next() => if w.acked { settlements.settle(&w.tp, w.offset) },
            () = &mut deadline => break,
        }
    }
    settlements.store(consumer);
    if let Err(e) = consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Sync) {
        tracing::debug!(error = %e, "final commit of the delay stage");
    }
}

/// A tier's name in its topic: the largest unit that divides it exactly (`5s`, `2m`, `6h`,
/// `1d`, `1500ms`), so names stay short and legal in topic names.
pub fn tier_name(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, size) in [
        ("d", 86_400_000u128),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
    ] {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(due: SystemTime, offset: i64, bytes: usize) -> Held {
        Held {
            due,
            offset,
            outgoing: Outgoing {
                topic: Arc::from("hookline.deliveries"),
                key: b"ep_1".to_vec(),
                headers: OwnedHeaders::new(),
                payload: bytes::Bytes::from(vec![b'x'; bytes]),
            },
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn tier_names_are_short_and_exact() {
        let n = |s| tier_name(Duration::from_millis(s));
        assert_eq!(n(5_000), "5s");
        assert_eq!(n(90_000), "90s");
        assert_eq!(n(120_000), "2m");
        assert_eq!(n(6 * 3_600_000), "6h");
        assert_eq!(n(86_400_000), "1d");
        assert_eq!(n(1_500), "1500ms");
    }

    #[test]
    fn records_go_back_in_offset_order_when_due_never_before() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut p = Partition::default();
        p.push(held(t0 + ms(10), 1, 100));
        // Due earlier, but behind offset 1: it waits for it.
        p.push(held(t0 + ms(5), 2, 100));
        p.push(held(t0 + ms(20), 3, 100));
        assert_eq!(p.bytes, 300);
        assert!(
            p.pop_due(t0 + ms(9)).is_none(),
            "nothing before its due time"
        );
        let offsets: Vec<i64> = std::iter::from_fn(|| p.pop_due(t0 + ms(10)))
            .map(|h| h.offset)
            .collect();
        assert_eq!(offsets, [1, 2], "offset 2 was due and goes right behind 1");
        assert!(p.pop_due(t0 + ms(19)).is_none());
        assert_eq!(p.pop_due(t0 + ms(20)).map(|h| h.offset), Some(3));
        assert_eq!(p.bytes, 0);
    }

    #[test]
    fn a_partition_pauses_once_it_reads_past_the_read_ahead_and_resumes_well_before_due() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut p = Partition::default();
        assert!(!p.wants_pause(0, now), "nothing held, nothing to pause for");
        p.push(held(now + READ_AHEAD, 1, 10));
        assert!(
            !p.wants_pause(10, now),
            "due within the read-ahead: read on"
        );
        p.push(held(now + READ_AHEAD + ms(1), 2, 10));
        assert!(p.wants_pause(20, now), "read past the read-ahead");
        p.paused = true;
        let resume = p.resume_at(now).expect("paused by the clock");
        assert_eq!(resume, now + READ_AHEAD + ms(1) - RESUME_AHEAD);
        assert!(
            p.wants_pause(20, resume - ms(1)),
            "stays paused until its last record is due within the resume margin"
        );
        assert!(!p.wants_pause(20, resume), "resumes then");
        assert!(
            p.resume_at(resume).is_none(),
            "no wake-up for a time gone by"
        );
        assert!(
            READ_AHEAD > RESUME_AHEAD && RESUME_AHEAD > Duration::from_secs(1),
            "resumed ahead of librdkafka's up-to-a-second fetch, with room to read a stretch"
        );
    }

    #[test]
    fn the_stage_wakes_a_little_after_the_front_is_due_or_to_resume() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut p = Partition::default();
        assert_eq!(p.wake_at(now), None, "nothing held");
        p.push(held(now + ms(10), 1, 1));
        p.push(held(now + ms(12), 2, 1));
        assert_eq!(p.wake_at(now), Some(now + ms(10) + HOLD_BATCH));
        assert!(
            HOLD_BATCH >= ms(20) && HOLD_BATCH < Duration::from_secs(1),
            "long enough to gather a burst, short beside the 5 s shortest tier"
        );
        let mut far = Partition::default();
        far.push(held(now + Duration::from_secs(60), 1, 1));
        far.paused = true;
        assert_eq!(
            far.wake_at(now),
            Some(now + Duration::from_secs(60) - RESUME_AHEAD),
            "a paused partition wakes the stage to resume before its front is due"
        );
    }

    #[test]
    fn held_records_and_bytes_are_bounded_with_room_to_drain() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut p = Partition::default();
        for i in 0..MAX_HELD - 1 {
            p.push(held(now, i64::try_from(i).unwrap(), 1));
        }
        assert!(!p.wants_pause(p.bytes, now));
        p.push(held(now, 1_000_000, 1));
        assert!(
            p.wants_pause(p.bytes, now),
            "{MAX_HELD} records held: pause"
        );
        p.paused = true;
        while p.held.len() > MAX_HELD / 2 {
            assert!(p.wants_pause(p.bytes, now), "paused until half drained");
            p.pop_due(now);
        }
        assert!(!p.wants_pause(p.bytes, now), "resumes at half");

        // Bytes count over every partition; one record per partition is always allowed.
        let mut big = Partition::default();
        big.push(held(now, 1, 1));
        assert!(
            !big.wants_pause(MAX_HELD_BYTES + 1, now),
            "a lone head always fits"
        );
        big.push(held(now, 2, 1));
        assert!(big.wants_pause(MAX_HELD_BYTES + 1, now));
        big.paused = true;
        assert!(
            big.wants_pause(MAX_HELD_BYTES / 2 + 1, now),
            "paused until half freed"
        );
        assert!(!big.wants_pause(MAX_HELD_BYTES / 2, now));
    }

    #[test]
    fn tiers_pick_the_largest_not_longer_than_the_delay() {
        let s = Duration::from_secs;
        let tiers = Tiers::new(
            "hookline.retry.",
            &[s(30), s(5), s(120), s(600), s(3600), s(21600)],
        );
        let names: Vec<&str> = tiers.all().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["5s", "30s", "2m", "10m", "1h", "6h"]);
        assert_eq!(
            &*tiers.for_delay(s(0)).topic,
            "hookline.retry.5s",
            "shorter than any tier"
        );
        assert_eq!(tiers.for_delay(s(5)).name, "5s");
        assert_eq!(tiers.for_delay(s(29)).name, "5s");
        assert_eq!(tiers.for_delay(s(30)).name, "30s");
        assert_eq!(tiers.for_delay(s(7199)).name, "1h");
        assert_eq!(tiers.for_delay(s(86400)).name, "6h");
        assert_eq!(tiers.at_least(s(0)).name, "5s");
        assert_eq!(tiers.at_least(s(5)).name, "5s");
        assert_eq!(tiers.at_least(s(15)).name, "30s");
        assert_eq!(tiers.at_least(s(86400)).name, "6h", "longer than any tier");
    }
}

#[cfg(test)]
mod stage_tests {
    use std::collections::BTreeMap;

    use rdkafka::producer::FutureRecord;

    use super::*;
    use crate::event_type::EventType;
    use crate::id::{EndpointId, EventId, Tenant};
    use crate::kafka::{
        DELAY_FETCH, EmbeddedKafka, ProducerLog, TopicSpec, producer_config, stage_consumer_config,
    };
    use crate::stage::StageContext;

    const TIER: &str = "hookline.retry.5s";

    /// A delay stage on the mock cluster whose forwards go to an address no broker listens on:
    /// nothing it forwards is ever acknowledged, so every record it reads stays in its window.
    /// (Fields drop in order: the clients leave before the cluster stops.)
    struct Unacked {
        consumer: StageConsumer,
        nowhere: crate::kafka::Producer,
        kafka: EmbeddedKafka,
    }

    impl Unacked {
        fn start() -> Unacked {
            let kafka = EmbeddedKafka::start(&[TopicSpec {
                name: TIER.into(),
                partitions: 1,
                compacted: false,
            }])
            .unwrap();
            let none = BTreeMap::new();
            let consumer: StageConsumer =
                stage_consumer_config(kafka.bootstrap_servers(), "delay", DELAY_FETCH, &none)
                    .create_with_context(StageContext::new("delay"))
                    .unwrap();
            consumer.subscribe(&[TIER]).unwrap();
            let nowhere = producer_config("127.0.0.1:1", &none)
                .create_with_context(ProducerLog::default())
                .unwrap();
            Unacked {
                consumer,
                nowhere,
                kafka,
            }
        }

        /// The stage, until `shutdown`.
        async fn run(&self, shutdown: &CancellationToken) {
            let topics = DelayTopics {
                deliveries: Arc::from("hookline.deliveries"),
                invalid: Arc::from("hookline.invalid"),
            };
            stage(
                &self.consumer,
                self.nowhere.clone(),
                topics,
                shutdown.clone(),
            )
            .await;
        }

        /// Records the stage has read from the tier's partition (its next offset: the topic
        /// starts at 0).
        fn read(&self) -> i64 {
            let Ok(position) = self.consumer.position() else {
                return 0;
            };
            match position.find_partition(TIER, 0).map(|e| e.offset()) {
                Some(rdkafka::Offset::Offset(n)) => n,
                _ => 0,
            }
        }

        /// Waits until the stage is assigned the tier's partition.
        async fn assigned(&self) {
            for _ in 0..600 {
                if self
                    .consumer
                    .assignment()
                    .is_ok_and(|a| a.find_partition(TIER, 0).is_some())
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("the tier partition was not assigned within 30 s");
        }

        /// Produces `n` delivery records to the tier, due at `due` (`None`: due at once).
        async fn produce(&self, n: usize, due: Option<SystemTime>) {
            let producer: crate::kafka::Producer =
                producer_config(self.kafka.bootstrap_servers(), &BTreeMap::new())
                    .create_with_context(ProducerLog::default())
                    .unwrap();
            let mut acks = vec![];
            for i in 0..n {
                let record = DeliveryRecord::new(
                    EventId::parse(format!("evt_{i}")).unwrap(),
                    EndpointId::parse("ep_1").unwrap(),
                    Tenant::parse("acme").unwrap(),
                    EventType::parse("t").unwrap(),
                    SystemTime::now().into(),
                    None,
                    bytes::Bytes::from_static(b"{}"),
                );
                let record = match due {
                    Some(at) => record.for_park(at),
                    None => record,
                };
                let out = crate::stage::outgoing(Arc::from(TIER), &record);
                let sent = producer.send_result(
                    FutureRecord::to(TIER)
                        .partition(0)
                        .key(&out.key[..])
                        .headers(out.headers)
                        .payload(&out.payload[..]),
                );
                acks.push(sent.map_err(|(e, _)| e).unwrap());
            }
            for ack in acks {
                ack.await.unwrap().map_err(|(e, _)| e).unwrap();
            }
        }

        /// Waits until the stage has read `n` records.
        async fn until_read(&self, n: i64) {
            for _ in 0..1200 {
                if self.read() >= n {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("the stage read {} records, not {n}, in 60 s", self.read());
        }
    }

    /// Records due at once go back as they are read, and a burst of them stops at the window:
    /// the stage pauses the partition at the record that fills it, not at its next tick.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_due_at_once_is_read_no_further_than_the_window() {
        let u = Unacked::start();
        let shutdown = CancellationToken::new();
        let test = async {
            u.assigned().await;
            u.produce(MAX_WINDOW + 5_000, None).await;
            let window = i64::try_from(MAX_WINDOW).unwrap();
            u.until_read(window).await;
            // Several of the stage's 200 ms ticks, each of which pauses a full partition.
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert_eq!(u.read(), window, "the stage read past its window");
            shutdown.cancel();
        };
        tokio::join!(u.run(&shutdown), test);
    }

    /// A window filled by unacknowledged forwards and held records keeps its partition paused
    /// when the held records come due and the stage's own hold on the partition ends: the stage
    /// reads no record past its window.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_due_head_does_not_resume_a_partition_whose_window_is_full() {
        let u = Unacked::start();
        let shutdown = CancellationToken::new();
        let test = async {
            u.assigned().await;
            // Records due at once are forwarded as they are read and never acknowledged; the
            // held ones fill the window to the record and hold the partition until they are due;
            // the ones behind them are due at once, so nothing but the window keeps them out.
            let forwarded = MAX_WINDOW - MAX_HELD;
            u.produce(forwarded, None).await;
            let due = SystemTime::now() + Duration::from_secs(5);
            u.produce(MAX_HELD, Some(due)).await;
            u.produce(100, None).await;
            let window = i64::try_from(MAX_WINDOW).unwrap();
            u.until_read(window).await;
            // The held records go out HOLD_BATCH after they are due; a resumed partition is
            // fetched again within about a second (see the module doc).
            let released = due + HOLD_BATCH + Duration::from_secs(3);
            if let Ok(wait) = released.duration_since(SystemTime::now()) {
                tokio::time::sleep(wait).await;
            }
            assert_eq!(
                u.read(),
                window,
                "the stage read past its window once its held records were due"
            );
            shutdown.cancel();
        };
        tokio::join!(u.run(&shutdown), test);
    }
}
