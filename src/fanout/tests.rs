//! The fan-out stage on a mock cluster.

use super::*;
use crate::endpoint::{CreateEndpoint, Endpoint};
use crate::id::{EventId, Tenant};
use crate::registry::{EndpointStore, MemoryEndpointStore};
use crate::sealed::MasterKey;
use crate::stage::StageContext;
use metrics_exporter_prometheus::PrometheusBuilder;
use rdkafka::consumer::Consumer;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::FutureRecord;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

/// The fan-out's producer to the mock cluster at `bootstrap`, with hookline's settings.
fn producer_to(bootstrap: &str) -> crate::kafka::Producer {
    crate::kafka::producer_config(bootstrap, &Default::default())
        .create_with_context(crate::kafka::ProducerLog::default())
        .unwrap()
}

/// An endpoint of tenant `acme` subscribed to everything, written to a fresh endpoint store.
async fn acme_subscribed() -> (MemoryEndpointStore, Arc<Endpoint>) {
    let endpoints = MemoryEndpointStore::new(MasterKey::generate());
    let endpoint = Endpoint::create(
        serde_json::from_value::<CreateEndpoint>(serde_json::json!({
            "tenant": "acme", "url": "https://example.com/hook", "event_types": ["*"]
        }))
        .unwrap(),
        SystemTime::now(),
    )
    .unwrap();
    let endpoint = endpoints.put(&endpoint).await.unwrap();
    (endpoints, endpoint)
}

/// The fan-out stage reading `t.events` on the mock cluster at `bootstrap` (group
/// `t-fanout`), writing `t.deliveries` and `t.invalid`, with `endpoints`, `store` and room for
/// `max_held_bytes`; it runs until `shutdown`.
fn stage_on(
    bootstrap: &str,
    producer: &crate::kafka::Producer,
    endpoints: &MemoryEndpointStore,
    store: Arc<dyn DeliveryStore>,
    max_held_bytes: usize,
    shutdown: &CancellationToken,
) -> impl Future<Output = ()> {
    let consumer: StageConsumer =
        crate::kafka::consumer_config(bootstrap, "t-fanout", &Default::default())
            .create_with_context(StageContext::new("fanout"))
            .unwrap();
    consumer.subscribe(&["t.events"]).unwrap();
    run(
        consumer,
        producer.clone(),
        FanoutDeps {
            view: endpoints.view().clone(),
            input: InputConfig::default(),
            topics: FanoutTopics {
                deliveries: Arc::from("t.deliveries"),
                invalid: Arc::from("t.invalid"),
            },
            store,
            dedupe_window: Duration::from_secs(3600),
            max_held_bytes,
        },
        shutdown.clone(),
    )
}

/// The value of the series `name` (name and labels) in `handle`'s scrape; 0 before it has one.
fn counted(handle: &metrics_exporter_prometheus::PrometheusHandle, name: &str) -> u64 {
    handle
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<u64>().ok())
        .unwrap_or(0)
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
    let fanned_out = || counted(&handle, "hookline_events_fanned_out_total") as usize;
    let producer = producer_to(&bootstrap);
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
    let (endpoints, _) = acme_subscribed().await;

    // From now on the broker refuses every produce (librdkafka retries them).
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS; 100_000],
    );
    let shutdown = CancellationToken::new();
    let stage = stage_on(
        &bootstrap,
        &producer,
        &endpoints,
        Arc::new(crate::storage::memory::MemoryStore::with_capacity(1_000)),
        // Room for about five events' records.
        5 * PAYLOAD,
        &shutdown,
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

/// The fan-out and the store: an event is recorded, with the endpoints it went to, once its
/// delivery records are acknowledged, and so is an event no endpoint subscribes to. A copy read
/// later on another partition (as another instance, or after a restart, would read it) is
/// dropped as a repeat; a different event reusing the id goes to the invalid topic.
// The mock cluster is not Send: current-thread runtime, local metrics recorder.
#[tokio::test]
async fn the_store_tells_a_repeat_from_a_new_event_across_partitions() {
    let mock = MockCluster::new(1).unwrap();
    mock.create_topic("t.events", 2, 1).unwrap();
    for topic in ["t.deliveries", "t.invalid"] {
        mock.create_topic(topic, 1, 1).unwrap();
    }
    let bootstrap = mock.bootstrap_servers();
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let _local = metrics::set_default_local_recorder(&recorder);
    let metric = |name: &str| counted(&handle, name);
    let producer = producer_to(&bootstrap);
    let post = |partition: i32, id: &str, tenant: &str, payload: serde_json::Value| {
        let value = serde_json::json!({
            "id": id, "tenant": tenant, "type": "order.created", "payload": payload,
        })
        .to_string();
        let producer = producer.clone();
        async move {
            producer
                .send(
                    FutureRecord::<str, str>::to("t.events")
                        .partition(partition)
                        .payload(&value),
                    Duration::from_secs(10),
                )
                .await
                .unwrap();
        }
    };
    let (endpoints, endpoint) = acme_subscribed().await;
    let store = Arc::new(crate::storage::memory::MemoryStore::with_capacity(100));
    let shutdown = CancellationToken::new();
    let stage = stage_on(
        &bootstrap,
        &producer,
        &endpoints,
        store.clone(),
        MAX_HELD_BYTES,
        &shutdown,
    );
    let (acme, globex) = (
        Tenant::parse("acme").unwrap(),
        Tenant::parse("globex").unwrap(),
    );
    let event = |s: &str| EventId::parse(s).unwrap();
    let watch = async {
        let recorded = |tenant: Tenant, id: EventId| {
            let store = store.clone();
            async move {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
                loop {
                    if let Some(row) = store.event(&tenant, &id).await.unwrap() {
                        return row;
                    }
                    assert!(tokio::time::Instant::now() < deadline, "{id} not recorded");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        post(0, "evt_1", "acme", serde_json::json!({"n": 1})).await;
        post(0, "evt_2", "globex", serde_json::json!({"n": 2})).await;
        let first = recorded(acme.clone(), event("evt_1")).await;
        assert_eq!(first.endpoints, vec![endpoint.id.clone()]);
        assert_eq!(first.event_type, "order.created");
        let body: serde_json::Value = serde_json::from_slice(&first.body).unwrap();
        assert_eq!(body["data"], serde_json::json!({"n": 1}));
        let nobody = recorded(globex.clone(), event("evt_2")).await;
        assert!(nobody.endpoints.is_empty(), "recorded with no endpoint");

        // Another partition reads a copy, and then a different event with the id.
        post(1, "evt_1", "acme", serde_json::json!({"n": 1})).await;
        post(1, "evt_1", "acme", serde_json::json!({"n": "other"})).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while metric("hookline_events_repeated_total") < 1
            || metric(r#"hookline_invalid_records_total{reason="reused_id"}"#) < 1
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{}",
                handle.render()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The same copy again on the first partition is caught there, before the store.
        post(0, "evt_1", "acme", serde_json::json!({"n": 1})).await;
        while metric("hookline_events_repeated_total") < 2 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{}",
                handle.render()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        shutdown.cancel();
    };
    tokio::join!(stage, watch);
    assert_eq!(
        metric("hookline_events_fanned_out_total"),
        2,
        "evt_1 and evt_2, once"
    );
    assert_eq!(metric("hookline_deliveries_created_total"), 1);
    let kept = store.event(&acme, &event("evt_1")).await.unwrap().unwrap();
    let body: serde_json::Value = serde_json::from_slice(&kept.body).unwrap();
    assert_eq!(
        body["data"],
        serde_json::json!({"n": 1}),
        "the first event kept"
    );
}
