//! The one home of "what happens after an attempt": classification and backoff.
//!
//! [`classify`] is a pure function from an [`AttemptResult`] to a [`Verdict`]; the table below is
//! the whole policy, and nothing else in hookline decides whether to retry. [`RetryPolicy`] turns a
//! retryable verdict into a [`Decision`]: when to try again (full jitter, `Retry-After` honoured
//! and clamped), or dead-letter because the total window, measured from the first attempt, is
//! spent.
//!
//! | attempt result                                   | verdict                         |
//! |--------------------------------------------------|---------------------------------|
//! | 2xx                                              | success                         |
//! | 408, 425, 429, 5xx                               | retry (`Retry-After` honoured)  |
//! | timeout, connect, dns, tls                       | retry                           |
//! | 410 Gone                                         | dead, and disable the endpoint  |
//! | 3xx (never followed), 409 and every other 4xx    | dead                            |
//! | 1xx or any status outside 200..=599              | dead                            |
//! | ssrf_blocked, insecure_scheme, invalid_url       | dead                            |
//! | not_sent (a refusal; never classified)           | dead                            |
//!
//! 408 (Request Timeout) and 425 (Too Early) say "the same request may succeed later", so they
//! retry. 409 (Conflict) is the receiver rejecting the event against its own state; sending the
//! same bytes again does not change that, so it is dead like other 4xx. SSRF refusals and bad
//! URLs are properties of the endpoint's configuration, not of the moment, so retrying them only
//! delays the dead letter an operator needs to see.

use std::fmt;
use std::time::{Duration, SystemTime};

use rand::Rng;
use serde::Deserialize;

use crate::attempt::{AttemptResult, ErrorClass};
use crate::dead_reason::DeadReason;

/// What an attempt's result means for its delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The receiver accepted the delivery.
    Success,
    /// Worth trying again; `retry_after` is the receiver's `Retry-After`, when it sent a
    /// parseable one, already turned into a delay from the classification time.
    Retry {
        /// The receiver's requested delay, unclamped.
        retry_after: Option<Duration>,
    },
    /// Never worth trying again.
    Dead {
        /// Why, in the dead-letter vocabulary.
        reason: DeadReason,
        /// The receiver said the endpoint is gone (410): stop sending to it at all.
        disable_endpoint: bool,
    },
}

/// Classifies one attempt's result. `now` only serves to turn an HTTP-date `Retry-After` into a
/// delay; the function is otherwise pure.
pub fn classify(result: &AttemptResult, now: SystemTime) -> Verdict {
    match result {
        AttemptResult::Response(response) => match response.status {
            200..=299 => Verdict::Success,
            408 | 425 | 429 | 500..=599 => Verdict::Retry {
                retry_after: response
                    .retry_after
                    .as_deref()
                    .and_then(|v| parse_retry_after(v, now)),
            },
            410 => Verdict::Dead {
                reason: DeadReason::Gone,
                disable_endpoint: true,
            },
            300..=399 => dead(DeadReason::Redirect),
            _ => dead(DeadReason::HttpStatus),
        },
        AttemptResult::Failed { class, .. } => match class {
            ErrorClass::Timeout | ErrorClass::Connect | ErrorClass::Dns | ErrorClass::Tls => {
                Verdict::Retry { retry_after: None }
            }
            ErrorClass::SsrfBlocked => dead(DeadReason::SsrfBlocked),
            ErrorClass::InsecureScheme => dead(DeadReason::InsecureScheme),
            ErrorClass::InvalidUrl => dead(DeadReason::InvalidUrl),
            // A failure record never carries these two (they describe responses), but the
            // table stays total so a new caller cannot make a retry loop out of them.
            ErrorClass::HttpStatus => dead(DeadReason::HttpStatus),
            ErrorClass::Redirect => dead(DeadReason::Redirect),
            // A refusal's reason is its caller's (endpoint deleted or disabled, no key, window);
            // it is never classified, and dead, not retried, if it ever were.
            ErrorClass::NotSent => dead(DeadReason::EndpointDisabled),
        },
    }
}

fn dead(reason: DeadReason) -> Verdict {
    Verdict::Dead {
        reason,
        disable_endpoint: false,
    }
}

/// Parses a `Retry-After` value: delta-seconds (`120`) or an HTTP-date. A date in the past means
/// "now" (zero delay). Anything else is `None`, and the caller falls back to backoff.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Absurdly long digit strings saturate rather than fail: the cap clamps them anyway.
        return Some(Duration::from_secs(
            value.parse::<u64>().unwrap_or(u64::MAX),
        ));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The retry schedule: `delay(n) = uniform(0, min(cap, base * multiplier^(n-1)))` for retry n
/// (full jitter), `Retry-After` clamped to `cap`, and a total `window` from the first attempt.
#[derive(Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    /// Upper bound of the first retry's delay.
    #[serde(with = "humantime_serde")]
    pub base: Duration,
    /// Growth of the upper bound per retry.
    pub multiplier: f64,
    /// No delay (backoff or `Retry-After`) exceeds this.
    #[serde(with = "humantime_serde")]
    pub cap: Duration,
    /// Measured from the first attempt: a retry due after it becomes a dead letter.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
}

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("base", &humantime::format_duration(self.base).to_string())
            .field("multiplier", &self.multiplier)
            .field("cap", &humantime::format_duration(self.cap).to_string())
            .field(
                "window",
                &humantime::format_duration(self.window).to_string(),
            )
            .finish()
    }
}

impl Default for RetryPolicy {
    /// base 30 s, multiplier 2, cap 1 h, window 24 h.
    fn default() -> Self {
        RetryPolicy {
            base: Duration::from_secs(30),
            multiplier: 2.0,
            cap: Duration::from_secs(3600),
            window: Duration::from_secs(24 * 3600),
        }
    }
}

/// A [`RetryPolicy`] that cannot work, and which field is wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    /// `base` is zero.
    #[error("retry.base must be greater than zero")]
    ZeroBase,
    /// `multiplier` is below 1, NaN or infinite.
    #[error("retry.multiplier must be a finite number >= 1, got {0}")]
    BadMultiplier(f64),
    /// `cap` is below `base`.
    #[error("retry.cap ({cap}) must be at least retry.base ({base})")]
    CapBelowBase {
        /// The configured cap, human-readable.
        cap: String,
        /// The configured base, human-readable.
        base: String,
    },
    /// `window` is zero.
    #[error("retry.window must be greater than zero")]
    ZeroWindow,
}

/// What to do with a delivery after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Delivered; nothing more to do.
    Done,
    /// Try again after `delay` (measured from the decision).
    Retry {
        /// How long to wait.
        delay: Duration,
    },
    /// Dead-letter it.
    DeadLetter {
        /// Why.
        reason: DeadReason,
        /// Also disable the endpoint (410).
        disable_endpoint: bool,
    },
}

impl RetryPolicy {
    /// Checks the policy, naming the field that is wrong.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.base.is_zero() {
            return Err(PolicyError::ZeroBase);
        }
        if !self.multiplier.is_finite() || self.multiplier < 1.0 {
            return Err(PolicyError::BadMultiplier(self.multiplier));
        }
        if self.cap < self.base {
            return Err(PolicyError::CapBelowBase {
                cap: humantime::format_duration(self.cap).to_string(),
                base: humantime::format_duration(self.base).to_string(),
            });
        }
        if self.window.is_zero() {
            return Err(PolicyError::ZeroWindow);
        }
        Ok(())
    }

    /// The upper bound of retry `n`'s delay (n = 1 for the first retry):
    /// `min(cap, base * multiplier^(n-1))`.
    pub fn ceiling(&self, retry: u32) -> Duration {
        let exponent = retry.saturating_sub(1).min(i32::MAX as u32) as i32;
        let bound = self.base.as_secs_f64() * self.multiplier.powi(exponent);
        // NaN cannot arise from a validated policy; infinity and overflow land on the cap.
        if bound.is_finite() && bound < self.cap.as_secs_f64() {
            Duration::from_secs_f64(bound)
        } else {
            self.cap
        }
    }

    /// The delay before retry `n`: the receiver's `Retry-After` clamped to `cap` when given,
    /// otherwise a uniform draw from `[0, ceiling(n)]`.
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>, rng: &mut impl Rng) -> Duration {
        match retry_after {
            Some(requested) => requested.min(self.cap),
            None => {
                let ceiling = self.ceiling(retry).as_nanos() as u64;
                Duration::from_nanos(rng.random_range(0..=ceiling))
            }
        }
    }

    /// Decides what follows an attempt.
    ///
    /// `attempts_made` counts every attempt so far including this one (so the retry about to be
    /// scheduled is retry number `attempts_made`); `elapsed` is the time since the first attempt
    /// started. A retry whose due time would fall past `window` becomes a dead letter.
    pub fn decide(
        &self,
        verdict: Verdict,
        attempts_made: u32,
        elapsed: Duration,
        rng: &mut impl Rng,
    ) -> Decision {
        match verdict {
            Verdict::Success => Decision::Done,
            Verdict::Dead {
                reason,
                disable_endpoint,
            } => Decision::DeadLetter {
                reason,
                disable_endpoint,
            },
            Verdict::Retry { retry_after } => {
                let delay = self.delay(attempts_made.max(1), retry_after, rng);
                if elapsed.saturating_add(delay) > self.window {
                    Decision::DeadLetter {
                        reason: DeadReason::WindowExhausted,
                        disable_endpoint: false,
                    }
                } else {
                    Decision::Retry { delay }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attempt::HttpResponse;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn status(code: u16) -> AttemptResult {
        AttemptResult::Response(HttpResponse {
            status: code,
            retry_after: None,
            body: vec![],
        })
    }

    fn status_with_retry_after(code: u16, value: &str) -> AttemptResult {
        AttemptResult::Response(HttpResponse {
            status: code,
            retry_after: Some(value.into()),
            body: vec![],
        })
    }

    fn failed(class: ErrorClass) -> AttemptResult {
        AttemptResult::Failed {
            class,
            detail: String::new(),
        }
    }

    const RETRY: Verdict = Verdict::Retry { retry_after: None };

    #[test]
    fn the_table() {
        let now = SystemTime::now();
        for code in [200, 201, 204, 299] {
            assert_eq!(classify(&status(code), now), Verdict::Success, "{code}");
        }
        for code in [408, 425, 429, 500, 502, 503, 504, 599] {
            assert_eq!(classify(&status(code), now), RETRY, "{code}");
        }
        for code in [400, 401, 403, 404, 405, 409, 413, 422, 451, 100, 600, 999] {
            assert_eq!(
                classify(&status(code), now),
                dead(DeadReason::HttpStatus),
                "{code}"
            );
        }
        for code in [300, 301, 302, 303, 307, 308] {
            assert_eq!(
                classify(&status(code), now),
                dead(DeadReason::Redirect),
                "{code}"
            );
        }
        assert_eq!(
            classify(&status(410), now),
            Verdict::Dead {
                reason: DeadReason::Gone,
                disable_endpoint: true
            }
        );
        for class in [
            ErrorClass::Timeout,
            ErrorClass::Connect,
            ErrorClass::Dns,
            ErrorClass::Tls,
        ] {
            assert_eq!(classify(&failed(class), now), RETRY, "{class}");
        }
        assert_eq!(
            classify(&failed(ErrorClass::SsrfBlocked), now),
            dead(DeadReason::SsrfBlocked)
        );
        assert_eq!(
            classify(&failed(ErrorClass::InsecureScheme), now),
            dead(DeadReason::InsecureScheme)
        );
        assert_eq!(
            classify(&failed(ErrorClass::InvalidUrl), now),
            dead(DeadReason::InvalidUrl)
        );
    }

    #[test]
    fn only_410_disables_the_endpoint() {
        let now = SystemTime::now();
        for code in 100..1000u16 {
            let disables = matches!(
                classify(&status(code), now),
                Verdict::Dead {
                    disable_endpoint: true,
                    ..
                }
            );
            assert_eq!(disables, code == 410, "{code}");
        }
    }

    #[test]
    fn retry_after_seconds_and_dates() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2026 07:28:00 GMT").unwrap();
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2026 07:28:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2026 07:27:00 GMT", now),
            Some(Duration::ZERO),
            "a past date means now"
        );
        for junk in ["", "-5", "1.5", "soon", "12 s", "Wed, 99 Oct 2026"] {
            assert_eq!(parse_retry_after(junk, now), None, "{junk:?}");
        }
        assert_eq!(
            parse_retry_after("99999999999999999999999", now),
            Some(Duration::from_secs(u64::MAX))
        );
        assert_eq!(
            classify(&status_with_retry_after(503, "7"), now),
            Verdict::Retry {
                retry_after: Some(Duration::from_secs(7))
            }
        );
        assert_eq!(classify(&status_with_retry_after(503, "later"), now), RETRY);
        // Retry-After on a dead status does not resurrect it.
        assert_eq!(
            classify(&status_with_retry_after(404, "7"), now),
            dead(DeadReason::HttpStatus)
        );
    }

    #[test]
    fn defaults_and_ceilings() {
        let p = RetryPolicy::default();
        p.validate().unwrap();
        assert_eq!(p.ceiling(1), Duration::from_secs(30));
        assert_eq!(p.ceiling(2), Duration::from_secs(60));
        assert_eq!(p.ceiling(3), Duration::from_secs(120));
        assert_eq!(p.ceiling(7), Duration::from_secs(1920));
        assert_eq!(p.ceiling(8), Duration::from_secs(3600), "clamped to cap");
        assert_eq!(p.ceiling(u32::MAX), Duration::from_secs(3600));
        assert_eq!(p.ceiling(0), p.ceiling(1));
    }

    #[test]
    fn retry_after_is_clamped_to_cap_and_not_jittered() {
        let p = RetryPolicy::default();
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(
            p.delay(1, Some(Duration::from_secs(5)), &mut rng),
            Duration::from_secs(5)
        );
        assert_eq!(
            p.delay(1, Some(Duration::from_secs(86_400)), &mut rng),
            p.cap
        );
    }

    #[test]
    fn window_turns_retries_into_dead_letters() {
        let p = RetryPolicy {
            window: Duration::from_secs(100),
            ..RetryPolicy::default()
        };
        let mut rng = StdRng::seed_from_u64(7);
        let ra = |s| Verdict::Retry {
            retry_after: Some(Duration::from_secs(s)),
        };
        assert_eq!(
            p.decide(ra(10), 3, Duration::from_secs(90), &mut rng),
            Decision::Retry {
                delay: Duration::from_secs(10)
            },
            "due exactly at the window's end is still inside it"
        );
        assert_eq!(
            p.decide(ra(11), 3, Duration::from_secs(90), &mut rng),
            Decision::DeadLetter {
                reason: DeadReason::WindowExhausted,
                disable_endpoint: false
            }
        );
        assert_eq!(
            p.decide(Verdict::Success, 9, Duration::MAX, &mut rng),
            Decision::Done
        );
    }

    #[test]
    fn validation_names_the_field() {
        let ok = RetryPolicy::default();
        let bad = |p: RetryPolicy| p.validate().unwrap_err().to_string();
        assert!(
            bad(RetryPolicy {
                base: Duration::ZERO,
                ..ok
            })
            .contains("retry.base")
        );
        assert!(
            bad(RetryPolicy {
                multiplier: 0.5,
                ..ok
            })
            .contains("retry.multiplier")
        );
        assert!(
            bad(RetryPolicy {
                multiplier: f64::NAN,
                ..ok
            })
            .contains("retry.multiplier")
        );
        assert!(
            bad(RetryPolicy {
                cap: Duration::from_secs(1),
                ..ok
            })
            .contains("retry.cap")
        );
        assert!(
            bad(RetryPolicy {
                window: Duration::ZERO,
                ..ok
            })
            .contains("retry.window")
        );
    }

    #[test]
    fn deserialises_human_durations() {
        let p: RetryPolicy =
            toml::from_str("base = \"30s\"\nmultiplier = 2\ncap = \"1h\"\nwindow = \"24h\"")
                .unwrap();
        assert_eq!(p, RetryPolicy::default());
        let err = toml::from_str::<RetryPolicy>(
            "base = \"30 parsecs\"\nmultiplier = 2\ncap = \"1h\"\nwindow = \"1h\"",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("base"), "{err}");
    }

    /// Drives a receiver that always fails through the policy on paused tokio time: every wait
    /// stays under its ceiling, and the last retry lands inside the window.
    #[tokio::test(start_paused = true)]
    async fn a_failing_endpoint_is_retried_inside_the_window_then_dead_lettered() {
        let p = RetryPolicy {
            base: Duration::from_secs(30),
            multiplier: 2.0,
            cap: Duration::from_secs(3600),
            window: Duration::from_secs(6 * 3600),
        };
        let mut rng = StdRng::seed_from_u64(42);
        let start = tokio::time::Instant::now();
        let mut attempts = 0u32;
        let outcome = loop {
            attempts += 1;
            let verdict = classify(&status(503), SystemTime::now());
            match p.decide(verdict, attempts, start.elapsed(), &mut rng) {
                Decision::Retry { delay } => {
                    assert!(
                        delay <= p.ceiling(attempts),
                        "retry {attempts} waited {delay:?}"
                    );
                    tokio::time::sleep(delay).await;
                }
                other => break other,
            }
        };
        assert_eq!(
            outcome,
            Decision::DeadLetter {
                reason: DeadReason::WindowExhausted,
                disable_endpoint: false
            }
        );
        assert!(start.elapsed() <= p.window);
        // Full jitter averages half the ceiling, so six hours holds well over ten attempts.
        assert!(attempts > 10, "only {attempts} attempts in the window");
    }

    /// 503, 503 with Retry-After, then 200: two retries, the second waiting exactly as asked.
    #[tokio::test(start_paused = true)]
    async fn retry_after_sets_the_wait_on_paused_time() {
        let p = RetryPolicy::default();
        let mut rng = StdRng::seed_from_u64(3);
        let script = [status(503), status_with_retry_after(503, "42"), status(200)];
        let start = tokio::time::Instant::now();
        let mut waits = vec![];
        for (i, result) in script.iter().enumerate() {
            let verdict = classify(result, SystemTime::now());
            match p.decide(verdict, i as u32 + 1, start.elapsed(), &mut rng) {
                Decision::Retry { delay } => {
                    waits.push(delay);
                    tokio::time::sleep(delay).await;
                }
                Decision::Done => break,
                d => panic!("unexpected {d:?}"),
            }
        }
        assert_eq!(waits.len(), 2);
        assert!(waits[0] <= Duration::from_secs(30));
        assert_eq!(waits[1], Duration::from_secs(42));
        // tokio's timer wheel rounds each sleep up to the next millisecond.
        let slept = start.elapsed();
        assert!(
            slept >= waits[0] + waits[1] && slept <= waits[0] + waits[1] + Duration::from_millis(2)
        );
    }

    fn policies() -> impl Strategy<Value = RetryPolicy> {
        (1u64..600, 1.0f64..10.0, 0u64..100_000, 1u64..1_000_000).prop_map(
            |(base, multiplier, extra_cap, window)| RetryPolicy {
                base: Duration::from_secs(base),
                multiplier,
                cap: Duration::from_secs(base + extra_cap),
                window: Duration::from_secs(window),
            },
        )
    }

    proptest! {
        #[test]
        fn delay_never_exceeds_ceiling_or_cap(
            p in policies(), retry in 0u32..200, seed: u64, ra in proptest::option::of(0u64..10_000_000)
        ) {
            let mut rng = StdRng::seed_from_u64(seed);
            let d = p.delay(retry, ra.map(Duration::from_secs), &mut rng);
            prop_assert!(d <= p.cap);
            if ra.is_none() {
                prop_assert!(d <= p.ceiling(retry));
            }
        }

        #[test]
        fn ceilings_grow_monotonically_to_the_cap(p in policies(), retry in 1u32..200) {
            prop_assert!(p.ceiling(retry) <= p.ceiling(retry + 1));
            prop_assert!(p.ceiling(retry) <= p.cap);
            prop_assert!(p.ceiling(retry) >= p.base.min(p.cap));
        }

        #[test]
        fn a_scheduled_retry_is_always_due_inside_the_window(
            p in policies(), attempts in 1u32..100, elapsed in 0u64..2_000_000, seed: u64,
            ra in proptest::option::of(0u64..10_000_000)
        ) {
            let mut rng = StdRng::seed_from_u64(seed);
            let elapsed = Duration::from_secs(elapsed);
            let verdict = Verdict::Retry { retry_after: ra.map(Duration::from_secs) };
            match p.decide(verdict, attempts, elapsed, &mut rng) {
                Decision::Retry { delay } => prop_assert!(elapsed + delay <= p.window),
                Decision::DeadLetter { reason, .. } => {
                    prop_assert_eq!(reason, DeadReason::WindowExhausted)
                }
                Decision::Done => prop_assert!(false, "a retry verdict never ends done"),
            }
        }

        #[test]
        fn classification_is_total_and_stable(code in 0u16..1000, ra in ".{0,40}") {
            let now = SystemTime::now();
            let result = status_with_retry_after(code, &ra);
            prop_assert_eq!(classify(&result, now), classify(&result, now));
        }
    }
}
