//! The handles of the metrics every delivery touches, held once they are registered.

use std::sync::OnceLock;

use metrics::{counter, gauge, histogram};

use super::name;
use crate::attempt::ErrorClass;

/// The handles of the metrics every delivery touches, registered once with the global
/// recorder when [`super::install`] sets it. A metric named by the macros is looked up by name and
/// labels (a hash and a lock) on every call; these are not. Without them (tests with a local
/// recorder, or none) each call registers with the current recorder as the macros do.
pub(super) struct Hot {
    /// `hookline_attempts_total` by error class, in [`error_class_labels`]' order.
    attempts: Vec<metrics::Counter>,
    pub(super) attempt_duration: metrics::Histogram,
    pub(super) delivered: metrics::Counter,
    pub(super) event_to_delivery: metrics::Histogram,
    pub(super) in_flight: metrics::Gauge,
    pub(super) store_written: metrics::Histogram,
    pub(super) runtime_lag: metrics::Histogram,
    pub(super) fanned_out: metrics::Counter,
    pub(super) deliveries_created: metrics::Counter,
}

static HOT: OnceLock<Hot> = OnceLock::new();

impl Hot {
    /// Registers the handles with the global recorder and holds them for every later call.
    pub(super) fn install() {
        let _ = HOT.set(Hot::register());
    }

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
    pub(super) fn with(f: impl FnOnce(&Hot)) {
        match HOT.get() {
            Some(hot) => f(hot),
            None => f(&Hot::register()),
        }
    }

    pub(super) fn attempts(&self, class: Option<ErrorClass>) -> &metrics::Counter {
        &self.attempts[class.map_or(0, |c| 1 + c as usize)]
    }
}

/// An attempt's `error_class` label (and log field): its class, or `none` for a 2xx.
pub(super) fn error_class_label(class: Option<ErrorClass>) -> &'static str {
    class.map_or("none", ErrorClass::as_str)
}

/// Every `error_class` label: `none` first, then [`ErrorClass::all`]'s order, the order
/// [`Hot::attempts`] indexes by.
pub(super) fn error_class_labels() -> impl Iterator<Item = &'static str> {
    std::iter::once(None)
        .chain(ErrorClass::all().map(Some))
        .map(error_class_label)
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_exporter_prometheus::PrometheusBuilder;

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
}
