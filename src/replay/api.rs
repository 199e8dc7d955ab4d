//! Replays the admin API starts: one dead delivery by its id (`POST
//! /v1/deliveries/{id}/replay`), or every dead delivery of one endpoint within a time range
//! (`POST /v1/endpoints/{id}/replay`). Both find their records in the DLQ by time
//! ([`DlqScan`]) and republish them as `hookline replay` does, with one audit entry each.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};

use super::scan::{DlqScan, ScanEnd, unix_millis};
use super::{
    KAFKA_TIMEOUT, POLL_WAIT, ReplayError, ReplayRequest, ReplaySummary, ReplayTarget, Republished,
    Republisher, SEND_STEP, WINDOW, check, dlq_consumer, kafka_failure, new_replay_id,
    read_error_is_final, record_audit,
};
use crate::id::{DeliveryId, EndpointId, Tenant};
use crate::record::DeliveryRecord;
use crate::storage::{
    DeliveryState, DeliveryStatus, DeliveryStore, RecordPosition, ReplayAudit, ReplayMark,
    StoreError,
};
use crate::telemetry;

/// Where a dead letter's DLQ record is looked for, from its delivery's last attempt: a little
/// before it (clocks), and well after it (the record is produced once the attempt and its log
/// row are done, later when the broker was away meanwhile).
const LOCATE_BEFORE: Duration = Duration::from_secs(5);
const LOCATE_AFTER: Duration = Duration::from_secs(600);

/// How long [`locate`] reads the DLQ before giving up.
pub const LOCATE_LIMIT: Duration = Duration::from_secs(10);

/// How long [`replay_endpoint`] reads the DLQ before it stops and answers with what it did: the
/// API's answer is due within its request deadline (30 s), and a republished record may take
/// up to [`API_PUBLISH_DEADLINE`] more.
pub const ENDPOINT_SCAN_LIMIT: Duration = Duration::from_secs(15);

/// How long a replay through the admin API waits on the brokers.
const API_IDLE_LIMIT: Duration = Duration::from_secs(5);
const API_PUBLISH_DEADLINE: Duration = Duration::from_secs(10);

/// Where a delivery's dead letter is in the DLQ.
pub type DlqPosition = RecordPosition;

/// Finds the DLQ record of `delivery`, which the attempt log shows dead-lettered: a dead
/// letter of its delivery id in any DLQ partition, at most [`LOCATE_BEFORE`] before its last
/// attempt and [`LOCATE_AFTER`] after it. `Ok(None)` when every partition was read that far (or
/// to its end) without finding it: the record is past the topic's retention, or was never
/// written (the delivery stage stopped in between, and sends the delivery again when it
/// restarts).
pub async fn locate(
    target: &ReplayTarget,
    delivery: &DeliveryState,
) -> Result<Option<DlqPosition>, ReplayError> {
    let from = delivery
        .last_attempt_at
        .checked_sub(LOCATE_BEFORE)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let mut scan = DlqScan::start(
        target,
        unix_millis(from),
        unix_millis(delivery.last_attempt_at + LOCATE_AFTER),
        LOCATE_LIMIT,
    )?;
    loop {
        match scan.next()? {
            Ok(msg) => {
                let found = DeliveryRecord::from_message(&msg)
                    .is_ok_and(|r| r.dead.is_some() && r.delivery_id == delivery.delivery_id);
                if found {
                    use rdkafka::Message;
                    return Ok(Some(DlqPosition {
                        partition: msg.partition(),
                        offset: msg.offset(),
                    }));
                }
            }
            Err(ScanEnd::Done) => return Ok(None),
            Err(ScanEnd::TimedOut { .. }) => {
                return Err(ReplayError::NotLocated {
                    delivery: delivery.delivery_id.to_string(),
                    dlq: target.dlq.clone(),
                    limit: LOCATE_LIMIT,
                });
            }
        }
    }
}

/// How long a replay's claim on a delivery keeps other replays off it while it has not
/// republished it. A replay through the API republishes within [`API_PUBLISH_DEADLINE`] of
/// claiming, and then marks it; a claim this old with neither a mark nor an attempt of its
/// replay was left by a process that stopped in between, and no longer holds the delivery.
pub const CLAIM_LIMIT: Duration = Duration::from_secs(120);

/// How many times [`claim`] reads and tries again when another replay's claim came in between.
const CLAIM_TRIES: usize = 3;

/// Whether a delivery may be replayed now.
#[derive(Debug, Clone, PartialEq)]
pub enum Standing {
    /// Dead, and no replay of it is on its way: replaying it sends it again.
    Dead,
    /// Delivered (a 2xx), and no replay of it is on its way: replaying it by its id sends it
    /// again from its record in the deliveries topic, while that is kept.
    Delivered,
    /// Dead in the attempt log, but the replay `0` names republished it and no attempt of that
    /// replay is logged yet: it is on its way, and replaying it again would send it twice.
    OnItsWay(ReplayMark),
    /// Dead in the attempt log, and claimed less than [`CLAIM_LIMIT`] ago by the replay `0`
    /// names, which has not republished it yet: it is about to.
    BeingReplayed(ReplayMark),
    /// Neither dead nor delivered: being retried, or not attempted yet.
    NotDead(DeliveryStatus),
}

/// Where `delivery` stands for a replay: dead in the attempt log, and then whether its latest
/// replay (its [`ReplayMark`]) has had an attempt logged, and whether a replay has claimed it
/// and not republished it yet. A replay is settled by an attempt that carries its id, whenever
/// either was written; only a claim's age is read against the clock.
pub async fn standing(
    store: &dyn DeliveryStore,
    delivery: &DeliveryState,
) -> Result<Standing, StoreError> {
    Ok(look(store, delivery).await?.0)
}

/// [`standing`], and the delivery's latest claim, which a replay of a [`Standing::Dead`]
/// delivery claims it over.
async fn look(
    store: &dyn DeliveryStore,
    delivery: &DeliveryState,
) -> Result<(Standing, Option<ReplayMark>), StoreError> {
    let free = match delivery.status {
        DeliveryStatus::Dead => Standing::Dead,
        DeliveryStatus::Succeeded => Standing::Delivered,
        other => return Ok((Standing::NotDead(other), None)),
    };
    let (busy, claim) = in_flight(store, &delivery.delivery_id).await?;
    Ok((busy.unwrap_or(free), claim))
}

/// Whether another replay of `id` is on its way ([`Standing::OnItsWay`]) or about to be
/// ([`Standing::BeingReplayed`]), and the delivery's latest claim, which a replay claims it
/// over.
async fn in_flight(
    store: &dyn DeliveryStore,
    id: &DeliveryId,
) -> Result<(Option<Standing>, Option<ReplayMark>), StoreError> {
    // Read side by side: one store round trip instead of two. Whichever order the two reads
    // reach the store in, a replay seen half-way (claimed and not yet marked, or marked and
    // its claim read before it was made) stands as busy, and a claim made after the claim
    // read makes this replay's own claim, which is conditional on what was read, fail.
    let (mark, claim) = tokio::try_join!(store.replay_mark(id), store.replay_claim(id))?;
    if mark.is_none() && claim.is_none() {
        return Ok((None, None));
    }
    let attempts = store.attempts(id).await?;
    let carried = |replay: &ReplayMark| {
        attempts
            .iter()
            .any(|a| a.replay_id.as_deref() == Some(replay.replay_id.as_str()))
    };
    if let Some(mark) = mark.as_ref().filter(|m| !carried(m)) {
        return Ok((Some(Standing::OnItsWay(mark.clone())), claim));
    }
    let marked = |c: &ReplayMark| mark.as_ref().is_some_and(|m| m.replay_id == c.replay_id);
    let young = |c: &ReplayMark| {
        SystemTime::now()
            .duration_since(c.at)
            .map_or(true, |age| age < CLAIM_LIMIT)
    };
    if let Some(claimed) = claim
        .as_ref()
        .filter(|c| !marked(c) && !carried(c) && young(c))
    {
        return Ok((Some(Standing::BeingReplayed(claimed.clone())), claim));
    }
    Ok((None, claim))
}

/// Claims delivery `id` for replay `replay_id` of a range of DLQ offsets, whatever the attempt
/// log says of it (an operator's range is sent as asked), unless another replay of it is on
/// its way or about to be; whether it claimed it. Of two replays at once, one sends it.
pub(crate) async fn claim_in_range(
    store: &dyn DeliveryStore,
    id: &DeliveryId,
    replay_id: &str,
) -> Result<bool, StoreError> {
    for _ in 0..CLAIM_TRIES {
        let (busy, claim) = in_flight(store, id).await?;
        if busy.is_some() {
            return Ok(false);
        }
        if claim_over(store, id, replay_id, claim.as_ref()).await? {
            return Ok(true);
        }
    }
    // Claimed by another replay each time it looked: one of them is sending it.
    Ok(false)
}

/// Claims `id` for replay `replay_id`, now, over `latest`, the claim it read
/// ([`DeliveryStore::claim_replay`]); whether no other claim came in between.
async fn claim_over(
    store: &dyn DeliveryStore,
    id: &DeliveryId,
    replay_id: &str,
    latest: Option<&ReplayMark>,
) -> Result<bool, StoreError> {
    let mine = ReplayMark {
        delivery_id: id.clone(),
        replay_id: replay_id.to_owned(),
        at: SystemTime::now(),
    };
    store
        .claim_replay(&mine, latest.map(|c| c.replay_id.as_str()))
        .await
}

/// Why a delivery standing so cannot be replayed by its id now, for the caller; `None` for
/// [`Standing::Dead`] and [`Standing::Delivered`].
pub fn refusal(id: &DeliveryId, standing: &Standing) -> Option<String> {
    let time = |t: SystemTime| humantime::format_rfc3339_millis(t).to_string();
    match standing {
        Standing::Dead | Standing::Delivered => None,
        Standing::NotDead(status) => Some(format!(
            "delivery {id} is {}: only a dead-lettered or a delivered delivery can be \
             replayed (one being retried will be attempted again anyway)",
            status.as_str()
        )),
        Standing::OnItsWay(mark) => Some(format!(
            "delivery {id} was replayed at {} (replay {}) and that replay's attempt is not \
             logged yet: it is on its way; replay it again once it shows dead again",
            time(mark.at),
            mark.replay_id
        )),
        Standing::BeingReplayed(claim) => Some(format!(
            "delivery {id} is being replayed by replay {} (started at {}), which has not sent it \
             on yet: replay it again once that replay's attempt shows it dead again, or after {} \
             if that replay stops before sending it",
            claim.replay_id,
            time(claim.at),
            time(claim.at + CLAIM_LIMIT)
        )),
    }
}

/// Claims `delivery` for replay `replay_id` ([`DeliveryStore::claim_replay`]) while it is
/// [`Standing::Dead`] (or [`Standing::Delivered`], when `delivered` too): of two replays that
/// find it so at the same moment, one claims it and the other is refused, so it is sent once.
/// [`ReplayError::Refused`] when it stands otherwise or another replay has it;
/// [`ReplayError::Store`] when the store does not answer.
async fn claim(
    store: &dyn DeliveryStore,
    delivery: &DeliveryState,
    replay_id: &str,
    delivered: bool,
) -> Result<(), ReplayError> {
    let id = &delivery.delivery_id;
    for _ in 0..CLAIM_TRIES {
        let (standing, latest) = look(store, delivery).await.map_err(ReplayError::Store)?;
        if let Some(why) = refusal(id, &standing) {
            return Err(ReplayError::Refused(why));
        }
        if standing == Standing::Delivered && !delivered {
            return Err(ReplayError::Refused(format!(
                "delivery {id} is succeeded: this replay sends dead deliveries only"
            )));
        }
        if claim_over(store, id, replay_id, latest.as_ref())
            .await
            .map_err(ReplayError::Store)?
        {
            return Ok(());
        }
    }
    Err(ReplayError::Refused(format!(
        "delivery {id} was claimed by {CLAIM_TRIES} other replays while this one tried to: \
         replay it again in a moment"
    )))
}

/// What [`replay_delivery`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryReplay {
    /// The replay id receivers see.
    pub replay_id: String,
    /// The topic its record was read from: the DLQ for a dead delivery, the deliveries topic
    /// for a delivered one.
    pub topic: String,
    /// Where in it.
    pub from: RecordPosition,
}

/// Replays one dead-lettered or delivered delivery by its id. Its record is read where its
/// latest attempt logged it in the deliveries topic (one offset, however large the topics),
/// and republished as a replay, once the delivery is [`claim`]ed (refused when another replay
/// got to it first), with an audit entry. A dead delivery whose attempts predate that log, or
/// whose record is past the deliveries topic's retention, is replayed from its dead letter
/// instead: [`locate`]d in the DLQ and republished the same way. The delivery is claimed only
/// once its record is read, so a replay that cannot read it holds nothing.
pub async fn replay_delivery(
    target: &ReplayTarget,
    store: &dyn DeliveryStore,
    delivery: &DeliveryState,
    actor: String,
    reason: String,
) -> Result<DeliveryReplay, ReplayError> {
    let id = &delivery.delivery_id;
    let attempts = store.attempts(id).await.map_err(ReplayError::Store)?;
    let logged = attempts
        .iter()
        .max_by_key(|a| a.started_at)
        .and_then(|a| a.record);
    let dead = delivery.status == DeliveryStatus::Dead;
    let Some(at) = logged else {
        if dead {
            return from_dead_letter(target, store, delivery, actor, reason).await;
        }
        return Err(ReplayError::RecordNotKept {
            delivery: id.to_string(),
        });
    };
    let topic = target.deliveries.clone();
    match read_record(target, &topic, at).await? {
        Some(record) if record.delivery_id == *id => {
            let from = Source { topic, at };
            send_again(target, store, delivery, record, from, actor, reason).await
        }
        _ if dead => from_dead_letter(target, store, delivery, actor, reason).await,
        _ => Err(ReplayError::RecordGone {
            delivery: id.to_string(),
            topic,
            at,
        }),
    }
}

/// Replays a dead delivery from its dead letter: [`locate`]s it in the DLQ, reads that one
/// record and [`send_again`]s it.
async fn from_dead_letter(
    target: &ReplayTarget,
    store: &dyn DeliveryStore,
    delivery: &DeliveryState,
    actor: String,
    reason: String,
) -> Result<DeliveryReplay, ReplayError> {
    let gone = || ReplayError::DeadLetterGone {
        delivery: delivery.delivery_id.to_string(),
        dlq: target.dlq.clone(),
    };
    let at = locate(target, delivery).await?.ok_or_else(gone)?;
    let record = read_record(target, &target.dlq, at)
        .await?
        .filter(|r| r.delivery_id == delivery.delivery_id && r.dead.is_some())
        .ok_or_else(gone)?;
    let from = Source {
        topic: target.dlq.clone(),
        at,
    };
    send_again(target, store, delivery, record, from, actor, reason).await
}

/// Where a replayed record was read.
struct Source {
    topic: String,
    at: RecordPosition,
}

/// Republishes `record`, read at `from`, as a replay of `delivery` once it is [`claim`]ed,
/// with an audit entry. A claim whose record the deliveries topic did not acknowledge in time
/// is not released: the record may still arrive, and the claim holds the delivery until
/// [`CLAIM_LIMIT`].
async fn send_again(
    target: &ReplayTarget,
    store: &dyn DeliveryStore,
    delivery: &DeliveryState,
    record: DeliveryRecord,
    from: Source,
    actor: String,
    reason: String,
) -> Result<DeliveryReplay, ReplayError> {
    let id = &delivery.delivery_id;
    let republisher = Republisher::new(target)?;
    let replay_id = new_replay_id();
    claim(store, delivery, &replay_id, true).await?;
    match republisher
        .republish(record, &replay_id, API_PUBLISH_DEADLINE, store)
        .await
    {
        Republished::Yes => {}
        Republished::Refused(source) => {
            return Err(ReplayError::RefusedByTopic {
                topic: target.deliveries.clone(),
                source: Box::new(source),
            });
        }
        Republished::NotAcknowledged => {
            return Err(ReplayError::NotAcknowledged {
                topic: target.deliveries.clone(),
                deadline: API_PUBLISH_DEADLINE,
            });
        }
    }
    telemetry::replayed(1);
    let Source { topic, at } = from;
    let audit = ReplayAudit {
        replay_id: replay_id.clone(),
        actor,
        reason,
        at: SystemTime::now(),
        scope: format!(
            "{topic} partition {} offset {} (delivery {id}, {}, sent again)",
            at.partition,
            at.offset,
            delivery.status.as_str()
        ),
        count: 1,
        dry_run: false,
        tenant: Some(delivery.tenant.clone()),
    };
    record_audit(store, &audit)
        .await
        .map_err(|source| ReplayError::Audit {
            replay_id: replay_id.clone(),
            replayed: 1,
            source,
        })?;
    Ok(DeliveryReplay {
        replay_id,
        topic,
        from: at,
    })
}

/// The record at `at` in `topic`; `None` when the partition no longer holds that offset (it
/// is past the topic's retention) or never did. Reads for at most [`API_IDLE_LIMIT`].
async fn read_record(
    target: &ReplayTarget,
    topic: &str,
    at: RecordPosition,
) -> Result<Option<DeliveryRecord>, ReplayError> {
    use rdkafka::consumer::Consumer;
    use rdkafka::{Message, Offset, TopicPartitionList};
    let reading = || {
        format!(
            "reading {topic} partition {} offset {}",
            at.partition, at.offset
        )
    };
    let consumer = dlq_consumer(target)?;
    let (low, high) = tokio::task::block_in_place(|| {
        consumer.fetch_watermarks(topic, at.partition, KAFKA_TIMEOUT)
    })
    .map_err(kafka_failure(target, reading()))?;
    if at.offset < low || at.offset >= high {
        return Ok(None);
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, at.partition, Offset::Offset(at.offset))
        .and_then(|()| consumer.assign(&tpl))
        .map_err(kafka_failure(target, reading()))?;
    let deadline = std::time::Instant::now() + API_IDLE_LIMIT;
    loop {
        let wait = deadline
            .saturating_duration_since(std::time::Instant::now())
            .min(POLL_WAIT);
        if wait.is_zero() {
            return Err(ReplayError::NotRead {
                what: reading(),
                limit: API_IDLE_LIMIT,
            });
        }
        match tokio::task::block_in_place(|| consumer.poll(wait)) {
            Some(Ok(msg)) if msg.offset() >= at.offset => {
                if msg.offset() > at.offset {
                    return Ok(None);
                }
                return Ok(DeliveryRecord::from_message(&msg).ok());
            }
            Some(Err(e)) if read_error_is_final(&e) => {
                return Err(kafka_failure(target, reading())(e));
            }
            _ => {}
        }
    }
}

/// Which of an endpoint's dead letters [`replay_endpoint`] replays.
#[derive(Debug, Clone)]
pub struct EndpointReplayRequest {
    /// The endpoint.
    pub endpoint: EndpointId,
    /// Its tenant, for the audit entry.
    pub tenant: Tenant,
    /// Dead letters written at or after this.
    pub since: SystemTime,
    /// And at or before this.
    pub until: SystemTime,
    /// Who asks, for the audit entry.
    pub actor: String,
    /// Why.
    pub reason: String,
}

/// What [`replay_endpoint`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointReplay {
    /// The replay id receivers see.
    pub replay_id: String,
    /// Deliveries republished.
    pub replayed: u64,
    /// The endpoint's dead letters in range whose delivery is no longer dead (replayed since,
    /// and delivered or being retried), is on its way from an earlier replay whose attempt is
    /// not logged yet, is claimed by another replay that has not republished it yet, or was
    /// already replayed by this request; left alone.
    pub skipped: u64,
    /// `None` when the whole range was read; else where a later request resumes: every dead
    /// letter written before it was covered.
    pub resume_since: Option<SystemTime>,
    /// Why it stopped short, with `resume_since`.
    pub stopped: Option<String>,
}

/// Replays every dead delivery of one endpoint whose dead letter was written within
/// `since..=until`: each delivery once, and only while it is [`Standing::Dead`] and this
/// replay has [`claim`]ed it, so one replayed since (through the API or `hookline replay`)
/// that was delivered, is being retried, or is still on its way to its first attempt, and one
/// another replay is sending at the same moment, is not sent again. Reads for at most
/// [`ENDPOINT_SCAN_LIMIT`]; what it did not reach is given as `resume_since`. One audit entry
/// covers what it republished.
pub async fn replay_endpoint(
    target: &ReplayTarget,
    store: &dyn DeliveryStore,
    request: &EndpointReplayRequest,
) -> Result<EndpointReplay, ReplayError> {
    let mut scan = DlqScan::start(
        target,
        unix_millis(request.since),
        unix_millis(request.until),
        ENDPOINT_SCAN_LIMIT,
    )?;
    let replay_id = new_replay_id();
    let republisher = Republisher::new(target)?;
    let mut seen = BTreeSet::new();
    let mut done = EndpointReplay {
        replay_id: replay_id.clone(),
        replayed: 0,
        skipped: 0,
        resume_since: None,
        stopped: None,
    };
    // Up to `WINDOW` sends at once, as a replay of a range does; the earliest time a failed one
    // leaves uncovered, and why.
    let mut sends = FuturesUnordered::new();
    let mut failed: Option<(SystemTime, String)> = None;
    let settle = |(resume, sent): (SystemTime, EndpointSent),
                  done: &mut EndpointReplay,
                  failed: &mut Option<(SystemTime, String)>| match sent {
        EndpointSent::Replayed => done.replayed += 1,
        EndpointSent::Skipped => done.skipped += 1,
        EndpointSent::Failed(why) => {
            if failed.as_ref().is_none_or(|(at, _)| resume < *at) {
                *failed = Some((resume, why));
            }
        }
    };
    done.stopped = loop {
        while let Some(Some(sent)) = sends.next().now_or_never() {
            settle(sent, &mut done, &mut failed);
        }
        if failed.is_some() {
            break None;
        }
        if sends.len() >= WINDOW {
            if let Some(sent) = sends.next().await {
                settle(sent, &mut done, &mut failed);
            }
            continue;
        }
        let next = if sends.is_empty() {
            scan.next().map(Some)
        } else {
            scan.next_within(Duration::ZERO)
        };
        let msg = match next {
            Ok(Some(Ok(msg))) => msg,
            // Nothing to read at once: give the sends a moment instead.
            Ok(None) => {
                if let Ok(Some(sent)) = tokio::time::timeout(SEND_STEP, sends.next()).await {
                    settle(sent, &mut done, &mut failed);
                }
                continue;
            }
            // What was republished before is audited all the same.
            Err(e) => {
                done.resume_since = Some(millis_time(scan.resume_from()));
                break Some(format!("reading the DLQ failed: {e}"));
            }
            Ok(Some(Err(ScanEnd::Done))) => break None,
            Ok(Some(Err(ScanEnd::TimedOut { resume_from }))) => {
                done.resume_since = Some(millis_time(resume_from));
                break Some(format!(
                    "read the DLQ for {}s, the longest one request may",
                    ENDPOINT_SCAN_LIMIT.as_secs()
                ));
            }
        };
        let Ok(record) = DeliveryRecord::from_message(&msg) else {
            continue;
        };
        if record.dead.is_none() || record.endpoint_id != request.endpoint {
            continue;
        }
        if !seen.insert(record.delivery_id.clone()) {
            done.skipped += 1;
            continue;
        }
        // Where a request resumes when this record is not covered: its own time, or earlier
        // where another partition has not been read as far.
        let resume = {
            use rdkafka::Message;
            let at = msg.timestamp().to_millis().unwrap_or(i64::MAX);
            millis_time(scan.resume_from().min(at))
        };
        let (republisher, replay_id) = (&republisher, replay_id.as_str());
        sends.push(async move {
            let sent = send_for_endpoint(store, republisher, record, replay_id).await;
            (resume, sent)
        });
    };
    // Let the sends under way finish: each was claimed, and may already be on its way.
    while let Some(sent) = sends.next().await {
        settle(sent, &mut done, &mut failed);
    }
    drop(sends);
    // A failed send leaves its record uncovered: the request resumes no later than its time.
    if let Some((resume, why)) = failed {
        done.resume_since = Some(done.resume_since.map_or(resume, |r| r.min(resume)));
        done.stopped = Some(why);
    }
    telemetry::replayed(done.replayed);
    let time = |t: SystemTime| humantime::format_rfc3339_millis(t).to_string();
    let mut scope = format!(
        "{} dead letters of endpoint {} written {}..={}",
        target.dlq,
        request.endpoint,
        time(request.since),
        time(request.until)
    );
    if let Some(resume) = done.resume_since {
        scope.push_str(&format!(
            " (incomplete: covered those before {}{})",
            time(resume),
            done.stopped
                .as_deref()
                .map(|s| format!("; {s}"))
                .unwrap_or_default()
        ));
    }
    let audit = ReplayAudit {
        replay_id,
        actor: request.actor.clone(),
        reason: request.reason.clone(),
        at: SystemTime::now(),
        scope,
        count: done.replayed,
        dry_run: false,
        tenant: Some(request.tenant.clone()),
    };
    record_audit(store, &audit)
        .await
        .map_err(|source| ReplayError::Audit {
            replay_id: audit.replay_id.clone(),
            replayed: done.replayed,
            source,
        })?;
    Ok(done)
}

/// How one dead letter's send in an endpoint's replay ended.
enum EndpointSent {
    /// Claimed and republished.
    Replayed,
    /// No longer in the attempt log, not dead any more, or another replay is sending it.
    Skipped,
    /// The attempt log or the deliveries topic failed: the replay stops, and says why.
    Failed(String),
}

/// Republishes `record` for an endpoint's replay `replay_id` if its delivery is still dead and
/// this replay claims it.
async fn send_for_endpoint(
    store: &dyn DeliveryStore,
    republisher: &Republisher,
    record: DeliveryRecord,
    replay_id: &str,
) -> EndpointSent {
    let unanswered =
        |e: StoreError| EndpointSent::Failed(format!("the attempt log did not answer: {e}"));
    let state = match store.delivery(&record.delivery_id).await {
        Ok(Some(state)) => state,
        Ok(None) => return EndpointSent::Skipped,
        Err(e) => return unanswered(e),
    };
    match claim(store, &state, replay_id, false).await {
        Ok(()) => {}
        Err(ReplayError::Refused(_)) => return EndpointSent::Skipped,
        // What was republished before this one stands: say only that the log stopped.
        Err(ReplayError::Store(e)) => return unanswered(e),
        Err(e) => return EndpointSent::Failed(e.to_string()),
    }
    let topic = &republisher.deliveries;
    match republisher
        .republish(record, replay_id, API_PUBLISH_DEADLINE, store)
        .await
    {
        Republished::Yes => EndpointSent::Replayed,
        Republished::Refused(e) => {
            EndpointSent::Failed(format!("{topic} refused a record for good: {e}"))
        }
        // Its claim is kept: the record may still arrive.
        Republished::NotAcknowledged => EndpointSent::Failed(format!(
            "{topic} did not acknowledge a record within {}s",
            API_PUBLISH_DEADLINE.as_secs()
        )),
    }
}

/// A Kafka timestamp as a time.
fn millis_time(ms: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// The replays the admin API starts.
#[async_trait::async_trait]
pub trait ApiReplayer: Send + Sync {
    /// Replays `delivery` (dead in the attempt log), as [`replay_delivery`] does.
    async fn replay(
        &self,
        delivery: &DeliveryState,
        actor: String,
        reason: String,
    ) -> Result<DeliveryReplay, ReplayError>;

    /// Replays an endpoint's dead deliveries, as [`replay_endpoint`] does.
    async fn replay_endpoint(
        &self,
        request: &EndpointReplayRequest,
    ) -> Result<EndpointReplay, ReplayError>;

    /// Replays a range of DLQ offsets, as `hookline replay` does, within the API's time.
    async fn replay_range(&self, request: &ReplayRequest) -> Result<ReplaySummary, ReplayError>;
}

/// [`ApiReplayer`] on the cluster and store the process runs on.
pub struct KafkaReplayer {
    /// Where the DLQ and the deliveries topic are.
    pub target: ReplayTarget,
    /// Where the audit entry goes, and what says whether a delivery is still dead.
    pub store: Arc<dyn DeliveryStore>,
}

#[async_trait::async_trait]
impl ApiReplayer for KafkaReplayer {
    async fn replay(
        &self,
        delivery: &DeliveryState,
        actor: String,
        reason: String,
    ) -> Result<DeliveryReplay, ReplayError> {
        replay_delivery(&self.target, self.store.as_ref(), delivery, actor, reason).await
    }

    async fn replay_endpoint(
        &self,
        request: &EndpointReplayRequest,
    ) -> Result<EndpointReplay, ReplayError> {
        replay_endpoint(&self.target, self.store.as_ref(), request).await
    }

    async fn replay_range(&self, request: &ReplayRequest) -> Result<ReplaySummary, ReplayError> {
        check(&self.target, request)
            .await?
            .idle_limit(API_IDLE_LIMIT)
            .publish_deadline(API_PUBLISH_DEADLINE)
            .run(self.store.as_ref(), &mut |_, _| {})
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use async_trait::async_trait;
    use tokio::sync::Barrier;

    use super::*;
    use crate::dead_reason::DeadReason;
    use crate::storage::AttemptOutcome;
    use crate::storage::conformance::attempt_row;
    use crate::storage::hooked::{Hooked, Hooks};
    use crate::storage::memory::MemoryStore;

    /// The first two claim reads wait for each other: two replays that both found a delivery
    /// unclaimed, then race to claim it.
    struct Race {
        reads: AtomicUsize,
        both_read: Barrier,
    }

    #[async_trait]
    impl Hooks for Race {
        async fn after_replay_claim_read(&self) {
            if self.reads.fetch_add(1, Ordering::SeqCst) < 2 {
                self.both_read.wait().await;
            }
        }
    }

    async fn dead_delivery(store: &dyn DeliveryStore) -> DeliveryState {
        let mut row = attempt_row("evt_race", "ep_race", 1);
        row.outcome = AttemptOutcome::Dead {
            reason: DeadReason::HttpStatus,
        };
        store.record_attempt(&row).await.unwrap();
        store.delivery(&row.delivery_id).await.unwrap().unwrap()
    }

    #[tokio::test]
    async fn of_two_replays_that_found_a_delivery_unclaimed_one_claims_it() {
        let race = Race {
            reads: AtomicUsize::new(0),
            both_read: Barrier::new(2),
        };
        let store = Hooked::new(race, 16);
        let delivery = dead_delivery(&store).await;
        let (a, b) = tokio::join!(
            claim(&store, &delivery, "rpl_a", false),
            claim(&store, &delivery, "rpl_b", false)
        );
        let claimed = store.replay_claim(&delivery.delivery_id).await.unwrap();
        let winner = claimed.expect("one claimed it").replay_id;
        let (won, lost) = if winner == "rpl_a" { (a, b) } else { (b, a) };
        won.expect("the winner's claim");
        match lost {
            Err(ReplayError::Refused(why)) => assert!(
                why.contains(&format!("is being replayed by replay {winner}")),
                "{why}"
            ),
            other => panic!("the other replay is refused, not {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_claim_holds_the_delivery_until_its_replay_settles() {
        let store = MemoryStore::default();
        let delivery = dead_delivery(&store).await;
        let id = &delivery.delivery_id;
        claim(&store, &delivery, "rpl_b", false).await.unwrap();
        assert!(matches!(
            claim(&store, &delivery, "rpl_x", false).await,
            Err(ReplayError::Refused(_))
        ));
        // rpl_b republished it and marked it: on its way until its attempt is logged.
        let mark = ReplayMark {
            delivery_id: id.clone(),
            replay_id: "rpl_b".into(),
            at: SystemTime::now(),
        };
        store.record_replay_mark(&mark).await.unwrap();
        assert_eq!(
            standing(&store, &delivery).await.unwrap(),
            Standing::OnItsWay(mark)
        );
        let mut again = attempt_row("evt_race", "ep_race", 1);
        again.replay_id = Some("rpl_b".into());
        again.outcome = AttemptOutcome::Dead {
            reason: DeadReason::HttpStatus,
        };
        store.record_attempt(&again).await.unwrap();
        assert_eq!(standing(&store, &delivery).await.unwrap(), Standing::Dead);
        claim(&store, &delivery, "rpl_c", false).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_delivered_delivery_logged_without_its_records_place_is_gone() {
        let store = MemoryStore::default();
        let mut row = attempt_row("evt_old", "ep_old", 1);
        row.record = None;
        store.record_attempt(&row).await.unwrap();
        let delivery = store.delivery(&row.delivery_id).await.unwrap().unwrap();
        assert_eq!(delivery.status, DeliveryStatus::Succeeded);
        // Never contacted: the attempt log says there is nothing to read.
        let target = ReplayTarget {
            bootstrap: "127.0.0.1:1".into(),
            client: Default::default(),
            dlq: "hookline.dlq".into(),
            deliveries: "hookline.deliveries".into(),
        };
        let err = replay_delivery(&target, &store, &delivery, "a".into(), "b".into())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ReplayError::RecordNotKept { delivery } if *delivery == row.delivery_id.to_string()),
            "{err}"
        );
        assert_eq!(store.replay_claim(&row.delivery_id).await.unwrap(), None);
    }
}
