//! `[delivery]`: how many attempts run at once, when a breaker opens, when a lane is stalled.

use std::time::Duration;

use serde::Deserialize;

use super::error::{ConfigError, invalid};
use crate::serde_field::duration;

/// Longest accepted `delivery.breaker_cooldown`.
const MAX_BREAKER_COOLDOWN: Duration = Duration::from_secs(3600);

/// `[delivery]`: plain numbers; the lane and breaker types read them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeliveryConfig {
    /// Concurrent attempts per endpoint unless the endpoint sets its own.
    pub max_in_flight: u32,
    /// Records held in memory per deliveries partition (in flight or queued in lanes).
    pub partition_max_in_flight: u32,
    /// Consecutive failures that open an endpoint's breaker (it also opens when half or more
    /// of the last 20 attempts failed, once there are 10).
    pub breaker_failure_threshold: u32,
    /// How long an open breaker waits before admitting one probe (at most 1 h); each failed
    /// probe doubles it, up to 5 minutes or this value if longer.
    #[serde(deserialize_with = "duration")]
    pub breaker_cooldown: Duration,
    /// An endpoint whose lane is full and has not finished one request for this long is
    /// stalled: its queued records park in a delay tier instead of holding the partition.
    #[serde(deserialize_with = "duration")]
    pub stall_after: Duration,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            max_in_flight: 16,
            partition_max_in_flight: 1000,
            breaker_failure_threshold: 5,
            breaker_cooldown: Duration::from_secs(30),
            stall_after: Duration::from_secs(1),
        }
    }
}

impl DeliveryConfig {
    /// In-flight limits that fit inside each other and non-zero breaker and stall times.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=crate::endpoint::MAX_IN_FLIGHT_CEILING).contains(&self.max_in_flight) {
            return Err(invalid(
                "delivery.max_in_flight",
                format!(
                    "= {} must be between 1 and {}",
                    self.max_in_flight,
                    crate::endpoint::MAX_IN_FLIGHT_CEILING
                ),
            ));
        }
        if self.partition_max_in_flight < self.max_in_flight
            || self.partition_max_in_flight > 1_000_000
        {
            return Err(invalid(
                "delivery.partition_max_in_flight",
                format!(
                    "= {} must be between delivery.max_in_flight ({}) and 1000000",
                    self.partition_max_in_flight, self.max_in_flight
                ),
            ));
        }
        if self.breaker_failure_threshold == 0 {
            return Err(invalid(
                "delivery.breaker_failure_threshold",
                "= 0 must be at least 1",
            ));
        }
        if self.breaker_cooldown.is_zero() {
            return Err(invalid(
                "delivery.breaker_cooldown",
                "= \"0s\" must be greater than zero",
            ));
        }
        if self.breaker_cooldown > MAX_BREAKER_COOLDOWN {
            return Err(invalid(
                "delivery.breaker_cooldown",
                format!(
                    "= \"{}\" must be at most 1h: records for an open breaker wait that long",
                    humantime::format_duration(self.breaker_cooldown)
                ),
            ));
        }
        if self.stall_after.is_zero() {
            return Err(invalid(
                "delivery.stall_after",
                "= \"0s\" must be greater than zero",
            ));
        }
        Ok(())
    }
}
