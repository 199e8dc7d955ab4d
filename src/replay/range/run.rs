//! Running a checked range replay: reading the DLQ, sending each dead letter in the range
//! through the window, and recording the audit entry of what was covered.

use std::time::{Duration, Instant, SystemTime};

use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use rdkafka::Message;
use rdkafka::error::KafkaError;

use super::super::audit::{new_replay_id, record_audit};
use super::super::consumer::{POLL_WAIT, read_error_is_final};
use super::super::error::past_count;
use super::super::republisher::Republisher;
use super::super::{
    Incomplete, ReplayError, ReplayRequest, ReplaySummary, ReplayTarget, StopCause,
};
use super::window::{Covered, SEND_STEP, Window, send};
use super::{Checked, Progress};
use crate::record::DeliveryRecord;
use crate::storage::{DeliveryStore, ReplayAudit};
use crate::telemetry;

impl Checked<'_> {
    /// Republishes the checked range (unless a dry run) and records the audit entry in `store`.
    /// A replay that stops short of the range's end fails with [`ReplayError::Incomplete`],
    /// after recording an audit entry for the part it covered.
    pub async fn run<P: Progress + ?Sized>(
        self,
        store: &dyn DeliveryStore,
        progress: &mut P,
    ) -> Result<ReplaySummary, ReplayError> {
        let Checked {
            target,
            request,
            consumer,
            last,
            total,
            idle_limit,
            publish_deadline,
            window,
        } = self;
        let replay_id = new_replay_id();
        let republisher = Republisher::new(target)?;
        let mut summary = ReplaySummary {
            replay_id: replay_id.clone(),
            scanned: 0,
            replayed: 0,
            filtered: 0,
            undecodable: 0,
            skipped_being_replayed: 0,
            last_offset: last,
        };
        // The first offset the reader has not read: past every record read, each of them
        // covered (filtered, skipped, counted) or among `window`'s sends.
        let mut next = request.from_offset;
        let mut heard_at = Instant::now();
        let mut covered = Covered::default();
        let mut window = Window::new(window);
        let mut sends = FuturesUnordered::new();
        // The latest error the consumer reported since the last record: librdkafka goes on
        // fetching after most of them, so they stop the replay only once it has gone idle.
        let mut failing: Option<KafkaError> = None;
        let read_stop = loop {
            // Take in the sends that finished; after a failed one, read no further.
            while let Some(Some((offset, sent))) = sends.next().now_or_never() {
                window.settle(offset, sent, &mut summary, &mut covered);
            }
            if window.failed.is_some() || next > last {
                break None;
            }
            if window.is_full(next) {
                // Waiting for a send is not waiting for the DLQ: it does not count towards the
                // idle limit.
                let waiting = Instant::now();
                if let Some((offset, sent)) = sends.next().await {
                    window.settle(offset, sent, &mut summary, &mut covered);
                }
                heard_at += waiting.elapsed();
                continue;
            }
            let busy = !sends.is_empty();
            let wait = if busy {
                Duration::ZERO
            } else {
                idle_limit.saturating_sub(heard_at.elapsed()).min(POLL_WAIT)
            };
            // The consumer's poll blocks; keep it off the async workers' backs.
            let read_failed = |source| StopCause::Read {
                bootstrap: target.bootstrap.clone(),
                source,
            };
            let msg = match tokio::task::block_in_place(|| consumer.poll(wait)) {
                Some(Ok(m)) => m,
                Some(Err(source)) if read_error_is_final(&source) => {
                    break Some(read_failed(source));
                }
                // Nothing yet; the end of partition before `last`, which is the end of what the
                // replica being read holds so far (a follower behind its leader); or an error
                // librdkafka retries by itself. The rest of the range may still come, within
                // the idle limit; past it, the replay stops on the last such error, if any.
                polled => {
                    if let Some(Err(source)) = polled
                        && !matches!(source, KafkaError::PartitionEOF(_))
                    {
                        tracing::warn!(error = %source, partition = request.partition, offset = next,
                            "reading the DLQ failed; retrying");
                        failing = Some(source);
                    }
                    if heard_at.elapsed() >= idle_limit {
                        break Some(
                            failing
                                .take()
                                .map_or(StopCause::Idle(idle_limit), read_failed),
                        );
                    }
                    if busy {
                        // Nothing to read at once: give the sends a moment instead.
                        let step = idle_limit.saturating_sub(heard_at.elapsed()).min(SEND_STEP);
                        if let Ok(Some((offset, sent))) =
                            tokio::time::timeout(step, sends.next()).await
                        {
                            window.settle(offset, sent, &mut summary, &mut covered);
                        }
                    }
                    continue;
                }
            };
            heard_at = Instant::now();
            failing = None;
            next = msg.offset() + 1;
            if msg.offset() > last {
                break None;
            }
            summary.scanned += 1;
            progress.update(summary.scanned, total);
            let record = match DeliveryRecord::from_message(&msg) {
                Ok(r) if r.dead.is_some() => r,
                _ => {
                    summary.undecodable += 1;
                    continue;
                }
            };
            if request
                .endpoint
                .as_ref()
                .is_some_and(|e| *e != record.endpoint_id)
            {
                summary.filtered += 1;
                continue;
            }
            if request.dry_run {
                summary.replayed += 1;
                covered.add(&record.tenant);
                continue;
            }
            let offset = msg.offset();
            window.in_flight.insert(offset);
            let (republisher, replay_id) = (&republisher, replay_id.as_str());
            sends.push(async move {
                let sent = send(store, republisher, record, replay_id, publish_deadline).await;
                (offset, sent)
            });
        };
        // Let the sends under way finish: each was claimed, and may already be on its way.
        while let Some((offset, sent)) = sends.next().await {
            window.settle(offset, sent, &mut summary, &mut covered);
        }
        drop(sends);
        // A failed send stops the replay at its offset, below anything the reader reached.
        let (stop, past) = match window.failed.take() {
            Some((offset, cause)) => {
                next = offset;
                let past = window.sent_past(offset);
                (Some(cause), past)
            }
            None => (read_stop, 0),
        };
        if !request.dry_run {
            telemetry::replayed(summary.replayed);
        }
        let audit = ReplayAudit {
            replay_id: replay_id.clone(),
            actor: request.actor.clone(),
            reason: request.reason.clone(),
            at: SystemTime::now(),
            scope: scope(
                target,
                request,
                last,
                stop.as_ref().map(|cause| (cause, next, past)),
            ),
            count: summary.replayed,
            dry_run: request.dry_run,
            // A range of DLQ offsets may hold many tenants' deliveries: it is theirs to read
            // only when it held one tenant's alone (an endpoint's, say).
            tenant: covered.tenant(),
        };
        let recorded = record_audit(store, &audit).await;
        match (stop, recorded) {
            (None, Ok(())) => Ok(summary),
            (None, Err(source)) => Err(ReplayError::Audit {
                replay_id,
                replayed: summary.replayed,
                source,
            }),
            (Some(cause), recorded) => Err(ReplayError::Incomplete(Box::new(Incomplete {
                replay_id,
                dlq: target.dlq.clone(),
                partition: request.partition,
                from_offset: request.from_offset,
                to_offset: request.to_offset,
                resume_from: next,
                replayed: summary.replayed,
                replayed_past: past,
                dry_run: request.dry_run,
                cause,
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
    stopped: Option<(&StopCause, i64, u64)>,
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
        Some((cause, resume_from, past)) => {
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
