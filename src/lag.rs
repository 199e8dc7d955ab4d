//! How long hookline's own runtime keeps a woken task waiting, and how busy its workers are.
//!
//! - [`watch`]: a task asks to wake every [`TICK`] and notes how late it woke
//!   (`hookline_runtime_lag_seconds`). On a machine short of CPU, or with its workers held by
//!   long work, every task waits like that, an HTTP attempt's at each of its steps. It samples
//!   the worker that runs it: a second worker's queue may wait longer unseen.
//! - [`watch_busy`]: every [`BUSY_EVERY`], the share of that time all the workers together spent
//!   running tasks (`hookline_runtime_busy_ratio`), from tokio's own per-worker counts. Lateness
//!   with the workers near 1 means more work than the process gets CPU for; lateness with them
//!   well below 1 means the CPU was taken from it (a container's CPU limit, a crowded node).

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

/// How often [`watch_busy`] looks at the workers.
pub const BUSY_EVERY: Duration = Duration::from_secs(1);

/// What the runtime's workers did over one interval of [`watch_busy`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Busy {
    /// Time the workers spent running tasks, summed over all of them.
    pub busy: Duration,
    /// The interval's length.
    pub wall: Duration,
    /// How many workers the runtime has.
    pub workers: usize,
}

impl Busy {
    /// The share of the workers' time that was busy. A worker counts its busy time when it
    /// stops to look for I/O or to sleep, so a second can read a little over 1 when the one
    /// before it read that much under.
    pub fn share(&self) -> f64 {
        let capacity = self.wall.as_secs_f64() * self.workers as f64;
        if capacity > 0.0 {
            self.busy.as_secs_f64() / capacity
        } else {
            0.0
        }
    }
}

/// Every `every` until `stop`, gives `note` how busy the current runtime's workers were since
/// the last look.
pub async fn watch_busy(stop: CancellationToken, every: Duration, mut note: impl FnMut(Busy)) {
    let metrics = tokio::runtime::Handle::current().metrics();
    let workers = metrics.num_workers();
    let busy_total = || -> Duration {
        (0..workers)
            .map(|w| metrics.worker_total_busy_duration(w))
            .sum()
    };
    let (mut then, mut busy_then) = (Instant::now(), busy_total());
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        let (now, busy_now) = (Instant::now(), busy_total());
        note(Busy {
            busy: busy_now.saturating_sub(busy_then),
            wall: now.saturating_duration_since(then),
            workers,
        });
        (then, busy_then) = (now, busy_now);
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

    /// Two workers each held for 400 ms show as 0.8 s of busy time (one worker alone would
    /// give half that), and an idle runtime as nearly none.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn busy_time_is_summed_over_every_worker() {
        let every = Duration::from_millis(100);
        let stop = CancellationToken::new();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let noted = seen.clone();
        let watching = tokio::spawn(watch_busy(stop.clone(), every, move |b| {
            noted.lock().unwrap().push(b)
        }));
        tokio::time::sleep(Duration::from_millis(450)).await;
        let idle: Vec<Busy> = seen.lock().unwrap().clone();
        let spin = || {
            tokio::spawn(async {
                let until = std::time::Instant::now() + Duration::from_millis(400);
                while std::time::Instant::now() < until {
                    std::hint::spin_loop();
                }
            })
        };
        let (a, b) = (spin(), spin());
        a.await.unwrap();
        b.await.unwrap();
        tokio::time::sleep(Duration::from_millis(350)).await;
        stop.cancel();
        watching.await.unwrap();
        let seen = seen.lock().unwrap();
        assert!(idle.len() >= 2, "{seen:?}");
        for b in &idle {
            assert_eq!(b.workers, 2);
            assert!(b.share() < 0.25, "idle: {b:?} of {seen:?}");
        }
        let busy: Duration = seen[idle.len()..].iter().map(|b| b.busy).sum();
        let wall: Duration = seen[idle.len()..].iter().map(|b| b.wall).sum();
        assert!(busy >= Duration::from_millis(750), "{busy:?} in {seen:?}");
        assert!(busy <= wall * 2, "{busy:?} over {wall:?}: {seen:?}");
    }
}
