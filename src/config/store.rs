//! `[store]`: which store keeps the attempt log, and its settings.

use serde::Deserialize;

use super::error::{ConfigError, invalid};
use crate::storage::scylla::ScyllaConfig;

/// `[store]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// `memory` (for `hookline dev` and tests) or `scylla`.
    pub kind: StoreKind,
    /// Used when `kind = "memory"`.
    pub memory: MemoryStoreConfig,
    /// Used when `kind = "scylla"`; validated whatever the kind, so a mistake shows before the
    /// switch to it.
    pub scylla: ScyllaConfig,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            kind: StoreKind::Scylla,
            memory: MemoryStoreConfig::default(),
            scylla: ScyllaConfig::default(),
        }
    }
}

/// `[store.memory]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryStoreConfig {
    /// How many deliveries the in-memory store keeps; past that it forgets the oldest. Its
    /// tables are sized for this many when it starts.
    pub capacity: usize,
}

impl Default for MemoryStoreConfig {
    fn default() -> Self {
        MemoryStoreConfig {
            capacity: crate::storage::memory::DEFAULT_CAPACITY,
        }
    }
}

/// Most deliveries `store.memory.capacity` accepts: the store sizes its tables for its capacity
/// at start, and a delivery with a full attempt log can hold several KiB.
pub const MAX_MEMORY_CAPACITY: usize = 10_000_000;

/// Which store keeps the attempt log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// In process; lost on exit.
    Memory,
    /// ScyllaDB or Cassandra over CQL.
    Scylla,
}

impl StoreConfig {
    /// A memory capacity within bounds and a valid `[store.scylla]`, whichever store is chosen.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let capacity = self.memory.capacity;
        if !(1..=MAX_MEMORY_CAPACITY).contains(&capacity) {
            return Err(invalid(
                "store.memory.capacity",
                format!("= {capacity} must be between 1 and {MAX_MEMORY_CAPACITY}"),
            ));
        }
        self.scylla
            .validate()
            .map_err(|e| invalid(e.full_key(), e.reason()))
    }
}
