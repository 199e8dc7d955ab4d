//! The fan-out stage: consumes the input topics (Debezium outbox topics, the native events topic;
//! group `hookline-fanout`), and turns each event into one delivery record per subscribed
//! endpoint on the deliveries topic, keyed by endpoint id.
//!
//! The body is serialised once per event and shared by every delivery record. An event the
//! store already holds from within `ingest.dedupe_window` (sent twice, to any instance, or read
//! again after a restart) is dropped as a repeat; one reusing the id of a different event goes
//! to the invalid topic. Otherwise, once every delivery record made from it is acknowledged, the
//! event is recorded in the store (its deliveries pending from then on), and only then does its
//! input offset settle: a crash at any point re-reads the event and produces the same delivery
//! ids again. A record that is not an event goes to the invalid topic with a reason header; the
//! partition moves on.
//!
//! Where each part lives:
//! - here: the stage loop, taking each record in order and turning it into its [`event::Work`].
//! - `event`: the work of one record, in its own future: the store lookup, the produces, the
//!   event's row.
//! - `recent`: the events each partition took lately, a repeat's cheap first check.
//! - `held`: the bytes waiting for the broker, and the pause that bounds them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use rdkafka::Message;
use rdkafka::message::OwnedHeaders;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::input::{InputConfig, InputEvent, InvalidInput, InvalidReason, parse_message};
use crate::record::{DeliveryRecord, Origin, UnixMillis};
use crate::registry::{EndpointView, ViewStatus};
use crate::stage::{
    Outgoing, Settlements, StageConsumer, Tp, Written, forget_moved, invalid_forward, outgoing,
};
use crate::storage::{DeliveryStore, EventRow};
use crate::subscription::{SubscriptionIndex, parse_filters};
use crate::telemetry;

mod event;
mod held;
mod recent;

#[cfg(test)]
mod tests;

use event::{Sent, Shared, Taken, Work};
use held::{HeldBytes, record_bytes};
use recent::{Recent, Seen, fingerprint_start};

/// Where the fan-out writes.
#[derive(Debug, Clone)]
pub struct FanoutTopics {
    /// Delivery records.
    pub deliveries: Arc<str>,
    /// Records that are not events.
    pub invalid: Arc<str>,
}

/// Everything the fan-out stage works with besides its Kafka clients.
pub struct FanoutDeps {
    /// The materialised endpoints, whose subscriptions the events are matched against.
    pub view: Arc<EndpointView>,
    /// How input records are read.
    pub input: InputConfig,
    /// Where the fan-out writes.
    pub topics: FanoutTopics,
    /// Where events are recorded and looked up.
    pub store: Arc<dyn DeliveryStore>,
    /// The same (tenant, event id) received within this long is one event
    /// (`ingest.dedupe_window`).
    pub dedupe_window: Duration,
    /// Bytes of records the broker has not acknowledged yet at most ([`MAX_HELD_BYTES`] in
    /// service).
    pub max_held_bytes: usize,
}

/// Input records held per partition before it is paused.
const MAX_WINDOW: usize = 5_000;
/// Bytes of records handed to the producer and not yet acknowledged, over all partitions,
/// before every partition is paused (see `held`).
pub const MAX_HELD_BYTES: usize = 64 << 20;

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

/// An event's delivery records, one per endpoint subscribed to it in `index` (sharing one
/// body), and the row the store keeps of it, received at `received_at`, with its
/// `fingerprint` ([`InputEvent::fingerprint_hex`]).
pub fn fan_out(
    event: &InputEvent,
    fingerprint: String,
    index: &SubscriptionIndex,
    origin: Option<Origin>,
    topic: &Arc<str>,
    received_at: SystemTime,
) -> (EventRow, Vec<Outgoing>) {
    let endpoints = index.matching_refs(&event.tenant, event.event_type.as_str());
    let body = event.body_bytes();
    let time = UnixMillis::from_system_time(event.occurred_at);
    let records = endpoints
        .iter()
        .map(|endpoint| {
            let record = DeliveryRecord::new(
                event.id.clone(),
                (*endpoint).clone(),
                event.tenant.clone(),
                event.event_type.clone(),
                time,
                origin.clone(),
                body.clone(),
            );
            outgoing(topic.clone(), &record)
        })
        .collect();
    let row = EventRow {
        tenant: event.tenant.clone(),
        event_id: event.id.clone(),
        event_type: event.event_type.to_string(),
        occurred_at: event.occurred_at,
        received_at,
        body,
        fingerprint,
        endpoints: endpoints.into_iter().cloned().collect(),
    };
    (row, records)
}

/// When the input record `msg` was received: its Kafka timestamp, the same every time it is
/// read; `now` for a record without one.
fn received_at(msg: &impl Message, now: SystemTime) -> SystemTime {
    msg.timestamp()
        .to_millis()
        .and_then(|ms| u64::try_from(ms).ok())
        .map_or(now, |ms| UNIX_EPOCH + Duration::from_millis(ms))
}

/// The original record, key, value and `headers` (copied raw: a header name need not be
/// UTF-8), with the reason added, for the invalid topic.
/// A value that would make the record larger than the producer writes (`max_record`; an input
/// topic may hold larger records than that) is left out, and the detail says so and where the
/// original stays: a forward that can never be written would hold its partition forever.
fn invalid_record<M: Message>(
    msg: &M,
    headers: OwnedHeaders,
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
        headers,
        bytes::Bytes::copy_from_slice(value),
        &invalid.reason.code(),
        &invalid.detail,
    )
}

/// What the input record `msg`, at the offset of `tp` it was read from, comes to: an event's
/// work (see [`event`]), or, when it is not an event or reuses the id of a different event its
/// partition took lately, the record itself for the invalid topic. `None` for a repeat of an
/// event its partition took lately: nothing to do. Runs in the stage loop, in partition order,
/// and never waits.
fn take(
    msg: &rdkafka::message::BorrowedMessage<'_>,
    tp: &Tp,
    input: &InputConfig,
    topics: &FanoutTopics,
    index: &SubscriptionIndex,
    recent: &mut HashMap<Tp, Recent>,
) -> Option<Work> {
    let offset = msg.offset();
    let now = SystemTime::now();
    let invalid = match parse_message(input, msg, now) {
        Ok(event) => {
            let fingerprint = event.fingerprint_hex();
            let seen = recent.entry(tp.clone()).or_default().check(
                &event.tenant,
                &event.id,
                fingerprint_start(&fingerprint),
            );
            match seen {
                Seen::New => {
                    let origin = Some(Origin {
                        topic: tp.topic.to_string(),
                        partition: tp.partition,
                        offset,
                    });
                    let (row, records) = fan_out(
                        &event,
                        fingerprint,
                        index,
                        origin,
                        &topics.deliveries,
                        received_at(msg, now),
                    );
                    return Some(Work::Event(Box::new(Taken {
                        row,
                        records,
                        original: msg.detach(),
                    })));
                }
                Seen::Same => {
                    telemetry::event_repeated(event.tenant.as_str(), event.id.as_str(), true);
                    return None;
                }
                Seen::Different => InvalidInput::new(
                    InvalidReason::ReusedId,
                    format!(
                        "event id {} of tenant {} belongs to a different event (another type or \
                         payload) this partition took moments ago; this one is not fanned out: \
                         send it with an id of its own",
                        event.id, event.tenant
                    ),
                ),
            }
        }
        Err(invalid) => invalid,
    };
    telemetry::invalid_record(
        &tp.topic,
        tp.partition,
        offset,
        invalid.reason.kind(),
        &invalid.detail,
    );
    Some(Work::Forward(invalid_record(
        msg,
        msg.headers().map(|h| h.detach()).unwrap_or_default(),
        invalid,
        &topics.invalid,
        input.max_record,
    )))
}

/// Runs the fan-out stage until `shutdown`, then waits (bounded) for the work under way and
/// commits what settled. It holds at most `deps.max_held_bytes` of records the broker has not
/// acknowledged yet (see `held`).
pub async fn run(
    consumer: StageConsumer,
    producer: crate::kafka::Producer,
    deps: FanoutDeps,
    shutdown: CancellationToken,
) {
    let FanoutDeps {
        view,
        input,
        topics,
        store,
        dedupe_window,
        max_held_bytes,
    } = deps;
    let stop = CancellationToken::new();
    let shared = Arc::new(Shared {
        producer,
        store,
        dedupe_window,
        invalid_topic: topics.invalid.clone(),
        max_record: input.max_record,
        stop: stop.clone(),
    });
    let mut subs = Subscriptions::new(view);
    let mut settlements = Settlements::new("fanout", MAX_WINDOW);
    let mut held = HeldBytes::new(max_held_bytes);
    let mut recent: HashMap<Tp, Recent> = HashMap::new();
    let mut pending = FuturesUnordered::new();
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
                let Some(work) = take(&msg, &tp, &input, &topics, &subs.index, &mut recent) else {
                    settlements.settle(&tp, offset);
                    continue;
                };
                let bytes = match &work {
                    Work::Forward(out) => record_bytes(std::slice::from_ref(out)),
                    Work::Event(taken) => record_bytes(&taken.records),
                };
                held.add(bytes);
                pending.push(event::settle(shared.clone(), tp, offset, work, bytes));
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
