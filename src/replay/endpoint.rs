//! Replaying an endpoint's dead deliveries within a time range (`POST
//! /v1/endpoints/{id}/replay`): its dead letters, found in the DLQ by time, each republished
//! once while it is still dead, with one audit entry.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use rdkafka::Message;
use rdkafka::message::OwnedMessage;

use super::api::API_PUBLISH_DEADLINE;
use super::audit::{new_replay_id, record_audit};
use super::claim::claim;
use super::range::{SEND_STEP, WINDOW};
use super::republisher::{Republished, Republisher};
use super::scan::{DlqScan, ScanEnd, unix_millis};
use super::{ReplayError, ReplayTarget};
use crate::id::{DeliveryId, EndpointId, Tenant};
use crate::record::DeliveryRecord;
use crate::storage::{DeliveryStore, ReplayAudit, StoreError};
use crate::telemetry;

/// How long [`replay_endpoint`] reads the DLQ before it stops and answers with what it did: the
/// API's answer is due within its request deadline, and a republished record may take up to
/// [`API_PUBLISH_DEADLINE`] more.
pub const ENDPOINT_SCAN_LIMIT: Duration = Duration::from_secs(15);

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
    /// Which credential asked, for the audit entry.
    pub asked_by: Option<String>,
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
///
/// [`Standing::Dead`]: super::Standing::Dead
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
    let done = send_dead_letters(&mut scan, store, &republisher, &replay_id, request).await;
    telemetry::replayed(done.replayed);
    let audit = ReplayAudit {
        replay_id,
        actor: request.actor.clone(),
        reason: request.reason.clone(),
        at: SystemTime::now(),
        scope: scope(target, request, &done),
        count: done.replayed,
        dry_run: false,
        tenant: Some(request.tenant.clone()),
        asked_by: request.asked_by.clone(),
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

/// Reads the endpoint's dead letters from `scan` and sends each, up to [`WINDOW`] at once as
/// a replay of a range does, until the scan ends or stops; then lets the sends under way
/// finish. What was republished before a stop is audited all the same.
async fn send_dead_letters(
    scan: &mut DlqScan,
    store: &dyn DeliveryStore,
    republisher: &Republisher,
    replay_id: &str,
    request: &EndpointReplayRequest,
) -> EndpointReplay {
    let mut tally = Tally {
        done: EndpointReplay {
            replay_id: replay_id.to_owned(),
            replayed: 0,
            skipped: 0,
            resume_since: None,
            stopped: None,
        },
        seen: BTreeSet::new(),
        failed: None,
    };
    let mut sends = FuturesUnordered::new();
    tally.done.stopped = loop {
        while let Some(Some(sent)) = sends.next().now_or_never() {
            tally.settle(sent);
        }
        if tally.failed.is_some() {
            break None;
        }
        if sends.len() >= WINDOW {
            if let Some(sent) = sends.next().await {
                tally.settle(sent);
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
                    tally.settle(sent);
                }
                continue;
            }
            Err(e) => {
                tally.done.resume_since = Some(millis_time(scan.resume_from()));
                break Some(format!("reading the DLQ failed: {e}"));
            }
            Ok(Some(Err(ScanEnd::Done))) => break None,
            Ok(Some(Err(ScanEnd::TimedOut { resume_from }))) => {
                tally.done.resume_since = Some(millis_time(resume_from));
                break Some(format!(
                    "read the DLQ for {}s, the longest one request may",
                    ENDPOINT_SCAN_LIMIT.as_secs()
                ));
            }
        };
        let Some(record) = tally.admit(&msg, &request.endpoint) else {
            continue;
        };
        // Where a request resumes when this record is not covered: its own time, or earlier
        // where another partition has not been read as far.
        let at = msg.timestamp().to_millis().unwrap_or(i64::MAX);
        let resume = millis_time(scan.resume_from().min(at));
        sends.push(async move {
            let sent = send_for_endpoint(store, republisher, record, replay_id).await;
            (resume, sent)
        });
    };
    // Let the sends under way finish: each was claimed, and may already be on its way.
    while let Some(sent) = sends.next().await {
        tally.settle(sent);
    }
    drop(sends);
    tally.finish()
}

/// What an endpoint's replay has done, as it reads dead letters and their sends settle.
struct Tally {
    done: EndpointReplay,
    /// The deliveries this replay has sent (or is sending).
    seen: BTreeSet<DeliveryId>,
    /// The earliest dead letter a failed send left uncovered.
    failed: Option<Uncovered>,
}

/// A dead letter a failed send left uncovered: when it was written, and why the send failed.
struct Uncovered {
    since: SystemTime,
    why: String,
}

impl Tally {
    /// The dead letter in `msg` when it is one of `endpoint`'s and its delivery's first in
    /// this replay; a delivery's later dead letters are counted as skipped.
    fn admit(&mut self, msg: &OwnedMessage, endpoint: &EndpointId) -> Option<DeliveryRecord> {
        let record = DeliveryRecord::from_message(msg).ok()?;
        if record.dead.is_none() || record.endpoint_id != *endpoint {
            return None;
        }
        if !self.seen.insert(record.delivery_id.clone()) {
            self.done.skipped += 1;
            return None;
        }
        Some(record)
    }

    /// Counts a finished send: where a request resumes if its record is not covered, and how
    /// the send ended.
    fn settle(&mut self, (resume, sent): (SystemTime, EndpointSent)) {
        match sent {
            EndpointSent::Replayed => self.done.replayed += 1,
            EndpointSent::Skipped => self.done.skipped += 1,
            EndpointSent::Failed(why) => {
                if self.failed.as_ref().is_none_or(|f| resume < f.since) {
                    self.failed = Some(Uncovered { since: resume, why });
                }
            }
        }
    }

    /// What the replay did. A failed send leaves its record uncovered: the request resumes no
    /// later than its time.
    fn finish(self) -> EndpointReplay {
        let mut done = self.done;
        if let Some(Uncovered { since, why }) = self.failed {
            done.resume_since = Some(done.resume_since.map_or(since, |r| r.min(since)));
            done.stopped = Some(why);
        }
        done
    }
}

/// The audit entry's account of what an endpoint's replay covered.
fn scope(target: &ReplayTarget, request: &EndpointReplayRequest, done: &EndpointReplay) -> String {
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
    scope
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::super::fixture::{ClaimsFailAfter, MockDlq, mock_dlq};
    use super::*;
    /// An endpoint's replay sends its dead letters side by side; when the attempt log stops
    /// answering, the sends under way finish, what went out is counted and audited, and the
    /// answer says where to resume and why.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_endpoint_replay_whose_claims_fail_says_where_to_resume() {
        let endpoint = EndpointId::generate();
        let letters: Vec<DeliveryRecord> = (0..3)
            .map(|n| crate::storage::conformance::dead_letter_to(&format!("evt_{n}"), &endpoint, 0))
            .collect();
        let since = SystemTime::now() - Duration::from_secs(60);
        let MockDlq {
            cluster: _cluster,
            target,
        } = mock_dlq(&letters).await;
        let store = crate::storage::hooked::Hooked::new(ClaimsFailAfter(AtomicUsize::new(1)), 16);
        for letter in &letters {
            let row = crate::storage::conformance::dead_attempt(letter);
            store.record_attempt(&row).await.unwrap();
        }
        let request = EndpointReplayRequest {
            endpoint: endpoint.clone(),
            tenant: Tenant::parse("acme").unwrap(),
            since,
            until: SystemTime::now() + Duration::from_secs(60),
            actor: "acme's API token".into(),
            reason: "receiver fixed".into(),
            asked_by: Some("tenant token".into()),
        };
        let done = replay_endpoint(&target, &store, &request).await.unwrap();
        assert_eq!((done.replayed, done.skipped), (1, 0), "{done:?}");
        let resume = done.resume_since.expect("it stopped short");
        assert!(resume >= since && resume <= SystemTime::now(), "{done:?}");
        assert!(
            done.stopped
                .as_deref()
                .is_some_and(|s| s.starts_with("the attempt log did not answer")),
            "{done:?}"
        );
        let audits = store.replays(None, 10).await.unwrap();
        assert_eq!(audits.len(), 1, "{audits:?}");
        assert_eq!(audits[0].count, 1, "{audits:?}");
        assert_eq!(audits[0].asked_by.as_deref(), Some("tenant token"));
    }
}
