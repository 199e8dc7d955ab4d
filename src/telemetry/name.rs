//! Metric names, in one place so dashboards and code agree.

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
/// Events the fan-out dropped as repeats of one it fanned out within `ingest.dedupe_window`
/// (the same tenant, id and content, on any instance).
pub const EVENTS_REPEATED: &str = "hookline_events_repeated_total";
/// Delivery records produced by the fan-out.
pub const DELIVERIES_CREATED: &str = "hookline_deliveries_created_total";
/// Endpoints disabled because the receiver answered 410 Gone.
pub const ENDPOINTS_DISABLED: &str = "hookline_endpoints_disabled_total";
/// Records replayed from the DLQ.
pub const REPLAYED: &str = "hookline_replayed_records_total";
/// Replayed records whose replay mark the store did not take: a second replay before their
/// attempt is logged would send them again.
pub const REPLAY_MARKS_FAILED: &str = "hookline_replay_marks_failed_total";
/// Store calls the pipeline makes before settling a record (attempt rows, notes, events and
/// their lookups) that failed: the call is retried, the record not settled.
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
