//! Replaying one delivery by its id (`POST /v1/deliveries/{id}/replay`): from its record in
//! the deliveries topic, or from its dead letter, found in the DLQ by time.

use std::time::{Duration, SystemTime};

use super::api::{API_IDLE_LIMIT, API_PUBLISH_DEADLINE};
use super::audit::{new_replay_id, record_audit};
use super::claim::claim;
use super::consumer::{KAFKA_TIMEOUT, POLL_WAIT, dlq_consumer, read_error_is_final};
use super::error::kafka_failure;
use super::republisher::{Republished, Republisher};
use super::scan::{DlqScan, ScanEnd, unix_millis};
use super::{Asked, ReplayError, ReplayTarget};
use crate::record::DeliveryRecord;
use crate::storage::{DeliveryState, DeliveryStatus, DeliveryStore, RecordPosition, ReplayAudit};
use crate::telemetry;

/// Where a dead letter's DLQ record is looked for, from its delivery's last attempt: a little
/// before it (clocks), and well after it (the record is produced once the attempt and its log
/// row are done, later when the broker was away meanwhile).
const LOCATE_BEFORE: Duration = Duration::from_secs(5);
const LOCATE_AFTER: Duration = Duration::from_secs(600);

/// How long [`locate`] reads the DLQ before giving up.
pub const LOCATE_LIMIT: Duration = Duration::from_secs(10);

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
        .updated_at
        .checked_sub(LOCATE_BEFORE)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let mut scan = DlqScan::start(
        target,
        unix_millis(from),
        unix_millis(delivery.updated_at + LOCATE_AFTER),
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
    asked: Asked,
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
            return from_dead_letter(target, store, delivery, asked).await;
        }
        return Err(ReplayError::RecordNotKept {
            delivery: id.to_string(),
        });
    };
    let topic = target.deliveries.clone();
    match read_record(target, &topic, at).await? {
        Some(record) if record.delivery_id == *id => {
            let from = Source { topic, at };
            send_again(target, store, delivery, record, from, asked).await
        }
        _ if dead => from_dead_letter(target, store, delivery, asked).await,
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
    asked: Asked,
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
    send_again(target, store, delivery, record, from, asked).await
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
    asked: Asked,
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
        actor: asked.actor,
        reason: asked.reason,
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
        asked_by: asked.asked_by,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::conformance::attempt_row;
    use crate::storage::memory::MemoryStore;
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
        let asked = Asked {
            actor: "a".into(),
            reason: "b".into(),
            asked_by: None,
        };
        let err = replay_delivery(&target, &store, &delivery, asked)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ReplayError::RecordNotKept { delivery } if *delivery == row.delivery_id.to_string()),
            "{err}"
        );
        assert_eq!(store.replay_claim(&row.delivery_id).await.unwrap(), None);
    }
}
