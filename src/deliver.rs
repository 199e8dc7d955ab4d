//! The delivery stage: consumes `hookline.deliveries` (group `hookline-deliver`), and for each
//! record signs, sends, classifies, logs the attempt and settles it.
//!
//! Records of one partition are dispatched to per-endpoint lanes and complete out of order; the
//! partition's offset advances only over the settled prefix. A lane holds a bounded queue: a
//! healthy endpoint's burst waits there (when the partition's window fills, the partition pauses:
//! backpressure, nothing parks). Records are parked durably in a delay tier (without spending
//! retry budget) when the endpoint's breaker is open, or when it is stalled (every request slot
//! taken and no answer for `stall_after`: a receiver that hangs), so the endpoints sharing its
//! partition never wait behind it for the HTTP timeout. An endpoint that answers, but slower
//! than its records arrive (a rate limit, or few request slots and long answers), keeps queued
//! only what it sends within the shortest tier; the rest is parked until its turn (see
//! `Turns`), so its backlog does not fill the partition's window either.
//!
//! Settled means: the attempt row is durable in the store AND the follow-up record (a retry in a
//! delay tier, or the DLQ record) is acknowledged by the broker; or a parked copy is
//! acknowledged. Nothing else moves the offset.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use rdkafka::Message;
use rdkafka::consumer::Consumer;
use rdkafka::message::BorrowedMessage;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::attempt::{Attempt, AttemptResult, ErrorClass};
use crate::breaker::{self, Transition};
use crate::dead_reason::DeadReason;
use crate::delay_tier::Tiers;
use crate::endpoint::{Endpoint, SecretKind};
use crate::id::{DeliveryId, EndpointId};
use crate::intake::Intake;
use crate::lane::{LaneConfig, Lanes, LanesConfig, Permit, Refusal};
use crate::record::{DeadInfo, DeliveryRecord, UnixMillis};
use crate::registry::{EndpointStore, EndpointView};
use crate::retry_policy::{Decision, RetryPolicy, classify};
use crate::sender::{OutboundRequest, Sender, Target};
use crate::signing::{Ed25519SigningKey, Signer, SignerKey, SigningKey, SigningSecret};
use crate::stage::{
    Outgoing, RebalanceEvent, Settlements, StageConsumer, Tp, invalid_forward, outgoing,
    produce_until_acked,
};
use crate::storage::{AttemptOutcome, AttemptRow, DeliveryStore, RecordPosition};
use crate::telemetry::{self, ParkReason};

/// Header receivers see on replayed deliveries: the replay's id.
pub const REPLAY_HEADER: &str = "hookline-replay-id";
/// Header receivers see with the attempt number (1-based, per window).
pub const ATTEMPT_HEADER: &str = "hookline-attempt";

/// Everything the delivery stage works with.
pub struct DeliverDeps {
    /// The materialised endpoints.
    pub endpoints: Arc<EndpointView>,
    /// Writes endpoint changes (disabling after a 410).
    pub endpoint_writer: Arc<dyn EndpointStore>,
    /// The attempt log.
    pub store: Arc<dyn DeliveryStore>,
    /// The outbound HTTP client.
    pub sender: Sender,
    /// Classification and backoff.
    pub policy: RetryPolicy,
    /// Delay tiers for retries and parking.
    pub tiers: Arc<Tiers>,
    /// The DLQ topic.
    pub dlq_topic: Arc<str>,
    /// Where undecodable records go.
    pub invalid_topic: Arc<str>,
    /// Lane and breaker settings.
    pub lanes: LanesConfig,
    /// Concurrency ceiling for endpoints that set none.
    pub default_max_in_flight: u32,
    /// Records held per partition before it is paused.
    pub max_window: usize,
    /// Records queued per endpoint before new ones are parked.
    pub lane_queue: usize,
    /// A full lane with no request finished for this long is stalled: its queue parks.
    pub stall_after: Duration,
    /// How long a stalled endpoint's records stay parked at least: until its hanging requests
    /// have answered or timed out (the HTTP total timeout).
    pub stalled_wait: Duration,
    /// How long in-flight attempts may take to finish after shutdown starts.
    pub drain_deadline: Duration,
}

/// A record waiting in its endpoint's lane queue.
struct Queued {
    tp: Tp,
    offset: i64,
    record: DeliveryRecord,
    endpoint: Arc<Endpoint>,
}

/// A delivery waiting for the endpoint view to be confirmed current (see
/// [`Stage::view_may_be_behind`]).
struct AwaitingView {
    tp: Tp,
    offset: i64,
    record: DeliveryRecord,
    /// Since when.
    since: tokio::time::Instant,
}

/// How long a delivery waits in memory for the endpoint view to be confirmed before it is
/// parked in the shortest tier instead.
const VIEW_PATIENCE: Duration = Duration::from_secs(10);

/// What an attempt task reports back to the stage loop: first that the endpoint answered (its
/// lane slot is free), then that the attempt is logged and its follow-up produced, or that it
/// panicked.
enum Done {
    Answered {
        permit: Permit,
        health: Option<breaker::Outcome>,
        /// When the answer came (or the attempt gave its slot back unsent).
        at: tokio::time::Instant,
    },
    Finished {
        tp: Tp,
        offset: i64,
        disable: Option<EndpointId>,
        settled: bool,
    },
    /// The attempt panicked (a bug in hookline); `record` is the record as it was read, to be
    /// parked for a later attempt.
    Panicked {
        tp: Tp,
        offset: i64,
        record: Box<DeliveryRecord>,
    },
}

/// An attempt's lane slot, given back to the stage loop exactly once: with the endpoint's
/// answer, or, when the attempt ends without one (it panicked), when it is dropped. A slot
/// that was never given back would be lost to its endpoint for good, and an endpoint with
/// `max_in_flight` 1 would never be sent anything again.
///
/// A slot dropped unanswered carries no health signal: the panic is hookline's bug and says
/// nothing about the endpoint. Counted as a failure it could open the breaker of a healthy
/// endpoint and park its records; counted as a success it could close a half-open breaker on no
/// evidence. A breaker probe is handed back, so the next record probes at once.
struct Slot {
    permit: Option<Permit>,
    done: mpsc::UnboundedSender<Done>,
}

impl Slot {
    /// Gives the slot back with what the endpoint's answer said about it.
    fn answer(mut self, health: Option<breaker::Outcome>) {
        self.give_back(health);
    }

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

/// What follows one attempt.
pub struct AttemptReport {
    /// The record to produce before settling (a retry or the DLQ record).
    pub follow_up: Option<FollowUp>,
    /// The receiver answered 410: disable the endpoint.
    pub disable_endpoint: bool,
    /// The logged row.
    pub row: AttemptRow,
}

/// A record that must be in Kafka before its delivery settles: a retry in a delay tier, or a
/// dead letter in the DLQ.
pub struct FollowUp {
    /// The record.
    pub out: Outgoing,
    /// What it is, reported once the broker has it.
    landed: Landed,
}

/// What a [`FollowUp`] reports once it is in Kafka.
enum Landed {
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
    pub async fn produce(
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

fn signing_keys(endpoint: &Endpoint, now: SystemTime) -> Vec<SignerKey> {
    endpoint
        .active_secrets(now)
        .filter_map(|s| {
            let key: SigningKey = match s.kind {
                SecretKind::Hmac => SigningSecret::from_bytes(s.material.expose()).ok()?.into(),
                SecretKind::Ed25519 => Ed25519SigningKey::from_bytes(s.material.expose())
                    .ok()?
                    .into(),
            };
            Some(SignerKey::new(s.key_id.as_str(), key))
        })
        .collect()
}

/// What every attempt to one version of an endpoint shares: its request target and its signer.
/// Built once per endpoint version (and again when one of its secrets expires), not per
/// attempt: parsing the URL and keying the HMACs cost more than signing one body.
pub struct SendPlan {
    version: u64,
    url_text: String,
    target: Result<Target, String>,
    signer: Option<Signer>,
    key_ids: Vec<String>,
    /// The earliest expiry among the active secrets: from then on the signer is stale.
    valid_until: Option<SystemTime>,
}

impl SendPlan {
    /// The plan for `endpoint` as of `now`.
    pub fn build(endpoint: &Endpoint, now: SystemTime) -> SendPlan {
        let signer = Signer::new(&signing_keys(endpoint, now)).ok();
        let key_ids = signer
            .as_ref()
            .map(|s| s.key_ids().map(str::to_owned).collect())
            .unwrap_or_default();
        SendPlan {
            version: endpoint.version,
            url_text: endpoint.url.clone(),
            target: Target::parse(&endpoint.url).map_err(|e| format!("endpoint URL {e}")),
            signer,
            key_ids,
            valid_until: endpoint
                .active_secrets(now)
                .filter_map(|s| s.expires_at)
                .min(),
        }
    }

    /// Whether this plan still describes `endpoint` at `now`.
    pub fn fits(&self, endpoint: &Endpoint, now: SystemTime) -> bool {
        self.version == endpoint.version
            && self.url_text == endpoint.url
            && self.valid_until.is_none_or(|t| now < t)
    }
}

/// An attempt that sent nothing, for `class` (`invalid_url`, or `not_sent` with `detail` saying
/// why).
fn refused(class: ErrorClass, detail: &str) -> Attempt {
    Attempt {
        result: AttemptResult::Failed {
            class,
            detail: detail.to_owned(),
        },
        latency: Duration::ZERO,
    }
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Why no request could be built.
enum Unsendable {
    /// The endpoint has no active signing secret.
    NoKey,
    /// The endpoint's URL does not parse.
    BadUrl(String),
}

/// Builds the signed request for `record` following `plan`, or the reason none can be sent.
fn prepare(
    record: &DeliveryRecord,
    plan: &SendPlan,
    attempt: u32,
    now: SystemTime,
) -> Result<(OutboundRequest, Vec<String>), Unsendable> {
    let signer = plan.signer.as_ref().ok_or(Unsendable::NoKey)?;
    let target = plan.target.clone().map_err(Unsendable::BadUrl)?;
    // Room for every header the request ends with: the signature's three, the attempt, a
    // replay id, and what the sender and the HTTP client add (content type, user agent,
    // authorization, host). A map that fills up is rehashed into one twice its size.
    let mut headers = HeaderMap::with_capacity(10);
    let signed = signer.headers(record.event_id.as_str(), unix_secs(now), &record.body);
    for (name, value) in signed.iter() {
        if let Ok(v) = HeaderValue::try_from(value) {
            headers.insert(HeaderName::from_static(name), v);
        }
    }
    headers.insert(
        HeaderName::from_static(ATTEMPT_HEADER),
        HeaderValue::from(attempt),
    );
    if let Some(replay) = record
        .replay_id
        .as_deref()
        .and_then(|r| HeaderValue::try_from(r).ok())
    {
        headers.insert(HeaderName::from_static(REPLAY_HEADER), replay);
    }
    Ok((
        OutboundRequest {
            target,
            headers,
            body: record.body.clone(),
        },
        plan.key_ids.clone(),
    ))
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
    /// panic (see [`Stage::spawn_attempt`]); it is copied only for a follow-up record, as it
    /// would be anyway.
    pub async fn attempt(
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
        let (attempt, key_ids, no_key) = match prepare(record, plan, attempt_no, started) {
            Ok((request, key_ids)) => {
                telemetry::in_flight(1);
                let a = self.sender.send(request).await;
                telemetry::in_flight(-1);
                (a, key_ids, false)
            }
            Err(Unsendable::NoKey) => (
                refused(ErrorClass::NotSent, "endpoint has no active signing secret"),
                vec![],
                true,
            ),
            Err(Unsendable::BadUrl(detail)) => {
                (refused(ErrorClass::InvalidUrl, &detail), vec![], false)
            }
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
        let decision = if no_key {
            Decision::DeadLetter {
                reason: DeadReason::NoSigningKey,
                disable_endpoint: false,
            }
        } else {
            let verdict = classify(&attempt.result, finished);
            self.policy
                .decide(verdict, attempt_no, elapsed, &mut rand::rng())
        };
        self.settle_decision(
            record, read_at, attempt, attempt_no, started, key_ids, decision, stop,
        )
        .await
    }

    /// Logs a delivery that cannot be attempted (endpoint deleted or disabled) and builds its DLQ
    /// record. Nothing is sent.
    pub async fn refuse(
        &self,
        record: DeliveryRecord,
        read_at: Option<RecordPosition>,
        reason: DeadReason,
        stop: &CancellationToken,
    ) -> Option<AttemptReport> {
        let now = SystemTime::now();
        let attempt_no = record.attempts.saturating_add(1);
        let decision = Decision::DeadLetter {
            reason,
            disable_endpoint: false,
        };
        self.settle_decision(
            &record,
            read_at,
            refused(ErrorClass::NotSent, reason.as_str()),
            attempt_no,
            now,
            vec![],
            decision,
            stop,
        )
        .await
    }

    /// Logs attempt `attempt_no` of `record` (read at `read_at` in the deliveries topic),
    /// started at `started` (the window's start unless `record` has one), and builds the
    /// follow-up `decision` asks for.
    #[allow(clippy::too_many_arguments)]
    async fn settle_decision(
        &self,
        record: &DeliveryRecord,
        read_at: Option<RecordPosition>,
        attempt: Attempt,
        attempt_no: u32,
        started: SystemTime,
        key_ids: Vec<String>,
        decision: Decision,
        stop: &CancellationToken,
    ) -> Option<AttemptReport> {
        let now = SystemTime::now();
        let (outcome, follow_up, disable) = match decision {
            Decision::Done => {
                let age = now.duration_since(record.event_time.to_system_time()).ok();
                telemetry::delivered(age);
                (AttemptOutcome::Succeeded, None, false)
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
                (
                    AttemptOutcome::RetryScheduled {
                        next_attempt_at: next,
                    },
                    Some(follow_up),
                    false,
                )
            }
            Decision::DeadLetter {
                reason,
                disable_endpoint,
            } => {
                let mut dead = record.clone().with_first_attempt_at(started);
                dead.attempts = attempt_no;
                let dead = dead.for_dlq(DeadInfo {
                    reason,
                    last_status: attempt.result.status(),
                    last_error: attempt.result.error_class(),
                    last_attempt_at: started.into(),
                    signing_key_ids: key_ids.clone(),
                });
                let follow_up = FollowUp {
                    out: outgoing(self.dlq_topic.clone(), &dead),
                    landed: Landed::Dead {
                        delivery_id: record.delivery_id.clone(),
                        endpoint_id: record.endpoint_id.clone(),
                        reason,
                    },
                };
                (
                    AttemptOutcome::Dead { reason },
                    Some(follow_up),
                    disable_endpoint,
                )
            }
        };
        let body = match &attempt.result {
            AttemptResult::Response(r) => r.body.clone(),
            AttemptResult::Failed { .. } => vec![],
        };
        let row = AttemptRow {
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
        };
        let mut backoff = Duration::from_millis(50);
        let logging = Instant::now();
        loop {
            match self.store.record_attempt(&row).await {
                Ok(()) => {
                    telemetry::store_written(logging.elapsed());
                    break;
                }
                Err(e) => {
                    telemetry::store_error(e.kind(), &e);
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = stop.cancelled() => return None,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
        Some(AttemptReport {
            follow_up,
            disable_endpoint: disable,
            row,
        })
    }
}

/// Where the record at `offset` of `tp` (a deliveries topic partition) is, as an attempt row
/// logs it.
fn record_position(tp: &Tp, offset: i64) -> RecordPosition {
    RecordPosition {
        partition: tp.1,
        offset,
    }
}

/// How many records an endpoint that sends `rate` a second may keep queued: what it sends within
/// `horizon` (the shortest tier's delay), at least one. A record beyond that waits no longer
/// parked until its turn than it would have in the queue, and holds no place in its partition's
/// window meanwhile.
fn queue_room(rate: f64, horizon: Duration) -> usize {
    // A float-to-int cast saturates: an unmeasurably fast endpoint gets all the room there is.
    ((rate * horizon.as_secs_f64()).ceil() as usize).max(1)
}

/// The turns booked for the records of endpoints that send slower than their records arrive:
/// per endpoint, the next free turn. Records beyond an endpoint's queue room are parked until
/// their turn, so they come back about when the endpoint can take them.
#[derive(Default)]
struct Turns {
    next: HashMap<EndpointId, SystemTime>,
}

impl Turns {
    /// Books the turn of a record of `id` (which sends `rate` records a second) parked at `now`
    /// behind `queued` records: one interval of the rate after the last turn booked, and no
    /// sooner than those queued are sent. Returns when the record is due: its turn, or
    /// `now + horizon` when its turn lies beyond that (the longest tier). Such a record is not
    /// booked: it books again when it comes back. Booked, it would push every later turn back,
    /// and the records that came back from the longest tier together would book turns behind
    /// one another's, so that the endpoint got a few records per round of the longest tier
    /// rather than its rate.
    fn book(
        &mut self,
        id: &EndpointId,
        rate: f64,
        queued: usize,
        now: SystemTime,
        horizon: Duration,
    ) -> SystemTime {
        let step = Duration::from_secs_f64(1.0 / rate);
        let after_queue = now + step.mul_f64(queued as f64);
        let turn = self
            .next
            .get(id)
            .map_or(after_queue, |next| (*next).max(after_queue));
        let latest = now + horizon;
        if turn > latest {
            return latest;
        }
        if self.next.len() >= crate::limits::MAX_ENDPOINT_ENTRIES {
            self.next.retain(|_, next| *next > now);
        }
        self.next.insert(id.clone(), turn + step);
        turn
    }
}

/// The stage loop's state.
struct Stage {
    deps: Arc<DeliverDeps>,
    producer: crate::kafka::Producer,
    settlements: Settlements,
    lanes: Lanes,
    queues: HashMap<EndpointId, VecDeque<Queued>>,
    plans: HashMap<EndpointId, Arc<SendPlan>>,
    /// The turns booked for records parked because their endpoint sends slower than they
    /// arrive (see [`Stage::booked_turn`]).
    turns: Turns,
    /// When this stage first met a delivery for each endpoint its view lacks or has disabled
    /// (see [`Stage::view_may_be_behind`]).
    unusable_since: HashMap<EndpointId, SystemTime>,
    /// Deliveries waiting for the endpoint view to be confirmed current.
    awaiting_view: Vec<AwaitingView>,
    done_tx: mpsc::UnboundedSender<Done>,
    parks: mpsc::UnboundedSender<(Tp, i64, bool)>,
    tasks: TaskTracker,
    stop: CancellationToken,
    /// Cancelled when a task writing a record's last way out panicked (see
    /// [`Stage::spawn_settling`]): the stage drains and stops.
    broken: CancellationToken,
    breakers_open: telemetry::BreakersOpen,
}

/// Runs the delivery stage until `shutdown`; then parks what is queued, lets in-flight attempts
/// finish within the drain deadline, stores the settled offsets and commits.
///
/// A panicking attempt is logged and its record parked for later (see [`Stage::spawn_attempt`]);
/// the stage goes on. A panic while writing a dead letter or a parked copy stops the stage the
/// same way, before `shutdown`: its supervisor (the service's `spawn_stage`) then stops
/// the process, and the record, never settled, is read again by the next one.
pub async fn run(
    consumer: StageConsumer,
    producer: crate::kafka::Producer,
    deps: Arc<DeliverDeps>,
    shutdown: CancellationToken,
) {
    let (mut stage, (mut done_rx, mut parks_rx)) = Stage::new(deps, producer);
    // Each partition gets its own queue and reader, so a backlog is taken a batch per
    // partition in turn (see `intake`); the consumer's own queue still serves rebalances.
    let consumer = Arc::new(consumer);
    consumer.context().split_partitions(&consumer);
    let mut intake = Intake::new(Intaken::decode);
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            () = stage.broken.cancelled() => break,
            Some(done) = done_rx.recv() => stage.on_done(done),
            Some((tp, offset, acked)) = parks_rx.recv() => if acked { stage.settlements.settle(&tp, offset) },
            _ = tick.tick() => stage.on_tick(&consumer, &mut intake),
            batch = intake.recv() => {
                stage.sync(&consumer, &mut intake);
                if intake.is_current(&batch) {
                    let tp = batch.tp;
                    for (offset, intaken) in batch.records {
                        stage.take(&consumer, tp.clone(), offset, intaken);
                    }
                }
            }
            // Records of a partition whose queue could not be split, if any.
            msg = consumer.recv() => match msg {
                Ok(m) => {
                    stage.sync(&consumer, &mut intake);
                    let tp: Tp = (Arc::from(m.topic()), m.partition());
                    let offset = m.offset();
                    let intaken = Intaken::decode(&m);
                    drop(m);
                    stage.take(&consumer, tp, offset, intaken);
                }
                Err(e) => telemetry::consumer_error("deliver", &e),
            },
        }
    }
    intake.close(&consumer).await;
    // Shutdown: queued records go to the shortest tier; in-flight attempts get the deadline.
    let queued: Vec<Queued> = stage.queues.drain().flat_map(|(_, q)| q).collect();
    for q in queued {
        let due = SystemTime::now();
        stage.park(q.tp, q.offset, q.record, due, ParkReason::LaneFull);
    }
    stage.tasks.close();
    let deadline = tokio::time::sleep(stage.deps.drain_deadline);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            Some(done) = done_rx.recv() => stage.on_done(done),
            Some((tp, offset, acked)) = parks_rx.recv() => if acked { stage.settlements.settle(&tp, offset) },
            () = stage.tasks.wait() => break,
            () = &mut deadline => {
                tracing::warn!("drain deadline passed; unfinished deliveries will be re-read on restart");
                stage.stop.cancel();
                break;
            }
        }
    }
    while let Ok(done) = done_rx.try_recv() {
        stage.on_done(done);
    }
    while let Ok((tp, offset, acked)) = parks_rx.try_recv() {
        if acked {
            stage.settlements.settle(&tp, offset);
        }
    }
    stage.settlements.store(&*consumer);
    if let Err(e) = rdkafka::consumer::Consumer::commit_consumer_state(
        &*consumer,
        rdkafka::consumer::CommitMode::Sync,
    ) {
        tracing::debug!(error = %e, "final commit of the delivery stage");
    }
    stage.stop.cancel();
}

/// A delivery record as its partition's reader decoded it.
struct Intaken {
    decoded: Result<DeliveryRecord, crate::record::RecordError>,
    /// The raw key and value, kept only to forward an undecodable record as it was.
    raw: Option<(Option<Vec<u8>>, Option<Bytes>)>,
}

impl Intaken {
    fn decode(m: &BorrowedMessage<'_>) -> Intaken {
        let decoded = DeliveryRecord::from_message(m);
        let raw = decoded.is_err().then(|| {
            (
                m.key().map(<[u8]>::to_vec),
                m.payload().map(Bytes::copy_from_slice),
            )
        });
        Intaken { decoded, raw }
    }
}

/// What the stage's attempt tasks report back: their answers and results, and parked records'
/// acknowledgements (`(partition, offset, acknowledged)`).
type StageReports = (
    mpsc::UnboundedReceiver<Done>,
    mpsc::UnboundedReceiver<(Tp, i64, bool)>,
);

impl Stage {
    /// A stage with nothing assigned yet, and the receiving ends of its tasks' reports.
    fn new(deps: Arc<DeliverDeps>, producer: crate::kafka::Producer) -> (Stage, StageReports) {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let (parks_tx, parks_rx) = mpsc::unbounded_channel();
        let stage = Stage {
            settlements: Settlements::new("deliver", deps.max_window),
            lanes: Lanes::new(deps.lanes),
            queues: HashMap::new(),
            plans: HashMap::new(),
            turns: Turns::default(),
            unusable_since: HashMap::new(),
            awaiting_view: Vec::new(),
            deps,
            producer,
            done_tx,
            parks: parks_tx,
            tasks: TaskTracker::new(),
            // Cancelled only when the drain deadline passes: in-flight work keeps going until
            // then.
            stop: CancellationToken::new(),
            broken: CancellationToken::new(),
            breakers_open: telemetry::BreakersOpen::default(),
        };
        (stage, (done_rx, parks_rx))
    }

    /// Tracks a record taken from `tp` and hands it on, pausing the partition at once when
    /// the record filled it.
    fn take(&mut self, consumer: &StageConsumer, tp: Tp, offset: i64, intaken: Intaken) {
        if !self.settlements.track(&tp, offset) {
            return;
        }
        let pause = self.settlements.needs_pause(&tp);
        self.on_record(tp, offset, intaken.decoded, intaken.raw);
        if pause {
            self.settlements.flow_control(consumer);
        }
    }

    fn on_record(
        &mut self,
        tp: Tp,
        offset: i64,
        decoded: Result<DeliveryRecord, crate::record::RecordError>,
        raw: Option<(Option<Vec<u8>>, Option<Bytes>)>,
    ) {
        let record = match decoded {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(topic = %tp.0, partition = tp.1, offset, error = %e,
                    "undecodable delivery record; sending it to the invalid topic");
                let (key, payload) = raw.unwrap_or_default();
                let out = invalid_forward(
                    self.deps.invalid_topic.clone(),
                    key.unwrap_or_default(),
                    rdkafka::message::OwnedHeaders::new(),
                    payload.unwrap_or_default(),
                    "bad_delivery_record",
                    &e.to_string(),
                );
                self.produce_then_settle(tp, offset, out);
                return;
            }
        };
        let endpoint = match self.deps.endpoints.get(&record.endpoint_id) {
            Some(e) if e.enabled => {
                if !self.unusable_since.is_empty() {
                    self.unusable_since.remove(&e.id);
                }
                e
            }
            found => {
                if self.view_may_be_behind(&record.endpoint_id) {
                    self.awaiting_view.push(AwaitingView {
                        tp,
                        offset,
                        record,
                        since: tokio::time::Instant::now(),
                    });
                    return;
                }
                let reason = if found.is_some() {
                    DeadReason::EndpointDisabled
                } else {
                    DeadReason::EndpointDeleted
                };
                self.spawn_refusal(tp, offset, record, reason);
                return;
            }
        };
        // A record that arrives early (replayed into a tier by hand, clock skew) waits again.
        if let Some(due) = record
            .due_at()
            .filter(|d| *d > SystemTime::now() + Duration::from_secs(1))
        {
            self.park(tp, offset, record, due, ParkReason::LaneFull);
            return;
        }
        if let Some(due) = self.park_if_stalled(&endpoint.id) {
            self.park(tp, offset, record, due, ParkReason::Stalled);
            return;
        }
        let queued = self.queues.get(&endpoint.id).map_or(0, VecDeque::len);
        if queued >= self.deps.lane_queue {
            self.park_briefly(tp, offset, record, ParkReason::LaneFull);
            return;
        }
        if let Some(due) = self.booked_turn(&endpoint, queued) {
            self.park(tp, offset, record, due, ParkReason::SlowEndpoint);
            return;
        }
        let id = endpoint.id.clone();
        self.queues
            .entry(id.clone())
            .or_default()
            .push_back(Queued {
                tp,
                offset,
                record,
                endpoint,
            });
        self.dispatch(&id);
    }

    /// Whether this instance's endpoint view may lack a write that the instance which made a
    /// delivery for `id` had seen, so that `id` looks deleted or disabled here only because the
    /// view is behind (an endpoint created or re-enabled a moment ago, on another instance).
    ///
    /// That instance found the endpoint usable before this stage first met a delivery for it
    /// that it could not use. Once the view is confirmed to hold every write made before that
    /// moment, what it says stands. Until then a confirmation is requested and the delivery
    /// waits here (see [`Stage::recheck_awaiting_view`]); a confirmation takes a watermark
    /// request and the view's catching up, a few milliseconds normally.
    fn view_may_be_behind(&mut self, id: &EndpointId) -> bool {
        if self.unusable_since.len() >= crate::limits::MAX_ENDPOINT_ENTRIES
            && !self.unusable_since.contains_key(id)
        {
            self.unusable_since.clear();
        }
        let since = *self
            .unusable_since
            .entry(id.clone())
            .or_insert_with(SystemTime::now);
        if self.deps.endpoints.holds_writes_before(since) {
            return false;
        }
        self.deps.endpoints.request_confirmation();
        true
    }

    /// Looks again at the deliveries waiting for the endpoint view (see
    /// [`Stage::view_may_be_behind`]): each whose endpoint is usable now, or whose view is now
    /// confirmed, goes on as it would have; one that has waited [`VIEW_PATIENCE`] is parked in
    /// the shortest tier (`view_behind`, its window started) so its offset does not hold its
    /// partition while the view cannot be confirmed; the rest wait on, with the confirmation
    /// asked for again.
    fn recheck_awaiting_view(&mut self) {
        if self.awaiting_view.is_empty() {
            return;
        }
        let now = tokio::time::Instant::now();
        for a in std::mem::take(&mut self.awaiting_view) {
            let usable = self
                .deps
                .endpoints
                .get(&a.record.endpoint_id)
                .is_some_and(|e| e.enabled);
            if usable || !self.view_may_be_behind(&a.record.endpoint_id) {
                self.on_record(a.tp, a.offset, Ok(a.record), None);
            } else if now.duration_since(a.since) >= VIEW_PATIENCE {
                self.park_briefly(a.tp, a.offset, a.record, ParkReason::ViewBehind);
            } else {
                self.awaiting_view.push(a);
            }
        }
    }

    /// How many records a second `endpoint` sends: its rate limit, or what its lane completes at
    /// its concurrency limit and recent answer time, whichever is lower. `None` when neither is
    /// known (no rate limit, and no answer yet).
    fn send_rate(&self, endpoint: &Endpoint) -> Option<f64> {
        let limit = endpoint.rate_limit_per_s.filter(|r| *r > 0.0);
        let completes = self.lanes.throughput(&endpoint.id);
        match (limit, completes) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// `endpoint`'s send rate and the room its queue has at that rate (see [`queue_room`]):
    /// what it sends within the shortest tier's delay. `None` while its rate is not known.
    fn rate_and_room(&self, endpoint: &Endpoint) -> Option<(f64, usize)> {
        let rate = self.send_rate(endpoint)?;
        Some((rate, queue_room(rate, self.deps.tiers.shortest().delay)))
    }

    /// When `endpoint`'s queue (`queued` records) already holds what it sends within the
    /// shortest tier's delay (see [`Stage::send_rate`] and [`queue_room`]): the time a record
    /// arriving now gets its turn (see [`Turns::book`]). The record is parked until then. Held
    /// here instead, a slow endpoint's backlog would fill its partition's window (at 1 request
    /// a second, 1,000 records wait 17 minutes), and every endpoint sharing the partition would
    /// wait behind it. An endpoint whose send rate is not known yet queues up to `lane_queue`;
    /// [`Stage::shed_excess`] parks the surplus once its first answer gives it a rate.
    fn booked_turn(&mut self, endpoint: &Endpoint, queued: usize) -> Option<SystemTime> {
        // The room is at least one record: an empty queue takes it without a look at the rate.
        if queued == 0 {
            return None;
        }
        let (rate, room) = self.rate_and_room(endpoint)?;
        if queued < room {
            return None;
        }
        telemetry::slow_endpoint(endpoint.id.as_str(), rate, room);
        let longest = self.deps.tiers.longest().delay;
        Some(
            self.turns
                .book(&endpoint.id, rate, queued, SystemTime::now(), longest),
        )
    }

    /// Parks what `id`'s queue holds beyond what the endpoint sends within the shortest tier,
    /// each record until its turn. Records queued before the endpoint's first answer (when its
    /// send rate was not known), or while it answered faster, would otherwise stay and hold
    /// their partition's window until the endpoint got through them.
    fn shed_excess(&mut self, id: &EndpointId) {
        let Some(endpoint) = self
            .queues
            .get(id)
            .and_then(|q| q.front())
            .map(|front| front.endpoint.clone())
        else {
            return;
        };
        let Some((rate, room)) = self.rate_and_room(&endpoint) else {
            return;
        };
        let Some(queue) = self.queues.get_mut(id).filter(|q| q.len() > room) else {
            return;
        };
        let excess = queue.split_off(room);
        telemetry::slow_endpoint(id.as_str(), rate, room);
        let longest = self.deps.tiers.longest().delay;
        let now = SystemTime::now();
        for q in excess {
            let due = self.turns.book(id, rate, room, now, longest);
            self.park(q.tp, q.offset, q.record, due, ParkReason::SlowEndpoint);
        }
    }

    fn lane_config(&self, endpoint: &Endpoint) -> LaneConfig {
        LaneConfig {
            max_in_flight: endpoint
                .max_in_flight
                .unwrap_or(self.deps.default_max_in_flight),
            rate_limit_per_s: endpoint.rate_limit_per_s,
        }
    }

    /// Starts as many queued attempts for `id` as its lane admits; parks the queue when the
    /// breaker is open.
    fn dispatch(&mut self, id: &EndpointId) {
        while let Some(front) = self.queues.get(id).and_then(|q| q.front()) {
            let cfg = self.lane_config(&front.endpoint);
            match self.lanes.try_acquire(id, cfg, tokio::time::Instant::now()) {
                Ok(permit) => {
                    let q = self
                        .queues
                        .get_mut(id)
                        .and_then(VecDeque::pop_front)
                        .expect("front exists");
                    self.spawn_attempt(q, permit);
                }
                Err(Refusal::Concurrency | Refusal::RateLimited { .. }) => break,
                Err(Refusal::BreakerOpen { retry_at }) => {
                    let wait = retry_at.saturating_duration_since(tokio::time::Instant::now());
                    let due = SystemTime::now() + wait;
                    for q in self.queues.remove(id).unwrap_or_default() {
                        self.park(q.tp, q.offset, q.record, due, ParkReason::BreakerOpen);
                    }
                    break;
                }
                Err(Refusal::TooManyLanes) => {
                    let q = self
                        .queues
                        .get_mut(id)
                        .and_then(VecDeque::pop_front)
                        .expect("front exists");
                    self.park_briefly(q.tp, q.offset, q.record, ParkReason::LaneFull);
                }
            }
        }
        if self.queues.get(id).is_some_and(VecDeque::is_empty) {
            self.queues.remove(id);
        }
    }

    /// When `id` is stalled (its lane full and silent for `stall_after`), parks its whole queue
    /// and returns when its records are due again: they should not wait here either. Its queue
    /// would otherwise grow to the partition's window and pause the endpoints sharing the
    /// partition until the hanging requests time out. They come back no sooner than those
    /// requests end (by then the breaker knows), in the tier that fits: a shorter wait would
    /// only cycle them through a tier again and again.
    fn park_if_stalled(&mut self, id: &EndpointId) -> Option<SystemTime> {
        if !self
            .lanes
            .stalled(id, tokio::time::Instant::now(), self.deps.stall_after)
        {
            return None;
        }
        let due = SystemTime::now() + self.deps.tiers.at_least(self.deps.stalled_wait).delay;
        for q in self.queues.remove(id).unwrap_or_default() {
            self.park(q.tp, q.offset, q.record, due, ParkReason::Stalled);
        }
        Some(due)
    }

    /// The send plan for `endpoint`, built when it changed or was never used here.
    fn plan(&mut self, endpoint: &Endpoint) -> Arc<SendPlan> {
        let now = SystemTime::now();
        if let Some(plan) = self.plans.get(&endpoint.id)
            && plan.fits(endpoint, now)
        {
            return plan.clone();
        }
        if self.plans.len() >= crate::limits::MAX_ENDPOINT_ENTRIES {
            self.plans.clear();
        }
        let plan = Arc::new(SendPlan::build(endpoint, now));
        self.plans.insert(endpoint.id.clone(), plan.clone());
        plan
    }

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
    fn spawn_attempt(&mut self, q: Queued, permit: Permit) {
        use futures::FutureExt as _;
        let plan = self.plan(&q.endpoint);
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

    fn spawn_refusal(&self, tp: Tp, offset: i64, record: DeliveryRecord, reason: DeadReason) {
        let deps = self.deps.clone();
        let producer = self.producer.clone();
        let stop = self.stop.clone();
        let read_at = record_position(&tp, offset);
        self.spawn_settling(tp, offset, async move {
            match deps.refuse(record, Some(read_at), reason, &stop).await {
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
    fn spawn_settling(
        &self,
        tp: Tp,
        offset: i64,
        write: impl std::future::Future<Output = bool> + Send + 'static,
    ) {
        use futures::FutureExt as _;
        let parks = self.parks.clone();
        let broken = self.broken.clone();
        self.tasks.spawn(async move {
            match std::panic::AssertUnwindSafe(write).catch_unwind().await {
                Ok(acked) => {
                    let _ = parks.send((tp, offset, acked));
                }
                Err(panic) => {
                    telemetry::settling_panicked(
                        &tp.0,
                        tp.1,
                        offset,
                        &telemetry::panic_message(&*panic),
                    );
                    broken.cancel();
                }
            }
        });
    }

    /// Parks `record` until the shortest tier brings it back (see [`Stage::park`]).
    fn park_briefly(&self, tp: Tp, offset: i64, record: DeliveryRecord, reason: ParkReason) {
        let due = SystemTime::now() + self.deps.tiers.shortest().delay;
        self.park(tp, offset, record, due, reason);
    }

    /// Parks `record` in the tier matching `due`; settles it once the broker has it.
    ///
    /// A record never attempted and held back because its endpoint is failing (breaker open, or
    /// stalled) starts its window then, as a first attempt would, and is dead-lettered
    /// (`window_exhausted`) rather than parked once the window is spent. Otherwise a dead
    /// endpoint's backlog would cycle through the tiers for ever and never reach the DLQ. A
    /// record attempted before waits for the breaker's probe as it did: its last attempt's
    /// answer belongs in its DLQ record, and there are few of them (what was in flight when the
    /// breaker opened). A record whose attempt panicked, or whose endpoint view is not confirmed
    /// current, starts its window as well, attempted before or not: one that panics every time,
    /// or waits on a view that cannot be confirmed, is dead-lettered once its window is spent
    /// instead of coming back for ever.
    fn park(
        &self,
        tp: Tp,
        offset: i64,
        record: DeliveryRecord,
        due: SystemTime,
        reason: ParkReason,
    ) {
        let held_back = match reason {
            ParkReason::BreakerOpen | ParkReason::Stalled => record.attempts == 0,
            ParkReason::ViewBehind | ParkReason::Panicked => true,
            ParkReason::LaneFull | ParkReason::SlowEndpoint => false,
        };
        let record = if held_back {
            let now = SystemTime::now();
            let record = record.with_first_attempt_at(now);
            let first = record
                .first_attempt_at
                .map_or(now, UnixMillis::to_system_time);
            if now.duration_since(first).unwrap_or_default() >= self.deps.policy.window {
                self.spawn_refusal(tp, offset, record, DeadReason::WindowExhausted);
                return;
            }
            record
        } else {
            record
        };
        telemetry::parked(reason);
        let wait = due.duration_since(SystemTime::now()).unwrap_or_default();
        let tier = self.deps.tiers.for_delay(wait);
        let out = outgoing(tier.topic.clone(), &record.for_park(due));
        self.produce_then_settle(tp, offset, out);
    }

    fn produce_then_settle(&self, tp: Tp, offset: i64, out: Outgoing) {
        let producer = self.producer.clone();
        let stop = self.stop.clone();
        self.spawn_settling(tp, offset, async move {
            produce_until_acked(&producer, out, &stop).await
        });
    }

    fn on_done(&mut self, done: Done) {
        match done {
            Done::Answered { permit, health, at } => {
                let id = permit.endpoint().clone();
                match self
                    .lanes
                    .release_answered(permit, health, tokio::time::Instant::now(), at)
                {
                    Some(Transition::Opened { cool_down, .. }) => {
                        telemetry::breaker_opened(id.as_str(), cool_down)
                    }
                    Some(Transition::Closed) => telemetry::breaker_closed(id.as_str()),
                    None => {}
                }
                self.dispatch(&id);
            }
            Done::Finished {
                tp,
                offset,
                disable,
                settled,
            } => {
                if settled {
                    self.settlements.settle(&tp, offset);
                }
                if let Some(gone) = disable {
                    self.disable(gone);
                }
            }
            Done::Panicked { tp, offset, record } => {
                self.park_briefly(tp, offset, *record, ParkReason::Panicked);
            }
        }
    }

    /// Disables an endpoint whose receiver answered 410 Gone.
    fn disable(&self, id: EndpointId) {
        let Some(current) = self.deps.endpoints.get(&id) else {
            return;
        };
        if !current.enabled {
            return;
        }
        let writer = self.deps.endpoint_writer.clone();
        tokio::spawn(async move {
            let mut endpoint = (*current).clone();
            endpoint.disable(crate::endpoint::DISABLED_GONE, SystemTime::now());
            match writer.put(&endpoint).await {
                Ok(_) => telemetry::endpoint_disabled(id.as_str()),
                Err(e) => {
                    tracing::warn!(endpoint_id = %id, error = %e, "disabling the endpoint failed")
                }
            }
        });
    }

    /// Applies rebalance events: queued records of moved partitions are re-read by their
    /// owner, so they are dropped here along with the partitions' tracking.
    /// The intake's readers of moved partitions stop with them; newly split queues get theirs.
    fn sync(&mut self, consumer: &StageConsumer, intake: &mut Intake<Intaken>) {
        let events = self.settlements.sync(consumer);
        intake.follow(consumer, &events);
        for e in events {
            let (RebalanceEvent::Revoked(tps) | RebalanceEvent::Assigned(tps)) = e;
            for q in self.queues.values_mut() {
                q.retain(|item| !tps.contains(&item.tp));
            }
            self.queues.retain(|_, q| !q.is_empty());
            self.awaiting_view.retain(|a| !tps.contains(&a.tp));
        }
    }

    fn on_tick(&mut self, consumer: &StageConsumer, intake: &mut Intake<Intaken>) {
        self.sync(consumer, intake);
        self.recheck_awaiting_view();
        // Rate-limited lanes get another chance each tick; stalled ones give their queue up.
        // Slow ones give up what they cannot send soon.
        let waiting: Vec<EndpointId> = self.queues.keys().cloned().collect();
        for id in waiting {
            if self.park_if_stalled(&id).is_none() {
                self.dispatch(&id);
                self.shed_excess(&id);
            }
        }
        self.lanes.evict_idle(tokio::time::Instant::now());
        // Breakers opened, closed, or dropped with their lane (idle, for room, endpoint
        // deleted) since the last tick.
        self.breakers_open.report(self.lanes.open_breakers());
        self.settlements.store(consumer);
        self.settlements.flow_control(consumer);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::atomic::{AtomicU64, Ordering};

    use async_trait::async_trait;
    use tokio::sync::{Semaphore, oneshot};

    use super::*;
    use crate::endpoint::CreateEndpoint;
    use crate::event_type::EventType;
    use crate::id::{DeliveryId, EventId, Tenant};
    use crate::registry::MemoryEndpointStore;
    use crate::sealed::MasterKey;
    use crate::storage::hooked::{Hooked, Hooks};
    use crate::storage::memory::MemoryStore;

    /// What goes wrong in a [`FaultyStore`]'s `record_attempt`.
    enum Fault {
        /// Each write waits for a permit of the semaphore.
        Gate(Semaphore),
        /// The write of a row of this event panics (a bug in the store).
        Panic(EventId),
    }

    /// A memory store whose `record_attempt` suffers a [`Fault`].
    type FaultyStore = Hooked<Fault>;

    #[async_trait]
    impl Hooks for Fault {
        async fn before_record_attempt(&self, row: &AttemptRow) {
            match self {
                Fault::Gate(gate) => gate.acquire().await.expect("gate open").forget(),
                Fault::Panic(id) if *id == row.event_id => {
                    panic!("injected: the store broke on {id}")
                }
                Fault::Panic(_) => {}
            }
        }
    }

    fn faulty_store(fault: Fault) -> Arc<FaultyStore> {
        Arc::new(Hooked::new(fault, 16))
    }

    #[test]
    fn the_queue_holds_what_the_endpoint_sends_within_the_horizon() {
        let second = Duration::from_secs(1);
        assert_eq!(queue_room(2.0, second), 2);
        assert_eq!(queue_room(2.0, Duration::from_secs(5)), 10);
        assert_eq!(queue_room(2.5, second), 3, "rounded up");
        assert_eq!(queue_room(0.1, second), 1, "at least one");
        assert_eq!(queue_room(f64::INFINITY, second), usize::MAX);
    }

    #[test]
    fn turns_follow_the_rate_behind_the_queue() {
        let mut turns = Turns::default();
        let (a, b) = (
            EndpointId::parse("ep_a").unwrap(),
            EndpointId::parse("ep_b").unwrap(),
        );
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let s = Duration::from_secs;
        let horizon = s(60);
        // 2 a second behind 4 queued: the first turn comes when those 4 are sent, the next ones
        // half a second apart.
        let booked: Vec<SystemTime> = (0..3)
            .map(|_| turns.book(&a, 2.0, 4, now, horizon))
            .collect();
        assert_eq!(
            booked,
            [now + s(2), now + Duration::from_millis(2_500), now + s(3)]
        );
        // Each endpoint has its own turns.
        assert_eq!(turns.book(&b, 1.0, 1, now, horizon), now + s(1));
        // A longer queue than the turns booked pushes the next turn behind it.
        assert_eq!(turns.book(&a, 2.0, 10, now, horizon), now + s(5));
        assert_eq!(
            turns.book(&a, 2.0, 1, now, horizon),
            now + Duration::from_millis(5_500)
        );
        // Turns gone by are not handed out again: the next is behind the queue as of now.
        let later = now + s(100);
        assert_eq!(turns.book(&a, 2.0, 2, later, horizon), later + s(1));
    }

    #[test]
    fn a_turn_beyond_the_horizon_is_not_booked() {
        let mut turns = Turns::default();
        let a = EndpointId::parse("ep_a").unwrap();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let s = Duration::from_secs;
        // 1 a second, a horizon of 5 s: turns at 1..=5 s, then the rest come back at 5 s
        // without a turn, however many there are.
        let due: Vec<SystemTime> = (0..8).map(|_| turns.book(&a, 1.0, 1, now, s(5))).collect();
        let expected: Vec<SystemTime> = [1, 2, 3, 4, 5, 5, 5, 5]
            .iter()
            .map(|d| now + s(*d))
            .collect();
        assert_eq!(due, expected);
        // Back at 5 s, they book the turns from 6 s on, one a second: the endpoint's rate, not
        // a turn after every record sent to the horizon.
        let back = now + s(5);
        let due: Vec<SystemTime> = (0..6).map(|_| turns.book(&a, 1.0, 0, back, s(5))).collect();
        let expected: Vec<SystemTime> = [1, 2, 3, 4, 5, 5].iter().map(|d| back + s(*d)).collect();
        assert_eq!(due, expected);
    }

    /// A receiver on loopback that answers 200 and counts requests.
    async fn receiver() -> (String, Arc<AtomicU64>) {
        let hits = Arc::new(AtomicU64::new(0));
        let counted = hits.clone();
        let app = axum::Router::new().fallback(move || {
            let hits = counted.clone();
            async move {
                hits.fetch_add(1, Ordering::SeqCst);
                "ok"
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (format!("http://{addr}/hook"), hits)
    }

    /// An endpoint to `url` that takes one request at a time, and the delivery stage's
    /// dependencies around it and `store`, with dev defaults and topics named `t.*`.
    async fn one_at_a_time(
        url: String,
        store: Arc<dyn DeliveryStore>,
    ) -> (Arc<Endpoint>, Arc<DeliverDeps>) {
        let endpoints = Arc::new(MemoryEndpointStore::new(MasterKey::generate()));
        let endpoint = endpoint_at(&endpoints, url, 1).await;
        (
            endpoint,
            Arc::new(deps_on(&endpoints, store, &DEFAULT_TIERS)),
        )
    }

    /// The delay tiers of a default config.
    const DEFAULT_TIERS: [Duration; 6] = [
        Duration::from_secs(5),
        Duration::from_secs(30),
        Duration::from_secs(120),
        Duration::from_secs(600),
        Duration::from_secs(3600),
        Duration::from_secs(6 * 3600),
    ];

    /// A sender that may reach plain http on loopback, as `hookline dev`'s may.
    fn loopback_sender() -> Sender {
        Sender::new(crate::sender::SenderConfig {
            allow_http: true,
            policy: crate::ssrf::Policy::with_allowed([
                "127.0.0.0/8".parse().unwrap(),
                "::1/128".parse().unwrap(),
            ]),
            ..Default::default()
        })
        .unwrap()
    }

    /// A producer with hookline's settings to the (mock) cluster at `bootstrap`.
    fn producer_to(bootstrap: &str) -> crate::kafka::Producer {
        crate::kafka::producer_config(bootstrap, &Default::default())
            .create_with_context(crate::kafka::ProducerLog::default())
            .unwrap()
    }

    /// An endpoint of tenant `acme` at `url`, written to `endpoints`.
    async fn endpoint_at(
        endpoints: &MemoryEndpointStore,
        url: String,
        max_in_flight: u32,
    ) -> Arc<Endpoint> {
        let created = Endpoint::create(
            CreateEndpoint {
                tenant: Tenant::parse("acme").unwrap(),
                url,
                event_types: vec!["*".into()],
                max_in_flight: Some(max_in_flight),
                rate_limit_per_s: None,
                secret: None,
            },
            SystemTime::now(),
        )
        .unwrap();
        endpoints.put(&created).await.unwrap()
    }

    /// The stage's dependencies on `endpoints` and `store`, with delay tiers `tiers` (topics
    /// `t.retry.<tier>`). Queues hold up to 100 records; nothing stalls within 30 s.
    fn deps_on(
        endpoints: &Arc<MemoryEndpointStore>,
        store: Arc<dyn DeliveryStore>,
        tiers: &[Duration],
    ) -> DeliverDeps {
        DeliverDeps {
            endpoints: endpoints.view().clone(),
            endpoint_writer: endpoints.clone(),
            store,
            sender: loopback_sender(),
            policy: RetryPolicy::default(),
            tiers: Arc::new(Tiers::new("t.retry.", tiers)),
            dlq_topic: Arc::from("t.dlq"),
            invalid_topic: Arc::from("t.invalid"),
            lanes: LanesConfig::default(),
            default_max_in_flight: 1,
            max_window: 100,
            lane_queue: 100,
            stall_after: Duration::from_secs(30),
            stalled_wait: Duration::from_secs(15),
            drain_deadline: Duration::from_secs(20),
        }
    }

    /// A delivery of event `event` to `endpoint_id`, of tenant `acme`.
    fn delivery_for(endpoint_id: &EndpointId, event: &str) -> DeliveryRecord {
        DeliveryRecord::new(
            EventId::parse(event).unwrap(),
            endpoint_id.clone(),
            Tenant::parse("acme").unwrap(),
            EventType::parse("order.created").unwrap(),
            UnixMillis::from(SystemTime::now()),
            None,
            Bytes::from_static(b"{}"),
        )
    }

    #[tokio::test]
    async fn the_lane_slot_is_given_back_before_the_attempt_is_logged() {
        let (url, hits) = receiver().await;
        let store = faulty_store(Fault::Gate(Semaphore::new(0)));
        let (endpoint, deps) = one_at_a_time(url, store.clone()).await;
        let record = delivery_for(&endpoint.id, "evt_1");
        let delivery = record.delivery_id.clone();
        let plan = SendPlan::build(&endpoint, SystemTime::now());
        let (answered_tx, answered_rx) = oneshot::channel();
        let attempt = tokio::spawn({
            let deps = deps.clone();
            async move {
                let stop = CancellationToken::new();
                deps.attempt(&record, None, &endpoint, &plan, &stop, |health| {
                    let _ = answered_tx.send(health);
                })
                .await
            }
        });

        // The store write is held back: the endpoint's answer must be reported anyway.
        let health = tokio::time::timeout(Duration::from_secs(10), answered_rx)
            .await
            .expect("the answer was reported while the store write was still waiting")
            .unwrap();
        assert_eq!(health, Some(breaker::Outcome::Healthy));
        assert_eq!(hits.load(Ordering::SeqCst), 1);
        assert!(store.inner.attempts(&delivery).await.unwrap().is_empty());
        assert!(
            !attempt.is_finished(),
            "not settled before its row is logged"
        );

        let Fault::Gate(gate) = &store.hooks else {
            unreachable!("a gated store")
        };
        gate.add_permits(1);
        let report = attempt.await.unwrap().expect("logged and reported");
        assert!(report.follow_up.is_none());
        assert_eq!(store.inner.attempts(&delivery).await.unwrap().len(), 1);
    }

    /// An endpoint's answer time ends when its answer came, not when the stage got round to
    /// it: two slots whose answers come after 1 s send 2 a second, however late the stage
    /// reads them.
    // The mock cluster is not Send: current-thread runtime.
    #[tokio::test(start_paused = true)]
    async fn the_answer_time_ends_at_the_answer_not_when_the_stage_reads_it() {
        use rdkafka::mocking::MockCluster;

        let mock = MockCluster::new(1).unwrap();
        let s = Duration::from_secs;
        let endpoints = Arc::new(MemoryEndpointStore::new(MasterKey::generate()));
        let endpoint = endpoint_at(&endpoints, "http://127.0.0.1:9/hook".into(), 2).await;
        let deps = deps_on(
            &endpoints,
            Arc::new(MemoryStore::with_capacity(16)),
            &[s(1)],
        );
        let producer = producer_to(&mock.bootstrap_servers());
        let (mut stage, _reports) = Stage::new(Arc::new(deps), producer);
        let id = endpoint.id.clone();
        let cfg = stage.lane_config(&endpoint);
        for _ in 0..2 {
            let now = tokio::time::Instant::now();
            let permits = [(); 2].map(|()| stage.lanes.try_acquire(&id, cfg, now).unwrap());
            tokio::time::advance(s(1)).await;
            let at = tokio::time::Instant::now();
            // The stage is busy for another 2 s before it reads the answers.
            tokio::time::advance(s(2)).await;
            for permit in permits {
                stage.on_done(Done::Answered {
                    permit,
                    health: Some(breaker::Outcome::Healthy),
                    at,
                });
            }
        }
        assert_eq!(stage.lanes.throughput(&id), Some(2.0));
    }

    /// A slow endpoint's queue, filled before its first answer told its rate, is cut to what it
    /// sends within the shortest tier once the rate is known; the rest is parked and settles
    /// once the tier has it, and so is a record arriving after. The endpoint's lane is kept full
    /// by hand, so nothing is sent.
    // The mock cluster is not Send: current-thread runtime.
    #[tokio::test]
    async fn a_slow_endpoints_queue_is_cut_to_what_it_sends_within_the_shortest_tier() {
        use metrics_exporter_prometheus::PrometheusBuilder;
        use rdkafka::mocking::MockCluster;

        // Parks are counted on this thread, as they are made.
        let recorder = PrometheusBuilder::new().build_recorder();
        let counted = recorder.handle();
        let _local = metrics::set_default_local_recorder(&recorder);
        let mock = MockCluster::new(1).unwrap();
        let s = Duration::from_secs;
        let endpoints = Arc::new(MemoryEndpointStore::new(MasterKey::generate()));
        let endpoint = endpoint_at(&endpoints, "http://127.0.0.1:9/hook".into(), 2).await;
        let deps = Arc::new(deps_on(
            &endpoints,
            Arc::new(MemoryStore::with_capacity(16)),
            &[s(1), s(5)],
        ));
        for tier in deps.tiers.all() {
            mock.create_topic(&tier.topic, 1, 1).unwrap();
        }
        let producer = producer_to(&mock.bootstrap_servers());
        let (mut stage, (_done_rx, mut parks_rx)) = Stage::new(deps, producer);
        let id = endpoint.id.clone();
        let tp: Tp = (Arc::from("t.deliveries"), 0);
        let take = |stage: &mut Stage, offset: i64| {
            let record = delivery_for(&endpoint.id, &format!("evt_{offset}"));
            stage.on_record(tp.clone(), offset, Ok(record), None);
        };
        // Both request slots taken, as by two requests in flight.
        let cfg = stage.lane_config(&endpoint);
        let t0 = tokio::time::Instant::now();
        let first = stage.lanes.try_acquire(&id, cfg, t0).unwrap();
        let _second = stage.lanes.try_acquire(&id, cfg, t0).unwrap();
        // Before its first answer the endpoint's rate is unknown: 20 records queue.
        for offset in 0..20 {
            take(&mut stage, offset);
        }
        assert_eq!(stage.queues[&id].len(), 20);
        stage.shed_excess(&id);
        assert_eq!(stage.queues[&id].len(), 20, "nothing to go by yet");

        // One answer after 1 s, its slot taken again: one round is no evidence yet.
        stage
            .lanes
            .release(first, Some(breaker::Outcome::Healthy), t0 + s(1));
        let third = stage.lanes.try_acquire(&id, cfg, t0 + s(1)).unwrap();
        stage.shed_excess(&id);
        assert_eq!(stage.queues[&id].len(), 20, "one round to go by");
        // Another answer after 1 s, a second later: 2 slots of 1 s send 2 a second, and the
        // shortest tier (1 s) holds 2.
        stage
            .lanes
            .release(third, Some(breaker::Outcome::Healthy), t0 + s(2));
        let _fourth = stage.lanes.try_acquire(&id, cfg, t0 + s(2)).unwrap();
        assert_eq!(stage.lanes.throughput(&id), Some(2.0));
        stage.shed_excess(&id);
        let queued: Vec<i64> = stage.queues[&id].iter().map(|q| q.offset).collect();
        assert_eq!(queued, [0, 1], "the oldest stay");
        // A record arriving now is parked too: the queue stays at 2.
        take(&mut stage, 20);
        assert_eq!(stage.queues[&id].len(), 2);

        let mut parked = BTreeSet::new();
        while parked.len() < 19 {
            let (_, offset, acked) = tokio::time::timeout(s(20), parks_rx.recv())
                .await
                .expect("every parked record acknowledged within 20 s")
                .unwrap();
            assert!(acked);
            assert!(parked.insert(offset), "offset {offset} parked twice");
        }
        assert_eq!(parked, (2..=20).collect());
        // Counted as a slow endpoint's, not as a full lane's: an operator tells a receiver that
        // cannot keep up from a burst that filled its queue.
        let text = counted.render();
        assert!(
            text.contains(r#"hookline_parked_total{reason="slow_endpoint"} 19"#),
            "{text}"
        );
        assert!(!text.contains(r#"reason="lane_full""#), "{text}");
    }

    /// A record librdkafka hands out again in the same assignment (see
    /// [`Settlements::track`]) is not queued or sent a second time. The endpoint's lane is
    /// kept full by hand, so what the stage took waits in its queue.
    // The mock cluster is not Send: current-thread runtime.
    #[tokio::test]
    async fn a_record_handed_out_again_is_not_taken_twice() {
        use rdkafka::mocking::MockCluster;

        let mock = MockCluster::new(1).unwrap();
        let endpoints = Arc::new(MemoryEndpointStore::new(MasterKey::generate()));
        let endpoint = endpoint_at(&endpoints, "http://127.0.0.1:9/hook".into(), 1).await;
        let deps = Arc::new(deps_on(
            &endpoints,
            Arc::new(MemoryStore::with_capacity(16)),
            &[Duration::from_secs(5)],
        ));
        let producer = producer_to(&mock.bootstrap_servers());
        let consumer: StageConsumer =
            crate::kafka::consumer_config(&mock.bootstrap_servers(), "g", &Default::default())
                .create_with_context(crate::stage::StageContext::new("deliver"))
                .unwrap();
        let (mut stage, _reports) = Stage::new(deps, producer);
        let cfg = stage.lane_config(&endpoint);
        let _slot = stage
            .lanes
            .try_acquire(&endpoint.id, cfg, tokio::time::Instant::now())
            .unwrap();
        let tp: Tp = (Arc::from("t.deliveries"), 0);
        let intaken = |offset: i64| Intaken {
            decoded: Ok(delivery_for(&endpoint.id, &format!("evt_{offset}"))),
            raw: None,
        };
        for offset in [0, 1, 2, 1, 2, 0] {
            stage.take(&consumer, tp.clone(), offset, intaken(offset));
        }
        let queued: Vec<i64> = stage.queues[&endpoint.id]
            .iter()
            .map(|q| q.offset)
            .collect();
        assert_eq!(queued, [0, 1, 2], "each record taken once");
        assert_eq!(stage.settlements.in_flight(), 3);
    }

    /// The DLQ write of a dead letter is refused for a while: the dead letter is logged and
    /// counted only once the broker acknowledges it, never for the refused tries (a restart in
    /// between would otherwise count it twice, and the log would name a record the DLQ lacks).
    // The mock cluster is not Send: it stays on this test's thread (current-thread runtime),
    // which is also where the local metrics recorder is installed.
    #[tokio::test]
    async fn a_dead_letter_is_counted_once_the_dlq_acknowledges_it() {
        use metrics_exporter_prometheus::PrometheusBuilder;
        use rdkafka::mocking::MockCluster;
        use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

        let mock = MockCluster::new(1).unwrap();
        mock.create_topic("t.dlq", 1, 1).unwrap();
        let producer = producer_to(&mock.bootstrap_servers());
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let _local = metrics::set_default_local_recorder(&recorder);
        let follow_up = || FollowUp {
            out: Outgoing {
                topic: Arc::from("t.dlq"),
                key: b"ep_1".to_vec(),
                headers: rdkafka::message::OwnedHeaders::new(),
                payload: Bytes::from_static(b"{}"),
            },
            landed: Landed::Dead {
                delivery_id: DeliveryId::parse("dlv_1").unwrap(),
                endpoint_id: EndpointId::parse("ep_1").unwrap(),
                reason: DeadReason::Gone,
            },
        };
        let metric = |name: &str| {
            let text = handle.render();
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let dead = r#"hookline_dead_letters_total{reason="gone"}"#;

        mock.request_errors(
            RDKafkaApiKey::Produce,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE; 1_000],
        );
        // Stopped once the DLQ has refused it twice, however long that takes on a busy machine.
        let stop = CancellationToken::new();
        let refused_twice = async {
            let deadline = Instant::now() + Duration::from_secs(30);
            while metric("hookline_produce_retries_total") < 2 {
                assert!(Instant::now() < deadline, "no refusal in 30 s");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            stop.cancel();
        };
        let (acked, ()) = tokio::join!(follow_up().produce(&producer, &stop), refused_twice);
        assert!(!acked, "not acknowledged");
        assert_eq!(metric(dead), 0, "refused, so not counted");

        mock.clear_request_errors(RDKafkaApiKey::Produce);
        let acked = tokio::time::timeout(
            Duration::from_secs(20),
            follow_up().produce(&producer, &CancellationToken::new()),
        )
        .await
        .expect("acknowledged within 20 s once the DLQ accepts records");
        assert!(acked);
        assert_eq!(metric(dead), 1, "{}", handle.render());
    }

    /// An attempt that panics before the endpoint answered drops its slot unanswered: the slot
    /// still comes back to the lane, without a health signal, so an endpoint that takes one
    /// request at a time is not stopped for good.
    #[tokio::test]
    async fn a_slot_dropped_by_a_panic_comes_back_to_its_lane() {
        let id = EndpointId::parse("ep_1").unwrap();
        let one = LaneConfig {
            max_in_flight: 1,
            rate_limit_per_s: None,
        };
        let mut lanes = Lanes::new(LanesConfig::default());
        let now = tokio::time::Instant::now();
        let permit = lanes.try_acquire(&id, one, now).expect("a free lane");
        assert!(matches!(
            lanes.try_acquire(&id, one, now),
            Err(Refusal::Concurrency)
        ));
        let (done, mut reports) = mpsc::unbounded_channel();
        let slot = Slot {
            permit: Some(permit),
            done,
        };
        let attempt = tokio::spawn(async move {
            let _held = slot;
            panic!("injected: a bug before the endpoint answered");
        });
        assert!(attempt.await.unwrap_err().is_panic());

        let Some(Done::Answered { permit, health, .. }) = reports.recv().await else {
            panic!("the slot was not given back");
        };
        assert_eq!(health, None, "a panic says nothing about the endpoint");
        assert!(reports.try_recv().is_err(), "given back once");
        let _ = lanes.release(permit, health, now);
        assert!(
            lanes.try_acquire(&id, one, now).is_ok(),
            "the lane has its slot"
        );
    }

    /// The delivery stage on an embedded cluster, reading `t.deliveries` (one partition) as
    /// group `t-deliver`.
    struct Rig {
        kafka: crate::kafka::EmbeddedKafka,
        shutdown: CancellationToken,
        stage: tokio::task::JoinHandle<()>,
    }

    const DELIVERIES: &str = "t.deliveries";
    const GROUP: &str = "t-deliver";

    impl Rig {
        /// Writes `records` to `t.deliveries`, then starts the stage on it.
        async fn start(deps: Arc<DeliverDeps>, records: &[DeliveryRecord]) -> Rig {
            use crate::kafka::TopicSpec;
            let mut topics = vec![DELIVERIES, "t.dlq", "t.invalid"];
            topics.extend(deps.tiers.all().iter().map(|t| &*t.topic));
            let specs: Vec<TopicSpec> = topics
                .iter()
                .map(|name| TopicSpec {
                    name: (*name).to_owned(),
                    partitions: 1,
                    compacted: false,
                })
                .collect();
            let kafka = crate::kafka::EmbeddedKafka::start(&specs).unwrap();
            let bootstrap = kafka.bootstrap_servers();
            let producer: crate::kafka::Producer =
                crate::kafka::producer_config(bootstrap, &Default::default())
                    .create_with_context(crate::kafka::ProducerLog::default())
                    .unwrap();
            for r in records {
                let out = outgoing(Arc::from(DELIVERIES), r);
                assert!(produce_until_acked(&producer, out, &CancellationToken::new()).await);
            }
            let consumer: StageConsumer = crate::kafka::stage_consumer_config(
                bootstrap,
                GROUP,
                crate::kafka::HOT_FETCH,
                &Default::default(),
            )
            .create_with_context(crate::stage::StageContext::new("deliver"))
            .unwrap();
            consumer.subscribe(&[DELIVERIES]).unwrap();
            let shutdown = CancellationToken::new();
            let stage = tokio::spawn(run(consumer, producer, deps, shutdown.clone()));
            Rig {
                kafka,
                shutdown,
                stage,
            }
        }

        /// The offset the stage's group has committed on `t.deliveries`, if any.
        async fn committed(&self) -> Option<i64> {
            use rdkafka::consumer::BaseConsumer;
            let bootstrap = self.kafka.bootstrap_servers().to_owned();
            tokio::task::spawn_blocking(move || {
                let reader: BaseConsumer =
                    crate::kafka::consumer_config(&bootstrap, GROUP, &Default::default())
                        .set("enable.auto.commit", "false")
                        .create()
                        .unwrap();
                let mut tpl = rdkafka::TopicPartitionList::new();
                tpl.add_partition(DELIVERIES, 0);
                let got = reader.committed_offsets(tpl, Duration::from_secs(5)).ok()?;
                match got.find_partition(DELIVERIES, 0)?.offset() {
                    rdkafka::Offset::Offset(n) => Some(n),
                    _ => None,
                }
            })
            .await
            .unwrap()
        }

        /// Waits until the group has committed `offset` on `t.deliveries` (a minute at most, so
        /// that a stage that never gets there fails the test rather than hanging it).
        async fn committed_reaches(&self, offset: i64) {
            let deadline = Instant::now() + Duration::from_secs(60);
            while self.committed().await < Some(offset) {
                assert!(
                    Instant::now() < deadline,
                    "committed {:?}, never {offset}",
                    self.committed().await
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }

        /// Every record in `topic`, read from the beginning until `n` are there.
        async fn read(&self, topic: &str, n: usize) -> Vec<DeliveryRecord> {
            use rdkafka::consumer::BaseConsumer;
            let bootstrap = self.kafka.bootstrap_servers().to_owned();
            let topic = topic.to_owned();
            tokio::task::spawn_blocking(move || {
                let reader: BaseConsumer =
                    crate::kafka::consumer_config(&bootstrap, "t-reader", &Default::default())
                        .create()
                        .unwrap();
                let mut tpl = rdkafka::TopicPartitionList::new();
                tpl.add_partition_offset(&topic, 0, rdkafka::Offset::Beginning)
                    .unwrap();
                reader.assign(&tpl).unwrap();
                let deadline = Instant::now() + Duration::from_secs(60);
                let mut got = Vec::new();
                while got.len() < n {
                    assert!(Instant::now() < deadline, "{} of {n} in {topic}", got.len());
                    if let Some(Ok(m)) = reader.poll(Duration::from_millis(100)) {
                        got.push(DeliveryRecord::from_message(&m).unwrap());
                    }
                }
                got
            })
            .await
            .unwrap()
        }
    }

    /// The store panics on the first record's attempt row, after the endpoint answered. The
    /// record is parked for a later attempt rather than lost with the task: the partition
    /// commits past it, and the endpoint (one request at a time) goes on to the next record.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_attempt_parks_its_record_and_the_partition_commits_past_it() {
        let (url, hits) = receiver().await;
        let store = faulty_store(Fault::Panic(EventId::parse("evt_1").unwrap()));
        let (endpoint, deps) = one_at_a_time(url, store.clone()).await;
        let records = [
            delivery_for(&endpoint.id, "evt_1"),
            delivery_for(&endpoint.id, "evt_2"),
        ];
        let (panics, delivered) = (&records[0].delivery_id, &records[1].delivery_id);
        let shortest = deps.tiers.shortest().topic.clone();
        let rig = Rig::start(deps, &records).await;

        rig.committed_reaches(2).await;
        let parked = rig.read(&shortest, 1).await;
        assert_eq!(&parked[0].delivery_id, panics);
        assert_eq!(parked[0].attempts, 0, "parking spends no retry budget");
        assert!(
            parked[0].first_attempt_at.is_some(),
            "its window has started, so a record that always panics is dead-lettered in time"
        );
        assert!(parked[0].not_before.is_some());
        assert_eq!(
            hits.load(Ordering::SeqCst),
            2,
            "both were sent, one at a time"
        );
        assert_eq!(store.inner.attempts(delivered).await.unwrap().len(), 1);

        rig.shutdown.cancel();
        rig.stage.await.unwrap();
    }

    /// The store panics on the row of a record whose endpoint is gone, while it is being
    /// dead-lettered: the record has nowhere safer to go than its uncommitted offset, so the
    /// stage stops on its own (its supervisor then stops hookline, which exits 70) and commits
    /// nothing past it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_dead_letter_stops_the_stage_with_its_offset_unsettled() {
        let gone = EndpointId::parse("ep_gone").unwrap();
        let record = delivery_for(&gone, "evt_1");
        let store = faulty_store(Fault::Panic(record.event_id.clone()));
        let (_, deps) = one_at_a_time("http://127.0.0.1:9/".into(), store).await;
        let mut rig = Rig::start(deps, &[record]).await;

        tokio::time::timeout(Duration::from_secs(60), &mut rig.stage)
            .await
            .expect("the stage stopped on its own")
            .unwrap();
        assert!(!rig.shutdown.is_cancelled());
        let committed = rig.committed().await;
        assert!(
            matches!(committed, None | Some(0)),
            "committed {committed:?}, past the record"
        );
    }
}
