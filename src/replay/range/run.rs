//! Running a checked range replay: reading the DLQ, sending each dead letter in the range
//! through the window, and recording the audit entry of what was covered.

use std::time::{Duration, Instant, SystemTime};

use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use rdkafka::Message;
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;

use super::super::audit::{new_replay_id, record_audit};
use super::super::consumer::{POLL_WAIT, read_error_is_final};
use super::super::error::past_count;
use super::super::republisher::Republisher;
use super::super::{
    Incomplete, ReplayError, ReplayRequest, ReplaySummary, ReplayTarget, StopCause,
};
use super::window::{Covered, SEND_STEP, Sent, Window, send};
use super::{Checked, Progress};
use crate::record::DeliveryRecord;
use crate::storage::{DeliveryStore, ReplayAudit, StoreError};
use crate::telemetry;

/// What a range replay has counted, as it reads records and their sends settle.
struct Tally {
    summary: ReplaySummary,
    covered: Covered,
    window: Window,
}

impl Tally {
    /// Counts a finished send: the record's offset, and how its send ended.
    fn settle(&mut self, (offset, sent): (i64, Sent)) {
        self.window
            .settle(offset, sent, &mut self.summary, &mut self.covered);
    }

    /// How the replay ended, given why the reader stopped (if it did) and the first offset it
    /// did not read. A failed send stops the replay at its offset, below anything the reader
    /// reached.
    fn end(mut self, read_stop: Option<StopCause>, next: i64) -> Ended {
        let stop = match self.window.failed.take() {
            Some((offset, cause)) => Some(Stop {
                cause,
                resume_from: offset,
                past: self.window.sent_past(offset),
            }),
            None => read_stop.map(|cause| Stop {
                cause,
                resume_from: next,
                past: 0,
            }),
        };
        Ended {
            summary: self.summary,
            covered: self.covered,
            stop,
        }
    }
}

/// Where a range replay's reader is in the DLQ.
struct Reader {
    /// The first offset the reader has not read: past every record read, each of them
    /// covered (filtered, skipped, counted) or among the window's sends.
    next: i64,
    /// When the DLQ last handed a record over, moved on by the time spent waiting for sends.
    heard_at: Instant,
    /// The latest error the consumer reported since the last record: librdkafka goes on
    /// fetching after most of them, so they stop the replay only once it has gone idle.
    failing: Option<KafkaError>,
}

/// What one poll of the DLQ gave the reader.
enum Polled<'c> {
    /// A record.
    Record(BorrowedMessage<'c>),
    /// Nothing to read yet; the rest of the range may still come.
    Nothing,
    /// The reading stops here.
    Stop(StopCause),
}

/// Where a range replay that stopped short stopped, and why.
struct Stop {
    cause: StopCause,
    /// The first offset not covered, where a new replay resumes.
    resume_from: i64,
    /// How many records after `resume_from` were republished all the same.
    past: u64,
}

/// What a range replay's reading and sending came to.
struct Ended {
    summary: ReplaySummary,
    covered: Covered,
    /// `None` when it reached the end of its range.
    stop: Option<Stop>,
}

impl Checked<'_> {
    /// Republishes the checked range (unless a dry run) and records the audit entry in `store`.
    /// A replay that stops short of the range's end fails with [`ReplayError::Incomplete`],
    /// after recording an audit entry for the part it covered.
    pub async fn run<P: Progress + ?Sized>(
        self,
        store: &dyn DeliveryStore,
        progress: &mut P,
    ) -> Result<ReplaySummary, ReplayError> {
        let replay_id = new_replay_id();
        let republisher = Republisher::new(self.target)?;
        let Ended {
            summary,
            covered,
            stop,
        } = self
            .send_range(store, &republisher, &replay_id, progress)
            .await;
        if !self.request.dry_run {
            telemetry::replayed(summary.replayed);
        }
        let audit = ReplayAudit {
            replay_id,
            actor: self.request.actor.clone(),
            reason: self.request.reason.clone(),
            at: SystemTime::now(),
            scope: scope(self.target, self.request, self.last, stop.as_ref()),
            count: summary.replayed,
            dry_run: self.request.dry_run,
            // A range of DLQ offsets may hold many tenants' deliveries: it is theirs to read
            // only when it held one tenant's alone (an endpoint's, say).
            tenant: covered.tenant(),
            asked_by: self.asked_by.clone(),
        };
        let recorded = record_audit(store, &audit).await;
        self.outcome(summary, stop, recorded)
    }

    /// Reads the range and sends each dead letter in it through the window, until the range
    /// ends or the reading stops; then lets the sends under way finish.
    async fn send_range<P: Progress + ?Sized>(
        &self,
        store: &dyn DeliveryStore,
        republisher: &Republisher,
        replay_id: &str,
        progress: &mut P,
    ) -> Ended {
        let mut tally = Tally {
            summary: ReplaySummary {
                replay_id: replay_id.to_owned(),
                scanned: 0,
                replayed: 0,
                filtered: 0,
                undecodable: 0,
                skipped_being_replayed: 0,
                last_offset: self.last,
            },
            covered: Covered::default(),
            window: Window::new(self.window),
        };
        let mut reader = Reader {
            next: self.request.from_offset,
            heard_at: Instant::now(),
            failing: None,
        };
        let mut sends = FuturesUnordered::new();
        let read_stop = loop {
            // Take in the sends that finished; after a failed one, read no further.
            while let Some(Some(done)) = sends.next().now_or_never() {
                tally.settle(done);
            }
            if tally.window.failed.is_some() || reader.next > self.last {
                break None;
            }
            if tally.window.is_full(reader.next) {
                // Waiting for a send is not waiting for the DLQ: it does not count towards the
                // idle limit.
                let waiting = Instant::now();
                if let Some(done) = sends.next().await {
                    tally.settle(done);
                }
                reader.heard_at += waiting.elapsed();
                continue;
            }
            let busy = !sends.is_empty();
            let msg = match self.poll(&mut reader, busy) {
                Polled::Record(msg) => msg,
                Polled::Stop(cause) => break Some(cause),
                Polled::Nothing => {
                    if busy {
                        // Nothing to read at once: give the sends a moment instead.
                        let left = self.idle_limit.saturating_sub(reader.heard_at.elapsed());
                        let step = left.min(SEND_STEP);
                        if let Ok(Some(done)) = tokio::time::timeout(step, sends.next()).await {
                            tally.settle(done);
                        }
                    }
                    continue;
                }
            };
            reader.heard_at = Instant::now();
            reader.failing = None;
            reader.next = msg.offset() + 1;
            if msg.offset() > self.last {
                break None;
            }
            let Some(record) = self.admit(&msg, &mut tally, progress) else {
                continue;
            };
            let offset = msg.offset();
            tally.window.in_flight.insert(offset);
            let deadline = self.publish_deadline;
            sends.push(async move {
                let sent = send(store, republisher, record, replay_id, deadline).await;
                (offset, sent)
            });
        };
        // Let the sends under way finish: each was claimed, and may already be on its way.
        while let Some(done) = sends.next().await {
            tally.settle(done);
        }
        drop(sends);
        tally.end(read_stop, reader.next)
    }

    /// Polls the DLQ once: without waiting while sends are under way (`busy`), else for what
    /// is left of the idle limit, up to [`POLL_WAIT`]. Once the idle limit has passed with
    /// nothing read, the reading stops, on the last error the consumer reported if any.
    fn poll(&self, reader: &mut Reader, busy: bool) -> Polled<'_> {
        let wait = if busy {
            Duration::ZERO
        } else {
            self.idle_limit
                .saturating_sub(reader.heard_at.elapsed())
                .min(POLL_WAIT)
        };
        let read_failed = |source| StopCause::Read {
            bootstrap: self.target.bootstrap.clone(),
            source,
        };
        // The consumer's poll blocks; keep it off the async workers' backs.
        match tokio::task::block_in_place(|| self.consumer.poll(wait)) {
            Some(Ok(m)) => return Polled::Record(m),
            Some(Err(source)) if read_error_is_final(&source) => {
                return Polled::Stop(read_failed(source));
            }
            // Nothing yet; the end of partition before `last`, which is the end of what the
            // replica being read holds so far (a follower behind its leader); or an error
            // librdkafka retries by itself. The rest of the range may still come, within the
            // idle limit; past it, the replay stops on the last such error, if any.
            Some(Err(source)) if !matches!(source, KafkaError::PartitionEOF(_)) => {
                tracing::warn!(error = %source, partition = self.request.partition,
                    offset = reader.next, "reading the DLQ failed; retrying");
                reader.failing = Some(source);
            }
            Some(Err(_)) | None => {}
        }
        if reader.heard_at.elapsed() >= self.idle_limit {
            let cause = reader
                .failing
                .take()
                .map_or(StopCause::Idle(self.idle_limit), read_failed);
            return Polled::Stop(cause);
        }
        Polled::Nothing
    }

    /// Counts the record read, and hands back its dead letter when it is to be sent: not when
    /// it is no dead letter, when the endpoint filter leaves it out, or in a dry run.
    fn admit<P: Progress + ?Sized>(
        &self,
        msg: &BorrowedMessage<'_>,
        tally: &mut Tally,
        progress: &mut P,
    ) -> Option<DeliveryRecord> {
        let summary = &mut tally.summary;
        summary.scanned += 1;
        progress.update(summary.scanned, self.total);
        let record = match DeliveryRecord::from_message(msg) {
            Ok(r) if r.dead.is_some() => r,
            _ => {
                summary.undecodable += 1;
                return None;
            }
        };
        if self
            .request
            .endpoint
            .as_ref()
            .is_some_and(|e| *e != record.endpoint_id)
        {
            summary.filtered += 1;
            return None;
        }
        if self.request.dry_run {
            summary.replayed += 1;
            tally.covered.add(&record.tenant);
            return None;
        }
        Some(record)
    }

    /// The replay's answer, given how it ended and whether its audit entry was recorded.
    fn outcome(
        &self,
        summary: ReplaySummary,
        stop: Option<Stop>,
        recorded: Result<(), StoreError>,
    ) -> Result<ReplaySummary, ReplayError> {
        let request = self.request;
        match (stop, recorded) {
            (None, Ok(())) => Ok(summary),
            (None, Err(source)) => Err(ReplayError::Audit {
                replay_id: summary.replay_id,
                replayed: summary.replayed,
                source,
            }),
            (Some(stop), recorded) => Err(ReplayError::Incomplete(Box::new(Incomplete {
                replay_id: summary.replay_id,
                dlq: self.target.dlq.clone(),
                partition: request.partition,
                from_offset: request.from_offset,
                to_offset: request.to_offset,
                resume_from: stop.resume_from,
                replayed: summary.replayed,
                replayed_past: stop.past,
                dry_run: request.dry_run,
                cause: stop.cause,
                audit_error: recorded.err(),
            }))),
        }
    }
}

/// The audit entry's account of what a replay covered: `from_offset..=last` when it reached
/// the end of its range; else, given why it stopped and the first offset it did not cover,
/// the offsets before that one, what was asked, and why it stopped.
fn scope(
    target: &ReplayTarget,
    request: &ReplayRequest,
    last: i64,
    stopped: Option<&Stop>,
) -> String {
    let from = request.from_offset;
    let to = request.to_offset;
    let mut scope = format!("{} partition {}", target.dlq, request.partition);
    match stopped {
        None => {
            scope.push_str(&format!(" offsets {from}..={last}"));
            if to > last {
                scope.push_str(&format!(" (asked up to {to}; the partition ended there)"));
            }
        }
        Some(&Stop {
            ref cause,
            resume_from,
            past,
        }) => {
            if resume_from > from {
                scope.push_str(&format!(" offsets {from}..={}", resume_from - 1));
            } else {
                scope.push_str(" no offsets");
            }
            if past > 0 {
                scope.push_str(&format!(
                    " and {} (under way when it stopped)",
                    past_count(past, resume_from)
                ));
            }
            scope.push_str(&format!(
                " (asked {from}..={to}; incomplete, stopped before offset {resume_from}: {})",
                cause.describe(resume_from)
            ));
        }
    }
    if let Some(endpoint) = &request.endpoint {
        scope.push_str(&format!(", endpoint {endpoint}"));
    }
    scope
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::atomic::AtomicUsize;

    use rdkafka::consumer::{BaseConsumer, Consumer};

    use super::super::super::fixture::{ClaimsFailAfter, MockDlq, dead_letter, mock_dlq, request};
    use super::super::check;
    use super::super::window::{SPAN_WINDOWS, WINDOW};
    use super::*;
    use crate::id::Tenant;
    use crate::kafka::client_config;
    /// A claim the attempt log does not answer stops a range at that offset before anything is
    /// sent for it, with the records before it republished and audited.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_the_attempt_log_does_not_answer_stops_the_range_there() {
        let letters: Vec<DeliveryRecord> = (0..3).map(dead_letter).collect();
        let MockDlq {
            cluster: _cluster,
            target,
        } = mock_dlq(&letters).await;
        let store = crate::storage::hooked::Hooked::new(ClaimsFailAfter(AtomicUsize::new(1)), 16);
        let request = ReplayRequest {
            partition: 0,
            from_offset: 0,
            to_offset: 2,
            ..request()
        };
        let result = check(&target, &request)
            .await
            .unwrap()
            .asked_by("cli")
            .run(&store, &mut |_, _| {})
            .await;
        let Err(ReplayError::Incomplete(stop)) = result else {
            panic!("the replay stops: {result:?}");
        };
        assert!(matches!(stop.cause, StopCause::Claim(_)), "{stop}");
        assert_eq!((stop.resume_from, stop.replayed), (1, 1), "{stop}");
        let audits = store.replays(None, 10).await.unwrap();
        assert_eq!(audits.len(), 1, "{audits:?}");
        assert_eq!(audits[0].count, 1);
        assert!(audits[0].scope.contains("claimed"), "{}", audits[0].scope);
        assert_eq!(audits[0].asked_by.as_deref(), Some("cli"));
        assert_eq!(
            audits[0].tenant.as_ref().map(Tenant::as_str),
            Some("acme"),
            "what it republished was one tenant's"
        );
    }

    /// A range longer than the window is sent whole, each delivery once: a delivery whose
    /// dead letter is in the range twice (dead again after a replay) is claimed by one of its
    /// two sends, which run at the same time, and left alone by the other.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_range_longer_than_the_window_sends_each_delivery_once() {
        let count = SPAN_WINDOWS * WINDOW + WINDOW + 10;
        let mut letters: Vec<DeliveryRecord> = (0..count).map(dead_letter).collect();
        // The same delivery's dead letter again, next to the first.
        letters.insert(8, letters[7].clone());
        let MockDlq {
            cluster: _cluster,
            target,
        } = mock_dlq(&letters).await;
        // The store holds each delivery, dead (the in-memory store keeps claims only for the
        // deliveries it holds).
        let store = crate::storage::memory::MemoryStore::default();
        for (_, letter) in letters.iter().enumerate().filter(|(i, _)| *i != 8) {
            let row = crate::storage::conformance::dead_attempt(letter);
            store.record_attempt(&row).await.unwrap();
        }
        let request = ReplayRequest {
            partition: 0,
            from_offset: 0,
            to_offset: i64::try_from(letters.len()).unwrap() - 1,
            ..request()
        };
        let summary = check(&target, &request)
            .await
            .unwrap()
            .run(&store, &mut |_, _| {})
            .await
            .expect("the whole range is replayed");
        assert_eq!(
            (
                summary.scanned,
                summary.replayed,
                summary.skipped_being_replayed
            ),
            (count as u64 + 1, count as u64, 1),
            "{summary:?}"
        );
        let consumer: BaseConsumer = client_config(&target.bootstrap, &target.client)
            .set("group.id", "check")
            .set("auto.offset.reset", "earliest")
            .create()
            .unwrap();
        consumer.subscribe(&[&target.deliveries]).unwrap();
        let mut sent = BTreeSet::new();
        let mut records = 0;
        let deadline = Instant::now() + Duration::from_secs(20);
        while records < count && Instant::now() < deadline {
            if let Some(Ok(m)) =
                tokio::task::block_in_place(|| consumer.poll(Duration::from_millis(100)))
            {
                let r = DeliveryRecord::from_message(&m).unwrap();
                assert_eq!(r.replay_id.as_deref(), Some(summary.replay_id.as_str()));
                sent.insert(r.delivery_id);
                records += 1;
            }
        }
        // Nothing more comes.
        let extra = tokio::task::block_in_place(|| consumer.poll(Duration::from_millis(500)));
        assert!(extra.is_none_or(|m| m.is_err()), "a record sent twice");
        let expected: BTreeSet<_> = letters.iter().map(|l| l.delivery_id.clone()).collect();
        assert_eq!((records, sent), (count, expected));
    }
}
