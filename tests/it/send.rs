//! `hookline send` end to end against local receivers (all on 127.0.0.1, allowed explicitly).

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::dns::DnsServer;
use crate::support::hookline_bin;
use crate::support::receiver::{Receiver, Reply};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// What one `hookline send` run produced.
pub struct Run {
    pub code: i32,
    pub json: Option<Value>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `hookline send URL --secret SECRET --body '{"a":1}' EXTRA...`.
pub async fn send(url: &str, extra: &[&str]) -> Run {
    let output = tokio::process::Command::new(hookline_bin())
        .args(["send", url, "--secret", SECRET, "--body", r#"{"a":1}"#])
        .args(extra)
        .output()
        .await
        .expect("run hookline");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines.len() <= 1, "more than one line: {stdout}");
    Run {
        code: output.status.code().unwrap_or(-1),
        json: lines
            .first()
            .map(|l| serde_json::from_str(l).expect("JSON line")),
        stdout,
        stderr,
    }
}

const LOCAL: [&str; 3] = ["--allow-cidr", "127.0.0.1/32", "--dangerous-allow-http"];

async fn outcome_of(reply: Reply) -> (Receiver, Run, Value) {
    let receiver = Receiver::fixed(reply).await;
    let run = send(&receiver.url("/hook"), &LOCAL).await;
    let json = run
        .json
        .clone()
        .unwrap_or_else(|| panic!("no JSON: {}", run.stderr));
    (receiver, run, json)
}

#[tokio::test]
async fn success_sends_the_signed_body_exactly() {
    let (receiver, run, json) = outcome_of(Reply::status(200).body("thanks")).await;
    assert_eq!(run.code, 0, "{}", run.stdout);
    assert_eq!(json["outcome"], "success");
    assert_eq!(json["status"], 200);
    assert_eq!(json["error_class"], Value::Null);
    assert_eq!(json["response_body"], "thanks");
    assert!(json["latency_ms"].is_u64());
    assert!(json.get("retry_after_ms").is_none());

    let requests = receiver.requests();
    assert_eq!(requests.len(), 1);
    let r = &requests[0];
    assert_eq!(r.method, "POST");
    assert_eq!(r.path, "/hook");
    assert_eq!(r.body, br#"{"a":1}"#);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert!(r.header("user-agent").unwrap().starts_with("hookline/"));
    assert!(r.header("webhook-id").unwrap().starts_with("msg_"));
    assert!(
        r.header("webhook-timestamp")
            .unwrap()
            .parse::<u64>()
            .is_ok()
    );
    assert!(r.header("webhook-signature").unwrap().starts_with("v1,"));
    // No decompression offered, so receivers never compress at us.
    assert_eq!(r.header("accept-encoding"), None);
}

#[tokio::test]
async fn given_id_and_every_secret_are_used() {
    let receiver = Receiver::fixed(Reply::status(204)).await;
    let run = send(
        &receiver.url("/"),
        &[
            "--id",
            "msg_fixed",
            "--secret",
            "whsec_c2Vjb25kLXNlY3JldC1ieXRlcy0zMi1ieXRlcy1sb25nISE=",
            "--allow-cidr",
            "127.0.0.1/32",
            "--dangerous-allow-http",
        ],
    )
    .await;
    assert_eq!(run.code, 0);
    let r = &receiver.requests()[0];
    assert_eq!(r.header("webhook-id"), Some("msg_fixed"));
    assert_eq!(r.header("webhook-signature").unwrap().split(' ').count(), 2);
}

#[tokio::test]
async fn url_credentials_are_sent_as_basic_authorization_not_in_the_request_line() {
    let receiver = Receiver::fixed(Reply::status(200)).await;
    let url = format!("http://ops:p%40ss@127.0.0.1:{}/hook?x=1", receiver.port());
    let run = send(&url, &LOCAL).await;
    assert_eq!(run.code, 0, "{}", run.stdout);
    let r = &receiver.requests()[0];
    assert_eq!(r.path, "/hook?x=1");
    // base64("ops:p@ss")
    assert_eq!(r.header("authorization"), Some("Basic b3BzOnBAc3M="));
    assert_eq!(
        r.header("host"),
        Some(&*format!("127.0.0.1:{}", receiver.port()))
    );
    assert!(!run.stdout.contains("p%40ss") && !run.stdout.contains("ops:"));
}

#[tokio::test]
async fn server_errors_are_retried() {
    let (_r, run, json) = outcome_of(Reply::status(500).body("boom")).await;
    assert_eq!(run.code, 1);
    assert_eq!(json["outcome"], "retry");
    assert_eq!(json["status"], 500);
    assert_eq!(json["error_class"], "http_status");
    assert_eq!(json["response_body"], "boom");
}

#[tokio::test]
async fn service_unavailable_reports_retry_after() {
    let (_r, run, json) = outcome_of(Reply::status(503).header("Retry-After", "7")).await;
    assert_eq!(run.code, 1);
    assert_eq!(json["outcome"], "retry");
    assert_eq!(json["status"], 503);
    assert_eq!(json["retry_after_ms"], 7000);
}

#[tokio::test]
async fn too_many_requests_is_retried_and_http_dates_are_understood() {
    let at = std::time::SystemTime::now() + Duration::from_secs(120);
    let (_r, run, json) =
        outcome_of(Reply::status(429).header("Retry-After", &httpdate::fmt_http_date(at))).await;
    assert_eq!(run.code, 1);
    assert_eq!(json["outcome"], "retry");
    assert_eq!(json["status"], 429);
    let ms = json["retry_after_ms"].as_u64().unwrap();
    assert!((115_000..=120_000).contains(&ms), "{ms}");
}

#[tokio::test]
async fn client_errors_are_dead() {
    for status in [400, 404, 410] {
        let (_r, run, json) = outcome_of(Reply::status(status)).await;
        assert_eq!(run.code, 1);
        assert_eq!(json["outcome"], "dead", "{status}");
        assert_eq!(json["status"], status);
        assert_eq!(json["error_class"], "http_status");
    }
}

#[tokio::test]
async fn redirects_are_dead_and_not_followed() {
    let target = Receiver::fixed(Reply::status(200)).await;
    let (_r, run, json) =
        outcome_of(Reply::status(302).header("Location", &target.url("/elsewhere"))).await;
    assert_eq!(run.code, 1);
    assert_eq!(json["outcome"], "dead");
    assert_eq!(json["status"], 302);
    assert_eq!(json["error_class"], "redirect");
    assert_eq!(target.connections(), 0);
}

#[tokio::test]
async fn a_slow_receiver_times_out() {
    let receiver = Receiver::fixed(Reply::status(200).delay(Duration::from_secs(10))).await;
    let started = Instant::now();
    let mut args = LOCAL.to_vec();
    args.extend(["--timeout", "1"]);
    let run = send(&receiver.url("/"), &args).await;
    let json = run.json.unwrap();
    assert_eq!(run.code, 1);
    assert_eq!(json["outcome"], "retry");
    assert_eq!(json["error_class"], "timeout");
    assert_eq!(json["status"], Value::Null);
    assert_eq!(json["response_body"], Value::Null);
    let latency = json["latency_ms"].as_u64().unwrap();
    assert!((1000..3000).contains(&latency), "{latency}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_huge_body_is_capped_without_downloading_it() {
    let (_r, run, json) = outcome_of(Reply::status(200).huge_body(1 << 20)).await;
    assert_eq!(run.code, 0);
    assert_eq!(json["response_body"].as_str().unwrap().len(), 4096);
}

#[tokio::test]
async fn non_utf8_bodies_are_rendered_lossily() {
    let (_r, _run, json) = outcome_of(Reply::status(400).body(&b"bad \xff\xfe"[..])).await;
    assert_eq!(json["response_body"], "bad \u{fffd}\u{fffd}");
}

#[tokio::test]
async fn refused_connections_are_connect_errors() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let run = send(&format!("http://127.0.0.1:{port}/"), &LOCAL).await;
    let json = run.json.unwrap();
    assert_eq!(run.code, 1);
    assert_eq!(json["outcome"], "retry");
    assert_eq!(json["error_class"], "connect");
}

#[tokio::test]
async fn a_failed_handshake_is_a_tls_error() {
    let receiver = Receiver::fixed(Reply::status(200)).await;
    let url = format!("https://127.0.0.1:{}/", receiver.port());
    let run = send(&url, &["--allow-cidr", "127.0.0.1/32"]).await;
    let json = run.json.unwrap();
    assert_eq!(json["error_class"], "tls", "{json}");
    assert_eq!(json["outcome"], "retry");
}

#[tokio::test]
async fn plain_http_needs_the_dangerous_switch() {
    let receiver = Receiver::fixed(Reply::status(200)).await;
    let run = send(&receiver.url("/"), &["--allow-cidr", "127.0.0.1/32"]).await;
    let json = run.json.unwrap();
    assert_eq!(run.code, 1);
    assert_eq!(json["outcome"], "dead");
    assert_eq!(json["error_class"], "insecure_scheme");
    assert_eq!(receiver.connections(), 0);
}

#[tokio::test]
async fn names_resolve_through_the_given_dns_server() {
    let receiver = Receiver::fixed(Reply::status(200)).await;
    let dns = DnsServer::start([("hooks.test", vec!["127.0.0.1".parse().unwrap()])]).await;
    let url = format!("http://hooks.test:{}/", receiver.port());
    let dns_arg = dns.addr().to_string();
    let mut args = LOCAL.to_vec();
    args.extend(["--dns-server", &dns_arg]);
    let run = send(&url, &args).await;
    assert_eq!(run.code, 0, "{}", run.stdout);
    assert_eq!(
        receiver.requests()[0].header("host"),
        Some(&*format!("hooks.test:{}", receiver.port()))
    );

    let run = send(&format!("http://missing.test:{}/", receiver.port()), &args).await;
    let json = run.json.unwrap();
    assert_eq!(json["error_class"], "dns", "{json}");
    assert_eq!(json["outcome"], "retry");
}

#[tokio::test]
async fn bad_input_is_a_usage_error() {
    for (url, extra) in [
        ("not a url", vec![]),
        ("ftp://example.com/", vec![]),
        ("https://", vec![]),
        ("https://127.0.0.1:9/", vec!["--timeout", "-1"]),
        ("https://127.0.0.1:9/", vec!["--timeout", "nan"]),
    ] {
        let run = send(url, &extra).await;
        assert_eq!(run.code, 2, "{url} {extra:?}: {}", run.stderr);
        assert!(run.stdout.is_empty());
        assert!(run.stderr.starts_with("error: "), "{}", run.stderr);
    }
    let run = send("not a url", &[]).await;
    assert!(
        run.stderr.starts_with("error: invalid URL"),
        "{}",
        run.stderr
    );

    let output = tokio::process::Command::new(hookline_bin())
        .args([
            "send",
            "https://127.0.0.1:9/",
            "--secret",
            "not base64!",
            "--body",
            "{}",
        ])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));

    let output = tokio::process::Command::new(hookline_bin())
        .args([
            "send",
            "https://127.0.0.1:9/",
            "--secret",
            SECRET,
            "--body",
            "{}",
            "--allow-cidr",
            "nope",
        ])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
}
