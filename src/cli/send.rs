//! `hookline send`: one signed delivery attempt through the service's own [`Sender`], printed as
//! one JSON line.
//!
//! Output: `{"outcome","status","error_class","latency_ms","retry_after_ms"?,"response_body"}`.
//! - `outcome` is `success` (exit 0), `retry` or `dead` (exit 1).
//! - `retry_after_ms` is present only when the receiver sent a `Retry-After` hookline can parse
//!   (delta-seconds or an HTTP date; a past date gives 0).
//! - `response_body` is the first 4096 bytes of the body decoded as UTF-8 with invalid sequences
//!   replaced by U+FFFD (lossy: it is a diagnostic, and JSON strings cannot hold raw bytes);
//!   `null` when no response arrived.
//! - `detail` (extra, only when no response arrived) says why, e.g. which range blocked which
//!   address; it never contains the URL.
//!
//! Usage errors print `error: ...` on stderr, no JSON line, and exit 2, like clap's own flag
//! errors: an unparsable URL or one that is not http(s) with a host, an unreadable body file, a
//! secret that is not base64, a timeout that is not a positive number of seconds. A URL that is
//! well-formed but refused (`insecure_scheme`, `ssrf_blocked`) is an attempt outcome: JSON line,
//! outcome `dead`, exit 1.

use std::borrow::Cow;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue};

use super::SendArgs;
use crate::attempt::{Attempt, AttemptResult, ErrorClass};
use crate::retry_policy::{Verdict, classify, parse_retry_after};
use crate::sender::{OutboundRequest, Sender, SenderConfig, Target};
use crate::signing::{Signer, SignerKey, SigningKey};
use crate::ssrf::Policy;

const USAGE_ERROR: u8 = 2;

pub(super) fn send(args: &SendArgs) -> ExitCode {
    match prepare(args) {
        Ok((config, request)) => run(config, request),
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(USAGE_ERROR)
        }
    }
}

fn prepare(args: &SendArgs) -> Result<(SenderConfig, OutboundRequest), String> {
    let target =
        Target::parse(&args.url).map_err(|e| format!("invalid URL {:?}: {e}", args.url))?;
    let body = Bytes::from(args.body.bytes()?);
    let mut config = SenderConfig {
        allow_http: args.dangerous_allow_http,
        policy: Policy::with_allowed(args.allow_cidrs.iter().copied()),
        dns_servers: args.dns_servers.clone(),
        ..SenderConfig::default()
    };
    if let Some(secs) = args.timeout {
        config.total_timeout = Duration::try_from_secs_f64(secs)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| format!("--timeout must be a positive number of seconds, not {secs}"))?;
    }
    let id = args
        .id
        .clone()
        .unwrap_or_else(|| format!("msg_{}", uuid::Uuid::now_v7().simple()));
    let timestamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|_| "system clock is before 1970".to_owned())?
        .as_secs();
    let headers = signed_headers(&args.secrets, &id, timestamp, &body)?;
    Ok((
        config,
        OutboundRequest {
            target,
            headers,
            body,
        },
    ))
}

/// The three Standard Webhooks headers, signed with every `--secret` (key ids `cli_1`, ...).
fn signed_headers(
    secrets: &[String],
    id: &str,
    timestamp: u64,
    body: &[u8],
) -> Result<HeaderMap, String> {
    let keys = secrets
        .iter()
        .enumerate()
        .map(|(i, s)| {
            s.parse::<SigningKey>()
                .map(|key| SignerKey::new(format!("cli_{}", i + 1), key))
                .map_err(|e| format!("--secret #{}: {e}", i + 1))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let signer = Signer::new(&keys).map_err(|e| e.to_string())?;
    let mut headers = HeaderMap::new();
    for (name, value) in signer.headers(id, timestamp, body).iter() {
        let value = HeaderValue::try_from(value)
            .map_err(|_| "--id must be a valid header value".to_owned())?;
        headers.insert(name, value);
    }
    Ok(headers)
}

fn run(config: SenderConfig, request: OutboundRequest) -> ExitCode {
    let runtime = match super::runtime(super::Threads::One) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let attempt = runtime.block_on(async {
        let sender = Sender::new(config).map_err(|e| e.to_string())?;
        Ok::<_, String>(sender.send(request).await)
    });
    let attempt = match attempt {
        Ok(attempt) => attempt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (line, outcome) = report(&attempt, SystemTime::now());
    println!("{line}");
    if outcome == Outcome::Success {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Success,
    Retry,
    Dead,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Retry => "retry",
            Outcome::Dead => "dead",
        }
    }
}

fn outcome(result: &AttemptResult, now: SystemTime) -> Outcome {
    match classify(result, now) {
        Verdict::Success => Outcome::Success,
        Verdict::Retry { .. } => Outcome::Retry,
        Verdict::Dead { .. } => Outcome::Dead,
    }
}

/// The printed line, fields in the documented order.
#[derive(serde::Serialize)]
struct Line<'a> {
    outcome: &'static str,
    status: Option<u16>,
    error_class: Option<&'static str>,
    latency_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_ms: Option<u64>,
    response_body: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<&'a str>,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn report(attempt: &Attempt, now: SystemTime) -> (String, Outcome) {
    let outcome = outcome(&attempt.result, now);
    let (retry_after_ms, response_body, detail) = match &attempt.result {
        AttemptResult::Response(r) => (
            r.retry_after
                .as_deref()
                .and_then(|v| parse_retry_after(v, now))
                .map(millis),
            Some(String::from_utf8_lossy(&r.body)),
            None,
        ),
        AttemptResult::Failed { detail, .. } => (None, None, Some(detail.as_str())),
    };
    let line = Line {
        outcome: outcome.as_str(),
        status: attempt.result.status(),
        error_class: attempt.result.error_class().map(ErrorClass::as_str),
        latency_ms: millis(attempt.latency),
        retry_after_ms,
        response_body,
        detail,
    };
    let line = serde_json::to_string(&line).expect("the line always serialises");
    (line, outcome)
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::attempt::HttpResponse;

    fn response(status: u16, retry_after: Option<&str>, body: &[u8]) -> Attempt {
        Attempt {
            result: AttemptResult::Response(HttpResponse {
                status,
                retry_after: retry_after.map(str::to_owned),
                body: body.to_vec(),
            }),
            latency: Duration::from_millis(12),
        }
    }

    #[test]
    fn outcomes_follow_the_retry_table() {
        let o = |s| outcome(&response(s, None, b"").result, UNIX_EPOCH);
        assert_eq!(o(200), Outcome::Success);
        assert_eq!(o(204), Outcome::Success);
        assert_eq!(o(302), Outcome::Dead);
        assert_eq!(o(404), Outcome::Dead);
        assert_eq!(o(410), Outcome::Dead);
        assert_eq!(o(429), Outcome::Retry);
        assert_eq!(o(500), Outcome::Retry);
        assert_eq!(o(503), Outcome::Retry);
        let f = |class| {
            outcome(
                &AttemptResult::Failed {
                    class,
                    detail: String::new(),
                },
                UNIX_EPOCH,
            )
        };
        assert_eq!(f(ErrorClass::Timeout), Outcome::Retry);
        assert_eq!(f(ErrorClass::Connect), Outcome::Retry);
        assert_eq!(f(ErrorClass::Dns), Outcome::Retry);
        assert_eq!(f(ErrorClass::Tls), Outcome::Retry);
        assert_eq!(f(ErrorClass::SsrfBlocked), Outcome::Dead);
        assert_eq!(f(ErrorClass::InsecureScheme), Outcome::Dead);
    }

    #[test]
    fn report_line_shape() {
        let now = UNIX_EPOCH;
        let (line, o) = report(&response(503, Some("2"), b"busy \xff"), now);
        assert_eq!(o, Outcome::Retry);
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["status"], 503);
        assert_eq!(v["error_class"], "http_status");
        assert_eq!(v["latency_ms"], 12);
        assert_eq!(v["retry_after_ms"], 2000);
        assert_eq!(v["response_body"], "busy \u{fffd}");

        let (line, _) = report(&response(200, None, b"ok"), now);
        let v: Value = serde_json::from_str(&line).unwrap();
        assert!(v.get("retry_after_ms").is_none());
        assert_eq!(v["error_class"], Value::Null);

        let failed = Attempt {
            result: AttemptResult::Failed {
                class: ErrorClass::SsrfBlocked,
                detail: "x".into(),
            },
            latency: Duration::ZERO,
        };
        let (line, o) = report(&failed, now);
        assert_eq!(o, Outcome::Dead);
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["status"], Value::Null);
        assert_eq!(v["response_body"], Value::Null);
        assert_eq!(v["error_class"], "ssrf_blocked");
    }

    #[test]
    fn signature_matches_the_standard_webhooks_vector() {
        // The published Standard Webhooks test vector.
        let headers = signed_headers(
            &["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned()],
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        )
        .unwrap();
        assert_eq!(
            headers["webhook-signature"],
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }
}
