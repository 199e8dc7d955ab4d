//! Opening the store at start-up. A cluster that is still starting (or a network that is not up
//! yet) is retried with growing pauses for `startup_wait`; a problem no retry can fix (bad
//! settings, a keyspace that was never migrated) fails at once, so an operator sees it in
//! seconds instead of after the whole wait.

use std::future::Future;
use std::time::Duration;

/// The first pause after a failed try.
pub const FIRST_PAUSE: Duration = Duration::from_millis(500);
/// The longest pause between tries.
pub const MAX_PAUSE: Duration = Duration::from_secs(5);

/// How a bounded retry ended without success.
#[derive(Debug, PartialEq, Eq)]
pub enum GaveUp<E> {
    /// The error can never go away by retrying.
    Permanent(E),
    /// Every try failed until the wait was spent.
    Exhausted {
        /// How many tries were made.
        tries: u32,
        /// How long was spent, tries and pauses.
        waited: Duration,
        /// The last try's error.
        last: E,
    },
}

/// Runs `try_once` until it succeeds, returns a `permanent` error, or `wait` is spent (tokio
/// time, so tests run on paused time). Pauses double from [`FIRST_PAUSE`] to [`MAX_PAUSE`] and
/// never reach past the deadline; the last try starts at the deadline at the latest. Each try
/// is bounded by its own timeouts (the driver's connect and request timeouts), not here.
/// `on_failure(try, error, pause)` is told about each failure that will be retried.
pub async fn retry_until<T, E, F, Fut>(
    wait: Duration,
    mut try_once: F,
    permanent: impl Fn(&E) -> bool,
    mut on_failure: impl FnMut(u32, &E, Duration),
) -> Result<T, GaveUp<E>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let start = tokio::time::Instant::now();
    let deadline = start + wait;
    let mut pause = FIRST_PAUSE;
    let mut tries = 0u32;
    loop {
        tries += 1;
        let error = match try_once().await {
            Ok(value) => return Ok(value),
            Err(e) if permanent(&e) => return Err(GaveUp::Permanent(e)),
            Err(e) => e,
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Err(GaveUp::Exhausted {
                tries,
                waited: start.elapsed(),
                last: error,
            });
        }
        let this_pause = pause.min(left);
        on_failure(tries, &error, this_pause);
        tokio::time::sleep(this_pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[derive(Debug, PartialEq, Eq)]
    enum E {
        Down,
        Fatal,
    }

    #[tokio::test(start_paused = true)]
    async fn retries_until_the_cluster_answers() {
        let calls = Cell::new(0);
        let mut pauses = vec![];
        let start = tokio::time::Instant::now();
        let got = retry_until(
            Duration::from_secs(60),
            || {
                calls.set(calls.get() + 1);
                let n = calls.get();
                async move { if n < 4 { Err(E::Down) } else { Ok(n) } }
            },
            |e| *e == E::Fatal,
            |_, _, pause| pauses.push(pause),
        )
        .await;
        assert_eq!(got, Ok(4));
        assert_eq!(pauses, [500, 1000, 2000].map(Duration::from_millis));
        assert_eq!(start.elapsed(), Duration::from_millis(3500));
    }

    #[tokio::test(start_paused = true)]
    async fn a_permanent_error_fails_at_once() {
        let calls = Cell::new(0);
        let start = tokio::time::Instant::now();
        let got: Result<(), _> = retry_until(
            Duration::from_secs(60),
            || {
                calls.set(calls.get() + 1);
                async { Err(E::Fatal) }
            },
            |e| *e == E::Fatal,
            |_, _, _| panic!("a permanent error is not retried"),
        )
        .await;
        assert_eq!(got, Err(GaveUp::Permanent(E::Fatal)));
        assert_eq!(calls.get(), 1);
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_at_the_deadline_with_the_last_error() {
        let mut pauses = vec![];
        let start = tokio::time::Instant::now();
        let got: Result<(), _> = retry_until(
            Duration::from_secs(20),
            || async { Err(E::Down) },
            |e| *e == E::Fatal,
            |_, _, pause| pauses.push(pause),
        )
        .await;
        // 0.5 + 1 + 2 + 4 + 5 + 5 = 17.5 s, then a 2.5 s pause up to the deadline, a last try.
        assert_eq!(
            pauses,
            [500, 1000, 2000, 4000, 5000, 5000, 2500].map(Duration::from_millis)
        );
        assert_eq!(
            got,
            Err(GaveUp::Exhausted {
                tries: 8,
                waited: Duration::from_secs(20),
                last: E::Down
            })
        );
        assert_eq!(start.elapsed(), Duration::from_secs(20));
    }

    #[tokio::test(start_paused = true)]
    async fn zero_wait_is_one_try() {
        let calls = Cell::new(0);
        let got: Result<(), _> = retry_until(
            Duration::ZERO,
            || {
                calls.set(calls.get() + 1);
                async { Err(E::Down) }
            },
            |_| false,
            |_, _, _| panic!("no pause without a wait"),
        )
        .await;
        assert!(matches!(got, Err(GaveUp::Exhausted { tries: 1, .. })));
        assert_eq!(calls.get(), 1);
    }
}
