//! The outbox route end to end: a row inserted into `public.outbox` through tokio-postgres reaches
//! `outbox.event.<aggregatetype>` through Debezium in the shape hookline's fan-out reads (input
//! format (a) in DESIGN.md): key = aggregateid, header `id` = the row's id, headers `eventType`
//! and `tenant`, value = the JSON payload.
//!
//! Topics: the route writes to a topic per aggregatetype and the broker refuses to auto-create
//! topics. Connect creates a missing route topic through the admin API (`topic.creation.*` in
//! tests/services.d/connect/outbox.properties); tests that must read from offset 0 either create
//! the topic before inserting or wait for Connect to create it, then read from the beginning.

use std::time::Duration;

use rdkafka::Offset;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use serde_json::{Value, json};
use tokio_postgres::{Client, NoTls};
use uuid::Uuid;

use super::fixture::{
    Topics, kafka_config, require_connect, require_kafka, require_postgres, unique,
};

/// Debezium usually delivers in about a second; the bound covers a busy two-core machine.
const ARRIVAL_TIMEOUT: Duration = Duration::from_secs(60);

/// One outbox row as the application writes it.
struct Row {
    id: Uuid,
    aggregatetype: String,
    aggregateid: String,
    event_type: String,
    tenant: String,
    payload: Value,
}

impl Row {
    fn new(aggregatetype: &str, n: u32) -> Row {
        Row {
            id: Uuid::new_v4(),
            aggregatetype: aggregatetype.to_owned(),
            aggregateid: format!("order-{n}"),
            event_type: "order.created".to_owned(),
            tenant: "tenant_a".to_owned(),
            payload: json!({"order": n, "lines": [{"sku": "a-1", "qty": 2}], "note": "ünïcode"}),
        }
    }

    fn topic(&self) -> String {
        format!("outbox.event.{}", self.aggregatetype)
    }
}

async fn postgres() -> Client {
    let conn = require_postgres().await;
    let (client, connection) = tokio_postgres::connect(&conn, NoTls)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL ({conn}): {e}: run `tests/services up`"));
    tokio::spawn(connection);
    client
}

const INSERT: &str = "INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, tenant_id, payload) \
     VALUES ($1::text::uuid, $2, $3, $4, $5, $6::text::jsonb)";

async fn insert(client: &impl tokio_postgres::GenericClient, row: &Row) {
    client
        .execute(
            INSERT,
            &[
                &row.id.to_string(),
                &row.aggregatetype,
                &row.aggregateid,
                &row.event_type,
                &row.tenant,
                &row.payload.to_string(),
            ],
        )
        .await
        .expect("insert outbox row");
}

fn consumer_from_start(bootstrap: &str, topic: &str) -> StreamConsumer {
    let consumer: StreamConsumer = kafka_config(bootstrap)
        .set("group.id", unique("it_outbox"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .expect("partition");
    consumer.assign(&tpl).expect("assign");
    consumer
}

async fn next<'c>(consumer: &'c StreamConsumer, topic: &str) -> BorrowedMessage<'c> {
    tokio::time::timeout(ARRIVAL_TIMEOUT, consumer.recv())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "no record on {topic} within {ARRIVAL_TIMEOUT:?}: is Debezium's route healthy? \
                 (`tests/services status`; log in ~/.cache/hookline/services/connect/server.log)"
            )
        })
        .expect("consumer error")
}

fn header<'m>(msg: &'m BorrowedMessage<'_>, name: &str) -> Option<&'m str> {
    let headers = msg.headers()?;
    headers
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value)
        .map(|v| std::str::from_utf8(v).expect("utf-8 header"))
}

fn assert_routed(msg: &BorrowedMessage<'_>, row: &Row) {
    assert_eq!(msg.topic(), row.topic());
    assert_eq!(
        msg.key(),
        Some(row.aggregateid.as_bytes()),
        "key must be the aggregateid as plain bytes"
    );
    assert_eq!(header(msg, "id"), Some(row.id.to_string().as_str()));
    assert_eq!(header(msg, "eventType"), Some(row.event_type.as_str()));
    assert_eq!(header(msg, "tenant"), Some(row.tenant.as_str()));
    let value: Value =
        serde_json::from_slice(msg.payload().expect("a value")).expect("value is JSON");
    assert_eq!(value, row.payload, "value must be the expanded payload");
}

#[tokio::test]
async fn outbox_insert_arrives_on_its_route_topic() {
    let bootstrap = require_kafka().await;
    require_connect().await;
    let pg = postgres().await;

    let aggregatetype = unique("itorder");
    let row = Row::new(&aggregatetype, 1);
    let topic = row.topic();
    let topics = Topics::create(&bootstrap, &[&topic], 1).await;
    let consumer = consumer_from_start(&bootstrap, &topic);

    insert(&pg, &row).await;

    let msg = next(&consumer, &topic).await;
    assert_routed(&msg, &row);
    drop(msg);
    drop(consumer);
    topics.delete().await;
}

/// Applications may delete the row in the transaction that inserted it, keeping the table empty:
/// the event must still go out, once, with no delete or tombstone record after it.
#[tokio::test]
async fn outbox_row_deleted_in_its_transaction_still_arrives_once() {
    let bootstrap = require_kafka().await;
    require_connect().await;
    let mut pg = postgres().await;

    let aggregatetype = unique("itorder");
    let deleted = Row::new(&aggregatetype, 1);
    let marker = Row::new(&aggregatetype, 2);
    let topic = deleted.topic();
    let topics = Topics::create(&bootstrap, &[&topic], 1).await;
    let consumer = consumer_from_start(&bootstrap, &topic);

    let tx = pg.transaction().await.expect("begin");
    insert(&tx, &deleted).await;
    tx.execute(
        "DELETE FROM public.outbox WHERE id = $1::text::uuid",
        &[&deleted.id.to_string()],
    )
    .await
    .expect("delete outbox row");
    tx.commit().await.expect("commit");
    // A later event on the same topic: whatever the delete produced would sit before it.
    insert(&pg, &marker).await;

    let first = next(&consumer, &topic).await;
    assert_routed(&first, &deleted);
    drop(first);
    let second = next(&consumer, &topic).await;
    assert_routed(&second, &marker);
    drop(second);
    drop(consumer);
    topics.delete().await;
}

/// The broker refuses to auto-create topics; the route must create a new aggregatetype's topic
/// itself rather than fail the connector.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_route_creates_a_missing_topic() {
    let bootstrap = require_kafka().await;
    require_connect().await;
    let pg = postgres().await;

    let row = Row::new(&unique("itnew"), 1);
    let topic = row.topic();
    insert(&pg, &row).await;

    // Wait for Connect to create the topic, then read it from its start.
    let probe: StreamConsumer = kafka_config(&bootstrap).create().expect("consumer");
    let deadline = tokio::time::Instant::now() + ARRIVAL_TIMEOUT;
    loop {
        let exists = tokio::task::block_in_place(|| {
            probe
                .fetch_metadata(Some(&topic), Duration::from_secs(5))
                .map(|m| {
                    m.topics()
                        .iter()
                        .any(|t| t.error().is_none() && !t.partitions().is_empty())
                })
                .unwrap_or(false)
        });
        if exists {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "Debezium's route did not create {topic} within {ARRIVAL_TIMEOUT:?}; \
             see ~/.cache/hookline/services/connect/server.log"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let topics = Topics::adopt(&bootstrap, &[&topic]);
    let consumer = consumer_from_start(&bootstrap, &topic);
    let msg = next(&consumer, &topic).await;
    assert_routed(&msg, &row);
    drop(msg);
    drop(consumer);
    topics.delete().await;
}

/// The prefix of the second connector [`wrapped_route`] registers, and of its slot and
/// publication. Each run uses a name of its own: Connect keeps a connector's offsets by name,
/// and a name used before would resume at a position in a slot dropped since.
const WRAPPED: &str = "hookline_outbox_wrapped";

/// Removes what earlier runs of [`wrapped_route`] left behind when they failed before cleaning
/// up: their connectors, then their slots (which would hold WAL for ever) and publications.
async fn sweep_wrapped_routes(http: &reqwest::Client, connect: &str, pg: &Client) {
    let names: Vec<String> = http
        .get(format!("http://{connect}/connectors"))
        .send()
        .await
        .expect("Kafka Connect REST")
        .json()
        .await
        .expect("connector names");
    let mut left = vec![];
    for name in names.into_iter().filter(|n| n.starts_with(WRAPPED)) {
        left.push(name.clone());
        let _ = http
            .delete(format!("http://{connect}/connectors/{name}"))
            .send()
            .await;
    }
    for row in pg
        .query("SELECT slot_name FROM pg_replication_slots", &[])
        .await
        .expect("pg_replication_slots")
    {
        let slot: String = row.get(0);
        if slot.starts_with(WRAPPED) {
            left.push(slot);
        }
    }
    left.sort();
    left.dedup();
    for name in left {
        drop_slot_and_publication(pg, &name).await;
    }
}

/// Drops the replication slot and publication `name`, once no task holds the slot.
async fn drop_slot_and_publication(pg: &Client, name: &str) {
    let deadline = tokio::time::Instant::now() + ARRIVAL_TIMEOUT;
    loop {
        let dropped = pg
            .execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                 WHERE slot_name = $1 AND NOT active",
                &[&name],
            )
            .await;
        let left = pg
            .query_opt(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1",
                &[&name],
            )
            .await
            .expect("pg_replication_slots");
        if dropped.is_ok() && left.is_none() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "slot {name} still held after its connector was deleted"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    pg.execute(&format!("DROP PUBLICATION IF EXISTS {name}"), &[])
        .await
        .expect("drop publication");
}

/// Registers (or updates) a second outbox connector on the running Connect worker, set up as
/// Kafka Connect and Debezium leave it by default: the JSON converter with schemas on, and the
/// jsonb payload column not expanded (so it travels as a string named `io.debezium.data.Json`).
/// It routes to `outbox.wrapped.<aggregatetype>`. Returns once its task runs and its replication
/// slot streams.
async fn wrapped_route(connect: &str, pg: &Client) -> (reqwest::Client, String) {
    let http = reqwest::Client::new();
    sweep_wrapped_routes(&http, connect, pg).await;
    let name = format!("{WRAPPED}_{}", &Uuid::new_v4().simple().to_string()[..12]);
    let config = json!({
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "database.hostname": "127.0.0.1",
        "database.port": "5432",
        "database.user": "postgres",
        "database.password": "",
        "database.dbname": "hookline",
        "topic.prefix": name,
        "plugin.name": "pgoutput",
        "slot.name": name,
        "publication.name": name,
        "publication.autocreate.mode": "filtered",
        "table.include.list": "public.outbox",
        "snapshot.mode": "no_data",
        "tombstones.on.delete": "false",
        "transforms": "outbox",
        "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
        "transforms.outbox.route.by.field": "aggregatetype",
        "transforms.outbox.route.topic.replacement": "outbox.wrapped.${routedByValue}",
        "transforms.outbox.table.field.event.id": "id",
        "transforms.outbox.table.field.event.key": "aggregateid",
        "transforms.outbox.table.field.event.payload": "payload",
        "transforms.outbox.table.fields.additional.placement":
            "type:header:eventType,tenant_id:header:tenant",
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "true",
        "topic.creation.default.replication.factor": "1",
        "topic.creation.default.partitions": "1",
    });
    let url = format!("http://{connect}/connectors/{name}");
    let put = http
        .put(format!("{url}/config"))
        .json(&config)
        .send()
        .await
        .expect("Kafka Connect REST");
    assert!(
        put.status().is_success(),
        "registering {name}: {} {}",
        put.status(),
        put.text().await.unwrap_or_default()
    );
    let deadline = tokio::time::Instant::now() + ARRIVAL_TIMEOUT;
    loop {
        let status = match http.get(format!("{url}/status")).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(e) => e.to_string(),
        };
        let slot_active = pg
            .query_opt(
                "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                &[&name],
            )
            .await
            .expect("pg_replication_slots")
            .is_some_and(|r| r.get::<_, bool>(0));
        if status.contains(r#""tasks":[{"id":0,"state":"RUNNING""#) && slot_active {
            return (http, name);
        }
        assert!(
            !status.contains(r#""state":"FAILED""#),
            "{name} failed: {status}"
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} not running with an active slot within {ARRIVAL_TIMEOUT:?}: {status}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Removes [`wrapped_route`]'s connector `name`, then its slot and publication.
async fn remove_wrapped_route(http: &reqwest::Client, connect: &str, pg: &Client, name: &str) {
    let _ = http
        .delete(format!("http://{connect}/connectors/{name}"))
        .send()
        .await;
    drop_slot_and_publication(pg, name).await;
}

/// Under Kafka Connect's defaults the outbox route wraps the payload in a schema envelope and
/// carries the jsonb column as an escaped string; hookline's fan-out still reads the
/// application's JSON out of it, and delivers that as `data`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_route_on_connect_defaults_gives_hookline_the_application_payload() {
    let bootstrap = require_kafka().await;
    let connect = require_connect().await;
    let pg = postgres().await;
    let (http, name) = wrapped_route(&connect, &pg).await;

    let row = Row::new(&unique("itwrapped"), 7);
    let topic = format!("outbox.wrapped.{}", row.aggregatetype);
    let topics = Topics::create(&bootstrap, &[&topic], 1).await;
    let consumer = consumer_from_start(&bootstrap, &topic);
    insert(&pg, &row).await;
    let msg = next(&consumer, &topic).await;

    let value: Value =
        serde_json::from_slice(msg.payload().expect("a value")).expect("value is JSON");
    assert_eq!(
        value["schema"]["name"], "io.debezium.data.Json",
        "the route wraps the payload: {value}"
    );
    assert!(
        value["payload"].is_string(),
        "the payload is a string: {value}"
    );
    let event = hookline::input::parse_message(
        &hookline::input::InputConfig::default(),
        &msg,
        std::time::SystemTime::now(),
    )
    .expect("hookline reads the wrapped record");
    assert_eq!(event.id.as_str(), row.id.to_string());
    assert_eq!(event.event_type.as_str(), row.event_type);
    let payload: Value = serde_json::from_str(event.payload.get()).expect("payload JSON");
    assert_eq!(payload, row.payload, "the application's JSON, unwrapped");
    let body: Value = serde_json::from_slice(&event.body_bytes()).expect("body JSON");
    assert_eq!(body["data"], row.payload);

    drop(msg);
    drop(consumer);
    remove_wrapped_route(&http, &connect, &pg, &name).await;
    topics.delete().await;
}
