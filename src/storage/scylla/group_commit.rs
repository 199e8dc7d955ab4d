//! Group commit for the index tables: rows of one CQL partition that arrive while a write to
//! that partition is in flight go together as the next single-partition UNLOGGED batch.
//!
//! A CQL node's cost of a write follows the mutations it applies, not the requests it answers,
//! and a batch whose rows share one partition is one mutation (one commit-log entry, one
//! memtable update). So the history rows of one (endpoint, minute), or the event-index rows of one
//! event, cost about one write however many go together. Batches spanning partitions gain
//! nothing: the coordinator splits them per partition.
//!
//! There is no timer. A row for a partition with nothing in flight is sent at once; rows that
//! find a write of their partition in flight wait for it and go in the next batch. With at most
//! one write per partition in flight, the load sets the batch size and an idle store adds no
//! latency.
//!
//! A partition with rows to write has a run: a spawned task that takes a permit of the store's
//! request semaphore, takes the waiting rows (at most [`MAX_ROWS`], about [`MAX_BATCH_BYTES`]),
//! sends them as one request, hands the outcome to every caller whose row went in it, and goes
//! on until no row of its partition waits. Each caller awaits only the answer for its own row,
//! so dropping a caller drops an answer, never a row: the run, not the caller, owns the write.
//! A run that stops early (a panic, a runtime shutting down) fails its waiting callers instead
//! of leaving them waiting, and the next row for its partition starts a new run.
//!
//! The number of waiting rows is bounded by the callers awaiting them; nothing here grows on
//! its own. Runs are not registered with the service's task tracker: a run lives only while
//! rows of its partition wait, each such row has a caller, and the tracker already drains the
//! callers.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use tokio::sync::{Semaphore, oneshot};

use crate::storage::StoreError;

/// Most rows in one batch.
pub const MAX_ROWS: usize = 64;
/// Most estimated bytes in one batch ([`PartitionRow::size`]), below the 5 KiB at which
/// Cassandra (`batch_size_warn_threshold`) and ScyllaDB log a warning for every batch.
pub const MAX_BATCH_BYTES: usize = 4 * 1024;

/// A row of a table written through [`GroupCommit`].
pub trait PartitionRow: Send + 'static {
    /// The row's partition key.
    type Key: Hash + Eq + Clone + Send + Sync + 'static;
    /// The row's partition.
    fn partition(&self) -> Self::Key;
    /// About how many bytes the row adds to a batch as the server counts them for its size
    /// threshold: clustering and cell values, plus 16 bytes of write time and TTL per cell.
    fn size(&self) -> usize;
}

/// Sends the rows of one partition as one request.
#[async_trait]
pub trait BatchWrite<R>: Send + Sync + 'static {
    /// Writes `rows` (one or more, all of one partition); they are durable when it returns
    /// `Ok`.
    async fn write(&self, rows: Vec<R>) -> Result<(), StoreError>;
}

/// One table's group-commit writer. See the module documentation.
pub struct GroupCommit<R: PartitionRow> {
    shared: Arc<Shared<R>>,
}

struct Shared<R: PartitionRow> {
    writer: Box<dyn BatchWrite<R>>,
    permits: Arc<Semaphore>,
    /// The rows waiting per partition. A key is present exactly while its partition has a run.
    waiting: Mutex<HashMap<R::Key, VecDeque<Waiter<R>>>>,
}

struct Waiter<R> {
    row: R,
    answer: oneshot::Sender<Result<(), StoreError>>,
}

impl<R: PartitionRow> Shared<R> {
    fn waiting(&self) -> MutexGuard<'_, HashMap<R::Key, VecDeque<Waiter<R>>>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<R: PartitionRow> GroupCommit<R> {
    /// A writer sending through `writer`, each request under one permit of `permits`.
    pub fn new(writer: impl BatchWrite<R>, permits: Arc<Semaphore>) -> GroupCommit<R> {
        GroupCommit {
            shared: Arc::new(Shared {
                writer: Box::new(writer),
                permits,
                waiting: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Writes `row` with whatever else of its partition is waiting; returns the outcome of the
    /// request it went in. Must be called within a tokio runtime.
    pub async fn write(&self, row: R) -> Result<(), StoreError> {
        let key = row.partition();
        let (answer, outcome) = oneshot::channel();
        let waiter = Waiter { row, answer };
        let start_run = match self.shared.waiting().entry(key.clone()) {
            Entry::Occupied(mut queue) => {
                queue.get_mut().push_back(waiter);
                false
            }
            Entry::Vacant(slot) => {
                slot.insert(VecDeque::from([waiter]));
                true
            }
        };
        if start_run {
            tokio::spawn(run(self.shared.clone(), key));
        }
        outcome.await.unwrap_or_else(|_| {
            Err(StoreError::Unavailable(
                "the write of this row's batch was abandoned".into(),
            ))
        })
    }

    /// Partitions with a run (rows waiting or in flight).
    #[cfg(test)]
    fn runs(&self) -> usize {
        self.shared.waiting().len()
    }
}

/// Writes the partition's waiting rows, batch after batch, until none is left.
async fn run<R: PartitionRow>(shared: Arc<Shared<R>>, key: R::Key) {
    let mut guard = RunGuard {
        shared: &shared,
        key: &key,
        finished: false,
    };
    loop {
        {
            let mut waiting = shared.waiting();
            if waiting.get(&key).is_none_or(VecDeque::is_empty) {
                waiting.remove(&key);
                guard.finished = true;
                return;
            }
        }
        // Rows arriving while the permit is awaited join this batch.
        let permit = shared.permits.clone().acquire_owned().await;
        let batch = take_batch(shared.waiting().get_mut(&key));
        if batch.is_empty() {
            continue;
        }
        let (rows, answers): (Vec<R>, Vec<_>) =
            batch.into_iter().map(|w| (w.row, w.answer)).unzip();
        let outcome = match permit {
            Ok(_permit) => shared.writer.write(rows).await,
            Err(_) => Err(StoreError::Unavailable("store is shutting down".into())),
        };
        for answer in answers {
            // A caller that went away no longer wants its answer; its row was written anyway.
            let _ = answer.send(outcome.clone());
        }
    }
}

/// The oldest waiting rows, as many as fit in one batch (at least one).
fn take_batch<R: PartitionRow>(queue: Option<&mut VecDeque<Waiter<R>>>) -> Vec<Waiter<R>> {
    let Some(queue) = queue else {
        return Vec::new();
    };
    let mut bytes = 0;
    let mut count = 0;
    for waiter in queue.iter() {
        bytes += waiter.row.size();
        if count == MAX_ROWS || (count > 0 && bytes > MAX_BATCH_BYTES) {
            break;
        }
        count += 1;
    }
    queue.drain(..count).collect()
}

/// Ends a run that stopped before its queue was empty (a panic in the writer, the runtime
/// dropping the task): its waiting callers get an error (their answer senders drop) rather than
/// wait forever, and the partition's next row starts a new run.
struct RunGuard<'a, R: PartitionRow> {
    shared: &'a Shared<R>,
    key: &'a R::Key,
    finished: bool,
}

impl<R: PartitionRow> Drop for RunGuard<'_, R> {
    fn drop(&mut self) {
        if !self.finished {
            self.shared.waiting().remove(self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use futures::future::join_all;
    use tokio::sync::Notify;

    use super::*;

    #[derive(Debug, Clone, PartialEq)]
    struct Row {
        partition: u32,
        n: u32,
        size: usize,
    }

    impl PartitionRow for Row {
        type Key = u32;
        fn partition(&self) -> u32 {
            self.partition
        }
        fn size(&self) -> usize {
            self.size
        }
    }

    fn row(partition: u32, n: u32) -> Row {
        Row {
            partition,
            n,
            size: 10,
        }
    }

    /// A table in memory: records every request; while `held`, requests wait for `release`;
    /// rows whose `n` is in `fail` fail their whole batch; a row numbered `PANIC` panics.
    #[derive(Default)]
    struct Table {
        written: Mutex<Vec<Row>>,
        batches: Mutex<Vec<Vec<u32>>>,
        fail: Mutex<Vec<u32>>,
        held: std::sync::atomic::AtomicBool,
        release: Notify,
        in_flight: AtomicUsize,
        most_in_flight: AtomicUsize,
    }

    const PANIC: u32 = 666;

    struct Writer(Arc<Table>);

    #[async_trait]
    impl BatchWrite<Row> for Writer {
        async fn write(&self, rows: Vec<Row>) -> Result<(), StoreError> {
            let t = &self.0;
            let now = t.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            t.most_in_flight.fetch_max(now, Ordering::SeqCst);
            assert!(
                rows.iter().all(|r| r.partition == rows[0].partition),
                "one partition per batch"
            );
            t.batches
                .lock()
                .unwrap()
                .push(rows.iter().map(|r| r.n).collect());
            if t.held.load(Ordering::SeqCst) {
                t.release.notified().await;
            }
            t.in_flight.fetch_sub(1, Ordering::SeqCst);
            if rows.iter().any(|r| r.n == PANIC) {
                panic!("writer failed hard");
            }
            let fail = t.fail.lock().unwrap().clone();
            if rows.iter().any(|r| fail.contains(&r.n)) {
                return Err(StoreError::Backend("rejected".into()));
            }
            t.written.lock().unwrap().extend(rows);
            Ok(())
        }
    }

    type Call = tokio::task::JoinHandle<Result<(), StoreError>>;

    impl Table {
        /// From now on requests wait until [`Table::release`].
        fn hold(&self) {
            self.held.store(true, Ordering::SeqCst);
        }

        /// Lets the waiting requests and every later one through.
        fn release(&self) {
            self.held.store(false, Ordering::SeqCst);
            self.release.notify_waiters();
        }

        /// The numbers of the rows written, sorted.
        fn written(&self) -> Vec<u32> {
            let mut n: Vec<u32> = self.written.lock().unwrap().iter().map(|r| r.n).collect();
            n.sort();
            n
        }

        fn batch_sizes(&self) -> Vec<usize> {
            self.batches.lock().unwrap().iter().map(Vec::len).collect()
        }
    }

    fn commit(permits: usize) -> (Arc<GroupCommit<Row>>, Arc<Table>) {
        let table = Arc::new(Table::default());
        let gc = GroupCommit::new(Writer(table.clone()), Arc::new(Semaphore::new(permits)));
        (Arc::new(gc), table)
    }

    /// A caller in its own task, so that it can be dropped (aborted) wherever it is.
    fn call(gc: &Arc<GroupCommit<Row>>, row: Row) -> Call {
        let gc = gc.clone();
        tokio::spawn(async move { gc.write(row).await })
    }

    /// Lets spawned tasks and parked callers run until nothing is left to do.
    async fn settle() {
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
    }

    async fn answers(calls: Vec<Call>) -> Vec<Result<(), StoreError>> {
        join_all(calls)
            .await
            .into_iter()
            .map(|c| c.expect("caller task"))
            .collect()
    }

    #[tokio::test]
    async fn a_lone_row_goes_at_once_alone() {
        let (gc, table) = commit(4);
        gc.write(row(1, 1)).await.unwrap();
        assert_eq!(*table.batches.lock().unwrap(), [vec![1]]);
        assert_eq!(gc.runs(), 0, "the run ends with its queue");
        gc.write(row(1, 2)).await.unwrap();
        assert_eq!(table.written(), [1, 2]);
    }

    #[tokio::test]
    async fn rows_arriving_during_a_write_go_together_and_are_written_when_answered() {
        let (gc, table) = commit(4);
        table.hold();
        let first = call(&gc, row(7, 0));
        settle().await;
        assert_eq!(*table.batches.lock().unwrap(), [vec![0]], "sent at once");
        // 100 rows of the partition and one of another arrive while row 0 is in flight; each
        // caller checks, the moment it is answered, that its row is in the table.
        let mut later: Vec<Call> = (1..=100)
            .map(|n| (7, n))
            .chain([(8, 1000)])
            .map(|(p, n)| {
                let (gc, table) = (gc.clone(), table.clone());
                tokio::spawn(async move {
                    gc.write(row(p, n)).await?;
                    let written = table.written.lock().unwrap().iter().any(|r| r.n == n);
                    assert!(written, "row {n} answered Ok before it was written");
                    Ok(())
                })
            })
            .collect();
        settle().await;
        assert_eq!(
            table.batches.lock().unwrap().len(),
            2,
            "the other partition does not wait; partition 7 waits for its write in flight"
        );
        table.release();
        later.push(first);
        assert!(answers(later).await.iter().all(Result::is_ok));
        let batches = table.batches.lock().unwrap().clone();
        let sevens: Vec<usize> = batches
            .iter()
            .filter(|b| b[0] < 1000)
            .map(Vec::len)
            .collect();
        assert_eq!(sevens, [1, MAX_ROWS, 100 - MAX_ROWS], "{batches:?}");
        let mut all: Vec<u32> = (0..=100).collect();
        all.push(1000);
        assert_eq!(table.written(), all);
        assert_eq!(gc.runs(), 0);
    }

    #[tokio::test]
    async fn batches_stay_under_the_byte_budget() {
        let (gc, table) = commit(4);
        table.hold();
        let big = |n, size| Row {
            partition: 1,
            n,
            size,
        };
        let mut calls = vec![call(&gc, big(0, MAX_BATCH_BYTES / 3))];
        settle().await;
        calls.extend((1..7).map(|n| call(&gc, big(n, MAX_BATCH_BYTES / 3))));
        settle().await;
        table.release();
        assert!(answers(calls).await.iter().all(Result::is_ok));
        assert_eq!(table.batch_sizes(), [1, 3, 3]);
        // A row bigger than the budget still goes, alone.
        gc.write(big(9, MAX_BATCH_BYTES * 2)).await.unwrap();
        assert_eq!(table.written(), [0, 1, 2, 3, 4, 5, 6, 9]);
    }

    #[tokio::test]
    async fn an_error_fails_every_caller_of_its_batch_and_later_rows_still_go() {
        let (gc, table) = commit(4);
        table.fail.lock().unwrap().push(3);
        table.hold();
        let first = call(&gc, row(1, 0));
        settle().await;
        // 1..=5 wait for row 0 and go together; row 3 makes that batch fail.
        let batch: Vec<Call> = (1..=5).map(|n| call(&gc, row(1, n))).collect();
        settle().await;
        table.release();
        first.await.unwrap().unwrap();
        for (n, outcome) in (1..=5).zip(answers(batch).await) {
            let err = outcome.unwrap_err();
            assert!(matches!(err, StoreError::Backend(_)), "row {n}: {err:?}");
        }
        gc.write(row(1, 6)).await.unwrap();
        assert_eq!(table.written(), [0, 6]);
        assert_eq!(gc.runs(), 0);
    }

    #[tokio::test]
    async fn a_dropped_caller_loses_no_other_callers_row() {
        let (gc, table) = commit(4);
        table.hold();
        // The caller whose row started the run, and one whose row waits, both go away.
        let starter = call(&gc, row(1, 0));
        settle().await;
        let waiting = call(&gc, row(1, 1));
        let others: Vec<Call> = (2..10).map(|n| call(&gc, row(1, n))).collect();
        settle().await;
        starter.abort();
        waiting.abort();
        settle().await;
        table.release();
        assert!(answers(others).await.iter().all(Result::is_ok));
        assert_eq!(table.written(), (0..10).collect::<Vec<_>>());
        assert_eq!(gc.runs(), 0);
    }

    #[tokio::test]
    async fn a_run_that_dies_fails_its_callers_and_the_partition_recovers() {
        let (gc, table) = commit(4);
        table.hold();
        let doomed = call(&gc, row(1, PANIC));
        settle().await;
        let waiting = call(&gc, row(1, 1));
        settle().await;
        table.release();
        assert!(doomed.await.unwrap().is_err());
        assert!(
            waiting.await.unwrap().is_err(),
            "fails rather than waits forever"
        );
        assert_eq!(gc.runs(), 0);
        gc.write(row(1, 2)).await.unwrap();
        assert_eq!(table.written(), [2]);
    }

    #[tokio::test]
    async fn requests_never_exceed_the_permits() {
        let (gc, table) = commit(2);
        table.hold();
        let calls: Vec<Call> = (0..20).map(|p| call(&gc, row(p, p))).collect();
        settle().await;
        assert_eq!(table.in_flight.load(Ordering::SeqCst), 2);
        table.release();
        tokio::time::timeout(Duration::from_secs(10), answers(calls))
            .await
            .expect("every call answered");
        assert_eq!(table.most_in_flight.load(Ordering::SeqCst), 2);
        assert_eq!(table.written(), (0..20).collect::<Vec<_>>());
    }
}
