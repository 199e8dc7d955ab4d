//! `[retry]`: the backoff policy and the delay tiers.

use std::time::Duration;

use serde::Deserialize;

use super::error::{ConfigError, invalid};
use crate::retry_policy::RetryPolicy;
use crate::serde_field::{duration, durations};

/// Largest delay tier accepted.
pub const MAX_TIER: Duration = Duration::from_secs(7 * 24 * 3600);
/// Most delay tiers accepted (each is a topic and a consumer).
pub const MAX_TIERS: usize = 32;

/// `[retry]`: the backoff policy (see [`RetryPolicy`]) and the delay tiers.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryConfig {
    /// Upper bound of the first retry's delay.
    #[serde(deserialize_with = "duration")]
    pub base: Duration,
    /// Growth of the upper bound per retry.
    pub multiplier: f64,
    /// No delay exceeds this.
    #[serde(deserialize_with = "duration")]
    pub cap: Duration,
    /// Total time from the first attempt after which a delivery is dead-lettered.
    #[serde(deserialize_with = "duration")]
    pub window: Duration,
    /// Delay tiers, ascending; each is a topic `<retry_prefix><tier>`.
    #[serde(deserialize_with = "durations")]
    pub tiers: Vec<Duration>,
}

impl Default for RetryConfig {
    fn default() -> Self {
        let p = RetryPolicy::default();
        RetryConfig {
            base: p.base,
            multiplier: p.multiplier,
            cap: p.cap,
            window: p.window,
            tiers: [5, 30, 120, 600, 3600, 6 * 3600]
                .map(Duration::from_secs)
                .to_vec(),
        }
    }
}

impl RetryConfig {
    /// The backoff policy.
    pub fn policy(&self) -> RetryPolicy {
        RetryPolicy {
            base: self.base,
            multiplier: self.multiplier,
            cap: self.cap,
            window: self.window,
        }
    }
}

impl RetryConfig {
    /// A valid policy and between one and [`MAX_TIERS`] ascending, whole-millisecond tiers.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.policy().validate().map_err(|e| {
            let msg = e.to_string();
            let (key, rest) = msg.split_once(' ').unwrap_or(("retry", &msg));
            invalid(key, rest)
        })?;
        if self.tiers.is_empty() {
            return Err(invalid("retry.tiers", "must list at least one tier"));
        }
        if self.tiers.len() > MAX_TIERS {
            return Err(invalid(
                "retry.tiers",
                format!("must list at most {MAX_TIERS} tiers"),
            ));
        }
        for (i, &t) in self.tiers.iter().enumerate() {
            let key = format!("retry.tiers[{i}]");
            let shown = humantime::format_duration(t).to_string();
            if t.is_zero() {
                return Err(invalid(key, "= \"0s\" must be greater than zero"));
            }
            if t.subsec_millis() as u128 * 1_000_000 != t.subsec_nanos() as u128 {
                return Err(invalid(
                    key,
                    format!("= {shown:?} must be whole milliseconds"),
                ));
            }
            if t > MAX_TIER {
                return Err(invalid(key, format!("= {shown:?} must be at most 7d")));
            }
            if i > 0 && t <= self.tiers[i - 1] {
                return Err(invalid(
                    key,
                    format!(
                        "= {shown:?} must be greater than retry.tiers[{}] ({}): tiers are \
                         ascending and unique",
                        i - 1,
                        humantime::format_duration(self.tiers[i - 1])
                    ),
                ));
            }
        }
        Ok(())
    }
}
