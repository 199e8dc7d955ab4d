//! `hookline sign` / `hookline verify` through the built binary, checked from the outside by the
//! official Standard Webhooks verifier (Python package `standardwebhooks`, installed by
//! `tests/run`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use hookline::signing::{Ed25519SigningKey, SigningSecret};

use crate::support::hookline_bin;

const VECTOR_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const VECTOR_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const VECTOR_BODY: &str = r#"{"test": 2432232314}"#;
const VECTOR_SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

/// Exit code the script uses when the package is missing, so the test can fail with a fix.
const NOT_INSTALLED: i32 = 3;

/// `verify SECRET BODY_FILE` reads the headers from the environment and prints `ok` or exits 1;
/// `sign SECRET BODY_FILE ID` prints the signature header the reference library makes for now.
const PY_REFERENCE: &str = r#"
import os, sys
from datetime import datetime, timezone
try:
    from standardwebhooks.webhooks import Webhook, WebhookVerificationError
except ImportError as e:
    sys.stderr.write(f"cannot import standardwebhooks: {e}\n")
    sys.exit(3)
mode, secret, body_path = sys.argv[1:4]
body = open(body_path, "rb").read()
wh = Webhook(secret)
if mode == "verify":
    headers = {k: os.environ[v] for k, v in [
        ("webhook-id", "WH_ID"), ("webhook-timestamp", "WH_TS"), ("webhook-signature", "WH_SIG")]}
    try:
        wh.verify(body, headers, json_parse=False)
    except WebhookVerificationError as e:
        print(f"rejected: {e}")
        sys.exit(1)
    print("ok")
else:
    now = datetime.now(tz=timezone.utc)
    print(int(now.timestamp()))
    print(wh.sign(sys.argv[4], now, body.decode()))
"#;

fn python(args: &[&str], env: &[(&str, &str)]) -> Output {
    let out = Command::new("python3")
        .arg("-c")
        .arg(PY_REFERENCE)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("cannot run python3 ({e}); the signing tests need Python 3"));
    if out.status.code() == Some(NOT_INSTALLED) {
        panic!(
            "the official Standard Webhooks verifier is not importable ({}): run \
             `python3 -m pip install standardwebhooks==1.1.0` or `tests/run`, which installs it",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    out
}

/// Whether the reference library accepts the headers for the body in `body_file`.
fn reference_verify(secret: &str, body_file: &Path, headers: &Headers) -> Result<(), String> {
    let out = python(
        &["verify", secret, body_file.to_str().unwrap()],
        &[
            ("WH_ID", &headers.id),
            ("WH_TS", &headers.timestamp),
            ("WH_SIG", &headers.signature),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    match (out.status.success(), stdout.as_str()) {
        (true, "ok") => Ok(()),
        _ => Err(format!(
            "{stdout} {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

struct Headers {
    id: String,
    timestamp: String,
    signature: String,
}

fn hookline(args: &[&str]) -> Output {
    Command::new(hookline_bin())
        .args(args)
        .output()
        .expect("run hookline")
}

/// Runs `hookline sign` and parses its three `name: value` lines, insisting on exactly those.
fn hookline_sign(secrets: &[&str], id: &str, body_file: &Path) -> Headers {
    let mut args = vec![
        "sign",
        "--id",
        id,
        "--body-file",
        body_file.to_str().unwrap(),
    ];
    for s in secrets {
        args.extend(["--secret", s]);
    }
    let out = hookline(&args);
    assert!(
        out.status.success(),
        "hookline sign failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    let value = |line: &str, name: &str| {
        line.strip_prefix(&format!("{name}: "))
            .unwrap_or_else(|| panic!("expected {name}: in {line:?}"))
            .to_owned()
    };
    Headers {
        id: value(lines[0], "webhook-id"),
        timestamp: value(lines[1], "webhook-timestamp"),
        signature: value(lines[2], "webhook-signature"),
    }
}

/// A body file in a fresh directory: JSON with non-ASCII text and newlines, about 1 KiB, so byte
/// exactness matters.
fn body_file(name: &str, body: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hookline-it-signing-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path
}

fn sample_body() -> String {
    let filler = "x".repeat(900);
    format!(
        "{{\"id\":\"evt_1\",\"type\":\"invoice.paid\",\"timestamp\":\"2024-01-01T00:00:00Z\",\
         \"data\":{{\"note\":\"déjà vu ✓\\n\",\"pad\":\"{filler}\"}}}}\n"
    )
}

#[test]
fn reference_verifier_accepts_what_hookline_signs() {
    let secret = SigningSecret::generate().expose_whsec();
    let body = body_file("single.json", &sample_body());
    let headers = hookline_sign(&[&secret], "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", &body);
    assert_eq!(headers.id, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W");
    reference_verify(&secret, &body, &headers).unwrap();
}

#[test]
fn reference_verifier_rejects_a_tampered_body() {
    // Proves the harness can say no, so the acceptances above mean something.
    let secret = SigningSecret::generate().expose_whsec();
    let body = body_file("original.json", &sample_body());
    let headers = hookline_sign(&[&secret], "msg_tamper", &body);
    let tampered = body_file("tampered.json", &sample_body().replace("paid", "Paid"));
    let err = reference_verify(&secret, &tampered, &headers).unwrap_err();
    assert!(err.contains("No matching signature"), "{err}");
}

#[test]
fn reference_verifier_accepts_each_key_during_rotation() {
    let old = SigningSecret::generate().expose_whsec();
    let new = SigningSecret::generate().expose_whsec();
    let body = body_file("rotation.json", &sample_body());
    let headers = hookline_sign(&[&new, &old], "msg_rotation", &body);
    assert_eq!(headers.signature.split(' ').count(), 2);
    for secret in [&old, &new] {
        reference_verify(secret, &body, &headers).unwrap();
    }
    let stranger = SigningSecret::generate().expose_whsec();
    assert!(reference_verify(&stranger, &body, &headers).is_err());
}

#[test]
fn mixed_hmac_and_ed25519_headers_verify_on_both_sides() {
    let hmac = SigningSecret::generate().expose_whsec();
    let ed = Ed25519SigningKey::generate();
    let whsk = ed.expose_whsk();
    let whpk = ed.verifying_key().to_string();
    let body = body_file("mixed.json", &sample_body());
    let headers = hookline_sign(&[&hmac, &whsk], "msg_mixed", &body);
    assert!(headers.signature.contains(" v1a,"), "{}", headers.signature);
    // The reference library only knows v1 and must skip the v1a entry.
    reference_verify(&hmac, &body, &headers).unwrap();
    // hookline verifies the v1a entry with the public key alone.
    let out = hookline(&[
        "verify",
        "--secret",
        &whpk,
        "--id",
        &headers.id,
        "--timestamp",
        &headers.timestamp,
        "--signature",
        &headers.signature,
        "--body-file",
        body.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn hookline_verify_accepts_what_the_reference_library_signs() {
    let secret = SigningSecret::generate().expose_whsec();
    let body = body_file("from-python.json", &sample_body());
    let out = python(&["sign", &secret, body.to_str().unwrap(), "msg_py"], &[]);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let (timestamp, signature) = stdout.trim().split_once('\n').unwrap();
    let out = hookline(&[
        "verify",
        "--secret",
        &secret,
        "--id",
        "msg_py",
        "--timestamp",
        timestamp,
        "--signature",
        signature,
        "--body-file",
        body.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "valid\n");
}

fn verify_vector(body: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "verify",
        "--secret",
        VECTOR_SECRET,
        "--id",
        VECTOR_ID,
        "--timestamp",
        "1614265330",
        "--signature",
        VECTOR_SIG,
        "--body",
        body,
    ];
    args.extend_from_slice(extra);
    hookline(&args)
}

#[test]
fn hookline_sign_reproduces_the_test_vector() {
    let out = hookline(&[
        "sign",
        "--secret",
        VECTOR_SECRET,
        "--id",
        VECTOR_ID,
        "--timestamp",
        "1614265330",
        "--body",
        VECTOR_BODY,
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!(
            "webhook-id: {VECTOR_ID}\nwebhook-timestamp: 1614265330\nwebhook-signature: {VECTOR_SIG}\n"
        )
    );
}

#[test]
fn hookline_verify_accepts_the_test_vector_and_rejects_tampering() {
    // The vector is from 2021: only a tolerance reaching back that far accepts it.
    let wide = ["--tolerance", "2000000000"];
    let out = verify_vector(VECTOR_BODY, &wide);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "valid\n");

    let out = verify_vector(r#"{"test": 2432232315}"#, &wide);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "invalid: no signature matches any of the keys\n"
    );
    assert!(out.stdout.is_empty());

    let out = verify_vector(VECTOR_BODY, &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("invalid: timestamp is ") && stderr.contains("s old"),
        "{stderr}"
    );
}

#[test]
fn bad_secrets_exit_2_without_echoing_them() {
    let short = "whsec_MfKQ9r8GKYqrTwjUPD8I";
    let common = [
        "--secret",
        VECTOR_SECRET,
        "--secret",
        short,
        "--id",
        "msg_1",
        "--timestamp",
        "1614265330",
        "--body",
        "{}",
    ];
    for cmd in ["sign", "verify"] {
        let mut args = vec![cmd];
        args.extend(common);
        if cmd == "verify" {
            args.extend(["--signature", VECTOR_SIG]);
        }
        let out = hookline(&args);
        assert_eq!(out.status.code(), Some(2), "{cmd}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--secret #2: secret decodes to 15 bytes; at least 24 are required"),
            "{cmd}: {stderr}"
        );
        assert!(
            !stderr.contains("MfKQ9r8G"),
            "{cmd} echoed a secret: {stderr}"
        );
    }
    let out = hookline(&[
        "sign",
        "--secret",
        "hunter2hunter2",
        "--id",
        "m",
        "--body",
        "",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("must start with whsec_ or whsk_"),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

#[test]
fn sign_refuses_ids_that_break_the_header_or_the_signed_content() {
    let secret = SigningSecret::generate().expose_whsec();
    for id in ["", "msg 1", "msg.1", "msg\n1"] {
        let out = hookline(&["sign", "--secret", &secret, "--id", id, "--body", "{}"]);
        assert_eq!(out.status.code(), Some(2), "{id:?}: {out:?}");
        assert!(out.stdout.is_empty());
    }
}
