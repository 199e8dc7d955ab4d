//! Attempt-log write throughput and latency of the CQL store against the real server on
//! 127.0.0.1:9042 (`tests/services up`), at the delivery stage's concurrency (64 and 256
//! attempts in flight). Creates and drops its own keyspace.
//!
//! Then it times, one delivery after another, the store's part of a replay through the admin
//! API: the mark and claim reads, the claim (a lightweight transaction) and the mark.
//!
//! Last, a replay of a range of DLQ offsets end to end (`hookline replay`'s work): dead letters
//! written to a fresh DLQ topic on the broker at `HOOKLINE_BENCH_KAFKA` (127.0.0.1:9092, also
//! from `tests/services up`), each claimed in the store, republished to a fresh deliveries topic
//! and noted, with the in-memory store and with this CQL store, one record at a time and
//! [`WINDOW`] at once (`HOOKLINE_BENCH_REPLAY_WINDOW` sets another); `HOOKLINE_BENCH_REPLAY_RECORDS`
//! (default 2000) dead letters per replay. Then an endpoint's replay through the admin API
//! (`POST /v1/endpoints/{id}/replay`: the DLQ scanned by time, each delivery's state read and
//! claimed, [`WINDOW`] at once) of as many dead letters, with each store, against the range
//! replay's rate with `HOOKLINE_BENCH_REPLAY_WINDOW` (the same window unless that is set).
//!
//! `cargo bench --bench attempt_log`; `HOOKLINE_BENCH_SECS` (default 10) sets each run's length,
//! `HOOKLINE_BENCH_MAX_WRITES` the store's `max_concurrent_writes` (default: the config default),
//! `HOOKLINE_BENCH_CQL_USER` / `HOOKLINE_BENCH_CQL_PASSWORD` the login (default cassandra/cassandra,
//! the superuser of the test node).
//! One `record_attempt` is 3-6 CQL writes issued together: attempt row, history entry, event
//! index, the endpoint's bucket index once per endpoint and minute, the dead letter (and its
//! bucket index) for one attempt in fifty. Delivery state is derived from the attempt rows on
//! read and costs no write. Figures are per attempt; the server shares the machine's cores with
//! everything else, so compare only runs made back to back.
//!
//! The load models one delivery stage: [`ENDPOINTS`] endpoints, every event fanned out to each
//! of them, attempts taken in event order. So an event's deliveries are logged at about the same
//! time (their event-index rows share a partition), and the attempts in flight at once share a
//! handful of (endpoint, minute) history partitions, as they do in the pipeline.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use hookline::attempt::ErrorClass;
use hookline::dead_reason::DeadReason;
use hookline::id::{EndpointId, Tenant};
use hookline::kafka::{
    Producer, ProducerLog, TopicSpec, client_config, ensure_topics, producer_config,
};
use hookline::record::DeliveryRecord;
use hookline::replay::{
    EndpointReplayRequest, ReplayRequest, ReplayTarget, WINDOW, check, replay_endpoint,
};
use hookline::stage::outgoing;
use hookline::stage::produce_until_acked;
use hookline::storage::conformance::{attempt_row, dead_attempt, dead_letter, dead_letter_to};
use hookline::storage::memory::MemoryStore;
use hookline::storage::scylla::migrate::{MIGRATIONS, migrate};
use hookline::storage::scylla::{CqlPassword, ScyllaConfig, ScyllaStore, connect_session};
use hookline::storage::{AttemptOutcome, AttemptRow, DeliveryStore, ReplayMark};
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use tokio_util::sync::CancellationToken;

const CQL_ADDR: &str = "127.0.0.1:9042";
/// Endpoints of the modelled delivery stage; every event goes to each.
const ENDPOINTS: u64 = 10;

fn env_str(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The `n`th attempt: event `n / ENDPOINTS` to endpoint `n % ENDPOINTS`. A realistic mix: most
/// attempts succeed, one in ten is a 503 with a retry, one in fifty is a 404 dead letter;
/// bodies of a few hundred bytes.
fn row(n: u64) -> AttemptRow {
    let mut row = attempt_row(
        &format!("evt_b{}", n / ENDPOINTS),
        &format!("ep_b{}", n % ENDPOINTS),
        1,
    );
    row.started_at = SystemTime::now();
    row.response_body = vec![b'x'; 300];
    // Outcomes spread over endpoints (a fixed `n % 10` would make one endpoint take every retry).
    let roll = (n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % 100;
    if roll < 10 {
        row.status = Some(503);
        row.error_class = Some(ErrorClass::HttpStatus);
        row.outcome = AttemptOutcome::RetryScheduled {
            next_attempt_at: row.started_at + Duration::from_secs(30),
        };
    } else if roll < 12 {
        row.status = Some(404);
        row.error_class = Some(ErrorClass::HttpStatus);
        row.outcome = AttemptOutcome::Dead {
            reason: DeadReason::HttpStatus,
        };
    }
    row
}

async fn run(store: Arc<ScyllaStore>, concurrency: usize, length: Duration, next: Arc<AtomicU64>) {
    let deadline = Instant::now() + length;
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let store = store.clone();
            let next = next.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut errors = 0u64;
                while Instant::now() < deadline {
                    let r = row(next.fetch_add(1, Ordering::Relaxed));
                    let start = Instant::now();
                    match store.record_attempt(&r).await {
                        Ok(()) => latencies.push(start.elapsed()),
                        Err(_) => errors += 1,
                    }
                }
                (latencies, errors)
            })
        })
        .collect();
    let started = Instant::now();
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await.expect("bench task");
        all.extend(l);
        errors += e;
    }
    let elapsed = started.elapsed();
    all.sort();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    println!(
        "concurrency {concurrency:>3}: {:>7} attempts in {:>5.1}s = {:>7.0} attempts/s; latency \
         p50 {:>6.1} ms, p99 {:>6.1} ms, max {:>6.1} ms; {errors} errors",
        all.len(),
        elapsed.as_secs_f64(),
        all.len() as f64 / elapsed.as_secs_f64(),
        pct(0.50).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
        all.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
    );
}

/// What a replay through the admin API asks the store per delivery besides reading its
/// attempts, one delivery after another as an endpoint-range replay does: the mark and the claim
/// read (a serial read), the claim (a lightweight transaction) and, once the record is
/// acknowledged, the mark. `count` deliveries already logged (rows `0..count`).
async fn claims(store: &ScyllaStore, count: u64) {
    let mut steps: [Vec<Duration>; 4] = Default::default();
    let mut whole = Vec::new();
    for n in 0..count {
        let id = row(n).delivery_id;
        let mark = ReplayMark {
            delivery_id: id.clone(),
            replay_id: format!("rpl_bench_{n}"),
            at: SystemTime::now(),
        };
        let began = Instant::now();
        let mut t = Instant::now();
        let mut lap = |i: usize, t: &mut Instant| {
            steps[i].push(t.elapsed());
            *t = Instant::now();
        };
        store.replay_mark(&id).await.expect("mark read");
        lap(0, &mut t);
        let over = store.replay_claim(&id).await.expect("claim read");
        lap(1, &mut t);
        let over = over.map(|c| c.replay_id);
        assert!(
            store
                .claim_replay(&mark, over.as_deref())
                .await
                .expect("claim"),
            "nothing else claims here"
        );
        lap(2, &mut t);
        store.record_replay_mark(&mark).await.expect("mark");
        lap(3, &mut t);
        whole.push(began.elapsed());
    }
    let p = |v: &mut Vec<Duration>, q: f64| {
        v.sort();
        v.get(((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    let names = [
        "mark read",
        "claim read (serial)",
        "claim (LWT)",
        "mark write",
    ];
    for (name, v) in names.iter().zip(steps.iter_mut()) {
        println!(
            "replay, per delivery: {name:<20} p50 {:>5.2} ms, p99 {:>5.2} ms",
            p(v, 0.5),
            p(v, 0.99)
        );
    }
    println!(
        "replay, per delivery: all four, one after another: p50 {:>5.2} ms, p99 {:>5.2} ms \
         ({count} deliveries)",
        p(&mut whole, 0.5),
        p(&mut whole, 0.99)
    );
}

/// Replays of `count` dead letters each, through the broker at `HOOKLINE_BENCH_KAFKA`, with the
/// in-memory store and with `cql`, one record at a time and `window` at once. Each replay has
/// dead letters of its own, appended to the DLQ before it starts.
async fn range_replays(cql: &ScyllaStore, count: usize, window: usize) {
    let kafka = env_str("HOOKLINE_BENCH_KAFKA", "127.0.0.1:9092");
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let target = ReplayTarget {
        bootstrap: kafka.clone(),
        client: Default::default(),
        dlq: format!("hl_bench_dlq_{suffix}"),
        deliveries: format!("hl_bench_deliveries_{suffix}"),
    };
    let specs = [&target.dlq, &target.deliveries].map(|name| TopicSpec {
        name: name.clone(),
        partitions: 1,
        compacted: false,
    });
    if let Err(e) = ensure_topics(&kafka, &Default::default(), &specs, 1, 1 << 20).await {
        eprintln!("no Kafka broker for the replay runs ({e}): start it with `tests/services up`");
        std::process::exit(1);
    }
    let producer: Producer = producer_config(&kafka, &Default::default())
        .create_with_context(ProducerLog::default())
        .expect("producer");
    let memory = MemoryStore::default();
    let runs: [(&str, &dyn DeliveryStore, usize); 4] = [
        ("memory", &memory, 1),
        ("memory", &memory, window),
        ("cql", cql, 1),
        ("cql", cql, window),
    ];
    let mut rates = Vec::new();
    let mut from = 0i64;
    for (run, (store_name, store, at_once)) in runs.into_iter().enumerate() {
        let letters = (0..count).map(|n| dead_letter(&format!("evt_r{run}_{n}"), 1000));
        write_dead_letters(&producer, &target.dlq, letters.collect()).await;
        let request = ReplayRequest {
            partition: 0,
            from_offset: from,
            to_offset: from + i64::try_from(count).expect("count") - 1,
            endpoint: None,
            actor: "bench".into(),
            reason: "bench".into(),
            dry_run: false,
        };
        let began = Instant::now();
        let summary = check(&target, &request)
            .await
            .expect("the range is in the DLQ")
            .window(at_once)
            .run(store, &mut |_, _| {})
            .await
            .expect("the replay covers its range");
        let took = began.elapsed();
        assert_eq!(summary.replayed, count as u64, "{summary:?}");
        let rate = count as f64 / took.as_secs_f64();
        println!(
            "range replay, {store_name:<6} store, {at_once:>3} at once: {count} dead letters in \
             {:>6.2}s = {rate:>7.0} records/s",
            took.as_secs_f64()
        );
        rates.push(rate);
        from += i64::try_from(count).expect("count");
    }
    println!(
        "range replay, {window} at once against one at a time: memory store {:.1}x, cql store \
         {:.1}x",
        rates[1] / rates[0],
        rates[3] / rates[2]
    );
    // An endpoint's replay through the admin API: each run's dead letters are another
    // endpoint's, written after the runs above, and the scan reads from the run's own start.
    let endpoint_runs: [(&str, &dyn DeliveryStore, f64); 2] =
        [("memory", &memory, rates[1]), ("cql", cql, rates[3])];
    for (run, (store_name, store, range_rate)) in endpoint_runs.into_iter().enumerate() {
        let endpoint = EndpointId::generate();
        let letters: Vec<_> = (0..count)
            .map(|n| dead_letter_to(&format!("evt_e{run}_{n}"), &endpoint, 1000))
            .collect();
        // The attempt log holds each as dead, as the delivery stage left it.
        for letter in &letters {
            store
                .record_attempt(&dead_attempt(letter))
                .await
                .expect("the attempt log takes the dead attempt");
        }
        // Broker timestamps are in milliseconds: start the scan a little before the writes.
        let since = SystemTime::now() - Duration::from_millis(5);
        write_dead_letters(&producer, &target.dlq, letters).await;
        let request = EndpointReplayRequest {
            endpoint,
            tenant: Tenant::parse("acme").expect("tenant"),
            since,
            until: SystemTime::now() + Duration::from_secs(1),
            actor: "bench".into(),
            reason: "bench".into(),
            asked_by: None,
        };
        let began = Instant::now();
        let done = replay_endpoint(&target, store, &request)
            .await
            .expect("the endpoint's replay runs");
        let took = began.elapsed();
        assert_eq!(
            (done.replayed, done.stopped.as_deref()),
            (count as u64, None),
            "{done:?}"
        );
        let rate = count as f64 / took.as_secs_f64();
        println!(
            "endpoint replay, {store_name:<6} store, {WINDOW:>3} at once: {count} dead letters in \
             {:>6.2}s = {rate:>7.0} records/s ({:.2}x the range replay's, {window} at once)",
            took.as_secs_f64(),
            rate / range_rate
        );
    }
    let admin: AdminClient<DefaultClientContext> = client_config(&kafka, &Default::default())
        .create()
        .expect("admin client");
    let names = [target.dlq.as_str(), target.deliveries.as_str()];
    if let Err(e) = admin.delete_topics(&names, &AdminOptions::new()).await {
        eprintln!("could not delete the replay topics: {e}");
    }
}

/// Appends `letters` to the DLQ `dlq`, all at once, and waits until the broker has every one.
async fn write_dead_letters(producer: &Producer, dlq: &str, letters: Vec<DeliveryRecord>) {
    let dlq: Arc<str> = Arc::from(dlq);
    let never = CancellationToken::new();
    let writes = letters.iter().map(|letter| {
        let out = outgoing(dlq.clone(), letter);
        let never = &never;
        async move { produce_until_acked(producer, out, never).await }
    });
    let written = futures::future::join_all(writes).await;
    assert!(
        written.iter().all(|acked| *acked),
        "the DLQ took every dead letter"
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        if tokio::net::TcpStream::connect(CQL_ADDR).await.is_err() {
            eprintln!("no CQL server on {CQL_ADDR}: start it with `tests/services up`");
            std::process::exit(1);
        }
        let defaults = ScyllaConfig::default();
        let config = ScyllaConfig {
            nodes: vec![CQL_ADDR.into()],
            keyspace: format!(
                "hl_bench_{}",
                &uuid::Uuid::new_v4().simple().to_string()[..12]
            ),
            max_concurrent_writes: env_u64(
                "HOOKLINE_BENCH_MAX_WRITES",
                defaults.max_concurrent_writes as u64,
            ) as usize,
            write_timeout: Duration::from_secs(10),
            // The node of `tests/services up` asks for a login: its default superuser.
            username: Some(env_str("HOOKLINE_BENCH_CQL_USER", "cassandra")),
            password: Some(CqlPassword::new(env_str(
                "HOOKLINE_BENCH_CQL_PASSWORD",
                "cassandra",
            ))),
            ..defaults
        };
        let session = Arc::new(connect_session(&config).await.expect("connect"));
        migrate(
            &session,
            &config.keyspace,
            &config.replication().expect("replication"),
            MIGRATIONS,
        )
        .await
        .expect("migrate");
        let store = Arc::new(
            ScyllaStore::with_session(session.clone(), &config)
                .await
                .expect("store"),
        );
        // `cargo test --all-targets` runs bench binaries without `--bench`: a one-second smoke
        // run proves the bench works without spending the suite's time.
        let smoke = !std::env::args().any(|a| a == "--bench");
        let length = Duration::from_secs(if smoke {
            1
        } else {
            env_u64("HOOKLINE_BENCH_SECS", 10)
        });
        println!(
            "attempt log on {CQL_ADDR}, keyspace {}, max_concurrent_writes {}, {}s per run",
            config.keyspace,
            config.max_concurrent_writes,
            length.as_secs()
        );
        let next = Arc::new(AtomicU64::new(0));
        // Warm-up: connections, prepared statement caches, the server's JIT.
        run(store.clone(), 32, Duration::from_secs(2), next.clone()).await;
        for concurrency in [64, 256] {
            run(store.clone(), concurrency, length, next.clone()).await;
        }
        claims(&store, if smoke { 20 } else { 500 }).await;
        let records = if smoke {
            50
        } else {
            env_u64("HOOKLINE_BENCH_REPLAY_RECORDS", 2000) as usize
        };
        let window = env_u64("HOOKLINE_BENCH_REPLAY_WINDOW", WINDOW as u64) as usize;
        range_replays(&store, records, window).await;
        let drop = format!("DROP KEYSPACE IF EXISTS {}", config.keyspace);
        if let Err(e) = session.query_unpaged(drop, ()).await {
            eprintln!("could not drop {}: {e}", config.keyspace);
        }
    });
}
