//! Deliveries in every state: created pending by `record_event`, scheduled or dead by the
//! delivery stage's notes, whatever order their entries are written in.

use std::time::{Duration, SystemTime};

use super::{attempt_row, legacy_delivery_id, unique};
use crate::dead_reason::DeadReason;
use crate::id::{DeliveryId, EndpointId, EventId, Tenant};
use crate::park_reason::ParkReason;
use crate::storage::{
    AttemptOutcome, DeliveryNote, DeliveryState, DeliveryStatus, DeliveryStore, EventRow,
    HistoryQuery, NoteKind, ScheduleReason, Scheduled,
};

pub(super) async fn run<S: DeliveryStore + ?Sized>(store: &S) {
    recorded_events_make_pending_deliveries(store).await;
    each_state_is_listed_by_its_filter(store).await;
    a_parked_delivery_is_scheduled_with_its_reason(store).await;
    a_dead_note_without_attempts_is_dead_with_its_reason(store).await;
    the_latest_entry_wins_in_any_write_order(store).await;
    a_creation_after_an_attempt_does_not_override_it(store).await;
    events_and_notes_recorded_twice_are_recorded_once(store).await;
}

/// 2027-01-15T08:00:00Z plus `ms` milliseconds (the CQL store keeps milliseconds).
fn at(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(1_800_000_000_000 + ms)
}

/// An event of tenant `tenant` received at `received`, fanned out to `endpoints` (sorted, as
/// the CQL store returns them).
pub(super) fn event_row(
    tenant: &Tenant,
    event: &str,
    event_type: &str,
    received: SystemTime,
    endpoints: &[String],
) -> EventRow {
    let event_id = EventId::parse(event).expect("valid event id");
    let mut endpoints: Vec<EndpointId> = endpoints
        .iter()
        .map(|e| EndpointId::parse(e.as_str()).expect("valid endpoint id"))
        .collect();
    endpoints.sort();
    let body = format!(
        r#"{{"id":"{event}","type":"{event_type}","timestamp":"2027-01-15T07:59:59Z","data":{{"n":1}}}}"#
    );
    EventRow {
        tenant: tenant.clone(),
        event_id,
        event_type: event_type.into(),
        occurred_at: received - Duration::from_secs(1),
        received_at: received,
        body: bytes::Bytes::from(body),
        fingerprint: format!("fp_{}", unique("x")),
        endpoints,
    }
}

/// Records event `event` of acme, received at `received`, fanned out to `endpoint` alone.
async fn fan_out<S: DeliveryStore + ?Sized>(
    store: &S,
    event: &str,
    endpoint: &str,
    received: SystemTime,
) -> EventRow {
    let row = one_endpoint(event, endpoint, received);
    store.record_event(&row).await.expect("record event");
    row
}

/// Event `event` of acme, received at `received`, fanned out to `endpoint` alone.
fn one_endpoint(event: &str, endpoint: &str, received: SystemTime) -> EventRow {
    event_row(
        &acme(),
        event,
        "order.created",
        received,
        &[endpoint.to_owned()],
    )
}

fn acme() -> Tenant {
    Tenant::parse("acme").expect("valid tenant")
}

/// The note of (`event`, `endpoint`) at `t`.
fn note(event: &str, endpoint: &str, t: SystemTime, kind: NoteKind) -> DeliveryNote {
    let event_id = EventId::parse(event).expect("valid event id");
    let endpoint_id = EndpointId::parse(endpoint).expect("valid endpoint id");
    DeliveryNote {
        delivery_id: DeliveryId::derive(&event_id, &endpoint_id),
        event_id,
        endpoint_id,
        tenant: acme(),
        event_type: "order.created".into(),
        at: t,
        kind,
        replay_id: None,
    }
}

fn parked(reason: ParkReason, next: SystemTime) -> NoteKind {
    NoteKind::Parked {
        reason,
        next_attempt_at: next,
    }
}

fn dead(reason: DeadReason) -> NoteKind {
    NoteKind::Dead { reason }
}

async fn state<S: DeliveryStore + ?Sized>(store: &S, event: &str, endpoint: &str) -> DeliveryState {
    let id = DeliveryId::derive(
        &EventId::parse(event).unwrap(),
        &EndpointId::parse(endpoint).unwrap(),
    );
    store
        .delivery(&id)
        .await
        .expect("read state")
        .unwrap_or_else(|| panic!("no state for {event} to {endpoint}"))
}

async fn history<S: DeliveryStore + ?Sized>(
    store: &S,
    endpoint: &str,
    status: Option<DeliveryStatus>,
) -> Vec<DeliveryState> {
    store
        .endpoint_deliveries(
            &EndpointId::parse(endpoint).unwrap(),
            &HistoryQuery {
                status,
                limit: 100,
                ..Default::default()
            },
        )
        .await
        .expect("read history")
        .items
}

async fn recorded_events_make_pending_deliveries<S: DeliveryStore + ?Sized>(store: &S) {
    let event = unique("evt");
    let mut endpoints = vec![unique("ep"), unique("ep"), unique("ep")];
    endpoints.sort();
    let row = event_row(&acme(), &event, "order.created", at(0), &endpoints);
    store.record_event(&row).await.expect("record event");
    for ep in &endpoints {
        let s = state(store, &event, ep).await;
        assert_eq!(s.status, DeliveryStatus::Pending, "made pending");
        assert_eq!(s.attempts, 0);
        assert_eq!((s.created_at, s.updated_at), (at(0), at(0)));
        assert_eq!((s.first_attempt_at, s.last_attempt_at), (None, None));
        assert_eq!((s.scheduled, s.dead_reason), (None, None));
        assert_eq!((s.last_status, s.last_error_class), (None, None));
        assert_eq!(s.tenant, acme());
        assert_eq!(s.event_type, "order.created");
        let listed = history(store, ep, None).await;
        assert_eq!(listed, [s], "in its endpoint's history, once");
        let id = &listed[0].delivery_id;
        assert!(store.attempts(id).await.unwrap().is_empty(), "no attempt");
    }
    let mut listed: Vec<String> = store
        .event_deliveries(&row.event_id)
        .await
        .unwrap()
        .into_iter()
        .map(|s| {
            assert_eq!(s.status, DeliveryStatus::Pending);
            s.endpoint_id.to_string()
        })
        .collect();
    listed.sort();
    assert_eq!(
        listed, endpoints,
        "every endpoint's delivery, none attempted"
    );
    // An event no endpoint subscribed to is kept, with no delivery.
    let lone = event_row(&acme(), &unique("evt"), "order.created", at(1), &[]);
    store.record_event(&lone).await.unwrap();
    assert_eq!(
        store.event(&acme(), &lone.event_id).await.unwrap(),
        Some(lone.clone())
    );
    assert!(
        store
            .event_deliveries(&lone.event_id)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn each_state_is_listed_by_its_filter<S: DeliveryStore + ?Sized>(store: &S) {
    let endpoint = unique("ep");
    let events: Vec<String> = (0..4).map(|_| unique("evt")).collect();
    for (i, e) in events.iter().enumerate() {
        fan_out(store, e, &endpoint, at(i as u64 * 1000)).await;
    }
    // events[0] stays pending.
    let scheduled = note(
        &events[1],
        &endpoint,
        at(1500),
        parked(ParkReason::Stalled, at(9000)),
    );
    store.record_note(&scheduled).await.unwrap();
    let mut ok = attempt_row(&events[2], &endpoint, 1);
    ok.started_at = at(2500);
    store.record_attempt(&ok).await.unwrap();
    let gone = note(
        &events[3],
        &endpoint,
        at(3500),
        dead(DeadReason::EndpointDisabled),
    );
    store.record_note(&gone).await.unwrap();
    let all = history(store, &endpoint, None).await;
    let order: Vec<&str> = all.iter().map(|s| s.event_id.as_str()).collect();
    let newest_first: Vec<&str> = events.iter().rev().map(String::as_str).collect();
    assert_eq!(order, newest_first, "listed by creation, newest first");
    for (status, event) in DeliveryStatus::ALL.into_iter().zip(&events) {
        let listed = history(store, &endpoint, Some(status)).await;
        let ids: Vec<&str> = listed.iter().map(|s| s.event_id.as_str()).collect();
        assert_eq!(ids, [event.as_str()], "state filter {}", status.as_str());
        assert_eq!(listed[0].status, status);
    }
}

async fn a_parked_delivery_is_scheduled_with_its_reason<S: DeliveryStore + ?Sized>(store: &S) {
    let (event, endpoint) = (unique("evt"), unique("ep"));
    fan_out(store, &event, &endpoint, at(0)).await;
    let due = at(60_000);
    let parked_note = note(
        &event,
        &endpoint,
        at(250),
        parked(ParkReason::BreakerOpen, due),
    );
    store.record_note(&parked_note).await.unwrap();
    let s = state(store, &event, &endpoint).await;
    assert_eq!(s.status, DeliveryStatus::Scheduled);
    assert_eq!(
        s.scheduled,
        Some(Scheduled {
            reason: ScheduleReason::Parked(ParkReason::BreakerOpen),
            next_attempt_at: due,
        })
    );
    assert_eq!(s.attempts, 0, "a note is not an attempt");
    assert_eq!((s.created_at, s.updated_at), (at(0), at(250)));
    assert_eq!(s.first_attempt_at, None);
    assert!(store.attempts(&s.delivery_id).await.unwrap().is_empty());
}

async fn a_dead_note_without_attempts_is_dead_with_its_reason<S: DeliveryStore + ?Sized>(
    store: &S,
) {
    // Dead-lettered from a record fanned out before the store recorded events: the note alone
    // makes the delivery, listed at the note.
    let (event, endpoint) = (unique("evt"), unique("ep"));
    let mut gone = note(
        &event,
        &endpoint,
        at(500),
        dead(DeadReason::EndpointDisabled),
    );
    gone.delivery_id = legacy_delivery_id(&event, &endpoint);
    store.record_note(&gone).await.unwrap();
    let s = store
        .delivery(&gone.delivery_id)
        .await
        .unwrap()
        .expect("a state from the note alone");
    assert_eq!(s.status, DeliveryStatus::Dead);
    assert_eq!(s.dead_reason, Some(DeadReason::EndpointDisabled));
    assert_eq!(s.attempts, 0);
    assert_eq!((s.first_attempt_at, s.last_attempt_at), (None, None));
    assert_eq!((s.created_at, s.updated_at), (at(500), at(500)));
    assert_eq!(s.scheduled, None);
    let dead_listed = history(store, &endpoint, Some(DeliveryStatus::Dead)).await;
    assert_eq!(dead_listed, [s], "listed with the dead letters");

    // Dead-lettered before the fan-out recorded its event (the delivery stage can be quicker):
    // dead at once, and listed at its creation once the event is recorded.
    let (event, endpoint) = (unique("evt"), unique("ep"));
    let gone = note(
        &event,
        &endpoint,
        at(500),
        dead(DeadReason::EndpointDisabled),
    );
    store.record_note(&gone).await.unwrap();
    let s = state(store, &event, &endpoint).await;
    assert_eq!((s.status, s.attempts), (DeliveryStatus::Dead, 0));
    store
        .record_event(&one_endpoint(&event, &endpoint, at(0)))
        .await
        .unwrap();
    let s = state(store, &event, &endpoint).await;
    assert_eq!(s.status, DeliveryStatus::Dead);
    assert_eq!((s.created_at, s.updated_at), (at(0), at(500)));
    let dead_listed = history(store, &endpoint, Some(DeliveryStatus::Dead)).await;
    assert_eq!(dead_listed, [s], "listed at its creation");
}

async fn the_latest_entry_wins_in_any_write_order<S: DeliveryStore + ?Sized>(store: &S) {
    let endpoint = unique("ep");
    // Entries at 0 (created), 1 s (a 503, retry at 31 s), 31 s (parked: breaker), 91 s (200),
    // written in four different orders: the same state each time.
    let orders: [[usize; 4]; 4] = [[0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1], [1, 3, 0, 2]];
    for order in orders {
        let event = unique("evt");
        let created = one_endpoint(&event, &endpoint, at(0));
        let mut failed = attempt_row(&event, &endpoint, 1);
        failed.started_at = at(1000);
        failed.status = Some(503);
        failed.error_class = Some(crate::attempt::ErrorClass::HttpStatus);
        failed.outcome = AttemptOutcome::RetryScheduled {
            next_attempt_at: at(31_000),
        };
        let parked_note = note(
            &event,
            &endpoint,
            at(31_000),
            parked(ParkReason::BreakerOpen, at(91_000)),
        );
        let mut ok = attempt_row(&event, &endpoint, 2);
        ok.started_at = at(91_000);
        for i in order {
            match i {
                0 => store.record_event(&created).await.unwrap(),
                1 => store.record_attempt(&failed).await.unwrap(),
                2 => store.record_note(&parked_note).await.unwrap(),
                _ => store.record_attempt(&ok).await.unwrap(),
            }
        }
        let s = state(store, &event, &endpoint).await;
        assert_eq!(s.status, DeliveryStatus::Succeeded, "order {order:?}");
        assert_eq!(s.attempts, 2, "order {order:?}");
        assert_eq!((s.created_at, s.updated_at), (at(0), at(91_000)));
        assert_eq!(s.first_attempt_at, Some(at(1000)));
        assert_eq!(s.last_attempt_at, Some(at(91_000)));
        assert_eq!((s.last_status, s.last_error_class), (Some(200), None));
        assert_eq!(s.scheduled, None);
    }
    let listed = history(store, &endpoint, None).await;
    assert_eq!(listed.len(), orders.len(), "each delivery listed once");
    assert!(listed.iter().all(|s| s.created_at == at(0)));
    // Without the success, the note after the failed attempt sets the state.
    let event = unique("evt");
    let parked_note = note(
        &event,
        &endpoint,
        at(31_000),
        parked(ParkReason::SlowEndpoint, at(45_000)),
    );
    store.record_note(&parked_note).await.unwrap();
    let mut failed = attempt_row(&event, &endpoint, 1);
    failed.started_at = at(1000);
    failed.status = Some(500);
    failed.outcome = AttemptOutcome::RetryScheduled {
        next_attempt_at: at(31_000),
    };
    store.record_attempt(&failed).await.unwrap();
    let s = state(store, &event, &endpoint).await;
    assert_eq!(
        s.scheduled,
        Some(Scheduled {
            reason: ScheduleReason::Parked(ParkReason::SlowEndpoint),
            next_attempt_at: at(45_000),
        })
    );
    assert_eq!((s.attempts, s.last_status), (1, Some(500)));
}

async fn a_creation_after_an_attempt_does_not_override_it<S: DeliveryStore + ?Sized>(store: &S) {
    let (event, endpoint) = (unique("evt"), unique("ep"));
    let mut dead_attempt = attempt_row(&event, &endpoint, 1);
    dead_attempt.started_at = at(2000);
    dead_attempt.status = Some(404);
    dead_attempt.outcome = AttemptOutcome::Dead {
        reason: DeadReason::HttpStatus,
    };
    store.record_attempt(&dead_attempt).await.unwrap();
    // The fan-out's record of the event lands after the attempt, stamped earlier.
    fan_out(store, &event, &endpoint, at(1500)).await;
    let s = state(store, &event, &endpoint).await;
    assert_eq!(s.status, DeliveryStatus::Dead);
    assert_eq!(s.dead_reason, Some(DeadReason::HttpStatus));
    assert_eq!(s.attempts, 1);
    assert_eq!((s.created_at, s.updated_at), (at(1500), at(2000)));
    let listed = history(store, &endpoint, None).await;
    assert_eq!(listed, [s], "listed once, at its creation");
    // Even one stamped after the attempt (clocks disagree) does not make it pending.
    let (event, endpoint) = (unique("evt"), unique("ep"));
    let mut ok = attempt_row(&event, &endpoint, 1);
    ok.started_at = at(1000);
    store.record_attempt(&ok).await.unwrap();
    fan_out(store, &event, &endpoint, at(1200)).await;
    let s = state(store, &event, &endpoint).await;
    assert_eq!(s.status, DeliveryStatus::Succeeded);
    assert_eq!(s.created_at, at(1200));
    assert_eq!(history(store, &endpoint, None).await, [s]);
}

async fn events_and_notes_recorded_twice_are_recorded_once<S: DeliveryStore + ?Sized>(store: &S) {
    let (event, endpoint) = (unique("evt"), unique("ep"));
    let row = one_endpoint(&event, &endpoint, at(0));
    let parked_note = note(
        &event,
        &endpoint,
        at(10),
        parked(ParkReason::LaneFull, at(70)),
    );
    for _ in 0..2 {
        store.record_event(&row).await.unwrap();
        store.record_note(&parked_note).await.unwrap();
    }
    let s = state(store, &event, &endpoint).await;
    assert_eq!(s.status, DeliveryStatus::Scheduled);
    assert_eq!((s.attempts, s.created_at, s.updated_at), (0, at(0), at(10)));
    assert_eq!(
        history(store, &endpoint, None).await,
        std::slice::from_ref(&s)
    );
    assert_eq!(store.event_deliveries(&row.event_id).await.unwrap(), [s]);
    assert_eq!(
        store.event(&acme(), &row.event_id).await.unwrap(),
        Some(row)
    );
}
