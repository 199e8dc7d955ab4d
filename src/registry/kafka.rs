//! The Kafka side of the registry: the materialiser that feeds an [`EndpointView`] from the
//! compacted endpoints topic, and the writer that produces to it and waits for the view.
//!
//! The materialiser uses no consumer group: every instance needs every endpoint, so it
//! `assign`s all partitions from the beginning and never joins a group or commits. "Caught up" means every
//! partition has been read up to the high watermark it had at start (or reported end of
//! partition, which also covers offsets removed by compaction). Partitions added to the topic
//! later are picked up at the next restart.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use rdkafka::consumer::{Consumer, ConsumerContext, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::FutureRecord;
use rdkafka::util::Timeout;
use rdkafka::{Offset, TopicPartitionList};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{
    Applied, EndpointStore, EndpointView, RegistryError, encode, encode_tenant_key,
    encode_tenant_limits,
};
use crate::endpoint::Endpoint;
use crate::id::EndpointId;
use crate::kafka::ClientProperties;
use crate::sealed::MasterKey;
use crate::tenant::{TenantKey, TenantLimits};

/// How long metadata and watermark requests may take at start-up.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the compacted endpoints topic lives: the cluster, the client settings and its name.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointsTopic {
    /// `bootstrap.servers`.
    pub bootstrap: String,
    /// Extra rdkafka properties (`kafka.client`; secret ones redacted in `Debug`).
    pub client: ClientProperties,
    /// The topic's name.
    pub topic: String,
}

fn kafka(e: KafkaError) -> RegistryError {
    RegistryError::Kafka(e.to_string())
}

/// Starts the materialiser: reads the endpoints topic's partitions and their high watermarks,
/// assigns every partition from the beginning, and spawns a task that applies records to
/// `view` until `shutdown` is cancelled. Await `view.wait_caught_up(..)` before serving.
pub async fn spawn_materializer(
    config: &EndpointsTopic,
    view: Arc<EndpointView>,
    shutdown: CancellationToken,
) -> Result<JoinHandle<()>, RegistryError> {
    let topic = config.topic.clone();
    let mut client = rdkafka::ClientConfig::new();
    client.set("bootstrap.servers", &config.bootstrap);
    for (k, v) in &config.client {
        if !crate::kafka::PRODUCER_ONLY.contains(&k.as_str()) {
            client.set(k, v);
        }
    }
    // librdkafka refuses `assign` without a group id. This one is never joined (no subscribe)
    // and never committed to; it is unique so no two instances ever share state through it.
    client
        .set(
            "group.id",
            format!("hookline-endpoint-view-{}", uuid::Uuid::new_v4().simple()),
        )
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest");
    let consumer: ViewConsumer = client
        .create_with_context(ViewContext::default())
        .map_err(kafka)?;
    let consumer = Arc::new(consumer);

    // Metadata and watermark calls block; keep them off the async threads. A cluster that is
    // electing leaders or still propagating a new topic answers with transient errors: retry
    // for a while before giving up.
    let mut tries = 0;
    let (assigned, consumer) = loop {
        let topic = topic.clone();
        let attempt = consumer.clone();
        let result = tokio::task::spawn_blocking(move || assign_from_start(&attempt, &topic))
            .await
            .map_err(|e| RegistryError::Kafka(format!("metadata task failed: {e}")))?;
        match result {
            Ok(assigned) => break (assigned, consumer),
            Err(e) if tries < 20 => {
                tries += 1;
                tracing::debug!(error = %e, "endpoints topic not ready; retrying");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e),
        }
    };
    let Assigned {
        partitions,
        targets,
    } = assigned;
    tracing::info!(topic = %topic, partitions_with_data = targets.len(), "materialising endpoints");

    Ok(tokio::spawn(async move {
        tokio::join!(
            materialise(consumer.clone(), view.clone(), targets, shutdown.clone()),
            confirm(consumer, view, topic, partitions, shutdown),
        );
    }))
}

/// How long one confirmation may wait for the view to apply what the topic held when it was
/// asked; a view that falls further behind is confirmed by a later request.
const CONFIRM_WAIT: Duration = Duration::from_secs(10);

/// Answers [confirmation requests](EndpointView::request_confirmation): reads the topic's high
/// watermarks, waits until the view has applied that far, and then confirms the view as of the
/// moment the watermarks were asked for. A failure is logged and left for the next request.
async fn confirm(
    consumer: Arc<ViewConsumer>,
    view: Arc<EndpointView>,
    topic: String,
    partitions: Vec<i32>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = view.confirmation_requested() => {}
        }
        let asked_at = std::time::SystemTime::now();
        let (c, t, ps) = (consumer.clone(), topic.clone(), partitions.clone());
        let highs = tokio::task::spawn_blocking(move || high_watermarks(&c, &t, &ps)).await;
        let waited = match highs {
            Ok(Ok(highs)) => tokio::select! {
                () = shutdown.cancelled() => break,
                r = view.wait_for_offsets(&highs, CONFIRM_WAIT) => r,
            },
            Ok(Err(e)) => Err(e),
            Err(e) => Err(RegistryError::Kafka(format!("watermark task failed: {e}"))),
        };
        match waited {
            Ok(()) => view.confirm_as_of(asked_at),
            Err(error) => {
                tracing::warn!(%error, "could not confirm the endpoint view is current; deliveries for endpoints it lacks wait");
                // Not at once again: a broker that cannot answer now is asked on a later request.
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    }
}

/// The high watermark of each non-empty partition of `topic` among `partitions`.
fn high_watermarks(
    consumer: &ViewConsumer,
    topic: &str,
    partitions: &[i32],
) -> Result<HashMap<i32, i64>, RegistryError> {
    let mut highs = HashMap::new();
    for &p in partitions {
        let (low, high) = consumer
            .fetch_watermarks(topic, p, METADATA_TIMEOUT)
            .map_err(kafka)?;
        if high > low {
            highs.insert(p, high);
        }
    }
    Ok(highs)
}

async fn materialise(
    consumer: Arc<ViewConsumer>,
    view: Arc<EndpointView>,
    mut pending: HashMap<i32, i64>,
    shutdown: CancellationToken,
) {
    let caught_up = |pending: &HashMap<i32, i64>| {
        if pending.is_empty() {
            view.mark_caught_up();
        }
    };
    caught_up(&pending);
    let mut eof_seen: HashSet<i32> = HashSet::new();
    loop {
        let msg = tokio::select! {
            _ = shutdown.cancelled() => break,
            msg = consumer.recv() => msg,
        };
        match msg {
            Ok(m) => {
                let (p, o) = (m.partition(), m.offset());
                let applied = view.apply_at(p, o, m.key().unwrap_or_default(), m.payload());
                if applied == Applied::Skipped {
                    tracing::warn!(partition = p, offset = o, "endpoint record skipped");
                }
                if pending.get(&p).is_some_and(|&high| o + 1 >= high) {
                    pending.remove(&p);
                    caught_up(&pending);
                }
            }
            Err(KafkaError::PartitionEOF(p)) => {
                if eof_seen.insert(p) && pending.remove(&p).is_some() {
                    caught_up(&pending);
                }
            }
            Err(error) => crate::telemetry::consumer_error("endpoints", &error),
        }
    }
    tracing::debug!("endpoint materialiser stopped");
}

/// The view's consumer context: end-of-partition is how the view learns it has caught up, not
/// an error worth an operator's attention, so it is not logged as one; a lost broker is logged
/// as [`OutageLog`](crate::kafka::OutageLog) allows.
#[derive(Default)]
struct ViewContext {
    outage: crate::kafka::OutageLog,
}

impl rdkafka::ClientContext for ViewContext {
    fn error(&self, error: KafkaError, reason: &str) {
        let eof =
            error.rdkafka_error_code() == Some(rdkafka::error::RDKafkaErrorCode::PartitionEOF);
        if eof {
            return;
        }
        if !crate::kafka_error::is_broker_outage(&error) {
            tracing::error!(error = %error, reason, "endpoint view consumer error");
        } else if let Some(held_back) = self.outage.admit(std::time::Instant::now()) {
            tracing::error!(error = %error, reason, held_back, "endpoint view consumer error");
        }
    }
}

impl ConsumerContext for ViewContext {}

type ViewConsumer = StreamConsumer<ViewContext>;

/// What [`assign_from_start`] assigned.
struct Assigned {
    /// Every partition of the topic.
    partitions: Vec<i32>,
    /// Each non-empty partition's high watermark at the time (the view is caught up once it has
    /// read that far).
    targets: HashMap<i32, i64>,
}

/// Assigns every partition of `topic` from the beginning.
fn assign_from_start(consumer: &ViewConsumer, topic: &str) -> Result<Assigned, RegistryError> {
    let md = consumer
        .fetch_metadata(Some(topic), METADATA_TIMEOUT)
        .map_err(kafka)?;
    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .ok_or_else(|| RegistryError::Kafka(format!("topic {topic} not in metadata")))?;
    if let Some(e) = t.error() {
        return Err(RegistryError::Kafka(format!(
            "endpoints topic {topic}: {} (create it with cleanup.policy=compact)",
            rdkafka::error::RDKafkaErrorCode::from(e)
        )));
    }
    let partitions: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
    let targets = high_watermarks(consumer, topic, &partitions)?;
    let mut tpl = TopicPartitionList::new();
    for &p in &partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .map_err(kafka)?;
    }
    consumer.assign(&tpl).map_err(kafka)?;
    Ok(Assigned {
        partitions,
        targets,
    })
}

/// Writes endpoints to the topic (key = id, `acks=all`, idempotent producer) and returns once
/// this instance's view has applied the write.
pub struct KafkaEndpointStore {
    producer: crate::kafka::Producer,
    topic: String,
    view: Arc<EndpointView>,
    key: MasterKey,
    timeout: Duration,
}

impl std::fmt::Debug for KafkaEndpointStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaEndpointStore")
            .field("topic", &self.topic)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl KafkaEndpointStore {
    /// A writer for `config.topic` whose writes are awaited in `view` (fed by
    /// [`spawn_materializer`]); each put or delete fails after `timeout` overall.
    pub fn new(
        config: &EndpointsTopic,
        view: Arc<EndpointView>,
        key: MasterKey,
        timeout: Duration,
    ) -> Result<KafkaEndpointStore, RegistryError> {
        let mut client = crate::kafka::client_config(&config.bootstrap, &config.client);
        // An admin write is one record that someone waits for: do not hold it for a batch.
        if client.get("linger.ms").is_none() {
            client.set("linger.ms", "0");
        }
        client
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("message.timeout.ms", timeout.as_millis().max(1).to_string());
        Ok(KafkaEndpointStore {
            producer: client
                .create_with_context(crate::kafka::ProducerLog::default())
                .map_err(kafka)?,
            topic: config.topic.clone(),
            view,
            key,
            timeout,
        })
    }

    async fn produce(&self, key: &str, value: Option<&[u8]>) -> Result<(), RegistryError> {
        let started = tokio::time::Instant::now();
        let mut record = FutureRecord::<str, [u8]>::to(&self.topic).key(key);
        if let Some(v) = value {
            record = record.payload(v);
        }
        let delivery = tokio::time::timeout(
            self.timeout,
            self.producer.send(record, Timeout::After(self.timeout)),
        )
        .await
        .map_err(|_| RegistryError::Timeout {
            what: "the broker to acknowledge the endpoint write",
            waited: self.timeout,
        })?
        .map_err(|(e, _)| kafka(e))?;
        let remaining = self.timeout.saturating_sub(started.elapsed());
        self.view
            .wait_for_offset(delivery.partition, delivery.offset, remaining)
            .await
    }
}

impl EndpointStore for KafkaEndpointStore {
    fn view(&self) -> &Arc<EndpointView> {
        &self.view
    }

    fn put<'a>(
        &'a self,
        endpoint: &'a Endpoint,
    ) -> BoxFuture<'a, Result<Arc<Endpoint>, RegistryError>> {
        Box::pin(async move {
            endpoint.validate()?;
            self.view.check_version(endpoint)?;
            let bytes = encode(endpoint, &self.key);
            self.produce(endpoint.id.as_str(), Some(&bytes)).await?;
            // A delete racing behind this write may already have removed it; the caller still
            // gets what it wrote.
            Ok(self
                .view
                .get(&endpoint.id)
                .unwrap_or_else(|| Arc::new(endpoint.clone())))
        })
    }

    fn delete<'a>(&'a self, id: &'a EndpointId) -> BoxFuture<'a, Result<(), RegistryError>> {
        Box::pin(async move { self.produce(id.as_str(), None).await })
    }

    fn put_tenant_key<'a>(
        &'a self,
        key: &'a TenantKey,
    ) -> BoxFuture<'a, Result<(), RegistryError>> {
        Box::pin(async move {
            let (k, v) = encode_tenant_key(key)?;
            self.produce(&k, Some(&v)).await
        })
    }

    fn put_tenant_limits<'a>(
        &'a self,
        limits: &'a TenantLimits,
    ) -> BoxFuture<'a, Result<(), RegistryError>> {
        Box::pin(async move {
            let (k, v) = encode_tenant_limits(limits)?;
            self.produce(&k, Some(&v)).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::endpoint;
    use super::*;
    use rdkafka::ClientConfig;
    use rdkafka::mocking::MockCluster;

    const WAIT: Duration = Duration::from_secs(20);

    fn config(bootstrap: &str) -> EndpointsTopic {
        let mut c = EndpointsTopic {
            bootstrap: bootstrap.to_owned(),
            client: ClientProperties::default(),
            topic: "hookline.endpoints".into(),
        };
        c.client.insert("linger.ms".into(), "0".into());
        c
    }

    async fn raw_produce(bootstrap: &str, topic: &str, key: &[u8], value: Option<&[u8]>) {
        let p: crate::kafka::Producer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("linger.ms", "0")
            .create_with_context(crate::kafka::ProducerLog::default())
            .unwrap();
        let mut r = FutureRecord::<[u8], [u8]>::to(topic).key(key);
        if let Some(v) = value {
            r = r.payload(v);
        }
        p.send(r, Timeout::After(WAIT)).await.unwrap();
    }

    // The mock cluster is not Send: it stays on this test's thread (current-thread runtime).
    #[tokio::test]
    async fn put_get_delete_and_a_late_view_materialises_the_same_state() {
        let mock = MockCluster::new(1).unwrap();
        let topic = "hookline.endpoints";
        mock.create_topic(topic, 3, 1).unwrap();
        let bootstrap = mock.bootstrap_servers();
        let cfg = config(&bootstrap);
        let key = MasterKey::generate();
        let shutdown = CancellationToken::new();

        let view = Arc::new(EndpointView::new(key.clone()));
        let task = spawn_materializer(&cfg, Arc::clone(&view), shutdown.clone())
            .await
            .unwrap();
        view.wait_caught_up(WAIT).await.unwrap();
        let store = KafkaEndpointStore::new(&cfg, Arc::clone(&view), key.clone(), WAIT).unwrap();

        let a = endpoint("acme");
        let b = endpoint("acme");
        let c = endpoint("globex");
        for e in [&a, &b, &c] {
            let got = store.put(e).await.unwrap();
            assert_eq!(*got, *e);
        }
        // Visible as soon as put returns: the writer waited for its own view.
        assert_eq!(*view.get(&b.id).unwrap(), b);
        assert_eq!(view.list(&a.tenant).len(), 2);

        let mut b2 = b.clone();
        b2.disable(crate::endpoint::DISABLED_GONE, std::time::SystemTime::now());
        store.put(&b2).await.unwrap();
        assert!(!view.get(&b.id).unwrap().enabled);
        store.delete(&c.id).await.unwrap();
        assert!(view.get(&c.id).is_none());

        // Garbage and a tombstone for an unknown id written by someone else are survived.
        raw_produce(
            &bootstrap,
            topic,
            a.id.as_str().as_bytes(),
            Some(b"{garbage"),
        )
        .await;
        raw_produce(&bootstrap, topic, b"ep_unknown", None).await;
        // A write after them proves the view has moved past them.
        let d = endpoint("initech");
        store.put(&d).await.unwrap();
        assert_eq!(*view.get(&a.id).unwrap(), a, "malformed record skipped");

        // A second instance started now reads the same state from the beginning.
        let late = Arc::new(EndpointView::new(key.clone()));
        let late_task = spawn_materializer(&cfg, Arc::clone(&late), shutdown.clone())
            .await
            .unwrap();
        late.wait_caught_up(WAIT).await.unwrap();
        let ids = |v: &EndpointView| v.all().iter().map(|e| (**e).clone()).collect::<Vec<_>>();
        assert_eq!(ids(&late), ids(&view));
        assert_eq!(late.len(), 3);
        assert!(!late.get(&b.id).unwrap().enabled);
        assert!(late.get(&c.id).is_none());

        shutdown.cancel();
        task.await.unwrap();
        late_task.await.unwrap();
    }

    #[tokio::test]
    async fn a_key_revoked_through_one_instance_is_refused_by_another() {
        use crate::tenant::{Scope, TenantKey};
        let mock = MockCluster::new(1).unwrap();
        mock.create_topic("hookline.endpoints", 3, 1).unwrap();
        let cfg = config(&mock.bootstrap_servers());
        let key = MasterKey::generate();
        let shutdown = CancellationToken::new();
        let mut instances = vec![];
        for _ in 0..2 {
            let view = Arc::new(EndpointView::new(key.clone()));
            let task = spawn_materializer(&cfg, Arc::clone(&view), shutdown.clone())
                .await
                .unwrap();
            view.wait_caught_up(WAIT).await.unwrap();
            let store =
                KafkaEndpointStore::new(&cfg, Arc::clone(&view), key.clone(), WAIT).unwrap();
            instances.push((view, store, task));
        }
        let tenant = crate::id::Tenant::parse("acme").unwrap();
        let (record, secret) =
            TenantKey::issue(tenant, Scope::Write, None, std::time::SystemTime::now()).unwrap();
        instances[0].1.put_tenant_key(&record).await.unwrap();
        let accepted = |v: &EndpointView| {
            v.tenant_key(&record.id)
                .is_some_and(|k| k.accepts(secret.expose()))
        };
        let other = Arc::clone(&instances[1].0);
        let deadline = tokio::time::Instant::now() + WAIT;
        while !accepted(&other) {
            assert!(tokio::time::Instant::now() < deadline, "never seen");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut revoked = record.clone();
        revoked.revoked_at = Some(std::time::SystemTime::now());
        instances[0].1.put_tenant_key(&revoked).await.unwrap();
        assert!(
            !accepted(&instances[0].0),
            "refused where it was revoked, at once"
        );
        let deadline = tokio::time::Instant::now() + WAIT;
        while accepted(&other) {
            assert!(tokio::time::Instant::now() < deadline, "never refused");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        shutdown.cancel();
        for (_, _, task) in instances {
            task.await.unwrap();
        }
    }

    /// Writes `writes` endpoints to a topic of `partitions`, the view's next `failed_fetches`
    /// fetches failing (a fetch backoff each) while watermark requests are answered at once;
    /// then asks for a confirmation and checks that, once given, the view holds every write.
    async fn confirm_after_writes(partitions: i32, writes: usize, failed_fetches: usize) {
        use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
        let mock = MockCluster::new(1).unwrap();
        let topic = "hookline.endpoints";
        mock.create_topic(topic, partitions, 1).unwrap();
        let bootstrap = mock.bootstrap_servers();
        let key = MasterKey::generate();
        let shutdown = CancellationToken::new();
        let view = Arc::new(EndpointView::new(key.clone()));
        let task = spawn_materializer(&config(&bootstrap), Arc::clone(&view), shutdown.clone())
            .await
            .unwrap();
        view.wait_caught_up(WAIT).await.unwrap();

        mock.request_errors(
            RDKafkaApiKey::Fetch,
            &vec![RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT; failed_fetches],
        );
        let written: Vec<Endpoint> = (0..writes).map(|_| endpoint("acme")).collect();
        for e in &written {
            let value = encode(e, &key);
            raw_produce(&bootstrap, topic, e.id.as_str().as_bytes(), Some(&value)).await;
        }
        let after = std::time::SystemTime::now();
        std::thread::sleep(Duration::from_millis(2));
        assert!(!view.holds_writes_before(after));
        view.request_confirmation();
        let deadline = tokio::time::Instant::now() + WAIT;
        while !view.holds_writes_before(after) {
            assert!(tokio::time::Instant::now() < deadline, "not confirmed");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for e in &written {
            assert!(
                view.get(&e.id).is_some(),
                "confirmed before {} applied",
                e.id
            );
        }
        shutdown.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn a_confirmation_covers_every_write_made_before_it_was_asked() {
        confirm_after_writes(3, 20, 0).await;
    }

    #[tokio::test]
    async fn a_confirmation_waits_for_the_view_to_apply_what_the_topic_held() {
        // The topic's end is known long before the view has read up to it: a confirmation
        // given on the watermarks alone would vouch for a write the view lacks.
        confirm_after_writes(1, 1, 4).await;
    }

    #[tokio::test]
    async fn an_empty_topic_is_caught_up_at_once_and_a_missing_one_is_an_error() {
        let mock = MockCluster::new(1).unwrap();
        mock.create_topic("hookline.endpoints", 2, 1).unwrap();
        let cfg = config(&mock.bootstrap_servers());
        let shutdown = CancellationToken::new();
        let view = Arc::new(EndpointView::new(MasterKey::generate()));
        let task = spawn_materializer(&cfg, Arc::clone(&view), shutdown.clone())
            .await
            .unwrap();
        view.wait_caught_up(WAIT).await.unwrap();
        assert!(view.is_empty());
        shutdown.cancel();
        task.await.unwrap();

        let mut missing = cfg.clone();
        missing.topic = "no.such.topic".into();
        let err = spawn_materializer(&missing, view, CancellationToken::new())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("no.such.topic"), "{err}");
    }
}
