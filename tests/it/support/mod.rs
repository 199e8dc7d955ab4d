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

/// A `hookline run` process and the lines it writes to stderr, collected as they come.
pub struct Logged {
    /// The process.
    pub child: tokio::process::Child,
    /// Its stderr so far.
    pub log: std::sync::Arc<std::sync::Mutex<String>>,
    /// Ends once the process has closed its stderr: await it for every line.
    pub reader: tokio::task::JoinHandle<()>,
}

/// `hookline run --role all --config <config>` started with `HOOKLINE_LOG=info`, its stderr
/// collected (for a test's checks and failure messages).
pub fn run_logged(config: &std::path::Path) -> Logged {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(hookline_bin())
        .args(["run", "--role", "all", "--config"])
        .arg(config)
        .env("HOOKLINE_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start hookline run");
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let collected = log.clone();
    let reader = tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            let mut log = collected.lock().unwrap();
            log.push_str(&line);
            log.push('\n');
        }
    });
    Logged { child, log, reader }
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
