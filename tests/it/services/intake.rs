//! The delivery stage's intake on the real broker: a backlog across partitions is taken a batch
//! per partition in turn, each partition in offset order, every record once.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use hookline::intake::Intake;
use hookline::kafka::{HOT_FETCH, stage_consumer_config};
use hookline::stage::{StageConsumer, StageContext};
use rdkafka::Message;
use rdkafka::consumer::Consumer;
use rdkafka::message::BorrowedMessage;
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::fixture::{Topics, kafka_config, require_kafka, unique};

const PARTITIONS: i32 = 6;
const PER_PARTITION: usize = 1500;

fn offset_only(_: &BorrowedMessage<'_>) {}

#[tokio::test]
async fn a_backlog_is_taken_a_batch_per_partition_in_turn() {
    let bootstrap = require_kafka().await;
    let topic = unique("it_intake");
    let topics = Topics::create(&bootstrap, &[&topic], PARTITIONS).await;

    // The backlog: 1,500 records of 1 KiB in each partition before the stage starts.
    let producer: FutureProducer = kafka_config(&bootstrap).create().expect("producer");
    let body = vec![b'x'; 1024];
    for p in 0..PARTITIONS {
        let sends = (0..PER_PARTITION).map(|_| {
            producer.send(
                FutureRecord::<(), _>::to(&topic)
                    .partition(p)
                    .payload(&body),
                Duration::from_secs(10),
            )
        });
        for r in futures::future::join_all(sends).await {
            r.expect("produce");
        }
    }

    let consumer: StageConsumer = stage_consumer_config(
        &bootstrap,
        &unique("it_intake"),
        HOT_FETCH,
        &BTreeMap::new(),
    )
    .create_with_context(StageContext::new("deliver"))
    .expect("consumer");
    let consumer = Arc::new(consumer);
    consumer.context().split_partitions(&consumer);
    consumer.subscribe(&[&topic]).expect("subscribe");
    let mut intake = Intake::new(offset_only);

    // A reader slower than the fetches, as the delivery stage is under a backlog: what it
    // takes next is what the intake offers, not what the broker happened to send first.
    let total = PER_PARTITION * PARTITIONS as usize;
    let mut taken: Vec<(i32, i64)> = Vec::with_capacity(total);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while taken.len() < total {
        let records: Vec<(i32, i64)> = tokio::select! {
            batch = intake.recv() => {
                intake.follow(&consumer, &consumer.context().drain());
                if !intake.is_current(&batch) {
                    continue;
                }
                batch.records.iter().map(|(offset, ())| (batch.tp.1, *offset)).collect()
            }
            m = consumer.recv() => {
                let m = m.expect("consumer error");
                vec![(m.partition(), m.offset())]
            }
            () = tokio::time::sleep(Duration::from_millis(100)) => {
                intake.follow(&consumer, &consumer.context().drain());
                vec![]
            }
            () = tokio::time::sleep_until(deadline) => panic!(
                "took {} of {total} records in 60 s", taken.len()
            ),
        };
        tokio::time::sleep(Duration::from_micros(100) * records.len() as u32).await;
        taken.extend(records);
    }

    // Every record once, each partition in offset order.
    let mut next: HashMap<i32, i64> = HashMap::new();
    for &(p, offset) in &taken {
        let expected = next.entry(p).or_insert(0);
        assert_eq!(offset, *expected, "partition {p} out of order");
        *expected += 1;
    }
    assert!(
        next.values().all(|n| *n == PER_PARTITION as i64),
        "{next:?}"
    );

    // In the first quarter taken, every partition had its share: a fair intake gives each
    // partition a sixth of it (375); through one shared queue some got none.
    let mut first_quarter: HashMap<i32, usize> = HashMap::new();
    for &(p, _) in &taken[..total / 4] {
        *first_quarter.entry(p).or_default() += 1;
    }
    for p in 0..PARTITIONS {
        let n = first_quarter.get(&p).copied().unwrap_or(0);
        assert!(
            n >= 150,
            "partition {p} had {n} of the first {} records taken: {first_quarter:?}",
            total / 4
        );
    }
    assert_eq!(
        intake.partitions(),
        PARTITIONS as usize,
        "every partition has its own reader"
    );
    intake.close(&consumer).await;
    topics.delete().await;
}
