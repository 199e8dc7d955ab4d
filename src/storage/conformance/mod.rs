//! One behavioural suite for every [`DeliveryStore`]: the embedded store runs it in unit tests,
//! the CQL store in integration tests against a real server. Ids are unique per run, so the
//! suite can run repeatedly against one keyspace.
//!
//! - this file: the fixtures, attempts, history pages and replay records;
//! - [`states`]: deliveries made by `record_event` and moved by notes, in every state;
//! - [`events`]: the events a tenant's fan-out recorded, one by one and paged.

mod events;
mod states;

use std::time::{Duration, SystemTime};

use super::{
    AttemptOutcome, AttemptRow, DeliveryStatus, DeliveryStore, HistoryQuery, RecordPosition,
    ReplayAudit, ReplayMark, ScheduleReason, Scheduled,
};
use crate::attempt::ErrorClass;
use crate::dead_reason::DeadReason;
use crate::id::{DeliveryId, EndpointId, EventId, Tenant};

/// The DLQ record of event `event` (an `order.created` of tenant acme) to an endpoint of its
/// own, dead after a 404, its data padded with `padding` bytes: what replays read, for their
/// tests and benchmarks.
pub fn dead_letter(event: &str, padding: usize) -> crate::record::DeliveryRecord {
    dead_letter_to(event, &EndpointId::generate(), padding)
}

/// [`dead_letter`], to `endpoint`.
pub fn dead_letter_to(
    event: &str,
    endpoint: &EndpointId,
    padding: usize,
) -> crate::record::DeliveryRecord {
    use crate::event_type::EventType;
    use crate::record::{DeadInfo, DeliveryRecord, UnixMillis, build_body};
    let event_id = EventId::parse(event).expect("valid event id");
    let event_type = EventType::parse("order.created").expect("valid event type");
    let at = UnixMillis(1_700_000_000_000);
    let data = serde_json::json!({ "pad": "x".repeat(padding) });
    let data = serde_json::value::to_raw_value(&data).expect("json");
    let body = build_body(&event_id, &event_type, at, &data);
    DeliveryRecord::new(
        event_id,
        endpoint.clone(),
        Tenant::parse("acme").expect("valid tenant"),
        event_type,
        at,
        None,
        body,
    )
    .for_dlq(DeadInfo {
        reason: DeadReason::HttpStatus,
        last_status: Some(404),
        last_error: Some(ErrorClass::HttpStatus),
        last_attempt_at: at,
        signing_key_ids: vec![],
    })
}

/// The attempt that dead-lettered `record`'s delivery (a 404), as the attempt log holds it.
pub fn dead_attempt(record: &crate::record::DeliveryRecord) -> AttemptRow {
    let mut row = attempt_row(record.event_id.as_str(), record.endpoint_id.as_str(), 1);
    row.delivery_id = record.delivery_id.clone();
    row.status = Some(404);
    row.outcome = AttemptOutcome::Dead {
        reason: DeadReason::HttpStatus,
    };
    row
}

/// A first attempt of (`event`, `endpoint`) that succeeded with 200, started "now".
pub fn attempt_row(event: &str, endpoint: &str, attempt: u32) -> AttemptRow {
    let event_id = EventId::parse(event).expect("valid event id");
    let endpoint_id = EndpointId::parse(endpoint).expect("valid endpoint id");
    AttemptRow {
        delivery_id: DeliveryId::derive(&event_id, &endpoint_id),
        event_id,
        endpoint_id,
        tenant: Tenant::parse("acme").expect("valid tenant"),
        event_type: "order.created".into(),
        attempt,
        started_at: SystemTime::now(),
        status: Some(200),
        latency_ms: 12,
        error_class: None,
        response_body: b"ok".to_vec(),
        signing_key_ids: vec!["k_1".into()],
        replay_id: None,
        outcome: AttemptOutcome::Succeeded,
        record: Some(RecordPosition {
            partition: 7,
            offset: 1_234_567_890_123,
        }),
        request_headers: vec![
            ("content-type".into(), "application/json".into()),
            ("webhook-id".into(), event.into()),
        ],
    }
}

/// The id of (`event`, `endpoint`)'s delivery had it been fanned out before version 7 of the
/// CQL schema: it does not begin with its event's key, and no recorded event lists it, so its
/// endpoint's history lists it by its attempts and notes, at its earliest.
pub fn legacy_delivery_id(event: &str, endpoint: &str) -> DeliveryId {
    let name = format!("{event}\0{endpoint}");
    let id = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, name.as_bytes());
    DeliveryId::parse(format!("dlv_{}", id.simple())).expect("valid id")
}

/// [`attempt_row`] of a delivery fanned out before version 7 ([`legacy_delivery_id`]).
pub fn legacy_attempt_row(event: &str, endpoint: &str, attempt: u32) -> AttemptRow {
    let mut row = attempt_row(event, endpoint, attempt);
    row.delivery_id = legacy_delivery_id(event, endpoint);
    row
}

/// A name no other run of the suite uses.
pub(super) fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

/// Runs every check; panics with a message naming the first that fails.
pub async fn run<S: DeliveryStore + ?Sized>(store: &S) {
    attempts_round_trip(store).await;
    state_follows_attempts(store).await;
    late_attempts_keep_the_newest_state(store).await;
    history_pages_newest_first_and_stable_under_inserts(store).await;
    history_filters(store).await;
    event_fan_out_listing(store).await;
    replay_audit(store).await;
    replay_marks(store).await;
    replay_claims(store).await;
    states::run(store).await;
    events::run(store).await;
}

async fn attempts_round_trip<S: DeliveryStore + ?Sized>(store: &S) {
    let event = unique("evt");
    let endpoint = unique("ep");
    let base = SystemTime::UNIX_EPOCH + Duration::from_millis(1_800_000_000_123);
    let mut timeout = attempt_row(&event, &endpoint, 1);
    timeout.started_at = base;
    timeout.status = None;
    timeout.error_class = Some(ErrorClass::Timeout);
    timeout.response_body = vec![];
    timeout.latency_ms = 15_000;
    timeout.outcome = AttemptOutcome::RetryScheduled {
        next_attempt_at: base + Duration::from_secs(30),
    };
    // As logged before attempts kept their record's place and the headers sent.
    timeout.record = None;
    timeout.request_headers = vec![];
    let mut big = attempt_row(&event, &endpoint, 2);
    big.started_at = base + Duration::from_secs(31);
    big.status = Some(500);
    big.error_class = Some(ErrorClass::HttpStatus);
    big.response_body = vec![b'x'; 4096];
    big.signing_key_ids = vec!["k_old".into(), "k_new".into()];
    big.replay_id = Some("rpl_1".into());
    big.request_headers = vec![
        ("content-type".into(), "application/json".into()),
        ("webhook-signature".into(), "v1,c2ln v1,b3RoZXI=".into()),
        ("webhook-id".into(), event.clone()),
        ("x-empty".into(), String::new()),
    ];
    big.outcome = AttemptOutcome::Dead {
        reason: DeadReason::WindowExhausted,
    };
    store
        .record_attempt(&timeout)
        .await
        .expect("record timeout attempt");
    store
        .record_attempt(&big)
        .await
        .expect("record 500 attempt");
    let rows = store
        .attempts(&timeout.delivery_id)
        .await
        .expect("read attempts");
    assert_eq!(
        rows,
        vec![timeout.clone(), big.clone()],
        "attempt rows round-trip exactly, request headers in order included"
    );
    let missing = DeliveryId::derive(
        &EventId::parse(unique("evt")).unwrap(),
        &EndpointId::parse(endpoint).unwrap(),
    );
    assert!(
        store.attempts(&missing).await.unwrap().is_empty(),
        "unknown delivery has no rows"
    );
    assert!(
        store.delivery(&missing).await.unwrap().is_none(),
        "unknown delivery has no state"
    );
}

/// The first attempt of a delivery, started at `t0`, answered 503 and retried 5 s later.
fn answered_503(event: &str, endpoint: &str, t0: SystemTime) -> AttemptRow {
    answered_503_to(attempt_row(event, endpoint, 1), t0)
}

/// `row` as the first attempt, started at `t0`, answered 503 and retried 5 s later.
fn answered_503_to(mut row: AttemptRow, t0: SystemTime) -> AttemptRow {
    row.started_at = t0;
    row.status = Some(503);
    row.error_class = Some(ErrorClass::HttpStatus);
    row.outcome = AttemptOutcome::RetryScheduled {
        next_attempt_at: t0 + Duration::from_secs(5),
    };
    row
}

async fn state_follows_attempts<S: DeliveryStore + ?Sized>(store: &S) {
    let event = unique("evt");
    let endpoint = unique("ep");
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let first = answered_503(&event, &endpoint, t0);
    store.record_attempt(&first).await.unwrap();
    let s = store
        .delivery(&first.delivery_id)
        .await
        .unwrap()
        .expect("state after 503");
    assert_eq!(s.status, DeliveryStatus::Scheduled);
    assert_eq!(s.attempts, 1);
    assert_eq!(
        s.scheduled,
        Some(Scheduled {
            reason: ScheduleReason::Retry,
            next_attempt_at: t0 + Duration::from_secs(5)
        })
    );
    assert_eq!(s.dead_reason, None);
    assert_eq!(s.last_status, Some(503));
    assert_eq!(
        (s.created_at, s.updated_at),
        (t0, t0),
        "no creation: the first attempt"
    );

    let mut second = attempt_row(&event, &endpoint, 2);
    second.started_at = t0 + Duration::from_secs(6);
    store.record_attempt(&second).await.unwrap();
    let s = store
        .delivery(&first.delivery_id)
        .await
        .unwrap()
        .expect("state after 200");
    assert_eq!(s.status, DeliveryStatus::Succeeded);
    assert_eq!(s.attempts, 2);
    assert_eq!(s.first_attempt_at, Some(t0));
    assert_eq!(s.last_attempt_at, Some(t0 + Duration::from_secs(6)));
    assert_eq!(s.updated_at, t0 + Duration::from_secs(6));
    assert_eq!(s.scheduled, None);
    assert_eq!(s.last_error_class, None);
}

/// After a crash an older attempt may be logged after a newer one: it counts, and moves the
/// first attempt back, but the newest attempt keeps setting the status; the history lists a
/// delivery without a recorded event at its first attempt.
async fn late_attempts_keep_the_newest_state<S: DeliveryStore + ?Sized>(store: &S) {
    let event = unique("evt");
    let endpoint = unique("ep");
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let mut newer = legacy_attempt_row(&event, &endpoint, 2);
    newer.started_at = t0 + Duration::from_secs(6);
    store.record_attempt(&newer).await.unwrap();
    let older = answered_503_to(legacy_attempt_row(&event, &endpoint, 1), t0);
    store.record_attempt(&older).await.unwrap();
    let s = store
        .delivery(&newer.delivery_id)
        .await
        .unwrap()
        .expect("state after both attempts");
    assert_eq!(
        s.status,
        DeliveryStatus::Succeeded,
        "the newest attempt wins"
    );
    assert_eq!(s.attempts, 2);
    assert_eq!(s.first_attempt_at, Some(t0));
    assert_eq!(s.last_attempt_at, Some(t0 + Duration::from_secs(6)));
    assert_eq!(s.last_status, Some(200));
    assert_eq!(s.scheduled, None);
    let page = store
        .endpoint_deliveries(
            &EndpointId::parse(&endpoint).unwrap(),
            &HistoryQuery {
                limit: 10,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let listed: Vec<_> = page.items.iter().map(|s| s.created_at).collect();
    assert_eq!(listed, [t0], "listed once, at its first attempt");
}

async fn history_pages_newest_first_and_stable_under_inserts<S: DeliveryStore + ?Sized>(store: &S) {
    let endpoint = unique("ep");
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let mut events = vec![];
    for i in 0..25u64 {
        let mut row = legacy_attempt_row(&unique("evt"), &endpoint, 1);
        row.started_at = t0 + Duration::from_secs(i);
        events.push(row.event_id.clone());
        store.record_attempt(&row).await.unwrap();
    }
    let ep = EndpointId::parse(&endpoint).unwrap();
    let mut query = HistoryQuery {
        limit: 10,
        ..Default::default()
    };
    let first = store.endpoint_deliveries(&ep, &query).await.unwrap();
    assert_eq!(first.items.len(), 10);
    assert_eq!(first.items[0].event_id, events[24], "newest first");
    // Newer deliveries arriving between pages must not shift or repeat what follows.
    for i in 0..5u64 {
        let mut row = legacy_attempt_row(&unique("evt"), &endpoint, 1);
        row.started_at = t0 + Duration::from_secs(100 + i);
        store.record_attempt(&row).await.unwrap();
    }
    let mut seen: Vec<EventId> = first.items.iter().map(|s| s.event_id.clone()).collect();
    query.cursor = first.next_cursor.clone();
    while let Some(cursor) = query.cursor.clone() {
        let page = store
            .endpoint_deliveries(
                &ep,
                &HistoryQuery {
                    cursor: Some(cursor),
                    ..query.clone()
                },
            )
            .await
            .unwrap();
        seen.extend(page.items.iter().map(|s| s.event_id.clone()));
        query.cursor = page.next_cursor;
    }
    let expected: Vec<EventId> = events.iter().rev().cloned().collect();
    assert_eq!(
        seen, expected,
        "paging is complete, ordered and free of duplicates"
    );
    let bad = HistoryQuery {
        cursor: Some("not a cursor".into()),
        limit: 10,
        ..Default::default()
    };
    assert!(
        store.endpoint_deliveries(&ep, &bad).await.is_err(),
        "garbage cursor is an error"
    );
}

async fn history_filters<S: DeliveryStore + ?Sized>(store: &S) {
    let endpoint = unique("ep");
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    for i in 0..6u64 {
        let mut row = legacy_attempt_row(&unique("evt"), &endpoint, 1);
        row.started_at = t0 + Duration::from_secs(i * 60);
        if i % 2 == 1 {
            row.status = Some(404);
            row.error_class = Some(ErrorClass::HttpStatus);
            row.outcome = AttemptOutcome::Dead {
                reason: DeadReason::HttpStatus,
            };
        }
        store.record_attempt(&row).await.unwrap();
    }
    let ep = EndpointId::parse(&endpoint).unwrap();
    let dead = store
        .endpoint_deliveries(
            &ep,
            &HistoryQuery {
                status: Some(DeliveryStatus::Dead),
                limit: 100,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(dead.items.len(), 3, "state filter");
    assert!(dead.items.iter().all(|s| s.status == DeliveryStatus::Dead));
    let recent = store
        .endpoint_deliveries(
            &ep,
            &HistoryQuery {
                since: Some(t0 + Duration::from_secs(180)),
                limit: 100,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(recent.items.len(), 3, "since filter");
}

/// An event's deliveries are those its recorded event lists, attempted or not.
async fn event_fan_out_listing<S: DeliveryStore + ?Sized>(store: &S) {
    let event = unique("evt");
    let mut endpoints = vec![unique("ep"), unique("ep"), unique("ep")];
    endpoints.sort();
    let tenant = Tenant::parse("acme").expect("valid tenant");
    let row = states::event_row(
        &tenant,
        &event,
        "order.created",
        SystemTime::now(),
        &endpoints,
    );
    store.record_event(&row).await.unwrap();
    for ep in &endpoints[..2] {
        store
            .record_attempt(&attempt_row(&event, ep, 1))
            .await
            .unwrap();
    }
    let listed = store
        .event_deliveries(&EventId::parse(&event).unwrap())
        .await
        .unwrap();
    let mut ids: Vec<String> = listed.iter().map(|s| s.endpoint_id.to_string()).collect();
    ids.sort();
    assert_eq!(
        ids, endpoints,
        "one delivery per endpoint the event fanned out to"
    );
    let attempted = listed
        .iter()
        .filter(|s| s.status == DeliveryStatus::Succeeded)
        .count();
    assert_eq!(attempted, 2, "two attempted, one pending");
}

async fn replay_audit<S: DeliveryStore + ?Sized>(store: &S) {
    let entry = |tenant: Option<&Tenant>| ReplayAudit {
        replay_id: unique("rpl"),
        actor: "oncall@example.com".into(),
        reason: "receiver fixed".into(),
        at: SystemTime::now() + Duration::from_secs(3600),
        scope: "dlq partition 0 offsets 0..10".into(),
        count: 10,
        dry_run: false,
        tenant: tenant.cloned(),
        asked_by: tenant.map(|t| format!("key tk_0193 ({t} ci)")),
    };
    let (a, b) = (
        Tenant::parse(unique("acme")).unwrap(),
        Tenant::parse(unique("globex")).unwrap(),
    );
    let range = entry(None);
    let of_a = entry(Some(&a));
    let of_b = entry(Some(&b));
    for audit in [&range, &of_a, &of_b] {
        store.record_replay(audit).await.unwrap();
    }
    let all = store.replays(None, 50).await.unwrap();
    for audit in [&range, &of_a, &of_b] {
        let found = all
            .iter()
            .find(|a| a.replay_id == audit.replay_id)
            .expect("every replay is in the operators' trail");
        assert_eq!(found.actor, audit.actor);
        assert_eq!(found.count, 10);
        assert_eq!(found.tenant, audit.tenant, "the tenant round-trips");
        assert_eq!(found.asked_by, audit.asked_by, "who asked round-trips");
    }
    let seen_by_a = store.replays(Some(&a), 50).await.unwrap();
    let seen: Vec<&str> = seen_by_a.iter().map(|a| a.replay_id.as_str()).collect();
    assert_eq!(
        seen,
        [of_a.replay_id.as_str()],
        "a tenant reads its own alone"
    );
    assert_eq!(seen_by_a[0].tenant.as_ref(), Some(&a));
    let nobody = Tenant::parse(unique("initech")).unwrap();
    assert!(store.replays(Some(&nobody), 50).await.unwrap().is_empty());
    assert!(store.replays(Some(&a), 0).await.unwrap().is_empty());
}

async fn replay_marks<S: DeliveryStore + ?Sized>(store: &S) {
    let row = attempt_row(&unique("evt"), &unique("ep"), 1);
    store.record_attempt(&row).await.unwrap();
    let id = &row.delivery_id;
    assert_eq!(
        store.replay_mark(id).await.unwrap(),
        None,
        "no mark before a replay"
    );
    let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_800_000_000_123);
    let first = ReplayMark {
        delivery_id: id.clone(),
        replay_id: unique("rpl"),
        at,
    };
    store.record_replay_mark(&first).await.unwrap();
    assert_eq!(store.replay_mark(id).await.unwrap(), Some(first.clone()));
    let second = ReplayMark {
        replay_id: unique("rpl"),
        at: at + Duration::from_secs(60),
        ..first.clone()
    };
    store.record_replay_mark(&second).await.unwrap();
    assert_eq!(
        store.replay_mark(id).await.unwrap(),
        Some(second),
        "a later replay's mark replaces the earlier one"
    );
    let other = attempt_row(&unique("evt"), &unique("ep"), 1);
    store.record_attempt(&other).await.unwrap();
    assert_eq!(
        store.replay_mark(&other.delivery_id).await.unwrap(),
        None,
        "a mark belongs to its delivery alone"
    );
}

async fn replay_claims<S: DeliveryStore + ?Sized>(store: &S) {
    let row = attempt_row(&unique("evt"), &unique("ep"), 1);
    store.record_attempt(&row).await.unwrap();
    let id = &row.delivery_id;
    assert_eq!(
        store.replay_claim(id).await.unwrap(),
        None,
        "unclaimed at first"
    );
    let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_800_000_000_456);
    let claim = |replay_id: &str, secs: u64| ReplayMark {
        delivery_id: id.clone(),
        replay_id: replay_id.to_owned(),
        at: at + Duration::from_secs(secs),
    };
    let (a, b, c) = (unique("rpl"), unique("rpl"), unique("rpl"));
    assert!(store.claim_replay(&claim(&a, 0), None).await.unwrap());
    assert_eq!(store.replay_claim(id).await.unwrap(), Some(claim(&a, 0)));
    assert!(
        !store.claim_replay(&claim(&b, 1), None).await.unwrap(),
        "a replay that read no claim loses to the one that made it"
    );
    assert!(
        !store.claim_replay(&claim(&b, 1), Some(&c)).await.unwrap(),
        "a replay that read another claim loses too"
    );
    assert_eq!(
        store.replay_claim(id).await.unwrap(),
        Some(claim(&a, 0)),
        "a lost claim writes nothing"
    );
    assert!(store.claim_replay(&claim(&b, 2), Some(&a)).await.unwrap());
    assert_eq!(store.replay_claim(id).await.unwrap(), Some(claim(&b, 2)));
    assert!(
        !store.claim_replay(&claim(&c, 3), Some(&a)).await.unwrap(),
        "a claim over a replaced one loses"
    );
    assert!(
        store.claim_replay(&claim(&c, 3), Some(&b)).await.unwrap(),
        "a claim over the latest one wins"
    );
    assert_eq!(store.replay_claim(id).await.unwrap(), Some(claim(&c, 3)));
    let other = attempt_row(&unique("evt"), &unique("ep"), 1);
    store.record_attempt(&other).await.unwrap();
    assert_eq!(
        store.replay_claim(&other.delivery_id).await.unwrap(),
        None,
        "a claim belongs to its delivery alone"
    );
}
