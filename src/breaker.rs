//! The per-endpoint circuit breaker: stop sending to an endpoint that keeps failing.
//!
//! ```text
//!            N consecutive failures, or failure ratio over the recent window
//!   Closed ─────────────────────────────────────────────────────────────────► Open
//!     ▲                                                                      │  ▲
//!     │ probe succeeds                                     cool-down passed  │  │ probe fails
//!     │                                                  (admit → Probe)     ▼  │ (cool-down grows)
//!     └──────────────────────────────────────────────────────────────── HalfOpen
//! ```
//!
//! While the breaker is open, [`Breaker::admit`] answers [`Admission::Rejected`] with the time
//! the next probe may go, so the delivery stage parks the record in a delay tier with that
//! `not_before` instead of holding it in memory. Half-open admits exactly one probe; its outcome
//! decides. Each re-open without a close in between multiplies the cool-down, up to a maximum, so
//! an endpoint that stays down costs one probe per few minutes, not one per 30 s.
//!
//! Outcomes of calls admitted before the last transition are stale and ignored: a slow request
//! sent while the breaker was closed must not decide a half-open breaker.
//!
//! The breaker is plain data; time is passed in (`tokio::time::Instant`, so tests run on paused
//! time) and transitions are returned to the caller, which emits the telemetry.

use std::collections::VecDeque;
use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

use crate::attempt::{AttemptResult, ErrorClass};

/// Largest accepted `window_size`: the window is a ring of one flag per outcome, kept per
/// endpoint, so it stays small.
pub const MAX_WINDOW_SIZE: u32 = 1000;

/// What an attempt says about the endpoint's health (not about the delivery: the retry policy
/// decides that). Shared by the breaker and the lane's concurrency control.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The endpoint answered in time with a status that is not an overload signal: 2xx, but also
    /// 3xx and 4xx other than 408/429. A receiver that answers 404 is up; its deliveries
    /// dead-letter on their own, and opening the breaker would only park them.
    Healthy,
    /// The endpoint is struggling: total timeout, 408, 429 or 5xx. Halves the lane's
    /// concurrency and counts as a breaker failure.
    Overload,
    /// The endpoint could not be reached: DNS, connect or TLS failure. Counts as a breaker
    /// failure; says nothing about how much concurrency it can take.
    Unreachable,
}

impl Outcome {
    /// What an attempt's result says about its endpoint. `None` when the request never left
    /// (SSRF refusal, insecure scheme, invalid URL): those are configuration problems that say
    /// nothing about the endpoint's health.
    pub fn of(result: &AttemptResult) -> Option<Outcome> {
        match result {
            AttemptResult::Response(r) => Some(match r.status {
                408 | 429 | 500..=599 => Outcome::Overload,
                _ => Outcome::Healthy,
            }),
            AttemptResult::Failed { class, .. } => match class {
                ErrorClass::Timeout => Some(Outcome::Overload),
                ErrorClass::Dns | ErrorClass::Connect | ErrorClass::Tls => {
                    Some(Outcome::Unreachable)
                }
                ErrorClass::SsrfBlocked
                | ErrorClass::InsecureScheme
                | ErrorClass::InvalidUrl
                | ErrorClass::HttpStatus
                | ErrorClass::Redirect
                | ErrorClass::NotSent => None,
            },
        }
    }

    /// Whether the breaker counts this outcome as a failure.
    pub fn is_failure(self) -> bool {
        !matches!(self, Outcome::Healthy)
    }

    /// The stable string form, for metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Healthy => "healthy",
            Outcome::Overload => "overload",
            Outcome::Unreachable => "unreachable",
        }
    }
}

/// Breaker settings (`delivery.breaker` in the configuration file), shared by every endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerConfig {
    /// Open after this many failures in a row.
    pub failure_threshold: u32,
    /// How many recent outcomes the failure ratio is computed over.
    pub window_size: u32,
    /// The ratio rule applies only once the window holds at least this many outcomes.
    pub min_samples: u32,
    /// Open when failures / outcomes in the window reach this ratio (0 < ratio <= 1).
    pub failure_ratio: f64,
    /// How long the breaker stays open the first time.
    #[serde(with = "humantime_serde")]
    pub cool_down: Duration,
    /// Each re-open (a failed probe) multiplies the cool-down by this much...
    pub cool_down_multiplier: f64,
    /// ...up to this.
    #[serde(with = "humantime_serde")]
    pub max_cool_down: Duration,
    /// A probe whose outcome has not come back after this long is presumed lost, and another
    /// probe may go. Longer than any attempt can take; it only guards against a caller's lost
    /// permit wedging the endpoint forever.
    #[serde(with = "humantime_serde")]
    pub probe_timeout: Duration,
}

impl Default for BreakerConfig {
    /// 5 consecutive failures, or >= 50% of the last 20 with at least 10 samples; cool-down 30 s,
    /// doubling per re-open up to 5 min; probes presumed lost after 1 min.
    fn default() -> Self {
        BreakerConfig {
            failure_threshold: 5,
            window_size: 20,
            min_samples: 10,
            failure_ratio: 0.5,
            cool_down: Duration::from_secs(30),
            cool_down_multiplier: 2.0,
            max_cool_down: Duration::from_secs(300),
            probe_timeout: Duration::from_secs(60),
        }
    }
}

/// A [`BreakerConfig`] that cannot work: which key, and what it must be.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BreakerConfigError {
    /// One key is out of range.
    #[error("delivery.breaker.{key} must be {must}")]
    Invalid {
        /// The key, under `delivery.breaker`.
        key: &'static str,
        /// What it must be.
        must: String,
    },
}

fn invalid(key: &'static str, must: impl Into<String>) -> Result<(), BreakerConfigError> {
    Err(BreakerConfigError::Invalid {
        key,
        must: must.into(),
    })
}

impl BreakerConfig {
    /// Checks the settings, naming the key that is wrong.
    pub fn validate(&self) -> Result<(), BreakerConfigError> {
        if self.failure_threshold < 1 {
            return invalid("failure_threshold", ">= 1");
        }
        if !(1..=MAX_WINDOW_SIZE).contains(&self.window_size) {
            return invalid("window_size", format!("between 1 and {MAX_WINDOW_SIZE}"));
        }
        if !(1..=self.window_size).contains(&self.min_samples) {
            return invalid(
                "min_samples",
                format!("between 1 and window_size ({})", self.window_size),
            );
        }
        if !(self.failure_ratio > 0.0 && self.failure_ratio <= 1.0) {
            return invalid(
                "failure_ratio",
                format!("in (0, 1], got {}", self.failure_ratio),
            );
        }
        if self.cool_down.is_zero() {
            return invalid("cool_down", "greater than zero");
        }
        if !self.cool_down_multiplier.is_finite() || self.cool_down_multiplier < 1.0 {
            return invalid(
                "cool_down_multiplier",
                format!("a finite number >= 1, got {}", self.cool_down_multiplier),
            );
        }
        if self.max_cool_down < self.cool_down {
            return invalid(
                "max_cool_down",
                format!(
                    "at least cool_down ({})",
                    humantime::format_duration(self.cool_down)
                ),
            );
        }
        if self.probe_timeout.is_zero() {
            return invalid("probe_timeout", "greater than zero");
        }
        Ok(())
    }

    /// The cool-down after the `opens`-th opening in a row (1 = first):
    /// `min(max_cool_down, cool_down * multiplier^(opens-1))`.
    pub fn cool_down_after(&self, opens: u32) -> Duration {
        let exponent = opens.saturating_sub(1).min(i32::MAX as u32) as i32;
        let secs = self.cool_down.as_secs_f64() * self.cool_down_multiplier.powi(exponent);
        if secs.is_finite() && secs < self.max_cool_down.as_secs_f64() {
            Duration::from_secs_f64(secs)
        } else {
            self.max_cool_down
        }
    }
}

/// The breaker's state, as reported to metrics and the admin API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Calls flow.
    Closed,
    /// Calls are refused until the cool-down passes. Stays reported as open after the cool-down
    /// until the next `admit` sends the probe.
    Open,
    /// One probe decides.
    HalfOpen,
}

impl BreakerState {
    /// The stable string form, for metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

/// The answer to "may this call go to the endpoint now?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Closed: go ahead. `closed` names the closed period that admitted the call: its outcome
    /// counts only if the breaker has not opened since.
    Allowed {
        /// Which closed period.
        closed: u64,
    },
    /// Half-open: this call is the probe whose outcome decides.
    Probe,
    /// Open (or a probe is out): do not call; the next probe may go at `retry_at`, so a parked
    /// record should come back then.
    Rejected {
        /// When to try again.
        retry_at: Instant,
    },
}

/// Why the breaker opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpenReason {
    /// `failure_threshold` failures in a row.
    ConsecutiveFailures,
    /// The failure ratio over the recent window reached `failure_ratio`.
    FailureRatio,
    /// The half-open probe failed.
    ProbeFailed,
}

impl OpenReason {
    /// The stable string form, for metric labels and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            OpenReason::ConsecutiveFailures => "consecutive_failures",
            OpenReason::FailureRatio => "failure_ratio",
            OpenReason::ProbeFailed => "probe_failed",
        }
    }
}

/// A state change the caller reports ("breaker opened" / "breaker closed").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// The breaker opened.
    Opened {
        /// Why.
        reason: OpenReason,
        /// How long it stays open.
        cool_down: Duration,
        /// When the probe may go.
        retry_at: Instant,
    },
    /// A probe succeeded and the breaker closed.
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Closed,
    Open {
        until: Instant,
    },
    /// `probe_since` is when the outstanding probe was admitted, `None` when none is out.
    HalfOpen {
        probe_since: Option<Instant>,
    },
}

/// One endpoint's circuit breaker.
#[derive(Debug, Clone)]
pub struct Breaker {
    config: BreakerConfig,
    phase: Phase,
    consecutive_failures: u32,
    /// The last `window_size` outcomes while closed; `true` = failure.
    recent: VecDeque<bool>,
    recent_failures: u32,
    /// Openings since the breaker last closed: drives the growing cool-down.
    opens_in_row: u32,
    /// Counts the breaker's openings: names the current closed period in [`Admission::Allowed`].
    closed_period: u64,
}

impl Breaker {
    /// A closed breaker. `config` should have passed [`BreakerConfig::validate`].
    pub fn new(config: BreakerConfig) -> Breaker {
        Breaker {
            config,
            phase: Phase::Closed,
            consecutive_failures: 0,
            recent: VecDeque::with_capacity(config.window_size.min(MAX_WINDOW_SIZE) as usize),
            recent_failures: 0,
            opens_in_row: 0,
            closed_period: 0,
        }
    }

    /// The current state.
    pub fn state(&self) -> BreakerState {
        match self.phase {
            Phase::Closed => BreakerState::Closed,
            Phase::Open { .. } => BreakerState::Open,
            Phase::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// The settings in use.
    pub fn config(&self) -> &BreakerConfig {
        &self.config
    }

    /// Asks whether a call may go now. An open breaker whose cool-down has passed turns
    /// half-open and admits this call as the probe.
    pub fn admit(&mut self, now: Instant) -> Admission {
        match self.phase {
            Phase::Closed => Admission::Allowed {
                closed: self.closed_period,
            },
            Phase::Open { until } if now < until => Admission::Rejected { retry_at: until },
            Phase::Open { .. } | Phase::HalfOpen { probe_since: None } => {
                self.phase = Phase::HalfOpen {
                    probe_since: Some(now),
                };
                Admission::Probe
            }
            Phase::HalfOpen {
                probe_since: Some(since),
            } => {
                let lost_at = since + self.config.probe_timeout;
                if now >= lost_at {
                    self.phase = Phase::HalfOpen {
                        probe_since: Some(now),
                    };
                    Admission::Probe
                } else {
                    // If the probe fails the breaker re-opens for at least `cool_down`; if it
                    // succeeds, parked records come back that much later than they could have,
                    // which is the price of not holding them in memory.
                    Admission::Rejected {
                        retry_at: lost_at.min(now + self.config.cool_down),
                    }
                }
            }
        }
    }

    /// Records the outcome of a call admitted as `admission`. Returns the transition it caused.
    /// Outcomes that no longer apply (a normal call finishing after the breaker opened, even
    /// once it has closed again; a probe finishing after another probe decided) are ignored, as
    /// is a `Rejected` admission. A request sent before the breaker opened can answer long after
    /// (up to the HTTP timeout, which may exceed the cool-down): counting its failure in the new
    /// closed period would reopen a breaker whose probe just found the endpoint healthy.
    pub fn record(
        &mut self,
        admission: Admission,
        outcome: Outcome,
        now: Instant,
    ) -> Option<Transition> {
        let failed = outcome.is_failure();
        match (self.phase, admission) {
            (Phase::Closed, Admission::Allowed { closed }) if closed == self.closed_period => {
                if failed {
                    self.consecutive_failures += 1;
                } else {
                    self.consecutive_failures = 0;
                }
                if self.recent.len() >= self.config.window_size as usize
                    && self.recent.pop_front() == Some(true)
                {
                    self.recent_failures -= 1;
                }
                self.recent.push_back(failed);
                self.recent_failures += u32::from(failed);
                if self.consecutive_failures >= self.config.failure_threshold {
                    Some(self.open(OpenReason::ConsecutiveFailures, now))
                } else if failed
                    && self.recent.len() >= self.config.min_samples as usize
                    && f64::from(self.recent_failures)
                        >= self.config.failure_ratio * self.recent.len() as f64
                {
                    Some(self.open(OpenReason::FailureRatio, now))
                } else {
                    None
                }
            }
            (Phase::HalfOpen { .. }, Admission::Probe) if failed => {
                Some(self.open(OpenReason::ProbeFailed, now))
            }
            (Phase::HalfOpen { .. }, Admission::Probe) => {
                self.close();
                Some(Transition::Closed)
            }
            _ => None,
        }
    }

    /// Gives back an admission whose call never happened (the lane was full, the request was
    /// refused before sending, the partition was revoked). A returned probe lets the next call
    /// probe at once instead of waiting for `probe_timeout`.
    pub fn abandon(&mut self, admission: Admission) {
        if admission == Admission::Probe
            && let Phase::HalfOpen { .. } = self.phase
        {
            self.phase = Phase::HalfOpen { probe_since: None };
        }
    }

    fn open(&mut self, reason: OpenReason, now: Instant) -> Transition {
        self.opens_in_row = self.opens_in_row.saturating_add(1);
        self.closed_period = self.closed_period.wrapping_add(1);
        let cool_down = self.config.cool_down_after(self.opens_in_row);
        let retry_at = now + cool_down;
        self.phase = Phase::Open { until: retry_at };
        self.clear_window();
        Transition::Opened {
            reason,
            cool_down,
            retry_at,
        }
    }

    fn close(&mut self) {
        self.phase = Phase::Closed;
        self.opens_in_row = 0;
        self.clear_window();
    }

    fn clear_window(&mut self) {
        self.consecutive_failures = 0;
        self.recent.clear();
        self.recent_failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attempt::HttpResponse;
    use tokio::time::advance;

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn breaker() -> Breaker {
        Breaker::new(BreakerConfig::default())
    }

    /// Admits and records one call; panics if it was not admitted as `expected`.
    fn call(b: &mut Breaker, outcome: Outcome) -> Option<Transition> {
        let now = Instant::now();
        let a = b.admit(now);
        assert!(
            !matches!(a, Admission::Rejected { .. }),
            "call rejected: {a:?}"
        );
        b.record(a, outcome, now)
    }

    #[test]
    fn outcomes_of_attempts() {
        let status = |status| {
            AttemptResult::Response(HttpResponse {
                status,
                retry_after: None,
                body: vec![],
            })
        };
        let failed = |class| AttemptResult::Failed {
            class,
            detail: String::new(),
        };
        for code in [200, 204, 301, 400, 404, 409, 410, 425] {
            assert_eq!(Outcome::of(&status(code)), Some(Outcome::Healthy), "{code}");
        }
        for code in [408, 429, 500, 503, 599] {
            assert_eq!(
                Outcome::of(&status(code)),
                Some(Outcome::Overload),
                "{code}"
            );
        }
        assert_eq!(
            Outcome::of(&failed(ErrorClass::Timeout)),
            Some(Outcome::Overload)
        );
        for class in [ErrorClass::Dns, ErrorClass::Connect, ErrorClass::Tls] {
            assert_eq!(Outcome::of(&failed(class)), Some(Outcome::Unreachable));
        }
        for class in [
            ErrorClass::SsrfBlocked,
            ErrorClass::InsecureScheme,
            ErrorClass::InvalidUrl,
            ErrorClass::NotSent,
        ] {
            assert_eq!(Outcome::of(&failed(class)), None);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn opens_after_consecutive_failures_and_probes_after_cool_down() {
        let mut b = breaker();
        for _ in 0..4 {
            assert_eq!(call(&mut b, Outcome::Overload), None);
        }
        let opened_at = Instant::now();
        assert_eq!(
            call(&mut b, Outcome::Unreachable),
            Some(Transition::Opened {
                reason: OpenReason::ConsecutiveFailures,
                cool_down: S(30),
                retry_at: opened_at + S(30)
            })
        );
        assert_eq!(b.state(), BreakerState::Open);
        advance(S(29)).await;
        assert_eq!(
            b.admit(Instant::now()),
            Admission::Rejected {
                retry_at: opened_at + S(30)
            }
        );
        advance(S(1)).await;
        let probe = b.admit(Instant::now());
        assert_eq!(probe, Admission::Probe);
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert!(
            matches!(b.admit(Instant::now()), Admission::Rejected { .. }),
            "exactly one probe"
        );
        assert_eq!(
            b.record(probe, Outcome::Healthy, Instant::now()),
            Some(Transition::Closed)
        );
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(
            b.admit(Instant::now()),
            Admission::Allowed { closed: 1 },
            "a new closed period"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_success_resets_the_run() {
        let mut b = Breaker::new(BreakerConfig {
            failure_ratio: 1.0,
            ..BreakerConfig::default()
        });
        for _ in 0..100 {
            for _ in 0..4 {
                assert_eq!(call(&mut b, Outcome::Overload), None);
            }
            assert_eq!(call(&mut b, Outcome::Healthy), None);
        }
        assert_eq!(
            b.state(),
            BreakerState::Closed,
            "no run of 5, ratio below 1"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn opens_on_failure_ratio_only_with_enough_samples() {
        let mut b = breaker();
        // Alternate failure/success: never 5 in a row, ratio exactly 50%.
        let mut opened = None;
        for i in 0..20 {
            let outcome = if i % 2 == 0 {
                Outcome::Overload
            } else {
                Outcome::Healthy
            };
            if let Some(t) = call(&mut b, outcome) {
                opened = Some((i, t));
                break;
            }
        }
        let (i, t) = opened.expect("ratio rule opens");
        assert_eq!(i, 10, "the first failure once 10 samples exist");
        assert!(matches!(
            t,
            Transition::Opened {
                reason: OpenReason::FailureRatio,
                ..
            }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn the_window_slides() {
        let mut b = Breaker::new(BreakerConfig {
            failure_threshold: 100,
            window_size: 10,
            min_samples: 10,
            failure_ratio: 0.5,
            ..BreakerConfig::default()
        });
        // 4 failures then many successes: the failures slide out, later failures start afresh.
        for _ in 0..4 {
            call(&mut b, Outcome::Overload);
        }
        for _ in 0..10 {
            assert_eq!(call(&mut b, Outcome::Healthy), None);
        }
        for _ in 0..4 {
            assert_eq!(call(&mut b, Outcome::Overload), None);
        }
        assert_eq!(b.state(), BreakerState::Closed, "4 of the last 10");
        // A fifth failure in the last 10 meets the ratio.
        assert!(matches!(
            call(&mut b, Outcome::Overload),
            Some(Transition::Opened {
                reason: OpenReason::FailureRatio,
                ..
            })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn failed_probes_grow_the_cool_down_to_its_max() {
        let mut b = breaker();
        for _ in 0..5 {
            call(&mut b, Outcome::Overload);
        }
        let mut cool_downs = vec![];
        for _ in 0..6 {
            let Admission::Rejected { retry_at } = b.admit(Instant::now()) else {
                panic!("open breaker admitted a call");
            };
            tokio::time::sleep_until(retry_at).await;
            let probe = b.admit(Instant::now());
            assert_eq!(probe, Admission::Probe);
            match b.record(probe, Outcome::Overload, Instant::now()) {
                Some(Transition::Opened {
                    reason: OpenReason::ProbeFailed,
                    cool_down,
                    ..
                }) => cool_downs.push(cool_down.as_secs()),
                t => panic!("unexpected {t:?}"),
            }
        }
        assert_eq!(cool_downs, [60, 120, 240, 300, 300, 300]);
        // A success resets the growth.
        advance(S(300)).await;
        let probe = b.admit(Instant::now());
        b.record(probe, Outcome::Healthy, Instant::now());
        for _ in 0..4 {
            call(&mut b, Outcome::Overload);
        }
        assert!(matches!(
            call(&mut b, Outcome::Overload),
            Some(Transition::Opened { cool_down, .. }) if cool_down == S(30)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn stale_outcomes_are_ignored() {
        let mut b = breaker();
        let early = b.admit(Instant::now());
        assert_eq!(early, Admission::Allowed { closed: 0 });
        for _ in 0..5 {
            call(&mut b, Outcome::Overload);
        }
        // A call admitted while closed finishes while open: ignored.
        assert_eq!(b.record(early, Outcome::Overload, Instant::now()), None);
        assert_eq!(b.record(early, Outcome::Healthy, Instant::now()), None);
        advance(S(30)).await;
        let probe = b.admit(Instant::now());
        // ...and while half-open: only the probe decides.
        assert_eq!(b.record(early, Outcome::Healthy, Instant::now()), None);
        assert_eq!(b.state(), BreakerState::HalfOpen);
        let rejected = b.admit(Instant::now());
        assert_eq!(b.record(rejected, Outcome::Healthy, Instant::now()), None);
        assert_eq!(
            b.record(probe, Outcome::Healthy, Instant::now()),
            Some(Transition::Closed)
        );
        // A second probe's late answer cannot re-open a closed breaker.
        assert_eq!(b.record(probe, Outcome::Overload, Instant::now()), None);
        assert_eq!(b.state(), BreakerState::Closed);
        // Nor can calls admitted before it opened, answering late (a cool-down shorter than the
        // HTTP timeout): the closed period that admitted them is over.
        for _ in 0..10 {
            assert_eq!(b.record(early, Outcome::Unreachable, Instant::now()), None);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        // Calls admitted now still count.
        for _ in 0..4 {
            assert_eq!(call(&mut b, Outcome::Unreachable), None);
        }
        assert!(matches!(
            call(&mut b, Outcome::Unreachable),
            Some(Transition::Opened {
                reason: OpenReason::ConsecutiveFailures,
                ..
            })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_probe_is_replaced_and_an_abandoned_one_at_once() {
        let mut b = breaker();
        for _ in 0..5 {
            call(&mut b, Outcome::Overload);
        }
        advance(S(30)).await;
        assert_eq!(b.admit(Instant::now()), Admission::Probe);
        let probed_at = Instant::now();
        advance(S(10)).await;
        assert_eq!(
            b.admit(Instant::now()),
            Admission::Rejected {
                retry_at: Instant::now() + S(30)
            },
            "cool-down from now, while it is before the probe timeout"
        );
        advance(S(40)).await;
        assert_eq!(
            b.admit(Instant::now()),
            Admission::Rejected {
                retry_at: probed_at + S(60)
            }
        );
        advance(S(10)).await;
        let second = b.admit(Instant::now());
        assert_eq!(second, Admission::Probe, "the first probe is presumed lost");
        b.abandon(second);
        assert_eq!(b.admit(Instant::now()), Admission::Probe, "given back");
        b.abandon(Admission::Allowed { closed: 0 });
        assert_eq!(b.state(), BreakerState::HalfOpen);
    }

    #[test]
    fn validation_names_the_key() {
        let ok = BreakerConfig::default();
        assert_eq!(ok.validate(), Ok(()));
        let bad = |c: BreakerConfig| c.validate().unwrap_err().to_string();
        assert_eq!(
            bad(BreakerConfig {
                failure_threshold: 0,
                ..ok
            }),
            "delivery.breaker.failure_threshold must be >= 1"
        );
        assert!(
            bad(BreakerConfig {
                window_size: 0,
                ..ok
            })
            .starts_with("delivery.breaker.window_size")
        );
        assert!(
            bad(BreakerConfig {
                window_size: MAX_WINDOW_SIZE + 1,
                ..ok
            })
            .starts_with("delivery.breaker.window_size")
        );
        assert!(
            bad(BreakerConfig {
                min_samples: 21,
                ..ok
            })
            .starts_with("delivery.breaker.min_samples")
        );
        for ratio in [0.0, 1.5, f64::NAN] {
            assert!(
                bad(BreakerConfig {
                    failure_ratio: ratio,
                    ..ok
                })
                .starts_with("delivery.breaker.failure_ratio")
            );
        }
        assert!(
            bad(BreakerConfig {
                cool_down: Duration::ZERO,
                ..ok
            })
            .starts_with("delivery.breaker.cool_down ")
        );
        assert!(
            bad(BreakerConfig {
                cool_down_multiplier: 0.5,
                ..ok
            })
            .starts_with("delivery.breaker.cool_down_multiplier")
        );
        assert_eq!(
            bad(BreakerConfig {
                max_cool_down: S(10),
                ..ok
            }),
            "delivery.breaker.max_cool_down must be at least cool_down (30s)"
        );
        assert!(
            bad(BreakerConfig {
                probe_timeout: Duration::ZERO,
                ..ok
            })
            .starts_with("delivery.breaker.probe_timeout")
        );
    }

    #[test]
    fn deserialises_with_defaults_and_human_durations() {
        let c: BreakerConfig =
            toml::from_str("cool_down = \"10s\"\nmax_cool_down = \"2m\"").unwrap();
        assert_eq!(c.cool_down, S(10));
        assert_eq!(c.max_cool_down, S(120));
        assert_eq!(c.failure_threshold, 5);
        let empty: BreakerConfig = toml::from_str("").unwrap();
        assert_eq!(empty, BreakerConfig::default());
        assert!(toml::from_str::<BreakerConfig>("treshold = 3").is_err());
    }
}
