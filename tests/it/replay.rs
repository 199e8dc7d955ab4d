//! `hookline replay` on the command line: arguments that are wrong fail at once, naming the
//! flag, before the store or Kafka is contacted. (Replaying itself is tested in `pipeline`.)

use std::process::Output;
use std::time::Duration;

use crate::services::fixture::{Topics, require_kafka, require_kafka_controller, unique};
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
