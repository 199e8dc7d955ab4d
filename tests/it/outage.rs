//! `hookline run` losing its broker mid-stream, as in a broker restart or a network partition:
//! readiness says so, `POST /v1/events` answers 503 instead of hanging, and once the broker is
//! back every event is delivered (at least once; a repeat carries the same webhook-id) and
//! SIGTERM still drains cleanly.
//!
//! The broker is the shared test broker seen through its OUTAGE listener, which it advertises at
//! a proxy this test runs: cutting the proxy takes the broker away from this hookline alone.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use hookline::config::Config;
use hookline::service;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::services::fixture::{Topics, require_kafka, require_kafka_outage_listener, unique};
use crate::support::proxy::TcpProxy;
use crate::support::receiver::{Receiver, Reply};
use crate::support::{Logged, create_endpoint, free_port, run_logged, signal};

const TOKEN: &str = "it-outage-operator-token-0123";
/// Bound on each wait for the pipeline or the probe on a busy machine.
const WAIT: Duration = Duration::from_secs(90);
/// How long the broker stays away: longer than hookline's producers wait for an acknowledgement
/// (`message.timeout.ms`, 30 s), so records produced as the cut lands fail and must be produced
/// again, as they would be in a broker restart that takes a while.
const OUTAGE: Duration = Duration::from_secs(40);

/// The config of this test's `hookline run`: its own topics and groups, retries short enough
/// to come round during the test, loopback receivers allowed.
fn config_text(run: &str, bootstrap: &str, admin: u16, metrics: u16) -> String {
    format!(
        r#"
[kafka]
bootstrap_servers = "{bootstrap}"
partitions = 3
group_prefix = "it-{run}"
input_pattern = '^it\.{run}\.outbox\..*'
[kafka.topics]
deliveries = "it.{run}.deliveries"
endpoints = "it.{run}.endpoints"
dlq = "it.{run}.dlq"
invalid = "it.{run}.invalid"
events = "it.{run}.events"
retry_prefix = "it.{run}.retry."
[retry]
base = "200ms"
multiplier = 2
cap = "2s"
window = "10m"
tiers = ["1s", "5s"]
[http]
total_timeout = "3s"
connect_timeout = "1s"
allow_cidrs = ["127.0.0.1/32"]
dangerous_allow_http = true
[admin]
listen = "127.0.0.1:{admin}"
operator_tokens = ["{TOKEN}"]
[metrics]
listen = "127.0.0.1:{metrics}"
[security]
master_key = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
[store]
kind = "memory"
"#
    )
}

struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    async fn ready(&self) -> Option<StatusCode> {
        let answer = self
            .http
            .get(format!("{}/v1/health/ready", self.base))
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        answer.ok().map(|r| r.status())
    }

    /// Waits until readiness answers `want`; panics with `log` after [`WAIT`].
    async fn wait_ready(&self, want: StatusCode, log: &Mutex<String>) {
        let deadline = Instant::now() + WAIT;
        while self.ready().await != Some(want) {
            assert!(
                Instant::now() < deadline,
                "readiness never answered {want} within {WAIT:?}; log:\n{}",
                log.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Posts event `id` and returns the status and the body.
    async fn post_event(&self, id: &str) -> (StatusCode, Value) {
        let answer = self
            .http
            .post(format!("{}/v1/events", self.base))
            .bearer_auth(TOKEN)
            .json(&json!({"tenant": "acme", "type": "order.created", "id": id, "payload": {"id": id}}))
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .expect("the admin API answers");
        let status = answer.status();
        (status, answer.json().await.unwrap_or(Value::Null))
    }

    async fn post_accepted(&self, ids: &[String]) {
        for id in ids {
            let (status, body) = self.post_event(id).await;
            assert_eq!(status, StatusCode::ACCEPTED, "posting {id}: {body}");
        }
    }
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

/// The distinct webhook-ids `receiver` has seen, each checked against `secret`.
fn delivered(receiver: &Receiver, secret: &str) -> BTreeSet<String> {
    receiver
        .requests()
        .iter()
        .map(|r| crate::pipeline::verify_request(r, secret))
        .collect()
}

async fn wait_delivered(
    receiver: &Receiver,
    secret: &str,
    want: &BTreeSet<String>,
    log: &Mutex<String>,
) {
    let deadline = Instant::now() + WAIT;
    loop {
        let got = delivered(receiver, secret);
        if want.is_subset(&got) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not delivered within {WAIT:?}: {:?}; log:\n{}",
            want.difference(&got).collect::<Vec<_>>(),
            log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_mid_stream_loses_nothing() {
    let shared = require_kafka().await;
    let (listener, advertised) = require_kafka_outage_listener().await;
    let proxy = TcpProxy::start_at(&advertised, &listener).await;
    let run = unique("outage");
    let (admin, metrics) = (free_port(), free_port());
    let path = std::env::temp_dir().join(format!("hookline-{run}.toml"));
    std::fs::write(&path, config_text(&run, &advertised, admin, metrics)).unwrap();
    let config = Config::load(Some(&path)).expect("the test's config is valid");
    let topic_names: Vec<String> = service::topic_specs(&config)
        .into_iter()
        .map(|t| t.name)
        .collect();

    let Logged {
        mut child,
        log,
        reader,
    } = run_logged(&path);
    let api = Api {
        http: reqwest::Client::new(),
        base: format!("http://127.0.0.1:{admin}"),
    };
    api.wait_ready(StatusCode::OK, &log).await;

    // One attempt at a time, 100 ms each: a batch of ten takes a second to deliver, so the cut
    // below lands while most of it is still on its way.
    let receiver = Receiver::fixed(Reply::status(200).delay(Duration::from_millis(100))).await;
    let created = create_endpoint(
        &api.http,
        &api.base,
        TOKEN,
        json!({
            "tenant": "acme",
            "url": receiver.url("/hook"),
            "event_types": ["*"],
            "max_in_flight": 1,
        }),
    )
    .await;
    let secret = created["secret"].as_str().unwrap().to_owned();
    let mut want: BTreeSet<String> = BTreeSet::new();

    // Before: the pipeline works through the proxy.
    let before = ids("before_", 10);
    api.post_accepted(&before).await;
    want.extend(before);
    wait_delivered(&receiver, &secret, &want, &log).await;
    assert!(proxy.accepted() > 0, "hookline connected through the proxy");

    // Mid-stream: events the broker has acknowledged, then the broker goes away at once, with
    // their fan-out, deliveries and offset commits in flight.
    let in_flight = ids("inflight_", 10);
    let in_flight_n = in_flight.len();
    api.post_accepted(&in_flight).await;
    proxy.cut();
    let cut_at = Instant::now();
    let landed = delivered(&receiver, &secret);
    let early = in_flight.iter().filter(|id| landed.contains(*id)).count();
    assert!(
        early < in_flight.len(),
        "the whole batch was delivered before the cut: the test no longer cuts mid-stream"
    );
    want.extend(in_flight);

    // During: readiness turns, and posts are refused with 503 rather than hanging.
    api.wait_ready(StatusCode::SERVICE_UNAVAILABLE, &log).await;
    let during = ids("during_", 5);
    let answers = futures::future::join_all(during.iter().map(|id| api.post_event(id))).await;
    for (id, (status, body)) in during.iter().zip(&answers) {
        assert_eq!(
            *status,
            StatusCode::SERVICE_UNAVAILABLE,
            "posting {id} with the broker away: {body}"
        );
        assert_eq!(body["code"], "unavailable", "{body}");
    }
    tokio::time::sleep(OUTAGE.saturating_sub(cut_at.elapsed())).await;
    let refused = proxy.refused();
    assert!(
        refused > 0,
        "hookline's clients kept trying the broker during the cut"
    );
    proxy.restore();
    let outage = cut_at.elapsed();

    // After: ready again; the refused posts are retried with the same ids, as the 503 says,
    // and new events flow.
    api.wait_ready(StatusCode::OK, &log).await;
    api.post_accepted(&during).await;
    want.extend(during);
    let after = ids("after_", 10);
    api.post_accepted(&after).await;
    want.extend(after);
    wait_delivered(&receiver, &secret, &want, &log).await;
    let got = delivered(&receiver, &secret);
    assert_eq!(
        got, want,
        "only the test's events, each delivered (outage {outage:?}, {refused} connections \
         refused, {early} of the in-flight batch delivered before the cut)"
    );

    signal(child.id().expect("running"), "-TERM").await;
    let status = tokio::time::timeout(Duration::from_secs(40), child.wait())
        .await
        .expect("exits within 40 s of SIGTERM")
        .unwrap();
    let _ = reader.await;
    let log = log.lock().unwrap().clone();
    assert!(status.success(), "exit status {status}; log:\n{log}");
    assert!(log.contains("stopped cleanly"), "{log}");
    assert!(
        log.contains("kafka is not reachable") && log.contains("kafka is reachable"),
        "readiness changes are logged:\n{log}"
    );
    // librdkafka reports a lost broker every few seconds for every client (142 lines in one
    // 40 s cut, before hookline held the repeats back). Each of `run --role all`'s nine clients
    // (four consumers, five producers) now logs it at most once per 30 s: twice in this cut.
    let reports: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("AllBrokersDown") || l.contains("BrokerTransportFailure"))
        .collect();
    assert!(
        reports.len() <= 20,
        "a lost broker is logged at most once per 30 s per client; got {} reports:\n{}",
        reports.len(),
        reports.join("\n")
    );
    eprintln!(
        "outage: {outage:?} cut, {refused} connections refused meanwhile, {early} of the \
         in-flight batch of {} delivered before the cut, {} requests for {} events in all, \
         {} produce retries logged",
        in_flight_n,
        receiver.requests().len(),
        want.len(),
        log.matches("produce failed; retrying").count()
    );
    let _ = std::fs::remove_file(&path);
    let names: Vec<&str> = topic_names.iter().map(String::as_str).collect();
    Topics::adopt(&shared, &names).delete().await;
}
