//! Tenant keys and ceilings across two `hookline run` processes on the real Kafka: both read
//! the same endpoints topic, so a key issued or revoked through one, and a ceiling set through
//! one, hold on the other within seconds.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hookline::config::Config;
use hookline::service;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::process::Child;
use tokio::time::Instant;

use crate::services::fixture::{Topics, require_kafka, unique};
use crate::support::{Logged, free_port, run_logged, signal};

const TOKEN: &str = "it-tenants-operator-token-0123";
/// Bound on start-up on a busy machine.
const WAIT: Duration = Duration::from_secs(90);
/// What the issue promises: a revocation holds on every instance within this.
const PROPAGATION: Duration = Duration::from_secs(5);

fn config_text(run: &str, bootstrap: &str, admin: u16, metrics: u16) -> String {
    format!(
        r#"
[kafka]
bootstrap_servers = "{bootstrap}"
partitions = 2
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
tiers = ["1s"]
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

/// One `hookline run` process and its admin API.
struct Instance {
    child: Child,
    log: Arc<Mutex<String>>,
    base: String,
    path: std::path::PathBuf,
}

impl Instance {
    async fn start(run: &str, n: u8, bootstrap: &str) -> Instance {
        let (admin, metrics) = (free_port(), free_port());
        let path = std::env::temp_dir().join(format!("hookline-{run}-{n}.toml"));
        std::fs::write(&path, config_text(run, bootstrap, admin, metrics)).unwrap();
        let Logged { child, log, .. } = run_logged(&path);
        let instance = Instance {
            child,
            log,
            base: format!("http://127.0.0.1:{admin}"),
            path,
        };
        let deadline = Instant::now() + WAIT;
        loop {
            let ready = reqwest::get(format!("{}/v1/health/ready", instance.base)).await;
            if ready.is_ok_and(|r| r.status() == StatusCode::OK) {
                return instance;
            }
            assert!(
                Instant::now() < deadline,
                "instance {n} not ready within {WAIT:?}; log:\n{}",
                instance.log.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = reqwest::Client::new()
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token)
            .timeout(Duration::from_secs(30));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let answer = req.send().await.expect("the admin API answers");
        let status = answer.status();
        (status, answer.json().await.unwrap_or(Value::Null))
    }

    /// Asks until `want` answers, for at most [`PROPAGATION`]; returns how long it took.
    async fn until(
        &self,
        what: &str,
        want: impl Fn(StatusCode, &Value) -> bool,
        ask: impl AsyncFn() -> (StatusCode, Value),
    ) -> Duration {
        let started = Instant::now();
        loop {
            let (status, body) = ask().await;
            if want(status, &body) {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < PROPAGATION,
                "{what}: not within {PROPAGATION:?} (last answer {status} {body}); log:\n{}",
                self.log.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(mut self) {
        signal(self.child.id().expect("running"), "-TERM").await;
        let status = tokio::time::timeout(Duration::from_secs(40), self.child.wait())
            .await
            .expect("exits within 40 s of SIGTERM")
            .unwrap();
        assert!(
            status.success(),
            "exit status {status}; log:\n{}",
            self.log.lock().unwrap()
        );
        let _ = std::fs::remove_file(&self.path);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_and_ceilings_set_through_one_instance_hold_on_another() {
    use reqwest::Method;
    let bootstrap = require_kafka().await;
    let run = unique("tenants");
    let one = Instance::start(&run, 1, &bootstrap).await;
    let two = Instance::start(&run, 2, &bootstrap).await;

    // A write key issued through one works on the other.
    let (status, issued) = one
        .call(
            Method::POST,
            "/v1/tenants/acme/keys",
            TOKEN,
            Some(json!({"scope": "write", "name": "it"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{issued}");
    let key = issued["key"].as_str().unwrap().to_owned();
    let id = issued["id"].as_str().unwrap().to_owned();
    two.until(
        "the key accepted by the other instance",
        |s, _| s == StatusCode::OK,
        async || two.call(Method::GET, "/v1/endpoints", &key, None).await,
    )
    .await;

    // Ceilings set through one hold for the tenant's writes on the other.
    let (status, body) = one
        .call(
            Method::PUT,
            "/v1/tenants/acme/limits",
            TOKEN,
            Some(json!({"max_endpoints": 1, "max_in_flight": 4})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let endpoint = |max_in_flight: u32| json!({"url": "https://example.com/hook", "event_types": ["*"], "max_in_flight": max_in_flight});
    two.until(
        "the ceiling seen by the other instance",
        |s, b| s == StatusCode::OK && b["max_in_flight"] == 4,
        async || {
            two.call(Method::GET, "/v1/tenants/acme/limits", &key, None)
                .await
        },
    )
    .await;
    let (status, body) = two
        .call(Method::POST, "/v1/endpoints", &key, Some(endpoint(8)))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        body["detail"],
        "max_in_flight: 8 is above tenant acme's ceiling of 4"
    );
    let (status, body) = two
        .call(Method::POST, "/v1/endpoints", &key, Some(endpoint(4)))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = two
        .call(Method::POST, "/v1/endpoints", &key, Some(endpoint(4)))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("max_endpoints) of 1"),
        "{body}"
    );

    // Revoked through one: refused by the other within 5 s.
    let (status, body) = one
        .call(
            Method::DELETE,
            &format!("/v1/tenants/acme/keys/{id}"),
            TOKEN,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let took = two
        .until(
            "the revoked key refused by the other instance",
            |s, b| {
                s == StatusCode::UNAUTHORIZED
                    && b["detail"].as_str().unwrap_or("").contains("revoked")
            },
            async || two.call(Method::GET, "/v1/endpoints", &key, None).await,
        )
        .await;
    eprintln!("a revocation reached the other instance in {took:?}");

    let config = Config::load(Some(&one.path)).unwrap();
    let names: Vec<String> = service::topic_specs(&config)
        .into_iter()
        .map(|t| t.name)
        .collect();
    one.stop().await;
    two.stop().await;
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    Topics::adopt(&bootstrap, &names).delete().await;
}
