//! Fair intake of a stage's partitions: each assigned partition has its own queue, read by its
//! own task into one small channel, so a backlog is taken a batch per partition in turn.
//!
//! Through the consumer's single queue a stage takes records in the order librdkafka fetched
//! them, and librdkafka decides whether to fetch a partition by the length of that shared queue
//! (`queued.min.messages` counts every partition's records in it). Under a backlog the fetches
//! then cluster on a few partitions at a time: the delivery stage serves only a few endpoints
//! at once, each endpoint's lane runs empty in turn, and the healthy endpoints' rate swings
//! with it. With a queue per partition each
//! partition is fetched by its own queue's length, and the channel's waiting senders are served
//! first come, first served: a reader that has just sent waits behind every other reader that
//! has records.
//!
//! Order within a partition is kept (one reader per partition, one channel). A batch read
//! before its partition was revoked, or from an earlier assignment of it, carries an older
//! generation and is dropped: the partition's new owner reads those records again.
//!
//! The delivery stage reads through it. The fan-out keeps the shared queue: read through the
//! intake, its producer sends more, smaller produce requests for the same bytes, and the
//! broker's CPU for them is what the latency target needs. The delay stage holds each
//! partition's head until due, and pausing is how it waits.

use std::collections::HashMap;
use std::sync::Arc;

use futures::FutureExt;
use rdkafka::consumer::Consumer;
use rdkafka::message::BorrowedMessage;
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinSet};

use crate::stage::{PartitionQueue, RebalanceEvent, StageConsumer, Tp};

/// Records a reader takes from its partition queue per turn, when that many are buffered.
pub const BATCH: usize = 64;

/// Batches that may wait in the channel, besides the one each reader holds while it waits.
/// Small, so the turn order among the readers decides what the stage takes next.
const CHANNEL_BATCHES: usize = 2;

/// At most how many records of a partition the stage takes after pausing it on the record
/// that filled its window: the rest of that record's batch, the partition's batches in the
/// channel, the one its reader holds, and one the reader was taking as the pause came.
/// librdkafka marks the partition's queued records outdated in the pause call itself, so the
/// reader takes none after it.
pub const TAKEN_AFTER_PAUSE: usize = (CHANNEL_BATCHES + 2) * BATCH;

/// Consecutive records of one partition, decoded by its reader.
pub struct Batch<T> {
    /// The partition.
    pub tp: Tp,
    generation: u64,
    /// `(offset, decoded record)`, in offset order.
    pub records: Vec<(i64, T)>,
}

/// The readers of a stage's split partition queues.
pub struct Intake<T> {
    tx: mpsc::Sender<Batch<T>>,
    rx: mpsc::Receiver<Batch<T>>,
    readers: HashMap<Tp, (u64, AbortHandle)>,
    tasks: JoinSet<()>,
    next_generation: u64,
    decode: Decode<T>,
}

/// How a reader turns a record into what the stage takes.
type Decode<T> = Arc<dyn Fn(&BorrowedMessage<'_>) -> T + Send + Sync>;

impl<T: Send + 'static> Intake<T> {
    /// An intake whose readers turn each record into a `T` with `decode` (on the reader's
    /// task, so decoding runs beside the stage loop).
    pub fn new(decode: impl Fn(&BorrowedMessage<'_>) -> T + Send + Sync + 'static) -> Intake<T> {
        let (tx, rx) = mpsc::channel(CHANNEL_BATCHES);
        Intake {
            tx,
            rx,
            readers: HashMap::new(),
            tasks: JoinSet::new(),
            next_generation: 0,
            decode: Arc::new(decode),
        }
    }

    /// Stops the readers of partitions that moved.
    fn apply(&mut self, events: &[RebalanceEvent]) {
        for e in events {
            let (RebalanceEvent::Revoked(tps) | RebalanceEvent::Assigned(tps)) = e;
            for tp in tps {
                if let Some((_, task)) = self.readers.remove(tp) {
                    task.abort();
                }
            }
        }
        while self.tasks.try_join_next().is_some() {}
    }

    /// Starts a reader for each newly split queue (after `apply` of the events that assigned
    /// them).
    fn start(&mut self, queues: Vec<(Tp, PartitionQueue)>) {
        for (tp, queue) in queues {
            self.next_generation += 1;
            let generation = self.next_generation;
            let task = self.tasks.spawn(read(
                queue,
                tp.clone(),
                generation,
                self.tx.clone(),
                self.decode.clone(),
            ));
            if let Some((_, old)) = self.readers.insert(tp, (generation, task)) {
                old.abort();
            }
        }
    }

    /// Follows a rebalance: stops the readers of the partitions its events moved, then starts
    /// readers for the queues `consumer` split meanwhile. Call it with the same events, at the
    /// same time, as the stage forgets those partitions' state.
    pub fn follow(&mut self, consumer: &StageConsumer, events: &[RebalanceEvent]) {
        self.apply(events);
        self.start(consumer.context().take_split());
    }

    /// The next batch, from whichever reader's turn it is. It may be stale: check
    /// [`is_current`](Self::is_current) after applying pending rebalances.
    pub async fn recv(&mut self) -> Batch<T> {
        // The intake holds a sender itself, so the channel never closes.
        self.rx.recv().await.expect("the intake holds a sender")
    }

    /// Whether `batch` comes from its partition's current assignment.
    pub fn is_current(&self, batch: &Batch<T>) -> bool {
        self.readers
            .get(&batch.tp)
            .is_some_and(|(generation, _)| *generation == batch.generation)
    }

    /// Partitions with a reader.
    pub fn partitions(&self) -> usize {
        self.readers.len()
    }

    /// Stops every reader and waits until they are gone, and drops the queues `consumer` split
    /// that no reader took: each holds the consumer.
    pub async fn close(mut self, consumer: &StageConsumer) {
        self.readers.clear();
        self.rx.close();
        self.tasks.shutdown().await;
        drop(consumer.context().take_split());
    }
}

/// A partition's reader: a batch of what is buffered (at least one record), then its turn.
async fn read<T: Send + 'static>(
    queue: PartitionQueue,
    tp: Tp,
    generation: u64,
    tx: mpsc::Sender<Batch<T>>,
    decode: Decode<T>,
) {
    loop {
        let mut records = Vec::with_capacity(BATCH);
        match queue.recv().await {
            Ok(m) => records.push((rdkafka::Message::offset(&m), decode(&m))),
            Err(e) => {
                tracing::warn!(topic = %tp.topic, partition = tp.partition, error = %e, "partition queue error");
                continue;
            }
        }
        while records.len() < BATCH {
            match queue.recv().now_or_never() {
                Some(Ok(m)) => records.push((rdkafka::Message::offset(&m), decode(&m))),
                Some(Err(e)) => {
                    tracing::warn!(topic = %tp.topic, partition = tp.partition, error = %e, "partition queue error");
                    break;
                }
                None => break,
            }
        }
        let batch = Batch {
            tp: tp.clone(),
            generation,
            records,
        };
        if tx.send(batch).await.is_err() {
            return;
        }
    }
}
