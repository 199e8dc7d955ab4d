//! The broker as hookline's stages use it: consumer groups that commit only what they settled,
//! and transactions whose aborted writes no read_committed consumer ever sees.

use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

use super::fixture::{Topics, kafka_config, require_kafka, unique};

/// A record that does not arrive within this long is not coming.
const RECV_TIMEOUT: Duration = Duration::from_secs(20);

fn group_consumer(bootstrap: &str, group: &str) -> StreamConsumer {
    kafka_config(bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "10000")
        .create()
        .expect("Kafka consumer")
}

async fn recv_payload(consumer: &StreamConsumer) -> (i64, String) {
    let msg = tokio::time::timeout(RECV_TIMEOUT, consumer.recv())
        .await
        .expect("no record within the receive timeout")
        .expect("consumer error");
    let payload = String::from_utf8(msg.payload().expect("payload").to_vec()).expect("utf-8");
    (msg.offset(), payload)
}

#[tokio::test]
async fn group_resumes_after_its_committed_offset() {
    let bootstrap = require_kafka().await;
    let topic = unique("it_group");
    let group = unique("it_group");
    let topics = Topics::create(&bootstrap, &[&topic], 1).await;

    let producer: FutureProducer = kafka_config(&bootstrap).create().expect("producer");
    for i in 0..10 {
        let payload = format!("record-{i}");
        producer
            .send(
                FutureRecord::to(&topic).key("k").payload(&payload),
                Duration::from_secs(10),
            )
            .await
            .expect("produce");
    }

    // The first member settles five records and commits exactly up to the fifth.
    {
        let first = group_consumer(&bootstrap, &group);
        first.subscribe(&[&topic]).expect("subscribe");
        for i in 0..5 {
            let msg = tokio::time::timeout(RECV_TIMEOUT, first.recv())
                .await
                .expect("first member got no record")
                .expect("consumer error");
            assert_eq!(msg.payload(), Some(format!("record-{i}").as_bytes()));
            if i == 4 {
                first
                    .commit_message(&msg, CommitMode::Sync)
                    .expect("commit");
            }
        }
        let committed = first
            .committed(Duration::from_secs(10))
            .expect("read committed offsets");
        let offset = committed
            .find_partition(&topic, 0)
            .expect("partition 0 committed")
            .offset();
        // Kafka stores the next offset to read, not the last one settled.
        assert_eq!(offset, Offset::Offset(5));
    }

    // A new member of the same group (the first has left) resumes right after the commit.
    let second = group_consumer(&bootstrap, &group);
    second.subscribe(&[&topic]).expect("subscribe");
    let (offset, payload) = recv_payload(&second).await;
    assert_eq!((offset, payload.as_str()), (5, "record-5"));
    drop(second);

    topics.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_committed_sees_committed_transactions_only() {
    let bootstrap = require_kafka().await;
    let topic = unique("it_tx");
    let topics = Topics::create(&bootstrap, &[&topic], 1).await;

    let producer: FutureProducer = kafka_config(&bootstrap)
        .set("transactional.id", unique("it_tx"))
        .set("transaction.timeout.ms", "30000")
        .create()
        .expect("transactional producer");
    // The transaction calls block on the broker; let this worker thread do so.
    tokio::task::block_in_place(|| producer.init_transactions(Duration::from_secs(30)))
        .expect("init_transactions");

    producer.begin_transaction().expect("begin");
    for payload in ["aborted-0", "aborted-1"] {
        producer
            .send(
                FutureRecord::to(&topic).key("k").payload(payload),
                Duration::from_secs(10),
            )
            .await
            .expect("produce in aborted transaction");
    }
    tokio::task::block_in_place(|| producer.abort_transaction(Duration::from_secs(30)))
        .expect("abort");

    producer.begin_transaction().expect("begin");
    for payload in ["committed-0", "committed-1"] {
        producer
            .send(
                FutureRecord::to(&topic).key("k").payload(payload),
                Duration::from_secs(10),
            )
            .await
            .expect("produce in committed transaction");
    }
    tokio::task::block_in_place(|| producer.commit_transaction(Duration::from_secs(30)))
        .expect("commit");

    let consumer: StreamConsumer = kafka_config(&bootstrap)
        .set("group.id", unique("it_tx"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, Offset::Beginning)
        .expect("partition");
    consumer.assign(&tpl).expect("assign");

    // The aborted records sit before the committed ones in the log, so reading the committed
    // pair first proves the aborted pair was skipped.
    let (_, first) = recv_payload(&consumer).await;
    let (_, second) = recv_payload(&consumer).await;
    assert_eq!(
        [first.as_str(), second.as_str()],
        ["committed-0", "committed-1"]
    );

    topics.delete().await;
}
