//! The whole pipeline on the real servers with the CQL store (issue 5's acceptance): an outbox row
//! in PostgreSQL reaches a local receiver through Debezium, Kafka and hookline, and every attempt
//! is then visible through the admin API; a 30 s CQL outage mid-stream loses nothing and
//! duplicates nothing in the attempt log; `hookline run` on an unmigrated keyspace fails clearly.
//!
//! Every test works in its own keyspace (migrated by `hookline::storage::scylla::migrate`, dropped at the end,
//! pass or fail), its own topics and consumer groups, so runs share the servers safely. The
//! outage is a TCP proxy inside the test between hookline and the shared Cassandra: cutting it
//! cuts only this test's store.

use std::collections::{BTreeMap, BTreeSet};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use futures::FutureExt;
use hookline::admin::events::MemoryEventSink;
use hookline::admin::{AdminState, router};
use hookline::config::{AdminConfig, Config, StoreKind, Token};
use hookline::id::{DeliveryId, EventId};
use hookline::service::{self, Role};
use hookline::storage::scylla::migrate::{MIGRATIONS, migrate};
use hookline::storage::scylla::{ScyllaConfig, connect_session};
use hookline::storage::{AttemptOutcome, DeliveryStatus};
use http_body_util::BodyExt;
use rdkafka::consumer::{Consumer, StreamConsumer};
use scylla::client::session::Session;
use serde_json::{Value, json};
use tokio_postgres::NoTls;
use tower::ServiceExt;
use uuid::Uuid;

use crate::pipeline::harness::{On, Pipeline, test_config, verify};
use crate::services::fixture::{
    Topics, cql_login_toml, cql_store_config, kafka_config, require_connect, require_cql,
    require_kafka, require_postgres, unique,
};
use crate::support::proxy::TcpProxy;
use crate::support::receiver::{Receiver, Reply};

/// Bound on every wait for the pipeline (Debezium, group joins, retries) on a busy machine.
const WAIT: Duration = Duration::from_secs(90);
const OPERATOR_TOKEN: &str = "it-operator-token-0123456789";

/// A fresh keyspace on the test server, migrated, dropped by [`Keyspace::run`].
pub(crate) struct Keyspace {
    session: Session,
    name: String,
}

impl Keyspace {
    pub(crate) async fn migrated() -> Keyspace {
        let node = require_cql().await;
        let name = format!("hl_pipe_{}", &Uuid::new_v4().simple().to_string()[..12]);
        let config = ScyllaConfig {
            // Schema changes are slow on a busy two-core machine.
            write_timeout: Duration::from_secs(30),
            ..cql_store_config(&node, &name)
        };
        let session = connect_session(&config).await.expect("CQL session");
        let report = migrate(
            &session,
            &name,
            &config.replication().expect("replication"),
            MIGRATIONS,
        )
        .await
        .expect("migrate the test keyspace");
        assert_eq!(
            report.version,
            hookline::storage::scylla::migrate::LATEST_VERSION
        );
        Keyspace { session, name }
    }

    /// Runs `body` with this keyspace, then drops it whether `body` panicked or not.
    pub(crate) async fn run<F: Future<Output = ()>>(self, body: impl FnOnce(String) -> F) {
        let outcome = AssertUnwindSafe(body(self.name.clone()))
            .catch_unwind()
            .await;
        let drop = format!("DROP KEYSPACE IF EXISTS {}", self.name);
        if let Err(e) = self.session.query_unpaged(drop, ()).await {
            eprintln!("could not drop keyspace {}: {e}", self.name);
        }
        if let Err(panic) = outcome {
            std::panic::resume_unwind(panic);
        }
    }
}

/// A pipeline config on real Kafka whose store is the CQL keyspace `keyspace` at `node`.
pub(crate) fn cql_config(node: &str, keyspace: &str) -> Config {
    let mut c = test_config(On::Real);
    c.store.kind = StoreKind::Scylla;
    c.store.scylla = ScyllaConfig {
        write_timeout: Duration::from_secs(10),
        ..cql_store_config(node, keyspace)
    };
    c
}

/// Starts every stage on real Kafka (see [`start_pipeline_as`]).
pub(crate) async fn start_pipeline(config: Config) -> Pipeline {
    start_pipeline_as(config, Role::All).await
}

/// Starts the stages of `role` on real Kafka after creating its topics and waiting until each
/// partition has a leader: the registry's first metadata read fails on a topic created a moment
/// ago (`NotLeaderForPartition`), which made these tests flaky when they ran in parallel.
pub(crate) async fn start_pipeline_as(mut config: Config, role: Role) -> Pipeline {
    config.kafka.bootstrap_servers = require_kafka().await;
    service::prepare_topics(&config)
        .await
        .expect("create the test's topics");
    let names: Vec<String> = service::topic_specs(&config)
        .into_iter()
        .map(|t| t.name)
        .collect();
    let probe: StreamConsumer = kafka_config(&config.kafka.bootstrap_servers)
        .create()
        .expect("metadata client");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    for name in &names {
        loop {
            let led = tokio::task::block_in_place(|| {
                probe
                    .fetch_metadata(Some(name), Duration::from_secs(5))
                    .is_ok_and(|m| {
                        m.topics().iter().all(|t| {
                            t.error().is_none()
                                && !t.partitions().is_empty()
                                && t.partitions()
                                    .iter()
                                    .all(|p| p.leader() >= 0 && p.error().is_none())
                        })
                    })
            });
            if led {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "topic {name} has no leader 30 s after it was created"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Pipeline::start_as(On::Real, config, role).await
}

/// The admin API over the pipeline's own endpoint view and store, as `hookline run` serves it.
pub(crate) fn admin(p: &Pipeline) -> axum::Router {
    let auth = AdminConfig {
        operator_tokens: vec![Token::new(OPERATOR_TOKEN)],
        ..AdminConfig::default()
    };
    let (_ready_tx, ready) = tokio::sync::watch::channel(true);
    router(AdminState::new(
        p.handles.endpoints.clone(),
        p.handles.store.clone(),
        Arc::new(MemoryEventSink::default()),
        auth,
        ready,
    ))
}

/// `GET path` with the operator token: (status, JSON body).
pub(crate) async fn get(api: &axum::Router, path: &str) -> (u16, Value) {
    let request = axum::http::Request::get(path)
        .header("authorization", format!("Bearer {OPERATOR_TOKEN}"))
        .body(Body::empty())
        .expect("request");
    let response = api.clone().oneshot(request).await.expect("router answers");
    let status = response.status().as_u16();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, body)
}

/// Polls `GET path` until `done(body)`, or fails after [`WAIT`] showing the last answer.
pub(crate) async fn get_until(
    api: &axum::Router,
    path: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (status, body) = get(api, path).await;
        if status == 200 && done(&body) {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "GET {path} never reached the expected state; last answer {status}: {body:#}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Issue 5's acceptance: from an outbox row in PostgreSQL through Debezium to a local receiver,
/// with every attempt then visible through the admin API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_row_to_receiver_with_every_attempt_in_the_admin_api() {
    let bootstrap = require_kafka().await;
    require_connect().await;
    let pg_conn = require_postgres().await;
    let node = require_cql().await;
    Keyspace::migrated()
        .await
        .run(|keyspace| async move {
            // The route topic exists before the row, so the fan-out reads it from its start.
            let aggregatetype = format!("it_{}", Uuid::new_v4().simple());
            let topic = format!("outbox.event.{aggregatetype}");
            let outbox_topic = Topics::create(&bootstrap, &[&topic], 1).await;

            let mut config = cql_config(&node, &keyspace);
            // Anchored on this test's own topic: hookline's topics never match it (validated).
            config.kafka.input_pattern = Some(format!(r"^outbox\.event\.{aggregatetype}$"));
            let p = start_pipeline(config).await;

            let tenant = unique("tenant");
            let calls = Arc::new(AtomicUsize::new(0));
            let receiver = Receiver::start({
                let calls = calls.clone();
                move |_| {
                    if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                        Reply::status(503).body("warming up")
                    } else {
                        Reply::status(200)
                    }
                }
            })
            .await;
            let (endpoint, secret) = p
                .endpoint(&tenant, &receiver.url("/hooks"), &["order.created"])
                .await;

            let (pg, connection) = tokio_postgres::connect(&pg_conn, NoTls)
                .await
                .expect("PostgreSQL");
            tokio::spawn(connection);
            let event_id = Uuid::new_v4();
            let payload = json!({"order": 42, "lines": [{"sku": "a-1", "qty": 2}], "note": "ünï"});
            pg.execute(
                "INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, tenant_id, \
                 payload) VALUES ($1::text::uuid, $2, $3, $4, $5, $6::text::jsonb)",
                &[
                    &event_id.to_string(),
                    &aggregatetype,
                    &"order-42",
                    &"order.created",
                    &tenant,
                    &payload.to_string(),
                ],
            )
            .await
            .expect("insert the outbox row");

            let got = receiver.wait_for(2, WAIT).await;
            for request in &got {
                assert_eq!(verify(request, &secret), event_id.to_string());
                let body: Value = serde_json::from_slice(&request.body).expect("JSON body");
                assert_eq!(body["id"], event_id.to_string());
                assert_eq!(body["type"], "order.created");
                assert_eq!(body["data"], payload);
            }
            assert_eq!(got[0].body, got[1].body, "the retry sends the same bytes");

            // The attempt rows are written after each response: poll until both are there.
            let api = admin(&p);
            let delivery =
                DeliveryId::derive(&EventId::parse(event_id.to_string()).unwrap(), &endpoint);
            let detail = get_until(&api, &format!("/v1/deliveries/{delivery}"), |b| {
                b["attempts"].as_array().is_some_and(|a| a.len() >= 2)
                    && b["delivery"]["state"] == "succeeded"
            })
            .await;
            let attempts = detail["attempts"].as_array().unwrap();
            assert_eq!(attempts.len(), 2, "{detail:#}");
            assert_eq!(attempts[0]["attempt"], 1);
            assert_eq!(attempts[0]["status"], 503);
            assert_eq!(attempts[0]["outcome"], "retry_scheduled");
            assert_eq!(attempts[0]["response_body"], "warming up");
            assert_eq!(attempts[1]["attempt"], 2);
            assert_eq!(attempts[1]["status"], 200);
            assert_eq!(attempts[1]["outcome"], "succeeded");
            let d = &detail["delivery"];
            assert_eq!(d["event_id"], event_id.to_string());
            assert_eq!(d["endpoint_id"], endpoint.to_string());
            assert_eq!(d["tenant"], tenant.as_str());
            assert_eq!(d["attempts"], 2);
            assert_eq!(d["last_status"], 200);

            let (status, list) = get(&api, &format!("/v1/events/{event_id}/deliveries")).await;
            assert_eq!(status, 200, "{list:#}");
            let rows = list["data"].as_array().expect("data");
            assert_eq!(rows.len(), 1, "{list:#}");
            assert_eq!(rows[0]["id"], delivery.to_string());
            assert_eq!(rows[0]["state"], "succeeded");
            assert_eq!(rows[0]["attempts"], 2);

            tokio::time::sleep(Duration::from_secs(1)).await;
            assert_eq!(receiver.requests().len(), 2, "nothing after the success");
            p.stop().await;
            outbox_topic.delete().await;
        })
        .await;
}

const OUTAGE: Duration = Duration::from_secs(30);
/// Events in the outage test: 10 before the cut, 15 as it starts, 20 (more than an endpoint's
/// 16 in flight, so some park in a delay tier) half-way through it, 10 after it.
const N: u32 = 55;

/// The CQL server unreachable for 30 s mid-stream: every event is still delivered, every
/// delivery has exactly one success row (retried identical writes are idempotent), and every
/// request the receiver saw has its row once the store is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thirty_second_cql_outage_loses_nothing_and_duplicates_nothing() {
    let node = require_cql().await;
    Keyspace::migrated()
        .await
        .run(|keyspace| async move {
            let proxy = TcpProxy::start(&node).await;
            let mut config = cql_config(&proxy.addr.to_string(), &keyspace);
            // Writes fail fast while the proxy is cut, so the stage's retries keep coming.
            config.store.scylla.write_timeout = Duration::from_secs(2);
            // Records parked behind blocked attempts come back through the tiers; nothing here
            // should be dead-lettered for taking long.
            config.retry.window = Duration::from_secs(600);
            let p = start_pipeline(config).await;
            let receiver = Receiver::fixed(Reply::status(200)).await;
            let (endpoint, secret) = p.endpoint("acme", &receiver.url("/"), &["*"]).await;
            let post = |range: std::ops::Range<u32>| {
                let events: Vec<(String, Value)> = range
                    .map(|i| (format!("evt_outage_{i}"), json!({"n": i})))
                    .collect();
                let p = &p;
                async move {
                    let posts: Vec<_> = events
                        .iter()
                        .map(|(id, v)| (id.as_str(), "acme", "order.created", v.clone()))
                        .collect();
                    p.post(&posts).await;
                }
            };
            let store = p.handles.store.clone();
            let delivery_of = |i: u32| {
                DeliveryId::derive(
                    &EventId::parse(format!("evt_outage_{i}")).unwrap(),
                    &endpoint,
                )
            };

            // Before: the store works through the proxy.
            post(0..10).await;
            receiver.wait_for(10, WAIT).await;
            wait_logged(&store, (0..10).map(delivery_of), WAIT).await;
            let through_proxy = proxy.accepted();
            assert!(through_proxy > 0, "the store connected through the proxy");

            // During: 30 s without the CQL server, events keep coming. The cut lands as the
            // next batch starts going out, so some attempt writes are in flight when it does:
            // whether they were applied or not, the stage writes them again, identically.
            post(10..25).await;
            receiver.wait_for(11, WAIT).await;
            proxy.cut();
            let cut_at = tokio::time::Instant::now();
            let before_cut = receiver.requests().len();
            let probe =
                tokio::time::timeout(Duration::from_secs(15), store.attempts(&delivery_of(0)))
                    .await
                    .expect("a store call fails within its write timeout, not hangs");
            assert!(
                probe.is_err(),
                "a store read succeeded with the proxy cut: the driver bypasses the proxy"
            );
            tokio::time::sleep(OUTAGE / 2).await;
            post(25..45).await;
            tokio::time::sleep(OUTAGE.saturating_sub(cut_at.elapsed())).await;
            let sent_during_cut = receiver.requests().len() - before_cut;
            let outage = cut_at.elapsed();
            proxy.restore();
            let restored_at = tokio::time::Instant::now();

            // After.
            post(45..N).await;
            let all: Vec<DeliveryId> = (0..N).map(delivery_of).collect();
            wait_logged(&store, all.iter().cloned(), WAIT).await;
            let logged_after = restored_at.elapsed();
            eprintln!(
                "outage: {sent_during_cut} requests sent during the {:.1}s cut ({} before it); \
                 every attempt row durable {:.1}s after restore; proxy accepted {} connections, \
                 closed {} while cut",
                outage.as_secs_f64(),
                before_cut,
                logged_after.as_secs_f64(),
                proxy.accepted(),
                proxy.refused(),
            );

            // Nothing lost: every event reached the receiver, signed.
            let requests = receiver.wait_for(N as usize, WAIT).await;
            let mut sent: BTreeMap<String, usize> = BTreeMap::new();
            for r in &requests {
                *sent.entry(verify(r, &secret)).or_default() += 1;
            }
            let expected: BTreeSet<String> = (0..N).map(|i| format!("evt_outage_{i}")).collect();
            assert_eq!(sent.keys().cloned().collect::<BTreeSet<_>>(), expected);
            assert!(
                sent_during_cut > 0,
                "the outage was mid-stream: deliveries went out while the store was cut"
            );

            // Nothing duplicated, nothing unlogged: one row per request the receiver saw, and
            // exactly one success row per delivery.
            for i in 0..N {
                let id = delivery_of(i);
                let rows = store.attempts(&id).await.expect("attempts");
                let successes = rows
                    .iter()
                    .filter(|r| r.outcome == AttemptOutcome::Succeeded)
                    .count();
                assert_eq!(successes, 1, "evt_outage_{i}: {rows:#?}");
                assert_eq!(
                    rows.len(),
                    sent[&format!("evt_outage_{i}")],
                    "evt_outage_{i}: one row per request the receiver saw"
                );
                let state = store
                    .delivery(&id)
                    .await
                    .expect("state")
                    .expect("a state row");
                assert_eq!(state.status, DeliveryStatus::Succeeded);
                assert_eq!(state.attempts as usize, rows.len(), "evt_outage_{i}");
            }
            p.stop().await;
            drop(proxy);
        })
        .await;
}

/// Waits until every delivery has a succeeded state (its success row written), or fails.
async fn wait_logged(
    store: &Arc<dyn hookline::storage::DeliveryStore>,
    deliveries: impl IntoIterator<Item = DeliveryId>,
    timeout: Duration,
) {
    let deadline = tokio::time::Instant::now() + timeout;
    for id in deliveries {
        loop {
            if let Ok(Some(state)) = store.delivery(&id).await
                && state.status == DeliveryStatus::Succeeded
            {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{id} was not logged as succeeded within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Runs `hookline run` on real Kafka (topics of its own) with `store` as its `[store.scylla]`
/// table until it exits; returns whether it succeeded, its last stderr line and how long it took.
async fn hookline_run(store: &str) -> (bool, String, Duration) {
    let bootstrap = require_kafka().await;
    let run = Uuid::new_v4().simple().to_string();
    let dir = std::env::temp_dir().join(format!("hl_run_{run}"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("hookline.toml");
    let topics = [
        format!("it.{run}.deliveries"),
        format!("it.{run}.endpoints"),
        format!("it.{run}.dlq"),
        format!("it.{run}.invalid"),
        format!("it.{run}.events"),
        format!("it.{run}.retry.5s"),
    ];
    let master_key = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
    std::fs::write(
        &path,
        format!(
            r#"
            [kafka]
            bootstrap_servers = "{bootstrap}"
            partitions = 1
            input_pattern = '^it\.{run}\.never$'
            group_prefix = "it-{run}"
            [kafka.topics]
            deliveries = "{}"
            endpoints = "{}"
            dlq = "{}"
            invalid = "{}"
            events = "{}"
            retry_prefix = "it.{run}.retry."
            [retry]
            tiers = ["5s"]
            [admin]
            listen = "127.0.0.1:0"
            [metrics]
            listen = "127.0.0.1:0"
            [security]
            master_key = "{master_key}"
            [store]
            kind = "scylla"
            [store.scylla]
            {store}
            "#,
            topics[0], topics[1], topics[2], topics[3], topics[4],
        ),
    )
    .unwrap();
    let started = tokio::time::Instant::now();
    let output = tokio::time::timeout(
        WAIT,
        tokio::process::Command::new(crate::support::hookline_bin())
            .args(["run", "--config"])
            .arg(&path)
            .env("HOOKLINE_LOG", "warn")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("hookline run exits instead of waiting forever")
    .expect("hookline run starts");
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last = stderr.lines().last().unwrap_or("").to_owned();
    eprintln!(
        "hookline run exited ({}) in {took:?}: {last}",
        output.status
    );
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    Topics::adopt(&bootstrap, &names).delete().await;
    std::fs::remove_dir_all(dir).unwrap();
    (output.status.success(), last, took)
}

/// `hookline run` on a keyspace nobody migrated stops at start-up, at once, and says what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_on_an_unmigrated_keyspace_fails_with_a_clear_message() {
    let node = require_cql().await;
    let keyspace = format!("hl_none_{}", &Uuid::new_v4().simple().to_string()[..12]);
    let (ok, last, took) = hookline_run(&format!(
        "nodes = [\"{node}\"]\nkeyspace = \"{keyspace}\"\n{}",
        cql_login_toml()
    ))
    .await;
    assert!(!ok);
    assert!(
        last.starts_with("error: store: CQL nodes")
            && last.contains(&node)
            && last.contains(&keyspace)
            && last.contains("schema version 0")
            && last.contains("run `hookline migrate`"),
        "unclear error: {last}"
    );
    assert!(
        took < Duration::from_secs(30),
        "a missing schema fails at once, not after the 60 s start-up wait ({took:?})"
    );
}

/// `hookline run` whose login the cluster refuses stops at start-up, at once (no retry through
/// the 60 s start-up wait), naming the keys to fix and never the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_a_refused_login_fails_at_once_naming_the_keys() {
    let node = require_cql().await;
    let (user, _) = crate::services::fixture::cql_login();
    let (ok, last, took) = hookline_run(&format!(
        "nodes = [\"{node}\"]\nusername = {user:?}\npassword = \"pw-wrong-77e1\""
    ))
    .await;
    assert!(!ok);
    assert!(
        last.starts_with("error: store: CQL nodes")
            && last.contains("refused hookline's login")
            && last.contains("store.scylla.password")
            && !last.contains("pw-wrong-77e1"),
        "unclear error: {last}"
    );
    assert!(
        took < Duration::from_secs(30),
        "a refused login fails at once, not after the 60 s start-up wait ({took:?})"
    );
}

/// `hookline run` with nodes that never answer retries for `startup_wait`, then names them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_unreachable_nodes_gives_up_after_the_startup_wait() {
    // Nothing listens on port 1 of loopback: every connection is refused at once.
    let (ok, last, took) = hookline_run("nodes = [\"127.0.0.1:1\"]\nstartup_wait = \"3s\"").await;
    assert!(!ok);
    assert!(
        last.starts_with("error: store: gave up on CQL nodes [\"127.0.0.1:1\"]")
            && last.contains("in 3s")
            && last.contains("run `hookline migrate`"),
        "unclear error: {last}"
    );
    assert!(
        took >= Duration::from_secs(3),
        "retried for the wait ({took:?})"
    );
}
