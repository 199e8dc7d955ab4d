//! Typed telemetry: each event emits its log line and its metrics together, so the two never
//! disagree. Metric names carry their unit; every label takes values from a fixed set (error
//! classes, dead reasons, tier names, stage names), never raw endpoint ids or URLs.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder};

use crate::attempt::ErrorClass;
use crate::dead_reason::DeadReason;
use crate::repeat_log::RepeatLog;

/// Metric names, in one place so dashboards and code agree.
pub mod name {
    /// Deliveries finished, by `outcome` (`success`, `retry`, `dead`).
    pub const DELIVERIES: &str = "hookline_deliveries_total";
    /// HTTP attempts, by `error_class` (`none` for 2xx).
    pub const ATTEMPTS: &str = "hookline_attempts_total";
    /// Attempt latency.
    pub const ATTEMPT_DURATION: &str = "hookline_attempt_duration_seconds";
    /// From the event's time to its successful delivery.
    pub const EVENT_TO_DELIVERY: &str = "hookline_event_to_delivery_seconds";
    /// Retries scheduled, by delay `tier`.
    pub const RETRIES_SCHEDULED: &str = "hookline_retries_scheduled_total";
    /// Records written to the DLQ, by `reason`.
    pub const DEAD_LETTERS: &str = "hookline_dead_letters_total";
    /// Breakers that opened.
    pub const BREAKER_OPENS: &str = "hookline_breaker_opens_total";
    /// Breakers open right now.
    pub const BREAKERS_OPEN: &str = "hookline_breakers_open";
    /// Records parked in a delay tier, by `reason` (`lane_full`, `slow_endpoint`,
    /// `breaker_open`, `stalled`, `view_behind`, `panicked`).
    pub const PARKED: &str = "hookline_parked_total";
    /// HTTP attempts in flight.
    pub const IN_FLIGHT: &str = "hookline_in_flight_requests";
    /// Consumer lag in records, by `stage` (`fanout`, `deliver`, `delay`).
    pub const CONSUMER_LAG: &str = "hookline_consumer_lag_records";
    /// Input records that were neither a Debezium outbox record nor a native event, by `reason`.
    pub const INVALID_RECORDS: &str = "hookline_invalid_records_total";
    /// Events fanned out.
    pub const EVENTS_FANNED_OUT: &str = "hookline_events_fanned_out_total";
    /// Delivery records produced by the fan-out.
    pub const DELIVERIES_CREATED: &str = "hookline_deliveries_created_total";
    /// Endpoints disabled because the receiver answered 410 Gone.
    pub const ENDPOINTS_DISABLED: &str = "hookline_endpoints_disabled_total";
    /// Records replayed from the DLQ.
    pub const REPLAYED: &str = "hookline_replayed_records_total";
    /// Replayed records whose replay mark the store did not take: a second replay before their
    /// attempt is logged would send them again.
    pub const REPLAY_MARKS_FAILED: &str = "hookline_replay_marks_failed_total";
    /// Attempt-log writes that failed (the record is retried, not settled).
    pub const STORE_ERRORS: &str = "hookline_store_errors_total";
    /// From an attempt's answer to its row being durable in the attempt log, retries included:
    /// the time its record waits, unsettled, on the store.
    pub const STORE_WRITE_DURATION: &str = "hookline_store_write_duration_seconds";
    /// Produces the broker did not acknowledge (the record stays unsettled and is produced
    /// again): a lost broker, or a topic that refuses records.
    pub const PRODUCE_RETRIES: &str = "hookline_produce_retries_total";
    /// Errors a stage's consumer returned in place of a record (a lost broker excepted: the
    /// client's context reports that), by stage.
    pub const CONSUMER_ERRORS: &str = "hookline_consumer_errors_total";
    /// How late hookline's runtime woke a task that asked to wake every 10 ms: the time every
    /// woken task waits for a worker (the process short of CPU, or its workers held).
    pub const RUNTIME_LAG: &str = "hookline_runtime_lag_seconds";
    /// The share of each second the runtime's workers, all of them, spent running tasks: near 1
    /// the process has more work than its workers get CPU for.
    pub const RUNTIME_BUSY: &str = "hookline_runtime_busy_ratio";
    /// The CQL store's TLS files read again after they changed, by `file` (`ca`,
    /// `client_cert`) and `outcome` (`used`, or `refused`: unusable, the files read before
    /// stay in use).
    pub const STORE_TLS_REREADS: &str = "hookline_store_tls_rereads_total";
    /// 1 while the CQL store's TLS `file` (`ca`, `client_cert`) changed into something unusable
    /// and the files read before are still in use; 0 otherwise.
    pub const STORE_TLS_REFUSED: &str = "hookline_store_tls_files_refused";
    /// When the client certificate hookline shows the CQL nodes (`tls.cert_file`) expires, as
    /// a Unix time, from the certificate in use.
    pub const STORE_TLS_CERT_EXPIRY: &str = "hookline_store_tls_cert_expiry_timestamp_seconds";
}

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
    let _ = HOT.set(Hot::register());
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

/// The handles of the metrics every delivery touches, registered once with the global
/// recorder when [`install`] sets it. A metric named by the macros is looked up by name and
/// labels (a hash and a lock) on every call; these are not. Without them (tests with a local
/// recorder, or none) each call registers with the current recorder as the macros do.
struct Hot {
    /// `hookline_attempts_total` by error class, in [`error_class_labels`]' order.
    attempts: Vec<metrics::Counter>,
    attempt_duration: metrics::Histogram,
    delivered: metrics::Counter,
    event_to_delivery: metrics::Histogram,
    in_flight: metrics::Gauge,
    store_written: metrics::Histogram,
    runtime_lag: metrics::Histogram,
    fanned_out: metrics::Counter,
    deliveries_created: metrics::Counter,
}

static HOT: OnceLock<Hot> = OnceLock::new();

impl Hot {
    fn register() -> Self {
        Self {
            attempts: error_class_labels()
                .map(|class| counter!(name::ATTEMPTS, "error_class" => class))
                .collect(),
            attempt_duration: histogram!(name::ATTEMPT_DURATION),
            delivered: counter!(name::DELIVERIES, "outcome" => "success"),
            event_to_delivery: histogram!(name::EVENT_TO_DELIVERY),
            in_flight: gauge!(name::IN_FLIGHT),
            store_written: histogram!(name::STORE_WRITE_DURATION),
            runtime_lag: histogram!(name::RUNTIME_LAG),
            fanned_out: counter!(name::EVENTS_FANNED_OUT),
            deliveries_created: counter!(name::DELIVERIES_CREATED),
        }
    }

    /// Runs `f` with the installed handles, or with handles registered just now with the
    /// current recorder.
    fn with(f: impl FnOnce(&Hot)) {
        match HOT.get() {
            Some(hot) => f(hot),
            None => f(&Hot::register()),
        }
    }

    fn attempts(&self, class: Option<ErrorClass>) -> &metrics::Counter {
        &self.attempts[class.map_or(0, |c| 1 + c as usize)]
    }
}

/// An attempt's `error_class` label (and log field): its class, or `none` for a 2xx.
fn error_class_label(class: Option<ErrorClass>) -> &'static str {
    class.map_or("none", ErrorClass::as_str)
}

/// Every `error_class` label: `none` first, then [`ErrorClass::all`]'s order, the order
/// [`Hot::attempts`] indexes by.
fn error_class_labels() -> impl Iterator<Item = &'static str> {
    std::iter::once(None)
        .chain(ErrorClass::all().map(Some))
        .map(error_class_label)
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
        "Attempt-log writes that failed and were retried."
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

/// The message a panic carried (`panic!` with a literal or a formatted one), for logs and
/// answers.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// The stages whose consumers report through [`consumer_error`]: the label values of
/// `hookline_consumer_errors_total`.
pub const CONSUMER_STAGES: [&str; 4] = ["fanout", "deliver", "delay", "endpoints"];

/// One HTTP attempt finished.
pub struct AttemptFinished<'a> {
    /// The endpoint (logged, never a label).
    pub endpoint_id: &'a str,
    /// The delivery (logged).
    pub delivery_id: &'a str,
    /// Attempt number.
    pub attempt: u32,
    /// Status, if a response arrived.
    pub status: Option<u16>,
    /// Error class, `None` for a 2xx.
    pub error_class: Option<ErrorClass>,
    /// How long it took.
    pub latency: Duration,
}

impl AttemptFinished<'_> {
    /// Logs and counts the attempt.
    pub fn emit(&self) {
        let class = error_class_label(self.error_class);
        tracing::debug!(
            endpoint_id = self.endpoint_id,
            delivery_id = self.delivery_id,
            attempt = self.attempt,
            status = self.status,
            error_class = class,
            latency_ms = self.latency.as_millis() as u64,
            "attempt finished"
        );
        Hot::with(|hot| {
            hot.attempts(self.error_class).increment(1);
            hot.attempt_duration.record(self.latency.as_secs_f64());
        });
    }
}

/// A delivery succeeded.
pub fn delivered(event_age: Option<Duration>) {
    Hot::with(|hot| {
        hot.delivered.increment(1);
        if let Some(age) = event_age {
            hot.event_to_delivery.record(age.as_secs_f64());
        }
    });
}

/// A retry was scheduled into `tier` (a configured tier's name such as `30s`).
pub fn retry_scheduled(tier: &str) {
    counter!(name::DELIVERIES, "outcome" => "retry").increment(1);
    counter!(name::RETRIES_SCHEDULED, "tier" => tier.to_owned()).increment(1);
}

/// A record was dead-lettered.
pub fn dead_lettered(delivery_id: &str, endpoint_id: &str, reason: DeadReason) {
    tracing::warn!(
        delivery_id,
        endpoint_id,
        reason = reason.as_str(),
        "dead-lettered"
    );
    counter!(name::DELIVERIES, "outcome" => "dead").increment(1);
    counter!(name::DEAD_LETTERS, "reason" => reason.as_str()).increment(1);
}

/// Why a record was parked instead of sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumIter, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum ParkReason {
    /// The endpoint's queue is full (as long as the partition's window) or the stage holds as
    /// many lanes as it may; also what is queued when the stage stops, and a record that
    /// arrived before it was due.
    LaneFull,
    /// The endpoint answers slower than its records arrive: its queue already holds what it
    /// sends within the shortest tier (at its rate limit, or its concurrency over its answer
    /// time), and the record waits parked for its turn.
    SlowEndpoint,
    /// The endpoint's breaker is open.
    BreakerOpen,
    /// The endpoint stopped answering (see [`crate::lane::Lanes::stalled`]).
    Stalled,
    /// This instance's endpoint view lacks the endpoint or has it disabled, and has not been
    /// confirmed current within 10 s: it may be behind the instance that made the delivery.
    ViewBehind,
    /// The record's attempt panicked (a bug in hookline; see [`attempt_panicked`]).
    Panicked,
}

impl ParkReason {
    /// Every reason, in declaration order.
    pub fn all() -> impl Iterator<Item = ParkReason> {
        <ParkReason as strum::IntoEnumIterator>::iter()
    }

    /// The label value: the variant's name in snake case.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// A record was parked in a delay tier.
pub fn parked(reason: ParkReason) {
    counter!(name::PARKED, "reason" => reason.as_str()).increment(1);
}

/// An attempt panicked: a bug in hookline. Its record is parked for a later attempt
/// (`hookline_parked_total{reason="panicked"}`) and the endpoint's lane slot given back.
pub fn attempt_panicked(delivery_id: &str, endpoint_id: &str, panic: &str) {
    tracing::error!(
        delivery_id,
        endpoint_id,
        panic,
        "attempt panicked; the record is parked for a later attempt"
    );
}

/// Writing a record's dead letter, parked copy or invalid-topic copy panicked: a bug in
/// hookline. The record stays unsettled and the delivery stage stops, so that hookline exits
/// and the next process reads the record again.
pub fn settling_panicked(topic: &str, partition: i32, offset: i64, panic: &str) {
    tracing::error!(
        topic,
        partition,
        offset,
        panic,
        "writing a record onward panicked; the delivery stage stops"
    );
}

/// An endpoint's breaker opened.
pub fn breaker_opened(endpoint_id: &str, until: Duration) {
    tracing::warn!(
        endpoint_id,
        cool_down_ms = until.as_millis() as u64,
        "breaker opened"
    );
    counter!(name::BREAKER_OPENS).increment(1);
}

/// An endpoint's breaker closed again.
pub fn breaker_closed(endpoint_id: &str) {
    tracing::info!(endpoint_id, "breaker closed");
}

/// One delivery stage's share of `hookline_breakers_open`: the stage reports how many of its
/// breakers are not closed, and the gauge moves by the change since its last report.
///
/// The gauge follows the breakers the stage holds rather than their open and close events: a
/// breaker that re-opens after a failed probe opens twice without closing, and a lane dropped
/// while its breaker is open (idle, evicted for room, endpoint deleted) never closes at all.
/// Counting events made the gauge climb on a long-running worker. Several stages in one
/// process each add their own share, and a stage that ends takes its share back.
#[derive(Debug, Default)]
pub struct BreakersOpen {
    reported: usize,
}

impl BreakersOpen {
    /// This stage now holds `open` breakers that are open or half-open.
    pub fn report(&mut self, open: usize) {
        if open != self.reported {
            gauge!(name::BREAKERS_OPEN).increment(open as f64 - self.reported as f64);
            self.reported = open;
        }
    }
}

impl Drop for BreakersOpen {
    fn drop(&mut self) {
        self.report(0);
    }
}

/// HTTP attempts in flight in this process, for the shutdown log line; the gauge says the same.
static ATTEMPTS_IN_FLIGHT: AtomicI64 = AtomicI64::new(0);

/// HTTP attempts in flight changed by `delta`.
pub fn in_flight(delta: i64) {
    ATTEMPTS_IN_FLIGHT.fetch_add(delta, Ordering::Relaxed);
    Hot::with(|hot| hot.in_flight.increment(delta as f64));
}

/// HTTP attempts in flight in this process right now.
pub fn attempts_in_flight() -> u64 {
    u64::try_from(ATTEMPTS_IN_FLIGHT.load(Ordering::Relaxed)).unwrap_or(0)
}

/// The consumer lag of a stage, summed over its assigned partitions.
pub fn consumer_lag(stage: &'static str, records: i64) {
    gauge!(name::CONSUMER_LAG, "stage" => stage).set(records as f64);
}

/// An input record was not an event hookline understands.
pub fn invalid_record(
    topic: &str,
    partition: i32,
    offset: i64,
    reason: &'static str,
    detail: &str,
) {
    tracing::warn!(
        topic,
        partition,
        offset,
        reason,
        detail,
        "invalid input record"
    );
    counter!(name::INVALID_RECORDS, "reason" => reason).increment(1);
}

/// An event fanned out to `deliveries` endpoints.
pub fn fanned_out(deliveries: usize) {
    Hot::with(|hot| {
        hot.fanned_out.increment(1);
        hot.deliveries_created.increment(deliveries as u64);
    });
}

/// An endpoint was disabled because its receiver answered 410 Gone.
pub fn endpoint_disabled(endpoint_id: &str) {
    tracing::warn!(endpoint_id, "endpoint disabled: receiver answered 410 Gone");
    counter!(name::ENDPOINTS_DISABLED).increment(1);
}

/// Records were replayed from the DLQ.
pub fn replayed(count: u64) {
    counter!(name::REPLAYED).increment(count);
}

/// A replayed record's replay mark was not taken by the store.
pub fn replay_mark_failed() {
    counter!(name::REPLAY_MARKS_FAILED).increment(1);
}

/// An attempt's row became durable `took` after the first try to write it.
pub fn store_written(took: Duration) {
    Hot::with(|hot| hot.store_written.record(took.as_secs_f64()));
}

/// The runtime woke a task `late` after it was due (see [`crate::lag::watch`]).
pub fn runtime_lag(late: Duration) {
    Hot::with(|hot| hot.runtime_lag.record(late.as_secs_f64()));
}

/// The runtime's workers were busy for `share` of the last interval (see
/// [`crate::lag::watch_busy`]).
pub fn runtime_busy(share: f64) {
    histogram!(name::RUNTIME_BUSY).record(share);
}

/// Which of the CQL store's TLS files: the CAs (`tls.ca_file`) or hookline's own certificate
/// and key (`tls.cert_file`, `tls.key_file`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CqlTlsFile {
    Ca,
    ClientCert,
}

impl CqlTlsFile {
    fn as_str(self) -> &'static str {
        match self {
            CqlTlsFile::Ca => "ca",
            CqlTlsFile::ClientCert => "client_cert",
        }
    }
}

/// Registers `file`'s re-read series at zero: the store reads it again when it changes.
pub fn cql_tls_watched(file: CqlTlsFile) {
    for outcome in ["used", "refused"] {
        counter!(name::STORE_TLS_REREADS, "file" => file.as_str(), "outcome" => outcome)
            .increment(0);
    }
}

/// The CQL client certificate now in use expires `at`.
pub fn cql_client_cert_expiry(at: std::time::SystemTime) {
    let secs = at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    gauge!(name::STORE_TLS_CERT_EXPIRY).set(secs);
}

/// Whether the CQL store's `file` on disk is refused (the files read before are in use).
pub fn cql_tls_refused(file: CqlTlsFile, refused: bool) {
    let label = file.as_str();
    gauge!(name::STORE_TLS_REFUSED, "file" => label).set(if refused { 1.0 } else { 0.0 });
}

/// The CQL store's `file` changed and was read again: `used`, or refused as unusable.
pub fn cql_tls_reread(file: CqlTlsFile, used: bool) {
    let outcome = if used { "used" } else { "refused" };
    counter!(name::STORE_TLS_REREADS, "file" => file.as_str(), "outcome" => outcome).increment(1);
}

/// The endpoints whose records the delivery stage parks because they send slower than their
/// records arrive, for [`slow_endpoint`]'s log, bounded as the stage's own per-endpoint maps.
static SLOW_ENDPOINTS: RepeatLog = RepeatLog::bounded(crate::limits::MAX_ENDPOINT_ENTRIES);

/// The delivery stage parks records of `endpoint_id` until their turn, because its queue holds
/// what the endpoint sends within the shortest tier (`queue_room` records at `sends_per_s`).
/// Counted by [`parked`] (`slow_endpoint`) every time; logged as [`RepeatLog`] allows, per
/// endpoint, since the count has no endpoint label.
pub fn slow_endpoint(endpoint_id: &str, sends_per_s: f64, queue_room: usize) {
    if let Some(held_back) = SLOW_ENDPOINTS.admit(endpoint_id, Instant::now()) {
        tracing::warn!(
            endpoint_id,
            sends_per_s = (sends_per_s * 10.0).round() / 10.0,
            queue_room,
            held_back,
            "endpoint sends slower than its records arrive; records beyond its queue are \
             parked until their turn"
        );
    }
}

/// The process's failed attempt-log writes, for [`store_error`]'s log.
static STORE_ERROR_LOG: RepeatLog = RepeatLog::new();

/// An attempt-log write failed; the record stays unsettled and is tried again. Counted every
/// time; logged as [`RepeatLog`] allows, per `kind` of error (unreachable, or anything else).
pub fn store_error(kind: &'static str, error: &dyn std::fmt::Display) {
    counter!(name::STORE_ERRORS).increment(1);
    if let Some(held_back) = STORE_ERROR_LOG.admit(kind, Instant::now()) {
        tracing::warn!(error = %error, held_back, "attempt log write failed; retrying");
    }
}

/// The process's failed produces, for [`produce_failed`]'s log.
static FAILED_PRODUCES: RepeatLog = RepeatLog::new();

/// A produce to `topic` failed; the record stays unsettled and is produced again. Counted every
/// time; logged as [`RepeatLog`] allows, per topic and error code, so that a topic whose error
/// changes (a refused record, then a lost broker) logs the new error at once.
pub fn produce_failed(topic: &str, error: &rdkafka::error::KafkaError) {
    counter!(name::PRODUCE_RETRIES).increment(1);
    if let Some(held_back) =
        FAILED_PRODUCES.admit(&crate::kafka_error::kind(topic, error), Instant::now())
    {
        tracing::warn!(topic, error = %error, held_back, "produce failed; retrying");
    }
}

/// The process's consumer errors, for [`consumer_error`]'s log.
static CONSUMER_ERROR_LOG: RepeatLog = RepeatLog::new();

/// A stage's consumer returned an error in place of a record; librdkafka goes on by itself, so
/// the error is reported, not fatal. A lost broker is left to the client's context, which holds
/// it back as it repeats (logged here at debug only). Anything else is counted every time and
/// logged as [`RepeatLog`] allows, per stage and error code: a consumer that fails on every poll
/// logs one line per 30 s, and a different error logs at once.
pub fn consumer_error(stage: &'static str, error: &rdkafka::error::KafkaError) {
    if crate::kafka_error::is_broker_outage(error) {
        tracing::debug!(stage, error = %error, "consumer error");
        return;
    }
    counter!(name::CONSUMER_ERRORS, "stage" => stage).increment(1);
    if let Some(held_back) =
        CONSUMER_ERROR_LOG.admit(&crate::kafka_error::kind(stage, error), Instant::now())
    {
        tracing::warn!(stage, error = %error, held_back, "consumer error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_exporter_prometheus::PrometheusBuilder;
    use std::sync::{Arc, Mutex};

    /// The park reasons are the `reason` label of `hookline_parked_total`, which operators'
    /// queries select on (the README's among them): pinned here, like the other label enums'.
    #[test]
    fn park_reason_strings_are_stable() {
        let all: Vec<&str> = ParkReason::all().map(ParkReason::as_str).collect();
        assert_eq!(
            all,
            [
                "lane_full",
                "slow_endpoint",
                "breaker_open",
                "stalled",
                "view_behind",
                "panicked"
            ]
        );
    }

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

    /// The attempt counters are held in a list indexed by error class: each class's attempt
    /// lands in the series of its own name.
    #[test]
    fn the_held_attempt_counters_are_each_error_classes_own() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let hot = Hot::register();
            hot.attempts(None).increment(1);
            for (n, class) in ErrorClass::all().enumerate() {
                hot.attempts(Some(class)).increment(n as u64 + 2);
            }
        });
        let text = handle.render();
        let series = |class: &str, n: usize| {
            let line = format!("hookline_attempts_total{{error_class=\"{class}\"}} {n}");
            assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
        };
        series("none", 1);
        for (n, class) in ErrorClass::all().enumerate() {
            series(class.as_str(), n + 2);
        }
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

    /// Records parked for a slow endpoint are counted under `slow_endpoint` with no endpoint
    /// label; the log says which endpoint, once per repeat interval, with the rate it was
    /// judged by.
    #[test]
    fn a_slow_endpoint_is_logged_once_by_name_with_its_rate() {
        let (text, _) = logged_and_exported(|| {
            for _ in 0..100 {
                slow_endpoint("ep_slow_log_a", 12.34, 62);
            }
            slow_endpoint("ep_slow_log_b", 0.5, 3);
        });
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        for (line, want) in lines.iter().zip([
            ["ep_slow_log_a", "sends_per_s=12.3", "queue_room=62"],
            ["ep_slow_log_b", "sends_per_s=0.5", "queue_room=3"],
        ]) {
            assert!(line.contains("WARN"), "{line}");
            assert!(
                line.contains("sends slower than its records arrive"),
                "{line}"
            );
            for w in want {
                assert!(line.contains(w), "{w} in {line}");
            }
        }
    }

    /// Log lines written while a test's subscriber is the default.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl tracing_subscriber::fmt::MakeWriter<'_> for Captured {
        type Writer = Captured;
        fn make_writer(&self) -> Captured {
            self.clone()
        }
    }

    /// A store that is down fails every unsettled record's write every few seconds: each kind of
    /// failure is one log line, while the counter counts every failure. (The only test in this
    /// binary that fails attempt-log writes, so the process-wide gate starts empty.)
    #[test]
    fn a_failing_attempt_log_is_logged_once_per_kind_and_counted_every_time() {
        let (text, rendered) = logged_and_exported(|| {
            for n in 0..500 {
                store_error(
                    "unavailable",
                    &format!("store unavailable: node {n} timed out"),
                );
            }
            store_error("backend", &"store error: keyspace hookline missing");
            store_error("backend", &"store error: keyspace hookline missing");
        });
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines[0].contains("store unavailable: node 0 timed out"),
            "{text}"
        );
        assert!(lines[1].contains("keyspace hookline missing"), "{text}");
        assert!(
            rendered
                .lines()
                .any(|l| l == "hookline_store_errors_total 502"),
            "{rendered}"
        );
    }

    /// What `report` logs (as text) and the metrics it leaves (as Prometheus renders them), with
    /// its own subscriber and recorder.
    fn logged_and_exported(report: impl FnOnce()) -> (String, String) {
        let captured = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(captured.clone())
            .with_ansi(false)
            .finish();
        let recorder = PrometheusBuilder::new().build_recorder();
        tracing::subscriber::with_default(subscriber, || {
            metrics::with_local_recorder(&recorder, report);
        });
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        (text, recorder.handle().render())
    }

    /// A consumer that fails on every poll (a topic it may not read, say) logs one line per
    /// stage and error until the repeat interval passes, counts every error by stage, and leaves
    /// a lost broker to the client's context. (The only test in this binary that reports
    /// consumer errors, so the process-wide gate starts empty.)
    #[test]
    fn a_failing_consumer_is_logged_once_per_stage_and_error_and_counted_every_time() {
        use rdkafka::error::{KafkaError, RDKafkaErrorCode};
        let denied = KafkaError::MessageConsumption(RDKafkaErrorCode::TopicAuthorizationFailed);
        let corrupt = KafkaError::MessageConsumption(RDKafkaErrorCode::InvalidMessage);
        let lost = KafkaError::MessageConsumption(RDKafkaErrorCode::AllBrokersDown);
        let (text, rendered) = logged_and_exported(|| {
            register_series(["5s"], []);
            for _ in 0..300 {
                consumer_error("deliver", &denied);
                consumer_error("deliver", &lost);
            }
            consumer_error("deliver", &corrupt);
            consumer_error("delay", &denied);
            consumer_error("delay", &denied);
        });
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        for (line, (stage, code)) in lines.iter().zip([
            ("deliver", "TopicAuthorizationFailed"),
            ("deliver", "InvalidMessage"),
            ("delay", "TopicAuthorizationFailed"),
        ]) {
            assert!(line.contains("WARN"), "{text}");
            assert!(line.contains(&format!("stage=\"{stage}\"")), "{text}");
            assert!(line.contains(code), "{text}");
        }
        for series in [
            "hookline_consumer_errors_total{stage=\"deliver\"} 301",
            "hookline_consumer_errors_total{stage=\"delay\"} 2",
            "hookline_consumer_errors_total{stage=\"fanout\"} 0",
            "hookline_consumer_errors_total{stage=\"endpoints\"} 0",
        ] {
            assert!(
                rendered.lines().any(|l| l == series),
                "{series}\n{rendered}"
            );
        }
    }

    #[test]
    fn breakers_open_is_the_sum_of_what_the_stages_hold_now() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let gauge = |text: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix("hookline_breakers_open "))
                .map(|v| v.parse::<f64>().expect("a number"))
        };
        metrics::with_local_recorder(&recorder, || {
            let mut a = BreakersOpen::default();
            let mut b = BreakersOpen::default();
            a.report(3);
            b.report(2);
            assert_eq!(gauge(&handle.render()), Some(5.0));
            // A re-opened breaker is still one; lanes dropped with open breakers leave.
            a.report(3);
            a.report(1);
            assert_eq!(gauge(&handle.render()), Some(3.0));
            drop(b);
            assert_eq!(gauge(&handle.render()), Some(1.0));
            a.report(0);
            assert_eq!(gauge(&handle.render()), Some(0.0));
        });
    }
}
