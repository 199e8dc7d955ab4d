//! Typed telemetry: each event emits its log line and its metrics together, so the two never
//! disagree. Metric names carry their unit; every label takes values from a fixed set (error
//! classes, dead reasons, tier names, stage names), never raw endpoint ids or URLs.
//!
//! - [`name`]: every metric's name, in one place.
//! - `exporter`: the Prometheus recorder, its scrape listener, and every series at zero.
//! - `delivery`, `stage`, `store`, `runtime`, `panic`: the typed events, by who reports them.
//! - `handle`: the metric handles every delivery touches, registered once.

mod delivery;
mod exporter;
mod handle;
pub mod name;
mod panic;
mod runtime;
mod stage;
mod store;

#[cfg(test)]
mod capture;

pub use delivery::{
    AttemptFinished, BreakersOpen, ParkReason, attempts_in_flight, breaker_closed, breaker_opened,
    dead_lettered, delivered, endpoint_disabled, in_flight, parked, retry_scheduled, slow_endpoint,
};
pub use exporter::{InstallError, install, register_series};
pub use panic::{attempt_panicked, panic_message, settling_panicked};
pub use runtime::{runtime_busy, runtime_lag};
pub use stage::{
    CONSUMER_STAGES, consumer_error, consumer_lag, event_repeated, fanned_out, invalid_record,
    produce_failed, replay_mark_failed, replayed,
};
pub use store::{
    CqlTlsFile, cql_client_cert_expiry, cql_tls_refused, cql_tls_reread, cql_tls_watched,
    store_error, store_written,
};
