//! What the stages report about the records they consume and produce: consumer lag and
//! errors, invalid input, fan-out, replays, and produces the broker did not acknowledge.

use std::time::Instant;

use metrics::{counter, gauge};

use super::handle::Hot;
use super::name;
use crate::repeat_log::RepeatLog;

/// The stages whose consumers report through [`consumer_error`]: the label values of
/// `hookline_consumer_errors_total`.
pub const CONSUMER_STAGES: [&str; 4] = ["fanout", "deliver", "delay", "endpoints"];

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

/// The fan-out dropped event `id` as a repeat of one it fanned out within the dedupe window:
/// lately on the same partition (`recently`), or as the store has it.
pub fn event_repeated(tenant: &str, id: &str, recently: bool) {
    tracing::debug!(
        tenant,
        event_id = id,
        recently,
        "repeated event; already fanned out"
    );
    counter!(name::EVENTS_REPEATED).increment(1);
}

/// Records were replayed from the DLQ.
pub fn replayed(count: u64) {
    counter!(name::REPLAYED).increment(count);
}

/// A replayed record's replay mark was not taken by the store.
pub fn replay_mark_failed() {
    counter!(name::REPLAY_MARKS_FAILED).increment(1);
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
    use crate::telemetry::capture::logged_and_exported;
    use crate::telemetry::register_series;

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
}
