//! One attempt of a delivery and its settling, in named steps: the request is sent, the retry
//! policy decides, and the [`Settling`] attempt is logged and given its follow-up record, which
//! the [`AttemptReport`] carries back to the task that produces it. A delivery that cannot be
//! sent at all (endpoint gone or disabled, no signing secret, window spent while held back) is
//! no attempt: a dead note is written for it instead, with its dead letter as follow-up.

use std::time::{Duration, Instant, SystemTime};

use http::HeaderMap;

use tokio_util::sync::CancellationToken;

use super::DeliverDeps;
use super::request::{SendPlan, Signed, Unsendable, prepare};
use crate::attempt::{Attempt, AttemptResult, ErrorClass};
use crate::breaker;
use crate::dead_reason::DeadReason;
use crate::endpoint::Endpoint;
use crate::id::{DeliveryId, EndpointId};
use crate::record::{DeadInfo, DeliveryRecord, UnixMillis};
use crate::retry_policy::{Decision, classify};
use crate::stage::{Outgoing, outgoing, produce_until_acked, until_stored};
use crate::storage::{AttemptOutcome, AttemptRow, DeliveryNote, NoteKind, RecordPosition};
use crate::telemetry;

/// What follows one attempt, once it is logged.
pub(super) struct AttemptReport {
    /// The record to produce before settling (a retry or the DLQ record).
    pub(super) follow_up: Option<FollowUp>,
    /// The receiver answered 410: disable the endpoint.
    pub(super) disable_endpoint: bool,
}

/// A record that must be in Kafka before its delivery settles: a retry in a delay tier, or a
/// dead letter in the DLQ.
pub(super) struct FollowUp {
    /// The record.
    pub(super) out: Outgoing,
    /// What it is, reported once the broker has it.
    pub(super) landed: Landed,
}

/// What a [`FollowUp`] reports once it is in Kafka.
pub(super) enum Landed {
    Retry {
        tier: String,
    },
    Dead {
        delivery_id: DeliveryId,
        endpoint_id: EndpointId,
        reason: DeadReason,
    },
}

impl FollowUp {
    /// Produces the record until the broker acknowledges it (`true`) or `stop` fires (`false`:
    /// the delivery must not settle). The retry or dead letter is logged and counted only once
    /// it is acknowledged, so that a record whose write was refused and is tried again after a
    /// restart is counted once, and a `dead-lettered` line means the DLQ has the record.
    pub(super) async fn produce(
        self,
        producer: &crate::kafka::Producer,
        stop: &CancellationToken,
    ) -> bool {
        if !produce_until_acked(producer, self.out, stop).await {
            return false;
        }
        match self.landed {
            Landed::Retry { tier } => telemetry::retry_scheduled(&tier),
            Landed::Dead {
                delivery_id,
                endpoint_id,
                reason,
            } => telemetry::dead_lettered(delivery_id.as_str(), endpoint_id.as_str(), reason),
        }
        true
    }
}

/// An attempt that sent nothing: its endpoint's URL is unusable (`detail` says why).
fn unusable_url(detail: &str) -> Attempt {
    Attempt {
        result: AttemptResult::Failed {
            class: ErrorClass::InvalidUrl,
            detail: detail.to_owned(),
        },
        latency: Duration::ZERO,
    }
}

/// `headers` as the attempt log keeps them: (name, value) in the order they are sent, a value
/// that is not text read leniently. Sensitive values (none is set on a signed request) are
/// left out.
fn header_pairs(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(_, value)| !value.is_sensitive())
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect()
}

/// What the dead letter of a delivery says of its last attempt, if it had one.
struct LastAttempt {
    status: Option<u16>,
    error: Option<ErrorClass>,
    at: SystemTime,
    key_ids: Vec<String>,
}

impl DeliverDeps {
    /// Makes one attempt of `record` to `endpoint`, logs it durably (retrying the store until it
    /// answers or `stop` fires: `None`), and says what must be produced before settling.
    ///
    /// `answered` is called with the attempt's health signal as soon as the HTTP exchange is
    /// over, before the attempt is logged: the endpoint's lane slot is free from then on, so a
    /// slow store write never counts against the endpoint's concurrency.
    ///
    /// `record` is borrowed so that the caller still has it, as it was read, should the attempt
    /// panic (see [`Stage::spawn_attempt`](super::stage::Stage::spawn_attempt)); it is copied
    /// only for a follow-up record, as it would be anyway.
    pub(super) async fn attempt(
        &self,
        record: &DeliveryRecord,
        read_at: Option<RecordPosition>,
        endpoint: &Endpoint,
        plan: &SendPlan,
        stop: &CancellationToken,
        answered: impl FnOnce(Option<breaker::Outcome>),
    ) -> Option<AttemptReport> {
        let started = SystemTime::now();
        let attempt_no = record.attempts.saturating_add(1);
        let (attempt, key_ids, request_headers) = match prepare(record, plan, attempt_no, started) {
            Ok(Signed { request, key_ids }) => {
                let headers = header_pairs(&request.headers);
                telemetry::in_flight(1);
                let a = self.sender.send(request).await;
                telemetry::in_flight(-1);
                (a, key_ids, headers)
            }
            Err(Unsendable::NoKey) => {
                answered(None);
                return self.refuse(record, DeadReason::NoSigningKey, stop).await;
            }
            Err(Unsendable::BadUrl(detail)) => (unusable_url(&detail), vec![], vec![]),
        };
        let finished = SystemTime::now();
        answered(breaker::Outcome::of(&attempt.result));
        telemetry::AttemptFinished {
            endpoint_id: endpoint.id.as_str(),
            delivery_id: record.delivery_id.as_str(),
            attempt: attempt_no,
            status: attempt.result.status(),
            error_class: attempt.result.error_class(),
            latency: attempt.latency,
        }
        .emit();
        // The window runs from the first attempt: this one, unless one was made before.
        let first = record
            .first_attempt_at
            .map_or(started, UnixMillis::to_system_time);
        let elapsed = finished.duration_since(first).unwrap_or_default();
        let verdict = classify(&attempt.result, finished);
        let decision = self
            .policy
            .decide(verdict, attempt_no, elapsed, &mut rand::rng());
        let settling = Settling {
            record,
            read_at,
            attempt,
            attempt_no,
            started,
            key_ids,
            request_headers,
            decision,
        };
        self.settle(settling, stop).await
    }

    /// Dead-letters `record` for `reason` without sending it (endpoint deleted or disabled, no
    /// signing secret, window spent while held back): writes its dead note durably (retrying
    /// the store until it answers or `stop` fires: `None`) and builds its DLQ record. No
    /// attempt is logged: the delivery shows as dead with the attempts it had.
    pub(super) async fn refuse(
        &self,
        record: &DeliveryRecord,
        reason: DeadReason,
        stop: &CancellationToken,
    ) -> Option<AttemptReport> {
        let now = SystemTime::now();
        let note = note_for(record, now, NoteKind::Dead { reason });
        if !self.note(&note, stop).await {
            return None;
        }
        let last = LastAttempt {
            status: None,
            error: Some(ErrorClass::NotSent),
            at: now,
            key_ids: vec![],
        };
        Some(AttemptReport {
            follow_up: Some(self.dead_letter(record, record.attempts, reason, last)),
            disable_endpoint: false,
        })
    }

    /// The dead letter of `record` for `reason`, after `attempts` attempts, the last as `last`
    /// says.
    fn dead_letter(
        &self,
        record: &DeliveryRecord,
        attempts: u32,
        reason: DeadReason,
        last: LastAttempt,
    ) -> FollowUp {
        let mut dead = record.clone().with_first_attempt_at(last.at);
        dead.attempts = attempts;
        let dead = dead.for_dlq(DeadInfo {
            reason,
            last_status: last.status,
            last_error: last.error,
            last_attempt_at: last.at.into(),
            signing_key_ids: last.key_ids,
        });
        FollowUp {
            out: outgoing(self.dlq_topic.clone(), &dead),
            landed: Landed::Dead {
                delivery_id: record.delivery_id.clone(),
                endpoint_id: record.endpoint_id.clone(),
                reason,
            },
        }
    }

    /// Logs `settling`'s attempt durably (retrying the store until it answers or `stop` fires:
    /// `None`) and builds the follow-up its decision asks for.
    async fn settle(
        &self,
        settling: Settling<'_>,
        stop: &CancellationToken,
    ) -> Option<AttemptReport> {
        let consequence = self.consequence(&settling, SystemTime::now());
        let row = settling.row(consequence.outcome);
        if !self.log(&row, stop).await {
            return None;
        }
        Some(AttemptReport {
            follow_up: consequence.follow_up,
            disable_endpoint: consequence.disable_endpoint,
        })
    }

    /// What `settling`'s decision comes to at `now`: the outcome its row logs, the record that
    /// follows it (a retry in the tier that fits its delay, or its dead letter), and whether its
    /// endpoint is to be disabled.
    fn consequence(&self, settling: &Settling<'_>, now: SystemTime) -> Consequence {
        let &Settling {
            record,
            ref attempt,
            attempt_no,
            started,
            ref key_ids,
            decision,
            ..
        } = settling;
        match decision {
            Decision::Done => {
                let age = now.duration_since(record.event_time.to_system_time()).ok();
                telemetry::delivered(age);
                Consequence {
                    outcome: AttemptOutcome::Succeeded,
                    follow_up: None,
                    disable_endpoint: false,
                }
            }
            Decision::Retry { delay } => {
                let tier = self.tiers.for_delay(delay);
                let next = now + delay;
                let retry = record
                    .clone()
                    .with_first_attempt_at(started)
                    .for_retry(attempt_no, next);
                let follow_up = FollowUp {
                    out: outgoing(tier.topic.clone(), &retry),
                    landed: Landed::Retry {
                        tier: tier.name.clone(),
                    },
                };
                Consequence {
                    outcome: AttemptOutcome::RetryScheduled {
                        next_attempt_at: next,
                    },
                    follow_up: Some(follow_up),
                    disable_endpoint: false,
                }
            }
            Decision::DeadLetter {
                reason,
                disable_endpoint,
            } => {
                let last = LastAttempt {
                    status: attempt.result.status(),
                    error: attempt.result.error_class(),
                    at: started,
                    key_ids: key_ids.clone(),
                };
                Consequence {
                    outcome: AttemptOutcome::Dead { reason },
                    follow_up: Some(self.dead_letter(record, attempt_no, reason, last)),
                    disable_endpoint,
                }
            }
        }
    }

    /// Writes `row` to the attempt log, trying again with backoff until the store takes it
    /// (`true`) or `stop` fires (`false`).
    async fn log(&self, row: &AttemptRow, stop: &CancellationToken) -> bool {
        let logging = Instant::now();
        let store = &self.store;
        let logged = until_stored("attempt", stop, || store.record_attempt(row))
            .await
            .is_some();
        if logged {
            telemetry::store_written(logging.elapsed());
        }
        logged
    }

    /// Writes `note` to the store, trying again with backoff until the store takes it (`true`)
    /// or `stop` fires (`false`).
    pub(super) async fn note(&self, note: &DeliveryNote, stop: &CancellationToken) -> bool {
        let store = &self.store;
        until_stored("note", stop, || store.record_note(note))
            .await
            .is_some()
    }
}

/// The note of what happened to `record` at `at` without an attempt.
pub(super) fn note_for(record: &DeliveryRecord, at: SystemTime, kind: NoteKind) -> DeliveryNote {
    DeliveryNote {
        delivery_id: record.delivery_id.clone(),
        event_id: record.event_id.clone(),
        endpoint_id: record.endpoint_id.clone(),
        tenant: record.tenant.clone(),
        event_type: record.event_type.to_string(),
        at,
        kind,
        replay_id: record.replay_id.clone(),
    }
}

/// One attempt as it ended, with what the retry policy decided: what is logged and followed up
/// before its delivery settles.
struct Settling<'a> {
    /// The delivery, as it was read.
    record: &'a DeliveryRecord,
    /// Where it was read in the deliveries topic.
    read_at: Option<RecordPosition>,
    /// What the attempt came to.
    attempt: Attempt,
    /// Its number, 1-based, per window.
    attempt_no: u32,
    /// When it started: the window's start, unless `record` has one.
    started: SystemTime,
    /// The ids of the keys that signed its request.
    key_ids: Vec<String>,
    /// Its request's headers as sent (empty when nothing was sent).
    request_headers: Vec<(String, String)>,
    /// What follows it.
    decision: Decision,
}

impl Settling<'_> {
    /// The attempt log's row for this attempt, which led to `outcome`.
    fn row(self, outcome: AttemptOutcome) -> AttemptRow {
        let Settling {
            record,
            read_at,
            attempt,
            attempt_no,
            started,
            key_ids,
            request_headers,
            ..
        } = self;
        let body = match &attempt.result {
            AttemptResult::Response(r) => r.body.clone(),
            AttemptResult::Failed { .. } => vec![],
        };
        AttemptRow {
            delivery_id: record.delivery_id.clone(),
            event_id: record.event_id.clone(),
            endpoint_id: record.endpoint_id.clone(),
            tenant: record.tenant.clone(),
            event_type: record.event_type.to_string(),
            attempt: attempt_no,
            started_at: started,
            status: attempt.result.status(),
            latency_ms: u32::try_from(attempt.latency.as_millis()).unwrap_or(u32::MAX),
            error_class: attempt.result.error_class(),
            response_body: body,
            signing_key_ids: key_ids,
            replay_id: record.replay_id.clone(),
            outcome,
            record: read_at,
            request_headers,
        }
    }
}

/// What a [`Decision`] comes to for one attempt.
struct Consequence {
    /// What the attempt's row logs.
    outcome: AttemptOutcome,
    /// The record to produce before the delivery settles.
    follow_up: Option<FollowUp>,
    /// The receiver answered 410: disable the endpoint.
    disable_endpoint: bool,
}
