//! `[security]`: the master key that seals endpoint secrets at rest.

use serde::Deserialize;

use crate::sealed::MasterKey;

/// `[security]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SecurityConfig {
    /// Base64 of 32 bytes; seals endpoint secrets. Required by `hookline run`; `hookline dev`
    /// generates one per process.
    pub master_key: Option<MasterKey>,
}
