//! One event id, one event, on every instance and across restarts: the same event posted to two
//! `hookline run` processes of one cluster (same topics, groups and CQL keyspace, their own admin
//! ports), produced again to every partition of the native events topic, and all of it again
//! after both restart, reaches each endpoint once. A different event reusing the id goes to the
//! invalid topic, and the repeated `POST /v1/events` answers as the first did.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hookline::config::Config;
use hookline::service;
use rdkafka::Message;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Headers;
use rdkafka::producer::{FutureProducer, FutureRecord};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::process::Child;
use tokio::time::Instant;

use crate::cql_pipeline::Keyspace;
use crate::services::fixture::{
    Topics, cql_login_toml, kafka_config, require_cql, require_kafka, unique,
};
use crate::support::receiver::{Receiver, Reply};
use crate::support::{Logged, create_endpoint, free_port, run_logged, signal};

const TOKEN: &str = "it-dedupe-operator-token-0123456";
/// Bound on each wait for a process or a delivery.
const WAIT: Duration = Duration::from_secs(60);
/// How long a repeat is given to show up (it would be fanned out and sent within a second).
const SETTLE: Duration = Duration::from_secs(3);
const PARTITIONS: i32 = 3;

/// The config both processes share, but for their listeners: topics, groups and keyspace of
/// this run.
fn config_text(run: &str, bootstrap: &str, node: &str, keyspace: &str, admin: u16) -> String {
    format!(
        r#"
[kafka]
bootstrap_servers = "{bootstrap}"
partitions = {PARTITIONS}
group_prefix = "it-{run}"
input_pattern = '^it\.{run}\.never$'
[kafka.client]
"linger.ms" = "1"
[kafka.topics]
deliveries = "it.{run}.deliveries"
endpoints = "it.{run}.endpoints"
dlq = "it.{run}.dlq"
invalid = "it.{run}.invalid"
events = "it.{run}.events"
retry_prefix = "it.{run}.retry."
[retry]
base = "200ms"
cap = "1s"
window = "10s"
tiers = ["1s", "5s"]
[http]
total_timeout = "3s"
connect_timeout = "1s"
allow_cidrs = ["127.0.0.1/32"]
dangerous_allow_http = true
[ingest]
dedupe_window = "1h"
[admin]
listen = "127.0.0.1:{admin}"
operator_tokens = ["{TOKEN}"]
[metrics]
listen = "127.0.0.1:{metrics}"
[security]
master_key = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
[store]
kind = "scylla"
[store.scylla]
nodes = ["{node}"]
keyspace = "{keyspace}"
{login}
"#,
        metrics = free_port(),
        login = cql_login_toml(),
    )
}

/// One `hookline run --role all` process and its admin API.
struct Instance {
    child: Child,
    log: Arc<Mutex<String>>,
    http: reqwest::Client,
    base: String,
    path: std::path::PathBuf,
}

impl Instance {
    /// Starts a process with `config` (its admin port given) and waits until it is ready.
    async fn start(config: String, admin: u16) -> Instance {
        let path = std::env::temp_dir().join(format!("{}.toml", unique("hookline-dedupe")));
        std::fs::write(&path, config).unwrap();
        let Logged { child, log, .. } = run_logged(&path);
        let instance = Instance {
            child,
            log,
            http: reqwest::Client::new(),
            base: format!("http://127.0.0.1:{admin}"),
            path,
        };
        let deadline = Instant::now() + WAIT;
        loop {
            let ready = instance
                .http
                .get(format!("{}/v1/health/ready", instance.base))
                .timeout(Duration::from_secs(5))
                .send()
                .await
                .is_ok_and(|r| r.status() == StatusCode::OK);
            if ready {
                return instance;
            }
            assert!(
                Instant::now() < deadline,
                "hookline run was not ready within {WAIT:?}; log:\n{}",
                instance.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// `POST /v1/events` of event `id` with `payload`: the status and the body.
    async fn post(&self, tenant: &str, id: &str, payload: &Value) -> (StatusCode, Value) {
        let answer = self
            .http
            .post(format!("{}/v1/events", self.base))
            .bearer_auth(TOKEN)
            .json(&json!({"tenant": tenant, "type": "order.created", "id": id, "payload": payload}))
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .expect("the admin API answers");
        let status = answer.status();
        (status, answer.json().await.unwrap_or(Value::Null))
    }

    /// `GET path` with the operator token: the status and the body.
    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let answer = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("the admin API answers");
        let status = answer.status();
        (status, answer.json().await.unwrap_or(Value::Null))
    }

    /// Stops the process with SIGTERM; it must exit cleanly.
    async fn stop(mut self) {
        signal(self.child.id().expect("running"), "-TERM").await;
        let status = tokio::time::timeout(Duration::from_secs(40), self.child.wait())
            .await
            .expect("exits within 40 s of SIGTERM")
            .unwrap();
        assert!(
            status.success(),
            "exit status {status}; log:\n{}",
            self.log()
        );
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Two processes of one cluster, each with an admin port of its own.
async fn two_instances(text: impl Fn(u16) -> String) -> (Instance, Instance) {
    let (a, b) = (free_port(), free_port());
    let first = Instance::start(text(a), a).await;
    // Started after the first has created the topics.
    let second = Instance::start(text(b), b).await;
    (first, second)
}

/// Produces the native envelope of event `id` to every partition of `topic`, each copy
/// acknowledged.
async fn produce_everywhere(
    producer: &FutureProducer,
    topic: &str,
    tenant: &str,
    id: &str,
    payload: &Value,
) {
    let value = json!({"id": id, "tenant": tenant, "type": "order.created", "payload": payload})
        .to_string();
    for partition in 0..PARTITIONS {
        producer
            .send(
                FutureRecord::to(topic)
                    .partition(partition)
                    .key(id)
                    .payload(&value),
                Duration::from_secs(10),
            )
            .await
            .expect("event produced");
    }
}

/// How many requests each receiver got for event `id`.
fn sent(receivers: &[&Receiver], id: &str) -> Vec<usize> {
    receivers
        .iter()
        .map(|r| {
            r.requests()
                .iter()
                .filter(|q| q.header("webhook-id") == Some(id))
                .count()
        })
        .collect()
}

/// Waits until every receiver got event `id`, then for [`SETTLE`], and checks each got it once.
/// A failure shows the logs of `instances`.
async fn delivered_once(receivers: &[&Receiver], id: &str, when: &str, instances: [&Instance; 2]) {
    let deadline = Instant::now() + WAIT;
    while sent(receivers, id).contains(&0) {
        assert!(
            Instant::now() < deadline,
            "{when}: not delivered everywhere within {WAIT:?}: {:?}; logs:\n{}\n{}",
            sent(receivers, id),
            instances[0].log(),
            instances[1].log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(SETTLE).await;
    assert_eq!(
        sent(receivers, id),
        vec![1; receivers.len()],
        "{when}; logs:\n{}\n{}",
        instances[0].log(),
        instances[1].log()
    );
}

/// The reason headers of the records in the invalid topic `topic` whose key is `key`, reading
/// until `n` of them are there.
async fn invalid_reasons(bootstrap: &str, topic: &str, key: &str, n: usize) -> Vec<String> {
    let consumer: StreamConsumer = kafka_config(bootstrap)
        .set("group.id", unique("it-invalid-reader"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .expect("reader");
    consumer.subscribe(&[topic]).expect("subscribe");
    let mut reasons = vec![];
    let deadline = Instant::now() + WAIT;
    while reasons.len() < n {
        let m = tokio::time::timeout_at(deadline, consumer.recv())
            .await
            .unwrap_or_else(|_| panic!("{} of {n} invalid records for {key}", reasons.len()))
            .expect("read the invalid topic");
        if m.key() != Some(key.as_bytes()) {
            continue;
        }
        let reason = m
            .headers()
            .and_then(|h| {
                h.iter()
                    .find(|h| h.key == hookline::input::INVALID_REASON_HEADER)
                    .and_then(|h| h.value)
                    .map(|v| String::from_utf8_lossy(v).into_owned())
            })
            .unwrap_or_default();
        reasons.push(reason);
    }
    reasons
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_event_id_is_delivered_once_through_two_processes_and_a_restart() {
    let bootstrap = require_kafka().await;
    let node = require_cql().await;
    Keyspace::migrated()
        .await
        .run(|keyspace| async move {
            let run = unique("dedupe");
            let text = |admin| config_text(&run, &bootstrap, &node, &keyspace, admin);
            let checked = std::env::temp_dir().join(format!("{run}.toml"));
            std::fs::write(&checked, text(free_port())).unwrap();
            let config = Config::load(Some(&checked)).expect("the test's config is valid");
            std::fs::remove_file(&checked).unwrap();
            let topics: Vec<String> = service::topic_specs(&config)
                .into_iter()
                .map(|t| t.name)
                .collect();
            let events_topic = format!("it.{run}.events");
            let invalid_topic = format!("it.{run}.invalid");
            let (one, two) = two_instances(&text).await;

            let tenant = unique("tenant");
            let receivers = [
                Receiver::fixed(Reply::status(200)).await,
                Receiver::fixed(Reply::status(204)).await,
            ];
            for r in &receivers {
                let created = create_endpoint(
                    &one.http,
                    &one.base,
                    TOKEN,
                    json!({"tenant": tenant, "url": r.url("/hook"), "event_types": ["*"]}),
                )
                .await;
                // Either process may fan the event out: both know the endpoint first.
                let path = format!("/v1/endpoints/{}", created["id"].as_str().unwrap());
                let deadline = Instant::now() + WAIT;
                while two.get(&path).await.0 != StatusCode::OK {
                    assert!(
                        Instant::now() < deadline,
                        "{path} unknown to the second process"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            let all: Vec<&Receiver> = receivers.iter().collect();
            let id = unique("evt");
            let payload = json!({"order": 7, "note": "once"});

            // The first copy, and the event recorded with both its deliveries.
            let first = one.post(&tenant, &id, &payload).await;
            assert_eq!(first.0, StatusCode::ACCEPTED, "{first:?}");
            delivered_once(&all, &id, "the first copy", [&one, &two]).await;
            let deadline = Instant::now() + WAIT;
            loop {
                let (status, list) = two.get(&format!("/v1/events/{id}/deliveries")).await;
                if status == StatusCode::OK && list["data"].as_array().is_some_and(|d| d.len() == 2)
                {
                    break;
                }
                assert!(Instant::now() < deadline, "event not recorded: {list}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }

            // Again through both processes and every partition of the events topic.
            for instance in [&two, &one] {
                assert_eq!(
                    instance.post(&tenant, &id, &payload).await,
                    first,
                    "a repeat answers as the first did"
                );
            }
            let producer: FutureProducer = kafka_config(&bootstrap).create().expect("producer");
            produce_everywhere(&producer, &events_topic, &tenant, &id, &payload).await;
            delivered_once(
                &all,
                &id,
                "repeats through two processes and every partition",
                [&one, &two],
            )
            .await;

            // A different event with the id, produced to the events topic: the invalid topic.
            let other = json!({"order": 8});
            produce_everywhere(&producer, &events_topic, &tenant, &id, &other).await;
            let reasons = invalid_reasons(&bootstrap, &invalid_topic, &id, 3).await;
            assert_eq!(reasons, vec!["reused_id"; 3]);

            // Both processes restart: what they remembered is gone, the store is not.
            let (log_one, log_two) = (one.log(), two.log());
            one.stop().await;
            two.stop().await;
            let (one, two) = two_instances(&text).await;
            for instance in [&one, &two] {
                assert_eq!(
                    instance.post(&tenant, &id, &payload).await,
                    first,
                    "a repeat after a restart answers as the first did"
                );
                let (status, body) = instance.post(&tenant, &id, &other).await;
                assert_eq!(
                    status,
                    StatusCode::CONFLICT,
                    "a different payload after a restart: {body}"
                );
            }
            produce_everywhere(&producer, &events_topic, &tenant, &id, &payload).await;
            delivered_once(&all, &id, "repeats after a restart", [&one, &two]).await;

            let counted: BTreeMap<String, usize> = receivers
                .iter()
                .enumerate()
                .map(|(i, r)| (format!("endpoint {i}"), r.requests().len()))
                .collect();
            eprintln!("requests per endpoint: {counted:?}");
            assert!(
                !log_one.contains("panicked") && !log_two.contains("panicked"),
                "{log_one}\n{log_two}"
            );
            one.stop().await;
            two.stop().await;
            let names: Vec<&str> = topics.iter().map(String::as_str).collect();
            Topics::adopt(&bootstrap, &names).delete().await;
        })
        .await;
}
