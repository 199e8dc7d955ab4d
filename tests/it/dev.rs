//! `hookline dev` as a newcomer runs it: start it, create an endpoint, post an event, see the
//! signed delivery; then SIGTERM drains and exits 0.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use crate::support::receiver::{Receiver, Reply};
use crate::support::{create_endpoint, free_port, hookline_bin, signal};

/// The operator token the tests give `hookline dev`.
const TOKEN: &str = "it_dev_token_0123456789";

/// A running `hookline dev` and a client for its admin API.
struct Dev {
    child: Child,
    /// Kept open: closing the pipe would fail dev's later prints.
    _stdout: Lines<BufReader<ChildStdout>>,
    http: reqwest::Client,
    /// The admin API, `http://127.0.0.1:<port>`.
    base: String,
    /// The metrics listener's port.
    metrics: u16,
}

impl Dev {
    /// Starts `hookline dev` on free ports with [`TOKEN`] and waits until it says it is running.
    async fn start() -> Dev {
        let (admin, metrics) = (free_port(), free_port());
        let mut child = Command::new(hookline_bin())
            .args(["dev", "--listen", &format!("127.0.0.1:{admin}")])
            .args([
                "--metrics-listen",
                &format!("127.0.0.1:{metrics}"),
                "--admin-token",
                TOKEN,
            ])
            .env("HOOKLINE_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start hookline dev");
        let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = stdout.next_line().await.unwrap() {
                if line.contains("hookline dev is running") {
                    return;
                }
            }
            panic!("hookline dev exited before it was running");
        })
        .await
        .expect("hookline dev is running within 60 s");
        Dev {
            child,
            _stdout: stdout,
            http: reqwest::Client::new(),
            base: format!("http://127.0.0.1:{admin}"),
            metrics,
        }
    }

    /// Registers an endpoint of tenant `acme` for `order.*` at `url`; the answer, with its
    /// secret.
    async fn create_endpoint(&self, url: &str) -> serde_json::Value {
        create_endpoint(
            &self.http,
            &self.base,
            TOKEN,
            serde_json::json!({"tenant": "acme", "url": url, "event_types": ["order.*"]}),
        )
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_delivers_a_signed_event_and_drains_on_sigterm() {
    let mut dev = Dev::start().await;
    let (http, base) = (&dev.http, &dev.base);

    // A receiver that takes a moment, so a delivery is in flight when SIGTERM arrives.
    let receiver = Receiver::fixed(Reply::status(200).delay(Duration::from_millis(1500))).await;
    let created = dev.create_endpoint(&receiver.url("/hook")).await;
    let secret = created["secret"]
        .as_str()
        .expect("secret shown at creation")
        .to_owned();
    let unauthorised = http
        .post(format!("{base}/v1/events"))
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthorised.status(), 401);
    let accepted = http
        .post(format!("{base}/v1/events"))
        .bearer_auth(TOKEN)
        .json(&serde_json::json!({"tenant": "acme", "type": "order.created", "payload": {"order": 42}}))
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status(), 202);
    let id = accepted.json::<serde_json::Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();

    let got = receiver.wait_for(1, Duration::from_secs(60)).await;
    assert_eq!(crate::pipeline::verify_request(&got[0], &secret), id);
    let metrics_text = http
        .get(format!("http://127.0.0.1:{}/metrics", dev.metrics))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics_text.contains("hookline_deliveries_created_total 1"),
        "{metrics_text}"
    );

    signal(dev.child.id().expect("running"), "-TERM").await;
    let status = tokio::time::timeout(Duration::from_secs(40), dev.child.wait())
        .await
        .expect("exits within 40 s of SIGTERM")
        .unwrap();
    let mut stderr = String::new();
    tokio::io::AsyncReadExt::read_to_string(dev.child.stderr.as_mut().unwrap(), &mut stderr)
        .await
        .unwrap();
    assert!(status.success(), "exit status {status}; stderr:\n{stderr}");
    assert!(stderr.contains("stopped cleanly"), "{stderr}");
}

/// Runs `hookline` to its end with `args` and `env`, returning (exit code, stderr).
async fn run_to_end(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        Command::new(hookline_bin())
            .args(args)
            .envs(env.iter().copied())
            .env("HOOKLINE_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("exits within 30 s")
    .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn config_errors_from_run_and_dev_never_show_a_token() {
    let path = std::env::temp_dir().join(format!("hookline-it-{}.toml", std::process::id()));
    std::fs::write(
        &path,
        "[admin.tenant_tokens]\n\"supersecret_tenant_token_456\" = \"\"\n",
    )
    .unwrap();
    let shown = path.display().to_string();
    let path = shown.as_str();
    for command in ["run", "dev"] {
        let (code, stderr) = run_to_end(&[command, "--config", path], &[]).await;
        assert_eq!(code, Some(1), "{command}: {stderr}");
        assert_eq!(
            stderr,
            format!(
                "error: admin.tenant_tokens (a token) is wrong: tenant must not be empty (set by \
                 {path})\n"
            )
        );
        // The environment is read with the file, by both commands.
        let (code, stderr) = run_to_end(
            &[command, "--config", "/dev/null"],
            &[(
                "HOOKLINE_ADMIN__OPERATOR_TOKENS",
                "supersecret_operator_token_123",
            )],
        )
        .await;
        assert_eq!(code, Some(1), "{command}: {stderr}");
        assert_eq!(
            stderr,
            "error: admin.operator_tokens is wrong: expected a list of tokens, got a string \
             (value not shown: it is a secret) (set by HOOKLINE_ADMIN__OPERATOR_TOKENS)\n"
        );
    }
    std::fs::remove_file(path).unwrap();
}

#[tokio::test]
async fn dev_reports_an_address_in_use_first_and_alone() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap().to_string();
    let free = format!("127.0.0.1:{}", free_port());
    for (admin, metrics, want) in [
        (
            taken_addr.as_str(),
            free.as_str(),
            format!("error: admin API on {taken_addr}: Address already in use"),
        ),
        (
            free.as_str(),
            taken_addr.as_str(),
            format!("error: metrics listener on {taken_addr}:"),
        ),
        (
            free.as_str(),
            free.as_str(),
            format!("error: metrics.listen = \"{free}\" is the same address as admin.listen"),
        ),
    ] {
        let (code, stderr) = run_to_end(
            &["dev", "--listen", admin, "--metrics-listen", metrics],
            &[],
        )
        .await;
        assert_eq!(code, Some(1), "{stderr}");
        assert!(stderr.starts_with(&want), "want {want:?}, got:\n{stderr}");
        assert_eq!(stderr.lines().count(), 1, "one line only:\n{stderr}");
        assert!(!stderr.contains('\x1b'), "no colours in a pipe:\n{stderr}");
    }
    let (code, stderr) = run_to_end(&["dev", "--admin-token", "x"], &[]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(
        stderr,
        "error: --admin-token must be 16 to 1024 characters (got 1)\n"
    );
}

/// Runs `hookline run --role all` with Kafka at `bootstrap` (free admin and metrics ports, a
/// master key), expects exit status 1, and returns stderr, checked for the master key.
async fn run_failing_against(bootstrap: &str) -> String {
    let (admin, metrics) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let (code, stderr) = run_to_end(
        &["run", "--config", "/dev/null", "--role", "all"],
        &[
            ("HOOKLINE_KAFKA__BOOTSTRAP_SERVERS", bootstrap),
            ("HOOKLINE_ADMIN__LISTEN", admin.as_str()),
            ("HOOKLINE_METRICS__LISTEN", metrics.as_str()),
            (
                "HOOKLINE_SECURITY__MASTER_KEY",
                "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
            ),
        ],
    )
    .await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        !stderr.contains("AAAAAAAA"),
        "the master key is a secret:\n{stderr}"
    );
    stderr
}

/// `run` pointed at a port where no broker listens says which address it tried and what to
/// check, and exits 1 (well within `run_to_end`'s 30 s: the topic creation alone used to wait
/// that long before failing).
#[tokio::test]
async fn run_without_a_broker_names_the_bootstrap_and_exits() {
    let nobody = format!("127.0.0.1:{}", free_port());
    let stderr = run_failing_against(&nobody).await;
    let want = format!(
        "error: no Kafka broker at {nobody} answered within 10 s; check \
         kafka.bootstrap_servers"
    );
    assert!(stderr.contains(&want), "want {want:?}, got:\n{stderr}");
}

/// `run` given the test broker's controller listener says that address is no broker's client
/// listener, as `replay` does.
#[tokio::test]
async fn run_given_a_controller_listener_names_it() {
    let controller = crate::services::fixture::require_kafka_controller().await;
    let stderr = run_failing_against(&controller).await;
    let want = format!("error: {controller} answered, but not as a Kafka broker's client listener");
    assert!(stderr.contains(&want), "want {want:?}, got:\n{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_ends_the_drain_at_once() {
    let mut dev = Dev::start().await;

    // A receiver slower than the HTTP timeout, so the drain would take the whole deadline.
    let receiver = Receiver::fixed(Reply::status(200).delay(Duration::from_secs(60))).await;
    dev.create_endpoint(&receiver.url("/hook")).await;
    dev.http
        .post(format!("{}/v1/events", dev.base))
        .bearer_auth(TOKEN)
        .json(&serde_json::json!({"tenant": "acme", "type": "order.created", "payload": {}}))
        .send()
        .await
        .unwrap()
        .error_for_status()
        .expect("event accepted");
    receiver.wait_for(1, Duration::from_secs(60)).await;

    let pid = dev.child.id().expect("running");
    signal(pid, "-TERM").await;
    let mut stderr = BufReader::new(dev.child.stderr.take().unwrap()).lines();
    let mut log = String::new();
    tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(line) = stderr.next_line().await.unwrap() {
            log.push_str(&line);
            log.push('\n');
            if line.contains("shutting down") {
                return;
            }
        }
    })
    .await
    .expect("the first signal is logged");
    assert!(
        log.contains("waiting up to 25s for 1 in-flight attempts"),
        "{log}"
    );
    signal(pid, "-INT").await;
    let status = tokio::time::timeout(Duration::from_secs(5), dev.child.wait())
        .await
        .expect("exits at once after the second signal")
        .unwrap();
    while let Some(line) = stderr.next_line().await.unwrap() {
        log.push_str(&line);
        log.push('\n');
    }
    assert_eq!(status.code(), Some(130), "{log}");
    assert!(
        log.contains(
            "second signal: exiting without draining; records not yet committed will be \
             delivered again"
        ),
        "{log}"
    );
}
