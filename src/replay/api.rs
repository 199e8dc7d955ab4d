//! Replays the admin API starts: one dead delivery by its id (`POST
//! /v1/deliveries/{id}/replay`), or every dead delivery of one endpoint within a time range
//! (`POST /v1/endpoints/{id}/replay`). Both find their records in the DLQ by time
//! ([`DlqScan`]) and republish them as `hookline replay` does, with one audit entry each.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::scan::{DlqScan, ScanEnd, unix_millis};
use super::{
    ReplayError, ReplayRequest, ReplaySummary, ReplayTarget, Republisher, check, new_replay_id,
    record_audit,
};
use crate::id::EndpointId;
use crate::record::DeliveryRecord;
use crate::storage::{
    DeliveryState, DeliveryStatus, DeliveryStore, ReplayAudit, ReplayMark, StoreError,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DlqPosition {
    /// The DLQ partition.
    pub partition: i32,
    /// The record's offset.
    pub offset: i64,
}

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

/// Whether a delivery may be replayed now.
#[derive(Debug, Clone, PartialEq)]
pub enum Standing {
    /// Dead, and no replay of it is on its way: replaying it sends it again.
    Dead,
    /// Dead in the attempt log, but the replay `0` names republished it and no attempt of that
    /// replay is logged yet: it is on its way, and replaying it again would send it twice.
    OnItsWay(ReplayMark),
    /// Not dead: delivered, being retried, or not attempted yet.
    NotDead(DeliveryStatus),
}

/// Where `delivery` stands for a replay: dead in the attempt log, and then whether its latest
/// replay (its [`ReplayMark`]) has had an attempt logged. Clock-free: a replay is settled by
/// an attempt that carries its id, whenever either was written.
pub async fn standing(
    store: &dyn DeliveryStore,
    delivery: &DeliveryState,
) -> Result<Standing, StoreError> {
    if delivery.status != DeliveryStatus::Dead {
        return Ok(Standing::NotDead(delivery.status));
    }
    let Some(mark) = store.replay_mark(&delivery.delivery_id).await? else {
        return Ok(Standing::Dead);
    };
    let attempts = store.attempts(&delivery.delivery_id).await?;
    let settled = attempts
        .iter()
        .any(|a| a.replay_id.as_deref() == Some(mark.replay_id.as_str()));
    Ok(if settled {
        Standing::Dead
    } else {
        Standing::OnItsWay(mark)
    })
}

/// What [`replay_delivery`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryReplay {
    /// The replay id receivers see.
    pub replay_id: String,
    /// Where its dead letter was.
    pub from: DlqPosition,
}

/// Replays one dead-lettered delivery: [`locate`]s its DLQ record and republishes it as a
/// replay of that one offset does, audit entry included.
pub async fn replay_delivery(
    target: &ReplayTarget,
    store: &dyn DeliveryStore,
    delivery: &DeliveryState,
    actor: String,
    reason: String,
) -> Result<DeliveryReplay, ReplayError> {
    let from = locate(target, delivery)
        .await?
        .ok_or_else(|| ReplayError::DeadLetterGone {
            delivery: delivery.delivery_id.to_string(),
            dlq: target.dlq.clone(),
        })?;
    let request = ReplayRequest {
        partition: from.partition,
        from_offset: from.offset,
        to_offset: from.offset,
        endpoint: Some(delivery.endpoint_id.clone()),
        actor,
        reason,
        dry_run: false,
    };
    let summary = check(target, &request)
        .await?
        .idle_limit(API_IDLE_LIMIT)
        .publish_deadline(API_PUBLISH_DEADLINE)
        .run(store, &mut |_, _| {})
        .await?;
    Ok(DeliveryReplay {
        replay_id: summary.replay_id,
        from,
    })
}

/// Which of an endpoint's dead letters [`replay_endpoint`] replays.
#[derive(Debug, Clone)]
pub struct EndpointReplayRequest {
    /// The endpoint.
    pub endpoint: EndpointId,
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
    /// not logged yet, or was already replayed by this request; left alone.
    pub skipped: u64,
    /// `None` when the whole range was read; else where a later request resumes: every dead
    /// letter written before it was covered.
    pub resume_since: Option<SystemTime>,
    /// Why it stopped short, with `resume_since`.
    pub stopped: Option<String>,
}

/// Replays every dead delivery of one endpoint whose dead letter was written within
/// `since..=until`: each delivery once, and only while it is [`Standing::Dead`], so one
/// replayed since (through the API or `hookline replay`) that was delivered, is being retried,
/// or is still on its way to its first attempt is not sent again. Reads for at most
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
    done.stopped = loop {
        let msg = match scan.next() {
            Ok(Ok(msg)) => msg,
            // What was republished before is audited all the same.
            Err(e) => {
                done.resume_since = Some(millis_time(scan.resume_from()));
                break Some(format!("reading the DLQ failed: {e}"));
            }
            Ok(Err(ScanEnd::Done)) => break None,
            Ok(Err(ScanEnd::TimedOut { resume_from })) => {
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
        let here = || {
            use rdkafka::Message;
            let at = msg.timestamp().to_millis().unwrap_or(i64::MAX);
            millis_time(scan.resume_from().min(at))
        };
        let dead = match store.delivery(&record.delivery_id).await {
            Ok(Some(state)) => standing(store, &state).await.map(|s| s == Standing::Dead),
            Ok(None) => Ok(false),
            Err(e) => Err(e),
        };
        match dead {
            Ok(true) => {}
            Ok(false) => {
                done.skipped += 1;
                continue;
            }
            Err(e) => {
                done.resume_since = Some(here());
                break Some(format!("the attempt log did not answer: {e}"));
            }
        }
        if !republisher
            .republish(record, &replay_id, API_PUBLISH_DEADLINE, store)
            .await
        {
            done.resume_since = Some(here());
            break Some(format!(
                "{} did not acknowledge a record within {}s",
                target.deliveries,
                API_PUBLISH_DEADLINE.as_secs()
            ));
        }
        done.replayed += 1;
    };
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
