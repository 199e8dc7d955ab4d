//! The stages' intake on the real broker: a backlog across partitions is taken a batch per
//! partition in turn, each partition in offset order, every record once; and a partition that
//! moves to another member of the group is read by that member alone from then on.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hookline::intake::Intake;
use hookline::kafka::{HOT_FETCH, stage_consumer_config};
use hookline::stage::{RebalanceEvent, StageConsumer, StageContext};
use rdkafka::Message;
use rdkafka::consumer::Consumer;
use rdkafka::message::BorrowedMessage;
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio_util::sync::CancellationToken;

use super::fixture::{Topics, kafka_config, require_kafka, unique};

const PARTITIONS: i32 = 6;
const PER_PARTITION: usize = 1500;

fn offset_only(_: &BorrowedMessage<'_>) {}

/// `per_partition` records of 1 KiB in each of `partitions` partitions of `topic`.
async fn produce_backlog(bootstrap: &str, topic: &str, partitions: i32, per_partition: usize) {
    let producer: FutureProducer = kafka_config(bootstrap).create().expect("producer");
    let body = vec![b'x'; 1024];
    for p in 0..partitions {
        let sends = (0..per_partition).map(|_| {
            producer.send(
                FutureRecord::<(), _>::to(topic).partition(p).payload(&body),
                Duration::from_secs(10),
            )
        });
        for r in futures::future::join_all(sends).await {
            r.expect("produce");
        }
    }
}

/// A delivery-stage consumer in `group` whose partitions get queues of their own.
fn split_consumer(bootstrap: &str, group: &str) -> Arc<StageConsumer> {
    let consumer: StageConsumer =
        stage_consumer_config(bootstrap, group, HOT_FETCH, &BTreeMap::new())
            .create_with_context(StageContext::new("deliver"))
            .expect("consumer");
    let consumer = Arc::new(consumer);
    consumer.context().split_partitions(&consumer);
    consumer
}

#[tokio::test]
async fn a_backlog_is_taken_a_batch_per_partition_in_turn() {
    let bootstrap = require_kafka().await;
    let topic = unique("it_intake");
    let topics = Topics::create(&bootstrap, &[&topic], PARTITIONS).await;

    // The backlog: 1,500 records of 1 KiB in each partition before the stage starts.
    produce_backlog(&bootstrap, &topic, PARTITIONS, PER_PARTITION).await;
    let consumer = split_consumer(&bootstrap, &unique("it_intake"));
    consumer.subscribe(&[&topic]).expect("subscribe");

    // A reader slower than the fetches, as the delivery stage is under a backlog: what it
    // takes next is what the intake offers, not what the broker happened to send first.
    let total = PER_PARTITION * PARTITIONS as usize;
    let log = Log::default();
    let done = CancellationToken::new();
    let reader = tokio::spawn(member(
        consumer,
        Duration::from_micros(100),
        log.clone(),
        done.clone(),
    ));
    let all_taken = until(|| log.lock().unwrap().len() >= total, &[&reader]).await;
    done.cancel();
    let (_, readers) = reader.await.expect("reader");
    let taken = log.lock().unwrap().clone();
    assert!(all_taken, "took {} of {total} records in 60 s", taken.len());

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
        readers, PARTITIONS as usize,
        "every partition has its own reader"
    );
    topics.delete().await;
}

/// `(partition, offset)` of every record taken, in the order taken, by the members sharing it.
type Log = Arc<Mutex<Vec<(i32, i64)>>>;

/// Waits until `cond` holds, for at most 60 s, or until one of `members` has ended (it failed
/// its check; awaiting it says which). Returns whether `cond` held.
async fn until(
    cond: impl Fn() -> bool,
    members: &[&tokio::task::JoinHandle<(usize, usize)>],
) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !cond() {
        if tokio::time::Instant::now() >= deadline || members.iter().any(|m| m.is_finished()) {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    true
}

/// A member of a delivery group reading through the intake until `done`, `pace` per record
/// taken: it checks that every record it takes is of a partition it owns at that moment, and
/// appends it to `log`. Returns how many records it took, and how many partitions had a
/// reader at the end.
async fn member(
    consumer: Arc<StageConsumer>,
    pace: Duration,
    log: Log,
    done: CancellationToken,
) -> (usize, usize) {
    let mut intake = Intake::new(offset_only);
    let mut owned: HashSet<i32> = HashSet::new();
    let mut taken = 0;
    let follow = |intake: &mut Intake<()>, owned: &mut HashSet<i32>| {
        let events = consumer.context().drain();
        for e in &events {
            match e {
                RebalanceEvent::Assigned(tps) => owned.extend(tps.iter().map(|tp| tp.partition)),
                RebalanceEvent::Revoked(tps) => {
                    for tp in tps {
                        owned.remove(&tp.partition);
                    }
                }
            }
        }
        intake.follow(&consumer, &events);
    };
    loop {
        let records: Vec<(i32, i64)> = tokio::select! {
            () = done.cancelled() => break,
            batch = intake.recv() => {
                follow(&mut intake, &mut owned);
                if !intake.is_current(&batch) {
                    continue;
                }
                batch.records.iter().map(|(offset, ())| (batch.tp.partition, *offset)).collect()
            }
            m = consumer.recv() => {
                let m = m.expect("consumer error");
                follow(&mut intake, &mut owned);
                vec![(m.partition(), m.offset())]
            }
            () = tokio::time::sleep(Duration::from_millis(50)) => {
                follow(&mut intake, &mut owned);
                vec![]
            }
        };
        for &(p, offset) in &records {
            assert!(
                owned.contains(&p),
                "took offset {offset} of partition {p}, which it does not own ({owned:?})"
            );
        }
        tokio::time::sleep(pace * records.len() as u32).await;
        taken += records.len();
        log.lock().unwrap().extend(records);
    }
    let readers = intake.partitions();
    intake.close(&consumer).await;
    (taken, readers)
}

#[tokio::test]
async fn a_partition_handed_to_a_new_member_is_read_by_it_alone_from_then_on() {
    const PARTS: i32 = 4;
    const PER: usize = 1000;
    let bootstrap = require_kafka().await;
    let topic = unique("it_intake_rebalance");
    let group = unique("it_intake_rebalance");
    let topics = Topics::create(&bootstrap, &[&topic], PARTS).await;
    produce_backlog(&bootstrap, &topic, PARTS, PER).await;

    // The first member reads slowly (2 ms a record), so the backlog outlasts the rebalance
    // the second member's arrival starts. Neither stores offsets, so the second reads the
    // partitions it gets from their start.
    let log = Log::default();
    let done = CancellationToken::new();
    let a = split_consumer(&bootstrap, &group);
    a.subscribe(&[&topic]).expect("subscribe");
    let first = tokio::spawn(member(
        a,
        Duration::from_millis(2),
        log.clone(),
        done.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let b = split_consumer(&bootstrap, &group);
    b.subscribe(&[&topic]).expect("subscribe");
    let second = tokio::spawn(member(b, Duration::ZERO, log.clone(), done.clone()));

    // Offsets taken by either member, by partition.
    let seen = || {
        let mut seen: HashMap<i32, BTreeSet<i64>> = HashMap::new();
        for &(p, offset) in log.lock().unwrap().iter() {
            seen.entry(p).or_default().insert(offset);
        }
        seen
    };
    let total = || seen().values().map(BTreeSet::len).sum::<usize>();
    until(|| total() >= PARTS as usize * PER, &[&first, &second]).await;
    done.cancel();
    let (by_first, _) = first.await.expect("first member");
    let (by_second, _) = second.await.expect("second member");
    assert!(by_second > 0, "the second member took no record");
    let seen = seen();
    for p in 0..PARTS {
        let n = seen.get(&p).map_or(0, BTreeSet::len);
        assert_eq!(
            n, PER,
            "partition {p}: {n} of {PER} offsets taken by either member (first took {by_first}, second {by_second})"
        );
    }
    topics.delete().await;
}
