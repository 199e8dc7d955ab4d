//! The fan-out stage: consumes the input topics (Debezium outbox topics, the native events topic;
//! group `hookline-fanout`), and turns each event into one delivery record per subscribed
//! endpoint on the deliveries topic, keyed by endpoint id.
//!
//! The body is serialised once per event and shared by every delivery record. An input offset
//! is settled only after every delivery record made from it is acknowledged, so a crash at any
//! point re-reads the event and produces the same delivery ids again. A record that is not an
//! event goes to the invalid topic with a reason header; the partition moves on.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use rdkafka::Message;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::id::{EventId, Tenant};
use crate::input::{InputConfig, InputEvent, InvalidInput, parse_message};
use crate::record::{DeliveryRecord, Origin, UnixMillis};
use crate::registry::{EndpointView, ViewStatus};
use crate::stage::{
    Outgoing, PauseReason, Settlements, StageConsumer, Tp, Written, forget_moved, invalid_forward,
    outgoing, produce_until_acked,
};
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
/// Bytes of records handed to the producer and not yet acknowledged, over all partitions,
/// before every partition is paused (see [`HeldBytes`]).
pub const MAX_HELD_BYTES: usize = 64 << 20;

/// The bytes of the records the fan-out has handed to its producer and not yet seen
/// acknowledged. The window of each partition bounds its events in records, but an event's
/// records are its body (up to the payload limit) times its endpoints, and librdkafka copies
/// each: 5,000 events of 256 KiB for ten endpoints each is 12 GiB. While Kafka is slow or refusing,
/// that is what would pile up. Past `limit`, every partition is paused (as a hold, beside its
/// window); once acknowledgements bring it down to half, they resume. An event is always taken
/// when nothing is held, whatever its size.
struct HeldBytes {
    held: usize,
    limit: usize,
    /// Whether partitions were paused for it.
    holding: bool,
}

impl HeldBytes {
    fn new(limit: usize) -> HeldBytes {
        HeldBytes {
            held: 0,
            limit: limit.max(1),
            holding: false,
        }
    }

    fn add(&mut self, bytes: usize) {
        self.held = self.held.saturating_add(bytes);
    }

    fn remove(&mut self, bytes: usize) {
        self.held = self.held.saturating_sub(bytes);
    }

    /// Pauses every tracked partition while over the limit (those assigned since included), and
    /// resumes them once down to half of it.
    fn apply(&mut self, settlements: &mut Settlements, consumer: &StageConsumer) {
        let (on, tps): (bool, Vec<Tp>) = if self.held >= self.limit {
            let tps = settlements
                .partitions()
                .filter(|tp| !settlements.paused_for(tp, PauseReason::Hold))
                .cloned()
                .collect();
            (true, tps)
        } else if self.holding && self.held <= self.limit / 2 {
            let tps = settlements
                .partitions()
                .filter(|tp| settlements.paused_for(tp, PauseReason::Hold))
                .cloned()
                .collect();
            (false, tps)
        } else {
            return;
        };
        if on && !self.holding {
            tracing::info!(
                held_bytes = self.held,
                limit = self.limit,
                "records waiting for Kafka's acknowledgement reached the fan-out's byte limit; pausing its input"
            );
        }
        self.holding = on;
        if !tps.is_empty() {
            let _ = settlements.set_pause_reason(consumer, &tps, PauseReason::Hold, on);
        }
    }
}

/// Bytes a record takes while it waits for the broker (its body is shared here, copied by
/// librdkafka).
fn record_bytes(records: &[Outgoing]) -> usize {
    records.iter().map(|r| r.key.len() + r.payload.len()).sum()
}

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
    let headroom = crate::limits::RECORD_HEADROOM as usize;
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
    invalid_forward(
        topic.clone(),
        key.to_vec(),
        msg.headers().map(|h| h.detach()).unwrap_or_default(),
        bytes::Bytes::copy_from_slice(value),
        &invalid.reason.code(),
        &invalid.detail,
    )
}

/// What the input record `msg`, at the offset of `tp` it was read from, comes to: one delivery
/// record per endpoint subscribed to its event (none when no endpoint is), or, when it is not
/// an event, the record itself forwarded to the invalid topic. `None` for an event this
/// partition has fanned out already.
fn records_for(
    msg: &rdkafka::message::BorrowedMessage<'_>,
    tp: &Tp,
    input: &InputConfig,
    topics: &FanoutTopics,
    index: &SubscriptionIndex,
    recent: &mut HashMap<Tp, Recent>,
) -> Option<Vec<Outgoing>> {
    let offset = msg.offset();
    match parse_message(input, msg, SystemTime::now()) {
        Ok(event) => {
            if !recent
                .entry(tp.clone())
                .or_default()
                .insert(&event.tenant, &event.id)
            {
                tracing::debug!(event_id = %event.id, "repeated event id; already fanned out");
                return None;
            }
            let origin = Some(Origin {
                topic: tp.topic.to_string(),
                partition: tp.partition,
                offset,
            });
            let records = fan_out(&event, index, origin, &topics.deliveries);
            telemetry::fanned_out(records.len());
            Some(records)
        }
        Err(invalid) => {
            telemetry::invalid_record(
                &tp.topic,
                tp.partition,
                offset,
                invalid.reason.kind(),
                &invalid.detail,
            );
            Some(vec![invalid_record(
                msg,
                invalid,
                &topics.invalid,
                input.max_record,
            )])
        }
    }
}

/// A batch of records produced for one input record, once the broker has answered for all of
/// them: the input record settles if every one was acknowledged; `bytes` are no longer held.
struct Sent {
    written: Written,
    bytes: usize,
}

/// Produces `records` (`bytes` of them, held until the batch is answered), made from the input
/// record at `offset` of `tp`, each until the broker acknowledges it or `stop` fires, and says
/// what the batch came to.
async fn send_all(
    producer: crate::kafka::Producer,
    stop: CancellationToken,
    tp: Tp,
    offset: i64,
    records: Vec<Outgoing>,
    bytes: usize,
) -> Sent {
    let sends = records
        .into_iter()
        .map(|r| produce_until_acked(&producer, r, &stop));
    let acked = futures::future::join_all(sends)
        .await
        .into_iter()
        .all(|ok| ok);
    Sent {
        written: Written { tp, offset, acked },
        bytes,
    }
}

/// Runs the fan-out stage until `shutdown`, then waits (bounded) for records under way and
/// commits what settled. It holds at most `max_held_bytes` of records the broker has not
/// acknowledged yet ([`MAX_HELD_BYTES`] in service; see [`HeldBytes`]).
pub async fn run(
    consumer: StageConsumer,
    producer: crate::kafka::Producer,
    view: Arc<EndpointView>,
    input: InputConfig,
    topics: FanoutTopics,
    shutdown: CancellationToken,
    max_held_bytes: usize,
) {
    let mut subs = Subscriptions::new(view);
    let mut settlements = Settlements::new("fanout", MAX_WINDOW);
    let mut held = HeldBytes::new(max_held_bytes);
    let mut recent: HashMap<Tp, Recent> = HashMap::new();
    let mut pending = FuturesUnordered::new();
    let stop = CancellationToken::new();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            Some(Sent { written: Written { tp, offset, acked }, bytes }) = pending.next() => {
                if acked {
                    settlements.settle(&tp, offset);
                }
                held.remove(bytes);
                held.apply(&mut settlements, &consumer);
            }
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
                let tp = Tp::new(msg.topic(), msg.partition());
                let offset = msg.offset();
                if !settlements.track(&tp, offset) {
                    continue;
                }
                subs.refresh();
                let Some(records) = records_for(&msg, &tp, &input, &topics, &subs.index, &mut recent) else {
                    settlements.settle(&tp, offset);
                    continue;
                };
                if records.is_empty() {
                    settlements.settle(&tp, offset);
                } else {
                    let bytes = record_bytes(&records);
                    held.add(bytes);
                    pending.push(send_all(producer.clone(), stop.clone(), tp, offset, records, bytes));
                }
                held.apply(&mut settlements, &consumer);
            }
        }
    }
    let deadline = tokio::time::sleep(Duration::from_secs(10));
    tokio::pin!(deadline);
    while !pending.is_empty() {
        tokio::select! {
            Some(Sent { written: Written { tp, offset, acked }, .. }) = pending.next() => if acked { settlements.settle(&tp, offset) },
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::{CreateEndpoint, Endpoint};
    use crate::registry::{EndpointStore, MemoryEndpointStore};
    use crate::sealed::MasterKey;
    use crate::stage::StageContext;
    use metrics_exporter_prometheus::PrometheusBuilder;
    use rdkafka::consumer::Consumer;
    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::FutureRecord;
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

    #[test]
    fn held_bytes_pause_past_the_limit_and_resume_at_half() {
        let mut held = HeldBytes::new(100);
        held.add(99);
        assert!(held.held < held.limit);
        held.add(1);
        assert!(held.held >= held.limit);
        held.remove(40);
        assert_eq!(held.held, 60);
        held.remove(1_000);
        assert_eq!(held.held, 0, "never below nothing");
        assert_eq!(HeldBytes::new(0).limit, 1);
    }

    /// While the broker acknowledges nothing, the fan-out takes input only until the records it
    /// handed to the producer reach its byte limit, however many events its windows would still
    /// allow; once the broker takes records again, every event is fanned out.
    // The mock cluster is not Send: it stays on this test's thread (current-thread runtime),
    // which is also where the local metrics recorder is installed.
    #[tokio::test]
    async fn unacknowledged_bytes_pause_the_input() {
        const EVENTS: usize = 60;
        const PAYLOAD: usize = 10_000;
        let mock = MockCluster::new(1).unwrap();
        for topic in ["t.events", "t.deliveries", "t.invalid"] {
            mock.create_topic(topic, 1, 1).unwrap();
        }
        let bootstrap = mock.bootstrap_servers();
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let _local = metrics::set_default_local_recorder(&recorder);
        let fanned_out = || {
            handle
                .render()
                .lines()
                .find_map(|l| {
                    l.strip_prefix("hookline_events_fanned_out_total ")?
                        .parse::<usize>()
                        .ok()
                })
                .unwrap_or(0)
        };

        let producer: crate::kafka::Producer =
            crate::kafka::producer_config(&bootstrap, &Default::default())
                .create_with_context(crate::kafka::ProducerLog::default())
                .unwrap();
        let data = "x".repeat(PAYLOAD);
        for n in 0..EVENTS {
            let value = serde_json::json!({
                "id": format!("evt_{n}"), "tenant": "acme", "type": "order.created",
                "payload": {"pad": data},
            })
            .to_string();
            producer
                .send(
                    FutureRecord::<str, str>::to("t.events").payload(&value),
                    Duration::from_secs(10),
                )
                .await
                .unwrap();
        }
        let endpoints = MemoryEndpointStore::new(MasterKey::generate());
        let endpoint = Endpoint::create(
            serde_json::from_value::<CreateEndpoint>(serde_json::json!({
                "tenant": "acme", "url": "https://example.com/hook", "event_types": ["*"]
            }))
            .unwrap(),
            SystemTime::now(),
        )
        .unwrap();
        endpoints.put(&endpoint).await.unwrap();

        // From now on the broker refuses every produce (librdkafka retries them).
        mock.request_errors(
            RDKafkaApiKey::Produce,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS; 100_000],
        );
        let consumer: StageConsumer =
            crate::kafka::consumer_config(&bootstrap, "t-fanout", &Default::default())
                .create_with_context(StageContext::new("fanout"))
                .unwrap();
        consumer.subscribe(&["t.events"]).unwrap();
        let shutdown = CancellationToken::new();
        let stage = run(
            consumer,
            producer.clone(),
            endpoints.view().clone(),
            InputConfig::default(),
            FanoutTopics {
                deliveries: Arc::from("t.deliveries"),
                invalid: Arc::from("t.invalid"),
            },
            shutdown.clone(),
            // Room for about five events' records.
            5 * PAYLOAD,
        );
        let watch = async {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            while fanned_out() == 0 {
                assert!(tokio::time::Instant::now() < deadline, "nothing fanned out");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // Long enough to take every event, were nothing holding the input back.
            tokio::time::sleep(Duration::from_secs(3)).await;
            let taken = fanned_out();
            assert!(
                (1..=6).contains(&taken),
                "{taken} events taken against room for about 5"
            );
            mock.clear_request_errors(RDKafkaApiKey::Produce);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while fanned_out() < EVENTS {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{} of {EVENTS} fanned out once the broker took records",
                    fanned_out()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            shutdown.cancel();
        };
        tokio::join!(stage, watch);
        assert_eq!(fanned_out(), EVENTS, "each event once");
    }
}
