//! Kafka clients as hookline uses them: how producers and consumers are configured, how topics
//! come to exist, and the embedded cluster `hookline dev` runs on.
//!
//! Every stage consumes with `enable.auto.offset.store=false`: offsets are stored only for
//! settled records (through the stage's offset tracker) and librdkafka commits what was stored,
//! including on rebalance. Producers are idempotent with `acks=all`, so a record the stage
//! counts as acknowledged is durable.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{
    AdminClient, AdminOptions, NewTopic, OwnedResourceSpecifier, ResourceSpecifier,
    TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::mocking::MockCluster;
use serde::{Deserialize, Deserializer};

/// A topic hookline needs, with how it is laid out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSpec {
    /// Topic name.
    pub name: String,
    /// Partition count.
    pub partitions: i32,
    /// Compacted (the endpoints topic) instead of deleted by time.
    pub compacted: bool,
}

/// Kafka failures at the edges hookline controls.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// A client could not be created from the configuration.
    #[error("kafka client configuration rejected: {0}")]
    Client(#[source] rdkafka::error::KafkaError),
    /// Creating a topic failed.
    #[error("creating {topic} failed: {detail}")]
    CreateTopic {
        /// The topic.
        topic: String,
        /// What the broker said.
        detail: String,
    },
    /// No broker of `bootstrap.servers` answered a metadata request within [`PROBE_TIMEOUT`].
    #[error(
        "no Kafka broker at {bootstrap} answered within {} s; {UNREACHABLE_ADVICE}",
        PROBE_TIMEOUT.as_secs()
    )]
    Unreachable {
        /// The configured bootstrap servers.
        bootstrap: String,
    },
    /// Something answered at `bootstrap.servers`, but not as a broker's client listener.
    #[error("{}", not_a_broker_listener(bootstrap))]
    NotABrokerListener {
        /// The configured bootstrap servers.
        bootstrap: String,
    },
    /// A topic refuses records as large as hookline's producers may write.
    #[error(
        "topic {topic} takes records of at most {topic_limit} bytes (its max.message.bytes), \
         but hookline's producers may write {record_limit} (kafka.client \"message.max.bytes\", \
         or librdkafka's default): a larger record would be refused by the broker and retried \
         for ever, holding up its partition. Raise the topic's max.message.bytes to at least \
         {record_limit} (kafka-configs.sh --alter --entity-type topics --entity-name {topic} \
         --add-config max.message.bytes={record_limit}), or lower kafka.client \
         \"message.max.bytes\" to {topic_limit}"
    )]
    RecordLimit {
        /// The topic.
        topic: String,
        /// Its `max.message.bytes`.
        topic_limit: u64,
        /// The largest record hookline's producers send.
        record_limit: u64,
    },
    /// The embedded mock cluster could not start.
    #[error("embedded kafka (librdkafka mock cluster) failed to start: {0}")]
    Embedded(String),
}

/// What to check when no broker answers, in the words every command uses (`run`, `replay`).
pub const UNREACHABLE_ADVICE: &str = "check kafka.bootstrap_servers, that the brokers are up and \
     reachable from here, and the [kafka.client] security settings";

/// Base client configuration: bootstrap servers plus operator overrides (which win).
pub fn client_config(bootstrap: &str, overrides: &BTreeMap<String, String>) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", bootstrap);
    for (k, v) in overrides {
        cfg.set(k, v);
    }
    cfg
}

/// Producer settings: idempotent, `acks=all`, short linger (hookline's records are small and
/// latency matters more than batch size; librdkafka still batches under load).
pub fn producer_config(bootstrap: &str, overrides: &BTreeMap<String, String>) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "1")
        .set("compression.type", "none")
        .set("message.timeout.ms", "30000")
        .set("queue.buffering.max.messages", "200000");
    for (k, v) in overrides {
        cfg.set(k, v);
    }
    cfg
}

/// librdkafka properties that only producers read. `kafka.client` applies to every client;
/// these are left out of consumers, which would otherwise log a warning for each.
pub const PRODUCER_ONLY: &[&str] = &[
    "linger.ms",
    "queue.buffering.max.ms",
    "queue.buffering.max.messages",
    "queue.buffering.max.kbytes",
    "batch.num.messages",
    "batch.size",
    "acks",
    "request.required.acks",
    "compression.type",
    "compression.codec",
    "enable.idempotence",
    "message.timeout.ms",
    "delivery.timeout.ms",
];

/// Consumer settings for a stage's group: offsets stored by hand for settled records only,
/// committed by librdkafka in the background and on rebalance. Fetches batch as
/// [`HOT_FETCH`] says.
pub fn consumer_config(
    bootstrap: &str,
    group: &str,
    overrides: &BTreeMap<String, String>,
) -> ClientConfig {
    stage_consumer_config(bootstrap, group, HOT_FETCH, overrides)
}

/// [`consumer_config`] with fetches answered as `fetch` says; `overrides` (`kafka.client`)
/// still win, `fetch.wait.max.ms` and `fetch.min.bytes` included.
pub fn stage_consumer_config(
    bootstrap: &str,
    group: &str,
    fetch: FetchBatching,
    overrides: &BTreeMap<String, String>,
) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "1000")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("session.timeout.ms", "10000")
        .set("heartbeat.interval.ms", "1000")
        .set("fetch.wait.max.ms", fetch.max_wait_ms.to_string())
        .set("fetch.min.bytes", fetch.min_bytes.to_string())
        // A stage pauses a partition whose window is full, and librdkafka drops that
        // partition's prefetched records on pause (they are fetched again on resume). With its
        // defaults (up to 100,000 records or 64 MiB prefetched) a backlog makes the delivery
        // stage fetch every record many times over. A small prefetch keeps the waste to a
        // fraction of the window; the short queue backoff fetches again as soon as the stage
        // has taken records (the default waits a second). librdkafka counts this against the
        // queue a partition's records go to: in the delivery stage each partition has its own
        // (see `intake`), so each prefetches up to 100 records plus one fetch (128 KiB); in
        // the other stages all partitions share the consumer's queue and its 100.
        .set("queued.min.messages", "100")
        .set("max.partition.fetch.bytes", "131072")
        .set("fetch.queue.backoff.ms", "5")
        .set("isolation.level", "read_committed")
        .set("statistics.interval.ms", "5000");
    for (k, v) in overrides
        .iter()
        .filter(|(k, _)| !PRODUCER_ONLY.contains(&k.as_str()))
    {
        cfg.set(k, v);
    }
    cfg
}

/// When the broker answers a stage's fetch: once `min_bytes` of records are there, or after
/// `max_wait_ms` (librdkafka's `fetch.min.bytes` and `fetch.wait.max.ms`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FetchBatching {
    pub max_wait_ms: u32,
    pub min_bytes: u32,
}

/// The fan-out and delivery stages' fetches: answered at 64 KiB or after 10 ms.
///
/// The broker's cost follows its request count more than its records: every fetch, even an
/// idle one, costs it CPU. With `fetch.min.bytes` 1 a fetch returns as soon as one record
/// arrives, so at a steady rate every few records cost a request; batching cuts the fetches
/// several times over. A stage sends at most 100 fetches/s until its records fill 64 KiB in
/// less than 10 ms, and then carries at least 64 KiB in each. A record that arrives alone waits
/// at most 10 ms per stage for its fetch (5 ms on average).
pub const HOT_FETCH: FetchBatching = FetchBatching {
    max_wait_ms: 10,
    min_bytes: 64 * 1024,
};

/// The delay stage's fetches: any record answers at once, and an idle fetch waits 500 ms.
///
/// Every fetch names all of a consumer's partitions and the broker reads each (librdkafka
/// sends no incremental fetch sessions), so an idle consumer costs the broker its partition
/// count times its fetch rate. The delay stage holds the most partitions (every tier topic) and
/// is idle most of the time. A record produced to a tier answers a waiting fetch at once, and
/// the stage resumes a partition it paused well before its records are due (see
/// [`RESUME_AHEAD`](crate::delay_tier::RESUME_AHEAD)), so the wait delays no retry.
pub const DELAY_FETCH: FetchBatching = FetchBatching {
    max_wait_ms: 500,
    min_bytes: 1,
};

/// Creates every topic in `specs` that does not exist yet (real clusters; auto-create is off
/// in production and must not be relied on).
pub async fn ensure_topics(
    bootstrap: &str,
    overrides: &BTreeMap<String, String>,
    specs: &[TopicSpec],
    replication: i32,
    record_limit: u64,
) -> Result<(), KafkaError> {
    let admin: AdminClient<DefaultClientContext> = client_config(bootstrap, overrides)
        .create()
        .map_err(KafkaError::Client)?;
    let limit = record_limit.to_string();
    let topics: Vec<NewTopic<'_>> = specs
        .iter()
        .map(|s| {
            let t = NewTopic::new(&s.name, s.partitions, TopicReplication::Fixed(replication))
                .set("max.message.bytes", &limit);
            if s.compacted {
                t.set("cleanup.policy", "compact")
            } else {
                t
            }
        })
        .collect();
    tracing::info!(bootstrap, "connecting to kafka");
    probe_cluster(&admin, bootstrap)?;
    tracing::info!(bootstrap, topics = specs.len(), "creating missing topics");
    // Without a request timeout an unreachable cluster makes this wait forever, silently.
    let opts = AdminOptions::new()
        .operation_timeout(Some(Duration::from_secs(30)))
        .request_timeout(Some(Duration::from_secs(30)));
    let results = admin
        .create_topics(topics.iter(), &opts)
        .await
        .map_err(|e| KafkaError::CreateTopic {
            topic: format!("{} topics", specs.len()),
            detail: format!("{e} (is Kafka reachable at {bootstrap}?)"),
        })?;
    for r in results {
        match r {
            Ok(_) => {}
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => {
                return Err(KafkaError::CreateTopic {
                    topic: format!("topic {topic}"),
                    detail: code.to_string(),
                });
            }
        }
    }
    wait_for_leaders(&admin, specs).await?;
    check_record_limits(&admin, specs, record_limit).await
}

/// Fails when a topic (one created before, by hand or by an older hookline) takes smaller
/// records than hookline's producers may write. librdkafka checks only its own
/// `message.max.bytes`; a record between the two limits would pass it, be refused by the broker
/// and be retried for ever, and nothing behind it in its partition would be committed. A
/// cluster that does not describe topic configs (no DescribeConfigs permission, or the embedded
/// mock cluster) is not checked; that is logged.
async fn check_record_limits(
    admin: &AdminClient<DefaultClientContext>,
    specs: &[TopicSpec],
    record_limit: u64,
) -> Result<(), KafkaError> {
    let resources: Vec<ResourceSpecifier<'_>> = specs
        .iter()
        .map(|s| ResourceSpecifier::Topic(&s.name))
        .collect();
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let described = match admin.describe_configs(resources.iter(), &opts).await {
        Ok(d) => d,
        Err(error) => {
            tracing::warn!(%error, "could not read the topics' max.message.bytes; not checked");
            return Ok(());
        }
    };
    for result in described {
        let resource = match result {
            Ok(r) => r,
            Err(code) => {
                tracing::warn!(error = %code, "could not read a topic's max.message.bytes; not checked");
                continue;
            }
        };
        let OwnedResourceSpecifier::Topic(topic) = &resource.specifier else {
            continue;
        };
        let topic_limit = resource
            .get("max.message.bytes")
            .and_then(|e| e.value.as_deref())
            .and_then(|v| v.parse::<u64>().ok());
        match topic_limit {
            Some(topic_limit) if topic_limit < record_limit => {
                return Err(KafkaError::RecordLimit {
                    topic: topic.clone(),
                    topic_limit,
                    record_limit,
                });
            }
            Some(_) => {}
            None => {
                tracing::warn!(topic = %topic, "topic has no readable max.message.bytes; not checked")
            }
        }
    }
    Ok(())
}

/// The error for an address that answered, but refused a metadata request as unsupported: what
/// a KRaft controller listener does when it is given to a client as a bootstrap server.
pub fn not_a_broker_listener(bootstrap: &str) -> String {
    format!(
        "{bootstrap} answered, but not as a Kafka broker's client listener (it refused a metadata \
         request as unsupported; a KRaft controller listener does): kafka.bootstrap_servers \
         must name the brokers' client listeners"
    )
}

/// Whether a produce failed with an error that trying again meets the same way: the record is
/// larger than the topic or the client takes, or malformed, or the topic refuses this client
/// or this record by policy. Other failures (a broker away, a leader moving, a timeout) pass.
pub fn refused_for_good(e: &rdkafka::error::KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::MessageBatchTooLarge
                | RDKafkaErrorCode::InvalidMessage
                | RDKafkaErrorCode::InvalidRecord
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::PolicyViolation
        )
    )
}

/// Whether librdkafka's `e` says the address answered but is no broker's client listener.
pub fn is_not_a_broker_listener(e: &rdkafka::error::KafkaError) -> bool {
    e.rdkafka_error_code() == Some(RDKafkaErrorCode::UnsupportedFeature)
}

/// How long start-up waits for any broker to answer before it gives up with
/// [`KafkaError::Unreachable`]. A reachable cluster answers in well under a second; waiting
/// out the topic creation's own 30 s timeout only delayed the same failure.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Asks the cluster for its id (a metadata request that names no topic, so nothing is
/// auto-created and the answer stays small on a large cluster).
fn probe_cluster(
    admin: &AdminClient<DefaultClientContext>,
    bootstrap: &str,
) -> Result<(), KafkaError> {
    let client = admin.inner();
    tokio::task::block_in_place(|| {
        if let Some(id) = client.fetch_cluster_id(PROBE_TIMEOUT) {
            tracing::debug!(bootstrap, cluster_id = %id, "kafka answered");
            return Ok(());
        }
        // No id: ask for the full metadata once, only to learn why (a controller listener
        // refuses it at once); an answer now means the cluster was slow, and start-up goes on.
        match client.fetch_metadata(None, Duration::from_secs(2)) {
            Ok(_) => Ok(()),
            Err(e) if is_not_a_broker_listener(&e) => Err(KafkaError::NotABrokerListener {
                bootstrap: bootstrap.to_owned(),
            }),
            Err(_) => Err(KafkaError::Unreachable {
                bootstrap: bootstrap.to_owned(),
            }),
        }
    })
}

/// Waits until every partition of `specs` has a leader: a freshly created topic answers "not
/// leader" for a moment, and stages that start earlier fail their first fetch.
async fn wait_for_leaders(
    admin: &AdminClient<DefaultClientContext>,
    specs: &[TopicSpec],
) -> Result<(), KafkaError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    for spec in specs {
        loop {
            let ready = tokio::task::block_in_place(|| {
                admin
                    .inner()
                    .fetch_metadata(Some(&spec.name), Duration::from_secs(5))
            })
            .ok()
            .and_then(|md| {
                md.topics().first().map(|t| {
                    t.error().is_none()
                        && t.partitions().len() == spec.partitions as usize
                        && t.partitions()
                            .iter()
                            .all(|p| p.leader() >= 0 && p.error().is_none())
                })
            })
            .unwrap_or(false);
            if ready {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                return Err(KafkaError::CreateTopic {
                    topic: format!("topic {}", spec.name),
                    detail: "created, but its partitions have no leader after 30 s".into(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// librdkafka's in-process mock cluster, for `hookline dev` and tests that need no broker.
///
/// The mock cluster is not `Send`, so it lives on a thread of its own until this handle is
/// dropped. It has no CreateTopics API: topics are created here, up front.
pub struct EmbeddedKafka {
    bootstrap: String,
    stop: Option<mpsc::Sender<Command>>,
    thread: Option<thread::JoinHandle<()>>,
}

enum Command {
    CreateTopic(TopicSpec, mpsc::Sender<Result<(), String>>),
}

impl EmbeddedKafka {
    /// Starts a one-broker mock cluster with `topics` created.
    pub fn start(topics: &[TopicSpec]) -> Result<EmbeddedKafka, KafkaError> {
        let (ready_tx, ready_rx) = mpsc::channel::<Result<String, String>>();
        let (cmd_tx, cmd_rx) = mpsc::channel::<Command>();
        let topics = topics.to_vec();
        let thread = thread::Builder::new()
            .name("embedded-kafka".into())
            .spawn(move || {
                let cluster = match MockCluster::new(1) {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                for t in &topics {
                    if let Err(e) = cluster.create_topic(&t.name, t.partitions, 1) {
                        let _ = ready_tx.send(Err(format!("topic {}: {e}", t.name)));
                        return;
                    }
                }
                let _ = ready_tx.send(Ok(cluster.bootstrap_servers()));
                // Serve topic creation until the handle is dropped (the channel closes).
                while let Ok(Command::CreateTopic(t, reply)) = cmd_rx.recv() {
                    let r = cluster
                        .create_topic(&t.name, t.partitions, 1)
                        .map_err(|e| e.to_string());
                    let _ = reply.send(r);
                }
            })
            .map_err(|e| KafkaError::Embedded(e.to_string()))?;
        let bootstrap = ready_rx
            .recv()
            .map_err(|_| KafkaError::Embedded("mock cluster thread exited".into()))?
            .map_err(KafkaError::Embedded)?;
        Ok(EmbeddedKafka {
            bootstrap,
            stop: Some(cmd_tx),
            thread: Some(thread),
        })
    }

    /// The bootstrap servers clients connect to.
    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap
    }

    /// Creates one more topic on the running mock cluster.
    pub fn create_topic(&self, spec: &TopicSpec) -> Result<(), KafkaError> {
        let (tx, rx) = mpsc::channel();
        let send = self
            .stop
            .as_ref()
            .expect("command channel lives as long as the handle")
            .send(Command::CreateTopic(spec.clone(), tx));
        send.map_err(|_| KafkaError::Embedded("mock cluster thread exited".into()))?;
        rx.recv()
            .map_err(|_| KafkaError::Embedded("mock cluster thread exited".into()))?
            .map_err(|detail| KafkaError::CreateTopic {
                topic: format!("topic {}", spec.name),
                detail,
            })
    }
}

impl Drop for EmbeddedKafka {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// rdkafka properties by name (`[kafka.client]`). `Debug` shows the values of secret ones
/// ([`is_secret_client_property`]) as `<redacted>`, so a config, or anything holding these,
/// can be logged whole.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ClientProperties(BTreeMap<String, String>);

impl std::ops::Deref for ClientProperties {
    type Target = BTreeMap<String, String>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for ClientProperties {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl From<BTreeMap<String, String>> for ClientProperties {
    fn from(map: BTreeMap<String, String>) -> Self {
        ClientProperties(map)
    }
}

impl<'a> IntoIterator for &'a ClientProperties {
    type Item = (&'a String, &'a String);
    type IntoIter = std::collections::btree_map::Iter<'a, String, String>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<'de> Deserialize<'de> for ClientProperties {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        crate::serde_field::string_map(d).map(ClientProperties)
    }
}

impl fmt::Debug for ClientProperties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, v)| {
                let shown = if is_secret_client_property(k) {
                    "<redacted>"
                } else {
                    v.as_str()
                };
                (k, shown)
            }))
            .finish()
    }
}

/// Whether an rdkafka property carries a secret (`sasl.password`, `ssl.key.password`,
/// `ssl.key.pem`, `sasl.oauthbearer.client.secret`, ...); its value is never shown.
pub fn is_secret_client_property(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    [
        "password",
        "secret",
        "passphrase",
        "key.pem",
        "private.key",
        "jaas.config",
    ]
    .iter()
    .any(|s| n.contains(s))
        || n == "sasl.oauthbearer.config"
}

/// One client's reports of a lost broker, so that an outage is logged once when it starts and
/// then at most every [`LOG_REPEAT`](crate::repeat_log::LOG_REPEAT) with a count of the reports held back, instead of
/// every few seconds by every client. Other errors are never held back.
#[derive(Debug, Default)]
pub struct OutageLog(crate::repeat_log::RepeatLog);

impl OutageLog {
    /// `None` when this report is held back, else how many were held back before it.
    pub fn admit(&self, now: std::time::Instant) -> Option<u64> {
        self.0.admit("brokers lost", now)
    }
}

/// The context of hookline's producers, in place of rdkafka's default: librdkafka's errors are
/// logged at error as `kafka producer error`, a lost broker as [`OutageLog`] allows.
#[derive(Debug, Default)]
pub struct ProducerLog {
    outage: OutageLog,
}

impl rdkafka::ClientContext for ProducerLog {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        if !crate::kafka_error::is_broker_outage(&error) {
            tracing::error!(error = %error, reason, "kafka producer error");
        } else if let Some(held_back) = self.outage.admit(std::time::Instant::now()) {
            tracing::error!(error = %error, reason, held_back, "kafka producer error");
        }
    }
}

/// For a [`BaseProducer`](rdkafka::producer::BaseProducer) that produces nothing (the
/// readiness probe, which only asks for metadata).
impl rdkafka::producer::ProducerContext for ProducerLog {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, (): ()) {}
}

/// A producer of hookline's (see [`ProducerLog`]).
pub type Producer = rdkafka::producer::FutureProducer<ProducerLog>;

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::Message;
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::producer::FutureRecord;

    /// A record too large or malformed, or a topic that refuses this client, is refused for
    /// good; a broker away or slow is not.
    #[test]
    fn only_refusals_that_repeat_are_for_good() {
        use rdkafka::error::KafkaError;
        let produce = |code| KafkaError::MessageProduction(code);
        for code in [
            RDKafkaErrorCode::MessageSizeTooLarge,
            RDKafkaErrorCode::InvalidRecord,
            RDKafkaErrorCode::TopicAuthorizationFailed,
        ] {
            assert!(refused_for_good(&produce(code)), "{code:?}");
        }
        for code in [
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::AllBrokersDown,
            RDKafkaErrorCode::NotLeaderForPartition,
            RDKafkaErrorCode::QueueFull,
        ] {
            assert!(!refused_for_good(&produce(code)), "{code:?}");
        }
    }

    #[test]
    fn hot_stages_batch_their_fetches_and_the_delay_stage_answers_at_once() {
        let none = BTreeMap::new();
        let fetch = |c: &ClientConfig| {
            (
                c.get("fetch.wait.max.ms").map(str::to_owned),
                c.get("fetch.min.bytes").map(str::to_owned),
            )
        };
        let some = |wait: &str, min: &str| (Some(wait.to_owned()), Some(min.to_owned()));
        let delay = |o| stage_consumer_config("b:9092", "g", DELAY_FETCH, o);
        assert_eq!(
            fetch(&consumer_config("b:9092", "g", &none)),
            some("10", "65536")
        );
        assert_eq!(fetch(&delay(&none)), some("500", "1"));
        // Everything else is the other stages' consumer set-up.
        let (delay_cfg, other) = (delay(&none), consumer_config("b:9092", "g", &none));
        for key in [
            "group.id",
            "enable.auto.offset.store",
            "queued.min.messages",
        ] {
            assert_eq!(delay_cfg.get(key), other.get(key), "{key}");
        }
        // `kafka.client` wins over both.
        let set = BTreeMap::from([
            ("fetch.wait.max.ms".to_owned(), "50".to_owned()),
            ("fetch.min.bytes".to_owned(), "1".to_owned()),
        ]);
        assert_eq!(fetch(&delay(&set)), some("50", "1"));
        assert_eq!(
            fetch(&consumer_config("b:9092", "g", &set)),
            some("50", "1")
        );
    }

    #[tokio::test]
    async fn embedded_cluster_round_trips_a_record() {
        let kafka = EmbeddedKafka::start(&[TopicSpec {
            name: "t".into(),
            partitions: 2,
            compacted: false,
        }])
        .unwrap();
        kafka
            .create_topic(&TopicSpec {
                name: "t2".into(),
                partitions: 1,
                compacted: false,
            })
            .unwrap();
        let none = BTreeMap::new();
        let producer: Producer = producer_config(kafka.bootstrap_servers(), &none)
            .create_with_context(ProducerLog::default())
            .unwrap();
        producer
            .send(
                FutureRecord::to("t2").key("k").payload("v"),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        let consumer: StreamConsumer = consumer_config(kafka.bootstrap_servers(), "g", &none)
            .create()
            .unwrap();
        consumer.subscribe(&["t2"]).unwrap();
        let msg = tokio::time::timeout(Duration::from_secs(20), consumer.recv())
            .await
            .expect("a record within 20 s")
            .unwrap();
        assert_eq!(msg.payload(), Some(&b"v"[..]));
    }

    #[test]
    fn an_outage_is_logged_once_then_every_repeat_interval_with_what_was_held_back() {
        use crate::repeat_log::LOG_REPEAT;
        let log = OutageLog::default();
        let t0 = std::time::Instant::now();
        assert_eq!(log.admit(t0), Some(0));
        for s in 1..30 {
            assert_eq!(log.admit(t0 + Duration::from_secs(s)), None, "at {s} s");
        }
        assert_eq!(log.admit(t0 + LOG_REPEAT), Some(29));
        assert_eq!(log.admit(t0 + LOG_REPEAT + Duration::from_secs(1)), None);
        assert_eq!(log.admit(t0 + LOG_REPEAT * 3), Some(1));
    }
}
