//! `[kafka]`, `[kafka.outbox]` and `[kafka.topics]`: the cluster, hookline's own topics, the
//! inputs, and the rules that keep hookline from consuming its own output.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::Deserialize;

use super::error::{ConfigError, invalid};
use crate::delay_tier::tier_name;
use crate::kafka::ClientProperties;
use crate::limits::DEFAULT_MESSAGE_MAX_BYTES;

/// Longest Kafka topic name.
const MAX_TOPIC_LEN: usize = 249;

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

impl KafkaConfig {
    /// The largest record hookline's producers send: `message.max.bytes` in `client`, or
    /// librdkafka's default.
    pub fn message_max_bytes(&self) -> Result<u64, ConfigError> {
        match self.client.get("message.max.bytes") {
            None => Ok(DEFAULT_MESSAGE_MAX_BYTES),
            Some(v) => v.trim().parse().map_err(|_| {
                invalid(
                    "kafka.client.\"message.max.bytes\"",
                    format!("= {v:?} is not a number of bytes"),
                )
            }),
        }
    }

    /// Checks `[kafka]` and its tables; `tiers` are `retry.tiers`, whose topics an input
    /// pattern must not match.
    pub(super) fn validate(&self, tiers: &[Duration]) -> Result<(), ConfigError> {
        self.validate_cluster()?;
        self.outbox.validate()?;
        self.topics.validate()?;
        self.validate_input_topics()?;
        self.validate_input_pattern(tiers)
    }

    /// The servers, the partition counts and the consumer-group prefix.
    fn validate_cluster(&self) -> Result<(), ConfigError> {
        if self.bootstrap_servers.trim().is_empty() {
            return Err(invalid("kafka.bootstrap_servers", "must not be empty"));
        }
        for (key, count) in [
            ("kafka.partitions", Some(self.partitions)),
            ("kafka.events_partitions", self.events_partitions),
        ] {
            if let Some(n) = count.filter(|n| !(1..=10_000).contains(n)) {
                return Err(invalid(key, format!("= {n} must be between 1 and 10000")));
            }
        }
        if self.group_prefix.is_empty()
            || !self
                .group_prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return Err(invalid(
                "kafka.group_prefix",
                "must be non-empty ASCII letters, digits, '.', '_' or '-'",
            ));
        }
        Ok(())
    }

    /// Named input topics: legal names, and none of hookline's own.
    fn validate_input_topics(&self) -> Result<(), ConfigError> {
        if self.input_topics.len() > 1000 {
            return Err(invalid(
                "kafka.input_topics",
                "must list at most 1000 topics",
            ));
        }
        for (i, name) in self.input_topics.iter().enumerate() {
            let key = format!("kafka.input_topics[{i}]");
            check_topic(&key, name)?;
            if self.topics.is_own_output(name) {
                return Err(invalid(
                    key,
                    format!("= {name:?} is one of hookline's own topics and cannot be an input"),
                ));
            }
        }
        Ok(())
    }

    /// The input pattern: a regex rdkafka subscribes to as one, matching none of hookline's own
    /// topics (tier topics included).
    fn validate_input_pattern(&self, tiers: &[Duration]) -> Result<(), ConfigError> {
        let Some(p) = &self.input_pattern else {
            return Ok(());
        };
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
        let t = &self.topics;
        let mut probes = vec![
            t.deliveries.clone(),
            t.endpoints.clone(),
            t.dlq.clone(),
            t.invalid.clone(),
        ];
        probes.extend(tiers.iter().map(|&tier| self.tier_topic(tier)));
        if let Some(hit) = probes.iter().find(|n| re.is_match(n)) {
            return Err(invalid(
                key,
                format!("= {p:?} matches hookline's own topic {hit:?}, which would loop"),
            ));
        }
        Ok(())
    }
}

impl OutboxConfig {
    /// Two distinct, usable header names, neither the one that carries the event id.
    fn validate(&self) -> Result<(), ConfigError> {
        for (key, name) in [
            ("kafka.outbox.type_header", &self.type_header),
            ("kafka.outbox.tenant_header", &self.tenant_header),
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
        if self.type_header == self.tenant_header {
            return Err(invalid(
                "kafka.outbox.tenant_header",
                format!(
                    "= {:?} is kafka.outbox.type_header as well; they are two headers",
                    self.tenant_header
                ),
            ));
        }
        Ok(())
    }
}

impl TopicsConfig {
    /// Legal, distinct topic names, and a retry prefix that leaves room for a tier suffix.
    fn validate(&self) -> Result<(), ConfigError> {
        let own = [
            ("kafka.topics.deliveries", &self.deliveries),
            ("kafka.topics.endpoints", &self.endpoints),
            ("kafka.topics.dlq", &self.dlq),
            ("kafka.topics.invalid", &self.invalid),
            ("kafka.topics.events", &self.events),
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
            &format!("{}{}", self.retry_prefix, "9999999ms"),
        )
        .map_err(|_| {
            invalid(
                "kafka.topics.retry_prefix",
                format!(
                    "= {:?} must be a topic name prefix (letters, digits, '.', '_', '-'; short \
                     enough for a tier suffix)",
                    self.retry_prefix
                ),
            )
        })?;
        if self.retry_prefix.is_empty() {
            return Err(invalid("kafka.topics.retry_prefix", "must not be empty"));
        }
        Ok(())
    }

    /// Whether `name` is a topic hookline writes: consuming it as input would loop forever.
    /// The events topic is not one: the fan-out consumes it.
    fn is_own_output(&self, name: &str) -> bool {
        name == self.deliveries
            || name == self.endpoints
            || name == self.dlq
            || name == self.invalid
            || name.starts_with(&self.retry_prefix)
    }
}

/// A legal Kafka topic name at `key`.
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
