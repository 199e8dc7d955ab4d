//! Liveness and readiness.
//!
//! `GET /v1/health` answers 200 whenever the process serves HTTP (liveness: a restart would not
//! help otherwise). `GET /v1/health/ready` answers 200 only when Kafka is reachable (a flag the
//! Kafka clients' owner keeps current through [`AdminState::kafka_ready`]) and the endpoint view
//! has read its start-up backlog; otherwise 503 naming the failing checks, so the load balancer
//! stops sending writes this instance cannot confirm. Neither needs a token: probes have none,
//! and the answers reveal nothing about tenants. Neither counts against the API's concurrency
//! limit ([`super::MAX_CONCURRENT_REQUESTS`]): ingest requests waiting on an unreachable Kafka
//! can take every permit, and a liveness probe answered 503 then would restart the pod.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::AdminState;

/// `GET /v1/health` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Live {
    /// Always `ok`.
    pub status: String,
}

/// One readiness check's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    /// `kafka` or `endpoint_view`.
    pub name: String,
    /// Whether it passes.
    pub ok: bool,
    /// What is wrong, when it fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// `GET /v1/health/ready` answer. On 503 it also carries `code` and `detail`, as every error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ready {
    /// `ready` or `not_ready`.
    pub status: String,
    /// `unavailable` when not ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Which checks failed, when not ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Every check.
    pub checks: Vec<Check>,
}

/// `GET /v1/health`.
pub async fn live() -> Json<Live> {
    Json(Live {
        status: "ok".into(),
    })
}

/// The readiness checks, evaluated now.
pub fn checks(state: &AdminState) -> Vec<Check> {
    let kafka = *state.kafka_ready.borrow();
    let view = state.endpoints.view().status().caught_up;
    let opened = state.endpoints.view().check_opened();
    vec![
        Check {
            name: "kafka".into(),
            ok: kafka,
            detail: (!kafka).then(|| "kafka is not reachable".into()),
        },
        Check {
            name: "endpoint_view".into(),
            ok: view,
            detail: (!view).then(|| "the endpoint view has not caught up yet".into()),
        },
        Check {
            name: "endpoint_records".into(),
            ok: opened.is_ok(),
            detail: opened.err().map(|e| e.to_string()),
        },
    ]
}

/// `GET /v1/health/ready`.
pub async fn ready(State(state): State<AdminState>) -> (StatusCode, Json<Ready>) {
    let checks = checks(&state);
    let failing: Vec<&str> = checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| c.name.as_str())
        .collect();
    if failing.is_empty() {
        return (
            StatusCode::OK,
            Json(Ready {
                status: "ready".into(),
                code: None,
                detail: None,
                checks,
            }),
        );
    }
    let detail = format!("not ready: {} failing", failing.join(", "));
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(Ready {
            status: "not_ready".into(),
            code: Some("unavailable".into()),
            detail: Some(detail),
            checks,
        }),
    )
}
