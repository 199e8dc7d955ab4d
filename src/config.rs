//! The one typed configuration, layered: built-in defaults < `--config FILE` (TOML) < environment.
//!
//! # Environment mapping
//! A variable `HOOKLINE_<SECTION>__<KEY>` sets `<section>.<key>`: the name after `HOOKLINE_` is
//! lower-cased and `__` separates levels, so `HOOKLINE_KAFKA__BOOTSTRAP_SERVERS` sets
//! `kafka.bootstrap_servers` and `HOOKLINE_STORE__SCYLLA__KEYSPACE` sets `store.scylla.keyspace`.
//! Variables without `__` (such as `HOOKLINE_LOG`) are not configuration and are ignored, except
//! one that starts with a section's name and one `_` (`HOOKLINE_KAFKA_BOOTSTRAP_SERVERS`): that
//! is a mistyped setting, and an error says how to spell it.
//! - Under `kafka.client`, the rest of the name is an rdkafka property with `_` for `.`:
//!   `HOOKLINE_KAFKA__CLIENT__SECURITY_PROTOCOL=ssl` sets `security.protocol` (librdkafka property
//!   names have no underscores). These values are always strings, as are
//!   `HOOKLINE_STORE__SCYLLA__USERNAME` and `HOOKLINE_STORE__SCYLLA__PASSWORD`.
//! - Elsewhere a value that reads as a TOML number, boolean, array or inline table is taken as
//!   one (`HOOKLINE_KAFKA__PARTITIONS=24`, `HOOKLINE_RETRY__TIERS='["5s","1m"]'`,
//!   `HOOKLINE_ADMIN__TENANT_TOKENS='{ "tok..." = "acme" }'`); anything else is a string
//!   (`HOOKLINE_ADMIN__LISTEN=0.0.0.0:8080`). Quote it to force a string:
//!   `HOOKLINE_STORE__SCYLLA__KEYSPACE='"2024"'`.
//!
//! # Validation
//! [`Config::validate`] runs at load and every error names the key and says why, e.g.
//! `retry.tiers[2] = "0s" must be greater than zero`, `unknown key kafka.bootstrap_server (did you
//! mean bootstrap_servers?)`, `admin.listen = "x" is not an address`. Keys set from the
//! environment say which variable set them. Errors about a secret-bearing key (admin tokens,
//! whose tenant-token names are the tokens, `security.master_key`, `store.scylla.password`,
//! secret `kafka.client` properties) are rebuilt in one place, `de_error`, to say the kind of
//! value given and never the value.
//!
//! `schemas/hookline.example.toml` lists every key with its default.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Deserializer};
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use crate::delay_tier::tier_name;
use crate::id::Tenant;
use crate::kafka::{ClientProperties, is_secret_client_property};
use crate::limits::{DEFAULT_MESSAGE_MAX_BYTES, RECORD_HEADROOM};
use crate::retry_policy::RetryPolicy;
use crate::sealed::MasterKey;
use crate::serde_field::{addr, addrs, cidrs, duration, durations};
pub use crate::storage::scylla::ScyllaConfig;

/// Prefix of configuration environment variables.
pub const ENV_PREFIX: &str = "HOOKLINE_";
/// Separator of levels in an environment variable name.
pub const ENV_SEPARATOR: &str = "__";
/// Largest delay tier accepted.
pub const MAX_TIER: Duration = Duration::from_secs(7 * 24 * 3600);
/// Most delay tiers accepted (each is a topic and a consumer).
pub const MAX_TIERS: usize = 32;
/// Shortest admin token accepted: shorter ones are guessable.
pub const MIN_TOKEN_LEN: usize = 16;
/// Longest admin token accepted.
pub const MAX_TOKEN_LEN: usize = 1024;
/// Longest Kafka topic name.
const MAX_TOPIC_LEN: usize = 249;

/// What went wrong while loading or checking the configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The config file is not valid TOML.
    #[error("config file {origin} is not valid TOML: {message}")]
    Syntax {
        /// The file.
        origin: String,
        /// The parser's message (with line and column).
        message: String,
    },
    /// An environment variable cannot be mapped onto a key.
    #[error("environment variable {var}: {reason}")]
    Env {
        /// The variable.
        var: String,
        /// Why.
        reason: String,
    },
    /// A key that does not exist.
    #[error("unknown key {key}{}{}", suggestion.as_ref().map(|s| format!(" (did you mean {s}?)")).unwrap_or_default(), origin_suffix(origin))]
    UnknownKey {
        /// The full key path.
        key: String,
        /// The closest known key at that level, when one is close.
        suggestion: Option<String>,
        /// Where the key came from (file or environment variable).
        origin: Option<String>,
    },
    /// A value that is not acceptable: `key = value why` or `key why`.
    #[error("{key} {detail}{}", origin_suffix(origin))]
    Invalid {
        /// The full key path, e.g. `retry.tiers[2]`.
        key: String,
        /// `= "value" why`, or just why.
        detail: String,
        /// Where the key came from (file or environment variable).
        origin: Option<String>,
    },
}

fn origin_suffix(origin: &Option<String>) -> String {
    origin
        .as_ref()
        .map(|o| format!(" (set by {o})"))
        .unwrap_or_default()
}

fn invalid(key: impl Into<String>, detail: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        detail: detail.into(),
        origin: None,
    }
}

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
}

/// `[kafka]`. `Debug` shows secret `client` properties as `<redacted>`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaConfig {
    /// `bootstrap.servers` for every client.
    pub bootstrap_servers: String,
    /// Extra rdkafka properties for every client (e.g. `security.protocol`), applied last.
    pub client: ClientProperties,
    /// Partition count of the deliveries topic (and of the tier topics).
    pub partitions: u32,
    /// Partition count of the native events topic (`POST /v1/events`) when hookline creates
    /// it; `partitions` when unset. It carries one record per event, not per endpoint, and
    /// sets how many fan-out instances can share the ingest.
    pub events_partitions: Option<u32>,
    /// Topic names.
    pub topics: TopicsConfig,
    /// Input topics carrying Debezium outbox records, by name.
    pub input_topics: Vec<String>,
    /// Input topics by regex (must start with `^`; rdkafka subscribes to it as a pattern).
    pub input_pattern: Option<String>,
    /// Consumer groups are `{group_prefix}-fanout`, `-deliver` and `-delay`.
    pub group_prefix: String,
    /// How outbox records carry an event's type and tenant.
    pub outbox: OutboxConfig,
}

/// `[kafka.outbox]`: the headers Debezium's Outbox Event Router puts an outbox row's type and
/// tenant in (`transforms.outbox.table.fields.additional.placement`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutboxConfig {
    /// The header holding the event type (`type:header:eventType`).
    pub type_header: String,
    /// The header holding the tenant (`tenant_id:header:tenant`).
    pub tenant_header: String,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        let input = crate::input::InputConfig::default();
        OutboxConfig {
            type_header: input.type_header,
            tenant_header: input.tenant_header,
        }
    }
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            bootstrap_servers: "localhost:9092".into(),
            client: ClientProperties::default(),
            partitions: 12,
            events_partitions: None,
            topics: TopicsConfig::default(),
            input_topics: vec![],
            input_pattern: Some(r"^outbox\.event\..*".into()),
            group_prefix: "hookline".into(),
            outbox: OutboxConfig::default(),
        }
    }
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
}

impl KafkaConfig {
    /// Where the compacted endpoints topic lives.
    pub fn endpoints_topic(&self) -> crate::registry::kafka::EndpointsTopic {
        crate::registry::kafka::EndpointsTopic {
            bootstrap: self.bootstrap_servers.clone(),
            client: self.client.clone(),
            topic: self.topics.endpoints.clone(),
        }
    }

    /// An rdkafka client config with `bootstrap.servers` and the `client` overrides set.
    pub fn client_config(&self) -> rdkafka::ClientConfig {
        let mut c = rdkafka::ClientConfig::new();
        c.set("bootstrap.servers", &self.bootstrap_servers);
        for (k, v) in &self.client {
            c.set(k, v);
        }
        c
    }

    /// The consumer group of a stage (`fanout`, `deliver`, `delay`).
    pub fn group(&self, stage: &str) -> String {
        format!("{}-{stage}", self.group_prefix)
    }

    /// The name of the delay-tier topic for `tier` (`hookline.retry.5s`, `hookline.retry.2m`).
    pub fn tier_topic(&self, tier: Duration) -> String {
        format!("{}{}", self.topics.retry_prefix, tier_name(tier))
    }
}

/// `[kafka.topics]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TopicsConfig {
    /// One record per (event, endpoint), keyed by endpoint id.
    pub deliveries: String,
    /// The compacted endpoints topic.
    pub endpoints: String,
    /// Dead letters.
    pub dlq: String,
    /// Input records that are neither Debezium outbox records nor native envelopes.
    pub invalid: String,
    /// Native events (`POST /v1/events`).
    pub events: String,
    /// Prefix of the delay-tier topics; the tier's duration follows (`hookline.retry.5s`).
    pub retry_prefix: String,
}

impl TopicsConfig {
    /// Every topic under `prefix` (`<prefix>.deliveries`, `<prefix>.retry.5s`, ...): the
    /// defaults are this with `hookline`. Separate prefixes keep runs sharing a cluster apart.
    pub fn prefixed(prefix: &str) -> TopicsConfig {
        TopicsConfig {
            deliveries: format!("{prefix}.deliveries"),
            endpoints: format!("{prefix}.endpoints"),
            dlq: format!("{prefix}.dlq"),
            invalid: format!("{prefix}.invalid"),
            events: format!("{prefix}.events"),
            retry_prefix: format!("{prefix}.retry."),
        }
    }
}

impl Default for TopicsConfig {
    fn default() -> Self {
        TopicsConfig::prefixed("hookline")
    }
}

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

/// `[http]`: the outbound client.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// TCP (and TLS) connect timeout.
    #[serde(deserialize_with = "duration")]
    pub connect_timeout: Duration,
    /// Whole-attempt timeout.
    #[serde(deserialize_with = "duration")]
    pub total_timeout: Duration,
    /// Ranges delivered to even though the SSRF policy blocks them (e.g. an internal receiver).
    #[serde(deserialize_with = "cidrs")]
    pub allow_cidrs: Vec<IpNet>,
    /// DNS servers to resolve endpoint hosts with; the system's when empty.
    #[serde(deserialize_with = "addrs")]
    pub dns_servers: Vec<SocketAddr>,
    /// Allow plain `http://` endpoints. Never in production.
    pub dangerous_allow_http: bool,
    /// Largest event payload accepted for delivery.
    pub max_payload_bytes: u64,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            connect_timeout: Duration::from_secs(3),
            total_timeout: Duration::from_secs(15),
            allow_cidrs: vec![],
            dns_servers: vec![],
            dangerous_allow_http: false,
            max_payload_bytes: 256 * 1024,
        }
    }
}

/// A bearer token for the admin API. Wiped on drop, `<redacted>` in `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Zeroizing<String>);

impl PartialOrd for Token {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Token {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.as_str().cmp(other.0.as_str())
    }
}

impl Token {
    /// Wraps a token.
    pub fn new(s: impl Into<String>) -> Token {
        Token(Zeroizing::new(s.into()))
    }

    /// Compares with a presented token in constant time (for equal lengths).
    pub fn matches(&self, presented: &str) -> bool {
        self.0.as_bytes().ct_eq(presented.as_bytes()).into()
    }

    /// The token itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl<'de> Deserialize<'de> for Token {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Token::new)
    }
}

/// Why `token` cannot be an admin token, said without the token (`must be 16 to 1024
/// characters (got 5)`), or `None` when it can. Config tokens and `hookline dev --admin-token`
/// pass the same check.
pub fn token_problem(token: &str) -> Option<String> {
    let n = token.chars().count();
    if !(MIN_TOKEN_LEN..=MAX_TOKEN_LEN).contains(&n) {
        return Some(format!(
            "must be {MIN_TOKEN_LEN} to {MAX_TOKEN_LEN} characters (got {n})"
        ));
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Some("must not contain spaces or control characters".into());
    }
    None
}

/// Who a bearer token belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// Sees and changes everything.
    Operator,
    /// Sees and changes only its tenant's endpoints and events.
    Tenant(Tenant),
}

/// `[admin]`: the admin API listener and its tokens.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// Listen address.
    #[serde(deserialize_with = "addr")]
    pub listen: SocketAddr,
    /// Tokens that see every tenant.
    pub operator_tokens: Vec<Token>,
    /// Token → the one tenant it may act for.
    pub tenant_tokens: BTreeMap<Token, Tenant>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            operator_tokens: vec![],
            tenant_tokens: BTreeMap::new(),
        }
    }
}

impl AdminConfig {
    /// Whom a presented bearer token belongs to. Every configured token is compared, in constant
    /// time each, so the answer's timing does not reveal which one was close.
    pub fn principal(&self, presented: &str) -> Option<Principal> {
        let mut found = None;
        for t in &self.operator_tokens {
            if t.matches(presented) && found.is_none() {
                found = Some(Principal::Operator);
            }
        }
        for (t, tenant) in &self.tenant_tokens {
            if t.matches(presented) && found.is_none() {
                found = Some(Principal::Tenant(tenant.clone()));
            }
        }
        found
    }
}

/// `[metrics]`: the Prometheus listener.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Listen address.
    #[serde(deserialize_with = "addr")]
    pub listen: SocketAddr,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 9464)),
        }
    }
}

/// `[security]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SecurityConfig {
    /// Base64 of 32 bytes; seals endpoint secrets. Required by `hookline run`; `hookline dev`
    /// generates one per process.
    pub master_key: Option<MasterKey>,
}

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

impl Config {
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
        // The mock cluster batches badly with a linger; FACTS.md measured 65x faster at 0.
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
        self.validate_kafka()?;
        self.validate_retry()?;
        self.validate_delivery()?;
        self.validate_http()?;
        self.validate_admin()?;
        self.validate_store()?;
        Ok(())
    }

    fn validate_kafka(&self) -> Result<(), ConfigError> {
        let k = &self.kafka;
        if k.bootstrap_servers.trim().is_empty() {
            return Err(invalid("kafka.bootstrap_servers", "must not be empty"));
        }
        for (key, count) in [
            ("kafka.partitions", Some(k.partitions)),
            ("kafka.events_partitions", k.events_partitions),
        ] {
            if let Some(n) = count.filter(|n| !(1..=10_000).contains(n)) {
                return Err(invalid(key, format!("= {n} must be between 1 and 10000")));
            }
        }
        if k.group_prefix.is_empty()
            || !k
                .group_prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return Err(invalid(
                "kafka.group_prefix",
                "must be non-empty ASCII letters, digits, '.', '_' or '-'",
            ));
        }
        let o = &k.outbox;
        for (key, name) in [
            ("kafka.outbox.type_header", &o.type_header),
            ("kafka.outbox.tenant_header", &o.tenant_header),
        ] {
            if name.is_empty() || name.len() > 256 || name.chars().any(char::is_control) {
                return Err(invalid(
                    key,
                    format!("= {name:?} must be a header name of 1 to 256 characters"),
                ));
            }
            if name == crate::input::OUTBOX_ID_HEADER {
                return Err(invalid(
                    key,
                    "= \"id\" is the header of the event id (Debezium's Outbox Event Router \
                     fixes it)",
                ));
            }
        }
        if o.type_header == o.tenant_header {
            return Err(invalid(
                "kafka.outbox.tenant_header",
                format!(
                    "= {:?} is kafka.outbox.type_header as well; they are two headers",
                    o.tenant_header
                ),
            ));
        }
        let t = &k.topics;
        let own = [
            ("kafka.topics.deliveries", &t.deliveries),
            ("kafka.topics.endpoints", &t.endpoints),
            ("kafka.topics.dlq", &t.dlq),
            ("kafka.topics.invalid", &t.invalid),
            ("kafka.topics.events", &t.events),
        ];
        let mut seen = BTreeSet::new();
        for (key, name) in own {
            check_topic(key, name)?;
            if !seen.insert(name.as_str()) {
                return Err(invalid(
                    key,
                    format!("= {name:?} is already used by another hookline topic"),
                ));
            }
        }
        // The prefix is checked with the longest tier suffix it will carry.
        check_topic(
            "kafka.topics.retry_prefix",
            &format!("{}{}", t.retry_prefix, "9999999ms"),
        )
        .map_err(|_| {
            invalid(
                "kafka.topics.retry_prefix",
                format!(
                    "= {:?} must be a topic name prefix (letters, digits, '.', '_', '-'; short \
                     enough for a tier suffix)",
                    t.retry_prefix
                ),
            )
        })?;
        if t.retry_prefix.is_empty() {
            return Err(invalid("kafka.topics.retry_prefix", "must not be empty"));
        }
        // Consuming hookline's own output as input would loop forever.
        let internal = |name: &str| {
            name == t.deliveries
                || name == t.endpoints
                || name == t.dlq
                || name == t.invalid
                || name.starts_with(&t.retry_prefix)
        };
        if k.input_topics.len() > 1000 {
            return Err(invalid(
                "kafka.input_topics",
                "must list at most 1000 topics",
            ));
        }
        for (i, name) in k.input_topics.iter().enumerate() {
            let key = format!("kafka.input_topics[{i}]");
            check_topic(&key, name)?;
            if internal(name) {
                return Err(invalid(
                    key,
                    format!("= {name:?} is one of hookline's own topics and cannot be an input"),
                ));
            }
        }
        if let Some(p) = &k.input_pattern {
            let key = "kafka.input_pattern";
            if !p.starts_with('^') {
                return Err(invalid(
                    key,
                    format!(
                        "= {p:?} must start with ^ (rdkafka takes a subscription without it as a \
                         topic name)"
                    ),
                ));
            }
            let re = regex::Regex::new(p).map_err(|e| {
                invalid(
                    key,
                    format!(
                        "= {p:?} is not a valid regex: {}",
                        e.to_string().lines().last().unwrap_or("")
                    ),
                )
            })?;
            let mut probes = vec![
                t.deliveries.clone(),
                t.endpoints.clone(),
                t.dlq.clone(),
                t.invalid.clone(),
            ];
            probes.extend(self.tier_topics().into_iter().map(|(_, n)| n));
            if let Some(hit) = probes.iter().find(|n| re.is_match(n)) {
                return Err(invalid(
                    key,
                    format!("= {p:?} matches hookline's own topic {hit:?}, which would loop"),
                ));
            }
        }
        Ok(())
    }

    fn validate_retry(&self) -> Result<(), ConfigError> {
        let r = &self.retry;
        r.policy().validate().map_err(|e| {
            let msg = e.to_string();
            let (key, rest) = msg.split_once(' ').unwrap_or(("retry", &msg));
            invalid(key, rest)
        })?;
        if r.tiers.is_empty() {
            return Err(invalid("retry.tiers", "must list at least one tier"));
        }
        if r.tiers.len() > MAX_TIERS {
            return Err(invalid(
                "retry.tiers",
                format!("must list at most {MAX_TIERS} tiers"),
            ));
        }
        for (i, &t) in r.tiers.iter().enumerate() {
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
            if i > 0 && t <= r.tiers[i - 1] {
                return Err(invalid(
                    key,
                    format!(
                        "= {shown:?} must be greater than retry.tiers[{}] ({}): tiers are \
                         ascending and unique",
                        i - 1,
                        humantime::format_duration(r.tiers[i - 1])
                    ),
                ));
            }
        }
        Ok(())
    }

    fn validate_delivery(&self) -> Result<(), ConfigError> {
        let d = &self.delivery;
        if !(1..=crate::endpoint::MAX_IN_FLIGHT_CEILING).contains(&d.max_in_flight) {
            return Err(invalid(
                "delivery.max_in_flight",
                format!(
                    "= {} must be between 1 and {}",
                    d.max_in_flight,
                    crate::endpoint::MAX_IN_FLIGHT_CEILING
                ),
            ));
        }
        if d.partition_max_in_flight < d.max_in_flight || d.partition_max_in_flight > 1_000_000 {
            return Err(invalid(
                "delivery.partition_max_in_flight",
                format!(
                    "= {} must be between delivery.max_in_flight ({}) and 1000000",
                    d.partition_max_in_flight, d.max_in_flight
                ),
            ));
        }
        if d.breaker_failure_threshold == 0 {
            return Err(invalid(
                "delivery.breaker_failure_threshold",
                "= 0 must be at least 1",
            ));
        }
        if d.breaker_cooldown.is_zero() {
            return Err(invalid(
                "delivery.breaker_cooldown",
                "= \"0s\" must be greater than zero",
            ));
        }
        if d.breaker_cooldown > MAX_BREAKER_COOLDOWN {
            return Err(invalid(
                "delivery.breaker_cooldown",
                format!(
                    "= \"{}\" must be at most 1h: records for an open breaker wait that long",
                    humantime::format_duration(d.breaker_cooldown)
                ),
            ));
        }
        if d.stall_after.is_zero() {
            return Err(invalid(
                "delivery.stall_after",
                "= \"0s\" must be greater than zero",
            ));
        }
        Ok(())
    }

    /// The largest record hookline's producers send: `message.max.bytes` in `kafka.client`, or
    /// librdkafka's default.
    pub fn message_max_bytes(&self) -> Result<u64, ConfigError> {
        match self.kafka.client.get("message.max.bytes") {
            None => Ok(DEFAULT_MESSAGE_MAX_BYTES),
            Some(v) => v.trim().parse().map_err(|_| {
                invalid(
                    "kafka.client.\"message.max.bytes\"",
                    format!("= {v:?} is not a number of bytes"),
                )
            }),
        }
    }

    fn validate_http(&self) -> Result<(), ConfigError> {
        let h = &self.http;
        if h.connect_timeout.is_zero() {
            return Err(invalid(
                "http.connect_timeout",
                "= \"0s\" must be greater than zero",
            ));
        }
        if h.total_timeout < h.connect_timeout {
            return Err(invalid(
                "http.total_timeout",
                format!(
                    "= {:?} must be at least http.connect_timeout ({})",
                    humantime::format_duration(h.total_timeout).to_string(),
                    humantime::format_duration(h.connect_timeout)
                ),
            ));
        }
        let record_limit = self.message_max_bytes()?;
        let ceiling = record_limit.saturating_sub(RECORD_HEADROOM);
        if !(1..=ceiling).contains(&h.max_payload_bytes) {
            return Err(invalid(
                "http.max_payload_bytes",
                format!(
                    "= {} must be between 1 and {ceiling}: a payload rides in one Kafka record \
                     of at most {record_limit} bytes (kafka.client \"message.max.bytes\"), less \
                     {RECORD_HEADROOM} for the envelope and headers hookline adds to it",
                    h.max_payload_bytes
                ),
            ));
        }
        if h.allow_cidrs.len() > 256 {
            return Err(invalid("http.allow_cidrs", "must list at most 256 ranges"));
        }
        if h.dns_servers.len() > 16 {
            return Err(invalid("http.dns_servers", "must list at most 16 servers"));
        }
        Ok(())
    }

    fn validate_admin(&self) -> Result<(), ConfigError> {
        let a = &self.admin;
        let mut seen = BTreeSet::new();
        let check = |key: String, t: &Token, seen: &mut BTreeSet<Token>| {
            if let Some(why) = token_problem(t.expose()) {
                return Err(invalid(key, why));
            }
            if !seen.insert(t.clone()) {
                return Err(invalid(key, "repeats another admin token"));
            }
            Ok(())
        };
        for (i, t) in a.operator_tokens.iter().enumerate() {
            check(format!("admin.operator_tokens[{i}]"), t, &mut seen)?;
        }
        for (t, tenant) in &a.tenant_tokens {
            check(
                format!("admin.tenant_tokens (token for {tenant})"),
                t,
                &mut seen,
            )?;
        }
        if a.listen == self.metrics.listen && a.listen.port() != 0 {
            return Err(invalid(
                "metrics.listen",
                format!("= \"{}\" is the same address as admin.listen", a.listen),
            ));
        }
        Ok(())
    }

    fn validate_store(&self) -> Result<(), ConfigError> {
        let capacity = self.store.memory.capacity;
        if !(1..=MAX_MEMORY_CAPACITY).contains(&capacity) {
            return Err(invalid(
                "store.memory.capacity",
                format!("= {capacity} must be between 1 and {MAX_MEMORY_CAPACITY}"),
            ));
        }
        self.store
            .scylla
            .validate()
            .map_err(|e| invalid(e.full_key(), e.reason()))
    }
}

fn check_topic(key: &str, name: &str) -> Result<(), ConfigError> {
    let legal = !name.is_empty()
        && name.len() <= MAX_TOPIC_LEN
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if legal {
        Ok(())
    } else {
        Err(invalid(
            key,
            format!(
                "= {name:?} is not a Kafka topic name (1 to {MAX_TOPIC_LEN} letters, digits, \
                 '.', '_', '-')"
            ),
        ))
    }
}

/// Every environment variable, failing on a `HOOKLINE_` one that is not Unicode (the others are
/// none of hookline's business).
fn env_vars() -> Result<Vec<(String, String)>, ConfigError> {
    let mut out = vec![];
    for (k, v) in std::env::vars_os() {
        let (Some(k), v) = (k.to_str().map(str::to_owned), v) else {
            continue;
        };
        if !k.starts_with(ENV_PREFIX) {
            continue;
        }
        let v: String = v.into_string().map_err(|_: OsString| ConfigError::Env {
            var: k.clone(),
            reason: "value is not valid Unicode".into(),
        })?;
        out.push((k, v));
    }
    Ok(out)
}

/// The config file's top-level tables, which a variable names first.
const SECTIONS: &[&str] = &[
    "kafka", "retry", "delivery", "http", "admin", "metrics", "security", "store",
];

/// A variable without `__` is not configuration, but one that starts with a section's name and
/// a single `_` (`HOOKLINE_KAFKA_BOOTSTRAP_SERVERS`) is a mistyped one: ignored, it would leave
/// the default in place and the failure that follows would not point at it.
fn section_with_one_underscore(var: &str, rest: &str) -> Result<Option<String>, ConfigError> {
    let lower = rest.to_ascii_lowercase();
    let Some(section) = SECTIONS
        .iter()
        .find(|s| lower.strip_prefix(**s).is_some_and(|r| r.starts_with('_')))
    else {
        return Ok(None);
    };
    let upper = section.to_ascii_uppercase();
    // The rest of an admin variable's name could be a token: never repeat it.
    let (shown, key) = if *section == "admin" {
        (format!("{ENV_PREFIX}{upper}_..."), "KEY".to_owned())
    } else {
        (var.to_owned(), rest[section.len() + 1..].to_owned())
    };
    Err(ConfigError::Env {
        var: shown,
        reason: format!(
            "is not read: configuration variables separate the section from the key with \
             {ENV_SEPARATOR}, e.g. {ENV_PREFIX}{upper}{ENV_SEPARATOR}{key}"
        ),
    })
}

/// Puts one environment variable into the TOML tree. Returns the key it set, or `None` when
/// the variable is not configuration.
fn overlay_env(
    tree: &mut toml::Table,
    var: &str,
    raw: &str,
) -> Result<Option<String>, ConfigError> {
    let Some(rest) = var.strip_prefix(ENV_PREFIX) else {
        return Ok(None);
    };
    if !rest.contains(ENV_SEPARATOR) {
        return section_with_one_underscore(var, rest);
    }
    let env_err = |reason: String| ConfigError::Env {
        var: var.to_owned(),
        reason,
    };
    let mut path: Vec<String> = rest
        .split(ENV_SEPARATOR)
        .map(|s| s.to_ascii_lowercase())
        .collect();
    if path.iter().any(String::is_empty) {
        return Err(env_err("has an empty key segment".into()));
    }
    let is_client = path.len() >= 3 && path[0] == "kafka" && path[1] == "client";
    if !is_client && path.len() > 2 && path[..2] == ["admin", "tenant_tokens"] {
        // The rest of the name would be a token: never repeat it.
        return Err(ConfigError::Env {
            var: format!("{ENV_PREFIX}ADMIN{ENV_SEPARATOR}TENANT_TOKENS{ENV_SEPARATOR}..."),
            reason: "a token cannot be part of a variable's name; set the whole table, \
                     HOOKLINE_ADMIN__TENANT_TOKENS='{ \"<token>\" = \"<tenant>\" }'"
                .into(),
        });
    }
    let value = if is_client {
        let prop = path.split_off(2).join(".").replace('_', ".");
        path.push(prop);
        toml::Value::String(raw.to_owned())
    } else if VERBATIM_ENV_KEYS.contains(&path.join(".").as_str()) {
        toml::Value::String(raw.to_owned())
    } else {
        let secret = secret_path(&path.join("."));
        env_value(raw).map_err(|reason| match secret {
            Some(s) => env_err(format!(
                "value for {} is not valid TOML (not shown: it is a secret)",
                s.shown
            )),
            None => env_err(reason),
        })?
    };
    let key = path.join(".");
    let (last, parents) = path.split_last().expect("non-empty path");
    let mut table = tree;
    let mut walked = String::new();
    for seg in parents {
        if !walked.is_empty() {
            walked.push('.');
        }
        walked.push_str(seg);
        let entry = table
            .entry(seg.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = entry
            .as_table_mut()
            .ok_or_else(|| env_err(format!("{walked} is a value, not a section")))?;
    }
    table.insert(last.clone(), value);
    Ok(Some(key))
}

/// Keys whose environment value is always taken as it is, a string: a password may read as a
/// number, a boolean or the start of an array and is still a password.
const VERBATIM_ENV_KEYS: &[&str] = &["store.scylla.username", "store.scylla.password"];

/// Reads an environment value: TOML when it looks like a number, boolean, array, inline table
/// or quoted string; a plain string otherwise.
fn env_value(raw: &str) -> Result<toml::Value, String> {
    let t = raw.trim();
    let looks_typed = t == "true"
        || t == "false"
        || t.starts_with(['[', '{', '"', '\''])
        || t.parse::<i64>().is_ok()
        || (t.parse::<f64>().is_ok() && t.chars().any(|c| c.is_ascii_digit()) && !t.contains(':'));
    if !looks_typed {
        return Ok(toml::Value::String(raw.to_owned()));
    }
    let doc = format!("v = {t}");
    let mut table: toml::Table =
        toml::from_str(&doc).map_err(|e| format!("value is not valid TOML: {}", e.message()))?;
    Ok(table.remove("v").expect("parsed one key"))
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

fn line_col(text: &str, offset: usize) -> String {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    format!("line {line}, column {col}")
}

/// How errors tell of a key that holds a secret without showing it.
struct SecretPath {
    /// The key as errors name it; never the secret itself (a tenant token is a table key).
    shown: String,
    /// What belongs there, for errors about the shape of what was given.
    expected: &'static str,
    /// The error is about a value beside the secret (a tenant token's tenant), which may be
    /// told.
    beside: bool,
}

impl SecretPath {
    /// `message` with anything that could quote the secret replaced by what was expected and
    /// the kind of value given.
    fn untold(&self, message: String) -> String {
        if self.beside {
            return message;
        }
        match unexpected_kind(&message) {
            Some(kind) => format!(
                "expected {}, got {kind} (value not shown: it is a secret)",
                self.expected
            ),
            None if message.contains(['"', '\'', '`']) => {
                format!(
                    "expected {} (value not shown: it is a secret)",
                    self.expected
                )
            }
            None => message,
        }
    }
}

/// The secret-bearing key at `key` (a full path such as `admin.operator_tokens[2]`), if any:
/// admin tokens (the names of `admin.tenant_tokens` are tokens), `security.master_key`,
/// `store.scylla.password`, and secret rdkafka properties under `kafka.client`.
fn secret_path(key: &str) -> Option<SecretPath> {
    let secret = |expected| {
        Some(SecretPath {
            shown: key.to_owned(),
            expected,
            beside: false,
        })
    };
    match key {
        "admin.operator_tokens" => secret("a list of tokens"),
        "admin.tenant_tokens" => secret("a table of token = tenant"),
        "security.master_key" => secret("base64 of 32 bytes"),
        "store.scylla.password" => secret("a string"),
        _ if key.starts_with("admin.operator_tokens[") => secret("a token"),
        _ if key.starts_with("admin.tenant_tokens.") => Some(SecretPath {
            shown: "admin.tenant_tokens (a token)".into(),
            expected: "a tenant",
            beside: true,
        }),
        _ => match key.strip_prefix("kafka.client.") {
            Some(prop) if is_secret_client_property(prop) => secret("a string"),
            _ => None,
        },
    }
}

/// The kind of value serde reports in `invalid type: string "...", expected ...` (`a string`),
/// without the value.
fn unexpected_kind(message: &str) -> Option<String> {
    let rest = ["invalid type: ", "invalid value: "]
        .iter()
        .find_map(|p| message.strip_prefix(p))?;
    let kind = rest.split(['"', '\'', '`', ',']).next()?.trim();
    let kind = match kind {
        "" => return None,
        "sequence" => "list",
        "map" => "table",
        k => k,
    };
    let article = if kind.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    };
    Some(format!("{article} {kind}"))
}

/// Turns a deserialisation error at `key` into a [`ConfigError`], recognising unknown keys.
fn de_error(key: String, message: String, origin: Option<String>) -> ConfigError {
    // toml appends "\nin `section`" context that the key path already carries.
    let message = message
        .split("\nin `")
        .next()
        .unwrap_or("")
        .trim()
        .to_owned();
    let (key, message) = match secret_path(&key) {
        Some(secret) => {
            let message = secret.untold(message);
            (secret.shown, message)
        }
        None => (key, message),
    };
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let field = rest.split('`').next().unwrap_or("");
        let expected: Vec<&str> = rest
            .split('`')
            .skip(2)
            .step_by(2)
            .map(|s| s.trim())
            .collect();
        let suggestion = expected
            .iter()
            .map(|e| (strsim::jaro_winkler(field, e), *e))
            .filter(|(score, _)| *score >= 0.8)
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, e)| e.to_owned());
        return ConfigError::UnknownKey {
            key,
            suggestion,
            origin,
        };
    }
    if message.starts_with("= ") {
        return ConfigError::Invalid {
            key,
            detail: message,
            origin,
        };
    }
    ConfigError::Invalid {
        key,
        detail: format!("is wrong: {message}"),
        origin,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(file: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_sources(
            Some(("test.toml", file)),
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        )
    }

    fn err(file: &str, env: &[(&str, &str)]) -> String {
        load(file, env).unwrap_err().to_string()
    }

    /// A CQL password is whatever the variable holds, even what would read as a number or a
    /// broken array; and no error or Debug output shows it.
    #[test]
    fn the_cql_password_is_taken_verbatim_and_never_shown() {
        let file = "[store.scylla]\nusername = \"hookline\"";
        for raw in [
            "98765432123",
            "[pw-not-toml",
            "\"pw-quoted\"",
            "pw with spaces",
        ] {
            let c = load(file, &[("HOOKLINE_STORE__SCYLLA__PASSWORD", raw)]).unwrap();
            let password = c.store.scylla.password.as_ref().expect("password set");
            assert_eq!(password.expose(), raw);
            let shown = format!("{c:?}");
            assert!(!shown.contains(raw), "{raw}: {shown}");
        }
        let e = err(&format!("{file}\npassword = 98765432123"), &[]);
        assert!(e.contains("store.scylla.password"), "{e}");
        assert!(!e.contains("98765432123"), "{e}");
        let e = err(file, &[("HOOKLINE_STORE__SCYLLA__USERNAME", "12345")]);
        assert!(e.contains("store.scylla.password is missing"), "{e}");
    }

    #[test]
    fn the_payload_limit_follows_the_producers_record_limit() {
        let most = load("[http]\nmax_payload_bytes = 934464", &[]).unwrap();
        assert_eq!(most.http.max_payload_bytes, 934_464);
        let larger = load(
            "[http]\nmax_payload_bytes = 1400000\n[kafka.client]\n\"message.max.bytes\" = \"1500000\"",
            &[],
        )
        .unwrap();
        assert_eq!(larger.http.max_payload_bytes, 1_400_000);
    }

    #[test]
    fn a_section_variable_with_one_underscore_is_an_error_that_spells_it() {
        assert_eq!(
            err("", &[("HOOKLINE_KAFKA_BOOTSTRAP_SERVERS", "k:9092")]),
            "environment variable HOOKLINE_KAFKA_BOOTSTRAP_SERVERS: is not read: configuration \
             variables separate the section from the key with __, e.g. \
             HOOKLINE_KAFKA__BOOTSTRAP_SERVERS"
        );
        // The rest of an admin variable's name may be a token, and is not repeated.
        let admin = err("", &[("HOOKLINE_ADMIN_TENANT_TOKENS_s3cr3t-token", "acme")]);
        assert!(!admin.contains("s3cr3t"), "{admin}");
        assert!(admin.starts_with("environment variable HOOKLINE_ADMIN_...: is not read"));
        // Others without __ are none of the config's business.
        for var in [
            "HOOKLINE_LOG",
            "HOOKLINE_HELM",
            "HOOKLINE_KAFKAESQUE",
            "HOOKLINE_BENCH_EVENTS",
        ] {
            assert!(load("", &[(var, "x")]).is_ok(), "{var}");
        }
        // Every section named is one the file has.
        for section in SECTIONS {
            assert!(load(&format!("[{section}]"), &[]).is_ok(), "{section}");
        }
    }

    #[test]
    fn defaults_are_valid_and_as_documented() {
        let c = Config::from_sources(None, vec![]).unwrap();
        assert_eq!(c.kafka.topics.deliveries, "hookline.deliveries");
        assert_eq!(c.kafka.topics.endpoints, "hookline.endpoints");
        assert_eq!(c.retry.policy(), RetryPolicy::default());
        assert_eq!(c.retry.tiers.len(), 6);
        assert_eq!(
            c.tier_topics()
                .into_iter()
                .map(|(_, n)| n)
                .collect::<Vec<_>>(),
            [
                "hookline.retry.5s",
                "hookline.retry.30s",
                "hookline.retry.2m",
                "hookline.retry.10m",
                "hookline.retry.1h",
                "hookline.retry.6h"
            ]
        );
        assert_eq!(c.http.connect_timeout, Duration::from_secs(3));
        assert_eq!(c.http.max_payload_bytes, 262_144);
        assert_eq!(c.admin.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(c.metrics.listen.to_string(), "127.0.0.1:9464");
        assert!(c.security.master_key.is_none());
        assert!(
            c.require_master_key()
                .unwrap_err()
                .to_string()
                .contains("security.master_key is required")
        );
        assert_eq!(c.store.kind, StoreKind::Scylla);
        Config::dev_defaults().validate().unwrap();
        assert!(Config::dev_defaults().require_master_key().is_ok());
    }

    #[test]
    fn the_example_file_parses_to_the_defaults() {
        let text = include_str!("../schemas/hookline.example.toml");
        let c = load(text, &[]).unwrap();
        assert_eq!(format!("{c:?}"), format!("{:?}", Config::default()));
    }

    #[test]
    fn file_values_are_read() {
        let c = load(
            r#"
            [kafka]
            bootstrap_servers = "k1:9092,k2:9092"
            partitions = 24
            events_partitions = 3
            input_topics = ["outbox.event.order"]
            input_pattern = '^outbox\..*'
            [kafka.client]
            "linger.ms" = 0
            "security.protocol" = "ssl"
            [retry]
            base = "10s"
            multiplier = 3
            cap = "30m"
            window = "2h"
            tiers = ["1s", "90s", "1d"]
            [http]
            allow_cidrs = ["10.1.0.0/16"]
            dns_servers = ["10.0.0.2:53"]
            [admin]
            operator_tokens = ["op-token-0123456789"]
            tenant_tokens = { "tenant-token-0123456789" = "acme" }
            [security]
            master_key = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
            [store]
            kind = "memory"
            [store.scylla]
            attempt_ttl = "7d"
            "#,
            &[],
        )
        .unwrap();
        assert_eq!(c.kafka.partitions, 24);
        assert_eq!(c.kafka.events_partitions, Some(3));
        assert_eq!(c.kafka.client["linger.ms"], "0");
        assert_eq!(c.retry.multiplier, 3.0);
        assert_eq!(
            c.tier_topics()
                .into_iter()
                .map(|(_, n)| n)
                .collect::<Vec<_>>(),
            [
                "hookline.retry.1s",
                "hookline.retry.90s",
                "hookline.retry.1d"
            ]
        );
        assert_eq!(c.http.allow_cidrs[0].to_string(), "10.1.0.0/16");
        assert_eq!(
            c.admin.principal("op-token-0123456789"),
            Some(Principal::Operator)
        );
        assert_eq!(
            c.admin.principal("tenant-token-0123456789"),
            Some(Principal::Tenant(Tenant::parse("acme").unwrap()))
        );
        assert_eq!(c.admin.principal("op-token-012345678"), None);
        assert!(c.require_master_key().is_ok());
        assert_eq!(c.store.kind, StoreKind::Memory);
        assert_eq!(c.store.scylla.attempt_ttl, Duration::from_secs(7 * 86_400));
        let rd = c.kafka.client_config();
        assert_eq!(rd.get("bootstrap.servers"), Some("k1:9092,k2:9092"));
        assert_eq!(rd.get("security.protocol"), Some("ssl"));
        // Secrets never print.
        let dbg = format!("{c:?}");
        assert!(
            !dbg.contains("op-token") && !dbg.contains("tenant-token") && !dbg.contains("AAAA")
        );
    }

    #[test]
    fn env_overrides_file_and_defaults() {
        let c = load(
            "[kafka]\nbootstrap_servers = \"file:9092\"\npartitions = 6\n",
            &[
                ("HOOKLINE_KAFKA__BOOTSTRAP_SERVERS", "env:9092"),
                ("HOOKLINE_KAFKA__CLIENT__SECURITY_PROTOCOL", "ssl"),
                ("HOOKLINE_KAFKA__CLIENT__LINGER_MS", "0"),
                ("HOOKLINE_RETRY__TIERS", r#"["5s","1m"]"#),
                ("HOOKLINE_RETRY__MULTIPLIER", "1.5"),
                ("HOOKLINE_ADMIN__LISTEN", "0.0.0.0:9000"),
                ("HOOKLINE_HTTP__DANGEROUS_ALLOW_HTTP", "true"),
                ("HOOKLINE_STORE__SCYLLA__KEYSPACE", "\"ks2024\""),
                ("HOOKLINE_STORE__SCYLLA__REPLICATION_FACTOR", "3"),
                ("HOOKLINE_LOG", "debug"),
                ("PATH", "/bin"),
            ],
        )
        .unwrap();
        assert_eq!(c.kafka.bootstrap_servers, "env:9092");
        assert_eq!(c.kafka.partitions, 6, "file value kept where env is silent");
        assert_eq!(c.kafka.client["security.protocol"], "ssl");
        assert_eq!(c.kafka.client["linger.ms"], "0");
        assert_eq!(
            c.retry.tiers,
            [Duration::from_secs(5), Duration::from_secs(60)]
        );
        assert_eq!(c.retry.multiplier, 1.5);
        assert_eq!(c.admin.listen.to_string(), "0.0.0.0:9000");
        assert!(c.http.dangerous_allow_http);
        assert_eq!(c.store.scylla.keyspace, "ks2024");
        assert_eq!(c.store.scylla.replication_factor, Some(3));
        assert_eq!(
            c.store.scylla.replication().unwrap(),
            crate::storage::scylla::Replication::Simple(3)
        );
    }

    #[test]
    fn validation_messages_name_the_key_and_say_why() {
        assert_eq!(
            err("[retry]\ntiers = [\"5s\", \"30s\", \"0s\"]", &[]),
            "retry.tiers[2] = \"0s\" must be greater than zero (set by test.toml)"
        );
        assert_eq!(
            err("[kafka]\nbootstrap_server = \"x\"", &[]),
            "unknown key kafka.bootstrap_server (did you mean bootstrap_servers?) (set by test.toml)"
        );
        assert_eq!(
            err("", &[("HOOKLINE_KAFKA__BOOTSTRAP_SERVER", "x")]),
            "unknown key kafka.bootstrap_server (did you mean bootstrap_servers?) (set by \
             HOOKLINE_KAFKA__BOOTSTRAP_SERVER)"
        );
        assert_eq!(
            err("[admin]\nlisten = \"x\"", &[]),
            "admin.listen = \"x\" is not an address (ip:port, e.g. \"127.0.0.1:8080\") (set by test.toml)"
        );
        assert!(err("[nope]", &[]).starts_with("unknown key nope"));
        let cases: &[(&str, &str)] = &[
            (
                "[retry]\ntiers = [\"5s\", \"5s\"]",
                "retry.tiers[1] = \"5s\" must be greater than retry.tiers[0]",
            ),
            (
                "[retry]\ntiers = [\"30s\", \"5s\"]",
                "retry.tiers[1] = \"5s\" must be greater",
            ),
            (
                "[retry]\ntiers = [\"8d\"]",
                "retry.tiers[0] = \"8days\" must be at most 7d",
            ),
            (
                "[retry]\ntiers = []",
                "retry.tiers must list at least one tier",
            ),
            (
                "[retry]\ntiers = [\"5s\", \"soon\"]",
                "retry.tiers[1] = \"soon\" is not a duration",
            ),
            (
                "[retry]\nbase = \"0s\"",
                "retry.base must be greater than zero",
            ),
            (
                "[retry]\nmultiplier = 0.5",
                "retry.multiplier must be a finite number >= 1",
            ),
            (
                "[retry]\ncap = \"1s\"",
                "retry.cap (1s) must be at least retry.base",
            ),
            (
                "[kafka]\npartitions = 0",
                "kafka.partitions = 0 must be between 1 and 10000",
            ),
            (
                "[kafka]\npartitions = \"x\"",
                "kafka.partitions is wrong: invalid type: string \"x\"",
            ),
            (
                "[kafka]\nevents_partitions = 0",
                "kafka.events_partitions = 0 must be between 1 and 10000",
            ),
            (
                "[kafka]\ninput_pattern = 'outbox'",
                "kafka.input_pattern = \"outbox\" must start with ^",
            ),
            (
                "[kafka]\ninput_pattern = '^outbox(('",
                "kafka.input_pattern = \"^outbox((\" is not a valid regex",
            ),
            (
                "[kafka]\ninput_pattern = '^hookline\\..*'",
                "matches hookline's own topic \"hookline.deliveries\"",
            ),
            (
                "[kafka]\ninput_topics = [\"hookline.dlq\"]",
                "kafka.input_topics[0] = \"hookline.dlq\" is one of hookline's own topics",
            ),
            (
                "[kafka]\ninput_topics = [\"bad topic\"]",
                "kafka.input_topics[0] = \"bad topic\" is not a Kafka topic name",
            ),
            (
                "[kafka.topics]\ndlq = \"hookline.deliveries\"",
                "kafka.topics.dlq = \"hookline.deliveries\" is already used",
            ),
            (
                "[kafka]\nbootstrap_servers = \"\"",
                "kafka.bootstrap_servers must not be empty",
            ),
            (
                "[delivery]\nmax_in_flight = 0",
                "delivery.max_in_flight = 0 must be between 1 and",
            ),
            (
                "[delivery]\npartition_max_in_flight = 4",
                "delivery.partition_max_in_flight = 4 must be between",
            ),
            (
                "[delivery]\nbreaker_cooldown = \"0s\"",
                "delivery.breaker_cooldown = \"0s\" must be greater than zero",
            ),
            (
                "[delivery]\nbreaker_cooldown = \"2h\"",
                "delivery.breaker_cooldown = \"2h\" must be at most 1h",
            ),
            (
                "[delivery]\nstall_after = \"0s\"",
                "delivery.stall_after = \"0s\" must be greater than zero",
            ),
            (
                "[http]\ntotal_timeout = \"1s\"",
                "http.total_timeout = \"1s\" must be at least http.connect_timeout",
            ),
            (
                "[http]\nmax_payload_bytes = 2000000",
                "http.max_payload_bytes = 2000000 must be between",
            ),
            (
                // A payload of a whole record leaves no room for what the fan-out adds.
                "[http]\nmax_payload_bytes = 1000000",
                "http.max_payload_bytes = 1000000 must be between 1 and 934464: a payload rides \
                 in one Kafka record of at most 1000000 bytes",
            ),
            (
                "[http]\nmax_payload_bytes = 2000000\n[kafka.client]\n\"message.max.bytes\" = \"1500000\"",
                "http.max_payload_bytes = 2000000 must be between 1 and 1434464",
            ),
            (
                "[kafka.outbox]\ntype_header = \"\"",
                "kafka.outbox.type_header = \"\" must be a header name of 1 to 256 characters",
            ),
            (
                "[kafka.outbox]\ntenant_header = \"id\"",
                "kafka.outbox.tenant_header = \"id\" is the header of the event id",
            ),
            (
                "[kafka.outbox]\ntype_header = \"t\"\ntenant_header = \"t\"",
                "kafka.outbox.tenant_header = \"t\" is kafka.outbox.type_header as well",
            ),
            (
                "[kafka.outbox]\ntype = \"t\"",
                "unknown key kafka.outbox.type",
            ),
            (
                "[kafka.client]\n\"message.max.bytes\" = \"1MB\"",
                "kafka.client.\"message.max.bytes\" = \"1MB\" is not a number of bytes",
            ),
            (
                "[http]\nallow_cidrs = [\"10.0.0.0/33\"]",
                "http.allow_cidrs[0] = \"10.0.0.0/33\" is not a CIDR",
            ),
            (
                "[http]\ndns_servers = [\"8.8.8.8\"]",
                "http.dns_servers[0] = \"8.8.8.8\" is not an address",
            ),
            (
                "[store.memory]\ncapacity = 0",
                "store.memory.capacity = 0 must be between 1 and 10000000",
            ),
            ("[store.memory]\ncapacity = -5", "store.memory.capacity"),
            (
                "[admin]\noperator_tokens = [\"short\"]",
                "admin.operator_tokens[0] must be 16 to 1024 characters (got 5)",
            ),
            (
                "[admin]\noperator_tokens = [\"0123456789abcdef\", \"0123456789abcdef\"]",
                "admin.operator_tokens[1] repeats another admin token",
            ),
            (
                "[metrics]\nlisten = \"127.0.0.1:8080\"",
                "metrics.listen = \"127.0.0.1:8080\" is the same address as admin.listen",
            ),
            (
                "[security]\nmaster_key = \"AAAA\"",
                "security.master_key is wrong: is not usable: master key must be 32 bytes, got 3",
            ),
            (
                "[store]\nkind = \"postgres\"",
                "store.kind is wrong: unknown variant `postgres`",
            ),
            (
                "[store.scylla]\nkeyspace = \"1ks\"",
                "store.scylla.keyspace = \"1ks\" must be 1 to 48 lowercase letters",
            ),
            (
                "[store.scylla]\nkeyspace = \"Hookline\"",
                "store.scylla.keyspace = \"Hookline\" must be 1 to 48 lowercase letters",
            ),
            (
                "[store.scylla]\nnodes = []",
                "store.scylla.nodes must list at least one host:port",
            ),
            (
                "[store.scylla]\nnodes = [\"db1:9042\", \"db2\"]",
                "store.scylla.nodes[1] = \"db2\" is not host:port",
            ),
            (
                "[store.scylla]\nattempt_ttl = \"30y\"",
                "store.scylla.attempt_ttl = \"30years\" must be between 1s and 20 years",
            ),
            (
                "[store.scylla]\nwrite_timeout = \"soon\"",
                "store.scylla.write_timeout = \"soon\" is not a duration",
            ),
            (
                "[store.scylla]\nreplication_factor = 3\nreplication = { dc1 = 3 }",
                "store.scylla.replication and replication_factor are both set",
            ),
            (
                "[store.scylla]\nkeyspac = \"x\"",
                "unknown key store.scylla.keyspac (did you mean keyspace?)",
            ),
            ("[kafka", "config file test.toml is not valid TOML"),
        ];
        for (file, want) in cases {
            let got = err(file, &[]);
            assert!(
                got.starts_with(want) || got.contains(want),
                "{file:?}: got {got:?}, want {want:?}"
            );
        }
        // Key material never appears in an error.
        let key_err = err(
            "[security]\nmaster_key = \"c2VjcmV0LWtleS1tYXRlcmlhbA==\"",
            &[],
        );
        assert!(!key_err.contains("c2VjcmV0"), "{key_err}");
    }

    #[test]
    fn env_reaches_every_store_scylla_key() {
        let c = load(
            "[store.scylla]\nnodes = [\"file:9042\"]\nkeyspace = \"from_file\"\n",
            &[
                (
                    "HOOKLINE_STORE__SCYLLA__NODES",
                    r#"["db1:9042","db2:9042"]"#,
                ),
                (
                    "HOOKLINE_STORE__SCYLLA__REPLICATION",
                    "{ dc1 = 3, dc2 = 2 }",
                ),
                ("HOOKLINE_STORE__SCYLLA__WRITE_TIMEOUT", "750ms"),
                ("HOOKLINE_STORE__SCYLLA__AUDIT_TTL", "90d"),
                ("HOOKLINE_STORE__SCYLLA__MAX_CONCURRENT_WRITES", "32"),
                ("HOOKLINE_STORE__SCYLLA__LOCAL_DC", "dc1"),
            ],
        )
        .unwrap();
        let s = &c.store.scylla;
        assert_eq!(s.nodes, ["db1:9042", "db2:9042"]);
        assert_eq!(
            s.keyspace, "from_file",
            "file value kept where env is silent"
        );
        assert_eq!(
            s.replication().unwrap().cql(),
            "{'class': 'NetworkTopologyStrategy', 'dc1': 3, 'dc2': 2}"
        );
        assert_eq!(s.write_timeout, Duration::from_millis(750));
        assert_eq!(s.audit_ttl, Duration::from_secs(90 * 86_400));
        assert_eq!(s.max_concurrent_writes, 32);
        assert_eq!(s.local_dc.as_deref(), Some("dc1"));
        // Errors in nested keys say which variable set them.
        assert_eq!(
            err(
                "",
                &[("HOOKLINE_STORE__SCYLLA__NODES", r#"["db1:9042","db2"]"#)]
            ),
            "store.scylla.nodes[1] = \"db2\" is not host:port (e.g. \"10.0.0.1:9042\") (set by \
             HOOKLINE_STORE__SCYLLA__NODES)"
        );
        assert_eq!(
            err("", &[("HOOKLINE_STORE__SCYLLA__KEYSPACE", "Prod")]),
            "store.scylla.keyspace = \"Prod\" must be 1 to 48 lowercase letters, digits or '_', \
             starting with a letter (set by HOOKLINE_STORE__SCYLLA__KEYSPACE)"
        );
        assert!(
            err("", &[("HOOKLINE_STORE__SCYLLA__NODEZ", "[]")])
                .starts_with("unknown key store.scylla.nodez (did you mean nodes?)")
        );
    }

    #[test]
    fn env_errors_say_which_variable() {
        assert_eq!(
            err(
                "[admin]\nlisten = \"127.0.0.1:1\"",
                &[("HOOKLINE_ADMIN__LISTEN__PORT", "1")]
            ),
            "environment variable HOOKLINE_ADMIN__LISTEN__PORT: admin.listen is a value, not a section"
        );
        assert!(err("", &[("HOOKLINE_RETRY__TIERS", "[\"5s\"")]).contains("not valid TOML"));
        assert_eq!(
            err("", &[("HOOKLINE_ADMIN__LISTEN", "nowhere")]),
            "admin.listen = \"nowhere\" is not an address (ip:port, e.g. \"127.0.0.1:8080\") (set by HOOKLINE_ADMIN__LISTEN)"
        );
        assert!(err("", &[("HOOKLINE_KAFKA____X", "1")]).contains("empty key segment"));
        // A clash with a default is not blamed on the file.
        assert_eq!(
            err("[admin]\nlisten = \"127.0.0.1:9464\"", &[]),
            "metrics.listen = \"127.0.0.1:9464\" is the same address as admin.listen"
        );
    }

    #[test]
    fn secrets_never_appear_in_config_errors() {
        const OP: &str = "supersecret_operator_token_123";
        const TEN: &str = "supersecret_tenant_token_456";
        const KEY: &str = "c2VjcmV0LWtleS1tYXRlcmlhbA";
        let file_cases: &[(&str, &str)] = &[
            (
                "[admin.tenant_tokens]\n\"supersecret_tenant_token_456\" = \"\"",
                "admin.tenant_tokens (a token) is wrong: tenant must not be empty (set by test.toml)",
            ),
            (
                "[admin.tenant_tokens]\n\"supersecret_tenant_token_456\" = 5",
                "admin.tenant_tokens (a token) is wrong: invalid type: integer `5`",
            ),
            (
                "[admin]\noperator_tokens = \"supersecret_operator_token_123\"",
                "admin.operator_tokens is wrong: expected a list of tokens, got a string (value not \
                 shown: it is a secret) (set by test.toml)",
            ),
            (
                "[admin]\noperator_tokens = [\"supersecret_operator_token_123\", 5]",
                "admin.operator_tokens[1] is wrong: expected a token, got an integer",
            ),
            (
                "[admin]\ntenant_tokens = \"supersecret_tenant_token_456\"",
                "admin.tenant_tokens is wrong: expected a table of token = tenant, got a string",
            ),
            (
                "[security]\nmaster_key = [\"c2VjcmV0LWtleS1tYXRlcmlhbA\"]",
                "security.master_key is wrong: expected base64 of 32 bytes, got a list",
            ),
            (
                "[kafka.client]\n\"sasl.password\" = [\"supersecret_operator_token_123\"]",
                "kafka.client",
            ),
        ];
        let env_cases: &[(&str, &str, &str)] = &[
            (
                "HOOKLINE_ADMIN__TENANT_TOKENS",
                "{ \"supersecret_tenant_token_456\" = \"\" }",
                "admin.tenant_tokens (a token) is wrong: tenant must not be empty (set by \
                 HOOKLINE_ADMIN__TENANT_TOKENS)",
            ),
            (
                "HOOKLINE_ADMIN__TENANT_TOKENS",
                "{ \"supersecret_tenant_token_456\" = 5 }",
                "admin.tenant_tokens (a token) is wrong",
            ),
            (
                "HOOKLINE_ADMIN__OPERATOR_TOKENS",
                OP,
                "admin.operator_tokens is wrong: expected a list of tokens, got a string (value not \
                 shown: it is a secret) (set by HOOKLINE_ADMIN__OPERATOR_TOKENS)",
            ),
            (
                "HOOKLINE_ADMIN__TENANT_TOKENS",
                TEN,
                "admin.tenant_tokens is wrong: expected a table of token = tenant, got a string \
                 (value not shown: it is a secret) (set by HOOKLINE_ADMIN__TENANT_TOKENS)",
            ),
            (
                "HOOKLINE_ADMIN__OPERATOR_TOKENS",
                "[\"supersecret_operator_token_123",
                "environment variable HOOKLINE_ADMIN__OPERATOR_TOKENS: value for \
                 admin.operator_tokens is not valid TOML",
            ),
            (
                "HOOKLINE_ADMIN__TENANT_TOKENS__SUPERSECRET_TENANT_TOKEN_456",
                "acme",
                "environment variable HOOKLINE_ADMIN__TENANT_TOKENS__...: a token cannot be part",
            ),
            (
                "HOOKLINE_SECURITY__MASTER_KEY",
                "[\"c2VjcmV0LWtleS1tYXRlcmlhbA\"]",
                "security.master_key is wrong: expected base64 of 32 bytes, got a list",
            ),
        ];
        let got = file_cases
            .iter()
            .map(|(file, want)| (*file, err(file, &[]), *want))
            .chain(
                env_cases
                    .iter()
                    .map(|(var, value, want)| (*var, err("", &[(var, value)]), *want)),
            );
        for (input, got, want) in got {
            assert!(got.starts_with(want), "{input}: got {got:?}, want {want:?}");
            let lower = got.to_ascii_lowercase();
            for secret in [OP, TEN, KEY] {
                assert!(
                    !lower.contains(&secret.to_ascii_lowercase()),
                    "{input}: {got}"
                );
            }
        }
    }

    #[test]
    fn secret_kafka_client_properties_are_redacted_in_debug() {
        let c = load(
            "[kafka.client]\n\"sasl.password\" = \"supersecret_sasl\"\n\
             \"ssl.key.pem\" = \"supersecret_pem\"\n\"sasl.username\" = \"hookline\"",
            &[(
                "HOOKLINE_KAFKA__CLIENT__SASL_OAUTHBEARER_CLIENT_SECRET",
                "supersecret_oauth",
            )],
        )
        .unwrap();
        assert_eq!(c.kafka.client["sasl.password"], "supersecret_sasl");
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("supersecret"), "{dbg}");
        assert!(dbg.contains("\"sasl.password\": \"<redacted>\""), "{dbg}");
        assert!(dbg.contains("\"sasl.username\": \"hookline\""), "{dbg}");
    }

    #[test]
    fn an_env_variable_below_a_value_is_named() {
        assert_eq!(
            err("", &[("HOOKLINE_KAFKA__PARTITIONS__X", "1")]),
            "kafka.partitions is wrong: invalid type: map, expected u32 (set by \
             HOOKLINE_KAFKA__PARTITIONS__X)"
        );
    }

    #[test]
    fn tier_names_are_short_and_exact() {
        let n = |s| tier_name(Duration::from_millis(s));
        assert_eq!(n(5_000), "5s");
        assert_eq!(n(90_000), "90s");
        assert_eq!(n(120_000), "2m");
        assert_eq!(n(6 * 3_600_000), "6h");
        assert_eq!(n(86_400_000), "1d");
        assert_eq!(n(1_500), "1500ms");
    }
}
