//! Shared test support: paths to the built binary, local receivers, server fixtures.
//!
//! Everything here listens on loopback only (127.0.0.1:0); tests never send traffic elsewhere.

#![allow(dead_code)]

pub mod dns;
pub mod proxy;
pub mod receiver;

/// Path to the `hookline` binary Cargo built for these tests.
pub fn hookline_bin() -> &'static str {
    env!("CARGO_BIN_EXE_hookline")
}

/// A loopback port free a moment ago, for a `hookline` process's listeners.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `POST /v1/endpoints` with `body` on the admin API at `base`; the answer, with the secret.
pub async fn create_endpoint(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    body: serde_json::Value,
) -> serde_json::Value {
    http.post(format!("{base}/v1/endpoints"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap()
        .error_for_status()
        .expect("endpoint created")
        .json()
        .await
        .unwrap()
}

/// Sends `signal` (`-TERM`, `-INT`) to process `pid`.
pub async fn signal(pid: u32, signal: &str) {
    let sent = tokio::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .await
        .unwrap();
    assert!(sent.success(), "kill {signal} {pid}");
}
