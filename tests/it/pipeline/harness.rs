//! A whole hookline (every stage) on the embedded mock cluster or on the real Kafka from
//! `tests/services`, with helpers to create endpoints, post events and read hookline's topics.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hookline::config::{Config, StoreKind, TopicsConfig};
use hookline::endpoint::{CreateEndpoint, Endpoint};
use hookline::id::{EndpointId, Tenant};
use hookline::kafka::{EmbeddedKafka, consumer_config, producer_config};
use hookline::record::DeliveryRecord;
use hookline::service::{self, Handles, Role};
use hookline::signing::{SigningSecret, Verifier};
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::support::receiver::RecordedRequest;

/// Which Kafka the pipeline runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum On {
    /// librdkafka's mock cluster, in process.
    Mock,
    /// The real broker `tests/services up` starts on 127.0.0.1:9092.
    Real,
}

/// A running pipeline.
pub struct Pipeline {
    pub config: Config,
    pub handles: Handles,
    role: Role,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    _kafka: Option<Arc<EmbeddedKafka>>,
    kafka: Option<Arc<EmbeddedKafka>>,
    split: Option<Arc<SplitMock>>,
}

/// A two-broker mock cluster on its own thread (the mock is not `Send`): broker 2 leads the
/// endpoints topic, broker 1 every other topic and every consumer group, and broker 2 can be
/// slowed so that the endpoint view falls behind the rest of the pipeline.
pub struct SplitMock {
    bootstrap: String,
    rtt: std::sync::Mutex<std::sync::mpsc::Sender<Duration>>,
}

impl SplitMock {
    fn start(config: &Config) -> SplitMock {
        use rdkafka::mocking::{MockCluster, MockCoordinator};
        let specs = service::topic_specs(config);
        let endpoints = config.kafka.topics.endpoints.clone();
        let groups: Vec<String> = ["fanout", "deliver", "delay"]
            .iter()
            .map(|s| config.kafka.group(s))
            .collect();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (rtt_tx, rtt_rx) = std::sync::mpsc::channel::<Duration>();
        std::thread::spawn(move || {
            let cluster = MockCluster::new(2).expect("two-broker mock cluster");
            for t in &specs {
                cluster
                    .create_topic(&t.name, t.partitions, 1)
                    .expect("mock topic");
                let leader = if t.name == endpoints { 2 } else { 1 };
                for p in 0..t.partitions {
                    cluster
                        .partition_leader(&t.name, p, Some(leader))
                        .expect("partition leader");
                }
            }
            for g in groups {
                cluster
                    .coordinator(MockCoordinator::Group(g), 1)
                    .expect("group coordinator");
            }
            ready_tx.send(cluster.bootstrap_servers()).unwrap();
            // Until the handle is dropped (the channel closes).
            while let Ok(rtt) = rtt_rx.recv() {
                cluster
                    .broker_round_trip_time(2, rtt)
                    .expect("broker round trip");
            }
        });
        SplitMock {
            bootstrap: ready_rx.recv().expect("mock cluster started"),
            rtt: std::sync::Mutex::new(rtt_tx),
        }
    }

    /// Delays every answer of the broker that leads the endpoints topic by `rtt`.
    pub fn slow_endpoints_broker(&self, rtt: Duration) {
        self.rtt
            .lock()
            .unwrap()
            .send(rtt)
            .expect("mock cluster thread");
    }
}

/// A test config: short retries, small partitions, loopback receivers allowed; on real Kafka,
/// topics and groups unique to this test.
pub fn test_config(on: On) -> Config {
    let mut c = Config::dev_defaults();
    c.store.kind = StoreKind::Memory;
    c.kafka.partitions = 3;
    c.retry.base = Duration::from_millis(100);
    c.retry.multiplier = 2.0;
    c.retry.cap = Duration::from_millis(400);
    c.retry.window = Duration::from_secs(3);
    c.retry.tiers = vec![Duration::from_secs(1), Duration::from_secs(5)];
    c.http.total_timeout = Duration::from_secs(2);
    c.http.connect_timeout = Duration::from_secs(1);
    c.delivery.breaker_failure_threshold = 1_000;
    if on == On::Real {
        let run = uuid::Uuid::new_v4().simple().to_string();
        c.kafka.topics = TopicsConfig::prefixed(&format!("it.{run}"));
        c.kafka.group_prefix = format!("it-{run}");
        c.kafka.input_pattern = None;
        c.kafka.client.insert("linger.ms".into(), "1".into());
    }
    c
}

impl Pipeline {
    /// Starts every stage of `config` on `on`.
    pub async fn start(on: On, config: Config) -> Pipeline {
        Self::start_as(on, config, Role::All).await
    }

    /// Starts the stages of `role` of `config` on `on`.
    pub async fn start_as(on: On, config: Config, role: Role) -> Pipeline {
        let mut config = config;
        let kafka = match on {
            On::Mock => {
                let k = EmbeddedKafka::start(&service::topic_specs(&config)).expect("mock cluster");
                config.kafka.bootstrap_servers = k.bootstrap_servers().to_owned();
                Some(Arc::new(k))
            }
            On::Real => {
                config.kafka.bootstrap_servers = crate::services::fixture::require_kafka().await;
                service::prepare_topics(&config)
                    .await
                    .expect("create the test's topics");
                None
            }
        };
        Self::start_on(config, kafka, role).await
    }

    /// Starts every stage of `config` on a [`SplitMock`]; returns the pipeline and the cluster.
    pub async fn start_split(config: Config) -> (Pipeline, Arc<SplitMock>) {
        let mut config = config;
        let split = Arc::new(SplitMock::start(&config));
        config.kafka.bootstrap_servers = split.bootstrap.clone();
        let mut p = Self::start_on(config, None, Role::All).await;
        p.split = Some(split.clone());
        (p, split)
    }

    async fn start_on(config: Config, kafka: Option<Arc<EmbeddedKafka>>, role: Role) -> Pipeline {
        if let Ok(filter) = std::env::var("HOOKLINE_TEST_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_test_writer()
                .try_init();
        }
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let handles = service::start(&config, role, &shutdown, &tasks)
            .await
            .expect("start the pipeline");
        Pipeline {
            config,
            handles,
            role,
            shutdown,
            tasks,
            _kafka: kafka.clone(),
            kafka,
            split: None,
        }
    }

    /// Stops every stage (as SIGTERM would), waits until they have drained and, on real Kafka,
    /// deletes the test's topics: thousands of leftover partitions slow the shared broker down
    /// for every later run.
    pub async fn stop(self) {
        let on_mock = self.split.is_some();
        let (config, kafka) = self.halt().await;
        if kafka.is_none() && !on_mock {
            delete_topics(&config).await;
        }
    }

    /// Stops every stage (as SIGTERM would) and waits until they have drained.
    async fn halt(self) -> (Config, Option<Arc<EmbeddedKafka>>) {
        self.shutdown.cancel();
        self.tasks.close();
        // In-flight attempts may use their whole timeout before the stages let go.
        let deadline = self.config.http.total_timeout + Duration::from_secs(20);
        tokio::time::timeout(deadline, self.tasks.wait())
            .await
            .expect("stages drain within the attempt timeout");
        (self.config, self.kafka)
    }

    /// Stops, then starts again on the same Kafka with the same store contents lost (a new
    /// process); returns the new pipeline.
    pub async fn restart(self) -> Pipeline {
        let role = self.role;
        let (config, kafka) = self.halt().await;
        Self::start_on(config, kafka, role).await
    }

    /// Creates an endpoint; returns its id and its `whsec_` secret.
    pub async fn endpoint(&self, tenant: &str, url: &str, types: &[&str]) -> (EndpointId, String) {
        self.endpoint_limited(tenant, url, types, None).await
    }

    /// [`Pipeline::endpoint`] with a rate limit (requests per second).
    pub async fn endpoint_limited(
        &self,
        tenant: &str,
        url: &str,
        types: &[&str],
        rate_limit_per_s: Option<f64>,
    ) -> (EndpointId, String) {
        let secret = SigningSecret::generate();
        let whsec = secret.expose_whsec().to_string();
        let endpoint = Endpoint::create(
            CreateEndpoint {
                tenant: Tenant::parse(tenant).unwrap(),
                url: url.to_owned(),
                event_types: types.iter().map(|s| s.to_string()).collect(),
                max_in_flight: None,
                rate_limit_per_s,
                secret: Some(whsec.clone()),
            },
            SystemTime::now(),
        )
        .expect("valid endpoint");
        let stored = self
            .handles
            .endpoints
            .put(&endpoint)
            .await
            .expect("endpoint written");
        (stored.id.clone(), whsec)
    }

    /// A producer to this pipeline's Kafka.
    pub fn producer(&self) -> FutureProducer {
        producer_config(
            &self.config.kafka.bootstrap_servers,
            &self.config.kafka.client,
        )
        .create()
        .expect("producer")
    }

    /// Posts native events (as `POST /v1/events` would) and waits for the broker's ack.
    pub async fn post(&self, events: &[(&str, &str, &str, serde_json::Value)]) {
        let producer = self.producer();
        for (id, tenant, kind, payload) in events {
            let body =
                serde_json::json!({"id": id, "tenant": tenant, "type": kind, "payload": payload});
            let body = body.to_string();
            producer
                .send(
                    FutureRecord::to(&self.config.kafka.topics.events)
                        .key(*id)
                        .payload(&body),
                    Duration::from_secs(10),
                )
                .await
                .expect("event produced");
        }
    }

    /// Produces raw bytes to the events topic (for malformed-input tests).
    pub async fn post_raw(&self, key: &str, value: &[u8]) {
        self.produce_raw(&self.config.kafka.topics.events, key, value)
            .await;
    }

    /// Produces a record with `headers` and `value` to the events topic, as Debezium's Outbox
    /// Event Router writes one to an input topic.
    pub async fn post_with_headers(&self, key: &str, headers: &[(&str, &str)], value: &[u8]) {
        let mut owned = rdkafka::message::OwnedHeaders::new();
        for (name, v) in headers {
            owned = owned.insert(rdkafka::message::Header {
                key: name,
                value: Some(*v),
            });
        }
        self.producer()
            .send(
                FutureRecord::to(&self.config.kafka.topics.events)
                    .key(key)
                    .headers(owned)
                    .payload(value),
                Duration::from_secs(10),
            )
            .await
            .expect("record produced");
    }

    /// Produces raw bytes to the events topic through a producer with librdkafka's own record
    /// limit, whatever `kafka.client` sets for hookline: input topics may hold records larger
    /// than hookline's producers write. On the real broker the events topic first takes the
    /// broker's default record size, as an input topic created by someone else would (hookline
    /// creates its own topics with its producers' limit).
    pub async fn post_raw_large(&self, key: &str, value: &[u8]) {
        if self.kafka.is_none() && self.split.is_none() {
            self.limit_record_size(&self.config.kafka.topics.events, 1_048_588)
                .await;
        }
        let mut client = self.config.kafka.client.clone();
        client.remove("message.max.bytes");
        let producer: FutureProducer =
            producer_config(&self.config.kafka.bootstrap_servers, &client)
                .create()
                .expect("producer");
        producer
            .send(
                FutureRecord::to(&self.config.kafka.topics.events)
                    .key(key)
                    .payload(value),
                Duration::from_secs(10),
            )
            .await
            .expect("large record produced");
    }

    /// Produces raw bytes, without headers, to `topic`.
    pub async fn produce_raw(&self, topic: &str, key: &str, value: &[u8]) {
        self.producer()
            .send(
                FutureRecord::to(topic).key(key).payload(value),
                Duration::from_secs(10),
            )
            .await
            .expect("record produced");
    }

    /// Produces `value` to the events topic with one header named by `name`, bytes that need
    /// not be UTF-8: Kafka allows any, librdkafka's C API writes them, rdkafka's Rust API
    /// cannot.
    pub fn post_with_header_name(&self, key: &str, value: &[u8], name: &[u8]) {
        use rdkafka::bindings::{
            RD_KAFKA_MSG_F_COPY, rd_kafka_error_destroy, rd_kafka_error_string,
            rd_kafka_header_add, rd_kafka_headers_new, rd_kafka_produceva, rd_kafka_vtype_t,
            rd_kafka_vu_s__bindgen_ty_1, rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1, rd_kafka_vu_t,
        };
        use rdkafka::producer::{BaseProducer, Producer};
        // A base producer: its delivery reports carry no per-message state, so a message
        // produced around rdkafka's API reports safely.
        let producer: BaseProducer = producer_config(
            &self.config.kafka.bootstrap_servers,
            &self.config.kafka.client,
        )
        .create()
        .expect("producer");
        let topic = std::ffi::CString::new(self.config.kafka.topics.events.as_str()).unwrap();
        let mem = |bytes: &[u8]| rd_kafka_vu_s__bindgen_ty_1 {
            mem: rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 {
                ptr: bytes.as_ptr().cast_mut().cast(),
                size: bytes.len(),
            },
        };
        // SAFETY: every pointer outlives the call (the flags ask librdkafka to copy key and
        // value), and the header list passes to the message on success.
        unsafe {
            let headers = rd_kafka_headers_new(1);
            rd_kafka_header_add(
                headers,
                name.as_ptr().cast(),
                isize::try_from(name.len()).unwrap(),
                b"x".as_ptr().cast(),
                1,
            );
            let vus = [
                rd_kafka_vu_t {
                    vtype: rd_kafka_vtype_t::RD_KAFKA_VTYPE_TOPIC,
                    u: rd_kafka_vu_s__bindgen_ty_1 {
                        cstr: topic.as_ptr(),
                    },
                },
                rd_kafka_vu_t {
                    vtype: rd_kafka_vtype_t::RD_KAFKA_VTYPE_KEY,
                    u: mem(key.as_bytes()),
                },
                rd_kafka_vu_t {
                    vtype: rd_kafka_vtype_t::RD_KAFKA_VTYPE_VALUE,
                    u: mem(value),
                },
                rd_kafka_vu_t {
                    vtype: rd_kafka_vtype_t::RD_KAFKA_VTYPE_MSGFLAGS,
                    u: rd_kafka_vu_s__bindgen_ty_1 {
                        i: RD_KAFKA_MSG_F_COPY,
                    },
                },
                rd_kafka_vu_t {
                    vtype: rd_kafka_vtype_t::RD_KAFKA_VTYPE_HEADERS,
                    u: rd_kafka_vu_s__bindgen_ty_1 { headers },
                },
            ];
            let error = rd_kafka_produceva(producer.client().native_ptr(), vus.as_ptr(), vus.len());
            if !error.is_null() {
                let text = std::ffi::CStr::from_ptr(rd_kafka_error_string(error))
                    .to_string_lossy()
                    .into_owned();
                rd_kafka_error_destroy(error);
                panic!("produce with a raw header name: {text}");
            }
        }
        producer
            .flush(Duration::from_secs(10))
            .expect("record with a raw header name produced");
    }

    /// `endpoint`'s record in the endpoints topic, as the registry writes it.
    pub fn endpoint_value(&self, endpoint: &Endpoint) -> Vec<u8> {
        let key = self
            .config
            .security
            .master_key
            .as_ref()
            .expect("the test config has a master key");
        hookline::registry::encode(endpoint, key)
    }

    /// Produces `record` to `topic` as hookline writes it (key, headers, body).
    pub async fn produce_delivery(&self, topic: &str, record: &DeliveryRecord) {
        produce_delivery(&self.producer(), topic, record).await;
    }

    /// How many records `topic` holds, over all its partitions (from its watermarks).
    pub fn records_in(&self, topic: &str) -> i64 {
        let consumer: BaseConsumer = consumer_config(
            &self.config.kafka.bootstrap_servers,
            &format!("it-counter-{}", uuid::Uuid::new_v4().simple()),
            &self.config.kafka.client,
        )
        .create()
        .expect("counter");
        partition_ids(&consumer, topic)
            .into_iter()
            .map(|p| {
                let (low, high) = consumer
                    .fetch_watermarks(topic, p, KAFKA_TIMEOUT)
                    .expect("watermarks");
                high - low
            })
            .sum()
    }

    /// Sets `topic`'s `max.message.bytes` on the real broker
    /// ([`limit_record_size`](crate::services::fixture::limit_record_size)).
    pub async fn limit_record_size(&self, topic: &str, bytes: u32) {
        crate::services::fixture::limit_record_size(
            &self.config.kafka.bootstrap_servers,
            topic,
            bytes,
        )
        .await;
    }

    /// The offsets `stage`'s consumer group has committed on `topic`, summed over its partitions
    /// (a partition with no commit counts 0). Reads them without joining the group.
    pub fn committed(&self, stage: &str, topic: &str) -> i64 {
        let consumer: BaseConsumer = consumer_config(
            &self.config.kafka.bootstrap_servers,
            &self.config.kafka.group(stage),
            &self.config.kafka.client,
        )
        .set("enable.auto.commit", "false")
        .create()
        .expect("offset reader");
        let mut partitions = TopicPartitionList::new();
        for p in partition_ids(&consumer, topic) {
            partitions.add_partition(topic, p);
        }
        consumer
            .committed_offsets(partitions, KAFKA_TIMEOUT)
            .expect("committed offsets")
            .elements()
            .iter()
            .map(|e| match e.offset() {
                Offset::Offset(n) => n,
                _ => 0,
            })
            .sum()
    }

    /// Reads `n` records from `topic` from the beginning, within `timeout`.
    pub async fn read(
        &self,
        topic: &str,
        n: usize,
        timeout: Duration,
    ) -> Vec<rdkafka::message::OwnedMessage> {
        let group = format!("it-reader-{}", uuid::Uuid::new_v4().simple());
        let consumer: StreamConsumer = consumer_config(
            &self.config.kafka.bootstrap_servers,
            &group,
            &self.config.kafka.client,
        )
        .set("enable.auto.commit", "false")
        .create()
        .expect("reader");
        consumer.subscribe(&[topic]).expect("subscribe");
        let mut out = vec![];
        let deadline = tokio::time::Instant::now() + timeout;
        while out.len() < n {
            match tokio::time::timeout_at(deadline, consumer.recv()).await {
                Ok(Ok(m)) => out.push(m.detach()),
                Ok(Err(e)) => panic!("reading {topic}: {e}"),
                Err(_) => panic!(
                    "only {} of {n} records arrived on {topic} within {timeout:?}",
                    out.len()
                ),
            }
        }
        out
    }
}

/// Deletes every topic `config` names from its (real) Kafka.
pub async fn delete_topics(config: &Config) {
    let names: Vec<String> = service::topic_specs(config)
        .into_iter()
        .map(|t| t.name)
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    crate::services::fixture::Topics::adopt(&config.kafka.bootstrap_servers, &names)
        .delete()
        .await;
}

/// How long the harness's metadata, watermark and offset requests may take.
const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);

/// `topic`'s partition ids, from `consumer`'s metadata.
fn partition_ids(consumer: &BaseConsumer, topic: &str) -> Vec<i32> {
    consumer
        .fetch_metadata(Some(topic), KAFKA_TIMEOUT)
        .expect("topic metadata")
        .topics()
        .iter()
        .flat_map(|t| t.partitions())
        .map(|p| p.id())
        .collect()
}

/// Checks a request's Standard Webhooks signature with `secret`; returns its webhook-id.
pub fn verify(req: &RecordedRequest, secret: &str) -> String {
    let key: hookline::signing::VerificationKey = secret.parse().expect("secret parses");
    let verifier = Verifier::new(&[key]);
    verifier
        .verify_lookup(
            |name| req.header(name),
            &req.body,
            hookline::signing::unix_now(),
        )
        .unwrap_or_else(|e| panic!("signature does not verify: {e}"));
    req.header("webhook-id").expect("webhook-id").to_owned()
}

/// Produces `record` to `topic` with `producer` as hookline writes it (key, headers, body), and
/// waits for the broker's acknowledgement.
pub async fn produce_delivery(producer: &FutureProducer, topic: &str, record: &DeliveryRecord) {
    let out = hookline::stage::outgoing(Arc::from(topic), record);
    producer
        .send(
            FutureRecord::to(topic)
                .key(&out.key[..])
                .headers(out.headers)
                .payload(&out.payload[..]),
            Duration::from_secs(10),
        )
        .await
        .expect("delivery record produced");
}

/// Decodes a DLQ record.
pub fn dead_record(m: &rdkafka::message::OwnedMessage) -> DeliveryRecord {
    DeliveryRecord::from_message(m).expect("DLQ record decodes")
}
