//! `[http]`: the outbound client's timeouts, SSRF exceptions, resolvers and payload limit.

use std::net::SocketAddr;
use std::time::Duration;

use ipnet::IpNet;
use serde::Deserialize;

use super::error::{ConfigError, invalid};
use super::kafka::KafkaConfig;
use crate::limits::RECORD_HEADROOM;
use crate::serde_field::{addrs, cidrs, duration};

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

impl HttpConfig {
    /// Usable timeouts, a payload limit that fits in one Kafka record under `kafka`'s record
    /// limit, and bounded lists.
    pub(super) fn validate(&self, kafka: &KafkaConfig) -> Result<(), ConfigError> {
        if self.connect_timeout.is_zero() {
            return Err(invalid(
                "http.connect_timeout",
                "= \"0s\" must be greater than zero",
            ));
        }
        if self.total_timeout < self.connect_timeout {
            return Err(invalid(
                "http.total_timeout",
                format!(
                    "= {:?} must be at least http.connect_timeout ({})",
                    humantime::format_duration(self.total_timeout).to_string(),
                    humantime::format_duration(self.connect_timeout)
                ),
            ));
        }
        let record_limit = kafka.message_max_bytes()?;
        let ceiling = record_limit.saturating_sub(RECORD_HEADROOM);
        if !(1..=ceiling).contains(&self.max_payload_bytes) {
            return Err(invalid(
                "http.max_payload_bytes",
                format!(
                    "= {} must be between 1 and {ceiling}: a payload rides in one Kafka record \
                     of at most {record_limit} bytes (kafka.client \"message.max.bytes\"), less \
                     {RECORD_HEADROOM} for the envelope and headers hookline adds to it",
                    self.max_payload_bytes
                ),
            ));
        }
        if self.allow_cidrs.len() > 256 {
            return Err(invalid("http.allow_cidrs", "must list at most 256 ranges"));
        }
        if self.dns_servers.len() > 16 {
            return Err(invalid("http.dns_servers", "must list at most 16 servers"));
        }
        Ok(())
    }
}
