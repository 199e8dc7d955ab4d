//! `[store.scylla]`: where the CQL cluster is and how hookline writes to it.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use zeroize::Zeroizing;

/// The longest TTL CQL accepts (20 years, in seconds).
pub const MAX_CQL_TTL: Duration = Duration::from_secs(630_720_000);

/// The CQL store's settings, the `[store.scylla]` table of [`crate::config::Config`] (which
/// deserialises it, environment overrides included, and calls [`ScyllaConfig::validate`]).
///
/// ```toml
/// [store.scylla]
/// nodes = ["10.0.0.1:9042", "10.0.0.2:9042"]
/// keyspace = "hookline"
/// replication = { dc1 = 3, dc2 = 3 }   # or: replication_factor = 3
/// attempt_ttl = "30d"
/// audit_ttl = "365d"
/// write_timeout = "2s"
/// max_concurrent_writes = 256
/// local_dc = "dc1"
/// startup_wait = "60s"
/// username = "hookline"                 # with password: log in (PasswordAuthenticator)
/// password = "..."                      # better: HOOKLINE_STORE__SCYLLA__PASSWORD
///
/// [store.scylla.tls]                    # TLS to every node; absent: plain TCP
/// ca_file = "/etc/hookline/cql-ca.pem"  # CAs the nodes' certificates chain to (default: Mozilla's)
/// server_name = "scylla.internal"       # name the certificates carry (default: each node's IP)
/// cert_file = "/etc/hookline-cql/client.pem"  # hookline's own certificate, when the cluster
/// key_file = "/etc/hookline-cql/client.key"   # asks clients for one (both or neither)
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
    #[serde(deserialize_with = "crate::serde_field::duration")]
    pub attempt_ttl: Duration,
    /// How long replay audit rows are kept.
    #[serde(deserialize_with = "crate::serde_field::duration")]
    pub audit_ttl: Duration,
    /// Client-side timeout of one CQL request (retries included).
    #[serde(deserialize_with = "crate::serde_field::duration")]
    pub write_timeout: Duration,
    /// CQL requests in flight at once from this process; further writes wait for a slot.
    pub max_concurrent_writes: usize,
    /// The datacenter to prefer (token-aware within it); any when unset.
    pub local_dc: Option<String>,
    /// How long start-up keeps retrying an unreachable cluster before it fails (`0s`: one try).
    /// Covers a cluster that starts alongside hookline; a missing schema fails at once.
    #[serde(deserialize_with = "crate::serde_field::duration")]
    pub startup_wait: Duration,
    /// The role hookline logs in as, with `password`; no login when unset.
    pub username: Option<String>,
    /// That role's password.
    pub password: Option<CqlPassword>,
    /// TLS to the nodes; plain TCP when absent.
    pub tls: Option<CqlTls>,
}

/// The CQL role's password: never shown in Debug output, wiped from memory when dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct CqlPassword(Zeroizing<String>);

impl CqlPassword {
    /// Wraps a password.
    pub fn new(s: impl Into<String>) -> CqlPassword {
        CqlPassword(Zeroizing::new(s.into()))
    }

    /// The password itself, for the driver's login.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for CqlPassword {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CqlPassword(<redacted>)")
    }
}

impl<'de> Deserialize<'de> for CqlPassword {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(CqlPassword::new)
    }
}

/// `[store.scylla.tls]`: how hookline checks the nodes' certificates, and its own. The files are
/// read at start-up and again by the first connection after they change (see the `tls` module).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CqlTls {
    /// A PEM file of the CA certificates the nodes' certificates chain to; Mozilla's root
    /// store (as for webhook endpoints) when unset.
    pub ca_file: Option<PathBuf>,
    /// The DNS name (or IP address) every node's certificate must be valid for. Unset, each
    /// node's certificate must be valid for that node's IP address, as the driver dials it.
    pub server_name: Option<String>,
    /// A PEM file of hookline's own certificate (and its chain), for a cluster that asks
    /// clients for one (`require_client_auth`); with `key_file`.
    pub cert_file: Option<PathBuf>,
    /// A PEM file of that certificate's private key (PKCS#8, PKCS#1 or SEC1, unencrypted).
    pub key_file: Option<PathBuf>,
}

impl CqlTls {
    /// `server_name` as rustls takes it, or the error naming the key.
    pub fn server_name(
        &self,
    ) -> Result<Option<rustls::pki_types::ServerName<'static>>, ConfigError> {
        self.server_name
            .as_ref()
            .map(|name| {
                rustls::pki_types::ServerName::try_from(name.clone()).map_err(|_| {
                    invalid(
                        "tls.server_name",
                        format!("= {name:?} is not a DNS name or an IP address"),
                    )
                })
            })
            .transpose()
    }
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
            startup_wait: Duration::from_secs(60),
            username: None,
            password: None,
            tls: None,
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

/// A `[store.scylla]` value that cannot work. The message reads like the rest of the config's
/// errors: the full key, then `= value` when there is one, then why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A key has an unusable value.
    #[error("store.scylla.{key} {reason}")]
    Invalid {
        /// The key relative to `[store.scylla]`, with an index for list items (`nodes[1]`).
        key: String,
        /// `= value why`, or just why; says what is accepted.
        reason: String,
    },
}

impl ConfigError {
    /// The full key path (`store.scylla.nodes[1]`), as [`crate::config`] names keys.
    pub fn full_key(&self) -> String {
        match self {
            ConfigError::Invalid { key, .. } => format!("store.scylla.{key}"),
        }
    }

    /// What is wrong with the value (the message without the key).
    pub fn reason(&self) -> &str {
        match self {
            ConfigError::Invalid { reason, .. } => reason,
        }
    }
}

pub(super) fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
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

/// Longest `startup_wait` accepted: beyond it a process supervisor's restart is the better wait.
pub const MAX_STARTUP_WAIT: Duration = Duration::from_secs(3600);

/// Most contact points accepted: the driver discovers the rest of the cluster from any one.
pub const MAX_NODES: usize = 64;

impl ScyllaConfig {
    /// Checks every value; the error names the key and says what is accepted.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_nodes()?;
        if !valid_keyspace(&self.keyspace) {
            return Err(invalid(
                "keyspace",
                format!(
                    "= {:?} must be 1 to 48 lowercase letters, digits or '_', starting with a \
                     letter",
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
                    format!(
                        "= {:?} must be between 1s and 20 years (CQL's TTL limit)",
                        humantime::format_duration(ttl).to_string()
                    ),
                ));
            }
        }
        if self.write_timeout.is_zero() || self.write_timeout > Duration::from_secs(60) {
            return Err(invalid(
                "write_timeout",
                format!(
                    "= {:?} must be between 1ms and 60s",
                    humantime::format_duration(self.write_timeout).to_string()
                ),
            ));
        }
        if !(1..=65_536).contains(&self.max_concurrent_writes) {
            return Err(invalid(
                "max_concurrent_writes",
                format!(
                    "= {} must be between 1 and 65536",
                    self.max_concurrent_writes
                ),
            ));
        }
        if self.local_dc.as_deref().is_some_and(str::is_empty) {
            return Err(invalid("local_dc", "must not be empty when set"));
        }
        self.validate_login()?;
        self.validate_tls()?;
        if self.startup_wait > MAX_STARTUP_WAIT {
            return Err(invalid(
                "startup_wait",
                format!(
                    "= {:?} must be at most 1h",
                    humantime::format_duration(self.startup_wait).to_string()
                ),
            ));
        }
        Ok(())
    }

    /// Between one and [`MAX_NODES`] contact points, each `host:port`.
    fn validate_nodes(&self) -> Result<(), ConfigError> {
        if self.nodes.is_empty() {
            return Err(invalid("nodes", "must list at least one host:port"));
        }
        if self.nodes.len() > MAX_NODES {
            return Err(invalid(
                "nodes",
                format!("must list at most {MAX_NODES} contact points"),
            ));
        }
        if let Some((i, bad)) = self
            .nodes
            .iter()
            .enumerate()
            .find(|(_, n)| !looks_like_host_port(n))
        {
            return Err(invalid(
                format!("nodes[{i}]"),
                format!("= {bad:?} is not host:port (e.g. \"10.0.0.1:9042\")"),
            ));
        }
        Ok(())
    }

    /// When TLS is on: no empty paths, a certificate only with its key, a usable server name.
    fn validate_tls(&self) -> Result<(), ConfigError> {
        let Some(tls) = &self.tls else {
            return Ok(());
        };
        for (key, path) in [
            ("tls.ca_file", &tls.ca_file),
            ("tls.cert_file", &tls.cert_file),
            ("tls.key_file", &tls.key_file),
        ] {
            if path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
                return Err(invalid(key, "must not be empty when set"));
            }
        }
        match (&tls.cert_file, &tls.key_file) {
            (Some(_), None) => {
                return Err(invalid(
                    "tls.key_file",
                    "is missing: tls.cert_file is set, and a certificate is presented \
                     with its private key",
                ));
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "tls.cert_file",
                    "is missing: tls.key_file is set, but not the certificate it belongs to",
                ));
            }
            _ => {}
        }
        tls.server_name()?;
        Ok(())
    }

    /// `username` and `password` come together, and neither is empty.
    fn validate_login(&self) -> Result<(), ConfigError> {
        if self.username.as_deref().is_some_and(str::is_empty) {
            return Err(invalid("username", "must not be empty when set"));
        }
        if self
            .password
            .as_ref()
            .is_some_and(|p| p.expose().is_empty())
        {
            return Err(invalid("password", "must not be empty when set"));
        }
        match (&self.username, &self.password) {
            (Some(_), None) => Err(invalid(
                "password",
                "is missing: store.scylla.username is set, so hookline logs in and needs the \
                 role's password (HOOKLINE_STORE__SCYLLA__PASSWORD, say)",
            )),
            (None, Some(_)) => Err(invalid(
                "username",
                "is missing: store.scylla.password is set, but not the role to log in as",
            )),
            _ => Ok(()),
        }
    }

    /// The keyspace's replication: the `replication` table when given, else SimpleStrategy with
    /// `replication_factor` (1 when unset).
    pub fn replication(&self) -> Result<Replication, ConfigError> {
        match (&self.replication, self.replication_factor) {
            (Some(_), Some(_)) => Err(invalid(
                "replication",
                "and replication_factor are both set: set either replication (per datacenter) \
                 or replication_factor, not both",
            )),
            (Some(dcs), None) => {
                if dcs.is_empty() {
                    return Err(invalid("replication", "must name at least one datacenter"));
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
                        return Err(invalid(
                            format!("replication.{dc}"),
                            "= 0 must be at least 1",
                        ));
                    }
                }
                Ok(Replication::NetworkTopology(dcs.clone()))
            }
            (None, Some(0)) => Err(invalid("replication_factor", "= 0 must be at least 1")),
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

    /// The `[store.scylla]` table alone, as the config module hands it over.
    fn parse(table: &str) -> Result<ScyllaConfig, String> {
        let c: ScyllaConfig = toml::from_str(table).map_err(|e| e.message().to_owned())?;
        c.validate().map_err(|e| e.to_string())?;
        Ok(c)
    }

    #[test]
    fn defaults_are_valid() {
        let c = parse("").unwrap();
        assert_eq!(c, ScyllaConfig::default());
        assert_eq!(c.replication().unwrap(), Replication::Simple(1));
        assert_eq!(c.attempt_ttl_secs(), 30 * 86_400);
    }

    #[test]
    fn reads_every_key() {
        let c = parse(
            r#"
            nodes = ["a:9042", "b:9043"]
            keyspace = "hl_prod"
            replication = { dc1 = 3, dc2 = 2 }
            attempt_ttl = "7d"
            audit_ttl = "400d"
            write_timeout = "500ms"
            max_concurrent_writes = 64
            local_dc = "dc1"
            startup_wait = "5s"
            "#,
        )
        .unwrap();
        assert_eq!(c.startup_wait, Duration::from_secs(5));
        assert_eq!(c.nodes, ["a:9042", "b:9043"]);
        assert_eq!(c.attempt_ttl, Duration::from_secs(7 * 86_400));
        assert_eq!(c.audit_ttl, Duration::from_secs(400 * 86_400));
        assert_eq!(c.write_timeout, Duration::from_millis(500));
        assert_eq!(c.max_concurrent_writes, 64);
        assert_eq!(c.local_dc.as_deref(), Some("dc1"));
        assert_eq!(
            c.replication().unwrap().cql(),
            "{'class': 'NetworkTopologyStrategy', 'dc1': 3, 'dc2': 2}"
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let e = parse("nodez = []").unwrap_err();
        assert!(e.contains("nodez"), "{e}");
        let cases = [
            (
                "keyspace = \"Bad-Name\"",
                "store.scylla.keyspace = \"Bad-Name\" must be 1 to 48 lowercase",
            ),
            (
                "replication_factor = 3\nreplication = { dc1 = 3 }",
                "store.scylla.replication and replication_factor are both set",
            ),
            (
                "replication = { \"d'c\" = 3 }",
                "store.scylla.replication datacenter name",
            ),
            (
                "replication = { dc1 = 0 }",
                "store.scylla.replication.dc1 = 0 must be at least 1",
            ),
            (
                "replication_factor = 0",
                "store.scylla.replication_factor = 0 must be at least 1",
            ),
            (
                "attempt_ttl = \"0s\"",
                "store.scylla.attempt_ttl = \"0s\" must be between 1s and 20 years",
            ),
            (
                "nodes = [\"a:9042\", \"nohost\"]",
                "store.scylla.nodes[1] = \"nohost\" is not host:port",
            ),
            ("nodes = []", "store.scylla.nodes must list at least one"),
            (
                "write_timeout = \"2m\"",
                "store.scylla.write_timeout = \"2m\" must be between 1ms and 60s",
            ),
            (
                "max_concurrent_writes = 0",
                "store.scylla.max_concurrent_writes = 0 must be between 1 and 65536",
            ),
            (
                "startup_wait = \"2h\"",
                "store.scylla.startup_wait = \"2h\" must be at most 1h",
            ),
            ("local_dc = \"\"", "store.scylla.local_dc must not be empty"),
            (
                "username = \"hookline\"",
                "store.scylla.password is missing: store.scylla.username is set",
            ),
            (
                "password = \"pw-0123\"",
                "store.scylla.username is missing: store.scylla.password is set",
            ),
            (
                "username = \"\"\npassword = \"pw-0123\"",
                "store.scylla.username must not be empty",
            ),
            (
                "username = \"hookline\"\npassword = \"\"",
                "store.scylla.password must not be empty",
            ),
            (
                "[tls]\nserver_name = \"not a name\"",
                "store.scylla.tls.server_name = \"not a name\" is not a DNS name or an IP address",
            ),
            (
                "[tls]\nca_file = \"\"",
                "store.scylla.tls.ca_file must not be empty",
            ),
            (
                "[tls]\nkey_file = \"\"",
                "store.scylla.tls.key_file must not be empty",
            ),
            (
                "[tls]\ncert_file = \"c.pem\"",
                "store.scylla.tls.key_file is missing: tls.cert_file is set",
            ),
            (
                "[tls]\nkey_file = \"c.key\"",
                "store.scylla.tls.cert_file is missing: tls.key_file is set",
            ),
        ];
        for (table, want) in cases {
            let got = parse(table).unwrap_err();
            assert!(
                got.starts_with(want),
                "{table:?}: got {got:?}, want {want:?}"
            );
        }
    }

    #[test]
    fn the_error_splits_into_key_and_reason() {
        let e = ScyllaConfig {
            nodes: vec!["x".into()],
            ..ScyllaConfig::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.full_key(), "store.scylla.nodes[0]");
        assert!(e.reason().starts_with("= \"x\" is not host:port"), "{e}");
    }

    #[test]
    fn simple_replication_literal() {
        assert_eq!(
            Replication::Simple(3).cql(),
            "{'class': 'SimpleStrategy', 'replication_factor': 3}"
        );
    }

    #[test]
    fn a_login_and_tls_are_read_and_the_password_never_shown() {
        let c = parse(
            r#"
            username = "hookline"
            password = "pw-supersecret-0123"
            [tls]
            ca_file = "/etc/hookline/cql-ca.pem"
            server_name = "scylla.internal"
            cert_file = "/etc/hookline/client.pem"
            key_file = "/etc/hookline/client.key"
            "#,
        )
        .unwrap();
        assert_eq!(c.username.as_deref(), Some("hookline"));
        assert_eq!(
            c.password.as_ref().map(CqlPassword::expose),
            Some("pw-supersecret-0123")
        );
        let tls = c.tls.as_ref().unwrap();
        assert_eq!(
            tls.ca_file.as_deref(),
            Some(std::path::Path::new("/etc/hookline/cql-ca.pem"))
        );
        assert_eq!(tls.server_name.as_deref(), Some("scylla.internal"));
        assert_eq!(
            (tls.cert_file.as_deref(), tls.key_file.as_deref()),
            (
                Some(std::path::Path::new("/etc/hookline/client.pem")),
                Some(std::path::Path::new("/etc/hookline/client.key"))
            )
        );
        let shown = format!("{c:?}");
        assert!(!shown.contains("pw-supersecret"), "{shown}");
        assert!(shown.contains("CqlPassword(<redacted>)"), "{shown}");
        // An empty [tls] table is TLS with the defaults, not plain TCP.
        assert_eq!(parse("[tls]").unwrap().tls, Some(CqlTls::default()));
        assert_eq!(parse("").unwrap().tls, None);
        let e = parse("[tls]\nca_files = \"x\"").unwrap_err();
        assert!(e.contains("ca_files"), "{e}");
    }
}
