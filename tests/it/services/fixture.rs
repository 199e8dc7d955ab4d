//! Where the real servers are and how tests reach them.
//!
//! A test that needs a server calls its `require_*` function first. A server that does not
//! answer fails the test at once with the command that starts it: these tests never pass, skip or
//! hang because a server is missing. Addresses can be moved with `HOOKLINE_TEST_*` variables (for
//! servers that `tests/services` did not start).

#![allow(dead_code)] // Each test module uses its own part of the fixtures.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use tokio::net::TcpStream;
use uuid::Uuid;

/// How long a reachability probe waits: the servers are local, so a slow answer means down.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

fn address(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

async fn require(server: &str, addr: &str) {
    let reachable = matches!(
        tokio::time::timeout(PROBE_TIMEOUT, TcpStream::connect(addr)).await,
        Ok(Ok(_))
    );
    assert!(
        reachable,
        "{server} is not reachable at {addr}: run `tests/services up` (see `tests/services status`)"
    );
}

/// Bootstrap servers of the Kafka broker, once it answers.
pub async fn require_kafka() -> String {
    let addr = address("HOOKLINE_TEST_KAFKA", "127.0.0.1:9092");
    require("Kafka", &addr).await;
    addr
}

/// The test broker's KRaft controller listener (`tests/services.d/kafka/server.properties`),
/// once it answers: an address clients must not be given, for testing what they say when they are.
pub async fn require_kafka_controller() -> String {
    let addr = address("HOOKLINE_TEST_KAFKA_CONTROLLER", "127.0.0.1:9093");
    require("Kafka's controller listener", &addr).await;
    addr
}

/// The test broker's OUTAGE listener (`tests/services.d/kafka/server.properties`), once it
/// answers: `(where it listens, where it tells clients to connect)`. The second address is free
/// for a test's proxy to the first; cutting that proxy takes the broker away from the clients
/// bootstrapped there, and from no one else.
pub async fn require_kafka_outage_listener() -> (String, String) {
    let listener = address("HOOKLINE_TEST_KAFKA_OUTAGE", "127.0.0.1:9094");
    require("Kafka's OUTAGE listener", &listener).await;
    (
        listener,
        address("HOOKLINE_TEST_KAFKA_OUTAGE_ADVERTISED", "127.0.0.1:9095"),
    )
}

/// Contact point of the CQL node (Cassandra here, ScyllaDB in production), once it answers.
pub async fn require_cql() -> String {
    let addr = address("HOOKLINE_TEST_CQL", "127.0.0.1:9042");
    require("Cassandra (CQL)", &addr).await;
    addr
}

/// The role tests log in to the CQL node as: `tests/services` runs Cassandra with logins
/// required (PasswordAuthenticator) and its default superuser, cassandra/cassandra.
/// `HOOKLINE_TEST_CQL_USER` and `HOOKLINE_TEST_CQL_PASSWORD` name another.
pub fn cql_login() -> (String, String) {
    (
        address("HOOKLINE_TEST_CQL_USER", "cassandra"),
        address("HOOKLINE_TEST_CQL_PASSWORD", "cassandra"),
    )
}

/// `ScyllaConfig` for `keyspace` on the test CQL node at `node`, logged in as [`cql_login`].
pub fn cql_store_config(node: &str, keyspace: &str) -> hookline::storage::scylla::ScyllaConfig {
    let (user, password) = cql_login();
    hookline::storage::scylla::ScyllaConfig {
        nodes: vec![node.to_owned()],
        keyspace: keyspace.to_owned(),
        username: Some(user),
        password: Some(hookline::storage::scylla::CqlPassword::new(password)),
        ..Default::default()
    }
}

/// The same login as `[store.scylla]` TOML lines, for tests that run the `hookline` binary.
pub fn cql_login_toml() -> String {
    let (user, password) = cql_login();
    format!("username = {user:?}\npassword = {password:?}")
}

/// The test CQL node's TLS files, made by `tests/services up` under its cache directory
/// (`HOOKLINE_TEST_CQL_TLS` names another directory).
pub struct CqlTlsFiles {
    /// The CA that signed the node's certificate and the client certificate.
    pub ca: std::path::PathBuf,
    /// A client certificate the node takes (it asks TLS clients for one).
    pub cert: std::path::PathBuf,
    /// That certificate's private key.
    pub key: std::path::PathBuf,
    /// A private key that belongs to another certificate (the node's).
    pub other_key: std::path::PathBuf,
    /// A self-signed client certificate the node does not take, and its key.
    pub stranger_cert: std::path::PathBuf,
    pub stranger_key: std::path::PathBuf,
}

/// [`CqlTlsFiles`], once they are there.
pub fn require_cql_tls() -> CqlTlsFiles {
    let dir = std::env::var_os("HOOKLINE_TEST_CQL_TLS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOOKLINE_SERVICES_HOME")
                .map(std::path::PathBuf::from)
                .unwrap_or_else(|| {
                    std::path::Path::new(&std::env::var_os("HOME").expect("HOME"))
                        .join(".cache/hookline/services")
                });
            home.join("cassandra/tls")
        });
    let files = CqlTlsFiles {
        ca: dir.join("ca.pem"),
        cert: dir.join("client.pem"),
        key: dir.join("client.key"),
        other_key: dir.join("node.key"),
        stranger_cert: dir.join("stranger.pem"),
        stranger_key: dir.join("stranger.key"),
    };
    for f in [
        &files.ca,
        &files.cert,
        &files.key,
        &files.other_key,
        &files.stranger_cert,
        &files.stranger_key,
    ] {
        assert!(
            f.is_file(),
            "no {} of the test CQL node: run `tests/services up`, which makes it (or set \
             HOOKLINE_TEST_CQL_TLS to a directory with ca.pem, client.pem, client.key, node.key, \
             stranger.pem, stranger.key)",
            f.display()
        );
    }
    files
}

/// tokio-postgres connection string of the `hookline` database, once PostgreSQL answers.
pub async fn require_postgres() -> String {
    let addr = address("HOOKLINE_TEST_POSTGRES", "127.0.0.1:5432");
    require("PostgreSQL", &addr).await;
    let (host, port) = addr
        .rsplit_once(':')
        .expect("HOOKLINE_TEST_POSTGRES is host:port");
    format!("host={host} port={port} user=postgres dbname=hookline connect_timeout=3")
}

/// REST address of the Kafka Connect worker that runs Debezium's outbox route, once it answers.
pub async fn require_connect() -> String {
    let addr = address("HOOKLINE_TEST_CONNECT", "127.0.0.1:8083");
    require("Kafka Connect (Debezium outbox route)", &addr).await;
    addr
}

/// A name no other test run uses, safe for topics, groups and CQL keyspaces.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", Uuid::new_v4().simple())
}

/// Client settings every test client shares: short timeouts, so that a broken server fails a
/// test in seconds, and no batching delay.
pub fn kafka_config(bootstrap: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("socket.timeout.ms", "10000")
        .set("message.timeout.ms", "15000")
        .set("linger.ms", "0");
    config
}

/// Creates topics the tests own; the broker refuses to auto-create them, as production does.
pub struct Topics {
    admin: AdminClient<DefaultClientContext>,
    names: Vec<String>,
}

impl Topics {
    /// Creates each named topic with `partitions` partitions and one replica.
    pub async fn create(bootstrap: &str, names: &[&str], partitions: i32) -> Topics {
        let admin: AdminClient<DefaultClientContext> = kafka_config(bootstrap)
            .create()
            .expect("Kafka admin client");
        let new: Vec<NewTopic<'_>> = names
            .iter()
            .map(|n| NewTopic::new(n, partitions, TopicReplication::Fixed(1)))
            .collect();
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        for result in admin
            .create_topics(&new, &opts)
            .await
            .expect("CreateTopics")
        {
            if let Err((topic, err)) = result {
                panic!("creating topic {topic}: {err}");
            }
        }
        Topics {
            admin,
            names: names.iter().map(|n| (*n).to_owned()).collect(),
        }
    }

    /// Takes charge of topics something else created (Debezium's outbox route), to delete them.
    pub fn adopt(bootstrap: &str, names: &[&str]) -> Topics {
        Topics {
            admin: kafka_config(bootstrap)
                .create()
                .expect("Kafka admin client"),
            names: names.iter().map(|n| (*n).to_owned()).collect(),
        }
    }

    /// Deletes the topics. Tests call it at their end; a failed test leaves its uniquely named
    /// topics behind, which harms no other run.
    pub async fn delete(self) {
        let names: Vec<&str> = self.names.iter().map(String::as_str).collect();
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        for result in self
            .admin
            .delete_topics(&names, &opts)
            .await
            .expect("DeleteTopics")
        {
            if let Err((topic, err)) = result {
                panic!("deleting topic {topic}: {err}");
            }
        }
    }
}

/// Sets `topic`'s `max.message.bytes` on the real broker at `bootstrap`: from then on it refuses
/// every batch larger than `bytes` (MESSAGE_TOO_LARGE) while the rest of the cluster, offset
/// commits included, works on. `AlterConfigs` replaces the topic's dynamic settings, which
/// hookline gives only its compacted endpoints topic: use it on the others.
pub async fn limit_record_size(bootstrap: &str, topic: &str, bytes: u32) {
    let admin: AdminClient<DefaultClientContext> = kafka_config(bootstrap)
        .create()
        .expect("Kafka admin client");
    let bytes = bytes.to_string();
    let change = AlterConfig::new(ResourceSpecifier::Topic(topic)).set("max.message.bytes", &bytes);
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin
        .alter_configs([&change], &opts)
        .await
        .expect("AlterConfigs")
    {
        if let Err((resource, err)) = result {
            panic!("setting max.message.bytes={bytes} on {resource:?}: {err}");
        }
    }
}
