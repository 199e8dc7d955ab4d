//! `[store.scylla]`: where the CQL cluster is and how hookline writes to it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

/// The longest TTL CQL accepts (20 years, in seconds).
pub const MAX_CQL_TTL: Duration = Duration::from_secs(630_720_000);

/// The CQL store's settings, the `[store.scylla]` table of the config file.
///
/// ```toml
/// [store.scylla]
/// nodes = ["10.0.0.1:9042", "10.0.0.2:9042"]
/// keyspace = "hookline"
/// replication = { dc1 = 3, dc2 = 3 }   # or: replication_factor = 3
/// attempt_ttl = "30d"
/// write_timeout = "2s"
/// max_concurrent_writes = 256
/// local_dc = "dc1"
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScyllaConfig {
    /// Contact points, `host:port`.
    pub nodes: Vec<String>,
    /// The keyspace hookline owns (lowercase letters, digits and `_`, at most 48).
    pub keyspace: String,
    /// SimpleStrategy with this many replicas; ignored when `replication` is given.
    pub replication_factor: Option<u32>,
    /// NetworkTopologyStrategy: replicas per datacenter.
    pub replication: Option<BTreeMap<String, u32>>,
    /// How long attempt rows, delivery state and history are kept.
    #[serde(with = "humantime_serde")]
    pub attempt_ttl: Duration,
    /// How long replay audit rows are kept.
    #[serde(with = "humantime_serde")]
    pub audit_ttl: Duration,
    /// Client-side timeout of one CQL request (retries included).
    #[serde(with = "humantime_serde")]
    pub write_timeout: Duration,
    /// CQL requests in flight at once from this process; further writes wait for a slot.
    pub max_concurrent_writes: usize,
    /// The datacenter to prefer (token-aware within it); any when unset.
    pub local_dc: Option<String>,
}

impl Default for ScyllaConfig {
    fn default() -> Self {
        ScyllaConfig {
            nodes: vec!["127.0.0.1:9042".into()],
            keyspace: "hookline".into(),
            replication_factor: None,
            replication: None,
            attempt_ttl: Duration::from_secs(30 * 86_400),
            audit_ttl: Duration::from_secs(365 * 86_400),
            write_timeout: Duration::from_secs(2),
            max_concurrent_writes: 256,
            local_dc: None,
        }
    }
}

/// How the keyspace's data is replicated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replication {
    /// `SimpleStrategy` with this many replicas (single datacenter, development).
    Simple(u32),
    /// `NetworkTopologyStrategy`: replicas per datacenter.
    NetworkTopology(BTreeMap<String, u32>),
}

impl Replication {
    /// The CQL map literal for `CREATE KEYSPACE ... WITH replication = ...`.
    pub fn cql(&self) -> String {
        match self {
            Replication::Simple(n) => {
                format!("{{'class': 'SimpleStrategy', 'replication_factor': {n}}}")
            }
            Replication::NetworkTopology(dcs) => {
                let mut s = String::from("{'class': 'NetworkTopologyStrategy'");
                for (dc, n) in dcs {
                    // DC names were validated: no quote can break out of the literal.
                    s.push_str(&format!(", '{dc}': {n}"));
                }
                s.push('}');
                s
            }
        }
    }
}

/// A `[store.scylla]` value that cannot work, naming the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A key has an unusable value.
    #[error("store.scylla.{key}: {reason}")]
    Invalid {
        /// The key, relative to `[store.scylla]`.
        key: &'static str,
        /// What is wrong and what is accepted.
        reason: String,
    },
    /// The TOML could not be read as a `[store.scylla]` table.
    #[error("store.scylla: {0}")]
    Parse(String),
}

fn invalid(key: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        reason: reason.into(),
    }
}

/// Whether `name` can be a keyspace name without quoting: CQL folds unquoted names to lowercase,
/// so only lowercase names mean the same thing quoted and unquoted.
pub fn valid_keyspace(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z'))
        && name.len() <= 48
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_'))
}

impl ScyllaConfig {
    /// Reads the `[store.scylla]` table of a whole config file (defaults when it is absent);
    /// unknown keys in that table are rejected.
    // TODO(lead): full Config — this reads only `[store.scylla]` until the config module lands.
    pub fn from_toml_file_text(text: &str) -> Result<ScyllaConfig, ConfigError> {
        let doc: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            ConfigError::Parse(format!("not valid TOML: {}", e.message()))
        })?;
        let table = doc
            .get("store")
            .and_then(|s| s.get("scylla"))
            .cloned()
            .unwrap_or_else(|| toml::Value::Table(toml::Table::new()));
        let config: ScyllaConfig = table
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Parse(e.message().to_owned()))?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every value; the error names the key and says what is accepted.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.nodes.is_empty() {
            return Err(invalid("nodes", "at least one host:port is required"));
        }
        if let Some(bad) = self.nodes.iter().find(|n| !looks_like_host_port(n)) {
            return Err(invalid("nodes", format!("{bad:?} is not host:port")));
        }
        if !valid_keyspace(&self.keyspace) {
            return Err(invalid(
                "keyspace",
                format!(
                    "{:?}: use 1 to 48 lowercase letters, digits or _, starting with a letter",
                    self.keyspace
                ),
            ));
        }
        self.replication()?;
        for (key, ttl) in [
            ("attempt_ttl", self.attempt_ttl),
            ("audit_ttl", self.audit_ttl),
        ] {
            if ttl < Duration::from_secs(1) || ttl > MAX_CQL_TTL {
                return Err(invalid(
                    key,
                    "must be between 1s and 20 years (CQL's TTL limit)",
                ));
            }
        }
        if self.write_timeout.is_zero() || self.write_timeout > Duration::from_secs(60) {
            return Err(invalid("write_timeout", "must be between 1ms and 60s"));
        }
        if !(1..=65_536).contains(&self.max_concurrent_writes) {
            return Err(invalid(
                "max_concurrent_writes",
                "must be between 1 and 65536",
            ));
        }
        if self.local_dc.as_deref().is_some_and(str::is_empty) {
            return Err(invalid("local_dc", "must not be empty when set"));
        }
        Ok(())
    }

    /// The keyspace's replication: the `replication` table when given, else SimpleStrategy with
    /// `replication_factor` (1 when unset).
    pub fn replication(&self) -> Result<Replication, ConfigError> {
        match (&self.replication, self.replication_factor) {
            (Some(_), Some(_)) => Err(invalid(
                "replication",
                "set either replication (per datacenter) or replication_factor, not both",
            )),
            (Some(dcs), None) => {
                if dcs.is_empty() {
                    return Err(invalid("replication", "name at least one datacenter"));
                }
                for (dc, n) in dcs {
                    let ok_name = !dc.is_empty()
                        && dc
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
                    if !ok_name {
                        return Err(invalid(
                            "replication",
                            format!("datacenter name {dc:?} may use letters, digits, _ - . only"),
                        ));
                    }
                    if *n == 0 {
                        return Err(invalid("replication", format!("{dc}: at least 1 replica")));
                    }
                }
                Ok(Replication::NetworkTopology(dcs.clone()))
            }
            (None, Some(0)) => Err(invalid("replication_factor", "must be at least 1")),
            (None, n) => Ok(Replication::Simple(n.unwrap_or(1))),
        }
    }

    /// `attempt_ttl` in whole seconds, as `USING TTL` takes it.
    pub fn attempt_ttl_secs(&self) -> i32 {
        ttl_secs(self.attempt_ttl)
    }

    /// `audit_ttl` in whole seconds, as `USING TTL` takes it.
    pub fn audit_ttl_secs(&self) -> i32 {
        ttl_secs(self.audit_ttl)
    }
}

fn ttl_secs(ttl: Duration) -> i32 {
    // validate() bounds both TTLs by MAX_CQL_TTL, which fits an i32.
    i32::try_from(ttl.min(MAX_CQL_TTL).as_secs())
        .unwrap_or(i32::MAX)
        .max(1)
}

fn looks_like_host_port(s: &str) -> bool {
    s.rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_apply_when_the_table_is_absent() {
        let c = ScyllaConfig::from_toml_file_text("[admin]\nlisten = \"x\"\n").unwrap();
        assert_eq!(c, ScyllaConfig::default());
        assert_eq!(c.replication().unwrap(), Replication::Simple(1));
        assert_eq!(c.attempt_ttl_secs(), 30 * 86_400);
    }

    #[test]
    fn reads_the_store_scylla_table() {
        let c = ScyllaConfig::from_toml_file_text(
            r#"
            [store.scylla]
            nodes = ["a:9042", "b:9043"]
            keyspace = "hl_prod"
            replication = { dc1 = 3, dc2 = 2 }
            attempt_ttl = "7d"
            write_timeout = "500ms"
            max_concurrent_writes = 64
            local_dc = "dc1"
            "#,
        )
        .unwrap();
        assert_eq!(c.nodes, ["a:9042", "b:9043"]);
        assert_eq!(c.attempt_ttl, Duration::from_secs(7 * 86_400));
        assert_eq!(c.write_timeout, Duration::from_millis(500));
        assert_eq!(
            c.replication().unwrap().cql(),
            "{'class': 'NetworkTopologyStrategy', 'dc1': 3, 'dc2': 2}"
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let e = ScyllaConfig::from_toml_file_text("[store.scylla]\nnodez = []\n").unwrap_err();
        assert!(e.to_string().contains("nodez"), "{e}");
        let e = ScyllaConfig::from_toml_file_text("[store.scylla]\nkeyspace = \"Bad-Name\"\n")
            .unwrap_err();
        assert!(e.to_string().starts_with("store.scylla.keyspace"), "{e}");
        let e = ScyllaConfig::from_toml_file_text(
            "[store.scylla]\nreplication_factor = 3\nreplication = { dc1 = 3 }\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("not both"), "{e}");
        let e =
            ScyllaConfig::from_toml_file_text("[store.scylla]\nreplication = { \"d'c\" = 3 }\n")
                .unwrap_err();
        assert!(e.to_string().contains("datacenter name"), "{e}");
        let e = ScyllaConfig::from_toml_file_text("[store.scylla]\nattempt_ttl = \"0s\"\n")
            .unwrap_err();
        assert!(e.to_string().contains("attempt_ttl"), "{e}");
        let e = ScyllaConfig::from_toml_file_text("[store.scylla]\nnodes = [\"nohost\"]\n")
            .unwrap_err();
        assert!(e.to_string().contains("host:port"), "{e}");
    }

    #[test]
    fn simple_replication_literal() {
        assert_eq!(
            Replication::Simple(3).cql(),
            "{'class': 'SimpleStrategy', 'replication_factor': 3}"
        );
    }
}
