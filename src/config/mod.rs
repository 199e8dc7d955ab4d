//! The one typed configuration, layered: built-in defaults < `--config FILE` (TOML) < environment.
//!
//! One file per section (`kafka`, `retry`, `delivery`, `http`, `admin`, `metrics`, `security`,
//! `store`, `ingest`, `tenants`) holds its table's type, defaults and rules; `env` lays `HOOKLINE_*` variables
//! over the file (its documentation gives the mapping); `error` says what is wrong without
//! quoting a secret. This file holds [`Config`] and the loading that joins them.
//!
//! # Validation
//! [`Config::validate`] runs at load and every error names the key and says why, e.g.
//! `retry.tiers[2] = "0s" must be greater than zero`, `unknown key kafka.bootstrap_server (did you
//! mean bootstrap_servers?)`, `admin.listen = "x" is not an address`. Keys set from the
//! environment say which variable set them. Errors about a secret-bearing key say the kind of
//! value given and never the value.
//!
//! `schemas/hookline.example.toml` lists every key with its default.

mod admin;
mod delivery;
mod env;
mod error;
mod http;
mod ingest;
mod kafka;
mod metrics;
mod retry;
mod security;
mod store;
mod tenants;
#[cfg(test)]
mod tests;

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

pub use self::admin::{AdminConfig, MAX_TOKEN_LEN, MIN_TOKEN_LEN, Principal, Token, token_problem};
pub use self::delivery::DeliveryConfig;
pub use self::env::{ENV_PREFIX, ENV_SEPARATOR};
use self::env::{env_vars, overlay_env};
pub use self::error::ConfigError;
use self::error::{de_error, invalid, line_col};
pub use self::http::HttpConfig;
pub use self::ingest::{IngestConfig, MAX_DEDUPE_WINDOW};
pub use self::kafka::{KafkaConfig, OutboxConfig, TopicsConfig};
pub use self::metrics::MetricsConfig;
pub use self::retry::{MAX_TIER, MAX_TIERS, RetryConfig};
pub use self::security::SecurityConfig;
pub use self::store::{MAX_MEMORY_CAPACITY, MemoryStoreConfig, StoreConfig, StoreKind};
pub use self::tenants::{DEFAULT_MAX_ENDPOINTS, DEFAULT_TENANT_MAX_IN_FLIGHT, TenantsConfig};
use crate::sealed::MasterKey;
pub use crate::storage::scylla::ScyllaConfig;

/// The whole configuration.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Kafka connection, topics and inputs.
    pub kafka: KafkaConfig,
    /// Retry schedule and delay tiers.
    pub retry: RetryConfig,
    /// Delivery-stage limits and breaker thresholds.
    pub delivery: DeliveryConfig,
    /// Outbound HTTP.
    pub http: HttpConfig,
    /// The admin API.
    pub admin: AdminConfig,
    /// The Prometheus listener.
    pub metrics: MetricsConfig,
    /// The master key for secrets at rest.
    pub security: SecurityConfig,
    /// Where attempts and delivery history are kept.
    pub store: StoreConfig,
    /// Event ingest: deduplication across instances and restarts.
    pub ingest: IngestConfig,
    /// Ceilings on every tenant's endpoints.
    pub tenants: TenantsConfig,
}

impl Config {
    /// The cluster and topics a replay reads and writes.
    pub fn replay_target(&self) -> crate::replay::ReplayTarget {
        crate::replay::ReplayTarget {
            bootstrap: self.kafka.bootstrap_servers.clone(),
            client: self.kafka.client.clone(),
            dlq: self.kafka.topics.dlq.clone(),
            deliveries: self.kafka.topics.deliveries.clone(),
        }
    }

    /// What the endpoint view needs to apply tenant ceilings: `[tenants]` and
    /// `delivery.max_in_flight`.
    pub fn tenant_defaults(&self) -> crate::tenant::TenantDefaults {
        crate::tenant::TenantDefaults {
            ceilings: self.tenants.ceilings(),
            default_max_in_flight: self.delivery.max_in_flight,
        }
    }

    /// Loads defaults < `path` (when given) < `HOOKLINE_*` environment, and validates.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let file = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.display().to_string(),
                    source,
                })?;
                Some((p.display().to_string(), text))
            }
            None => None,
        };
        let env = env_vars()?;
        Config::from_sources(file.as_ref().map(|(o, t)| (o.as_str(), t.as_str())), env)
    }

    /// The pure core of [`Config::load`]: `file` is (origin for messages, TOML text); `env` is
    /// every environment variable (those not starting with `HOOKLINE_` are ignored).
    pub fn from_sources(
        file: Option<(&str, &str)>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let mut tree = match file {
            Some((origin, text)) => {
                toml::from_str::<toml::Table>(text).map_err(|e| ConfigError::Syntax {
                    origin: origin.to_owned(),
                    message: e.message().to_owned()
                        + &e.span()
                            .map(|s| format!(" (at {})", line_col(text, s.start)))
                            .unwrap_or_default(),
                })?
            }
            None => toml::Table::new(),
        };
        // Kept to tell "set in the file" from "a default" when an error is reported.
        let file_tree = tree.clone();
        let mut from_env: Vec<(String, String)> = vec![];
        let mut env: Vec<(String, String)> = env.into_iter().collect();
        env.sort();
        for (var, raw) in env {
            if let Some(key) = overlay_env(&mut tree, &var, &raw)? {
                from_env.push((key, var));
            }
        }
        let origin_of = |key: &str| -> Option<String> {
            from_env
                .iter()
                .find(|(k, _)| {
                    // The variable set this key, a key inside it, or the section around it
                    // (`HOOKLINE_KAFKA__PARTITIONS__X` makes `kafka.partitions` a table).
                    key == k
                        || key.starts_with(&format!("{k}."))
                        || key.starts_with(&format!("{k}["))
                        || k.starts_with(&format!("{key}."))
                })
                .map(|(_, var)| var.clone())
                .or_else(|| {
                    let (origin, _) = file?;
                    in_tree(&file_tree, key).then(|| origin.to_owned())
                })
        };
        let config: Config =
            serde_path_to_error::deserialize(toml::Value::Table(tree)).map_err(|e| {
                let key = e.path().to_string();
                let origin = origin_of(&key);
                de_error(key, e.into_inner().to_string(), origin)
            })?;
        config.validate().map_err(|e| match e {
            ConfigError::Invalid { key, detail, .. } => {
                let origin = origin_of(&key);
                ConfigError::Invalid {
                    key,
                    detail,
                    origin,
                }
            }
            other => other,
        })?;
        Ok(config)
    }

    /// Defaults for `hookline dev`: in-memory store, an ephemeral master key, small partition
    /// count, and deliveries to plain http on loopback allowed so a local receiver works.
    pub fn dev_defaults() -> Config {
        let mut c = Config::default();
        c.kafka.partitions = 4;
        // The mock cluster batches badly with a linger: it is far faster at 0.
        c.kafka.client.insert("linger.ms".into(), "0".into());
        c.store.kind = StoreKind::Memory;
        c.security.master_key = Some(MasterKey::generate());
        c.http.dangerous_allow_http = true;
        c.http.allow_cidrs = vec![
            "127.0.0.0/8".parse().expect("literal CIDR"),
            "::1/128".parse().expect("literal CIDR"),
        ];
        c
    }

    /// Gives this config an ephemeral master key when it has none (for `hookline dev` with a
    /// config file): secrets sealed under it do not survive a restart.
    pub fn with_ephemeral_master_key(mut self) -> Config {
        if self.security.master_key.is_none() {
            self.security.master_key = Some(MasterKey::generate());
        }
        self
    }

    /// The master key, which `hookline run` must be given.
    pub fn require_master_key(&self) -> Result<&MasterKey, ConfigError> {
        self.security.master_key.as_ref().ok_or_else(|| {
            invalid(
                "security.master_key",
                "is required for `hookline run` (base64 of 32 random bytes, e.g. from \
                 `head -c32 /dev/urandom | base64`; or set HOOKLINE_SECURITY__MASTER_KEY)",
            )
        })
    }

    /// Every delay tier with its topic name, ascending.
    pub fn tier_topics(&self) -> Vec<(Duration, String)> {
        self.retry
            .tiers
            .iter()
            .map(|&t| (t, self.kafka.tier_topic(t)))
            .collect()
    }

    /// Checks every rule; the error names the first key that breaks one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.kafka.validate(&self.retry.tiers)?;
        self.retry.validate()?;
        self.delivery.validate()?;
        self.http.validate(&self.kafka)?;
        self.admin.validate()?;
        self.metrics.validate(&self.admin)?;
        self.store.validate()?;
        self.ingest.validate()?;
        self.tenants.validate()?;
        Ok(())
    }
}

/// Whether `key` (`a.b[2].c` or `a.b (note)`) names something present in `tree`; unknown keys
/// count, since they can only have come from there.
fn in_tree(tree: &toml::Table, key: &str) -> bool {
    let mut table = tree;
    let path = key.split(' ').next().unwrap_or("");
    let segments: Vec<&str> = path
        .split('.')
        .map(|s| s.split('[').next().unwrap_or(""))
        .collect();
    for (i, seg) in segments.iter().enumerate() {
        match table.get(*seg) {
            None => return false,
            Some(toml::Value::Table(t)) if i + 1 < segments.len() => table = t,
            Some(_) => return true,
        }
    }
    true
}
