//! Delay tiers: fixed topics (`hookline.retry.5s`, `hookline.retry.30s`, ...) that hold records
//! until their `not_before`, then put them back on the deliveries topic.
//!
//! A retry due in `d` goes to the largest tier not longer than `d` with its exact due time in a
//! header, so no record ever waits in a tier past its due time by more than [`HOLD_BATCH`] plus
//! the time the records ahead of it in the same partition are held. The tier consumer holds
//! each partition's head record in memory, pauses that partition (while still polling, so the
//! group keeps it) until the head is due, forwards it, and resumes.
//!
//! A held head is forwarded [`HOLD_BATCH`] after its due time, never before it. Records parked
//! or retried in a burst are due milliseconds apart, and librdkafka drops a partition's
//! prefetched records when it is paused: released exactly on time, each record of a burst cost
//! a pause, a resume and a fetch of its own (re-reading up to a fetch's worth of the log). Held a
//! little past the head's due time, the records due right behind it are due too when the
//! partition is read again, and go back in the same fetch.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use rdkafka::Message;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::Consumer;
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::FutureProducer;
use tokio_util::sync::CancellationToken;

use crate::config::tier_name;
use crate::record::DeliveryRecord;
use crate::stage::{Outgoing, Settlements, StageConsumer, Tp, forget_moved, produce_until_acked};

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
            .unwrap_or(&self.tiers[self.tiers.len() - 1])
    }

    /// Every tier, shortest first.
    pub fn all(&self) -> &[Tier] {
        &self.tiers
    }

    /// The shortest tier.
    pub fn shortest(&self) -> &Tier {
        &self.tiers[0]
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

/// A partition's head record, held until due.
struct Held {
    due: SystemTime,
    offset: i64,
    outgoing: Outgoing,
}

/// Records a tier partition may have forwarded but not yet acknowledged.
const MAX_WINDOW: usize = 10_000;

/// How long after its due time a held head is forwarded, so that the records due right behind
/// it go back with it (see the module doc). Small beside the shortest tier (seconds), and the
/// delivery stage sends whatever arrives due.
pub const HOLD_BATCH: Duration = Duration::from_millis(100);

/// When a head due at `due` is forwarded.
fn release_at(due: SystemTime) -> SystemTime {
    due + HOLD_BATCH
}

/// The delay stage: consumes every tier topic (group `hookline-delay`) and forwards due records.
pub async fn run(
    consumer: StageConsumer,
    producer: FutureProducer,
    topics: DelayTopics,
    shutdown: CancellationToken,
) {
    let mut settlements = Settlements::new("delay", MAX_WINDOW);
    let mut held: HashMap<Tp, Held> = HashMap::new();
    let mut forwards = FuturesUnordered::new();
    let forward = |tp: Tp, offset: i64, out: Outgoing| {
        let producer = producer.clone();
        let shutdown = shutdown.clone();
        async move {
            let acked = produce_until_acked(&producer, out, &shutdown).await;
            (tp, offset, acked)
        }
    };
    let mut store_tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        let next_release = held.values().map(|h| release_at(h.due)).min();
        let sleep_for = next_release.map(|at| {
            at.duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO)
        });
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            Some((tp, offset, acked)) = forwards.next() => {
                if acked {
                    settlements.settle(&tp, offset);
                }
            }
            () = sleep_or_never(sleep_for) => {
                let now = SystemTime::now();
                let due: Vec<Tp> = held.iter().filter(|(_, h)| release_at(h.due) <= now).map(|(tp, _)| tp.clone()).collect();
                for tp in due {
                    let h = held.remove(&tp).expect("listed above");
                    forwards.push(forward(tp.clone(), h.offset, h.outgoing));
                    let mut tpl = TopicPartitionList::new();
                    tpl.add_partition(&tp.0, tp.1);
                    if let Err(e) = consumer.resume(&tpl) {
                        tracing::warn!(topic = %tp.0, partition = tp.1, error = %e, "resume failed");
                    }
                }
            }
            _ = store_tick.tick() => {
                // A held head of a partition that moved is re-read by its new owner.
                forget_moved(&mut held, &settlements.maintain(&consumer));
            }
            msg = consumer.recv() => {
                let msg = match msg {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::warn!(error = %e, "delay tier consumer error");
                        continue;
                    }
                };
                forget_moved(&mut held, &settlements.sync(&consumer));
                let tp: Tp = (Arc::from(msg.topic()), msg.partition());
                let offset = msg.offset();
                settlements.track(&tp, offset);
                let headers = msg.headers().map(|h| h.detach()).unwrap_or_else(OwnedHeaders::new);
                let payload = bytes::Bytes::copy_from_slice(msg.payload().unwrap_or_default());
                let key = msg.key().unwrap_or_default().to_vec();
                match DeliveryRecord::from_message(&msg) {
                    Ok(record) => {
                        // Forward the bytes exactly as they are: nothing re-serialises them.
                        let out = Outgoing { topic: topics.deliveries.clone(), key, headers, payload };
                        match record.due_at().filter(|due| *due > SystemTime::now()) {
                            None => forwards.push(forward(tp, offset, out)),
                            Some(due) => {
                                let mut tpl = TopicPartitionList::new();
                                tpl.add_partition(&tp.0, tp.1);
                                if let Err(e) = consumer.pause(&tpl) {
                                    tracing::warn!(topic = %tp.0, partition = tp.1, error = %e, "pause failed");
                                }
                                held.insert(tp, Held { due, offset, outgoing: out });
                            }
                        }
                    }
                    Err(e) => {
                        tracing::warn!(topic = %tp.0, partition = tp.1, offset, error = %e,
                            "undecodable record in a delay tier; sending it to the invalid topic");
                        let headers = headers
                            .insert(rdkafka::message::Header { key: crate::input::INVALID_REASON_HEADER, value: Some("bad_delivery_record") })
                            .insert(rdkafka::message::Header { key: crate::input::INVALID_DETAIL_HEADER, value: Some(e.to_string().as_str()) });
                        let out = Outgoing { topic: topics.invalid.clone(), key, headers, payload };
                        forwards.push(forward(tp, offset, out));
                    }
                }
            }
        }
    }
    drain(&consumer, &mut settlements, &mut forwards).await;
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
    F: std::future::Future<Output = (Tp, i64, bool)>,
{
    let deadline = tokio::time::sleep(Duration::from_secs(10));
    tokio::pin!(deadline);
    while !forwards.is_empty() {
        tokio::select! {
            Some((tp, offset, acked)) = forwards.next() => if acked { settlements.settle(&tp, offset) },
            () = &mut deadline => break,
        }
    }
    settlements.store(consumer);
    if let Err(e) = consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Sync) {
        tracing::debug!(error = %e, "final commit of the delay stage");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_head_goes_back_a_little_after_its_due_time_never_before() {
        let due = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert!(release_at(due) > due, "never before it is due");
        assert_eq!(release_at(due), due + HOLD_BATCH);
        assert!(
            HOLD_BATCH >= Duration::from_millis(20) && HOLD_BATCH < Duration::from_secs(1),
            "long enough to gather a burst, short beside the 5 s shortest tier"
        );
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
