//! The tasks the delivery stage spawns: an attempt's, which holds its endpoint's lane slot, and
//! a settling one's, which writes a record where it goes last; and how a panic in one is
//! contained.

use futures::FutureExt as _;
use tokio::sync::mpsc;

use super::attempt::AttemptReport;
use super::report::Done;
use super::stage::{Queued, Stage};
use crate::breaker;
use crate::dead_reason::DeadReason;
use crate::lane::Permit;
use crate::record::DeliveryRecord;
use crate::stage::{Outgoing, Tp, Written, produce_until_acked};
use crate::storage::RecordPosition;
use crate::telemetry;

/// An attempt's lane slot, given back to the stage loop exactly once: with the endpoint's
/// answer, or, when the attempt ends without one (it panicked), when it is dropped. A slot
/// that was never given back would be lost to its endpoint for good, and an endpoint with
/// `max_in_flight` 1 would never be sent anything again.
///
/// A slot dropped unanswered carries no health signal: the panic is hookline's bug and says
/// nothing about the endpoint. Counted as a failure it could open the breaker of a healthy
/// endpoint and park its records; counted as a success it could close a half-open breaker on no
/// evidence. A breaker probe is handed back, so the next record probes at once.
pub(super) struct Slot {
    pub(super) permit: Option<Permit>,
    pub(super) done: mpsc::UnboundedSender<Done>,
}

impl Slot {
    /// Gives the slot back with what the endpoint's answer said about it.
    fn answer(mut self, health: Option<breaker::Outcome>) {
        self.give_back(health);
    }

    /// Sends the permit back, once.
    fn give_back(&mut self, health: Option<breaker::Outcome>) {
        if let Some(permit) = self.permit.take() {
            let _ = self.done.send(Done::Answered {
                permit,
                health,
                at: tokio::time::Instant::now(),
            });
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.give_back(None);
    }
}

/// Where the record at `offset` of `tp` (a deliveries topic partition) is, as an attempt row
/// logs it.
fn record_position(tp: &Tp, offset: i64) -> RecordPosition {
    RecordPosition {
        partition: tp.partition,
        offset,
    }
}

impl Stage {
    /// Runs one attempt of `q` as a task holding `permit`.
    ///
    /// A panic inside the attempt (signing, sending, the store, the follow-up: a bug in
    /// hookline) does not take the endpoint's lane slot or the record's offset with it. The
    /// slot is given back without a health signal (see [`Slot`]), the panic is logged as an
    /// error with its message, and the record, as it was read, is parked for a later attempt
    /// (`hookline_parked_total{reason="panicked"}`); its window starts if it had not, so a
    /// record that panics every time is dead-lettered once its window is spent (see
    /// [`Stage::park`]). The request may have reached the receiver: the later attempt is a
    /// duplicate with the same `webhook-id`, as after a crash.
    pub(super) fn spawn_attempt(&mut self, q: Queued, permit: Permit) {
        let plan = self.plans.plan(&q.endpoint);
        let deps = self.deps.clone();
        let producer = self.producer.clone();
        let done = self.done_tx.clone();
        let stop = self.stop.clone();
        self.tasks.spawn(async move {
            let Queued {
                tp,
                offset,
                record,
                endpoint,
            } = q;
            let read_at = record_position(&tp, offset);
            let slot = Slot {
                permit: Some(permit),
                done: done.clone(),
            };
            let attempt = async {
                let report = deps
                    .attempt(&record, Some(read_at), &endpoint, &plan, &stop, |health| {
                        slot.answer(health)
                    })
                    .await;
                match report {
                    None => (false, None),
                    Some(r) => {
                        let acked = match r.follow_up {
                            Some(f) => f.produce(&producer, &stop).await,
                            None => true,
                        };
                        (acked, r.disable_endpoint.then(|| endpoint.id.clone()))
                    }
                }
            };
            // Unwind safety: the attempt only reads `record`, and what it shares with other
            // tasks (store, sender, producer) keeps its state behind its own synchronisation.
            let ended = std::panic::AssertUnwindSafe(attempt).catch_unwind().await;
            let report = match ended {
                Ok((settled, disable)) => Done::Finished {
                    tp,
                    offset,
                    disable,
                    settled,
                },
                Err(panic) => {
                    telemetry::attempt_panicked(
                        record.delivery_id.as_str(),
                        endpoint.id.as_str(),
                        &telemetry::panic_message(&*panic),
                    );
                    Done::Panicked {
                        tp,
                        offset,
                        record: Box::new(record),
                    }
                }
            };
            let _ = done.send(report);
        });
    }

    /// Dead-letters the record at `offset` of `tp` for `reason` without attempting it (see
    /// [`DeliverDeps::refuse`](super::DeliverDeps::refuse)), as a settling task.
    pub(super) fn spawn_refusal(
        &self,
        tp: Tp,
        offset: i64,
        record: DeliveryRecord,
        reason: DeadReason,
    ) {
        let deps = self.deps.clone();
        let producer = self.producer.clone();
        let stop = self.stop.clone();
        self.spawn_settling(tp, offset, async move {
            match deps.refuse(&record, reason, &stop).await {
                Some(AttemptReport {
                    follow_up: Some(f), ..
                }) => f.produce(&producer, &stop).await,
                Some(_) => true,
                None => false,
            }
        });
    }

    /// Runs `write`, which puts the record at `offset` of `tp` where it goes last (its dead
    /// letter, a parked copy, the invalid topic) and says whether the broker has it; settles the
    /// record when it does.
    ///
    /// A panic there leaves the record with no safer place than its own offset, uncommitted:
    /// parking it instead could panic again, for ever. So it stops the stage (logged as an
    /// error with the panic's message), which drains as on shutdown and ends; hookline then
    /// exits with status 70 and the next process reads the record again. These tasks sign and
    /// send nothing; only a store or producer that panics on one record every time would make
    /// that a restart loop.
    pub(super) fn spawn_settling(
        &self,
        tp: Tp,
        offset: i64,
        write: impl std::future::Future<Output = bool> + Send + 'static,
    ) {
        let written = self.written.clone();
        let broken = self.broken.clone();
        self.tasks.spawn(async move {
            match std::panic::AssertUnwindSafe(write).catch_unwind().await {
                Ok(acked) => {
                    let _ = written.send(Written { tp, offset, acked });
                }
                Err(panic) => {
                    telemetry::settling_panicked(
                        &tp.topic,
                        tp.partition,
                        offset,
                        &telemetry::panic_message(&*panic),
                    );
                    broken.cancel();
                }
            }
        });
    }

    /// Produces `out` for the record at `offset` of `tp`, as a settling task.
    pub(super) fn produce_then_settle(&self, tp: Tp, offset: i64, out: Outgoing) {
        let producer = self.producer.clone();
        let stop = self.stop.clone();
        self.spawn_settling(tp, offset, async move {
            produce_until_acked(&producer, out, &stop).await
        });
    }
}
