//! `[ingest]`: how hookline takes events in, across every instance and restart.

use std::time::Duration;

use serde::Deserialize;

use super::error::{ConfigError, invalid};
use crate::serde_field::duration;

/// Longest `ingest.dedupe_window` accepted: the store keeps events no longer than that.
pub const MAX_DEDUPE_WINDOW: Duration = Duration::from_secs(30 * 24 * 3600);

/// `[ingest]`: event ingest through `POST /v1/events` and the input topics.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IngestConfig {
    /// The same (tenant, event id) seen again within this long of the first is the same event:
    /// `POST /v1/events` answers as it did the first time and the fan-out does not fan it out
    /// again, whichever instance took either copy and across restarts.
    #[serde(deserialize_with = "duration")]
    pub dedupe_window: Duration,
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            dedupe_window: Duration::from_secs(24 * 3600),
        }
    }
}

impl IngestConfig {
    /// A window of at least a second and at most [`MAX_DEDUPE_WINDOW`].
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let shown = humantime::format_duration(self.dedupe_window).to_string();
        if self.dedupe_window < Duration::from_secs(1) {
            return Err(invalid(
                "ingest.dedupe_window",
                format!("= {shown:?} must be at least 1s"),
            ));
        }
        if self.dedupe_window > MAX_DEDUPE_WINDOW {
            return Err(invalid(
                "ingest.dedupe_window",
                format!("= {shown:?} must be at most 30d (the longest the store keeps events)"),
            ));
        }
        Ok(())
    }
}
