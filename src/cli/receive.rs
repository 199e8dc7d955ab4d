//! `hookline receive`: a small webhook receiver for trying hookline out. It prints every request
//! it gets, checks its Standard Webhooks signature when given the endpoint's secret, and answers
//! with a chosen status.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use clap::Args;

use crate::signing::{VerificationKey, Verifier, unix_now};

/// `hookline receive`.
#[derive(Debug, Args)]
pub struct ReceiveArgs {
    /// Where to listen.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9000")]
    pub listen: SocketAddr,
    /// The endpoint's secret (`whsec_...` or `whpk_...`); signatures are checked when given.
    #[arg(long = "secret", value_name = "S")]
    pub secrets: Vec<String>,
    /// The status to answer with (e.g. 503 to watch retries, 410 to watch a disable).
    #[arg(long, default_value_t = 200)]
    pub status: u16,
}

struct Receiver {
    verifier: Option<Verifier>,
    status: StatusCode,
}

async fn receive(State(r): State<Arc<Receiver>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let h = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
    };
    let check = match &r.verifier {
        None => "not checked (no --secret)".to_owned(),
        Some(v) => match v.verify_lookup(
            |name| headers.get(name).and_then(|v| v.to_str().ok()),
            &body,
            unix_now(),
        ) {
            Ok(()) => "valid".to_owned(),
            Err(e) => format!("INVALID: {e}"),
        },
    };
    println!(
        "webhook-id={} attempt={} replay={} signature: {check}\n  {}",
        h("webhook-id"),
        h("hookline-attempt"),
        h("hookline-replay-id"),
        String::from_utf8_lossy(&body)
    );
    r.status
}

pub(super) fn run(args: &ReceiveArgs) -> ExitCode {
    let keys = match args
        .secrets
        .iter()
        .enumerate()
        .map(|(i, s)| {
            s.parse::<VerificationKey>()
                .map_err(|e| format!("--secret #{}: {e}", i + 1))
        })
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(k) => k,
        Err(e) => return super::serve::fail(e),
    };
    let Ok(status) = StatusCode::from_u16(args.status) else {
        return super::serve::fail(format!("--status {} is not an HTTP status", args.status));
    };
    let state = Arc::new(Receiver {
        verifier: (!keys.is_empty()).then(|| Verifier::new(&keys)),
        status,
    });
    let rt = match super::runtime(super::Threads::One) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let listen = args.listen;
    let result = rt.block_on(async move {
        let listener = crate::listen::listen(listen)?;
        println!("receiving webhooks on http://{listen}/ (answering {status}); Ctrl-C stops");
        let app = axum::Router::new().fallback(receive).with_state(state);
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => super::serve::fail(format!("listening on {listen}: {e}")),
    }
}
