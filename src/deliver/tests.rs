//! The delivery stage's tests: its parts on their own, and the stage on an embedded cluster.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use async_trait::async_trait;
use tokio::sync::{Semaphore, oneshot};

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use rdkafka::consumer::Consumer;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::attempt::{FollowUp, Landed};
use super::report::Done;
use super::request::SendPlan;
use super::stage::{Intaken, Stage};
use super::task::Slot;
use super::turn::{Turns, queue_room};
use super::{DeliverDeps, run};
use crate::breaker;
use crate::dead_reason::DeadReason;
use crate::delay_tier::Tiers;
use crate::endpoint::{CreateEndpoint, Endpoint};
use crate::event_type::EventType;
use crate::id::{DeliveryId, EndpointId, EventId, Tenant};
use crate::lane::{LaneConfig, Lanes, LanesConfig, Refusal};
use crate::record::{DeliveryRecord, UnixMillis, header};
use crate::registry::EndpointStore;
use crate::registry::MemoryEndpointStore;
use crate::retry_policy::RetryPolicy;
use crate::sealed::MasterKey;
use crate::sender::Sender;
use crate::stage::Written;
use crate::stage::{Outgoing, StageConsumer, Tp, outgoing, produce_until_acked};
use crate::storage::hooked::{Hooked, Hooks};
use crate::storage::memory::MemoryStore;
use crate::storage::{
    AttemptRow, DeliveryNote, DeliveryStatus, DeliveryStore, ScheduleReason, StoreError,
};

/// What goes wrong in a [`FaultyStore`]'s `record_attempt` or `record_note`.
enum Fault {
    /// Each attempt's write waits for a permit of the semaphore.
    Gate(Semaphore),
    /// The write of an attempt row of this event panics (a bug in the store).
    Panic(EventId),
    /// The write of a note of this event panics.
    PanicOnNote(EventId),
    /// Notes are refused while this is set.
    RefuseNotes(AtomicBool),
}

/// A memory store whose `record_attempt` or `record_note` suffers a [`Fault`].
type FaultyStore = Hooked<Fault>;

#[async_trait]
impl Hooks for Fault {
    async fn before_record_attempt(&self, row: &AttemptRow) {
        match self {
            Fault::Gate(gate) => gate.acquire().await.expect("gate open").forget(),
            Fault::Panic(id) if *id == row.event_id => {
                panic!("injected: the store broke on {id}")
            }
            _ => {}
        }
    }

    async fn before_record_note(&self, note: &DeliveryNote) -> Result<(), StoreError> {
        match self {
            Fault::PanicOnNote(id) if *id == note.event_id => {
                panic!("injected: the store broke on a note of {id}")
            }
            Fault::RefuseNotes(refusing) if refusing.load(Ordering::SeqCst) => {
                Err(StoreError::Unavailable("injected: notes refused".into()))
            }
            _ => Ok(()),
        }
    }
}

fn faulty_store(fault: Fault) -> Arc<FaultyStore> {
    Arc::new(Hooked::new(fault, 16))
}

#[test]
fn the_queue_holds_what_the_endpoint_sends_within_the_horizon() {
    let second = Duration::from_secs(1);
    assert_eq!(queue_room(2.0, second), 2);
    assert_eq!(queue_room(2.0, Duration::from_secs(5)), 10);
    assert_eq!(queue_room(2.5, second), 3, "rounded up");
    assert_eq!(queue_room(0.1, second), 1, "at least one");
    assert_eq!(queue_room(f64::INFINITY, second), usize::MAX);
}

#[test]
fn turns_follow_the_rate_behind_the_queue() {
    let mut turns = Turns::default();
    let (a, b) = (
        EndpointId::parse("ep_a").unwrap(),
        EndpointId::parse("ep_b").unwrap(),
    );
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
    let s = Duration::from_secs;
    let horizon = s(60);
    // 2 a second behind 4 queued: the first turn comes when those 4 are sent, the next ones
    // half a second apart.
    let booked: Vec<SystemTime> = (0..3)
        .map(|_| turns.book(&a, 2.0, 4, now, horizon))
        .collect();
    assert_eq!(
        booked,
        [now + s(2), now + Duration::from_millis(2_500), now + s(3)]
    );
    // Each endpoint has its own turns.
    assert_eq!(turns.book(&b, 1.0, 1, now, horizon), now + s(1));
    // A longer queue than the turns booked pushes the next turn behind it.
    assert_eq!(turns.book(&a, 2.0, 10, now, horizon), now + s(5));
    assert_eq!(
        turns.book(&a, 2.0, 1, now, horizon),
        now + Duration::from_millis(5_500)
    );
    // Turns gone by are not handed out again: the next is behind the queue as of now.
    let later = now + s(100);
    assert_eq!(turns.book(&a, 2.0, 2, later, horizon), later + s(1));
}

#[test]
fn a_turn_beyond_the_horizon_is_not_booked() {
    let mut turns = Turns::default();
    let a = EndpointId::parse("ep_a").unwrap();
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
    let s = Duration::from_secs;
    // 1 a second, a horizon of 5 s: turns at 1..=5 s, then the rest come back at 5 s
    // without a turn, however many there are.
    let due: Vec<SystemTime> = (0..8).map(|_| turns.book(&a, 1.0, 1, now, s(5))).collect();
    let expected: Vec<SystemTime> = [1, 2, 3, 4, 5, 5, 5, 5]
        .iter()
        .map(|d| now + s(*d))
        .collect();
    assert_eq!(due, expected);
    // Back at 5 s, they book the turns from 6 s on, one a second: the endpoint's rate, not
    // a turn after every record sent to the horizon.
    let back = now + s(5);
    let due: Vec<SystemTime> = (0..6).map(|_| turns.book(&a, 1.0, 0, back, s(5))).collect();
    let expected: Vec<SystemTime> = [1, 2, 3, 4, 5, 5].iter().map(|d| back + s(*d)).collect();
    assert_eq!(due, expected);
}

/// A receiver on loopback that answers 200 and counts requests.
async fn receiver() -> (String, Arc<AtomicU64>) {
    let hits = Arc::new(AtomicU64::new(0));
    let counted = hits.clone();
    let app = axum::Router::new().fallback(move || {
        let hits = counted.clone();
        async move {
            hits.fetch_add(1, Ordering::SeqCst);
            "ok"
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/hook"), hits)
}

/// An endpoint to `url` that takes one request at a time, and the delivery stage's
/// dependencies around it and `store`, with dev defaults and topics named `t.*`.
async fn one_at_a_time(
    url: String,
    store: Arc<dyn DeliveryStore>,
) -> (Arc<Endpoint>, Arc<DeliverDeps>) {
    let endpoints = Arc::new(MemoryEndpointStore::new(MasterKey::generate()));
    let endpoint = endpoint_at(&endpoints, url, 1).await;
    (
        endpoint,
        Arc::new(deps_on(&endpoints, store, &DEFAULT_TIERS)),
    )
}

/// The delay tiers of a default config.
const DEFAULT_TIERS: [Duration; 6] = [
    Duration::from_secs(5),
    Duration::from_secs(30),
    Duration::from_secs(120),
    Duration::from_secs(600),
    Duration::from_secs(3600),
    Duration::from_secs(6 * 3600),
];

/// A sender that may reach plain http on loopback, as `hookline dev`'s may.
fn loopback_sender() -> Sender {
    Sender::new(crate::sender::SenderConfig {
        allow_http: true,
        policy: crate::ssrf::Policy::with_allowed([
            "127.0.0.0/8".parse().unwrap(),
            "::1/128".parse().unwrap(),
        ]),
        ..Default::default()
    })
    .unwrap()
}

/// A producer with hookline's settings to the (mock) cluster at `bootstrap`.
fn producer_to(bootstrap: &str) -> crate::kafka::Producer {
    crate::kafka::producer_config(bootstrap, &Default::default())
        .create_with_context(crate::kafka::ProducerLog::default())
        .unwrap()
}

/// An endpoint of tenant `acme` at `url`, written to `endpoints`.
async fn endpoint_at(
    endpoints: &MemoryEndpointStore,
    url: String,
    max_in_flight: u32,
) -> Arc<Endpoint> {
    let created = Endpoint::create(
        CreateEndpoint {
            tenant: Tenant::parse("acme").unwrap(),
            url,
            event_types: vec!["*".into()],
            max_in_flight: Some(max_in_flight),
            rate_limit_per_s: None,
            secret: None,
        },
        SystemTime::now(),
    )
    .unwrap();
    endpoints.put(&created).await.unwrap()
}

/// The stage's dependencies on `endpoints` and `store`, with delay tiers `tiers` (topics
/// `t.retry.<tier>`). Queues hold up to 100 records; nothing stalls within 30 s.
fn deps_on(
    endpoints: &Arc<MemoryEndpointStore>,
    store: Arc<dyn DeliveryStore>,
    tiers: &[Duration],
) -> DeliverDeps {
    DeliverDeps {
        endpoints: endpoints.view().clone(),
        endpoint_writer: endpoints.clone(),
        store,
        sender: loopback_sender(),
        policy: RetryPolicy::default(),
        tiers: Arc::new(Tiers::new("t.retry.", tiers)),
        dlq_topic: Arc::from("t.dlq"),
        invalid_topic: Arc::from("t.invalid"),
        lanes: LanesConfig::default(),
        default_max_in_flight: 1,
        max_window: 100,
        lane_queue: 100,
        stall_after: Duration::from_secs(30),
        stalled_wait: Duration::from_secs(15),
        drain_deadline: Duration::from_secs(20),
    }
}

/// A delivery of event `event` to `endpoint_id`, of tenant `acme`.
fn delivery_for(endpoint_id: &EndpointId, event: &str) -> DeliveryRecord {
    DeliveryRecord::new(
        EventId::parse(event).unwrap(),
        endpoint_id.clone(),
        Tenant::parse("acme").unwrap(),
        EventType::parse("order.created").unwrap(),
        UnixMillis::from(SystemTime::now()),
        None,
        Bytes::from_static(b"{}"),
    )
}

#[tokio::test]
async fn the_lane_slot_is_given_back_before_the_attempt_is_logged() {
    let (url, hits) = receiver().await;
    let store = faulty_store(Fault::Gate(Semaphore::new(0)));
    let (endpoint, deps) = one_at_a_time(url, store.clone()).await;
    let record = delivery_for(&endpoint.id, "evt_1");
    let delivery = record.delivery_id.clone();
    let plan = SendPlan::build(&endpoint, SystemTime::now());
    let (answered_tx, answered_rx) = oneshot::channel();
    let attempt = tokio::spawn({
        let deps = deps.clone();
        async move {
            let stop = CancellationToken::new();
            deps.attempt(&record, None, &endpoint, &plan, &stop, |health| {
                let _ = answered_tx.send(health);
            })
            .await
        }
    });

    // The store write is held back: the endpoint's answer must be reported anyway.
    let health = tokio::time::timeout(Duration::from_secs(10), answered_rx)
        .await
        .expect("the answer was reported while the store write was still waiting")
        .unwrap();
    assert_eq!(health, Some(breaker::Outcome::Healthy));
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    assert!(store.inner.attempts(&delivery).await.unwrap().is_empty());
    assert!(
        !attempt.is_finished(),
        "not settled before its row is logged"
    );

    let Fault::Gate(gate) = &store.hooks else {
        unreachable!("a gated store")
    };
    gate.add_permits(1);
    let report = attempt.await.unwrap().expect("logged and reported");
    assert!(report.follow_up.is_none());
    assert_eq!(store.inner.attempts(&delivery).await.unwrap().len(), 1);
}

/// An endpoint's answer time ends when its answer came, not when the stage got round to
/// it: two slots whose answers come after 1 s send 2 a second, however late the stage
/// reads them.
// The mock cluster is not Send: current-thread runtime.
#[tokio::test(start_paused = true)]
async fn the_answer_time_ends_at_the_answer_not_when_the_stage_reads_it() {
    use rdkafka::mocking::MockCluster;

    let mock = MockCluster::new(1).unwrap();
    let s = Duration::from_secs;
    let endpoints = Arc::new(MemoryEndpointStore::new(MasterKey::generate()));
    let endpoint = endpoint_at(&endpoints, "http://127.0.0.1:9/hook".into(), 2).await;
    let deps = deps_on(
        &endpoints,
        Arc::new(MemoryStore::with_capacity(16)),
        &[s(1)],
    );
    let producer = producer_to(&mock.bootstrap_servers());
    let (mut stage, _reports) = Stage::new(Arc::new(deps), producer);
    let id = endpoint.id.clone();
    let cfg = stage.lane_config(&endpoint);
    for _ in 0..2 {
        let now = tokio::time::Instant::now();
        let permits = [(); 2].map(|()| stage.lanes.try_acquire(&id, cfg, now).unwrap());
        tokio::time::advance(s(1)).await;
        let at = tokio::time::Instant::now();
        // The stage is busy for another 2 s before it reads the answers.
        tokio::time::advance(s(2)).await;
        for permit in permits {
            stage.on_done(Done::Answered {
                permit,
                health: Some(breaker::Outcome::Healthy),
                at,
            });
        }
    }
    assert_eq!(stage.lanes.throughput(&id), Some(2.0));
}

/// A slow endpoint's queue, filled before its first answer told its rate, is cut to what it
/// sends within the shortest tier once the rate is known; the rest is parked and settles
/// once the tier has it, and so is a record arriving after. The endpoint's lane is kept full
/// by hand, so nothing is sent.
// The mock cluster is not Send: current-thread runtime.
#[tokio::test]
async fn a_slow_endpoints_queue_is_cut_to_what_it_sends_within_the_shortest_tier() {
    use metrics_exporter_prometheus::PrometheusBuilder;
    use rdkafka::mocking::MockCluster;

    // Parks are counted on this thread, as they are made.
    let recorder = PrometheusBuilder::new().build_recorder();
    let counted = recorder.handle();
    let _local = metrics::set_default_local_recorder(&recorder);
    let mock = MockCluster::new(1).unwrap();
    let s = Duration::from_secs;
    let endpoints = Arc::new(MemoryEndpointStore::new(MasterKey::generate()));
    let endpoint = endpoint_at(&endpoints, "http://127.0.0.1:9/hook".into(), 2).await;
    let deps = Arc::new(deps_on(
        &endpoints,
        Arc::new(MemoryStore::with_capacity(16)),
        &[s(1), s(5)],
    ));
    for tier in deps.tiers.all() {
        mock.create_topic(&tier.topic, 1, 1).unwrap();
    }
    let producer = producer_to(&mock.bootstrap_servers());
    let (mut stage, mut reports) = Stage::new(deps, producer);
    let id = endpoint.id.clone();
    let tp = Tp::new("t.deliveries", 0);
    let take = |stage: &mut Stage, offset: i64| {
        let record = delivery_for(&endpoint.id, &format!("evt_{offset}"));
        stage.on_record(tp.clone(), offset, Ok(record), None);
    };
    // Both request slots taken, as by two requests in flight.
    let cfg = stage.lane_config(&endpoint);
    let t0 = tokio::time::Instant::now();
    let first = stage.lanes.try_acquire(&id, cfg, t0).unwrap();
    let _second = stage.lanes.try_acquire(&id, cfg, t0).unwrap();
    // Before its first answer the endpoint's rate is unknown: 20 records queue.
    for offset in 0..20 {
        take(&mut stage, offset);
    }
    assert_eq!(stage.queues[&id].len(), 20);
    stage.shed_excess(&id);
    assert_eq!(stage.queues[&id].len(), 20, "nothing to go by yet");

    // One answer after 1 s, its slot taken again: one round is no evidence yet.
    stage
        .lanes
        .release(first, Some(breaker::Outcome::Healthy), t0 + s(1));
    let third = stage.lanes.try_acquire(&id, cfg, t0 + s(1)).unwrap();
    stage.shed_excess(&id);
    assert_eq!(stage.queues[&id].len(), 20, "one round to go by");
    // Another answer after 1 s, a second later: 2 slots of 1 s send 2 a second, and the
    // shortest tier (1 s) holds 2.
    stage
        .lanes
        .release(third, Some(breaker::Outcome::Healthy), t0 + s(2));
    let _fourth = stage.lanes.try_acquire(&id, cfg, t0 + s(2)).unwrap();
    assert_eq!(stage.lanes.throughput(&id), Some(2.0));
    stage.shed_excess(&id);
    let queued: Vec<i64> = stage.queues[&id].iter().map(|q| q.offset).collect();
    assert_eq!(queued, [0, 1], "the oldest stay");
    // A record arriving now is parked too: the queue stays at 2.
    take(&mut stage, 20);
    assert_eq!(stage.queues[&id].len(), 2);

    let mut parked = BTreeSet::new();
    while parked.len() < 19 {
        let Written { offset, acked, .. } = tokio::time::timeout(s(20), reports.written.recv())
            .await
            .expect("every parked record acknowledged within 20 s")
            .unwrap();
        assert!(acked);
        assert!(parked.insert(offset), "offset {offset} parked twice");
    }
    assert_eq!(parked, (2..=20).collect());
    // Counted as a slow endpoint's, not as a full lane's: an operator tells a receiver that
    // cannot keep up from a burst that filled its queue.
    let text = counted.render();
    assert!(
        text.contains(r#"hookline_parked_total{reason="slow_endpoint"} 19"#),
        "{text}"
    );
    assert!(!text.contains(r#"reason="lane_full""#), "{text}");
}

/// A record librdkafka hands out again in the same assignment (see
/// [`Settlements::track`](crate::stage::Settlements::track)) is not queued or sent a second
/// time. The endpoint's lane is kept full by hand, so what the stage took waits in its queue.
// The mock cluster is not Send: current-thread runtime.
#[tokio::test]
async fn a_record_handed_out_again_is_not_taken_twice() {
    use rdkafka::mocking::MockCluster;

    let mock = MockCluster::new(1).unwrap();
    let endpoints = Arc::new(MemoryEndpointStore::new(MasterKey::generate()));
    let endpoint = endpoint_at(&endpoints, "http://127.0.0.1:9/hook".into(), 1).await;
    let deps = Arc::new(deps_on(
        &endpoints,
        Arc::new(MemoryStore::with_capacity(16)),
        &[Duration::from_secs(5)],
    ));
    let producer = producer_to(&mock.bootstrap_servers());
    let consumer: StageConsumer =
        crate::kafka::consumer_config(&mock.bootstrap_servers(), "g", &Default::default())
            .create_with_context(crate::stage::StageContext::new("deliver"))
            .unwrap();
    let (mut stage, _reports) = Stage::new(deps, producer);
    let cfg = stage.lane_config(&endpoint);
    let _slot = stage
        .lanes
        .try_acquire(&endpoint.id, cfg, tokio::time::Instant::now())
        .unwrap();
    let tp = Tp::new("t.deliveries", 0);
    let intaken = |offset: i64| Intaken {
        decoded: Ok(delivery_for(&endpoint.id, &format!("evt_{offset}"))),
        raw: None,
    };
    for offset in [0, 1, 2, 1, 2, 0] {
        stage.take(&consumer, tp.clone(), offset, intaken(offset));
    }
    let queued: Vec<i64> = stage.queues[&endpoint.id]
        .iter()
        .map(|q| q.offset)
        .collect();
    assert_eq!(queued, [0, 1, 2], "each record taken once");
    assert_eq!(stage.settlements.in_flight(), 3);
}

/// The DLQ write of a dead letter is refused for a while: the dead letter is logged and
/// counted only once the broker acknowledges it, never for the refused tries (a restart in
/// between would otherwise count it twice, and the log would name a record the DLQ lacks).
// The mock cluster is not Send: it stays on this test's thread (current-thread runtime),
// which is also where the local metrics recorder is installed.
#[tokio::test]
async fn a_dead_letter_is_counted_once_the_dlq_acknowledges_it() {
    use metrics_exporter_prometheus::PrometheusBuilder;
    use rdkafka::mocking::MockCluster;
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

    let mock = MockCluster::new(1).unwrap();
    mock.create_topic("t.dlq", 1, 1).unwrap();
    let producer = producer_to(&mock.bootstrap_servers());
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let _local = metrics::set_default_local_recorder(&recorder);
    let follow_up = || FollowUp {
        out: Outgoing {
            topic: Arc::from("t.dlq"),
            key: b"ep_1".to_vec(),
            headers: rdkafka::message::OwnedHeaders::new(),
            payload: Bytes::from_static(b"{}"),
        },
        landed: Landed::Dead {
            delivery_id: DeliveryId::parse("dlv_1").unwrap(),
            endpoint_id: EndpointId::parse("ep_1").unwrap(),
            reason: DeadReason::Gone,
        },
    };
    let metric = |name: &str| {
        let text = handle.render();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let dead = r#"hookline_dead_letters_total{reason="gone"}"#;

    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE; 1_000],
    );
    // Stopped once the DLQ has refused it twice, however long that takes on a busy machine.
    let stop = CancellationToken::new();
    let refused_twice = async {
        let deadline = Instant::now() + Duration::from_secs(30);
        while metric("hookline_produce_retries_total") < 2 {
            assert!(Instant::now() < deadline, "no refusal in 30 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.cancel();
    };
    let (acked, ()) = tokio::join!(follow_up().produce(&producer, &stop), refused_twice);
    assert!(!acked, "not acknowledged");
    assert_eq!(metric(dead), 0, "refused, so not counted");

    mock.clear_request_errors(RDKafkaApiKey::Produce);
    let acked = tokio::time::timeout(
        Duration::from_secs(20),
        follow_up().produce(&producer, &CancellationToken::new()),
    )
    .await
    .expect("acknowledged within 20 s once the DLQ accepts records");
    assert!(acked);
    assert_eq!(metric(dead), 1, "{}", handle.render());
}

/// An attempt that panics before the endpoint answered drops its slot unanswered: the slot
/// still comes back to the lane, without a health signal, so an endpoint that takes one
/// request at a time is not stopped for good.
#[tokio::test]
async fn a_slot_dropped_by_a_panic_comes_back_to_its_lane() {
    let id = EndpointId::parse("ep_1").unwrap();
    let one = LaneConfig {
        max_in_flight: 1,
        rate_limit_per_s: None,
    };
    let mut lanes = Lanes::new(LanesConfig::default());
    let now = tokio::time::Instant::now();
    let permit = lanes.try_acquire(&id, one, now).expect("a free lane");
    assert!(matches!(
        lanes.try_acquire(&id, one, now),
        Err(Refusal::Concurrency)
    ));
    let (done, mut reports) = mpsc::unbounded_channel();
    let slot = Slot {
        permit: Some(permit),
        done,
    };
    let attempt = tokio::spawn(async move {
        let _held = slot;
        panic!("injected: a bug before the endpoint answered");
    });
    assert!(attempt.await.unwrap_err().is_panic());

    let Some(Done::Answered { permit, health, .. }) = reports.recv().await else {
        panic!("the slot was not given back");
    };
    assert_eq!(health, None, "a panic says nothing about the endpoint");
    assert!(reports.try_recv().is_err(), "given back once");
    let _ = lanes.release(permit, health, now);
    assert!(
        lanes.try_acquire(&id, one, now).is_ok(),
        "the lane has its slot"
    );
}

/// The delivery stage on an embedded cluster, reading `t.deliveries` (one partition) as
/// group `t-deliver`.
struct Rig {
    kafka: crate::kafka::EmbeddedKafka,
    shutdown: CancellationToken,
    stage: tokio::task::JoinHandle<()>,
}

const DELIVERIES: &str = "t.deliveries";
const GROUP: &str = "t-deliver";

impl Rig {
    /// Writes `records` to `t.deliveries`, then starts the stage on it.
    async fn start(deps: Arc<DeliverDeps>, records: &[DeliveryRecord]) -> Rig {
        use crate::kafka::TopicSpec;
        let mut topics = vec![DELIVERIES, "t.dlq", "t.invalid"];
        topics.extend(deps.tiers.all().iter().map(|t| &*t.topic));
        let specs: Vec<TopicSpec> = topics
            .iter()
            .map(|name| TopicSpec {
                name: (*name).to_owned(),
                partitions: 1,
                compacted: false,
            })
            .collect();
        let kafka = crate::kafka::EmbeddedKafka::start(&specs).unwrap();
        let bootstrap = kafka.bootstrap_servers();
        let producer: crate::kafka::Producer =
            crate::kafka::producer_config(bootstrap, &Default::default())
                .create_with_context(crate::kafka::ProducerLog::default())
                .unwrap();
        for r in records {
            let out = outgoing(Arc::from(DELIVERIES), r);
            assert!(produce_until_acked(&producer, out, &CancellationToken::new()).await);
        }
        let consumer: StageConsumer = crate::kafka::stage_consumer_config(
            bootstrap,
            GROUP,
            crate::kafka::HOT_FETCH,
            &Default::default(),
        )
        .create_with_context(crate::stage::StageContext::new("deliver"))
        .unwrap();
        consumer.subscribe(&[DELIVERIES]).unwrap();
        let shutdown = CancellationToken::new();
        let stage = tokio::spawn(run(consumer, producer, deps, shutdown.clone()));
        Rig {
            kafka,
            shutdown,
            stage,
        }
    }

    /// The offset the stage's group has committed on `t.deliveries`, if any.
    async fn committed(&self) -> Option<i64> {
        use rdkafka::consumer::BaseConsumer;
        let bootstrap = self.kafka.bootstrap_servers().to_owned();
        tokio::task::spawn_blocking(move || {
            let reader: BaseConsumer =
                crate::kafka::consumer_config(&bootstrap, GROUP, &Default::default())
                    .set("enable.auto.commit", "false")
                    .create()
                    .unwrap();
            let mut tpl = rdkafka::TopicPartitionList::new();
            tpl.add_partition(DELIVERIES, 0);
            let got = reader.committed_offsets(tpl, Duration::from_secs(5)).ok()?;
            match got.find_partition(DELIVERIES, 0)?.offset() {
                rdkafka::Offset::Offset(n) => Some(n),
                _ => None,
            }
        })
        .await
        .unwrap()
    }

    /// Waits until the group has committed `offset` on `t.deliveries` (a minute at most, so
    /// that a stage that never gets there fails the test rather than hanging it).
    async fn committed_reaches(&self, offset: i64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.committed().await < Some(offset) {
            assert!(
                Instant::now() < deadline,
                "committed {:?}, never {offset}",
                self.committed().await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Every record in `topic`, read from the beginning until `n` are there.
    async fn read(&self, topic: &str, n: usize) -> Vec<DeliveryRecord> {
        use rdkafka::consumer::BaseConsumer;
        let bootstrap = self.kafka.bootstrap_servers().to_owned();
        let topic = topic.to_owned();
        tokio::task::spawn_blocking(move || {
            let reader: BaseConsumer =
                crate::kafka::consumer_config(&bootstrap, "t-reader", &Default::default())
                    .create()
                    .unwrap();
            let mut tpl = rdkafka::TopicPartitionList::new();
            tpl.add_partition_offset(&topic, 0, rdkafka::Offset::Beginning)
                .unwrap();
            reader.assign(&tpl).unwrap();
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut got = Vec::new();
            while got.len() < n {
                assert!(Instant::now() < deadline, "{} of {n} in {topic}", got.len());
                if let Some(Ok(m)) = reader.poll(Duration::from_millis(100)) {
                    got.push(DeliveryRecord::from_message(&m).unwrap());
                }
            }
            got
        })
        .await
        .unwrap()
    }
}

/// The store panics on the first record's attempt row, after the endpoint answered. The
/// record is parked for a later attempt rather than lost with the task: the partition
/// commits past it, and the endpoint (one request at a time) goes on to the next record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_attempt_parks_its_record_and_the_partition_commits_past_it() {
    let (url, hits) = receiver().await;
    let store = faulty_store(Fault::Panic(EventId::parse("evt_1").unwrap()));
    let (endpoint, deps) = one_at_a_time(url, store.clone()).await;
    let records = [
        delivery_for(&endpoint.id, "evt_1"),
        delivery_for(&endpoint.id, "evt_2"),
    ];
    let (panics, delivered) = (&records[0].delivery_id, &records[1].delivery_id);
    let shortest = deps.tiers.shortest().topic.clone();
    let rig = Rig::start(deps, &records).await;

    rig.committed_reaches(2).await;
    let parked = rig.read(&shortest, 1).await;
    assert_eq!(&parked[0].delivery_id, panics);
    assert_eq!(parked[0].attempts, 0, "parking spends no retry budget");
    assert!(
        parked[0].first_attempt_at.is_some(),
        "its window has started, so a record that always panics is dead-lettered in time"
    );
    assert!(parked[0].not_before.is_some());
    assert_eq!(
        hits.load(Ordering::SeqCst),
        2,
        "both were sent, one at a time"
    );
    assert_eq!(store.inner.attempts(delivered).await.unwrap().len(), 1);

    rig.shutdown.cancel();
    rig.stage.await.unwrap();
}

/// The store panics on the dead note of a record whose endpoint is gone, while it is being
/// dead-lettered: the record has nowhere safer to go than its uncommitted offset, so the
/// stage stops on its own (its supervisor then stops hookline, which exits 70) and commits
/// nothing past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_dead_letter_stops_the_stage_with_its_offset_unsettled() {
    let gone = EndpointId::parse("ep_gone").unwrap();
    let record = delivery_for(&gone, "evt_1");
    let store = faulty_store(Fault::PanicOnNote(record.event_id.clone()));
    let (_, deps) = one_at_a_time("http://127.0.0.1:9/".into(), store).await;
    let mut rig = Rig::start(deps, &[record]).await;

    tokio::time::timeout(Duration::from_secs(60), &mut rig.stage)
        .await
        .expect("the stage stopped on its own")
        .unwrap();
    assert!(!rig.shutdown.is_cancelled());
    let committed = rig.committed().await;
    assert!(
        matches!(committed, None | Some(0)),
        "committed {committed:?}, past the record"
    );
}

/// The headers of a record produced as `out`, by name.
fn headers_of(out: &Outgoing) -> std::collections::BTreeMap<String, String> {
    use rdkafka::message::Headers;
    out.headers
        .iter()
        .map(|h| {
            let value = String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned();
            (h.key.to_owned(), value)
        })
        .collect()
}

/// A delivery whose endpoint is gone is no attempt: the store notes it dead, with its reason
/// and no attempt row, and its dead letter (nothing sent, `not_sent`) follows.
#[tokio::test]
async fn a_refused_delivery_is_noted_dead_without_an_attempt() {
    let store = Arc::new(MemoryStore::with_capacity(16));
    let (endpoint, deps) = one_at_a_time("http://127.0.0.1:9/".into(), store.clone()).await;
    let record = delivery_for(&endpoint.id, "evt_1");
    let report = deps
        .refuse(
            &record,
            DeadReason::EndpointDeleted,
            &CancellationToken::new(),
        )
        .await
        .expect("noted");
    let state = store
        .delivery(&record.delivery_id)
        .await
        .unwrap()
        .expect("the store knows the delivery");
    assert_eq!(state.status, DeliveryStatus::Dead);
    assert_eq!(state.dead_reason, Some(DeadReason::EndpointDeleted));
    assert_eq!(state.attempts, 0);
    assert_eq!(state.first_attempt_at, None);
    assert!(
        store
            .attempts(&record.delivery_id)
            .await
            .unwrap()
            .is_empty()
    );
    let dead = report.follow_up.expect("a dead letter");
    assert_eq!(&*dead.out.topic, "t.dlq");
    let headers = headers_of(&dead.out);
    assert_eq!(headers[header::DEAD_REASON], "endpoint_deleted");
    assert_eq!(headers[header::LAST_ERROR], "not_sent");
    assert_eq!(headers[header::ATTEMPTS], "0", "nothing was sent");
    assert!(!headers.contains_key(header::LAST_STATUS));
}

/// An endpoint without an active signing secret gets nothing: its lane slot comes back without
/// a health signal, and the delivery is noted dead (`no_signing_key`) with no attempt.
#[tokio::test]
async fn a_delivery_without_a_signing_key_is_noted_dead_without_an_attempt() {
    let (url, hits) = receiver().await;
    let store = Arc::new(MemoryStore::with_capacity(16));
    let (endpoint, deps) = one_at_a_time(url, store.clone()).await;
    let mut keyless = (*endpoint).clone();
    keyless.secrets.clear();
    let record = delivery_for(&keyless.id, "evt_1");
    let plan = SendPlan::build(&keyless, SystemTime::now());
    let mut health = Some(Some(breaker::Outcome::Healthy));
    let report = deps
        .attempt(
            &record,
            None,
            &keyless,
            &plan,
            &CancellationToken::new(),
            |h| health = Some(h),
        )
        .await
        .expect("noted");
    assert_eq!(health, Some(None), "answered, with no health signal");
    assert_eq!(hits.load(Ordering::SeqCst), 0);
    let state = store.delivery(&record.delivery_id).await.unwrap().unwrap();
    assert_eq!(state.status, DeliveryStatus::Dead);
    assert_eq!(state.dead_reason, Some(DeadReason::NoSigningKey));
    assert_eq!(state.attempts, 0);
    let dead = report.follow_up.expect("a dead letter");
    assert_eq!(headers_of(&dead.out)[header::DEAD_REASON], "no_signing_key");
}

/// An attempt's row holds the request's headers as the receiver got them: the signature's, the
/// attempt number, the content type and the user agent.
#[tokio::test]
async fn an_attempt_row_holds_the_headers_as_sent() {
    let seen: Arc<std::sync::Mutex<Vec<http::HeaderMap>>> = Arc::default();
    let app = axum::Router::new().fallback({
        let seen = seen.clone();
        move |headers: http::HeaderMap| {
            seen.lock().unwrap().push(headers);
            async { "ok" }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let store = Arc::new(MemoryStore::with_capacity(16));
    let (endpoint, deps) = one_at_a_time(url, store.clone()).await;
    let record = delivery_for(&endpoint.id, "evt_1");
    let plan = SendPlan::build(&endpoint, SystemTime::now());
    deps.attempt(
        &record,
        None,
        &endpoint,
        &plan,
        &CancellationToken::new(),
        |_| {},
    )
    .await
    .expect("logged");
    let rows = store.attempts(&record.delivery_id).await.unwrap();
    let logged = &rows[0].request_headers;
    let received = seen.lock().unwrap()[0].clone();
    for (name, value) in logged {
        assert_eq!(
            received.get(name).and_then(|v| v.to_str().ok()),
            Some(value.as_str()),
            "{name} as logged: {logged:?}"
        );
    }
    let names: BTreeSet<&str> = logged.iter().map(|(n, _)| n.as_str()).collect();
    for name in [
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
        "hookline-attempt",
        "content-type",
        "user-agent",
    ] {
        assert!(names.contains(name), "{name} missing from {logged:?}");
    }
    assert!(logged.contains(&("webhook-id".into(), "evt_1".into())));
}

/// A parked record settles only once its tier has it and the store has its note: while the
/// store refuses notes it stays unsettled; then the delivery shows as scheduled, with the park
/// reason and the time it is due.
// The mock cluster is not Send: current-thread runtime.
#[tokio::test]
async fn a_parked_record_settles_once_its_note_is_durable() {
    use rdkafka::mocking::MockCluster;

    let mock = MockCluster::new(1).unwrap();
    let store = faulty_store(Fault::RefuseNotes(AtomicBool::new(true)));
    let endpoints = Arc::new(MemoryEndpointStore::new(MasterKey::generate()));
    let endpoint = endpoint_at(&endpoints, "http://127.0.0.1:9/hook".into(), 1).await;
    let deps = Arc::new(deps_on(
        &endpoints,
        store.clone(),
        &[Duration::from_secs(1)],
    ));
    for tier in deps.tiers.all() {
        mock.create_topic(&tier.topic, 1, 1).unwrap();
    }
    let (stage, mut reports) = Stage::new(deps, producer_to(&mock.bootstrap_servers()));
    let record = delivery_for(&endpoint.id, "evt_1");
    let id = record.delivery_id.clone();
    let due = SystemTime::now() + Duration::from_secs(30);
    stage.park(
        Tp::new("t.deliveries", 0),
        7,
        record,
        due,
        crate::park_reason::ParkReason::BreakerOpen,
    );
    let early = tokio::time::timeout(Duration::from_secs(2), reports.written.recv()).await;
    assert!(early.is_err(), "settled before its note was durable");

    let Fault::RefuseNotes(refusing) = &store.hooks else {
        unreachable!("a store refusing notes")
    };
    refusing.store(false, Ordering::SeqCst);
    let written = tokio::time::timeout(Duration::from_secs(20), reports.written.recv())
        .await
        .expect("settled once the note was taken")
        .unwrap();
    assert!(written.acked);
    assert_eq!(written.offset, 7);
    let state = store.inner.delivery(&id).await.unwrap().expect("noted");
    assert_eq!(state.status, DeliveryStatus::Scheduled);
    assert_eq!(state.attempts, 0);
    let scheduled = state.scheduled.expect("why and until when");
    assert_eq!(
        scheduled.reason,
        ScheduleReason::Parked(crate::park_reason::ParkReason::BreakerOpen)
    );
    let to_ms = |t: SystemTime| UnixMillis::from_system_time(t);
    assert_eq!(to_ms(scheduled.next_attempt_at), to_ms(due));
}
