//! The customer's view through the store: every delivery in every state, the request as sent,
//! the events list, and ingest answering repeats from the store.

use std::collections::HashMap;
use std::time::UNIX_EPOCH;

use async_trait::async_trait;
use serde_json::value::RawValue;

use super::*;
use crate::dead_reason::DeadReason;
use crate::event_type::EventType;
use crate::id::{DeliveryId, EventId};
use crate::park_reason::ParkReason;
use crate::storage::{
    AttemptRow, DeliveryNote, DeliveryState, DeliveryStatus, EventQuery, EventRow, HistoryQuery,
    NoteKind, Page, ReplayAudit, ReplayMark, StoreError,
};

/// 2027-01-15T08:00:00Z plus `secs`.
fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
}

fn fingerprint_hex(tenant: &str, event_type: &str, payload: &str) -> String {
    crate::input::fingerprint(
        &Tenant::parse(tenant).unwrap(),
        &EventType::parse(event_type).unwrap(),
        &RawValue::from_string(payload.to_owned()).unwrap(),
    )
    .iter()
    .map(|b| format!("{b:02x}"))
    .collect()
}

/// The event `id` of `tenant` as the fan-out records it: type `order.created`, payload
/// `{"n":"<id>"}`, received at [`at`]`(secs)`, fanned out to `endpoints`.
fn event_row(tenant: &str, id: &str, secs: u64, endpoints: &[&str]) -> EventRow {
    let payload = format!(r#"{{"n":"{id}","price":1.50}}"#);
    let body = format!(
        r#"{{"id":"{id}","type":"order.created","timestamp":"2027-01-15T07:00:00Z","data":{payload}}}"#
    );
    EventRow {
        tenant: Tenant::parse(tenant).unwrap(),
        event_id: EventId::parse(id).unwrap(),
        event_type: "order.created".into(),
        occurred_at: at(secs) - Duration::from_secs(3600),
        received_at: at(secs),
        body: body.into_bytes().into(),
        fingerprint: fingerprint_hex(tenant, "order.created", &payload),
        endpoints: endpoints
            .iter()
            .map(|e| EndpointId::parse(*e).unwrap())
            .collect(),
    }
}

fn note(event: &str, endpoint: &str, secs: u64, kind: NoteKind) -> DeliveryNote {
    let event_id = EventId::parse(event).unwrap();
    let endpoint_id = EndpointId::parse(endpoint).unwrap();
    DeliveryNote {
        delivery_id: DeliveryId::derive(&event_id, &endpoint_id),
        event_id,
        endpoint_id,
        tenant: Tenant::parse("acme").unwrap(),
        event_type: "order.created".into(),
        at: at(secs),
        kind,
        replay_id: None,
    }
}

fn attempt(event: &str, endpoint: &str, secs: u64, outcome: AttemptOutcome) -> AttemptRow {
    let mut row = attempt_row(event, endpoint, 1);
    row.started_at = at(secs);
    row.outcome = outcome;
    if !matches!(outcome, AttemptOutcome::Succeeded) {
        row.status = Some(503);
        row.error_class = Some(crate::attempt::ErrorClass::HttpStatus);
    }
    row.request_headers = vec![
        ("content-type".into(), "application/json".into()),
        ("webhook-id".into(), event.into()),
        ("webhook-signature".into(), "v1,c2ln".into()),
    ];
    row
}

async fn get(f: &Fixture, uri: &str, token: &str) -> Answer {
    call(&f.app, Method::GET, uri, token, None).await
}

/// Five acme endpoints, one event fanned out to all of them, and each delivery taken to a
/// different state: (endpoint ids by role, the fixture).
async fn five_states() -> (HashMap<&'static str, String>, Fixture) {
    let f = fixture();
    let mut eps = HashMap::new();
    for role in ["pending", "parked", "dead", "succeeded", "retry"] {
        eps.insert(role, created_id(&f.app, ACME).await);
    }
    let all: Vec<&str> = eps.values().map(String::as_str).collect();
    f.store
        .record_event(&event_row("acme", "evt_1", 1, &all))
        .await
        .unwrap();
    let parked = NoteKind::Parked {
        reason: ParkReason::BreakerOpen,
        next_attempt_at: at(60),
    };
    f.store
        .record_note(&note("evt_1", &eps["parked"], 2, parked))
        .await
        .unwrap();
    let dead = NoteKind::Dead {
        reason: DeadReason::WindowExhausted,
    };
    f.store
        .record_note(&note("evt_1", &eps["dead"], 2, dead))
        .await
        .unwrap();
    f.store
        .record_attempt(&attempt(
            "evt_1",
            &eps["succeeded"],
            3,
            AttemptOutcome::Succeeded,
        ))
        .await
        .unwrap();
    let retry = AttemptOutcome::RetryScheduled {
        next_attempt_at: at(90),
    };
    f.store
        .record_attempt(&attempt("evt_1", &eps["retry"], 4, retry))
        .await
        .unwrap();
    (eps, f)
}

#[tokio::test(start_paused = true)]
async fn every_delivery_shows_in_its_state_with_its_reason() {
    let (eps, f) = five_states().await;
    let a = get(&f, "/v1/events/evt_1/deliveries", ACME).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    let rows: HashMap<String, Value> = a.json["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["endpoint_id"].as_str().unwrap().to_owned(), d.clone()))
        .collect();
    assert_eq!(rows.len(), 5, "{}", a.text);
    let created = "2027-01-15T08:00:01.000Z";
    assert_eq!(
        rows[&eps["pending"]],
        json!({
            "id": delivery_id("evt_1", &eps["pending"]).to_string(),
            "event_id": "evt_1", "endpoint_id": eps["pending"], "tenant": "acme",
            "event_type": "order.created", "state": "pending", "reason": null, "attempts": 0,
            "created_at": created, "updated_at": created, "first_attempt_at": null,
            "last_attempt_at": null, "next_attempt_at": null, "last_status": null,
            "last_error_class": null,
        })
    );
    let parked = &rows[&eps["parked"]];
    assert_eq!(
        (
            &parked["state"],
            &parked["reason"],
            &parked["attempts"],
            &parked["next_attempt_at"],
            &parked["updated_at"]
        ),
        (
            &json!("scheduled"),
            &json!("breaker_open"),
            &json!(0),
            &json!("2027-01-15T08:01:00.000Z"),
            &json!("2027-01-15T08:00:02.000Z")
        )
    );
    let dead = &rows[&eps["dead"]];
    assert_eq!(
        (
            &dead["state"],
            &dead["reason"],
            &dead["attempts"],
            &dead["first_attempt_at"]
        ),
        (
            &json!("dead"),
            &json!("window_exhausted"),
            &json!(0),
            &Value::Null
        )
    );
    let ok = &rows[&eps["succeeded"]];
    assert_eq!(
        (
            &ok["state"],
            &ok["reason"],
            &ok["attempts"],
            &ok["first_attempt_at"],
            &ok["last_attempt_at"],
            &ok["created_at"]
        ),
        (
            &json!("succeeded"),
            &Value::Null,
            &json!(1),
            &json!("2027-01-15T08:00:03.000Z"),
            &json!("2027-01-15T08:00:03.000Z"),
            &json!(created)
        )
    );
    let retry = &rows[&eps["retry"]];
    assert_eq!(
        (
            &retry["state"],
            &retry["reason"],
            &retry["next_attempt_at"],
            &retry["last_status"]
        ),
        (
            &json!("scheduled"),
            &json!("retry"),
            &json!("2027-01-15T08:01:30.000Z"),
            &json!(503)
        )
    );
    // The history filter takes each state; `failed` is read as `scheduled`.
    for (role, state, want) in [
        ("pending", "pending", 1),
        ("pending", "succeeded", 0),
        ("parked", "scheduled", 1),
        ("retry", "failed", 1),
        ("dead", "dead", 1),
        ("succeeded", "succeeded", 1),
        ("succeeded", "dead", 0),
    ] {
        let h = get(
            &f,
            &format!("/v1/endpoints/{}/deliveries?state={state}", eps[role]),
            ACME,
        )
        .await;
        assert_eq!(h.status, StatusCode::OK, "{}", h.text);
        let data = h.json["data"].as_array().unwrap();
        assert_eq!(data.len(), want, "{role} with state={state}: {}", h.text);
        if want == 1 {
            assert_eq!(data[0], rows[&eps[role]]);
        }
    }
    let bad = get(
        &f,
        &format!("/v1/endpoints/{}/deliveries?state=lost", eps["dead"]),
        ACME,
    )
    .await;
    assert_error(&bad, StatusCode::UNPROCESSABLE_ENTITY, "invalid", "state:");
    for s in DeliveryStatus::ALL {
        assert!(bad.text.contains(s.as_str()), "{}", bad.text);
    }
    // Each delivery answers alone, pending and dead-unattempted ones included.
    for role in ["pending", "dead"] {
        let d = get(
            &f,
            &format!("/v1/deliveries/{}", delivery_id("evt_1", &eps[role])),
            ACME,
        )
        .await;
        assert_eq!(d.status, StatusCode::OK, "{}", d.text);
        assert_eq!(d.json["delivery"], rows[&eps[role]]);
        assert_eq!(d.json["attempts"], json!([]));
    }
    // Another tenant sees none of it.
    let foreign = get(&f, "/v1/events/evt_1/deliveries", GLOBEX).await;
    assert_error(&foreign, StatusCode::NOT_FOUND, "not_found", "evt_1");
    let other = get(
        &f,
        &format!("/v1/deliveries/{}", delivery_id("evt_1", &eps["pending"])),
        GLOBEX,
    )
    .await;
    assert_error(&other, StatusCode::NOT_FOUND, "not_found", "delivery");
}

#[tokio::test(start_paused = true)]
async fn a_delivery_shows_the_request_it_sent() {
    let (eps, f) = five_states().await;
    let uri = |role: &str| format!("/v1/deliveries/{}", delivery_id("evt_1", &eps[role]));
    let sent = get(&f, &uri("succeeded"), ACME).await;
    assert_eq!(sent.status, StatusCode::OK, "{}", sent.text);
    assert_eq!(
        sent.json["request"]["headers"],
        json!({"content-type": "application/json", "webhook-id": "evt_1",
               "webhook-signature": "v1,c2ln"})
    );
    // The body as JSON, its bytes kept (`1.50` stays `1.50`).
    assert!(
        sent.text.contains(
            r#""body":{"id":"evt_1","type":"order.created","timestamp":"2027-01-15T07:00:00Z","data":{"n":"evt_1","price":1.50}}"#
        ),
        "{}",
        sent.text
    );
    assert!(sent.json["request"].get("body_base64").is_none());
    assert!(sent.json.get("request_unavailable").is_none());
    // Before any attempt: the body that will be sent, no headers yet.
    let pending = get(&f, &uri("pending"), ACME).await;
    assert_eq!(pending.json["request"]["headers"], json!({}));
    assert_eq!(pending.json["request"]["body"]["data"]["n"], "evt_1");
    // A body that is not UTF-8 comes as base64.
    let mut raw = event_row("acme", "evt_raw", 5, &[&eps["pending"]]);
    raw.body = bytes::Bytes::from_static(b"\xffbin");
    f.store.record_event(&raw).await.unwrap();
    let r = get(
        &f,
        &format!("/v1/deliveries/{}", delivery_id("evt_raw", &eps["pending"])),
        ACME,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        (
            &r.json["request"]["body"],
            &r.json["request"]["body_base64"]
        ),
        (&Value::Null, &json!("/2Jpbg=="))
    );
    // An attempt whose event the store does not hold: said plainly.
    f.store
        .record_attempt(&attempt(
            "evt_gone",
            &eps["pending"],
            6,
            AttemptOutcome::Succeeded,
        ))
        .await
        .unwrap();
    let gone = get(
        &f,
        &format!(
            "/v1/deliveries/{}",
            delivery_id("evt_gone", &eps["pending"])
        ),
        ACME,
    )
    .await;
    assert_eq!(gone.status, StatusCode::OK, "{}", gone.text);
    assert_eq!(gone.json["request"], Value::Null);
    let why = gone.json["request_unavailable"].as_str().unwrap();
    assert!(
        why.contains("no longer holds") && why.contains("store.scylla.attempt_ttl"),
        "{why}"
    );
    assert_eq!(gone.json["delivery"]["state"], "succeeded");
}

/// Pages `GET /v1/events?{query}` as `token`, calling `between` after each page; the ids seen.
async fn page_all(
    f: &Fixture,
    query: &str,
    token: &str,
    mut between: impl AsyncFnMut(usize),
) -> Vec<String> {
    let mut seen = vec![];
    let mut uri = format!("/v1/events?{query}");
    for page in 0.. {
        let p = get(f, &uri, token).await;
        assert_eq!(p.status, StatusCode::OK, "{}", p.text);
        seen.extend(
            p.json["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["id"].as_str().unwrap().to_owned()),
        );
        between(page).await;
        match p.json["next_cursor"].as_str() {
            Some(c) => uri = format!("/v1/events?{query}&cursor={c}"),
            None => {
                assert_eq!(p.json["next_cursor"], Value::Null, "{}", p.text);
                return seen;
            }
        }
    }
    unreachable!()
}

#[tokio::test(start_paused = true)]
async fn the_events_list_pages_newest_first_and_stays_stable() {
    let (eps, f) = five_states().await;
    for i in 2..=7 {
        let row = event_row("acme", &format!("evt_{i}"), 10 * i, &[&eps["pending"]]);
        f.store.record_event(&row).await.unwrap();
    }
    f.store
        .record_event(&event_row("globex", "evt_g", 15, &[]))
        .await
        .unwrap();
    // One event with no subscribed endpoint is listed too.
    f.store
        .record_event(&event_row("acme", "evt_none", 25, &[]))
        .await
        .unwrap();
    // New events arrive between pages: the pages neither repeat nor skip.
    let mut added = 0;
    let seen = page_all(&f, "limit=3", ACME, async |_| {
        added += 1;
        let row = event_row("acme", &format!("evt_new{added}"), 1000 + added, &[]);
        f.store.record_event(&row).await.unwrap();
    })
    .await;
    assert_eq!(
        seen,
        [
            "evt_7", "evt_6", "evt_5", "evt_4", "evt_3", "evt_none", "evt_2", "evt_1"
        ]
    );
    // One event in full: payload (the body's data) and its deliveries by state.
    let first = get(&f, "/v1/events?limit=500&since=2027-01-15T08:00:00Z", ACME).await;
    let evt_1 = first.json["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == "evt_1")
        .unwrap()
        .clone();
    assert_eq!(
        evt_1,
        json!({"id": "evt_1", "type": "order.created",
               "occurred_at": "2027-01-15T07:00:01.000Z",
               "received_at": "2027-01-15T08:00:01.000Z",
               "payload": {"n": "evt_1", "price": 1.50},
               "deliveries": {"pending": 1, "scheduled": 2, "succeeded": 1, "dead": 1}})
    );
    assert!(
        first
            .text
            .contains(r#""payload":{"n":"evt_1","price":1.50}"#)
    );
    // Filters: a window of receipt, a type.
    let window = page_all(
        &f,
        "since=2027-01-15T08:00:30Z&until=2027-01-15T08:01:00Z",
        ACME,
        async |_| {},
    )
    .await;
    assert_eq!(window, ["evt_5", "evt_4", "evt_3"]);
    let other_type = get(&f, "/v1/events?type=order.deleted", ACME).await;
    assert_eq!(other_type.json["data"], json!([]), "{}", other_type.text);
    // An operator names the tenant; a tenant token may name its own.
    let op = page_all(&f, "tenant=globex", OP, async |_| {}).await;
    assert_eq!(op, ["evt_g"]);
    assert_eq!(
        get(&f, "/v1/events?tenant=acme&limit=1", ACME).await.status,
        StatusCode::OK
    );
}

#[tokio::test(start_paused = true)]
async fn the_events_list_scopes_by_tenant_and_names_bad_parameters() {
    let f = fixture();
    f.store
        .record_event(&event_row("acme", "evt_1", 1, &[]))
        .await
        .unwrap();
    let no_token = send(&f.app, request(Method::GET, "/v1/events", None, None)).await;
    assert_error(
        &no_token,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "bearer token",
    );
    let foreign = get(&f, "/v1/events?tenant=acme", GLOBEX).await;
    assert_error(&foreign, StatusCode::NOT_FOUND, "not_found", "tenant");
    let own = get(&f, "/v1/events", GLOBEX).await;
    assert_eq!(own.json["data"], json!([]), "{}", own.text);
    let op = get(&f, "/v1/events", OP).await;
    assert_error(&op, StatusCode::UNPROCESSABLE_ENTITY, "invalid", "tenant:");
    for (q, needle) in [
        ("tenant=", "tenant:"),
        ("type=", "type:"),
        ("since=monday", "since:"),
        ("until=2027-13-01T00:00:00Z", "until:"),
        (
            "since=2027-01-15T08:00:00Z&until=2027-01-15T08:00:00Z",
            "until:",
        ),
        ("limit=0", "limit:"),
        ("limit=501", "limit:"),
        ("cursor=", "cursor:"),
        ("cursor=garbage", "cursor:"),
        ("state=dead", "state"),
    ] {
        let a = get(&f, &format!("/v1/events?{q}"), ACME).await;
        assert_error(&a, StatusCode::UNPROCESSABLE_ENTITY, "invalid", needle);
    }
}

/// `POST /v1/events` of event `evt_s` for `tenant` with `payload` as raw JSON (its bytes are
/// what the fingerprint covers), to `app`.
async fn post(app: &Router, token: &str, tenant: &str, payload: &str) -> Answer {
    let body = format!(
        r#"{{"tenant":"{tenant}","type":"order.created","id":"evt_s","payload":{payload}}}"#
    );
    call(app, Method::POST, "/v1/events", token, Some(&body)).await
}

#[tokio::test(start_paused = true)]
async fn ingest_answers_a_repeat_the_store_holds_like_the_first() {
    let f = fixture();
    // What another instance (or this one before a restart) took and fanned out.
    let mut first = event_row("acme", "evt_s", 0, &[]);
    first.received_at = SystemTime::now() - Duration::from_secs(3600);
    f.store.record_event(&first).await.unwrap();
    let same = r#"{"n":"evt_s","price":1.50}"#;
    let other = r#"{"n":"evt_s","price":2}"#;
    let a = post(&f.app, ACME, "acme", other).await;
    assert_error(&a, StatusCode::CONFLICT, "conflict", "evt_s");
    // The refused payload does not take the id over: the stored one answers 202, as the
    // first did, and is not published again.
    for _ in 0..2 {
        let b = post(&f.app, ACME, "acme", same).await;
        assert_eq!(
            (b.status, &b.json),
            (StatusCode::ACCEPTED, &json!({"id": "evt_s"})),
            "{}",
            b.text
        );
    }
    assert!(
        f.sink.events().is_empty(),
        "a repeat is not published again"
    );
    let c = post(&f.app, ACME, "acme", other).await;
    assert_error(&c, StatusCode::CONFLICT, "conflict", "evt_s");
    // Another tenant's event with the same id is another event.
    let g = post(&f.app, GLOBEX, "globex", same).await;
    assert_eq!(g.status, StatusCode::ACCEPTED, "{}", g.text);
    assert_eq!(f.sink.events().len(), 1);
    // Past the window the id is free again.
    let short = router(f.state.clone().with_dedupe_window(Duration::from_secs(60)));
    let late = post(&short, ACME, "acme", other).await;
    assert_eq!(late.status, StatusCode::ACCEPTED, "{}", late.text);
    assert_eq!(f.sink.events().len(), 2);
}

/// A memory store whose `event` reads fail as an unreachable store's do.
struct EventsUnreachable(MemoryStore);

#[async_trait]
impl DeliveryStore for EventsUnreachable {
    async fn record_attempt(&self, row: &AttemptRow) -> Result<(), StoreError> {
        self.0.record_attempt(row).await
    }
    async fn record_note(&self, note: &DeliveryNote) -> Result<(), StoreError> {
        self.0.record_note(note).await
    }
    async fn record_event(&self, event: &EventRow) -> Result<(), StoreError> {
        self.0.record_event(event).await
    }
    async fn event(&self, _: &Tenant, _: &EventId) -> Result<Option<EventRow>, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn events(&self, t: &Tenant, q: &EventQuery) -> Result<Page<EventRow>, StoreError> {
        self.0.events(t, q).await
    }
    async fn delivery(&self, id: &DeliveryId) -> Result<Option<DeliveryState>, StoreError> {
        self.0.delivery(id).await
    }
    async fn attempts(&self, id: &DeliveryId) -> Result<Vec<AttemptRow>, StoreError> {
        self.0.attempts(id).await
    }
    async fn endpoint_deliveries(
        &self,
        e: &EndpointId,
        q: &HistoryQuery,
    ) -> Result<Page<DeliveryState>, StoreError> {
        self.0.endpoint_deliveries(e, q).await
    }
    async fn event_deliveries(&self, e: &EventId) -> Result<Vec<DeliveryState>, StoreError> {
        self.0.event_deliveries(e).await
    }
    async fn record_replay(&self, a: &ReplayAudit) -> Result<(), StoreError> {
        self.0.record_replay(a).await
    }
    async fn replays(&self, t: Option<&Tenant>, n: u32) -> Result<Vec<ReplayAudit>, StoreError> {
        self.0.replays(t, n).await
    }
    async fn record_replay_mark(&self, m: &ReplayMark) -> Result<(), StoreError> {
        self.0.record_replay_mark(m).await
    }
    async fn replay_mark(&self, id: &DeliveryId) -> Result<Option<ReplayMark>, StoreError> {
        self.0.replay_mark(id).await
    }
    async fn replay_claim(&self, id: &DeliveryId) -> Result<Option<ReplayMark>, StoreError> {
        self.0.replay_claim(id).await
    }
    async fn claim_replay(&self, c: &ReplayMark, over: Option<&str>) -> Result<bool, StoreError> {
        self.0.claim_replay(c, over).await
    }
}

#[tokio::test(start_paused = true)]
async fn ingest_is_503_when_the_store_cannot_say_whether_an_id_is_taken() {
    let f = fixture();
    let mut state = f.state.clone();
    state.deliveries = Arc::new(EventsUnreachable(MemoryStore::default()));
    let app = router(state);
    let a = post(&app, ACME, "acme", "1").await;
    assert_error(
        &a,
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "retry with the same id",
    );
    assert!(f.sink.events().is_empty());
    assert!(!a.text.contains("connection refused"), "{}", a.text);
}
