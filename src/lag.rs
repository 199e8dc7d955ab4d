//! How long hookline's own runtime keeps a woken task waiting: a task asks to wake every
//! [`TICK`] and notes how late it woke (`hookline_runtime_lag_seconds`). On a machine short of
//! CPU, or with its workers held by long work, every task waits like that, an HTTP attempt's at
//! each of its steps. It samples the worker that runs it: a second worker's queue may wait
//! longer unseen.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How often the watching task asks to wake.
pub const TICK: Duration = Duration::from_millis(10);

/// Wakes every [`TICK`] until `stop` and gives `note` how late each wake came.
pub async fn watch(stop: CancellationToken, mut note: impl FnMut(Duration)) {
    let mut due = Instant::now() + TICK;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep_until(due) => {}
        }
        let now = Instant::now();
        note(now.saturating_duration_since(due));
        // The next wake is a tick after this one, not after the one missed: a long stall is
        // one late wake, not a burst of them.
        due = now + TICK;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[tokio::test]
    async fn a_blocked_runtime_is_noted_once_as_late_as_it_was_blocked() {
        let stop = CancellationToken::new();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let noted = seen.clone();
        let watching = tokio::spawn(watch(stop.clone(), move |late| {
            noted.lock().unwrap().push(late)
        }));
        tokio::time::sleep(Duration::from_millis(30)).await;
        // Hold the runtime's only thread for 250 ms: the watcher's next wake, due within a
        // tick, comes at least 240 ms late.
        std::thread::sleep(Duration::from_millis(250));
        tokio::time::sleep(Duration::from_millis(30)).await;
        stop.cancel();
        watching.await.unwrap();
        let seen = seen.lock().unwrap();
        let late: Vec<_> = seen
            .iter()
            .filter(|l| **l >= Duration::from_millis(200))
            .collect();
        assert_eq!(late.len(), 1, "one late wake: {seen:?}");
        assert!(*late[0] < Duration::from_secs(5), "{seen:?}");
    }
}
