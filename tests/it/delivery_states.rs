//! Every delivery visible through the admin API in every state, on the real servers (Kafka, and
//! the CQL store in a keyspace of each test's own): dead without an attempt when its endpoint's
//! breaker held it back past its window, scheduled while parked, pending before the delivery
//! stage has taken it. Retry windows, cool-downs and tiers are a few seconds, so each test takes
//! seconds.

use std::time::Duration;

use hookline::id::{DeliveryId, EndpointId, EventId};
use hookline::service::Role;
use serde_json::{Value, json};

use crate::cql_pipeline::{Keyspace, admin, cql_config, get, start_pipeline_as};
use crate::pipeline::harness::Pipeline;
use crate::services::fixture::{require_cql, unique};
use crate::support::receiver::{Receiver, Reply};

/// Bound on each wait for a state that should come within seconds.
const WAIT: Duration = Duration::from_secs(30);

/// The delivery of `event` to `endpoint`.
fn delivery_of(event: &str, endpoint: &EndpointId) -> DeliveryId {
    DeliveryId::derive(&EventId::parse(event).unwrap(), endpoint)
}

/// Posts one `order.created` event per id, of `tenant`.
async fn post(p: &Pipeline, tenant: &str, ids: &[String]) {
    let posts: Vec<_> = ids
        .iter()
        .map(|id| (id.as_str(), tenant, "order.created", json!({"id": id})))
        .collect();
    p.post(&posts).await;
}

/// Polls `GET /v1/deliveries/{id}` for each of `ids` until one's `delivery` satisfies `done`;
/// returns it, or fails after [`WAIT`] showing the last answers.
async fn first_delivery_where(
    api: &axum::Router,
    ids: &[DeliveryId],
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let mut last = vec![];
        for id in ids {
            let (status, body) = get(api, &format!("/v1/deliveries/{id}")).await;
            if status == 200 && done(&body["delivery"]) {
                return body["delivery"].clone();
            }
            last.push(format!("{status}: {body}"));
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no delivery reached the expected state within {WAIT:?}; last answers:\n{}",
            last.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A time the API wrote (RFC 3339), as a time.
fn time(v: &Value) -> std::time::SystemTime {
    humantime::parse_rfc3339(v.as_str().unwrap_or_else(|| panic!("not a time: {v}")))
        .unwrap_or_else(|e| panic!("{v}: {e}"))
}

/// An endpoint answering 500 opens its breaker at the first failure; the events that come while
/// it is open are held back, never attempted, and dead-lettered once their window is spent.
/// Each shows as dead, `window_exhausted`, with 0 attempts, and its event lists it beside the
/// delivery to the tenant's healthy endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_held_back_by_an_open_breaker_is_dead_with_no_attempt() {
    let node = require_cql().await;
    Keyspace::migrated()
        .await
        .run(|keyspace| async move {
            let mut config = cql_config(&node, &keyspace);
            config.delivery.breaker_failure_threshold = 1;
            config.delivery.breaker_cooldown = Duration::from_secs(1);
            config.retry.window = Duration::from_secs(1);
            let p = start_pipeline_as(config, Role::All).await;
            let api = admin(&p);
            let tenant = unique("tenant");
            let failing = Receiver::fixed(Reply::status(500)).await;
            let healthy = Receiver::fixed(Reply::status(200)).await;
            let (broken, _) = p.endpoint(&tenant, &failing.url("/"), &["*"]).await;
            let (fine, _) = p.endpoint(&tenant, &healthy.url("/"), &["*"]).await;

            post(&p, &tenant, &[unique("warm")]).await;
            failing.wait_for(1, WAIT).await;
            // The breaker is open: these are parked until its probe, one of them (or the warm
            // one's retry) is the probe, and the rest, held back again with their window spent,
            // are dead-lettered unsent.
            let held: Vec<String> = (0..5).map(|i| unique(&format!("held{i}"))).collect();
            post(&p, &tenant, &held).await;
            let ids: Vec<DeliveryId> = held.iter().map(|e| delivery_of(e, &broken)).collect();
            let dead =
                first_delivery_where(&api, &ids, |d| d["state"] == "dead" && d["attempts"] == 0)
                    .await;
            assert_eq!(dead["reason"], "window_exhausted", "{dead:#}");
            assert_eq!(dead["endpoint_id"], broken.to_string(), "{dead:#}");
            assert_eq!(dead["tenant"], tenant.as_str(), "{dead:#}");
            assert_eq!(dead["first_attempt_at"], Value::Null, "{dead:#}");
            assert_eq!(dead["last_attempt_at"], Value::Null, "{dead:#}");
            assert_eq!(dead["last_status"], Value::Null, "{dead:#}");
            assert_eq!(dead["next_attempt_at"], Value::Null, "{dead:#}");

            let event = dead["event_id"].as_str().unwrap().to_owned();
            let (status, list) = get(&api, &format!("/v1/events/{event}/deliveries")).await;
            assert_eq!(status, 200, "{list:#}");
            let rows = list["data"].as_array().expect("data");
            let row = |endpoint: &EndpointId| {
                rows.iter()
                    .find(|r| r["endpoint_id"] == endpoint.to_string())
                    .unwrap_or_else(|| panic!("no delivery to {endpoint} in {list:#}"))
            };
            assert_eq!(rows.len(), 2, "{list:#}");
            assert_eq!(row(&broken)["state"], "dead", "{list:#}");
            assert_eq!(row(&broken)["attempts"], 0, "{list:#}");
            assert_eq!(row(&broken)["reason"], "window_exhausted", "{list:#}");
            assert_eq!(row(&fine)["id"], delivery_of(&event, &fine).to_string());
            p.stop().await;
        })
        .await;
}

/// While an endpoint's breaker is open, an event's delivery to it is parked: it shows as
/// scheduled, `breaker_open`, with no attempt and the time the breaker lets a probe through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_delivery_is_scheduled_with_its_reason_and_time() {
    let node = require_cql().await;
    Keyspace::migrated()
        .await
        .run(|keyspace| async move {
            let cool_down = Duration::from_secs(30);
            let mut config = cql_config(&node, &keyspace);
            config.delivery.breaker_failure_threshold = 1;
            config.delivery.breaker_cooldown = cool_down;
            config.retry.window = Duration::from_secs(600);
            let p = start_pipeline_as(config, Role::All).await;
            let api = admin(&p);
            let tenant = unique("tenant");
            let failing = Receiver::fixed(Reply::status(503)).await;
            let (endpoint, _) = p.endpoint(&tenant, &failing.url("/"), &["*"]).await;

            post(&p, &tenant, &[unique("warm")]).await;
            failing.wait_for(1, WAIT).await;
            let opened = std::time::SystemTime::now();
            let held = unique("parked");
            post(&p, &tenant, std::slice::from_ref(&held)).await;
            let id = delivery_of(&held, &endpoint);
            let parked = first_delivery_where(&api, &[id], |d| d["state"] == "scheduled").await;
            assert_eq!(parked["reason"], "breaker_open", "{parked:#}");
            assert_eq!(parked["attempts"], 0, "{parked:#}");
            assert_eq!(parked["last_attempt_at"], Value::Null, "{parked:#}");
            let due = time(&parked["next_attempt_at"]);
            assert!(
                due > opened && due <= opened + cool_down + Duration::from_secs(1),
                "due when the breaker lets a probe through ({:?} after it opened): {parked:#}",
                due.duration_since(opened)
            );
            assert_eq!(failing.requests().len(), 1, "nothing sent while it is open");
            p.stop().await;
        })
        .await;
}

/// A process that only fans out (no delivery stage) records each event's deliveries: they show
/// as pending, with no attempt, at once, by id and among their event's deliveries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_not_yet_taken_is_pending() {
    let node = require_cql().await;
    Keyspace::migrated()
        .await
        .run(|keyspace| async move {
            let p = start_pipeline_as(cql_config(&node, &keyspace), Role::Fanout).await;
            let api = admin(&p);
            let tenant = unique("tenant");
            let receiver = Receiver::fixed(Reply::status(200)).await;
            let (endpoint, _) = p.endpoint(&tenant, &receiver.url("/"), &["*"]).await;
            let event = unique("pending");
            post(&p, &tenant, std::slice::from_ref(&event)).await;
            let id = delivery_of(&event, &endpoint);
            let pending =
                first_delivery_where(&api, std::slice::from_ref(&id), |d| !d.is_null()).await;
            assert_eq!(pending["state"], "pending", "{pending:#}");
            assert_eq!(pending["attempts"], 0, "{pending:#}");
            assert_eq!(pending["reason"], Value::Null, "{pending:#}");
            assert_eq!(pending["next_attempt_at"], Value::Null, "{pending:#}");
            assert_eq!(pending["first_attempt_at"], Value::Null, "{pending:#}");
            assert_eq!(pending["event_id"], event.as_str(), "{pending:#}");
            let (status, list) = get(&api, &format!("/v1/events/{event}/deliveries")).await;
            assert_eq!(status, 200, "{list:#}");
            assert_eq!(list["data"][0]["id"], id.to_string(), "{list:#}");
            assert_eq!(list["data"][0]["state"], "pending", "{list:#}");
            assert!(receiver.requests().is_empty(), "no delivery stage runs");
            p.stop().await;
        })
        .await;
}
