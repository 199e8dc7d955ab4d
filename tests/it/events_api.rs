//! The customer's view on the real servers, through `hookline run` with the CQL store: the
//! request a delivery sent (`GET /v1/deliveries/{id}`, byte for byte what the receiver got),
//! and the events API paging newest first, stably, while new events arrive between pages.
//!
//! The test has its own keyspace (dropped at the end, pass or fail), topics and groups.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hookline::id::{DeliveryId, EndpointId, EventId};
use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::process::Child;
use tokio::time::Instant;

use crate::cql_pipeline::Keyspace;
use crate::services::fixture::{Topics, cql_login_toml, require_cql, require_kafka, unique};
use crate::support::receiver::{Receiver, Reply};
use crate::support::{Logged, create_endpoint, free_port, run_logged, signal};

const ACME: &str = "it-events-acme-token-0123456789";
const GLOBEX: &str = "it-events-globex-token-0123456789";
/// Bound on each wait for the pipeline on a busy machine.
const WAIT: Duration = Duration::from_secs(90);

/// `hookline run` with the CQL store in `keyspace` and topics of its own; stderr kept in `log`.
struct Run {
    child: Child,
    log: Arc<Mutex<String>>,
    topics: Vec<String>,
    bootstrap: String,
    http: reqwest::Client,
    base: String,
}

impl Run {
    async fn start(keyspace: &str) -> Run {
        let bootstrap = require_kafka().await;
        let node = require_cql().await;
        let run = unique("events");
        let (admin, metrics) = (free_port(), free_port());
        let topics: Vec<String> = ["deliveries", "endpoints", "dlq", "invalid", "events"]
            .iter()
            .map(|t| format!("it.{run}.{t}"))
            .chain([format!("it.{run}.retry.1s")])
            .collect();
        let config = format!(
            r#"
[kafka]
bootstrap_servers = "{bootstrap}"
partitions = 1
group_prefix = "it-{run}"
input_pattern = '^it\.{run}\.never$'
[kafka.topics]
deliveries = "it.{run}.deliveries"
endpoints = "it.{run}.endpoints"
dlq = "it.{run}.dlq"
invalid = "it.{run}.invalid"
events = "it.{run}.events"
retry_prefix = "it.{run}.retry."
[retry]
tiers = ["1s"]
[http]
allow_cidrs = ["127.0.0.1/32"]
dangerous_allow_http = true
[admin]
listen = "127.0.0.1:{admin}"
[admin.tenant_tokens]
"{ACME}" = "acme"
"{GLOBEX}" = "globex"
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
            login = cql_login_toml(),
        );
        let path = std::env::temp_dir().join(format!("hookline-{run}.toml"));
        std::fs::write(&path, config).unwrap();
        let Logged { child, log, .. } = run_logged(&path);
        let run = Run {
            child,
            log,
            topics,
            bootstrap,
            http: reqwest::Client::new(),
            base: format!("http://127.0.0.1:{admin}"),
        };
        run.wait_ready().await;
        run
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + WAIT;
        loop {
            let ready = self
                .http
                .get(format!("{}/v1/health/ready", self.base))
                .timeout(Duration::from_secs(5))
                .send()
                .await;
            if ready.is_ok_and(|r| r.status() == StatusCode::OK) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "hookline run was not ready within {WAIT:?}; log:\n{}",
                self.log.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// `GET path` as `token`: (status, body text).
    async fn get(&self, path: &str, token: &str) -> (StatusCode, String) {
        let answer = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(token)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .expect("the admin API answers");
        (answer.status(), answer.text().await.unwrap_or_default())
    }

    /// Polls `GET path` as acme until `done(body)`; fails after [`WAIT`] with the last answer.
    async fn get_until(&self, path: &str, done: impl Fn(&Value) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let (status, text) = self.get(path, ACME).await;
            let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            if status == StatusCode::OK && done(&body) {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "GET {path} never got there; last answer {status}: {text}\nlog:\n{}",
                self.log.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Posts acme's event `id` with the raw JSON `payload`; 202 expected.
    async fn post(&self, id: &str, payload: &str) {
        let body = format!(r#"{{"type":"order.created","id":"{id}","payload":{payload}}}"#);
        let answer = self
            .http
            .post(format!("{}/v1/events", self.base))
            .bearer_auth(ACME)
            .header("content-type", "application/json")
            .body(body)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .expect("the admin API answers");
        assert_eq!(answer.status(), StatusCode::ACCEPTED, "posting {id}");
        // Kafka timestamps are milliseconds: keep each event's receipt distinct.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    /// Stops the process (SIGTERM) and deletes its topics.
    async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            signal(pid, "-TERM").await;
        }
        let _ = tokio::time::timeout(WAIT, self.child.wait()).await;
        let names: Vec<&str> = self.topics.iter().map(String::as_str).collect();
        Topics::adopt(&self.bootstrap, &names).delete().await;
    }
}

/// `GET /v1/deliveries/{id}`'s `request`, its body kept as the raw JSON text.
#[derive(Deserialize)]
struct Detail {
    request: Option<Sent>,
}

#[derive(Deserialize)]
struct Sent {
    headers: BTreeMap<String, String>,
    body: Box<RawValue>,
}

/// The event ids of `GET /v1/events?{query}` pages of `limit`, posting a new event (and
/// waiting until it is listed) between pages.
async fn page_while_posting(run: &Run, limit: usize) -> Vec<String> {
    let mut seen = vec![];
    let mut uri = format!("/v1/events?limit={limit}");
    for page in 0.. {
        let (status, text) = run.get(&uri, ACME).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let body: Value = serde_json::from_str(&text).unwrap();
        seen.extend(
            body["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["id"].as_str().unwrap().to_owned()),
        );
        let late = format!("late_{page}");
        run.post(&late, &format!(r#"{{"n":{page}}}"#)).await;
        run.get_until("/v1/events?limit=1", |b| {
            b["data"][0]["id"] == late.as_str()
        })
        .await;
        match body["next_cursor"].as_str() {
            Some(c) => uri = format!("/v1/events?limit={limit}&cursor={c}"),
            None => return seen,
        }
    }
    unreachable!()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_as_sent_and_the_events_api_on_the_cql_store() {
    Keyspace::migrated()
        .await
        .run(|keyspace| async move {
            let run = Run::start(&keyspace).await;
            let receiver = Receiver::fixed(Reply::status(200)).await;
            let endpoint = create_endpoint(
                &run.http,
                &run.base,
                ACME,
                json!({"url": receiver.url("/hook"), "event_types": ["order.*"]}),
            )
            .await;
            let endpoint = EndpointId::parse(endpoint["id"].as_str().unwrap()).unwrap();

            // The request as sent: the body byte for byte, the headers of the attempt.
            let payload = r#"{"amount":1.50,"note":"ünï","lines":[{"sku":"a-1","qty":2}]}"#;
            run.post("evt_0", payload).await;
            let got = receiver.wait_for(1, WAIT).await;
            let dlv = DeliveryId::derive(&EventId::parse("evt_0").unwrap(), &endpoint);
            let text = run
                .get_until(&format!("/v1/deliveries/{dlv}"), |b| {
                    b["delivery"]["state"] == "succeeded" && !b["request"].is_null()
                })
                .await;
            let detail: Detail = serde_json::from_str(&text).unwrap();
            let sent = detail.request.unwrap();
            assert_eq!(
                sent.body.get().as_bytes(),
                got[0].body.as_slice(),
                "the body shown is the body received"
            );
            for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
                assert_eq!(
                    sent.headers.get(name).map(String::as_str),
                    got[0].header(name),
                    "{name} in {text}"
                );
            }
            let (status, _) = run.get(&format!("/v1/deliveries/{dlv}"), GLOBEX).await;
            assert_eq!(status, StatusCode::NOT_FOUND);

            // Events API: newest first, with payload and counts, stable while events arrive.
            let ids: Vec<String> = (1..=7).map(|i| format!("evt_{i}")).collect();
            for (i, id) in ids.iter().enumerate() {
                run.post(id, &format!(r#"{{"i":{i}}}"#)).await;
            }
            let listed = run
                .get_until("/v1/events?limit=500", |b| {
                    b["data"].as_array().is_some_and(|d| d.len() == 8)
                        && b["data"][7]["deliveries"]["succeeded"] == 1
                })
                .await;
            assert!(
                listed.contains(&format!(r#""payload":{payload}"#)),
                "{listed}"
            );
            let seen = page_while_posting(&run, 3).await;
            let mut want: Vec<String> = ids.into_iter().rev().collect();
            want.push("evt_0".into());
            assert_eq!(seen, want, "newest first, no repeats, no gaps");
            let (status, text) = run.get("/v1/events?tenant=acme", GLOBEX).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
            run.stop().await;
        })
        .await;
}
