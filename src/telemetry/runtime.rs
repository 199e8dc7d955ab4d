//! How the runtime keeps up: how late it wakes tasks, and how busy its workers are.

use std::time::Duration;

use metrics::histogram;

use super::handle::Hot;
use super::name;

/// The runtime woke a task `late` after it was due (the lag watcher's wake every 10 ms).
pub fn runtime_lag(late: Duration) {
    Hot::with(|hot| hot.runtime_lag.record(late.as_secs_f64()));
}

/// The runtime's workers were busy for `share` of the last interval (the lag watcher's look at
/// them).
pub fn runtime_busy(share: f64) {
    histogram!(name::RUNTIME_BUSY).record(share);
}
