//! `hookline replay`: on the command line, arguments that are wrong fail at once, naming the
//! flag, before the store or Kafka is contacted; a range that cannot be replayed to its end is
//! an error that says where to resume, with what was republished in the audit trail.
//! (Replaying a whole range is tested in `pipeline`.)

use std::collections::BTreeMap;
use std::process::Output;
use std::time::Duration;

use hookline::id::Tenant;
use hookline::record::DeliveryRecord;
use hookline::replay::{
    Incomplete, Progress, ReplayError, ReplayRequest, ReplaySummary, ReplayTarget, StopCause, check,
};
use hookline::storage::conformance;
use hookline::storage::memory::MemoryStore;
use hookline::storage::{AttemptRow, DeliveryStore, ReplayMark};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{DefaultProducerContext, FutureProducer};
use rdkafka::types::{RDKafkaApiKey, RDKafkaErrorCode, RDKafkaRespErr};

use crate::pipeline::harness::produce_delivery;
use crate::services::fixture::{
    Topics, kafka_config, limit_record_size, require_kafka, require_kafka_controller, unique,
};
use crate::support::hookline_bin;

/// Nothing listens here: a connection attempt would wait for its timeout (60 s for the store).
const NOWHERE: &str = "127.0.0.1:1";

/// Far below the store's 60 s start-up wait, and generous for a process that only parses.
const LOCAL_CHECK_DEADLINE: Duration = Duration::from_secs(10);

/// Runs `hookline replay` with `args` against a CQL store and a Kafka that are both unreachable.
async fn replay_without_servers(args: &[&str]) -> Output {
    replay_with_unreachable_store(args, NOWHERE, &[]).await
}

/// Runs `hookline replay` with `args`, Kafka at `kafka` and a CQL store that never answers,
/// plus the `env` settings; fails if it is still running after [`LOCAL_CHECK_DEADLINE`].
async fn replay_with_unreachable_store(args: &[&str], kafka: &str, env: &[(&str, &str)]) -> Output {
    let mut command = tokio::process::Command::new(hookline_bin());
    command
        .arg("replay")
        .args(args)
        .env("HOOKLINE_STORE__KIND", "scylla")
        .env("HOOKLINE_STORE__SCYLLA__NODES", format!(r#"["{NOWHERE}"]"#))
        .env("HOOKLINE_KAFKA__BOOTSTRAP_SERVERS", kafka)
        .env("HOOKLINE_LOG", "warn")
        .envs(env.iter().copied())
        .kill_on_drop(true);
    tokio::time::timeout(LOCAL_CHECK_DEADLINE, command.output())
        .await
        .unwrap_or_else(|_| {
            panic!("hookline replay {args:?} was still running after {LOCAL_CHECK_DEADLINE:?}: it waited for a server instead of refusing its arguments")
        })
        .expect("run hookline replay")
}

/// The arguments of a replay, each value as given; `partition` is the whole flag so that both
/// `--partition=-1` and `--partition -1` can be tried.
fn replay_args<'a>(
    partition: &[&'a str],
    from: &'a str,
    to: &'a str,
    actor: &'a str,
    reason: &'a str,
) -> Vec<&'a str> {
    let mut args = partition.to_vec();
    args.extend([
        "--from-offset",
        from,
        "--to-offset",
        to,
        "--actor",
        actor,
        "--reason",
        reason,
    ]);
    args
}

#[tokio::test]
async fn wrong_arguments_are_named_before_any_server_is_contacted() {
    let p0: &[&str] = &["--partition", "0"];
    let cases = [
        (
            replay_args(p0, "5", "1", "oncall", "fixed"),
            "error: --from-offset 5 .. --to-offset 1 is not a range (from must be >= 0 and <= to)",
        ),
        (
            replay_args(p0, "0", "1", " ", "fixed"),
            "error: --actor must not be blank",
        ),
        (
            replay_args(p0, "0", "1", "oncall", "\t"),
            "error: --reason must not be blank",
        ),
        (
            replay_args(&["--partition=-1"], "0", "1", "oncall", "fixed"),
            "invalid value '-1' for '--partition <PARTITION>': must be 0 or more",
        ),
        (
            replay_args(&["--partition", "-1"], "0", "1", "oncall", "fixed"),
            "invalid value '-1' for '--partition <PARTITION>': must be 0 or more",
        ),
        (
            replay_args(p0, "-3", "1", "oncall", "fixed"),
            "invalid value '-3' for '--from-offset <A>': must be 0 or more",
        ),
        (
            [
                replay_args(p0, "0", "1", "oncall", "fixed"),
                vec!["--endpoint", "ep one"],
            ]
            .concat(),
            "error: --endpoint: endpoint id may contain only printable ASCII without spaces",
        ),
        (
            [
                replay_args(p0, "0", "1", "oncall", "fixed"),
                vec!["--endpoint", "ep_1234"],
            ]
            .concat(),
            "error: --endpoint: ep_1234 is not an endpoint id (ep_ and 32 hex digits",
        ),
    ];
    let runs = cases.iter().map(|(args, expected)| async move {
        let out = replay_without_servers(args).await;
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{args:?} succeeded: {stderr}");
        assert!(
            stderr.contains(expected),
            "{args:?}: expected {expected:?} in:\n{stderr}"
        );
        assert!(
            !stderr.contains("CQL") && !stderr.contains("kafka"),
            "{args:?} reached a server: {stderr}"
        );
    });
    futures::future::join_all(runs).await;
}

/// Runs a replay of partition 0 with the in-memory store and Kafka at `kafka`, asserts that it
/// failed, and returns its stderr, logged as an operator sees it by default.
async fn failed_replay_of_partition_0(kafka: &str) -> String {
    let out = tokio::process::Command::new(hookline_bin())
        .arg("replay")
        .args(replay_args(
            &["--partition", "0"],
            "0",
            "1",
            "oncall",
            "fixed",
        ))
        .env("HOOKLINE_STORE__KIND", "memory")
        .env("HOOKLINE_KAFKA__BOOTSTRAP_SERVERS", kafka)
        .env_remove("HOOKLINE_LOG")
        .env_remove("RUST_LOG")
        .kill_on_drop(true)
        .output()
        .await
        .expect("run hookline replay");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{stderr}");
    stderr
}

/// A broker that does not answer is named, with what to check, instead of librdkafka's bare
/// `AllBrokersDown`; and it is said once: librdkafka's own connection errors and logs are not
/// printed ahead of it.
#[tokio::test]
async fn an_unreachable_kafka_is_named() {
    let stderr = failed_replay_of_partition_0(NOWHERE).await;
    let noise: Vec<&str> = stderr.lines().filter(|l| l.contains("rdkafka")).collect();
    assert!(
        noise.is_empty(),
        "librdkafka's lines {noise:?} in:\n{stderr}"
    );
    let expected = format!("error: no Kafka broker at {NOWHERE} answered (");
    let advice = "; check kafka.bootstrap_servers, that the brokers are up and reachable from \
                  here, and the [kafka.client] security settings";
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with(&expected) && l.ends_with(advice)),
        "expected a line starting {expected:?} and ending {advice:?} in:\n{stderr}"
    );
}

/// Pointed at the controller listener instead of a broker's, replay says what that address is
/// and what belongs in `kafka.bootstrap_servers`, not librdkafka's bare `UnsupportedFeature`.
#[tokio::test]
async fn a_controller_listener_is_named_as_not_a_broker() {
    let controller = require_kafka_controller().await;
    let stderr = failed_replay_of_partition_0(&controller).await;
    let expected =
        format!("error: {controller} answered, but not as a Kafka broker's client listener");
    assert!(
        stderr.lines().any(|l| l.starts_with(&expected)),
        "expected a line starting {expected:?} in:\n{stderr}"
    );
}

/// A partition or offset the DLQ does not have is named by Kafka before the store is opened: an
/// unreachable store (here one that never answers) does not hide it behind its start-up wait.
#[tokio::test]
async fn kafka_names_a_wrong_range_before_the_store_is_opened() {
    let kafka = require_kafka().await;
    let dlq = unique("replay_dlq");
    let topics = Topics::create(&kafka, &[&dlq], 2).await;
    let env = [("HOOKLINE_KAFKA__TOPICS__DLQ", dlq.as_str())];
    let cases = [
        (
            replay_args(&["--partition", "5"], "0", "9", "oncall", "fixed"),
            format!(
                "error: DLQ topic {dlq} has 2 partitions, 0 to 1; --partition 5 does not exist"
            ),
        ),
        (
            replay_args(&["--partition", "1"], "0", "9", "oncall", "fixed"),
            "error: dlq partition 1 holds offsets 0..0 (exclusive end)".to_owned(),
        ),
    ];
    for (args, expected) in &cases {
        let out = replay_with_unreachable_store(args, &kafka, &env).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded: {stderr}");
        assert!(
            stderr.contains(expected.as_str()),
            "{args:?}: expected {expected:?} in:\n{stderr}"
        );
    }
    topics.delete().await;
}

/// Dead letter `n` of a test DLQ, its event's data padded with `padding` bytes.
fn dead_letter(n: usize, padding: usize) -> DeliveryRecord {
    conformance::dead_letter(&format!("evt_{n}"), padding)
}

/// Writes `records` to `topic`, one acknowledged batch each.
async fn write_dlq(bootstrap: &str, topic: &str, records: &[DeliveryRecord]) {
    let producer: FutureProducer = kafka_config(bootstrap).create().expect("producer");
    for record in records {
        produce_delivery(&producer, topic, record).await;
    }
}

/// A replay of partition 0, `from..=to`, as the on-call engineer asks for it.
fn replay_of(from: i64, to: i64) -> ReplayRequest {
    ReplayRequest {
        partition: 0,
        from_offset: from,
        to_offset: to,
        endpoint: None,
        actor: "oncall".into(),
        reason: "receiver fixed".into(),
        dry_run: false,
    }
}

/// How many dead letters [`lagging_dlq`] writes.
const LAGGING_DLQ_RECORDS: i64 = 6;

/// A two-broker mock cluster whose DLQ partition 0 holds [`LAGGING_DLQ_RECORDS`] dead letters
/// and is read from a follower that has only the first few: a reader gets those and the end of
/// the partition as the follower knows it, then nothing. Returns the cluster and a replay target
/// on it.
async fn lagging_dlq() -> (MockCluster<'static, DefaultProducerContext>, ReplayTarget) {
    let mock = MockCluster::new(2).expect("mock cluster");
    let target = ReplayTarget {
        bootstrap: mock.bootstrap_servers(),
        // The mock tells read-committed consumers the leader's end of the partition even when
        // they fetch from a follower; read-uncommitted ones get the follower's own end, as a
        // real follower reports it, and reach it long before the range's end.
        client: BTreeMap::from([("isolation.level".to_owned(), "read_uncommitted".to_owned())])
            .into(),
        dlq: "hookline.dlq".into(),
        deliveries: "hookline.deliveries".into(),
    };
    mock.create_topic(&target.dlq, 1, 2).expect("DLQ topic");
    mock.create_topic(&target.deliveries, 1, 1)
        .expect("deliveries topic");
    mock.partition_leader(&target.dlq, 0, Some(1))
        .expect("DLQ leader");
    let records: Vec<DeliveryRecord> = (0..LAGGING_DLQ_RECORDS as usize)
        .map(|n| dead_letter(n, 0))
        .collect();
    write_dlq(&target.bootstrap, &target.dlq, &records).await;
    mock.partition_follower(&target.dlq, 0, 2)
        .expect("DLQ follower");
    mock.follower_watermarks(&target.dlq, 0, None, Some(LAGGING_DLQ_RECORDS / 2))
        .expect("the follower lags");
    (mock, target)
}

/// Replays all of [`lagging_dlq`]'s records, waiting up to `idle_limit` for each, reporting its
/// progress to `progress`.
async fn replay_lagging_dlq(
    target: &ReplayTarget,
    store: &MemoryStore,
    idle_limit: Duration,
    progress: &mut dyn Progress,
) -> Result<ReplaySummary, ReplayError> {
    let request = replay_of(0, LAGGING_DLQ_RECORDS - 1);
    check(target, &request)
        .await
        .expect("the range is in the partition")
        .idle_limit(idle_limit)
        .run(store, progress)
        .await
}

/// Asserts that a replay of partition 0 from offset 0 to `to` stopped short of its end, and
/// that its error, its audit entry (the only one in `store`) and the deliveries topic agree on
/// what was republished: every offset before the one the error says to resume from. Returns
/// the stop and its message.
async fn assert_stopped_and_audited(
    result: Result<ReplaySummary, ReplayError>,
    to: i64,
    target: &ReplayTarget,
    store: &MemoryStore,
) -> (Box<Incomplete>, String) {
    let stop = match result {
        Err(ReplayError::Incomplete(stop)) => stop,
        other => panic!("expected an incomplete replay, got {other:?}"),
    };
    let message = stop.to_string();
    let resume = stop.resume_from;
    assert!((0..=to).contains(&resume), "{message}");
    assert_eq!(
        u64::try_from(resume).unwrap(),
        stop.replayed - stop.replayed_past,
        "every record before the resume offset is republished: {message}"
    );
    assert!(
        message.contains(&format!(
            "run it again with --partition 0 --from-offset {resume} --to-offset {to}"
        )),
        "{message}"
    );
    let audits = store.replays(None, 10).await.expect("audit trail");
    let [audit] = &audits[..] else {
        panic!("expected one audit entry: {audits:?}")
    };
    assert_eq!(
        (audit.replay_id.as_str(), audit.count),
        (stop.replay_id.as_str(), stop.replayed),
        "{audit:?}"
    );
    let covered = if resume > 0 {
        format!("offsets 0..={}", resume - 1)
    } else {
        "no offsets".to_owned()
    };
    let past = match stop.replayed_past {
        0 => String::new(),
        1 => format!(" and 1 record after offset {resume} (under way when it stopped)"),
        n => format!(" and {n} records after offset {resume} (under way when it stopped)"),
    };
    let scope = format!(
        "{} partition 0 {covered}{past} (asked 0..={to}; incomplete, stopped before offset \
         {resume}: ",
        target.dlq
    );
    assert!(audit.scope.starts_with(&scope), "{scope:?} in {audit:?}");
    let consumer: BaseConsumer = kafka_config(&target.bootstrap).create().expect("consumer");
    let (low, high) = consumer
        .fetch_watermarks(&target.deliveries, 0, Duration::from_secs(10))
        .expect("deliveries watermarks");
    assert_eq!(
        high - low,
        i64::try_from(stop.replayed).unwrap(),
        "records republished to {}",
        target.deliveries
    );
    (stop, message)
}

/// A range whose end the reader cannot reach within its idle limit is an error, even when the
/// reader is told it has reached the end of the partition: here it reads a follower that lags
/// (as one catching up, or taking over the partition, does), which reports its own end. The
/// error says where the replay stopped and the flags that replay the rest, and the audit entry
/// counts and names what was republished, not the range asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_the_reader_cannot_finish_fails_and_says_where_to_resume() {
    let (_mock, target) = lagging_dlq().await;
    let store = MemoryStore::default();
    let result = replay_lagging_dlq(&target, &store, Duration::from_secs(2), &mut |_, _| {}).await;
    let to = LAGGING_DLQ_RECORDS - 1;
    let (stop, message) = assert_stopped_and_audited(result, to, &target, &store).await;
    assert!(matches!(stop.cause, StopCause::Idle(_)), "{message}");
    assert!(
        stop.resume_from > 0,
        "the reader got the first records: {message}"
    );
    let reached = stop.resume_from;
    assert!(
        message.starts_with(&format!(
            "replay {} of hookline.dlq partition 0 offsets 0..={to} stopped before offset \
             {reached}: no record arrived for 2s: ",
            stop.replay_id
        )),
        "{message}"
    );
    assert!(
        message.contains(&format!(
            "; it republished {reached} records from offsets 0..={}, as its audit entry records. ",
            reached - 1
        )),
        "{message}"
    );
}

/// A read that fails partway (here the broker refuses the fetch) is audited for what was
/// republished before it, and its error names the failure and where to resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_fails_partway_is_audited_and_says_where_to_resume() {
    let (mock, target) = lagging_dlq().await;
    let store = MemoryStore::default();
    let mut refuse_fetches = |done: u64, _| {
        if done == 1 {
            mock.request_errors(
                RDKafkaApiKey::Fetch,
                &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED; 100],
            );
        }
    };
    let result =
        replay_lagging_dlq(&target, &store, Duration::from_secs(5), &mut refuse_fetches).await;
    let to = LAGGING_DLQ_RECORDS - 1;
    let (stop, message) = assert_stopped_and_audited(result, to, &target, &store).await;
    let StopCause::Read { source, .. } = &stop.cause else {
        panic!("expected the read to fail: {message}")
    };
    assert_eq!(
        source.rdkafka_error_code(),
        Some(RDKafkaErrorCode::TopicAuthorizationFailed),
        "{message}"
    );
    assert!(
        message.contains(&format!(
            "stopped before offset {}: reading it from Kafka at {} failed: ",
            stop.resume_from, target.bootstrap
        )),
        "{message}"
    );
}

/// A read error that librdkafka retries by itself (the broker timed the fetch out) is waited
/// out: the replay goes on and republishes the whole range, with one audit entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_error_the_consumer_retries_does_not_stop_the_replay() {
    let mock = MockCluster::new(1).expect("mock cluster");
    let target = ReplayTarget {
        bootstrap: mock.bootstrap_servers(),
        client: BTreeMap::new().into(),
        dlq: "hookline.dlq".into(),
        deliveries: "hookline.deliveries".into(),
    };
    mock.create_topic(&target.dlq, 1, 1).expect("DLQ topic");
    mock.create_topic(&target.deliveries, 1, 1)
        .expect("deliveries topic");
    let records: Vec<DeliveryRecord> = (0..6).map(|n| dead_letter(n, 0)).collect();
    write_dlq(&target.bootstrap, &target.dlq, &records).await;
    let store = MemoryStore::default();
    let request = replay_of(0, 5);
    let checked = check(&target, &request)
        .await
        .expect("the range is in the partition");
    mock.request_errors(
        RDKafkaApiKey::Fetch,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT; 3],
    );
    let summary = checked
        .idle_limit(Duration::from_secs(20))
        .run(&store, &mut |_, _| {})
        .await
        .expect("the replay waits out the timeouts and finishes");
    assert_eq!((summary.scanned, summary.replayed), (6, 6), "{summary:?}");
    let audits = store.replays(None, 10).await.expect("audit trail");
    assert_eq!(audits.len(), 1, "{audits:?}");
    assert_eq!(audits[0].count, 6, "{audits:?}");
}

/// A replay target on the real broker at `kafka`, its DLQ and deliveries topics new, with one
/// partition each.
async fn real_topics(kafka: &str) -> (ReplayTarget, Topics) {
    let target = ReplayTarget {
        bootstrap: kafka.to_owned(),
        client: Default::default(),
        dlq: unique("replay_dlq"),
        deliveries: unique("replay_deliveries"),
    };
    let topics = Topics::create(kafka, &[&target.dlq, &target.deliveries], 1).await;
    (target, topics)
}

/// Dead letters at or above this size are refused by the deliveries topic of
/// [`a_record_the_deliveries_topic_refuses_stops_the_replay_there`].
const REFUSED_SIZE: u32 = 4096;

/// A record the deliveries topic refuses stops the replay at its offset, at once: the records
/// before it are republished and audited, and the error names the offset, the refusal and the
/// flags that resume there. Only the real broker refuses a topic's records by size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_the_deliveries_topic_refuses_stops_the_replay_there() {
    let kafka = require_kafka().await;
    let (target, topics) = real_topics(&kafka).await;
    limit_record_size(&kafka, &target.deliveries, REFUSED_SIZE).await;
    let too_large = 2 * REFUSED_SIZE as usize;
    let records = [
        dead_letter(0, 0),
        dead_letter(1, 0),
        dead_letter(2, too_large),
        dead_letter(3, 0),
    ];
    write_dlq(&kafka, &target.dlq, &records).await;
    let store = MemoryStore::default();
    let request = replay_of(0, 3);
    let result = check(&target, &request)
        .await
        .expect("the range is in the partition")
        .publish_deadline(Duration::from_secs(3))
        .run(&store, &mut |_, _| {})
        .await;
    let (stop, message) = assert_stopped_and_audited(result, 3, &target, &store).await;
    // Refused for good: the replay stops at once rather than at its publish deadline.
    assert!(matches!(stop.cause, StopCause::Refused { .. }), "{message}");
    assert_eq!(stop.resume_from, 2, "{message}");
    // Offset 3 went out if it was sent beside it (on its own: the refusal did not take it down).
    assert!(stop.replayed_past <= 1, "{message}");
    assert!(
        message.contains(&format!(
            "stopped before offset 2: {} refused offset 2 (",
            target.deliveries
        )),
        "{message}"
    );
    assert!(
        message.contains("and would refuse it again; nothing was written for it"),
        "{message}"
    );
    topics.delete().await;
}

/// A range replay leaves a delivery to another replay that is sending it at that moment: one
/// that republished it and whose attempt is not logged yet, one that claimed it and has not
/// republished it yet. It claims and republishes the rest, a delivery whose earlier replay has
/// been attempted included, so that two replays at once send each delivery once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_replay_leaves_deliveries_another_replay_is_sending() {
    let kafka = require_kafka().await;
    let (target, topics) = real_topics(&kafka).await;
    let records: Vec<DeliveryRecord> = (0..4).map(|n| dead_letter(n, 0)).collect();
    write_dlq(&kafka, &target.dlq, &records).await;
    let store = MemoryStore::default();
    // The store holds each delivery, dead.
    for r in &records {
        store.record_attempt(&dead_row(r, None)).await.unwrap();
    }
    let now = std::time::SystemTime::now();
    let mark = |n: usize, replay: &str| ReplayMark {
        delivery_id: records[n].delivery_id.clone(),
        replay_id: replay.into(),
        at: now,
    };
    // 1: republished by rpl_sent, not attempted yet. 2: claimed by rpl_claimed, not sent yet.
    // 3: replayed by rpl_done, whose attempt is logged: that replay is over.
    store
        .record_replay_mark(&mark(1, "rpl_sent"))
        .await
        .unwrap();
    assert!(
        store
            .claim_replay(&mark(2, "rpl_claimed"), None)
            .await
            .unwrap()
    );
    store
        .record_replay_mark(&mark(3, "rpl_done"))
        .await
        .unwrap();
    let done = dead_row(&records[3], Some("rpl_done"));
    store.record_attempt(&done).await.unwrap();

    let request = replay_of(0, 3);
    let summary = check(&target, &request)
        .await
        .expect("the range is in the partition")
        .run(&store, &mut |_, _| {})
        .await
        .expect("the replay covers the range");
    assert_eq!(
        (
            summary.scanned,
            summary.replayed,
            summary.skipped_being_replayed
        ),
        (4, 2, 2),
        "{summary:?}"
    );
    // All of the range was acme's: its audit entry is acme's to read.
    let acme = Tenant::parse("acme").unwrap();
    let seen = store.replays(Some(&acme), 10).await.unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].replay_id, summary.replay_id);
    for n in [0, 3] {
        let claim = store.replay_claim(&records[n].delivery_id).await.unwrap();
        assert_eq!(
            claim.map(|c| c.replay_id),
            Some(summary.replay_id.clone()),
            "delivery {n} was claimed by the range"
        );
    }
    assert_eq!(
        store
            .replay_claim(&records[2].delivery_id)
            .await
            .unwrap()
            .map(|c| c.replay_id),
        Some("rpl_claimed".into()),
        "the other replay keeps its claim"
    );
    // What reached the deliveries topic: deliveries 0 and 3, as this replay.
    let consumer: BaseConsumer = kafka_config(&kafka)
        .set("group.id", unique("replay_check"))
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("consumer");
    consumer
        .subscribe(&[&target.deliveries])
        .expect("subscribe");
    let mut sent = vec![];
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while sent.len() < 2 && std::time::Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            let r = DeliveryRecord::from_message(&m).expect("a delivery record");
            assert_eq!(r.replay_id.as_deref(), Some(summary.replay_id.as_str()));
            sent.push(r.delivery_id);
        }
    }
    sent.sort();
    let mut expected = vec![
        records[0].delivery_id.clone(),
        records[3].delivery_id.clone(),
    ];
    expected.sort();
    assert_eq!(sent, expected);
    topics.delete().await;
}

/// An attempt of `record`'s delivery (of replay `replay`, if given) that dead-lettered it.
fn dead_row(record: &DeliveryRecord, replay: Option<&str>) -> AttemptRow {
    let mut row = conformance::dead_attempt(record);
    row.replay_id = replay.map(str::to_owned);
    row
}
