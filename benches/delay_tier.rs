//! The delay stage alone on real Kafka: a burst of parked records due close together in one tier
//! partition, forwarded back to the deliveries topic when due.
//!
//! Such bursts are what a retry wave or a stalled endpoint's parks look like. librdkafka drops a
//! paused partition's prefetched records and fetches a resumed one only when its broker thread
//! next wakes (up to a second later), so the stage reads each partition
//! [`hookline::delay_tier::READ_AHEAD`] ahead of the clock and resumes a paused one
//! [`hookline::delay_tier::RESUME_AHEAD`] before the last record it holds is due (see the
//! module doc of `hookline::delay_tier`). This bench shows how late that forwards a burst and
//! what it costs on the test broker.
//!
//! Each round: a fresh deliveries topic and one-partition tier topic; the delay stage starts
//! (`hookline run --role delay`, in process) and forwards one warm-up record; then `records`
//! park records of `body` bytes go into the tier, due `spacing` apart from `lead` after the last
//! was acknowledged. A reader on the deliveries topic takes each record's Kafka timestamp as the
//! time the stage forwarded it. Reported:
//! - records forwarded and records early (forwarded before their due time: never expected);
//! - lateness (forwarded minus due) p50 / p99 / max, and the batches the records went back in;
//! - CPU per record from the last acknowledgement to the last record read: this process
//!   (the delay stage and the reader) and a broker on this machine, with how busy the machine
//!   was. Compare rounds of one run, not runs on different days: the host's speed moves.
//!
//! By default the run has the configured tiers on `partitions` partitions each, as a
//! deployment does, so the stage's other partitions fetch while the burst's is paused;
//! `HOOKLINE_BENCH_DELAY_ONE_TIER=1` with `HOOKLINE_BENCH_PARTITIONS=1` shows a lone partition.
//!
//! Run with `cargo bench --bench delay_tier`; needs the Kafka of `tests/services up`.
//! Knobs (environment): `HOOKLINE_BENCH_KAFKA` (127.0.0.1:9092), `HOOKLINE_BENCH_DELAY_RECORDS`
//! (5000), `HOOKLINE_BENCH_DELAY_SPACING_US` (due times this many µs apart, 1000; the record's
//! due time has millisecond resolution, so below 1000 several share a millisecond),
//! `HOOKLINE_BENCH_DELAY_LEAD_MS` (3000), `HOOKLINE_BENCH_DELAY_ROUNDS` (2),
//! `HOOKLINE_BENCH_BODY` (1024), `HOOKLINE_BENCH_PARTITIONS` (each topic's, 12),
//! `HOOKLINE_BENCH_DELAY_ONE_TIER` (1: the shortest tier only), `HOOKLINE_BENCH_CLIENT`
//! (`k=v,...` librdkafka properties for every client), `HOOKLINE_BENCH_DELAY_DUMP` (a file to
//! write each record's forwarded and due times to, µs since the epoch).

use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use hookline::config::{Config, TopicsConfig};
use hookline::event_type::EventType;
use hookline::id::{EndpointId, EventId, Tenant};
use hookline::kafka::{client_config, producer_config};
use hookline::record::{DeliveryRecord, UnixMillis};
use hookline::service::{self, Role};
use hookline::stage::outgoing;
use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

mod common;
use common::{
    BROKER_WARM, CpuUse, asked_for, client_overrides, cpu_sample, cpu_use, delete_topics, env,
    load_average, local_broker_pid, percentile, process_age, wait_for_leaders,
};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Clone)]
struct Settings {
    kafka: String,
    records: u64,
    spacing: Duration,
    lead: Duration,
    rounds: u32,
    body_bytes: usize,
    partitions: u32,
    one_tier: bool,
}

impl Settings {
    fn from_env() -> Settings {
        Settings {
            kafka: env("HOOKLINE_BENCH_KAFKA", "127.0.0.1:9092".to_owned()),
            records: env("HOOKLINE_BENCH_DELAY_RECORDS", 5000u64).max(1),
            spacing: Duration::from_micros(env("HOOKLINE_BENCH_DELAY_SPACING_US", 1000u64)),
            lead: Duration::from_millis(env("HOOKLINE_BENCH_DELAY_LEAD_MS", 3000u64)),
            rounds: env("HOOKLINE_BENCH_DELAY_ROUNDS", 2u32).max(1),
            body_bytes: env("HOOKLINE_BENCH_BODY", 1024usize),
            partitions: env("HOOKLINE_BENCH_PARTITIONS", 12u32).max(1),
            one_tier: env("HOOKLINE_BENCH_DELAY_ONE_TIER", 0u8) == 1,
        }
    }
}

fn round_config(s: &Settings, run: &str) -> Config {
    let mut c = Config::dev_defaults();
    c.kafka.bootstrap_servers = s.kafka.clone();
    c.kafka.partitions = s.partitions;
    c.kafka.topics = TopicsConfig::prefixed(&format!("bench.{run}"));
    c.kafka.group_prefix = format!("bench-{run}");
    c.kafka.input_pattern = None;
    // dev_defaults' linger 0 suits the mock cluster only; on a real broker the stage's producer
    // runs with its production default.
    c.kafka.client.remove("linger.ms");
    // The configured tiers by default: the other partitions' idle fetches are part of how the
    // stage behaves (see the module doc).
    if s.one_tier {
        c.retry.tiers.truncate(1);
    }
    client_overrides(&mut c);
    c
}

/// A pause in the forwards longer than this separates two batches.
const GAP: Duration = Duration::from_millis(50);

/// A parked record `i` of round `run`, due at `due`.
fn parked(run: &str, i: u64, body: &Bytes, due: SystemTime) -> DeliveryRecord {
    DeliveryRecord::new(
        EventId::parse(format!("msg_{run}{i}")).expect("event id"),
        EndpointId::parse("ep_bench").expect("endpoint id"),
        Tenant::parse("bench").expect("tenant"),
        EventType::parse("bench.parked").expect("event type"),
        UnixMillis::from_system_time(SystemTime::now()),
        None,
        body.clone(),
    )
    .for_park(due)
}

/// Produces `records` into `topic` and waits for every acknowledgement.
async fn produce_all(producer: &FutureProducer, topic: &str, records: Vec<DeliveryRecord>) {
    let topic: std::sync::Arc<str> = std::sync::Arc::from(topic);
    let mut acks = Vec::with_capacity(records.len());
    for r in &records {
        let out = outgoing(topic.clone(), r);
        let record = FutureRecord::to(&out.topic)
            .partition(0)
            .key(&out.key)
            .headers(out.headers)
            .payload(&out.payload[..]);
        match producer.send_result(record) {
            Ok(ack) => acks.push(ack),
            Err((e, _)) => panic!("producing a parked record: {e}"),
        }
    }
    for ack in acks {
        match ack.await {
            Ok(Ok(_)) => {}
            Ok(Err((e, _))) => panic!("parked record not acknowledged: {e}"),
            Err(_) => panic!("producer dropped a parked record"),
        }
    }
}

/// Reads the deliveries topic from the start on a thread of its own until `expected` records of
/// `prefix` came back or `deadline` passed: (forwarded, due) for each, as microseconds since
/// the epoch. A forwarded record's Kafka timestamp is when the stage produced it (millisecond
/// resolution, like a due time), so the reader may read lazily and costs the broker little.
fn spawn_reader(
    config: &Config,
    prefix: String,
    expected: usize,
    deadline: Duration,
) -> std::thread::JoinHandle<Vec<(u64, u64)>> {
    let consumer: BaseConsumer =
        client_config(&config.kafka.bootstrap_servers, &config.kafka.client)
            .set("group.id", "bench-delay-reader")
            .set("enable.auto.commit", "false")
            .create()
            .expect("deliveries reader");
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..config.kafka.partitions {
        tpl.add_partition_offset(
            &config.kafka.topics.deliveries,
            i32::try_from(p).unwrap_or(i32::MAX),
            rdkafka::Offset::Beginning,
        )
        .expect("partition offset");
    }
    consumer.assign(&tpl).expect("assign the deliveries topic");
    std::thread::spawn(move || {
        let started = Instant::now();
        let mut seen = Vec::with_capacity(expected);
        while seen.len() < expected && started.elapsed() < deadline {
            let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) else {
                continue;
            };
            let Some(forwarded) = m.timestamp().to_millis() else {
                panic!("a forwarded record has no timestamp");
            };
            let read = u64::try_from(forwarded).unwrap_or(0) * 1000;
            let record = DeliveryRecord::from_message(&m).expect("a forwarded record decodes");
            if !record.event_id.as_str().starts_with(&prefix) {
                continue;
            }
            let due = record.due_at().map_or(0, micros);
            seen.push((read, due));
        }
        seen
    })
}

fn micros(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

struct Round {
    forwarded: usize,
    early: usize,
    /// Lateness p50, p99, max (µs).
    late: [u64; 3],
    /// First to last record forwarded.
    span: Duration,
    /// Groups the records went back in: runs of forwards with no gap over [`GAP`].
    batches: usize,
    cpu: Option<CpuUse>,
}

async fn round(s: &Settings, broker: Option<&str>) -> Round {
    let run = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
    let config = round_config(s, &run);
    service::prepare_topics(&config)
        .await
        .expect("create the round's topics (is `tests/services up` running?)");
    wait_for_leaders(&config).await;
    let shutdown = CancellationToken::new();
    let tasks = TaskTracker::new();
    if let Err(e) = service::start(&config, Role::Delay, &shutdown, &tasks).await {
        delete_topics(&config).await;
        panic!("the delay stage did not start: {e}");
    }
    // The burst goes to the first partition of the shortest tier. Its length does not matter:
    // the stage holds by each record's due time.
    let tiers =
        hookline::delay_tier::Tiers::new(&config.kafka.topics.retry_prefix, &config.retry.tiers);
    let tier = tiers.shortest().topic.to_string();
    let producer: FutureProducer =
        producer_config(&config.kafka.bootstrap_servers, &config.kafka.client)
            .create()
            .expect("producer");
    let body = Bytes::from(vec![b'x'; s.body_bytes]);

    // The stage's group is assigned once a record due now comes back.
    let warm = spawn_reader(&config, format!("msg_{run}w"), 1, Duration::from_secs(60));
    produce_all(
        &producer,
        &tier,
        vec![parked(&format!("{run}w"), 0, &body, SystemTime::now())],
    )
    .await;
    assert_eq!(
        warm.join().expect("reader").len(),
        1,
        "the delay stage forwarded no warm-up record within 60 s"
    );

    // The burst: due times fixed before producing, starting `lead` after an estimate of when
    // producing ends (checked below).
    let n = s.records;
    let estimate = Duration::from_millis(500) + Duration::from_micros(n * 50);
    let first_due = SystemTime::now() + estimate + s.lead;
    let records: Vec<DeliveryRecord> = (0..n)
        .map(|i| {
            let due = first_due + s.spacing * u32::try_from(i).unwrap_or(u32::MAX);
            parked(&format!("{run}b"), i, &body, due)
        })
        .collect();
    let reader = spawn_reader(
        &config,
        format!("msg_{run}b"),
        usize::try_from(n).unwrap_or(usize::MAX),
        estimate
            + s.lead
            + s.spacing * u32::try_from(n).unwrap_or(u32::MAX)
            + Duration::from_secs(60),
    );
    produce_all(&producer, &tier, records).await;
    assert!(
        SystemTime::now() < first_due,
        "producing the burst ran past its first due time; raise HOOKLINE_BENCH_DELAY_LEAD_MS"
    );
    let cpu_before = cpu_sample(broker);
    let seen = reader.join().expect("reader");
    let cpu = cpu_use(cpu_before, cpu_sample(broker), seen.len() as u64);

    shutdown.cancel();
    tasks.close();
    let _ = tokio::time::timeout(Duration::from_secs(20), tasks.wait()).await;
    delete_topics(&config).await;

    if let Ok(path) = std::env::var("HOOKLINE_BENCH_DELAY_DUMP") {
        let lines: Vec<String> = seen.iter().map(|(r, d)| format!("{r} {d}")).collect();
        std::fs::write(&path, lines.join("\n")).expect("write the dump");
    }
    let early = seen.iter().filter(|(read, due)| read < due).count();
    let mut late: Vec<u64> = seen
        .iter()
        .map(|(read, due)| read.saturating_sub(*due))
        .collect();
    late.sort_unstable();
    let mut reads: Vec<u64> = seen.iter().map(|(read, _)| *read).collect();
    reads.sort_unstable();
    let span = Duration::from_micros(reads.last().unwrap_or(&0) - reads.first().unwrap_or(&0));
    let gap = u64::try_from(GAP.as_micros()).unwrap_or(u64::MAX);
    let batches =
        usize::from(!reads.is_empty()) + reads.windows(2).filter(|w| w[1] - w[0] > gap).count();
    Round {
        forwarded: seen.len(),
        early,
        late: [
            percentile(&late, 0.5),
            percentile(&late, 0.99),
            late.last().copied().unwrap_or(0),
        ],
        span,
        batches,
        cpu,
    }
}

async fn run(s: Settings) {
    let broker = local_broker_pid(&s.kafka);
    let broker_age = broker.as_deref().and_then(process_age);
    println!();
    println!("hookline delay stage benchmark");
    println!(
        "settings: {} records of {} B in partition 0 of the shortest of {} tier topics of {} \
         partitions, due {} µs apart, first due {} ms after producing; read ahead {} ms, resume {} \
         ms ahead; idle fetch wait {} ms; load avg {}",
        s.records,
        s.body_bytes,
        if s.one_tier {
            1
        } else {
            Config::dev_defaults().retry.tiers.len()
        },
        s.partitions,
        s.spacing.as_micros(),
        s.lead.as_millis(),
        hookline::delay_tier::READ_AHEAD.as_millis(),
        hookline::delay_tier::RESUME_AHEAD.as_millis(),
        hookline::kafka::DELAY_FETCH.max_wait_ms,
        load_average()
    );
    println!(
        "| round | forwarded | early | late p50 / p99 / max (ms) | span (ms) | batches | \
         CPU µs/record: bench / broker | machine busy |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut failed = false;
    for r in 1..=s.rounds {
        let out = round(&s, broker.as_deref()).await;
        let ms = |us: u64| us as f64 / 1e3;
        println!(
            "| {r} | {} / {} | {} | {:.1} / {:.1} / {:.1} | {:.0} | {} | {} | {} |",
            out.forwarded,
            s.records,
            out.early,
            ms(out.late[0]),
            ms(out.late[1]),
            ms(out.late[2]),
            out.span.as_secs_f64() * 1e3,
            out.batches,
            out.cpu
                .map_or_else(|| "unknown (no /proc)".into(), |c| c.per_delivery(None)),
            out.cpu
                .map_or_else(|| "unknown".into(), |c| format!("{:.0}%", c.busy_pct)),
        );
        failed |= out.forwarded as u64 != s.records || out.early > 0;
    }
    println!("load avg after: {}", load_average());
    if let Some(age) = broker_age.filter(|a| *a < BROKER_WARM) {
        println!(
            "note: the broker had run for {} s only and may still be compiling its hot paths; \
             its CPU figures may not be its steady state",
            age.as_secs()
        );
    }
    // A record lost or released early is a bug, not a slow run: fail loudly.
    assert!(
        !failed,
        "a round lost records or forwarded one before its due time (see the table)"
    );
}

fn main() {
    if !asked_for("delay_tier") {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(Settings::from_env()));
    runtime.shutdown_timeout(Duration::from_secs(5));
}
