//! The whole pipeline (fan-out, delivery, delay tiers, DLQ) end to end, each scenario once on
//! librdkafka's mock cluster and once on the real Kafka from `tests/services`.

pub(crate) mod harness;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use hookline::config::Config;
use hookline::dead_reason::DeadReason;
use hookline::event_type::EventType;
use hookline::id::{EndpointId, EventId, Tenant};
use hookline::record::{DeliveryRecord, UnixMillis, header};
use rdkafka::Message;
use rdkafka::message::{Headers, OwnedMessage};
use serde_json::json;

use crate::support::receiver::{Receiver, Reply};
pub use harness::verify as verify_request;
use harness::{On, Pipeline, dead_record, test_config, verify};

const WAIT: Duration = Duration::from_secs(60);
/// How long the receiver holds its answer to a replayed request in the admin API replay test.
const HELD: Duration = Duration::from_secs(3);

/// N events x M endpoints: every pair delivered, signed, with the event id as webhook-id and the
/// body built once in the documented shape.
async fn every_event_reaches_every_endpoint(on: On) {
    let p = Pipeline::start(on, test_config(on)).await;
    let receivers = [
        Receiver::fixed(Reply::status(200)).await,
        Receiver::fixed(Reply::status(204)).await,
        Receiver::fixed(Reply::status(202)).await,
    ];
    let mut secrets = vec![];
    for r in &receivers {
        secrets.push(
            p.endpoint("acme", &r.url("/hook"), &["order.created"])
                .await
                .1,
        );
    }
    let events: Vec<(String, serde_json::Value)> = (0..20)
        .map(|i| (format!("evt_{i}"), json!({"n": i, "note": "ünïcode"})))
        .collect();
    let posts: Vec<_> = events
        .iter()
        .map(|(id, v)| (id.as_str(), "acme", "order.created", v.clone()))
        .collect();
    p.post(&posts).await;
    for (r, secret) in receivers.iter().zip(&secrets) {
        let got = r.wait_for(20, WAIT).await;
        let ids: BTreeSet<String> = got.iter().map(|req| verify(req, secret)).collect();
        assert_eq!(ids.len(), 20, "each event once per endpoint (ids: {ids:?})");
        for req in &got {
            let body: serde_json::Value = serde_json::from_slice(&req.body).unwrap();
            assert_eq!(body["type"], "order.created");
            assert_eq!(body["id"], req.header("webhook-id").unwrap());
            assert!(body["timestamp"].as_str().unwrap().ends_with('Z'));
            assert_eq!(body["data"]["note"], "ünïcode");
        }
    }
    p.stop().await;
}

/// A tenant's events never reach another tenant's endpoints; `*` and `order.*` filters match
/// what they should and nothing else.
async fn tenants_are_isolated_and_wildcards_match(on: On) {
    let p = Pipeline::start(on, test_config(on)).await;
    let orders = Receiver::fixed(Reply::status(200)).await;
    let everything = Receiver::fixed(Reply::status(200)).await;
    let other_tenant = Receiver::fixed(Reply::status(200)).await;
    p.endpoint("acme", &orders.url("/"), &["order.*"]).await;
    p.endpoint("acme", &everything.url("/"), &["*"]).await;
    p.endpoint("globex", &other_tenant.url("/"), &["*"]).await;
    p.post(&[
        ("e1", "acme", "order.created", json!({})),
        ("e2", "acme", "order.item.added", json!({})),
        ("e3", "acme", "invoice.paid", json!({})),
        ("e4", "acme", "orders.bogus", json!({})),
        ("e5", "globex", "order.created", json!({})),
    ])
    .await;
    let ids = |r: &Receiver| -> BTreeSet<String> {
        r.requests()
            .iter()
            .map(|q| q.header("webhook-id").unwrap().to_owned())
            .collect()
    };
    everything.wait_for(4, WAIT).await;
    other_tenant.wait_for(1, WAIT).await;
    orders.wait_for(2, WAIT).await;
    // Give stray deliveries a moment to show up before asserting they did not.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(ids(&orders), BTreeSet::from(["e1".into(), "e2".into()]));
    assert_eq!(
        ids(&everything),
        BTreeSet::from(["e1".into(), "e2".into(), "e3".into(), "e4".into()])
    );
    assert_eq!(ids(&other_tenant), BTreeSet::from(["e5".into()]));
    p.stop().await;
}

/// 503, 503, then 200: delivered on the third attempt with the same webhook-id each time.
async fn transient_failures_are_retried_with_the_same_id(on: On) {
    let p = Pipeline::start(on, test_config(on)).await;
    let counter = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = counter.clone();
    let r = Receiver::start(move |_| {
        if c.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 2 {
            Reply::status(503)
        } else {
            Reply::status(200)
        }
    })
    .await;
    let (endpoint, secret) = p.endpoint("acme", &r.url("/"), &["*"]).await;
    p.post(&[("evt_retry", "acme", "order.created", json!({"x": 1}))])
        .await;
    let got = r.wait_for(3, WAIT).await;
    let ids: Vec<String> = got.iter().map(|q| verify(q, &secret)).collect();
    assert_eq!(ids, ["evt_retry"; 3]);
    let attempts: Vec<&str> = got
        .iter()
        .map(|q| q.header("hookline-attempt").unwrap())
        .collect();
    assert_eq!(attempts, ["1", "2", "3"]);
    assert!(
        got.windows(2).all(|w| w[0].body == w[1].body),
        "the same bytes every time"
    );
    // The attempt log has all three, and the delivery ended succeeded.
    let delivery = hookline::id::DeliveryId::derive(
        &hookline::id::EventId::parse("evt_retry").unwrap(),
        &endpoint,
    );
    let rows = wait_rows(&p, &delivery, 3).await;
    assert_eq!(
        rows.iter().map(|r| r.status).collect::<Vec<_>>(),
        [Some(503), Some(503), Some(200)]
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(r.requests().len(), 3, "no attempt after the success");
    p.stop().await;
}

async fn wait_rows(
    p: &Pipeline,
    delivery: &hookline::id::DeliveryId,
    n: usize,
) -> Vec<hookline::storage::AttemptRow> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let rows = p.handles.store.attempts(delivery).await.unwrap();
        if rows.len() >= n {
            return rows;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} attempt rows",
            rows.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An endpoint that always answers 500 is retried until the window is spent, then its record
/// lands in the DLQ complete: exact body, ids, attempts, last status, reason, key ids, origin.
async fn a_failing_endpoint_is_dead_lettered_completely(on: On) {
    let p = Pipeline::start(on, test_config(on)).await;
    let r = Receiver::fixed(Reply::status(500).body("broken")).await;
    let (endpoint, _) = p.endpoint("acme", &r.url("/"), &["*"]).await;
    p.post(&[(
        "evt_dead",
        "acme",
        "order.created",
        json!({"keep": "these bytes"}),
    )])
    .await;
    let dlq = p.read(&p.config.kafka.topics.dlq, 1, WAIT).await;
    let dead = dead_record(&dlq[0]);
    let requests = r.requests();
    assert!(
        requests.len() >= 3,
        "retried before giving up ({} attempts)",
        requests.len()
    );
    assert_eq!(
        &dead.body[..],
        &requests[0].body[..],
        "DLQ keeps the exact bytes sent"
    );
    assert_eq!(dead.event_id.as_str(), "evt_dead");
    assert_eq!(dead.endpoint_id, endpoint);
    assert_eq!(dead.attempts as usize, requests.len());
    let info = dead.dead.as_ref().expect("dead info");
    assert_eq!(info.reason, DeadReason::WindowExhausted);
    assert_eq!(info.last_status, Some(500));
    assert_eq!(info.signing_key_ids.len(), 1);
    assert_eq!(
        dead.origin.as_ref().unwrap().topic,
        p.config.kafka.topics.events
    );
    assert!(dead.first_attempt_at.is_some());
    let h: BTreeMap<String, String> = dlq[0]
        .headers()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h.key.to_owned(),
                String::from_utf8_lossy(h.value.unwrap_or_default()).into(),
            )
        })
        .collect();
    assert_eq!(h[header::DEAD_REASON], "window_exhausted");
    p.stop().await;
}

/// 410 is dead at once and disables the endpoint: its record goes to the DLQ, and later events
/// are no longer fanned out to it.
async fn gone_disables_the_endpoint(on: On) {
    let p = Pipeline::start(on, test_config(on)).await;
    let r = Receiver::fixed(Reply::status(410)).await;
    let (endpoint, _) = p.endpoint("acme", &r.url("/"), &["*"]).await;
    p.post(&[("g1", "acme", "a.b", json!({}))]).await;
    r.wait_for(1, WAIT).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while p.handles.view.get(&endpoint).is_some_and(|e| e.enabled) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "endpoint was not disabled"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let e = p.handles.view.get(&endpoint).unwrap();
    assert_eq!(e.disabled_reason.as_deref(), Some("gone"));
    let dlq = p.read(&p.config.kafka.topics.dlq, 1, WAIT).await;
    assert_eq!(dead_record(&dlq[0]).dead.unwrap().reason, DeadReason::Gone);
    // A later event still reaches the tenant's other endpoint, and never the disabled one.
    let other = Receiver::fixed(Reply::status(200)).await;
    p.endpoint("acme", &other.url("/"), &["*"]).await;
    p.post(&[("g2", "acme", "a.b", json!({}))]).await;
    other.wait_for(1, WAIT).await;
    assert_eq!(
        r.requests().len(),
        1,
        "nothing more is sent to a disabled endpoint"
    );
    p.stop().await;
}

/// A delivery record, as the fan-out makes it, of `event` (tenant `acme`, type
/// `order.created`, now) to `endpoint` with `body`.
fn delivery(event: &str, endpoint: &EndpointId, body: &'static [u8]) -> DeliveryRecord {
    DeliveryRecord::new(
        EventId::parse(event).unwrap(),
        endpoint.clone(),
        Tenant::parse("acme").unwrap(),
        EventType::parse("order.created").unwrap(),
        UnixMillis::from(SystemTime::now()),
        None,
        Bytes::from_static(body),
    )
}

/// A delivery for an endpoint deleted since its event was fanned out is dead-lettered as
/// `endpoint_deleted`, with its body, once the instance has confirmed its endpoint view is
/// current: it is not parked for ever waiting for the endpoint to appear.
async fn a_delivery_for_a_deleted_endpoint_is_dead_lettered(on: On) {
    let mut config = test_config(on);
    config.retry.window = Duration::from_secs(600);
    let p = Pipeline::start(on, config).await;
    let r = Receiver::fixed(Reply::status(200)).await;
    let (endpoint, _) = p.endpoint("acme", &r.url("/"), &["*"]).await;
    p.handles
        .endpoints
        .delete(&endpoint)
        .await
        .expect("endpoint deleted");
    let record = delivery("evt_gone", &endpoint, br#"{"gone":true}"#);
    p.produce_delivery(&p.config.kafka.topics.deliveries, &record)
        .await;
    let dlq = p.read(&p.config.kafka.topics.dlq, 1, WAIT).await;
    let dead = dead_record(&dlq[0]);
    assert_eq!(dead.endpoint_id, endpoint);
    assert_eq!(dead.dead.unwrap().reason, DeadReason::EndpointDeleted);
    assert_eq!(&dead.body[..], br#"{"gone":true}"#);
    assert!(
        r.requests().is_empty(),
        "nothing sent to a deleted endpoint"
    );
    p.stop().await;
}

/// An instance whose endpoint view is behind the one that fanned an event out (an endpoint
/// created a moment ago elsewhere) delivers the event once its view has the endpoint; it does
/// not dead-letter it as `endpoint_deleted`. The broker leading the endpoints topic answers
/// seconds late, so this instance's view lags by that much while the delivery record arrives
/// at once. Mock cluster only: a real broker cannot be slowed for one topic.
async fn a_lagging_endpoint_view_delays_a_delivery_instead_of_dead_lettering_it() {
    let mut config = test_config(On::Mock);
    config.retry.window = Duration::from_secs(600);
    let (p, split) = Pipeline::start_split(config).await;
    let r = Receiver::fixed(Reply::status(200)).await;
    // Connections and topic metadata are set up before the broker slows down.
    let producer = p.producer();
    let (warm, _) = p.endpoint("acme", &r.url("/warm"), &["*"]).await;
    let send = |topic: &str, key: &str, value: Option<Vec<u8>>| {
        let producer = producer.clone();
        let (topic, key) = (topic.to_owned(), key.to_owned());
        async move {
            let mut rec = rdkafka::producer::FutureRecord::<str, [u8]>::to(&topic).key(&key);
            if let Some(v) = &value {
                rec = rec.payload(v);
            }
            producer
                .send(rec, Duration::from_secs(30))
                .await
                .expect("produced");
        }
    };
    send(&p.config.kafka.topics.endpoints, "ep_warmup", None).await;
    let deliveries = p.config.kafka.topics.deliveries.clone();
    harness::produce_delivery(&producer, &deliveries, &delivery("evt_warm", &warm, b"{}")).await;
    r.wait_for(1, WAIT).await;

    split.slow_endpoints_broker(Duration::from_secs(4));
    let secret = hookline::signing::SigningSecret::generate();
    let whsec = secret.expose_whsec().to_string();
    let created = hookline::endpoint::Endpoint::create(
        hookline::endpoint::CreateEndpoint {
            tenant: Tenant::parse("acme").unwrap(),
            url: r.url("/new"),
            event_types: vec!["*".into()],
            max_in_flight: None,
            rate_limit_per_s: None,
            secret: Some(whsec.clone()),
        },
        SystemTime::now(),
    )
    .unwrap();
    // Written elsewhere: on the broker as soon as the request reaches it, acknowledged (and
    // seen by this instance's view) only seconds later.
    let written = tokio::spawn(send(
        &p.config.kafka.topics.endpoints,
        created.id.as_str(),
        Some(p.endpoint_value(&created)),
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    harness::produce_delivery(
        &producer,
        &deliveries,
        &delivery("evt_new", &created.id, b"{}"),
    )
    .await;
    assert!(
        p.handles.view.get(&created.id).is_none(),
        "the view is behind when the delivery arrives"
    );

    let got = r.wait_for(2, WAIT).await;
    assert_eq!(verify(&got[1], &whsec), "evt_new");
    written.await.unwrap();
    split.slow_endpoints_broker(Duration::ZERO);
    // Give a wrongful dead letter time to show up before asserting there is none.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        p.records_in(&p.config.kafka.topics.dlq),
        0,
        "nothing dead-lettered"
    );
    assert_eq!(r.requests().len(), 2, "delivered once");
    p.stop().await;
}

/// An endpoint that hangs does not hold up a healthy one: every healthy delivery completes
/// while the hanging endpoint's first attempts are still waiting for their timeout.
async fn a_hanging_endpoint_does_not_slow_the_others(on: On) {
    let (p, slow) = hanging_beside_healthy(test_config(on), on, 50).await;
    assert!(
        !slow.requests().is_empty(),
        "the hanging endpoint was tried too"
    );
    p.stop().await;
}

/// An endpoint that hangs does not hold up the endpoints sharing its partition: once its lane is
/// full and silent for `stall_after`, its records park instead of filling the partition's window,
/// and the span pinned by its hanging attempts does not pause the partition either. One partition
/// and a window of 20 make any of that show within 300 events.
async fn a_hanging_endpoint_does_not_hold_up_its_partition(on: On) {
    let mut config = test_config(on);
    config.kafka.partitions = 1;
    config.delivery.max_in_flight = 2;
    config.delivery.partition_max_in_flight = 20;
    config.delivery.stall_after = Duration::from_millis(300);
    let (p, slow) = hanging_beside_healthy(config, on, 300).await;
    assert_eq!(
        slow.requests().len(),
        2,
        "the hanging endpoint got its two slots' worth and nothing more"
    );
    p.stop().await;
}

/// Probes until `check` holds and returns what it saw, or fails with `what` and the last value
/// seen.
async fn eventually<T: std::fmt::Debug>(
    what: &str,
    mut probe: impl FnMut() -> T,
    check: impl Fn(&T) -> bool,
) -> T {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let seen = probe();
        if check(&seen) {
            return seen;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: still {seen:?} after {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Posts `n` events of type `t` for tenant `acme`, with ids `{prefix}0`, `{prefix}1`, ...
/// and their index as payload; returns the ids.
async fn post_numbered(p: &Pipeline, prefix: &str, n: usize) -> Vec<String> {
    let ids: Vec<String> = (0..n).map(|i| format!("{prefix}{i}")).collect();
    let posts: Vec<_> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), "acme", "t", json!(i)))
        .collect();
    p.post(&posts).await;
    ids
}

/// Every id of `expected` was sent exactly once in `got`. When not, the failure names the ids
/// sent twice and those not sent, with what the attempt log holds for each duplicate: a first
/// attempt that failed (a timeout, retried as at-least-once allows) or one that succeeded (a
/// record sent again for nothing).
async fn assert_sent_once(
    p: &Pipeline,
    got: &[crate::support::receiver::RecordedRequest],
    expected: &[String],
) {
    let mut sent: BTreeMap<String, usize> = BTreeMap::new();
    for r in got {
        *sent
            .entry(r.header("webhook-id").expect("webhook-id").to_owned())
            .or_default() += 1;
    }
    let twice: Vec<&String> = sent
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, _)| id)
        .collect();
    let missing: Vec<&String> = expected
        .iter()
        .filter(|id| !sent.contains_key(*id))
        .collect();
    if twice.is_empty() && missing.is_empty() {
        return;
    }
    let store = &p.handles.store;
    let mut logged = String::new();
    for id in &twice {
        let event = EventId::parse(id.as_str()).expect("event id");
        for d in store
            .event_deliveries(&event)
            .await
            .expect("event deliveries")
        {
            let attempts = store.attempts(&d.delivery_id).await.expect("attempts");
            let rows: Vec<_> = attempts
                .iter()
                .map(|a| (a.attempt, a.status, a.error_class, a.latency_ms))
                .collect();
            logged.push_str(&format!("\n  {id}: (attempt, status, error, ms) {rows:?}"));
        }
    }
    panic!(
        "{} requests for {} records: sent twice {twice:?}, not sent {missing:?}; the attempt \
         log:{logged}",
        got.len(),
        sent.len()
    );
}

/// A healthy endpoint's backlog waits in its lane while its partition pauses: nothing parks,
/// even as the stage takes the rest of a batch after the record that filled the window. One
/// partition, one endpoint, a window of 20 and a slow receiver keep the lane full throughout.
/// The shortest tier is 5 s: the endpoint (a few hundred requests a second) gets through what
/// its lane queues (the window and what is taken after a pause, under 300 records) well within
/// it, as a healthy endpoint does. Slower than that, the surplus would be parked until its turn.
async fn a_backlog_waits_in_its_lane_and_nothing_parks(on: On) {
    let mut config = test_config(on);
    config.kafka.partitions = 1;
    config.delivery.max_in_flight = 2;
    config.delivery.partition_max_in_flight = 20;
    config.retry.tiers = vec![Duration::from_secs(5)];
    let p = Pipeline::start(on, config).await;
    let rx = Receiver::fixed(Reply::status(200).delay(Duration::from_millis(5))).await;
    p.endpoint("acme", &rx.url("/"), &["*"]).await;
    let n = 400;
    let ids = post_numbered(&p, "b", n).await;
    let got = rx.wait_for(n, WAIT).await;
    assert_sent_once(&p, &got, &ids).await;
    let tiers = hookline::delay_tier::Tiers::new(
        &p.config.kafka.topics.retry_prefix,
        &p.config.retry.tiers,
    );
    for tier in tiers.all() {
        assert_eq!(
            p.records_in(&tier.topic),
            0,
            "records parked in {} although the endpoint kept answering",
            tier.topic
        );
    }
    p.stop().await;
}

/// An endpoint with a low rate limit and a backlog does not hold up its partition: what its
/// rate cannot send soon is parked until its turn, and an endpoint sharing the partition gets
/// its events at once. Held in the lane, the backlog would fill the partition's window (50
/// here) and the other endpoint's events, behind it in the partition, would wait for the
/// slow one to settle some 150 records at 2 a second.
async fn a_rate_limited_backlog_does_not_hold_up_its_partition(on: On) {
    let mut config = test_config(on);
    config.kafka.partitions = 1;
    config.delivery.partition_max_in_flight = 50;
    let p = Pipeline::start(on, config).await;
    let slow = Receiver::fixed(Reply::status(200)).await;
    let fast = Receiver::fixed(Reply::status(200)).await;
    p.endpoint_limited("acme", &slow.url("/"), &["slow"], Some(2.0))
        .await;
    p.endpoint("acme", &fast.url("/"), &["fast"]).await;
    let backlog: Vec<(String, &str)> = (0..200).map(|i| (format!("s{i}"), "slow")).collect();
    let then: Vec<(String, &str)> = (0..5).map(|i| (format!("f{i}"), "fast")).collect();
    let posts: Vec<_> = backlog
        .iter()
        .chain(&then)
        .map(|(id, kind)| (id.as_str(), "acme", *kind, json!({})))
        .collect();
    p.post(&posts).await;
    fast.wait_for(5, Duration::from_secs(20)).await;
    let sent = slow.requests().len();
    assert!(
        sent < 60,
        "the rate-limited endpoint got {sent} requests, more than 2 a second allows"
    );
    // Its lane held 2 (what 2 a second sends within the shortest tier, 1 s here); the rest
    // come back at their turns and are sent, each once.
    let got = slow.wait_for(16, WAIT).await;
    let ids: BTreeSet<String> = got
        .iter()
        .map(|r| r.header("webhook-id").expect("webhook-id").to_owned())
        .collect();
    assert_eq!(ids.len(), got.len(), "a record was sent twice");
    p.stop().await;
}

/// An endpoint limited by its concurrency that answers slowly (1 s a request, 10 at a time, so
/// 10 a second) does not hold up its partition: what it cannot send within the shortest tier
/// (1 s here) is parked until its turn, and an endpoint sharing the partition gets its events
/// at once. Held in the lane, its backlog would fill the partition's window (50 here): the
/// partition would resume only once the slow endpoint had settled half of what the stage took
/// (up to the window and the 256 records taken after a pause), and the other endpoint's events,
/// posted behind the backlog, would wait for two such rounds, over 30 s at 10 a second.
/// `stall_after` is long: the slow endpoint keeps answering, so this is not the stalled
/// endpoint's path. The parked records come back and are sent, each once.
async fn a_slow_endpoints_backlog_does_not_hold_up_its_partition(on: On) {
    let mut config = test_config(on);
    config.kafka.partitions = 1;
    config.delivery.max_in_flight = 10;
    config.delivery.partition_max_in_flight = 50;
    config.delivery.stall_after = Duration::from_secs(30);
    config.http.total_timeout = Duration::from_secs(10);
    let p = Pipeline::start(on, config).await;
    let slow = Receiver::fixed(Reply::status(200).delay(Duration::from_secs(1))).await;
    let fast = Receiver::fixed(Reply::status(200)).await;
    p.endpoint("acme", &slow.url("/"), &["slow"]).await;
    p.endpoint("acme", &fast.url("/"), &["fast"]).await;
    let n = 400;
    let backlog: Vec<String> = (0..n).map(|i| format!("s{i}")).collect();
    let posts: Vec<_> = backlog
        .iter()
        .map(|id| (id.as_str(), "acme", "slow", json!({})))
        .collect();
    p.post(&posts).await;
    // The backlog is being sent, and the events posted now are behind it in the partition.
    slow.wait_for(1, WAIT).await;
    let posts: Vec<_> = ["f0", "f1", "f2", "f3", "f4"]
        .iter()
        .map(|id| (*id, "acme", "fast", json!({})))
        .collect();
    p.post(&posts).await;
    fast.wait_for(5, Duration::from_secs(20)).await;
    // 400 records at 10 a second, and the turns of the parked ones.
    let got = slow.wait_for(n, 2 * WAIT).await;
    assert_sent_once(&p, &got, &backlog).await;
    p.stop().await;
}

/// A process started with another master key than the endpoints were sealed with refuses to
/// start and says why: with an empty endpoint view, its fan-out would find no subscriber for
/// any event, commit, and deliver nothing.
async fn another_master_key_refuses_to_start(on: On) {
    let p = Pipeline::start(on, test_config(on)).await;
    let r = Receiver::fixed(Reply::status(200)).await;
    let (id, _) = p.endpoint("acme", &r.url("/"), &["*"]).await;
    let mut other = p.config.clone();
    other.security.master_key = Some(hookline::sealed::MasterKey::generate());
    let (shutdown, tasks) = (
        tokio_util::sync::CancellationToken::new(),
        tokio_util::task::TaskTracker::new(),
    );
    let err = hookline::service::start(&other, hookline::service::Role::All, &shutdown, &tasks)
        .await
        .err()
        .expect("a process with another master key started")
        .to_string();
    shutdown.cancel();
    tasks.close();
    tasks.wait().await;
    assert!(
        err.contains("1 endpoint record(s) do not open with security.master_key")
            && err.contains(id.as_str()),
        "{err}"
    );
    p.stop().await;
}

/// Records held back by an open breaker before any attempt reach the DLQ once their window is
/// spent: the window starts when a record is first held back, as it would at its first attempt.
/// Without that a failing endpoint's backlog cycles through the tiers with one probe per
/// cool-down (1, 2, 4, ... s here), and its records, never attempted, never die.
async fn held_back_records_are_dead_lettered_when_their_window_is_spent(on: On) {
    let mut config = test_config(on);
    config.delivery.breaker_failure_threshold = 3;
    config.delivery.breaker_cooldown = Duration::from_secs(1);
    let p = Pipeline::start(on, config).await;
    let r = Receiver::fixed(Reply::status(503)).await;
    p.endpoint("acme", &r.url("/"), &["*"]).await;
    // Three failures open the breaker; the 30 events after them find it open.
    post_numbered(&p, "warm", 3).await;
    r.wait_for(3, WAIT).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    post_numbered(&p, "held", 30).await;
    let dlq = p.config.kafka.topics.dlq.clone();
    let started = tokio::time::Instant::now();
    let dead = loop {
        let n = usize::try_from(p.records_in(&dlq)).unwrap();
        let got = if n == 0 {
            vec![]
        } else {
            p.read(&dlq, n, WAIT).await
        };
        let held: BTreeMap<String, hookline::record::DeadInfo> = got
            .iter()
            .map(dead_record)
            .filter(|d| d.event_id.as_str().starts_with("held"))
            .map(|d| {
                let info = d.dead.clone().expect("dead info");
                (d.event_id.as_str().to_owned(), info)
            })
            .collect();
        // The breaker's probes reach a few of them (one per cool-down, each cool-down twice
        // the last); every other one dies on its window.
        if held.len() >= 24 || started.elapsed() > WAIT {
            break held;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        dead.len() >= 24,
        "{} of 30 held records dead-lettered",
        dead.len()
    );
    for (id, info) in &dead {
        assert_eq!(info.reason, DeadReason::WindowExhausted, "{id}");
        // Refused without a request (`not_sent`), or answered 503 as a breaker's probe.
        match info.last_status {
            None => assert_eq!(
                info.last_error,
                Some(hookline::attempt::ErrorClass::NotSent),
                "{id}"
            ),
            Some(status) => assert_eq!(status, 503, "{id}"),
        }
    }
    p.stop().await;
}

/// Runs `n` events to a hanging endpoint and a healthy one (HTTP timeout 45 s) and checks that
/// every healthy delivery arrived while no attempt to the hanging endpoint had finished yet.
/// Returns the pipeline and the hanging receiver.
async fn hanging_beside_healthy(mut config: Config, on: On, n: usize) -> (Pipeline, Receiver) {
    config.http.total_timeout = Duration::from_secs(45);
    // Records held back from the hanging endpoint start their window then; the test config's
    // 3 s would dead-letter them (an attempt row, nothing sent) while a loaded machine is still
    // delivering the healthy ones.
    config.retry.window = Duration::from_secs(600);
    let p = Pipeline::start(on, config).await;
    let slow = Receiver::fixed(Reply::status(200).delay(Duration::from_secs(3600))).await;
    let fast = Receiver::fixed(Reply::status(200)).await;
    let (slow_id, _) = p.endpoint("acme", &slow.url("/"), &["*"]).await;
    p.endpoint("acme", &fast.url("/"), &["*"]).await;
    let events = post_numbered(&p, "h", n).await;
    fast.wait_for(n, WAIT).await;
    for id in &events {
        let delivery =
            hookline::id::DeliveryId::derive(&hookline::id::EventId::parse(id).unwrap(), &slow_id);
        assert!(
            p.handles
                .store
                .attempts(&delivery)
                .await
                .unwrap()
                .is_empty(),
            "an attempt to the hanging endpoint finished before the healthy deliveries did"
        );
    }
    (p, slow)
}

/// Reads the one record expected on the invalid topic and checks it is `payload` unchanged,
/// with `reason` in its reason header.
async fn the_invalid_record(p: &Pipeline, payload: &[u8], reason: &str) -> OwnedMessage {
    let mut invalid = p.read(&p.config.kafka.topics.invalid, 1, WAIT).await;
    let record = invalid.remove(0);
    assert_eq!(record.payload(), Some(payload), "kept as it was");
    let found = last_header(&record, hookline::input::INVALID_REASON_HEADER)
        .map(|v| String::from_utf8_lossy(&v).into_owned());
    assert_eq!(found.as_deref(), Some(reason));
    record
}

/// The value of the last header named `name`, read through librdkafka: a forwarded record
/// keeps its original headers, whose names rdkafka's own reader panics on when they are not
/// UTF-8.
fn last_header(record: &OwnedMessage, name: &str) -> Option<Vec<u8>> {
    use rdkafka::bindings::{rd_kafka_header_get_last, rd_kafka_headers_t, rd_kafka_resp_err_t};
    let headers = record.headers()?.as_borrowed();
    // rdkafka's `&BorrowedHeaders` is librdkafka's header list pointer, cast.
    let native = std::ptr::from_ref(headers).cast::<rd_kafka_headers_t>();
    let name = std::ffi::CString::new(name).unwrap();
    let mut value: *const std::ffi::c_void = std::ptr::null();
    let mut size = 0usize;
    // SAFETY: the list lives as long as `record`; the out-pointers are valid locals.
    let err = unsafe { rd_kafka_header_get_last(native, name.as_ptr(), &mut value, &mut size) };
    if err != rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        return None;
    }
    if value.is_null() {
        return Some(vec![]);
    }
    // SAFETY: librdkafka gives `size` bytes at `value`, owned by the list.
    Some(unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) }.to_vec())
}

/// A record that is neither a Debezium outbox record nor a native event lands in the invalid
/// topic with a reason, and the events behind it are still delivered.
async fn malformed_input_goes_to_the_invalid_topic(on: On) {
    let p = Pipeline::start(on, test_config(on)).await;
    let r = Receiver::fixed(Reply::status(200)).await;
    p.endpoint("acme", &r.url("/"), &["*"]).await;
    p.post_raw("k", b"this is not json").await;
    p.post(&[("after_bad", "acme", "t", json!({}))]).await;
    r.wait_for(1, WAIT).await;
    the_invalid_record(&p, b"this is not json", "not_json").await;
    p.stop().await;
}

/// A record whose header name is not UTF-8 (any producer but Java's can write one) lands in
/// the invalid topic, and the events behind it are still delivered: reading its headers must
/// not stop the fan-out.
async fn a_header_name_that_is_not_utf8_goes_to_the_invalid_topic(on: On) {
    let p = Pipeline::start(on, test_config(on)).await;
    let r = Receiver::fixed(Reply::status(200)).await;
    p.endpoint("acme", &r.url("/"), &["*"]).await;
    let value = json!({"id": "bad_name", "tenant": "acme", "type": "t", "payload": {}}).to_string();
    tokio::task::block_in_place(|| p.post_with_header_name("k", value.as_bytes(), b"\xff\xfe"));
    p.post(&[("after_bad_name", "acme", "t", json!({}))]).await;
    r.wait_for(1, WAIT).await;
    assert_eq!(
        r.requests()[0].header("webhook-id"),
        Some("after_bad_name"),
        "the record with the bad header name was not delivered"
    );
    the_invalid_record(&p, value.as_bytes(), "bad_header:#0").await;
    p.stop().await;
}

/// An invalid input record too large for hookline's producers to forward whole (an input topic
/// may hold records larger than their `message.max.bytes`) reaches the invalid topic without its
/// value, its detail saying where the original is, and the events behind it are delivered. A
/// forward that can never be written would hold its partition for good.
async fn an_invalid_record_too_large_to_forward_goes_without_its_value(on: On) {
    let mut config = test_config(on);
    config
        .kafka
        .client
        .insert("message.max.bytes".into(), "200000".into());
    config.http.max_payload_bytes = 100_000;
    let p = Pipeline::start(on, config).await;
    let r = Receiver::fixed(Reply::status(200)).await;
    p.endpoint("acme", &r.url("/"), &["*"]).await;
    p.post_raw_large("big", &vec![b'x'; 250_000]).await;
    p.post(&[("after_big", "acme", "t", json!({}))]).await;
    r.wait_for(1, WAIT).await;
    let record = p
        .read(&p.config.kafka.topics.invalid, 1, WAIT)
        .await
        .remove(0);
    assert_eq!(record.key(), Some(&b"big"[..]));
    assert!(
        record.payload().unwrap_or_default().is_empty(),
        "the value was forwarded ({} bytes)",
        record.payload().unwrap_or_default().len()
    );
    let header = |name| {
        last_header(&record, name)
            .map(|v| String::from_utf8_lossy(&v).into_owned())
            .unwrap_or_default()
    };
    assert_eq!(
        header(hookline::input::INVALID_REASON_HEADER),
        "payload_too_large"
    );
    let detail = header(hookline::input::INVALID_DETAIL_HEADER);
    assert!(
        detail.contains("the value (250000 bytes) is left out")
            && detail.contains(&format!("{} partition", p.config.kafka.topics.events)),
        "{detail}"
    );
    p.stop().await;
}

/// An outbox record whose type and tenant ride in the headers `[kafka.outbox]` names (a
/// connector placing `type:header:type,tenant_id:header:tenantId`) is delivered; one carrying
/// the default names instead is invalid, naming the header it lacks.
async fn outbox_headers_are_the_configured_ones(on: On) {
    let mut config = test_config(on);
    config.kafka.outbox.type_header = "type".into();
    config.kafka.outbox.tenant_header = "tenantId".into();
    let p = Pipeline::start(on, config).await;
    let r = Receiver::fixed(Reply::status(200)).await;
    p.endpoint("acme", &r.url("/"), &["order.created"]).await;
    let value = br#"{"order":1}"#;
    p.post_with_headers(
        "agg1",
        &[
            ("id", "ob_default"),
            ("eventType", "order.created"),
            ("tenant", "acme"),
        ],
        value,
    )
    .await;
    p.post_with_headers(
        "agg1",
        &[
            ("id", "ob_custom"),
            ("type", "order.created"),
            ("tenantId", "acme"),
        ],
        value,
    )
    .await;
    let got = r.wait_for(1, WAIT).await;
    assert_eq!(got[0].header("webhook-id"), Some("ob_custom"));
    the_invalid_record(&p, value, "missing_header:type").await;
    p.stop().await;
}

/// A record on the deliveries topic that is not a delivery record (no hookline headers) is
/// forwarded to the invalid topic byte for byte, and the deliveries behind it go on.
async fn an_undecodable_delivery_record_goes_to_the_invalid_topic(on: On) {
    let p = Pipeline::start(on, test_config(on)).await;
    let r = Receiver::fixed(Reply::status(200)).await;
    p.endpoint("acme", &r.url("/"), &["*"]).await;
    let stray = br#"{"not":"a delivery"}"#;
    p.produce_raw(&p.config.kafka.topics.deliveries, "ep_stray", stray)
        .await;
    p.post(&[("after_stray", "acme", "t", json!({}))]).await;
    r.wait_for(1, WAIT).await;
    let record = the_invalid_record(&p, stray, "bad_delivery_record").await;
    assert_eq!(record.key(), Some(&b"ep_stray"[..]));
    p.stop().await;
}

/// Stopping and restarting the stages mid-stream loses nothing: every event arrives at least
/// once, and repeats carry the same webhook-id.
async fn a_restart_mid_stream_loses_nothing(on: On) {
    let p = Pipeline::start(on, test_config(on)).await;
    let r = Receiver::fixed(Reply::status(200).delay(Duration::from_millis(20))).await;
    p.endpoint("acme", &r.url("/"), &["*"]).await;
    let first: Vec<(String, serde_json::Value)> =
        (0..100).map(|i| (format!("r{i}"), json!(i))).collect();
    let posts: Vec<_> = first
        .iter()
        .map(|(id, v)| (id.as_str(), "acme", "t", v.clone()))
        .collect();
    p.post(&posts).await;
    r.wait_for(10, WAIT).await;
    let p = p.restart().await;
    let second: Vec<(String, serde_json::Value)> =
        (100..150).map(|i| (format!("r{i}"), json!(i))).collect();
    let posts: Vec<_> = second
        .iter()
        .map(|(id, v)| (id.as_str(), "acme", "t", v.clone()))
        .collect();
    p.post(&posts).await;
    eventually(
        "distinct events delivered (of 150)",
        || {
            r.requests()
                .iter()
                .map(|q| q.header("webhook-id").unwrap().to_owned())
                .collect::<BTreeSet<_>>()
                .len()
        },
        |n| *n == 150,
    )
    .await;
    p.stop().await;
}

/// A receiver that answers 404 (dead-lettered at once) until its flag is set, then 200.
async fn fixable_receiver() -> (Receiver, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    let fixed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let f = fixed.clone();
    let r = Receiver::start(move |_| {
        if f.load(std::sync::atomic::Ordering::SeqCst) {
            Reply::status(200)
        } else {
            Reply::status(404)
        }
    })
    .await;
    (r, fixed)
}

/// A dead letter replayed by DLQ offset is delivered again with the same webhook-id and the
/// replay id in a header, and the replay is audited.
async fn a_dlq_range_replays_with_the_replay_header(on: On) {
    let p = Pipeline::start(on, test_config(on)).await;
    let (r, healthy) = fixable_receiver().await;
    let (endpoint, secret) = p.endpoint("acme", &r.url("/"), &["*"]).await;
    p.post(&[("evt_replay", "acme", "t", json!({"again": true}))])
        .await;
    let dlq = p.read(&p.config.kafka.topics.dlq, 1, WAIT).await;
    let (partition, offset) = (dlq[0].partition(), dlq[0].offset());
    healthy.store(true, std::sync::atomic::Ordering::SeqCst);
    let target = hookline::replay::ReplayTarget {
        bootstrap: p.config.kafka.bootstrap_servers.clone(),
        client: p.config.kafka.client.clone(),
        dlq: p.config.kafka.topics.dlq.clone(),
        deliveries: p.config.kafka.topics.deliveries.clone(),
    };
    // The dry run asks beyond the partition's end: it reads what is there, and says so.
    let mut request = hookline::replay::ReplayRequest {
        partition,
        from_offset: offset,
        to_offset: offset + 50,
        endpoint: Some(endpoint.clone()),
        actor: "oncall".into(),
        reason: "receiver fixed".into(),
        dry_run: true,
    };
    let mut seen = 0;
    let dry = hookline::replay::replay(&target, &request, p.handles.store.as_ref(), &mut |d, _| {
        seen = d
    })
    .await
    .expect("dry run");
    assert_eq!((dry.scanned, dry.replayed, seen), (1, 1, 1));
    assert_eq!(dry.last_offset, offset);
    request.to_offset = offset;
    request.dry_run = false;
    let done =
        hookline::replay::replay(&target, &request, p.handles.store.as_ref(), &mut |_, _| {})
            .await
            .expect("replay");
    assert_eq!(done.replayed, 1);
    let got = r.wait_for(2, WAIT).await;
    assert_eq!(verify(&got[1], &secret), "evt_replay");
    assert_eq!(
        got[1].header("hookline-replay-id"),
        Some(done.replay_id.as_str())
    );
    assert_eq!(got[0].header("hookline-replay-id"), None);
    assert_eq!(
        got[1].header("hookline-attempt"),
        Some("1"),
        "a replay starts a fresh window"
    );
    let audits = p.handles.store.replays(None, 10).await.unwrap();
    let audit = audits
        .iter()
        .find(|a| a.replay_id == done.replay_id)
        .expect("audited");
    assert_eq!(
        (audit.actor.as_str(), audit.count, audit.dry_run),
        ("oncall", 1, false)
    );
    assert!(
        audit
            .scope
            .ends_with(&format!("offsets {offset}..={offset}, endpoint {endpoint}")),
        "{}",
        audit.scope
    );
    let dry_audit = audits
        .iter()
        .find(|a| a.replay_id == dry.replay_id && a.dry_run)
        .expect("the dry run is audited");
    let asked = offset + 50;
    assert!(
        dry_audit.scope.contains(&format!(
            "offsets {offset}..={offset} (asked up to {asked}; the partition ended there)"
        )),
        "{}",
        dry_audit.scope
    );
    let store = p.handles.store.as_ref();
    let refusal = move |target: hookline::replay::ReplayTarget, request| async move {
        hookline::replay::replay(&target, &request, store, &mut |_, _| {})
            .await
            .expect_err("the replay should be refused")
            .to_string()
    };
    let out_of_range = hookline::replay::ReplayRequest {
        from_offset: offset + 100,
        to_offset: offset + 200,
        ..request.clone()
    };
    assert!(
        refusal(target.clone(), out_of_range)
            .await
            .starts_with(&format!("dlq partition {partition} holds offsets")),
    );
    let partitions = p.config.kafka.partitions;
    let beyond = hookline::replay::ReplayRequest {
        partition: i32::try_from(partitions).unwrap(),
        ..request.clone()
    };
    assert_eq!(
        refusal(target.clone(), beyond).await,
        format!(
            "DLQ topic {} has {partitions} partitions, 0 to {}; --partition {partitions} does not exist",
            target.dlq,
            partitions - 1
        )
    );
    let elsewhere = hookline::replay::ReplayTarget {
        dlq: format!("{}.missing", target.dlq),
        ..target.clone()
    };
    assert_eq!(
        refusal(elsewhere.clone(), request).await,
        format!(
            "DLQ topic {} does not exist at {} (kafka.topics.dlq names it)",
            elsewhere.dlq, target.bootstrap
        )
    );
    // The same through the admin API, for operators: a dry run of the offset, a partition the
    // DLQ does not have, and a tenant token, refused.
    let api = admin_api(&p);
    let range = |partition: i64| {
        json!({"partition": partition, "from_offset": offset, "to_offset": offset,
               "reason": "check", "dry_run": true})
        .to_string()
    };
    let (status, answer) = api_post(
        &api,
        OPERATOR_TOKEN,
        "/v1/replays",
        &range(partition.into()),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        (answer["scanned"].as_u64(), answer["replayed"].as_u64()),
        (Some(1), Some(1))
    );
    let (status, answer) = api_post(
        &api,
        OPERATOR_TOKEN,
        "/v1/replays",
        &range(partitions.into()),
    )
    .await;
    assert_eq!(status, 422, "{answer}");
    assert!(
        answer["detail"]
            .as_str()
            .unwrap()
            .starts_with(&format!("partition: {partitions} is not a partition of")),
        "{answer}"
    );
    let (status, _) = api_post(&api, ACME_TOKEN, "/v1/replays", &range(partition.into())).await;
    assert_eq!(status, 403);
    p.stop().await;
}

/// Batches the broker will not take: smaller than any delivery record with its headers.
const REFUSING: u32 = 64;
/// Kafka's default `max.message.bytes`.
const KAFKA_DEFAULT_MAX_MESSAGE: u32 = 1_048_588;

/// A topic that takes smaller records than hookline's producers may write (created earlier, by
/// hand) stops start-up with an error that names the topic, both limits and the fix; topics
/// hookline creates take what its producers write. Lowering the producers' limit to the
/// topic's lets it start.
async fn a_topic_that_refuses_large_records_stops_start_up() {
    let mut config = test_config(On::Real);
    let bootstrap = crate::services::fixture::require_kafka().await;
    config.kafka.bootstrap_servers = bootstrap.clone();
    // Above the broker's default (1048588): the topics hookline creates must take it.
    config
        .kafka
        .client
        .insert("message.max.bytes".into(), "2000000".into());
    hookline::service::prepare_topics(&config)
        .await
        .expect("topics created to fit");
    let dlq = config.kafka.topics.dlq.clone();
    crate::services::fixture::limit_record_size(&bootstrap, &dlq, 100_000).await;
    let err = hookline::service::prepare_topics(&config)
        .await
        .expect_err("a topic below the producers' record size")
        .to_string();
    assert!(
        err.starts_with(&format!(
            "topic {dlq} takes records of at most 100000 bytes (its max.message.bytes), but \
             hookline's producers may write 2000000"
        )),
        "{err}"
    );
    assert!(
        err.contains("--add-config max.message.bytes=2000000"),
        "{err}"
    );
    config
        .kafka
        .client
        .insert("message.max.bytes".into(), "100000".into());
    hookline::service::prepare_topics(&config)
        .await
        .expect("the producers' limit lowered to the topic's");
    harness::delete_topics(&config).await;
}

/// A delivery record the broker refuses is never settled. While the deliveries topic refuses
/// every record (a produce error while offset commits succeed), the fan-out stage commits nothing
/// past the refused events and keeps retrying, across a restart; once the topic takes records
/// again, every event arrives, signed. Only the real broker refuses a topic's records by size.
async fn refused_delivery_records_hold_their_events() {
    let p = Pipeline::start(On::Real, test_config(On::Real)).await;
    let r = Receiver::fixed(Reply::status(200)).await;
    let (_, secret) = p.endpoint("acme", &r.url("/"), &["*"]).await;
    let events = p.config.kafka.topics.events.clone();
    let deliveries = p.config.kafka.topics.deliveries.clone();
    let before = post_numbered(&p, "ok", 5).await;
    r.wait_for(5, WAIT).await;
    eventually(
        "the fan-out's committed events",
        || p.committed("fanout", &events),
        |n| *n == 5,
    )
    .await;

    p.limit_record_size(&deliveries, REFUSING).await;
    let held = post_numbered(&p, "held", 20).await;
    // Long enough for several rounds of retries (100 ms, doubling).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        r.requests().len(),
        5,
        "nothing is delivered while the topic refuses"
    );
    assert_eq!(
        p.records_in(&deliveries),
        5,
        "no delivery record was written"
    );
    assert_eq!(
        p.committed("fanout", &events),
        5,
        "no refused event is committed"
    );

    // Stopped while its produces fail, the stage leaves the events to the next run.
    let p = p.restart().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        p.committed("fanout", &events),
        5,
        "still nothing committed after the restart"
    );
    assert_eq!(r.requests().len(), 5);

    p.limit_record_size(&deliveries, KAFKA_DEFAULT_MAX_MESSAGE)
        .await;
    let ids = eventually(
        "events delivered",
        || {
            r.requests()
                .iter()
                .map(|q| verify(q, &secret))
                .collect::<BTreeSet<_>>()
        },
        |ids| ids.len() == 25,
    )
    .await;
    let want: BTreeSet<String> = before.into_iter().chain(held).collect();
    assert_eq!(ids, want);
    eventually(
        "the fan-out's committed events",
        || p.committed("fanout", &events),
        |n| *n == 25,
    )
    .await;
    p.stop().await;
}

/// A dead letter the broker refuses keeps its delivery record unsettled: nothing is committed
/// past it on the deliveries topic, through a restart, and once the DLQ takes records again
/// every dead delivery lands there. 410 is dead at its first answer, so each request the
/// receiver sees is followed by a DLQ write.
async fn a_refused_dead_letter_holds_its_delivery() {
    let p = Pipeline::start(On::Real, test_config(On::Real)).await;
    let r = Receiver::fixed(Reply::status(410)).await;
    p.endpoint("acme", &r.url("/"), &["*"]).await;
    let dlq = p.config.kafka.topics.dlq.clone();
    p.limit_record_size(&dlq, REFUSING).await;
    let dead = post_numbered(&p, "dead", 3).await;
    r.wait_for(3, WAIT).await;
    // Several rounds of refused DLQ writes (100 ms, doubling).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(p.records_in(&dlq), 0, "the DLQ refuses every record");
    let deliveries = p.config.kafka.topics.deliveries.clone();
    assert_eq!(
        p.committed("deliver", &deliveries),
        0,
        "no delivery whose dead letter was refused is committed"
    );

    let p = p.restart().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(p.records_in(&dlq), 0);
    assert_eq!(p.committed("deliver", &deliveries), 0);

    p.limit_record_size(&dlq, KAFKA_DEFAULT_MAX_MESSAGE).await;
    let landed: BTreeSet<String> = p
        .read(&dlq, 3, WAIT)
        .await
        .iter()
        .map(|m| dead_record(m).event_id.as_str().to_owned())
        .collect();
    assert_eq!(landed, dead.into_iter().collect::<BTreeSet<_>>());
    p.stop().await;
}

/// A record that reaches the delivery stage before it is due is parked in a delay tier; while
/// every tier refuses records, the parked record stays unsettled (its offset is not committed,
/// before or after a restart) and is neither sent nor lost. Once the tiers take records it is
/// parked, comes back when due, and is delivered.
async fn a_refused_park_holds_its_delivery() {
    let p = Pipeline::start(On::Real, test_config(On::Real)).await;
    let r = Receiver::fixed(Reply::status(200)).await;
    let (endpoint, secret) = p.endpoint("acme", &r.url("/"), &["*"]).await;
    let tiers = hookline::delay_tier::Tiers::new(
        &p.config.kafka.topics.retry_prefix,
        &p.config.retry.tiers,
    );
    for tier in tiers.all() {
        p.limit_record_size(&tier.topic, REFUSING).await;
    }
    // Due well after the tiers take records again, so it is parked on every run, the last too.
    let due = SystemTime::now() + Duration::from_secs(15);
    let early = DeliveryRecord::new(
        EventId::parse("early").unwrap(),
        endpoint,
        Tenant::parse("acme").unwrap(),
        EventType::parse("t").unwrap(),
        UnixMillis::from(SystemTime::now()),
        None,
        Bytes::from_static(br#"{"early":true}"#),
    )
    .for_park(due);
    let deliveries = p.config.kafka.topics.deliveries.clone();
    p.produce_delivery(&deliveries, &early).await;
    let parked_nowhere = |p: &Pipeline| {
        for tier in tiers.all() {
            assert_eq!(p.records_in(&tier.topic), 0, "{} refuses", tier.topic);
        }
        assert_eq!(
            p.committed("deliver", &deliveries),
            0,
            "a record whose park was refused is not committed"
        );
        assert!(r.requests().is_empty(), "sent before it was due");
    };
    // Several rounds of refused produces (100 ms, doubling).
    tokio::time::sleep(Duration::from_secs(3)).await;
    parked_nowhere(&p);
    let p = p.restart().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    parked_nowhere(&p);

    for tier in tiers.all() {
        p.limit_record_size(&tier.topic, KAFKA_DEFAULT_MAX_MESSAGE)
            .await;
    }
    let got = r.wait_for(1, WAIT).await;
    assert!(SystemTime::now() >= due, "delivered when due, not before");
    assert_eq!(
        verify(&got[0], &secret),
        "early",
        "the event id is the webhook-id"
    );
    let parked: i64 = tiers.all().iter().map(|t| p.records_in(&t.topic)).sum();
    assert_eq!(parked, 1, "parked once, in one tier");
    // The early record, and the same record back from its tier, delivered.
    assert_eq!(p.records_in(&deliveries), 2);
    eventually(
        "the deliver stage's committed offsets",
        || p.committed("deliver", &deliveries),
        |n| *n == 2,
    )
    .await;
    p.stop().await;
}

mod mock_split {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lagging_endpoint_view_delays_a_delivery_instead_of_dead_lettering_it() {
        super::a_lagging_endpoint_view_delays_a_delivery_instead_of_dead_lettering_it().await;
    }
}

mod real_kafka_refusing {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_topic_that_refuses_large_records_stops_start_up() {
        super::a_topic_that_refuses_large_records_stops_start_up().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn refused_delivery_records_hold_their_events() {
        super::refused_delivery_records_hold_their_events().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_dead_letter_holds_its_delivery() {
        super::a_refused_dead_letter_holds_its_delivery().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_park_holds_its_delivery() {
        super::a_refused_park_holds_its_delivery().await;
    }
}

macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        mod mock {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::On::Mock).await;
                }
            )*
        }
        mod real_kafka {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::On::Real).await;
                }
            )*
        }
    };
}

/// A tenant replays its deliveries through the admin API, as a customer's dashboard would:
/// - one dead delivery by id, asked twice at the same moment: replayed once, from the record
///   its attempt logged in the deliveries topic, and the other ask refused; asked again while
///   that replay's answer is held (the attempt log still shows it dead): refused;
/// - once delivered, the same one again (a resend), from its record in the deliveries topic;
/// - a dead delivery whose attempt row predates that log, from its dead letter in the DLQ,
///   found among others;
/// - the rest of the endpoint's dead deliveries since the test began, which leaves the ones
///   replayed by id alone and another endpoint's dead letter in the same DLQ untouched.
///
/// Each is sent with the same webhook-id and its replay id in a header, and audited under the
/// tenant's token.
async fn dead_deliveries_replay_through_the_admin_api(on: On) {
    let mut config = test_config(on);
    // Room for the held answer below.
    config.http.total_timeout = Duration::from_secs(15);
    let p = Pipeline::start(on, config).await;
    let began = SystemTime::now() - Duration::from_secs(1);
    let fixed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let r = Receiver::start({
        let fixed = fixed.clone();
        move |req| {
            if !fixed.load(std::sync::atomic::Ordering::SeqCst) {
                Reply::status(404)
            } else if req.header("hookline-replay-id").is_some()
                && req.header("webhook-id") == Some("evt_api_replay")
            {
                Reply {
                    delay: HELD,
                    ..Reply::status(200)
                }
            } else {
                Reply::status(200)
            }
        }
    })
    .await;
    let other = Receiver::fixed(Reply::status(404)).await;
    let (endpoint, secret) = p.endpoint("acme", &r.url("/"), &["t"]).await;
    p.endpoint("acme", &other.url("/"), &["u"]).await;
    let posts = [
        ("evt_before", "acme", "t", json!({})),
        ("evt_api_replay", "acme", "t", json!({})),
        ("evt_other", "acme", "u", json!({})),
        ("evt_after", "acme", "t", json!({})),
    ];
    p.post(&posts).await;
    let dlq = p.read(&p.config.kafka.topics.dlq, 4, WAIT).await;
    let delivery =
        |event: &str| hookline::id::DeliveryId::derive(&EventId::parse(event).unwrap(), &endpoint);
    let wanted = delivery("evt_api_replay");
    let before = delivery("evt_before");
    let at = dlq
        .iter()
        .find(|m| dead_record(m).delivery_id == before)
        .map(|m| (m.partition(), m.offset()))
        .expect("evt_before's dead letter");
    let store = p.handles.store.clone();
    let logged = store.attempts(&wanted).await.unwrap()[0]
        .record
        .expect("an attempt logs where its record is");
    // Every dead delivery's attempt is logged before its dead letter is written.
    fixed.store(true, std::sync::atomic::Ordering::SeqCst);
    let api = admin_api(&p);

    // Asked twice at the same moment (a double click): one replays it, the other is told.
    let wanted_uri = format!("/v1/deliveries/{wanted}/replay");
    let replay_wanted = || {
        api_post(
            &api,
            ACME_TOKEN,
            &wanted_uri,
            r#"{"actor":"alice@acme.example","reason":"receiver fixed"}"#,
        )
    };
    let (first, second) = tokio::join!(replay_wanted(), replay_wanted());
    let (mut answers, refused): (Vec<_>, Vec<_>) = [first, second]
        .into_iter()
        .partition(|(status, _)| *status == 202);
    assert_eq!(
        (answers.len(), refused.len()),
        (1, 1),
        "one of two simultaneous replays: {answers:?} {refused:?}"
    );
    let (status, answer) = answers.pop().unwrap();
    let one = answer["replay_id"].as_str().unwrap();
    let (refused_status, refusal) = &refused[0];
    assert_eq!(*refused_status, 409, "{refusal}");
    let detail = refusal["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!("is being replayed by replay {one}"))
            || detail.contains(&format!(
                "(replay {one}) and that replay's attempt is not logged"
            )),
        "{refusal}"
    );
    assert_eq!(status, 202, "{answer}");
    // Read where its attempt logged it, not searched for in the DLQ.
    let from = |answer: &serde_json::Value| {
        (
            answer["from"]["topic"].as_str().map(str::to_owned),
            answer["from"]["partition"].as_i64(),
            answer["from"]["offset"].as_i64(),
        )
    };
    assert_eq!(
        from(&answer),
        (
            Some(p.config.kafka.topics.deliveries.clone()),
            Some(i64::from(logged.partition)),
            Some(logged.offset)
        ),
        "{answer}"
    );
    let one = answer["replay_id"].as_str().unwrap().to_owned();
    let got = r.wait_for(4, WAIT).await;
    let held = Instant::now();
    assert_eq!(got[3].header("hookline-replay-id"), Some(one.as_str()));
    assert_eq!(verify(&got[3], &secret), "evt_api_replay");
    let replay_wanted_again = || api_post(&api, ACME_TOKEN, &wanted_uri, "");
    let (status, answer) = replay_wanted_again().await;
    assert!(
        held.elapsed() < HELD,
        "the receiver still held the replayed request's answer"
    );
    assert_eq!(status, 409, "{answer}");
    assert!(
        answer["detail"].as_str().unwrap().contains(&format!(
            "(replay {one}) and that replay's attempt is not logged yet"
        )),
        "{answer}"
    );
    let state = |id: hookline::id::DeliveryId| {
        let store = store.clone();
        move || {
            futures::executor::block_on(store.delivery(&id))
                .unwrap()
                .map(|d| d.status)
        }
    };
    let succeeded = |s: &Option<hookline::storage::DeliveryStatus>| {
        *s == Some(hookline::storage::DeliveryStatus::Succeeded)
    };
    eventually(
        "the replayed delivery's state",
        state(wanted.clone()),
        succeeded,
    )
    .await;
    // Delivered, it is sent again from the record its last attempt logged in the deliveries
    // topic (a customer's "resend"), once: a second ask while that one is held is refused.
    let (status, answer) = replay_wanted_again().await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(
        from(&answer).0.as_deref(),
        Some(p.config.kafka.topics.deliveries.as_str()),
        "{answer}"
    );
    let resent = answer["replay_id"].as_str().unwrap().to_owned();
    let got = r.wait_for(5, WAIT).await;
    assert_eq!(got[4].header("hookline-replay-id"), Some(resent.as_str()));
    assert_eq!(verify(&got[4], &secret), "evt_api_replay");
    let (status, answer) = replay_wanted_again().await;
    assert_eq!(status, 409, "{answer}");
    assert!(
        answer["detail"].as_str().unwrap().contains(&format!(
            "(replay {resent}) and that replay's attempt is not logged"
        )),
        "{answer}"
    );

    // A dead delivery whose attempts were logged before hookline kept their records' place
    // (a row as an older release wrote it) is replayed from its dead letter in the DLQ.
    let mut old_row = store.attempts(&before).await.unwrap().pop().unwrap();
    old_row.record = None;
    old_row.started_at += Duration::from_millis(1);
    store.record_attempt(&old_row).await.unwrap();
    let (status, answer) = api_post(
        &api,
        ACME_TOKEN,
        &format!("/v1/deliveries/{before}/replay"),
        "",
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(
        from(&answer),
        (
            Some(p.config.kafka.topics.dlq.clone()),
            Some(i64::from(at.0)),
            Some(at.1)
        ),
        "{answer}"
    );
    let from_dlq = answer["replay_id"].as_str().unwrap().to_owned();
    let got = r.wait_for(6, WAIT).await;
    assert_eq!(got[5].header("hookline-replay-id"), Some(from_dlq.as_str()));
    assert_eq!(verify(&got[5], &secret), "evt_before");

    let since = humantime::format_rfc3339_millis(began).to_string();
    let (status, answer) = api_post(
        &api,
        ACME_TOKEN,
        &format!("/v1/endpoints/{endpoint}/replay"),
        &json!({"since": since, "reason": "outage over"}).to_string(),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(
        (
            answer["replayed"].as_u64(),
            answer["skipped"].as_u64(),
            answer["complete"].as_bool()
        ),
        (Some(1), Some(2), Some(true)),
        "{answer}"
    );
    let range = answer["replay_id"].as_str().unwrap().to_owned();
    let got = r.wait_for(7, WAIT).await;
    assert_eq!(got[6].header("hookline-replay-id"), Some(range.as_str()));
    assert_eq!(verify(&got[6], &secret), "evt_after");
    for event in ["evt_before", "evt_after"] {
        eventually(event, state(delivery(event)), succeeded).await;
    }
    assert_eq!(
        other.requests().len(),
        1,
        "another endpoint's dead letter stays"
    );
    let audits = p.handles.store.replays(None, 10).await.unwrap();
    let audited = |id: &str| {
        let a = audits.iter().find(|a| a.replay_id == id).expect("audited");
        (a.actor.clone(), a.reason.clone(), a.count)
    };
    assert_eq!(
        audited(&one),
        (
            "alice@acme.example (with tenant acme's API token)".into(),
            "receiver fixed".into(),
            1
        )
    );
    assert_eq!(
        audited(&range),
        (
            "with tenant acme's API token".into(),
            "outage over".into(),
            1
        )
    );
    let (actor, reason, count) = audited(&resent);
    assert_eq!(
        (actor.as_str(), reason.as_str(), count),
        (
            "with tenant acme's API token",
            "replayed through the admin API",
            1
        )
    );
    // The tenant reads its own replays in the audit trail.
    let (status, trail) = api_get(&api, ACME_TOKEN, "/v1/replays").await;
    assert_eq!(status, 200, "{trail}");
    let entries = trail["data"].as_array().expect("a list");
    for id in [&one, &range, &resent] {
        assert!(
            entries.iter().any(|e| e["replay_id"] == id.as_str()),
            "{id} in {trail}"
        );
    }
    assert!(entries.iter().all(|e| e["tenant"] == "acme"), "{trail}");
    assert_eq!(r.requests().len(), 7, "nothing more was sent");
    p.stop().await;
}

/// The admin API over the pipeline's own view and store, with [`OPERATOR_TOKEN`] and a token
/// for tenant `acme`, replaying on the pipeline's Kafka.
fn admin_api(p: &Pipeline) -> axum::Router {
    let auth = hookline::config::AdminConfig {
        operator_tokens: vec![hookline::config::Token::new(OPERATOR_TOKEN)],
        tenant_tokens: BTreeMap::from([(
            hookline::config::Token::new(ACME_TOKEN),
            Tenant::parse("acme").unwrap(),
        )]),
        ..hookline::config::AdminConfig::default()
    };
    let (_ready_tx, ready) = tokio::sync::watch::channel(true);
    hookline::admin::router(
        hookline::admin::AdminState::new(
            p.handles.endpoints.clone(),
            p.handles.store.clone(),
            std::sync::Arc::new(hookline::admin::events::MemoryEventSink::default()),
            auth,
            ready,
        )
        .with_replayer(std::sync::Arc::new(hookline::replay::KafkaReplayer {
            target: p.config.replay_target(),
            store: p.handles.store.clone(),
        })),
    )
}

const ACME_TOKEN: &str = "acme-replay-token-0123456789";
const OPERATOR_TOKEN: &str = "operator-replay-token-0123456789";

/// `POST path` with `body` and `token`: (status, JSON answer).
async fn api_post(
    api: &axum::Router,
    token: &str,
    path: &str,
    body: &str,
) -> (u16, serde_json::Value) {
    let request = axum::http::Request::post(path)
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body.to_owned()))
        .unwrap();
    answer(api, request).await
}

/// `GET path` with `token`: (status, JSON answer).
async fn api_get(api: &axum::Router, token: &str, path: &str) -> (u16, serde_json::Value) {
    let request = axum::http::Request::get(path)
        .header("authorization", format!("Bearer {token}"))
        .body(axum::body::Body::empty())
        .unwrap();
    answer(api, request).await
}

/// What `api` answers to `request`: (status, JSON answer).
async fn answer(
    api: &axum::Router,
    request: axum::http::Request<axum::body::Body>,
) -> (u16, serde_json::Value) {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let response = api.clone().oneshot(request).await.expect("router answers");
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

on_both!(
    every_event_reaches_every_endpoint,
    tenants_are_isolated_and_wildcards_match,
    transient_failures_are_retried_with_the_same_id,
    a_failing_endpoint_is_dead_lettered_completely,
    gone_disables_the_endpoint,
    a_delivery_for_a_deleted_endpoint_is_dead_lettered,
    a_hanging_endpoint_does_not_slow_the_others,
    a_hanging_endpoint_does_not_hold_up_its_partition,
    a_backlog_waits_in_its_lane_and_nothing_parks,
    a_rate_limited_backlog_does_not_hold_up_its_partition,
    a_slow_endpoints_backlog_does_not_hold_up_its_partition,
    another_master_key_refuses_to_start,
    held_back_records_are_dead_lettered_when_their_window_is_spent,
    malformed_input_goes_to_the_invalid_topic,
    a_header_name_that_is_not_utf8_goes_to_the_invalid_topic,
    outbox_headers_are_the_configured_ones,
    an_invalid_record_too_large_to_forward_goes_without_its_value,
    an_undecodable_delivery_record_goes_to_the_invalid_topic,
    a_restart_mid_stream_loses_nothing,
    a_dlq_range_replays_with_the_replay_header,
    dead_deliveries_replay_through_the_admin_api,
);
