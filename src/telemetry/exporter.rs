//! The Prometheus exporter: the recorder with its buckets, the scrape listener, and every
//! metric described and registered at zero before the first scrape.

use std::net::SocketAddr;
use std::time::Duration;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder};

use super::handle::{Hot, error_class_labels};
use super::name;
use super::{CONSUMER_STAGES, ParkReason};
use crate::dead_reason::DeadReason;

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0,
    300.0, 3600.0,
];

/// Buckets of [`name::RUNTIME_BUSY`]: how many seconds the runtime was at most half, three
/// quarters, ... busy.
const BUSY_BUCKETS: &[f64] = &[0.25, 0.5, 0.75, 0.9, 0.95, 1.0];

/// The exporter as every recorder of hookline's is built: durations and the busy ratio as
/// histograms with buckets (a histogram without them would be rendered as a summary).
fn exporter() -> Result<PrometheusBuilder, BuildError> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(name::RUNTIME_BUSY.into()), BUSY_BUCKETS)
}

/// Why the metrics listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The address could not be bound (in use, say).
    #[error("{0}")]
    Bind(#[from] std::io::Error),
    /// The recorder could not be built or installed.
    #[error("{0}")]
    Recorder(#[from] BuildError),
}

/// How often the recorder drains what histograms gathered, as the exporter's own listener
/// would.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Installs the global Prometheus recorder, describes every metric, and serves them at every
/// path of `listen` but `/health` (which answers `OK`), as the exporter's own listener does.
/// The listener is bound as the admin API's is ([`crate::listen::listen`]): a scrape during a
/// burst of connections waits in the queue. Call it within the tokio runtime; the listener
/// lives as long as the runtime.
pub fn install(listen: SocketAddr) -> Result<(), InstallError> {
    let listener = crate::listen::listen(listen)?;
    let handle = exporter()?.install_recorder()?;
    // Only now is the global recorder the one handles register with.
    Hot::install();
    describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(UPKEEP_EVERY).await;
            upkeep.run_upkeep();
        }
    });
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, scrape_router(handle)).await {
            tracing::error!(error = %e, "metrics listener stopped");
        }
    });
    Ok(())
}

/// The metrics listener's routes: `/health`, and the metrics in Prometheus' text format at
/// every other path.
fn scrape_router(handle: metrics_exporter_prometheus::PrometheusHandle) -> axum::Router {
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    axum::Router::new()
        .route("/health", axum::routing::get(|| async { "OK" }))
        .fallback(move || {
            let handle = handle.clone();
            async move {
                // Rendering walks every series: off the runtime's workers.
                match tokio::task::spawn_blocking(move || handle.render()).await {
                    Ok(text) => (
                        [(
                            header::CONTENT_TYPE,
                            "text/plain; version=0.0.4; charset=utf-8",
                        )],
                        text,
                    )
                        .into_response(),
                    Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
                }
            }
        })
}

fn describe() {
    use name::*;
    describe_counter!(DELIVERIES, "Deliveries finished, by outcome.");
    describe_counter!(ATTEMPTS, "HTTP attempts, by error class (none for 2xx).");
    describe_histogram!(
        ATTEMPT_DURATION,
        metrics::Unit::Seconds,
        "HTTP attempt latency."
    );
    describe_histogram!(
        EVENT_TO_DELIVERY,
        metrics::Unit::Seconds,
        "Time from the event to its successful delivery."
    );
    describe_counter!(RETRIES_SCHEDULED, "Retries scheduled, by delay tier.");
    describe_counter!(DEAD_LETTERS, "Records written to the DLQ, by reason.");
    describe_counter!(BREAKER_OPENS, "Circuit breakers that opened.");
    describe_gauge!(BREAKERS_OPEN, "Circuit breakers open now.");
    describe_counter!(PARKED, "Records parked in a delay tier, by reason.");
    describe_gauge!(IN_FLIGHT, "HTTP attempts in flight.");
    describe_gauge!(CONSUMER_LAG, "Consumer lag in records, by stage.");
    describe_counter!(
        INVALID_RECORDS,
        "Input records sent to the invalid topic, by reason."
    );
    describe_counter!(EVENTS_FANNED_OUT, "Events fanned out.");
    describe_counter!(
        EVENTS_REPEATED,
        "Events dropped as repeats of one fanned out within the dedupe window."
    );
    describe_counter!(
        DELIVERIES_CREATED,
        "Delivery records produced by the fan-out."
    );
    describe_counter!(ENDPOINTS_DISABLED, "Endpoints disabled after a 410 Gone.");
    describe_counter!(REPLAYED, "Records replayed from the DLQ.");
    describe_counter!(
        REPLAY_MARKS_FAILED,
        "Replayed records whose replay mark the delivery store did not take."
    );
    describe_counter!(
        STORE_ERRORS,
        "Store calls made before settling a record that failed and were retried."
    );
    describe_histogram!(
        STORE_WRITE_DURATION,
        metrics::Unit::Seconds,
        "Time until an attempt's row is durable in the attempt log, retries included."
    );
    describe_counter!(
        PRODUCE_RETRIES,
        "Records the broker did not acknowledge, produced again (unsettled meanwhile)."
    );
    describe_counter!(
        CONSUMER_ERRORS,
        "Errors a stage's consumer returned in place of a record, by stage."
    );
    describe_histogram!(
        RUNTIME_LAG,
        metrics::Unit::Seconds,
        "How late the runtime woke a task due every 10 ms (time tasks wait for a worker)."
    );
    describe_counter!(
        STORE_TLS_REREADS,
        "CQL TLS files read again after a change, by file and outcome (refused: the files \
         read before stay in use)."
    );
    describe_gauge!(
        STORE_TLS_CERT_EXPIRY,
        metrics::Unit::Seconds,
        "When the CQL client certificate in use expires (Unix time)."
    );
    describe_gauge!(
        STORE_TLS_REFUSED,
        "1 while a CQL TLS file changed into something unusable and the one read before is in use."
    );
    describe_histogram!(
        RUNTIME_BUSY,
        "Share of each second the runtime's workers spent running tasks, over all of them."
    );
}

/// Registers every counter series (each label value of its fixed set, `tiers` for the retry
/// tiers, `invalid_reasons` for the kinds of invalid input) and the breaker and in-flight
/// gauges at zero, so that the first scrape already shows
/// them: a series that appears only at its first occurrence reads as "no data" on a dashboard,
/// and `increase()` over a window that contains its birth misses that first count.
pub fn register_series<'a>(
    tiers: impl IntoIterator<Item = &'a str>,
    invalid_reasons: impl IntoIterator<Item = &'static str>,
) {
    use name::*;
    for outcome in ["success", "retry", "dead"] {
        counter!(DELIVERIES, "outcome" => outcome).increment(0);
    }
    for class in error_class_labels() {
        counter!(ATTEMPTS, "error_class" => class).increment(0);
    }
    for tier in tiers {
        counter!(RETRIES_SCHEDULED, "tier" => tier.to_owned()).increment(0);
    }
    for reason in DeadReason::all() {
        counter!(DEAD_LETTERS, "reason" => reason.as_str()).increment(0);
    }
    for reason in ParkReason::all() {
        counter!(PARKED, "reason" => reason.as_str()).increment(0);
    }
    for reason in invalid_reasons {
        counter!(INVALID_RECORDS, "reason" => reason).increment(0);
    }
    for plain in [
        BREAKER_OPENS,
        EVENTS_FANNED_OUT,
        EVENTS_REPEATED,
        DELIVERIES_CREATED,
        ENDPOINTS_DISABLED,
        REPLAYED,
        REPLAY_MARKS_FAILED,
        STORE_ERRORS,
        PRODUCE_RETRIES,
    ] {
        counter!(plain).increment(0);
    }
    for stage in CONSUMER_STAGES {
        counter!(CONSUMER_ERRORS, "stage" => stage).increment(0);
    }
    gauge!(BREAKERS_OPEN).increment(0.0);
    gauge!(IN_FLIGHT).increment(0.0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attempt::ErrorClass;
    use crate::telemetry::{
        AttemptFinished, dead_lettered, delivered, fanned_out, retry_scheduled, runtime_busy,
        store_written,
    };

    #[test]
    fn events_render_with_bounded_labels() {
        let recorder = exporter().unwrap().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            describe();
            AttemptFinished {
                endpoint_id: "ep_1",
                delivery_id: "dlv_1",
                attempt: 1,
                status: Some(503),
                error_class: Some(ErrorClass::HttpStatus),
                latency: Duration::from_millis(20),
            }
            .emit();
            delivered(Some(Duration::from_millis(40)));
            retry_scheduled("30s");
            dead_lettered("dlv_1", "ep_1", DeadReason::Gone);
            store_written(Duration::from_millis(3));
            runtime_busy(0.8);
        });
        let text = handle.render();
        assert!(
            text.contains("hookline_attempts_total{error_class=\"http_status\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("hookline_deliveries_total{outcome=\"success\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("hookline_dead_letters_total{reason=\"gone\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("hookline_attempt_duration_seconds_bucket"),
            "histogram: {text}"
        );
        assert!(
            text.contains("hookline_store_write_duration_seconds_bucket{le=\"0.005\"} 1"),
            "store write histogram: {text}"
        );
        for (le, count) in [("0.75", 0), ("0.9", 1), ("1", 1)] {
            assert!(
                text.contains(&format!(
                    "hookline_runtime_busy_ratio_bucket{{le=\"{le}\"}} {count}"
                )),
                "busy ratio histogram, le {le}: {text}"
            );
        }
        assert!(
            !text.contains("ep_1"),
            "endpoint ids never become labels: {text}"
        );
    }

    /// The metrics listener answers a scrape at any path with the text format, and `/health`
    /// with `OK`, as the exporter's own listener did.
    #[tokio::test]
    async fn the_metrics_listener_serves_the_text_format_and_health() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            describe();
            fanned_out(3);
        });
        let listener = crate::listen::listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, scrape_router(handle)).await });
        let get = |path: &str| {
            reqwest::Client::new()
                .get(format!("http://{addr}{path}"))
                .send()
        };
        let scrape = get("/metrics").await.unwrap();
        assert_eq!(scrape.status(), 200);
        let kind = scrape.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(kind.starts_with("text/plain; version=0.0.4"), "{kind}");
        let text = scrape.text().await.unwrap();
        assert!(
            text.lines()
                .any(|l| l == "hookline_deliveries_created_total 3"),
            "{text}"
        );
        assert!(
            text.contains("# HELP hookline_events_fanned_out_total Events fanned out."),
            "{text}"
        );
        let health = get("/health").await.unwrap();
        assert_eq!(health.status(), 200);
        assert_eq!(health.text().await.unwrap(), "OK");
    }

    #[test]
    fn every_series_is_there_at_zero_before_anything_happens() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            describe();
            register_series(["5s", "1h"], ["empty_value", "not_json"]);
            dead_lettered("dlv_1", "ep_1", DeadReason::Gone);
        });
        let text = handle.render();
        let series = |line: &str| {
            assert!(
                text.lines().any(|l| l == line),
                "no line {line:?} in:\n{text}"
            );
        };
        series("hookline_deliveries_total{outcome=\"retry\"} 0");
        series("hookline_deliveries_total{outcome=\"dead\"} 1");
        series("hookline_attempts_total{error_class=\"none\"} 0");
        for class in ErrorClass::all() {
            series(&format!(
                "hookline_attempts_total{{error_class=\"{}\"}} 0",
                class.as_str()
            ));
        }
        series("hookline_retries_scheduled_total{tier=\"5s\"} 0");
        series("hookline_retries_scheduled_total{tier=\"1h\"} 0");
        series("hookline_dead_letters_total{reason=\"window_exhausted\"} 0");
        series("hookline_dead_letters_total{reason=\"gone\"} 1");
        series("hookline_parked_total{reason=\"breaker_open\"} 0");
        series("hookline_invalid_records_total{reason=\"not_json\"} 0");
        for plain in [
            "hookline_breaker_opens_total",
            "hookline_events_fanned_out_total",
            "hookline_events_repeated_total",
            "hookline_deliveries_created_total",
            "hookline_endpoints_disabled_total",
            "hookline_replayed_records_total",
            "hookline_store_errors_total",
            "hookline_breakers_open",
            "hookline_in_flight_requests",
        ] {
            series(&format!("{plain} 0"));
        }
    }
}
