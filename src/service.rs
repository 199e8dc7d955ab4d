//! Assembling hookline from a [`Config`]: topics, the endpoint registry, the store, the sender,
//! the stages of the chosen roles, metrics; and running them all under one cancellation token.
//!
//! `hookline run` and `hookline dev` are both this; `dev` only swaps in the embedded Kafka and
//! the in-memory store.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::Consumer;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, ConfigError, KafkaConfig, StoreKind};
use crate::delay_tier::{self, DelayTopics, Tiers};
use crate::deliver::{self, DeliverDeps};
use crate::fanout::{self, FanoutDeps, FanoutTopics};
use crate::input::InputConfig;
use crate::kafka::{self, KafkaError, TopicSpec, producer_config, stage_consumer_config};
use crate::lane::LanesConfig;
use crate::registry::kafka::{KafkaEndpointStore, spawn_materializer};
use crate::registry::{EndpointStore, EndpointView, RegistryError};
use crate::sender::{Sender, SenderConfig};
use crate::ssrf::Policy;
use crate::stage::{StageConsumer, StageContext};
use crate::storage::DeliveryStore;
use crate::storage::memory::MemoryStore;
use crate::storage::scylla::{ScyllaError, ScyllaStore};

/// A role a process plays; `All` is every one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// Input topics to delivery records.
    Fanout,
    /// HTTP attempts.
    Deliver,
    /// Delay tiers back to the deliveries topic.
    Delay,
    /// Every stage in one process.
    All,
}

impl Role {
    fn includes(self, other: Role) -> bool {
        self == Role::All || self == other
    }
}

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Kafka could not be set up.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// A Kafka client could not be created.
    #[error("kafka client: {0}")]
    Client(#[from] rdkafka::error::KafkaError),
    /// The endpoint registry could not start.
    #[error("endpoint registry: {0}")]
    Registry(#[from] RegistryError),
    /// The HTTP sender could not be built.
    #[error("http sender: {0}")]
    Sender(String),
    /// The store could not be opened.
    #[error("store: {0}")]
    Store(String),
    /// The admin API could not listen.
    #[error("admin API on {addr}: {detail}")]
    Admin {
        /// The address.
        addr: std::net::SocketAddr,
        /// What failed.
        detail: String,
    },
    /// The metrics listener could not start.
    #[error("metrics listener on {addr}: {detail}")]
    Metrics {
        /// The address.
        addr: std::net::SocketAddr,
        /// What failed.
        detail: String,
    },
}

/// Every topic hookline uses, with its layout.
pub fn topic_specs(config: &Config) -> Vec<TopicSpec> {
    let k = &config.kafka;
    let p = i32::try_from(k.partitions).unwrap_or(i32::MAX);
    let spec = |name: &str, partitions: i32, compacted: bool| TopicSpec {
        name: name.to_owned(),
        partitions,
        compacted,
    };
    let mut specs = vec![
        spec(&k.topics.deliveries, p, false),
        spec(&k.topics.endpoints, p.min(6), true),
        spec(&k.topics.dlq, p, false),
        spec(&k.topics.invalid, 1, false),
        spec(
            &k.topics.events,
            k.events_partitions
                .map_or(p, |n| i32::try_from(n).unwrap_or(i32::MAX)),
            false,
        ),
    ];
    for (_, topic) in config.tier_topics() {
        specs.push(spec(&topic, p, false));
    }
    specs
}

/// What the running service shares with the admin API and tests.
pub struct Handles {
    /// The materialised endpoints.
    pub view: Arc<EndpointView>,
    /// Endpoint writes.
    pub endpoints: Arc<dyn EndpointStore>,
    /// The delivery store.
    pub store: Arc<dyn DeliveryStore>,
    /// Cancelled when a stage stops on its own (see [`spawn_stage`]).
    pub failed: CancellationToken,
}

/// Runs a stage's loop as a tracked task. A stage that ends before `shutdown` (it panicked,
/// or returned) is logged as an error and cancels `failed`, on which the process stops and
/// exits non-zero, so that its supervisor starts it again, rather than answering health checks
/// while one of its stages no longer runs. Nothing is lost: what the stage had not committed is
/// read again by the next process.
pub fn spawn_stage(
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
    failed: &CancellationToken,
    stage: &'static str,
    run: impl std::future::Future<Output = ()> + Send + 'static,
) {
    use futures::FutureExt as _;
    let (shutdown, failed) = (shutdown.clone(), failed.clone());
    tasks.spawn(async move {
        let ended = std::panic::AssertUnwindSafe(run).catch_unwind().await;
        if shutdown.is_cancelled() && ended.is_ok() {
            return;
        }
        match ended {
            Ok(()) => tracing::error!(stage, "stage stopped on its own; hookline stops"),
            Err(panic) => {
                let message = crate::telemetry::panic_message(&*panic);
                tracing::error!(stage, panic = %message, "stage panicked; hookline stops");
            }
        }
        failed.cancel();
    });
}

/// Opens the delivery store the config names.
pub async fn open_store(config: &Config) -> Result<Arc<dyn DeliveryStore>, ServiceError> {
    match config.store.kind {
        StoreKind::Memory => Ok(Arc::new(MemoryStore::with_capacity(
            config.store.memory.capacity,
        ))),
        // Start-up waits (bounded by store.scylla.startup_wait) for a cluster that is still
        // coming up; a keyspace that needs `hookline migrate` fails at once. Every message
        // names the nodes, so a wrong address is obvious.
        StoreKind::Scylla => {
            let scylla = &config.store.scylla;
            let store = ScyllaStore::open(scylla).await.map_err(|e| match e {
                ScyllaError::Unreachable { .. } => ServiceError::Store(e.to_string()),
                other => ServiceError::Store(format!(
                    "CQL nodes {:?}, keyspace {:?}: {other}",
                    scylla.nodes, scylla.keyspace
                )),
            })?;
            tracing::info!(nodes = ?scylla.nodes, keyspace = %scylla.keyspace, "CQL store open");
            Ok(Arc::new(store))
        }
    }
}

/// Builds the sender from `[http]`.
pub fn sender(config: &Config) -> Result<Sender, ServiceError> {
    Sender::new(SenderConfig {
        connect_timeout: config.http.connect_timeout,
        total_timeout: config.http.total_timeout,
        allow_http: config.http.dangerous_allow_http,
        policy: Policy::with_allowed(config.http.allow_cidrs.iter().copied()),
        dns_servers: config.http.dns_servers.clone(),
    })
    .map_err(|e| ServiceError::Sender(e.to_string()))
}

fn stage_consumer(
    config: &Config,
    group: &str,
    stage: &'static str,
    fetch: kafka::FetchBatching,
) -> Result<StageConsumer, ServiceError> {
    Ok(stage_consumer_config(
        &config.kafka.bootstrap_servers,
        group,
        fetch,
        &config.kafka.client,
    )
    .create_with_context(StageContext::new(stage))?)
}

fn producer(config: &Config) -> Result<crate::kafka::Producer, ServiceError> {
    Ok(
        producer_config(&config.kafka.bootstrap_servers, &config.kafka.client)
            .create_with_context(crate::kafka::ProducerLog::default())?,
    )
}

/// Starts the endpoint registry (materialiser + writer) and waits until the view has caught up.
pub async fn start_registry(
    config: &Config,
    shutdown: &CancellationToken,
    tasks: &TaskTracker,
    failed: &CancellationToken,
) -> Result<(Arc<EndpointView>, Arc<dyn EndpointStore>), ServiceError> {
    let key = config.require_master_key()?.clone();
    let view =
        Arc::new(EndpointView::new(key.clone()).with_tenant_defaults(config.tenant_defaults()));
    let handle = spawn_materializer(
        &config.kafka.endpoints_topic(),
        view.clone(),
        shutdown.clone(),
    )
    .await?;
    spawn_stage(tasks, shutdown, failed, "endpoints", async move {
        if let Err(e) = handle.await
            && let Ok(panic) = e.try_into_panic()
        {
            std::panic::resume_unwind(panic);
        }
    });
    view.wait_caught_up(Duration::from_secs(60)).await?;
    view.check_opened()?;
    let writer = KafkaEndpointStore::new(
        &config.kafka.endpoints_topic(),
        view.clone(),
        key,
        Duration::from_secs(10),
    )?;
    Ok((view, Arc::new(writer)))
}

/// Starts the stages of `role` on an already prepared Kafka (topics exist), returning the
/// handles the admin API needs. Every task is tracked by `tasks` and stops on `shutdown`.
pub async fn start(
    config: &Config,
    role: Role,
    shutdown: &CancellationToken,
    tasks: &TaskTracker,
) -> Result<Handles, ServiceError> {
    let failed = CancellationToken::new();
    let (view, endpoints) = start_registry(config, shutdown, tasks, &failed).await?;
    let store = open_store(config).await?;
    let k = &config.kafka;
    let tiers = Arc::new(Tiers::new(&k.topics.retry_prefix, &config.retry.tiers));
    tasks.spawn(crate::lag::watch(
        shutdown.clone(),
        crate::telemetry::runtime_lag,
    ));
    tasks.spawn(crate::lag::watch_busy(
        shutdown.clone(),
        crate::lag::BUSY_EVERY,
        |busy| crate::telemetry::runtime_busy(busy.share()),
    ));

    if role.includes(Role::Fanout) {
        let consumer = stage_consumer(config, &k.group("fanout"), "fanout", kafka::HOT_FETCH)?;
        let inputs = fanout_subscription(k);
        let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
        consumer.subscribe(&refs)?;
        let input = InputConfig {
            max_payload: usize::try_from(config.http.max_payload_bytes).unwrap_or(usize::MAX),
            max_record: usize::try_from(config.kafka.message_max_bytes()?).unwrap_or(usize::MAX),
            type_header: k.outbox.type_header.clone(),
            tenant_header: k.outbox.tenant_header.clone(),
            ..InputConfig::default()
        };
        let topics = FanoutTopics {
            deliveries: Arc::from(k.topics.deliveries.as_str()),
            invalid: Arc::from(k.topics.invalid.as_str()),
        };
        spawn_stage(
            tasks,
            shutdown,
            &failed,
            "fanout",
            fanout::run(
                consumer,
                producer(config)?,
                FanoutDeps {
                    view: view.clone(),
                    input,
                    topics,
                    store: store.clone(),
                    dedupe_window: config.ingest.dedupe_window,
                    max_held_bytes: fanout::MAX_HELD_BYTES,
                },
                shutdown.clone(),
            ),
        );
    }
    if role.includes(Role::Delay) {
        let consumer = stage_consumer(config, &k.group("delay"), "delay", kafka::DELAY_FETCH)?;
        let names: Vec<&str> = tiers.all().iter().map(|t| &*t.topic).collect();
        consumer.subscribe(&names)?;
        let topics = DelayTopics {
            deliveries: Arc::from(k.topics.deliveries.as_str()),
            invalid: Arc::from(k.topics.invalid.as_str()),
        };
        spawn_stage(
            tasks,
            shutdown,
            &failed,
            "delay",
            delay_tier::run(consumer, producer(config)?, topics, shutdown.clone()),
        );
    }
    if role.includes(Role::Deliver) {
        let consumer = stage_consumer(config, &k.group("deliver"), "deliver", kafka::HOT_FETCH)?;
        consumer.subscribe(&[k.topics.deliveries.as_str()])?;
        let deps = deliver_deps(config, &view, &endpoints, &store, &tiers)?;
        spawn_stage(
            tasks,
            shutdown,
            &failed,
            "deliver",
            deliver::run(consumer, producer(config)?, deps, shutdown.clone()),
        );
    }
    Ok(Handles {
        view,
        endpoints,
        store,
        failed,
    })
}

/// The names the fan-out subscribes to: the input topics, the native events topic, and the input
/// pattern (librdkafka treats a subscription starting with `^` as a regex).
fn fanout_subscription(k: &KafkaConfig) -> Vec<String> {
    let mut inputs: Vec<String> = k.input_topics.clone();
    inputs.push(k.topics.events.clone());
    if let Some(pattern) = &k.input_pattern {
        inputs.push(if pattern.starts_with('^') {
            pattern.clone()
        } else {
            format!("^{pattern}")
        });
    }
    inputs
}

/// What the deliver stage is given: the registry, the store, the sender, and its limits from
/// `[retry]`, `[delivery]` and `[http]`.
fn deliver_deps(
    config: &Config,
    view: &Arc<EndpointView>,
    endpoints: &Arc<dyn EndpointStore>,
    store: &Arc<dyn DeliveryStore>,
    tiers: &Arc<Tiers>,
) -> Result<Arc<DeliverDeps>, ServiceError> {
    let k = &config.kafka;
    let lanes = LanesConfig {
        breaker: breaker_config(&config.delivery),
        ..LanesConfig::default()
    };
    Ok(Arc::new(DeliverDeps {
        endpoints: view.clone(),
        endpoint_writer: endpoints.clone(),
        store: store.clone(),
        sender: sender(config)?,
        policy: config.retry.policy(),
        tiers: tiers.clone(),
        dlq_topic: Arc::from(k.topics.dlq.as_str()),
        invalid_topic: Arc::from(k.topics.invalid.as_str()),
        lanes,
        default_max_in_flight: config.delivery.max_in_flight,
        max_window: config.delivery.partition_max_in_flight as usize,
        // A healthy endpoint's burst may wait in its lane up to the partition's window and
        // what the stage still takes after pausing the partition (the partition pauses,
        // nothing parks); a stalled endpoint's records park instead.
        lane_queue: config.delivery.partition_max_in_flight as usize
            + crate::intake::TAKEN_AFTER_PAUSE,
        stall_after: config.delivery.stall_after,
        stalled_wait: config.http.total_timeout,
        drain_deadline: config.http.total_timeout + Duration::from_secs(5),
    }))
}

/// Creates the topics on a real cluster (auto-create is off in production), with the
/// broker's default replication factor.
pub async fn prepare_topics(config: &Config) -> Result<(), ServiceError> {
    kafka::ensure_topics(
        &config.kafka.bootstrap_servers,
        &config.kafka.client,
        &topic_specs(config),
        -1,
        config.kafka.message_max_bytes()?,
    )
    .await?;
    Ok(())
}

/// The breakers' settings from `[delivery]`. A failed probe doubles the cool-down up to the
/// breaker's maximum (5 minutes), or up to `breaker_cooldown` itself when that is longer: a
/// longer configured cool-down is kept as given, never cut to the default maximum.
pub fn breaker_config(delivery: &crate::config::DeliveryConfig) -> crate::breaker::BreakerConfig {
    let default = crate::breaker::BreakerConfig::default();
    crate::breaker::BreakerConfig {
        failure_threshold: delivery.breaker_failure_threshold,
        cool_down: delivery.breaker_cooldown,
        max_cool_down: default.max_cool_down.max(delivery.breaker_cooldown),
        ..default
    }
}

/// Installs the Prometheus listener.
pub fn install_metrics(config: &Config) -> Result<(), ServiceError> {
    crate::telemetry::install(config.metrics.listen).map_err(|e| ServiceError::Metrics {
        addr: config.metrics.listen,
        detail: e.to_string(),
    })?;
    let tiers: Vec<String> = config
        .retry
        .tiers
        .iter()
        .map(|d| crate::delay_tier::tier_name(*d))
        .collect();
    crate::telemetry::register_series(
        tiers.iter().map(String::as_str),
        crate::input::InvalidReason::kinds(),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_memory_store_keeps_as_many_deliveries_as_configured() {
        let mut config = Config::default();
        config.store.kind = StoreKind::Memory;
        config.store.memory.capacity = 2;
        let store = open_store(&config).await.expect("memory store");
        for i in 0..3 {
            let row = crate::storage::conformance::attempt_row(&format!("e{i}"), "ep_cfg", 1);
            store.record_attempt(&row).await.expect("attempt recorded");
        }
        let kept = |e: &str| {
            let store = store.clone();
            let e = crate::id::EventId::parse(e).expect("event id");
            async move { store.event_deliveries(&e).await.expect("lookup").len() }
        };
        assert_eq!(kept("e0").await, 0, "the oldest delivery is forgotten");
        assert_eq!(kept("e1").await, 1);
        assert_eq!(kept("e2").await, 1);
    }

    #[test]
    fn a_configured_cool_down_is_kept_and_grows_to_five_minutes_or_itself() {
        let mut config = Config::default();
        config.delivery.breaker_cooldown = Duration::from_secs(30);
        let b = breaker_config(&config.delivery);
        assert!(b.validate().is_ok());
        assert_eq!(b.cool_down_after(1), Duration::from_secs(30));
        assert_eq!(b.cool_down_after(2), Duration::from_secs(60));
        assert_eq!(b.cool_down_after(9), Duration::from_secs(300));
        config.delivery.breaker_cooldown = Duration::from_secs(600);
        let b = breaker_config(&config.delivery);
        assert!(b.validate().is_ok());
        assert_eq!(b.cool_down_after(1), Duration::from_secs(600));
        assert_eq!(b.cool_down_after(3), Duration::from_secs(600));
    }

    /// Runs `stage` under [`spawn_stage`], cancelling `shutdown` first when `after_shutdown`;
    /// returns whether the failure token was cancelled once the task ended.
    async fn supervised(
        after_shutdown: bool,
        stage: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> bool {
        let (tasks, shutdown, failed) = (
            TaskTracker::new(),
            CancellationToken::new(),
            CancellationToken::new(),
        );
        if after_shutdown {
            shutdown.cancel();
        }
        spawn_stage(&tasks, &shutdown, &failed, "test", stage);
        tasks.close();
        tasks.wait().await;
        failed.is_cancelled()
    }

    #[tokio::test]
    async fn a_stage_that_stops_on_its_own_stops_the_process() {
        assert!(
            supervised(false, async { panic!("bug in a stage") }).await,
            "a panicking stage"
        );
        assert!(supervised(false, async {}).await, "a stage that returned");
        assert!(
            !supervised(true, async {}).await,
            "a stage that returned after shutdown is a clean stop"
        );
        assert!(
            supervised(true, async { panic!("bug while draining") }).await,
            "a stage that panicked while draining"
        );
    }

    fn partitions_of(config: &Config, topic: &str) -> i32 {
        topic_specs(config)
            .into_iter()
            .find(|s| s.name == topic)
            .unwrap_or_else(|| panic!("no spec for {topic}"))
            .partitions
    }

    #[test]
    fn the_events_topic_takes_its_own_partition_count_when_given() {
        let mut config = Config::default();
        config.kafka.partitions = 24;
        let events = config.kafka.topics.events.clone();
        let deliveries = config.kafka.topics.deliveries.clone();
        assert_eq!(
            partitions_of(&config, &events),
            24,
            "defaults to kafka.partitions"
        );
        config.kafka.events_partitions = Some(3);
        assert_eq!(partitions_of(&config, &events), 3);
        assert_eq!(partitions_of(&config, &deliveries), 24);
        for (_, tier) in config.tier_topics() {
            assert_eq!(partitions_of(&config, &tier), 24, "{tier}");
        }
    }
}
