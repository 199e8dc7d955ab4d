//! The stage loop: takes each delivery record from its partition, queues it for its endpoint's
//! lane (or parks or refuses it), dispatches queued records as the lanes admit them, and applies
//! what the stage's tasks report back; at shutdown, drains and commits what settled.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use rdkafka::Message;
use rdkafka::consumer::Consumer;
use rdkafka::message::BorrowedMessage;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::DeliverDeps;
use super::report::Done;
use super::request::SendPlans;
use super::turn::Turns;
use super::view_wait::AwaitingView;
use crate::breaker::Transition;
use crate::dead_reason::DeadReason;
use crate::endpoint::Endpoint;
use crate::id::EndpointId;
use crate::intake::Intake;
use crate::lane::{LaneConfig, Lanes, Refusal};
use crate::record::DeliveryRecord;
use crate::stage::{RebalanceEvent, Settlements, StageConsumer, Tp, Written, invalid_forward};
use crate::telemetry::{self, ParkReason};

/// A record waiting in its endpoint's lane queue.
pub(super) struct Queued {
    pub(super) tp: Tp,
    pub(super) offset: i64,
    pub(super) record: DeliveryRecord,
    pub(super) endpoint: Arc<Endpoint>,
}

/// The stage loop's state.
pub(super) struct Stage {
    pub(super) deps: Arc<DeliverDeps>,
    pub(super) producer: crate::kafka::Producer,
    pub(super) settlements: Settlements,
    pub(super) lanes: Lanes,
    /// Per endpoint, the records waiting for a slot in its lane.
    pub(super) queues: HashMap<EndpointId, VecDeque<Queued>>,
    /// Per endpoint, the send plan of its current version (see [`Stage::plan`]).
    pub(super) plans: SendPlans,
    /// The turns booked for records parked because their endpoint sends slower than they
    /// arrive (see [`Stage::booked_turn`]).
    pub(super) turns: Turns,
    /// When this stage first met a delivery for each endpoint its view lacks or has disabled
    /// (see [`Stage::view_may_be_behind`]).
    pub(super) unusable_since: HashMap<EndpointId, SystemTime>,
    /// Deliveries waiting for the endpoint view to be confirmed current.
    pub(super) awaiting_view: Vec<AwaitingView>,
    /// Where attempt tasks report (see [`Done`]).
    pub(super) done_tx: mpsc::UnboundedSender<Done>,
    /// Where settling tasks report (see [`Written`]).
    pub(super) written: mpsc::UnboundedSender<Written>,
    pub(super) tasks: TaskTracker,
    /// Cancelled only when the drain deadline passes: in-flight work keeps going until then.
    pub(super) stop: CancellationToken,
    /// Cancelled when a task writing a record's last way out panicked (see
    /// [`Stage::spawn_settling`]): the stage drains and stops.
    pub(super) broken: CancellationToken,
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
    let (mut stage, mut reports) = Stage::new(deps, producer);
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
            Some(done) = reports.done.recv() => stage.on_done(done),
            Some(written) = reports.written.recv() => stage.on_written(written),
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
                    let tp = Tp::new(m.topic(), m.partition());
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
            Some(done) = reports.done.recv() => stage.on_done(done),
            Some(written) = reports.written.recv() => stage.on_written(written),
            () = stage.tasks.wait() => break,
            () = &mut deadline => {
                tracing::warn!("drain deadline passed; unfinished deliveries will be re-read on restart");
                stage.stop.cancel();
                break;
            }
        }
    }
    while let Ok(done) = reports.done.try_recv() {
        stage.on_done(done);
    }
    while let Ok(written) = reports.written.try_recv() {
        stage.on_written(written);
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
pub(super) struct Intaken {
    pub(super) decoded: Result<DeliveryRecord, crate::record::RecordError>,
    /// Kept only to forward an undecodable record as it was.
    pub(super) raw: Option<Raw>,
}

/// An undecodable record's key and value, as read (empty when it had none).
#[derive(Default)]
pub(super) struct Raw {
    key: Vec<u8>,
    payload: Bytes,
}

impl Intaken {
    /// Decodes the record `m`, keeping its key and value should it not decode.
    pub(super) fn decode(m: &BorrowedMessage<'_>) -> Intaken {
        let decoded = DeliveryRecord::from_message(m);
        let raw = decoded.is_err().then(|| Raw {
            key: m.key().map(<[u8]>::to_vec).unwrap_or_default(),
            payload: m.payload().map(Bytes::copy_from_slice).unwrap_or_default(),
        });
        Intaken { decoded, raw }
    }
}

/// The receiving ends of what the stage's tasks report back: attempt tasks' answers and results,
/// and settling tasks' writes.
pub(super) struct Reports {
    pub(super) done: mpsc::UnboundedReceiver<Done>,
    pub(super) written: mpsc::UnboundedReceiver<Written>,
}

impl Stage {
    /// A stage with nothing assigned yet, and the receiving ends of its tasks' reports.
    pub(super) fn new(
        deps: Arc<DeliverDeps>,
        producer: crate::kafka::Producer,
    ) -> (Stage, Reports) {
        let (done_tx, done) = mpsc::unbounded_channel();
        let (written_tx, written) = mpsc::unbounded_channel();
        let stage = Stage {
            settlements: Settlements::new("deliver", deps.max_window),
            lanes: Lanes::new(deps.lanes),
            queues: HashMap::new(),
            plans: SendPlans::default(),
            turns: Turns::default(),
            unusable_since: HashMap::new(),
            awaiting_view: Vec::new(),
            deps,
            producer,
            done_tx,
            written: written_tx,
            tasks: TaskTracker::new(),
            stop: CancellationToken::new(),
            broken: CancellationToken::new(),
            breakers_open: telemetry::BreakersOpen::default(),
        };
        (stage, Reports { done, written })
    }

    /// Tracks a record taken from `tp` and hands it on, pausing the partition at once when
    /// the record filled it.
    pub(super) fn take(&mut self, consumer: &StageConsumer, tp: Tp, offset: i64, intaken: Intaken) {
        if !self.settlements.track(&tp, offset) {
            return;
        }
        let pause = self.settlements.needs_pause(&tp);
        self.on_record(tp, offset, intaken.decoded, intaken.raw);
        if pause {
            self.settlements.flow_control(consumer);
        }
    }

    /// Hands the record at `offset` of `tp` on: an undecodable one to the invalid topic; a
    /// delivery to an endpoint this stage cannot use to the wait for the view, or to the DLQ;
    /// one that is early, or whose endpoint is stalled, full or slow, to a delay tier; any
    /// other to its endpoint's queue.
    pub(super) fn on_record(
        &mut self,
        tp: Tp,
        offset: i64,
        decoded: Result<DeliveryRecord, crate::record::RecordError>,
        raw: Option<Raw>,
    ) {
        let record = match decoded {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(topic = %tp.topic, partition = tp.partition, offset, error = %e,
                    "undecodable delivery record; sending it to the invalid topic");
                let Raw { key, payload } = raw.unwrap_or_default();
                let out = invalid_forward(
                    self.deps.invalid_topic.clone(),
                    key,
                    rdkafka::message::OwnedHeaders::new(),
                    payload,
                    crate::stage::BAD_DELIVERY_RECORD,
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

    /// The lane limits of `endpoint`: its own, or the stage's default concurrency.
    pub(super) fn lane_config(&self, endpoint: &Endpoint) -> LaneConfig {
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

    /// Applies an attempt task's report: frees the lane slot (and dispatches what waits for
    /// it), settles the record, or parks the record of an attempt that panicked.
    pub(super) fn on_done(&mut self, done: Done) {
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

    /// Settles the record a settling task wrote, once the broker has it.
    fn on_written(&mut self, written: Written) {
        if written.acked {
            self.settlements.settle(&written.tp, written.offset);
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

    /// The stage's periodic work: rebalances, the wait for the view, lanes that may take
    /// more, stored offsets and paused partitions.
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
