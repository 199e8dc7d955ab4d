//! What happens to one delivery: its attempts and their outcome, parking, the endpoint's
//! breaker, and the endpoints that send slower than their records arrive.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use metrics::{counter, gauge};

use super::handle::{Hot, error_class_label};
use super::name;
use crate::attempt::ErrorClass;
use crate::dead_reason::DeadReason;
pub use crate::park_reason::ParkReason;
use crate::repeat_log::RepeatLog;

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

/// A record was parked in a delay tier.
pub fn parked(reason: ParkReason) {
    counter!(name::PARKED, "reason" => reason.as_str()).increment(1);
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
/// Counting events would make the gauge climb on a long-running worker. Several stages in one
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

/// An endpoint was disabled because its receiver answered 410 Gone.
pub fn endpoint_disabled(endpoint_id: &str) {
    tracing::warn!(endpoint_id, "endpoint disabled: receiver answered 410 Gone");
    counter!(name::ENDPOINTS_DISABLED).increment(1);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::capture::logged_and_exported;
    use metrics_exporter_prometheus::PrometheusBuilder;

    /// The park reasons are the `reason` label of `hookline_parked_total`, which operators'
    /// queries select on (the operations guide's among them): pinned here, like the other label enums'.
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
