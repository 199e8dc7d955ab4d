//! `hookline dev` as a newcomer runs it: start it, create an endpoint, post an event, see the
//! signed delivery; then SIGTERM drains and exits 0.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::support::hookline_bin;
use crate::support::receiver::{Receiver, Reply};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_delivers_a_signed_event_and_drains_on_sigterm() {
    let (admin, metrics) = (free_port(), free_port());
    let token = "it_dev_token_0123456789";
    let mut child = Command::new(hookline_bin())
        .args(["dev", "--listen", &format!("127.0.0.1:{admin}")])
        .args([
            "--metrics-listen",
            &format!("127.0.0.1:{metrics}"),
            "--admin-token",
            token,
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

    // A receiver that takes a moment, so a delivery is in flight when SIGTERM arrives.
    let receiver = Receiver::fixed(Reply::status(200).delay(Duration::from_millis(1500))).await;
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{admin}");
    let created: serde_json::Value = http
        .post(format!("{base}/v1/endpoints"))
        .bearer_auth(token)
        .json(&serde_json::json!({"tenant": "acme", "url": receiver.url("/hook"), "event_types": ["order.*"]}))
        .send()
        .await
        .unwrap()
        .error_for_status()
        .expect("endpoint created")
        .json()
        .await
        .unwrap();
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
        .bearer_auth(token)
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
        .get(format!("http://127.0.0.1:{metrics}/metrics"))
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

    let pid = child.id().expect("running").to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(40), child.wait())
        .await
        .expect("exits within 40 s of SIGTERM")
        .unwrap();
    let mut stderr = String::new();
    tokio::io::AsyncReadExt::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr)
        .await
        .unwrap();
    assert!(status.success(), "exit status {status}; stderr:\n{stderr}");
    assert!(stderr.contains("stopped cleanly"), "{stderr}");
}
