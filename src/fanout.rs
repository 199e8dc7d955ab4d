//! The fan-out stage: consumes the input topics (Debezium outbox topics, the native events topic;
//! group `hookline-fanout`), and turns each event into one delivery record per subscribed
//! endpoint on the deliveries topic, keyed by endpoint id.
//!
//! The body is serialised once per event and shared by every delivery record. An input offset
//! is settled only after every delivery record made from it is acknowledged, so a crash at any
//! point re-reads the event and produces the same delivery ids again. A record that is not an
//! event goes to the invalid topic with a reason header; the partition moves on.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use rdkafka::Message;
use rdkafka::message::Header;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::deliver::outgoing;
use crate::id::{EventId, Tenant};
use crate::input::{InputConfig, InputEvent, InvalidInput, parse_message};
use crate::record::{DeliveryRecord, Origin, UnixMillis};
use crate::registry::{EndpointView, ViewStatus};
use crate::stage::{Outgoing, Settlements, StageConsumer, Tp, forget_moved, produce_until_acked};
use crate::subscription::{SubscriptionIndex, parse_filters};
use crate::telemetry;

/// Where the fan-out writes.
#[derive(Debug, Clone)]
pub struct FanoutTopics {
    /// Delivery records.
    pub deliveries: Arc<str>,
    /// Records that are not events.
    pub invalid: Arc<str>,
}

/// Event ids remembered per input partition to drop repeated ingests of the same event.
const RECENT_IDS: usize = 100_000;
/// Input records held per partition before it is paused.
const MAX_WINDOW: usize = 5_000;

/// The subscription index, rebuilt from the endpoint view whenever it changes.
struct Subscriptions {
    view: Arc<EndpointView>,
    status: watch::Receiver<ViewStatus>,
    index: SubscriptionIndex,
}

impl Subscriptions {
    fn new(view: Arc<EndpointView>) -> Subscriptions {
        let mut s = Subscriptions {
            status: view.subscribe(),
            view,
            index: SubscriptionIndex::new(),
        };
        s.rebuild();
        s
    }

    fn rebuild(&mut self) {
        let mut index = SubscriptionIndex::new();
        for e in self.view.all() {
            match parse_filters(&e.event_types) {
                Ok(filters) => index.upsert(e.id.clone(), e.tenant.clone(), filters, e.enabled),
                Err(err) => tracing::warn!(endpoint_id = %e.id, error = %err,
                    "endpoint has unusable event-type filters; it receives nothing"),
            }
        }
        self.index = index;
    }

    /// Rebuilds when the view changed since the last look (a cheap check per record, so an
    /// endpoint created just before an event is posted always sees it).
    fn refresh(&mut self) {
        if self.status.has_changed().unwrap_or(false) {
            self.status.borrow_and_update();
            self.rebuild();
        }
    }
}

/// Recently seen (tenant, event id) pairs of one partition, bounded. Event ids are unique per
/// tenant, so two tenants may use the same id.
#[derive(Default)]
struct Recent {
    set: HashSet<(Tenant, EventId)>,
    order: VecDeque<(Tenant, EventId)>,
}

impl Recent {
    /// Remembers the event; false if it was already there.
    fn insert(&mut self, tenant: &Tenant, id: &EventId) -> bool {
        let key = (tenant.clone(), id.clone());
        if self.set.contains(&key) {
            return false;
        }
        if self.order.len() == RECENT_IDS
            && let Some(old) = self.order.pop_front()
        {
            self.set.remove(&old);
        }
        self.set.insert(key.clone());
        self.order.push_back(key);
        true
    }
}

/// The delivery records for one event: one per subscribed endpoint, sharing one body.
pub fn fan_out(
    event: &InputEvent,
    index: &SubscriptionIndex,
    origin: Option<Origin>,
    topic: &Arc<str>,
) -> Vec<Outgoing> {
    let endpoints = index.matching_refs(&event.tenant, event.event_type.as_str());
    if endpoints.is_empty() {
        return vec![];
    }
    let body = event.body_bytes();
    let time = UnixMillis::from_system_time(event.occurred_at);
    endpoints
        .into_iter()
        .map(|endpoint| {
            let record = DeliveryRecord::new(
                event.id.clone(),
                endpoint.clone(),
                event.tenant.clone(),
                event.event_type.clone(),
                time,
                origin.clone(),
                body.clone(),
            );
            outgoing(topic.clone(), &record)
        })
        .collect()
}

/// The original record, key, value and headers, with the reason added, for the invalid topic.
/// A value that would make the record larger than the producer writes (`max_record`; an input
/// topic may hold larger records than that) is left out, and the detail says so and where the
/// original stays: a forward that can never be written would hold its partition forever.
fn invalid_record(
    msg: &rdkafka::message::BorrowedMessage<'_>,
    mut invalid: InvalidInput,
    topic: &Arc<str>,
    max_record: usize,
) -> Outgoing {
    let key = msg.key().unwrap_or_default();
    let mut value = msg.payload().unwrap_or_default();
    // The same room a payload leaves for headers, here the original's and the two added.
    let headroom = crate::config::RECORD_HEADROOM as usize;
    if key.len() + value.len() > max_record.saturating_sub(headroom) {
        invalid = invalid.and(&format!(
            "the value ({} bytes) is left out, too large to forward within {max_record} bytes \
             (kafka.client message.max.bytes); the original is at {} partition {} offset {}",
            value.len(),
            msg.topic(),
            msg.partition(),
            msg.offset()
        ));
        value = &[];
    }
    let mut headers = msg.headers().map(|h| h.detach()).unwrap_or_default();
    for (key, value) in invalid.headers() {
        headers = headers.insert(Header {
            key,
            value: Some(value.as_str()),
        });
    }
    Outgoing {
        topic: topic.clone(),
        key: key.to_vec(),
        headers,
        payload: bytes::Bytes::copy_from_slice(value),
    }
}

/// Runs the fan-out stage until `shutdown`, then waits (bounded) for records under way and
/// commits what settled.
pub async fn run(
    consumer: StageConsumer,
    producer: crate::kafka::Producer,
    view: Arc<EndpointView>,
    input: InputConfig,
    topics: FanoutTopics,
    shutdown: CancellationToken,
) {
    let mut subs = Subscriptions::new(view);
    let mut settlements = Settlements::new("fanout", MAX_WINDOW);
    let mut recent: std::collections::HashMap<Tp, Recent> = std::collections::HashMap::new();
    let mut pending = FuturesUnordered::new();
    let stop = CancellationToken::new();
    let send_all = |tp: Tp, offset: i64, records: Vec<Outgoing>| {
        let producer = producer.clone();
        let stop = stop.clone();
        async move {
            let sends = records
                .into_iter()
                .map(|r| produce_until_acked(&producer, r, &stop));
            let acked = futures::future::join_all(sends)
                .await
                .into_iter()
                .all(|ok| ok);
            (tp, offset, acked)
        }
    };
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            Some((tp, offset, acked)) = pending.next() => if acked { settlements.settle(&tp, offset) },
            _ = tick.tick() => {
                forget_moved(&mut recent, &settlements.maintain(&consumer));
            }
            msg = consumer.recv() => {
                let msg = match msg {
                    Ok(m) => m,
                    Err(e) => {
                        // A named input topic that does not exist yet is reported by the
                        // consumer's context.
                        if e.rdkafka_error_code() != Some(rdkafka::error::RDKafkaErrorCode::UnknownTopicOrPartition) {
                            telemetry::consumer_error("fanout", &e);
                        }
                        continue;
                    }
                };
                forget_moved(&mut recent, &settlements.sync(&consumer));
                let tp: Tp = (Arc::from(msg.topic()), msg.partition());
                let offset = msg.offset();
                settlements.track(&tp, offset);
                subs.refresh();
                match parse_message(&input, &msg, SystemTime::now()) {
                    Ok(event) => {
                        if !recent.entry(tp.clone()).or_default().insert(&event.tenant, &event.id) {
                            tracing::debug!(event_id = %event.id, "repeated event id; already fanned out");
                            settlements.settle(&tp, offset);
                            continue;
                        }
                        let origin = Some(Origin { topic: tp.0.to_string(), partition: tp.1, offset });
                        let records = fan_out(&event, &subs.index, origin, &topics.deliveries);
                        telemetry::fanned_out(records.len());
                        if records.is_empty() {
                            settlements.settle(&tp, offset);
                        } else {
                            pending.push(send_all(tp, offset, records));
                        }
                    }
                    Err(invalid) => {
                        telemetry::invalid_record(&tp.0, tp.1, offset, invalid.reason.kind(), &invalid.detail);
                        let out = invalid_record(&msg, invalid, &topics.invalid, input.max_record);
                        pending.push(send_all(tp, offset, vec![out]));
                    }
                }
            }
        }
    }
    let deadline = tokio::time::sleep(Duration::from_secs(10));
    tokio::pin!(deadline);
    while !pending.is_empty() {
        tokio::select! {
            Some((tp, offset, acked)) = pending.next() => if acked { settlements.settle(&tp, offset) },
            () = &mut deadline => { stop.cancel(); break; }
        }
    }
    settlements.store(&consumer);
    if let Err(e) = rdkafka::consumer::Consumer::commit_consumer_state(
        &consumer,
        rdkafka::consumer::CommitMode::Sync,
    ) {
        tracing::debug!(error = %e, "final commit of the fan-out stage");
    }
    stop.cancel();
}
