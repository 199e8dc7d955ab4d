//! Router tests on in-memory stores: every route and error path, through `oneshot`.

/// Deliveries in every state, the request as sent, the events list, ingest repeats.
mod reads;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use futures::future::BoxFuture;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tokio::sync::watch;
use tower::ServiceExt;

use super::events::{Claim, EventSink, MemoryEventSink, NativeEvent, RecentIds, SinkError};
use super::*;
use crate::config::Token;
use crate::endpoint::Endpoint;
use crate::id::{EndpointId, Tenant};
use crate::listen::listen;
use crate::registry::{EndpointView, MemoryEndpointStore, RegistryError};
use crate::sealed::MasterKey;
use crate::ssrf::Policy;
use crate::storage::conformance::attempt_row;
use crate::storage::memory::MemoryStore;
use crate::storage::{AttemptOutcome, DeliveryStore};

const OP: &str = "op-token-0123456789abcdef";
const ACME: &str = "acme-token-0123456789abcdef";
const GLOBEX: &str = "globex-token-0123456789abcdef";

struct Fixture {
    app: Router,
    endpoints: Arc<MemoryEndpointStore>,
    store: Arc<MemoryStore>,
    sink: Arc<MemoryEventSink>,
    kafka: watch::Sender<bool>,
    state: AdminState,
}

fn auth() -> AdminConfig {
    AdminConfig {
        operator_tokens: vec![Token::new(OP)],
        tenant_tokens: BTreeMap::from([
            (Token::new(ACME), Tenant::parse("acme").unwrap()),
            (Token::new(GLOBEX), Tenant::parse("globex").unwrap()),
        ]),
        ..AdminConfig::default()
    }
}

fn fixture_with(sink: Arc<dyn EventSink>, mem_sink: Arc<MemoryEventSink>) -> Fixture {
    let endpoints = Arc::new(MemoryEndpointStore::new(MasterKey::generate()));
    let store = Arc::new(MemoryStore::default());
    let (kafka, kafka_rx) = watch::channel(true);
    let state = AdminState::new(endpoints.clone(), store.clone(), sink, auth(), kafka_rx)
        .with_max_payload_bytes(1024);
    Fixture {
        app: router(state.clone()),
        endpoints,
        store,
        sink: mem_sink,
        kafka,
        state,
    }
}

fn fixture() -> Fixture {
    let sink = Arc::new(MemoryEventSink::default());
    fixture_with(sink.clone(), sink)
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    text: String,
    json: Value,
}

async fn send(app: &Router, req: Request<Body>) -> Answer {
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let headers = res.headers().clone();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Answer {
        status,
        headers,
        text,
        json,
    }
}

fn request(method: Method, uri: &str, token: Option<&str>, body: Option<&str>) -> Request<Body> {
    let mut b = Request::builder().method(method).uri(uri);
    if let Some(t) = token {
        b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    match body {
        Some(s) => b
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(s.to_owned()))
            .unwrap(),
        None => b.body(Body::empty()).unwrap(),
    }
}

async fn call(app: &Router, method: Method, uri: &str, token: &str, body: Option<&str>) -> Answer {
    send(app, request(method, uri, Some(token), body)).await
}

/// Asserts an error answer: status, code, and that the detail mentions `needle`.
fn assert_error(a: &Answer, status: StatusCode, code: &str, needle: &str) {
    assert_eq!(a.status, status, "{}", a.text);
    assert_eq!(a.json["code"], code, "{}", a.text);
    let detail = a.json["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains(needle),
        "detail {detail:?} lacks {needle:?}"
    );
}

async fn create(app: &Router, token: &str, body: Value) -> Answer {
    call(
        app,
        Method::POST,
        "/v1/endpoints",
        token,
        Some(&body.to_string()),
    )
    .await
}

/// Creates [`acme_endpoint`] as `token` and returns its id.
async fn created_id(app: &Router, token: &str) -> String {
    let a = create(app, token, acme_endpoint()).await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text);
    a.json["id"].as_str().unwrap().to_owned()
}

fn acme_endpoint() -> Value {
    json!({"tenant": "acme", "url": "https://example.com/hook", "event_types": ["order.*"]})
}

#[tokio::test(start_paused = true)]
async fn tokens_are_required_and_checked() {
    let f = fixture();
    for req in [
        request(Method::GET, "/v1/endpoints", None, None),
        request(
            Method::GET,
            "/v1/endpoints",
            Some("wrong-token-0123456789"),
            None,
        ),
        request(Method::POST, "/v1/events", None, Some("{not json")),
        request(Method::GET, "/v1/deliveries/dlv_x", Some(""), None),
    ] {
        let a = send(&f.app, req).await;
        assert_error(&a, StatusCode::UNAUTHORIZED, "unauthorized", "bearer token");
        assert_eq!(a.headers[header::WWW_AUTHENTICATE], "Bearer");
    }
    // Another scheme carrying a valid token is still refused.
    let basic = Request::builder()
        .uri("/v1/endpoints")
        .header(header::AUTHORIZATION, format!("Basic {OP}"))
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&f.app, basic).await.status, StatusCode::UNAUTHORIZED);
    // The scheme is case-insensitive.
    let lower = Request::builder()
        .uri("/v1/endpoints")
        .header(header::AUTHORIZATION, format!("bearer {OP}"))
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&f.app, lower).await.status, StatusCode::OK);
    // Health needs no token; unknown routes are a JSON 404.
    let h = send(&f.app, request(Method::GET, "/v1/health", None, None)).await;
    assert_eq!(
        (h.status, h.json["status"].as_str()),
        (StatusCode::OK, Some("ok"))
    );
    let nf = send(&f.app, request(Method::GET, "/v2/nothing", None, None)).await;
    assert_error(&nf, StatusCode::NOT_FOUND, "not_found", "no such route");
    let m = send(
        &f.app,
        request(Method::PUT, "/v1/events", Some(OP), Some("{}")),
    )
    .await;
    assert_error(
        &m,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method",
    );
}

#[tokio::test(start_paused = true)]
async fn endpoint_lifecycle_shows_secrets_only_at_creation_and_rotation() {
    let f = fixture();
    let a = create(
        &f.app,
        ACME,
        json!({"url": "https://example.com/hook", "event_types": ["order.*"], "max_in_flight": 4}),
    )
    .await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text);
    let id = a.json["id"].as_str().unwrap().to_owned();
    let secret = a.json["secret"].as_str().unwrap().to_owned();
    assert!(id.starts_with("ep_") && secret.starts_with("whsec_"));
    assert_eq!(
        a.json["tenant"], "acme",
        "a tenant token's tenant is the default"
    );
    assert_eq!(a.json["max_in_flight"], 4);
    assert_eq!(a.json["enabled"], true);
    assert_eq!(a.json["disabled_reason"], Value::Null);
    assert_eq!(a.json["version"], 1);
    let first_key = a.json["secrets"][0]["key_id"].as_str().unwrap().to_owned();
    assert!(first_key.starts_with("k_"));
    let b64 = secret.trim_start_matches("whsec_").to_owned();

    // GET: same data, no secret material.
    let g = call(
        &f.app,
        Method::GET,
        &format!("/v1/endpoints/{id}"),
        ACME,
        None,
    )
    .await;
    assert_eq!(g.status, StatusCode::OK);
    assert_eq!(g.json["url"], "https://example.com/hook");
    assert_eq!(g.json["secrets"][0]["key_id"], first_key.as_str());
    assert_eq!(g.json["secrets"][0]["active"], true);
    assert!(g.json.get("secret").is_none());
    assert!(!g.text.contains(&b64), "GET leaks the secret");
    // Nor does the state's Debug, nor the list.
    assert!(!format!("{:?}", f.state).contains(&b64));
    let l = call(&f.app, Method::GET, "/v1/endpoints", ACME, None).await;
    assert_eq!(l.json["data"].as_array().unwrap().len(), 1);
    assert!(!l.text.contains(&b64));

    // PATCH: disable, then re-enable after a 410-style disable.
    let p = call(
        &f.app,
        Method::PATCH,
        &format!("/v1/endpoints/{id}"),
        ACME,
        Some(r#"{"enabled":false,"rate_limit_per_s":2.5}"#),
    )
    .await;
    assert_eq!(p.status, StatusCode::OK, "{}", p.text);
    assert_eq!(p.json["enabled"], false);
    assert_eq!(p.json["disabled_reason"], "manual");
    assert_eq!(p.json["rate_limit_per_s"], 2.5);
    assert_eq!(p.json["version"], 2);
    let mut gone = (*f
        .endpoints
        .view()
        .get(&EndpointId::parse(&id).unwrap())
        .unwrap())
    .clone();
    gone.disable(crate::endpoint::DISABLED_GONE, SystemTime::now());
    f.endpoints.put(&gone).await.unwrap();
    let g = call(
        &f.app,
        Method::GET,
        &format!("/v1/endpoints/{id}"),
        OP,
        None,
    )
    .await;
    assert_eq!(g.json["disabled_reason"], "gone");
    let p = call(
        &f.app,
        Method::PATCH,
        &format!("/v1/endpoints/{id}"),
        ACME,
        Some(r#"{"enabled":true,"rate_limit_per_s":null}"#),
    )
    .await;
    assert_eq!(p.json["enabled"], true);
    assert_eq!(p.json["disabled_reason"], Value::Null);
    assert_eq!(p.json["rate_limit_per_s"], Value::Null);

    // Rotate with an empty body: the new secret once, the old one expiring in 24 h.
    let r = call(
        &f.app,
        Method::POST,
        &format!("/v1/endpoints/{id}/secrets"),
        ACME,
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let new_secret = r.json["secret"].as_str().unwrap().to_owned();
    assert!(new_secret.starts_with("whsec_") && new_secret != secret);
    let secrets = r.json["secrets"].as_array().unwrap();
    assert_eq!(secrets.len(), 2);
    assert_eq!(secrets[0]["key_id"], first_key.as_str());
    assert!(secrets[0]["expires_at"].is_string());
    assert_eq!(secrets[1]["key_id"], r.json["key_id"]);
    assert_eq!(secrets[1]["expires_at"], Value::Null);
    // Rotate with the caller's expiry and secret.
    let given = format!(
        "whsec_{}",
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [9u8; 32])
    );
    let r2 = call(
        &f.app,
        Method::POST,
        &format!("/v1/endpoints/{id}/secrets"),
        ACME,
        Some(&json!({"secret": given, "old_expires_in": "1h"}).to_string()),
    )
    .await;
    assert_eq!(r2.status, StatusCode::CREATED, "{}", r2.text);
    assert_eq!(r2.json["secret"], given.as_str());
    let g = call(
        &f.app,
        Method::GET,
        &format!("/v1/endpoints/{id}"),
        ACME,
        None,
    )
    .await;
    assert!(!g.text.contains(new_secret.trim_start_matches("whsec_")));
    assert!(!g.text.contains(given.trim_start_matches("whsec_")));
    let bad = call(
        &f.app,
        Method::POST,
        &format!("/v1/endpoints/{id}/secrets"),
        ACME,
        Some(r#"{"old_expires_in":"1h","old_expires_at":"2030-01-01T00:00:00Z"}"#),
    )
    .await;
    assert_error(
        &bad,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid",
        "old_expires_in",
    );
    // Expiries out of bounds are refused with the field named, and change nothing: one far
    // beyond any date a record can hold must not take the request down with no answer.
    let (uri, rotate) = (
        format!("/v1/endpoints/{id}"),
        format!("/v1/endpoints/{id}/secrets"),
    );
    let before = call(&f.app, Method::GET, &uri, ACME, None).await;
    for (body, field) in [
        (
            r#"{"old_expires_in":"10000years"}"#,
            "old_expires_in: must be at most 30days",
        ),
        (
            r#"{"old_expires_in":"300000000000years"}"#,
            "old_expires_in: must be at most",
        ),
        (
            r#"{"old_expires_in":"31days"}"#,
            "old_expires_in: must be at most",
        ),
        (
            r#"{"old_expires_at":"9999-12-31T23:59:59Z"}"#,
            "old_expires_at: must be at most",
        ),
        (
            r#"{"old_expires_at":"2001-01-01T00:00:00Z"}"#,
            "old_expires_at: is in the past",
        ),
    ] {
        let r = call(&f.app, Method::POST, &rotate, ACME, Some(body)).await;
        assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid", field);
    }
    let after = call(&f.app, Method::GET, &uri, ACME, None).await;
    assert_eq!(
        before.json, after.json,
        "a refused rotation changes nothing"
    );
    // "0s" retires the previous secrets at once.
    let now = call(
        &f.app,
        Method::POST,
        &rotate,
        ACME,
        Some(r#"{"old_expires_in":"0s"}"#),
    )
    .await;
    assert_eq!(now.status, StatusCode::CREATED, "{}", now.text);
    assert_eq!(now.json["secrets"].as_array().unwrap().len(), 1);

    // A rate limit outside what the delivery stage applies is refused, not silently clamped.
    for rate in ["1e-300", "0.0001", "1e300", "0", "-1"] {
        let body = format!(r#"{{"rate_limit_per_s":{rate}}}"#);
        let r = call(&f.app, Method::PATCH, &uri, ACME, Some(&body)).await;
        let detail = "rate_limit_per_s: must be between 0.001 and 1000000";
        assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid", detail);
    }

    // DELETE, then it is gone.
    let d = call(
        &f.app,
        Method::DELETE,
        &format!("/v1/endpoints/{id}"),
        ACME,
        None,
    )
    .await;
    assert_eq!(d.status, StatusCode::NO_CONTENT);
    let g = call(
        &f.app,
        Method::GET,
        &format!("/v1/endpoints/{id}"),
        ACME,
        None,
    )
    .await;
    assert_error(&g, StatusCode::NOT_FOUND, "not_found", &id);
}

#[tokio::test(start_paused = true)]
async fn endpoint_validation_names_the_field() {
    let f = fixture();
    let cases: Vec<(Value, StatusCode, &str, &str)> = vec![
        (
            json!({"tenant": "acme", "url": "ftp://example.com", "event_types": ["a"]}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "url: must be http or https",
        ),
        (
            json!({"tenant": "acme", "url": "https://u:p@example.com", "event_types": ["a"]}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "url:",
        ),
        (
            json!({"tenant": "acme", "url": "https://example.com", "event_types": ["a*"]}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "event_types[0]:",
        ),
        (
            json!({"tenant": "acme", "url": "https://example.com", "event_types": ["a", "b..c"]}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "event_types[1]:",
        ),
        (
            json!({"tenant": "acme", "url": "https://example.com", "event_types": []}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "event_types: must not be empty",
        ),
        (
            json!({"tenant": "", "url": "https://example.com", "event_types": ["a"]}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "tenant: must not be empty",
        ),
        (
            json!({"url": "https://example.com", "event_types": ["a"]}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "missing field `tenant`",
        ),
        (
            json!({"tenant": "acme", "url": "https://example.com", "event_types": ["a"], "urls": 1}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "unknown field `urls`",
        ),
        (
            json!({"tenant": "acme", "url": "https://example.com", "event_types": ["a"], "max_in_flight": 0}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "max_in_flight:",
        ),
        (
            json!({"tenant": "acme", "url": "https://example.com", "event_types": ["a"], "max_in_flight": "x"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "max_in_flight: invalid type",
        ),
        (
            json!({"tenant": "acme", "url": "https://example.com", "event_types": ["a"], "secret": "nope"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "secret: must start with whsec_",
        ),
        (
            json!(["not", "an", "object"]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "body:",
        ),
    ];
    for (body, status, code, needle) in cases {
        let a = create(&f.app, OP, body.clone()).await;
        assert_error(&a, status, code, needle);
        assert!(
            !a.text.contains("nope"),
            "errors never echo a secret: {}",
            a.text
        );
    }
    let a = call(
        &f.app,
        Method::POST,
        "/v1/endpoints",
        OP,
        Some("{\"tenant\": "),
    )
    .await;
    assert_error(&a, StatusCode::BAD_REQUEST, "bad_request", "not valid JSON");
    let text = Request::builder()
        .method(Method::POST)
        .uri("/v1/endpoints")
        .header(header::AUTHORIZATION, format!("Bearer {OP}"))
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Body::from(acme_endpoint().to_string()))
        .unwrap();
    assert_error(
        &send(&f.app, text).await,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
        "application/json",
    );
    // PATCH validates too, and changes nothing when invalid.
    let id = created_id(&f.app, OP).await;
    let uri = format!("/v1/endpoints/{id}");
    assert_error(
        &call(
            &f.app,
            Method::PATCH,
            &uri,
            OP,
            Some(r#"{"url":"gopher://x"}"#),
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid",
        "url:",
    );
    assert_error(
        &call(
            &f.app,
            Method::PATCH,
            &uri,
            OP,
            Some(r#"{"event_types":["*.a"]}"#),
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid",
        "event_types[0]:",
    );
    assert_error(
        &call(
            &f.app,
            Method::PATCH,
            &uri,
            OP,
            Some(r#"{"tenant":"globex"}"#),
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid",
        "unknown field `tenant`",
    );
    let g = call(&f.app, Method::GET, &uri, OP, None).await;
    assert_eq!(g.json["version"], 1);
    // Bad list parameters.
    assert_error(
        &call(&f.app, Method::GET, "/v1/endpoints?limit=0", OP, None).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid",
        "limit:",
    );
    // A cursor is an endpoint id this API gave out; anything else would silently restart (or
    // end) the listing.
    for cursor in ["a%20b", "bad", "zzz", "ep_a"] {
        assert_error(
            &call(
                &f.app,
                Method::GET,
                &format!("/v1/endpoints?cursor={cursor}"),
                OP,
                None,
            )
            .await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "cursor: is not a cursor returned by this API",
        );
    }
    assert_error(
        &call(&f.app, Method::GET, "/v1/endpoints?tenat=acme", OP, None).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid",
        "tenat: unknown field `tenat`",
    );
    assert_error(
        &call(
            &f.app,
            Method::GET,
            "/v1/endpoints?limit=1&limit=2",
            OP,
            None,
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid",
        "duplicate field `limit`",
    );
}

#[tokio::test(start_paused = true)]
async fn tenants_see_only_their_own_endpoints() {
    let f = fixture();
    let acme = created_id(&f.app, ACME).await;
    let globex = create(
        &f.app,
        GLOBEX,
        json!({"url": "https://globex.example/h", "event_types": ["*"]}),
    )
    .await;
    assert_eq!(globex.json["tenant"], "globex");
    // Writing for another tenant: 403.
    let w = create(&f.app, GLOBEX, acme_endpoint()).await;
    assert_error(&w, StatusCode::FORBIDDEN, "forbidden", "own tenant");
    // Reads and writes of another tenant's endpoint: 404, exactly as for a missing one.
    let missing = format!("/v1/endpoints/{}", EndpointId::generate());
    for (method, suffix, body) in [
        (Method::GET, "", None),
        (Method::PATCH, "", Some("{}")),
        (Method::DELETE, "", None),
        (Method::POST, "/secrets", None),
        (Method::GET, "/deliveries", None),
    ] {
        let foreign = call(
            &f.app,
            method.clone(),
            &format!("/v1/endpoints/{acme}{suffix}"),
            GLOBEX,
            body,
        )
        .await;
        let absent = call(
            &f.app,
            method.clone(),
            &format!("{missing}{suffix}"),
            GLOBEX,
            body,
        )
        .await;
        assert_eq!(
            foreign.status,
            StatusCode::NOT_FOUND,
            "{method} {suffix}: {}",
            foreign.text
        );
        assert_eq!(foreign.json["code"], absent.json["code"]);
    }
    assert!(
        f.endpoints
            .view()
            .get(&EndpointId::parse(&acme).unwrap())
            .is_some(),
        "untouched"
    );
    // Lists: own tenant by default; another tenant is 404; operators see all or one.
    let l = call(&f.app, Method::GET, "/v1/endpoints", GLOBEX, None).await;
    assert_eq!(l.json["data"].as_array().unwrap().len(), 1);
    assert_eq!(l.json["data"][0]["tenant"], "globex");
    assert_eq!(
        call(
            &f.app,
            Method::GET,
            "/v1/endpoints?tenant=acme",
            GLOBEX,
            None
        )
        .await
        .status,
        StatusCode::NOT_FOUND
    );
    let all = call(&f.app, Method::GET, "/v1/endpoints", OP, None).await;
    assert_eq!(all.json["data"].as_array().unwrap().len(), 2);
    let one = call(&f.app, Method::GET, "/v1/endpoints?tenant=acme", OP, None).await;
    assert_eq!(one.json["data"][0]["id"], acme.as_str());
    // The operator may act on anyone's endpoint.
    assert_eq!(
        call(
            &f.app,
            Method::GET,
            &format!("/v1/endpoints/{acme}"),
            OP,
            None
        )
        .await
        .status,
        StatusCode::OK
    );
}

#[tokio::test(start_paused = true)]
async fn endpoint_list_pages_by_id() {
    let f = fixture();
    let mut ids = vec![];
    for _ in 0..5 {
        ids.push(created_id(&f.app, OP).await);
    }
    let mut seen = vec![];
    let mut uri = "/v1/endpoints?tenant=acme&limit=2".to_owned();
    loop {
        let p = call(&f.app, Method::GET, &uri, OP, None).await;
        assert_eq!(p.status, StatusCode::OK, "{}", p.text);
        seen.extend(
            p.json["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["id"].as_str().unwrap().to_owned()),
        );
        match p.json["next_cursor"].as_str() {
            Some(c) => uri = format!("/v1/endpoints?tenant=acme&limit=2&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(seen, ids);
}

#[tokio::test(start_paused = true)]
async fn ingest_is_idempotent_and_keeps_payload_bytes() {
    let f = fixture();
    let body = r#"{"id":"evt_1","tenant":"acme","type":"order.created","payload": {"b": 2,  "a":[1, 2.50]}}"#;
    for _ in 0..2 {
        let a = call(&f.app, Method::POST, "/v1/events", OP, Some(body)).await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.text);
        assert_eq!(a.json, json!({"id": "evt_1"}));
    }
    let events = f.sink.events();
    assert_eq!(events.len(), 1, "the same id twice is one event");
    assert_eq!(events[0].payload.get(), r#"{"b": 2,  "a":[1, 2.50]}"#);
    // The envelope is what the fan-out's parser accepts, bytes intact.
    let envelope = events[0].to_envelope();
    let rec = crate::input::InputRecord {
        topic: "hookline.events",
        partition: 0,
        offset: 0,
        timestamp: None,
        key: Some(b"evt_1"),
        headers: &[],
        payload: Some(&envelope),
    };
    let parsed = crate::input::parse(
        &crate::input::InputConfig::default(),
        &rec,
        SystemTime::UNIX_EPOCH,
    )
    .unwrap();
    assert_eq!(parsed.id.as_str(), "evt_1");
    assert_eq!(parsed.tenant.as_str(), "acme");
    assert_eq!(parsed.event_type.as_str(), "order.created");
    assert_eq!(parsed.occurred_at, events[0].occurred_at);
    assert_eq!(parsed.payload.get(), events[0].payload.get());
    // Same id, different payload: a different event under a reused id.
    let other = r#"{"id":"evt_1","tenant":"acme","type":"order.created","payload":{"b":3}}"#;
    assert_error(
        &call(&f.app, Method::POST, "/v1/events", OP, Some(other)).await,
        StatusCode::CONFLICT,
        "conflict",
        "evt_1",
    );
    // The same id under another tenant is another event.
    let globex = r#"{"id":"evt_1","type":"order.created","payload":null}"#;
    assert_eq!(
        call(&f.app, Method::POST, "/v1/events", GLOBEX, Some(globex))
            .await
            .status,
        StatusCode::ACCEPTED
    );
    // No id: one is generated; occurred_at is kept to the millisecond.
    let a = call(
        &f.app,
        Method::POST,
        "/v1/events",
        ACME,
        Some(r#"{"type":"x","occurred_at":"2026-03-01T12:00:00.250+01:00","payload":1}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.text);
    assert!(a.json["id"].as_str().unwrap().starts_with("msg_"));
    let events = f.sink.events();
    assert_eq!(events.len(), 3);
    assert_eq!(events[1].payload.get(), "null");
    assert_eq!(events[2].tenant.as_str(), "acme");
    assert!(
        String::from_utf8(events[2].to_envelope())
            .unwrap()
            .contains("\"occurred_at\":\"2026-03-01T11:00:00.250Z\"")
    );
}

#[tokio::test(start_paused = true)]
async fn ingest_validation_names_the_field() {
    let f = fixture();
    let cases = [
        (
            r#"{"tenant":"","type":"a","payload":1}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "tenant:",
        ),
        (
            r#"{"type":"a","payload":1}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "tenant: is required",
        ),
        (
            r#"{"tenant":"acme","type":"","payload":1}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "type: event type must not be empty",
        ),
        (
            r#"{"tenant":"acme","type":"a b","payload":1}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "type:",
        ),
        (
            r#"{"tenant":"acme","payload":1}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "type: is required",
        ),
        (
            r#"{"tenant":"acme","type":"a"}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "payload: is required",
        ),
        (
            r#"{"tenant":"acme","type":"a","payload":1,"id":""}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "id:",
        ),
        (
            r#"{"tenant":"acme","type":"a","payload":1,"occurred_at":"yesterday"}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "occurred_at:",
        ),
        (
            r#"{"tenant":"acme","type":"a","payload":1,"extra":true}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "unknown field `extra`",
        ),
        (
            r#"{"tenant":"acme","type":7,"payload":1}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "type: invalid type",
        ),
        (
            r#"{"tenant":"acme","type":"a","payload":"#,
            StatusCode::BAD_REQUEST,
            "bad_request",
            "not valid JSON",
        ),
        (
            r#"{"tenant":"acme","type":"a","payload":1} trailing"#,
            StatusCode::BAD_REQUEST,
            "bad_request",
            "not valid JSON",
        ),
        ("", StatusCode::BAD_REQUEST, "bad_request", "not valid JSON"),
    ];
    for (body, status, code, needle) in cases {
        assert_error(
            &call(&f.app, Method::POST, "/v1/events", OP, Some(body)).await,
            status,
            code,
            needle,
        );
    }
    // A tenant token posting for another tenant: 403.
    let a = call(
        &f.app,
        Method::POST,
        "/v1/events",
        ACME,
        Some(r#"{"tenant":"globex","type":"a","payload":1}"#),
    )
    .await;
    assert_error(&a, StatusCode::FORBIDDEN, "forbidden", "tenant");
    // Payload limit (1024 in the fixture): the payload itself, then the whole body.
    let big = format!(
        r#"{{"tenant":"acme","type":"a","payload":"{}"}}"#,
        "x".repeat(1100)
    );
    assert_error(
        &call(&f.app, Method::POST, "/v1/events", OP, Some(&big)).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        "payload: is 1102 bytes",
    );
    let huge = format!(
        r#"{{"tenant":"acme","type":"a","payload":"{}"}}"#,
        "x".repeat(40_000)
    );
    assert_error(
        &call(&f.app, Method::POST, "/v1/events", OP, Some(&huge)).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        "the request body is over 17408 bytes, the most this server accepts (an event's payload \
         may have up to 1024 bytes: http.max_payload_bytes)",
    );
    assert!(f.sink.events().is_empty());
}

#[tokio::test(start_paused = true)]
async fn ingest_when_kafka_is_down_is_503_and_a_retry_publishes() {
    let f = fixture();
    let body = r#"{"id":"evt_retry","tenant":"acme","type":"a","payload":{}}"#;
    f.sink.set_available(false);
    let a = call(&f.app, Method::POST, "/v1/events", OP, Some(body)).await;
    assert_error(
        &a,
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "retry with the same id",
    );
    assert!(!a.text.contains("memory sink"), "internals stay in the log");
    f.sink.set_available(true);
    assert_eq!(
        call(&f.app, Method::POST, "/v1/events", OP, Some(body))
            .await
            .status,
        StatusCode::ACCEPTED
    );
    assert_eq!(
        call(&f.app, Method::POST, "/v1/events", OP, Some(body))
            .await
            .status,
        StatusCode::ACCEPTED
    );
    assert_eq!(f.sink.events().len(), 1);
}

/// A sink that takes a second per publish and counts them.
struct SlowSink(AtomicUsize);

#[async_trait]
impl EventSink for SlowSink {
    async fn publish(&self, _event: &NativeEvent) -> Result<(), SinkError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn concurrent_repeats_wait_for_the_first_publish() {
    let slow = Arc::new(SlowSink(AtomicUsize::new(0)));
    let f = fixture_with(slow.clone(), Arc::new(MemoryEventSink::default()));
    let body = r#"{"id":"evt_c","tenant":"acme","type":"a","payload":1}"#;
    let (a, b) = tokio::join!(
        call(&f.app, Method::POST, "/v1/events", OP, Some(body)),
        call(&f.app, Method::POST, "/v1/events", OP, Some(body)),
    );
    assert_eq!(
        (a.status, b.status),
        (StatusCode::ACCEPTED, StatusCode::ACCEPTED)
    );
    assert_eq!(slow.0.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn health_answers_while_ingest_holds_every_permit() {
    let slow = Arc::new(SlowSink(AtomicUsize::new(0)));
    let f = fixture_with(slow.clone(), Arc::new(MemoryEventSink::default()));
    let ingest = |i: usize| {
        let app = f.app.clone();
        let body = format!(r#"{{"id":"evt_held_{i}","tenant":"acme","type":"a","payload":1}}"#);
        async move { call(&app, Method::POST, "/v1/events", OP, Some(&body)).await }
    };
    let held: Vec<_> = (0..MAX_CONCURRENT_REQUESTS)
        .map(|i| tokio::spawn(ingest(i)))
        .collect();
    // Paused time moves only once every task waits, so each request is in its publish by then.
    while slow.0.load(Ordering::SeqCst) < MAX_CONCURRENT_REQUESTS {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    let over = ingest(MAX_CONCURRENT_REQUESTS).await;
    assert_error(
        &over,
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "too many requests in progress",
    );
    for path in ["/v1/health", "/v1/health/ready"] {
        let h = send(&f.app, request(Method::GET, path, None, None)).await;
        assert_eq!(
            h.status,
            StatusCode::OK,
            "{path} with every permit held: {}",
            h.text
        );
    }

    for h in held {
        assert_eq!(h.await.unwrap().status, StatusCode::ACCEPTED);
    }
    // The permits came back.
    assert_eq!(
        ingest(MAX_CONCURRENT_REQUESTS).await.status,
        StatusCode::ACCEPTED
    );
}

#[tokio::test(start_paused = true)]
async fn recent_ids_are_bounded_in_count_and_age() {
    let t = Tenant::parse("acme").unwrap();
    let id = |s: &str| crate::id::EventId::parse(s).unwrap();
    let recent = RecentIds::new(2, Duration::from_secs(60));
    let done = |c: Claim| match c {
        Claim::Slot(cell) => {
            cell.set(()).unwrap();
        }
        Claim::Mismatch => panic!("mismatch"),
    };
    done(recent.claim(&t, &id("a"), [1; 32]));
    done(recent.claim(&t, &id("b"), [1; 32]));
    assert!(matches!(
        recent.claim(&t, &id("a"), [2; 32]),
        Claim::Mismatch
    ));
    assert!(matches!(recent.claim(&t, &id("a"), [1; 32]), Claim::Slot(c) if c.initialized()));
    // A third id evicts the oldest.
    done(recent.claim(&t, &id("c"), [1; 32]));
    assert_eq!(recent.len(), 2);
    assert!(matches!(recent.claim(&t, &id("a"), [2; 32]), Claim::Slot(c) if !c.initialized()));
    // Everything is forgotten after the ttl.
    tokio::time::advance(Duration::from_secs(61)).await;
    assert!(matches!(recent.claim(&t, &id("c"), [2; 32]), Claim::Slot(c) if !c.initialized()));
    assert_eq!(recent.len(), 1);
}

/// The id of the delivery of `event` to endpoint `ep`.
fn delivery_id(event: &str, ep: &str) -> crate::id::DeliveryId {
    crate::id::DeliveryId::derive(
        &crate::id::EventId::parse(event).unwrap(),
        &EndpointId::parse(ep).unwrap(),
    )
}

async fn record(
    store: &MemoryStore,
    event: &str,
    endpoint: &str,
    tenant: &str,
    at: u64,
    outcome: AttemptOutcome,
) {
    let mut row = attempt_row(event, endpoint, 1);
    row.tenant = Tenant::parse(tenant).unwrap();
    row.started_at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + at);
    row.outcome = outcome;
    if !matches!(outcome, AttemptOutcome::Succeeded) {
        row.status = Some(503);
        row.error_class = Some(crate::attempt::ErrorClass::HttpStatus);
        row.response_body = b"busy \xff".to_vec();
    }
    store.record_attempt(&row).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn history_pages_newest_first_and_scopes_by_tenant() {
    let f = fixture();
    let ep = created_id(&f.app, ACME).await;
    for i in 0..5 {
        record(
            &f.store,
            &format!("evt_{i}"),
            &ep,
            "acme",
            i,
            AttemptOutcome::Succeeded,
        )
        .await;
    }
    let retry = AttemptOutcome::RetryScheduled {
        next_attempt_at: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_100),
    };
    record(&f.store, "evt_9", &ep, "acme", 9, retry).await;
    record(
        &f.store,
        "evt_9",
        &ep,
        "acme",
        10,
        AttemptOutcome::Dead {
            reason: crate::dead_reason::DeadReason::HttpStatus,
        },
    )
    .await;
    // Paging: newest first, 2 at a time.
    let mut seen = vec![];
    let mut uri = format!("/v1/endpoints/{ep}/deliveries?limit=2");
    loop {
        let p = call(&f.app, Method::GET, &uri, ACME, None).await;
        assert_eq!(p.status, StatusCode::OK, "{}", p.text);
        seen.extend(
            p.json["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["event_id"].as_str().unwrap().to_owned()),
        );
        match p.json["next_cursor"].as_str() {
            Some(c) => uri = format!("/v1/endpoints/{ep}/deliveries?limit=2&cursor={c}"),
            None => {
                assert!(p.json.get("next_cursor").is_some_and(Value::is_null));
                break;
            }
        }
    }
    assert_eq!(seen, ["evt_9", "evt_4", "evt_3", "evt_2", "evt_1", "evt_0"]);
    // Filters.
    let dead = call(
        &f.app,
        Method::GET,
        &format!("/v1/endpoints/{ep}/deliveries?state=dead"),
        ACME,
        None,
    )
    .await;
    assert_eq!(dead.json["data"].as_array().unwrap().len(), 1);
    assert_eq!(dead.json["data"][0]["state"], "dead");
    let since = call(
        &f.app,
        Method::GET,
        &format!("/v1/endpoints/{ep}/deliveries?since=2027-01-15T08:00:03Z"),
        ACME,
        None,
    )
    .await;
    assert_eq!(since.status, StatusCode::OK, "{}", since.text);
    // Bad parameters name themselves.
    for (q, needle) in [
        ("state=lost", "state:"),
        ("since=monday", "since:"),
        ("limit=501", "limit:"),
        ("limit=x", "limit:"),
        ("cursor=garbage", "cursor:"),
    ] {
        let a = call(
            &f.app,
            Method::GET,
            &format!("/v1/endpoints/{ep}/deliveries?{q}"),
            ACME,
            None,
        )
        .await;
        assert_error(&a, StatusCode::UNPROCESSABLE_ENTITY, "invalid", needle);
    }
    // One delivery with every attempt.
    let dlv = delivery_id("evt_9", &ep);
    let d = call(
        &f.app,
        Method::GET,
        &format!("/v1/deliveries/{dlv}"),
        ACME,
        None,
    )
    .await;
    assert_eq!(d.status, StatusCode::OK, "{}", d.text);
    assert_eq!(d.json["delivery"]["state"], "dead");
    assert_eq!(d.json["delivery"]["attempts"], 2);
    assert_eq!(d.json["delivery"]["last_status"], 503);
    assert_eq!(d.json["delivery"]["last_error_class"], "http_status");
    let attempts = d.json["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0]["outcome"], "retry_scheduled");
    assert_eq!(attempts[0]["next_attempt_at"], "2027-01-15T08:01:40.000Z");
    assert_eq!(attempts[0]["started_at"], "2027-01-15T08:00:09.000Z");
    assert_eq!(attempts[0]["response_body"], "busy \u{fffd}");
    assert_eq!(attempts[1]["outcome"], "dead");
    assert_eq!(attempts[1]["dead_reason"], "http_status");
    // Another tenant sees none of it; a missing delivery looks the same.
    assert_error(
        &call(
            &f.app,
            Method::GET,
            &format!("/v1/deliveries/{dlv}"),
            GLOBEX,
            None,
        )
        .await,
        StatusCode::NOT_FOUND,
        "not_found",
        "delivery",
    );
    assert_error(
        &call(&f.app, Method::GET, "/v1/deliveries/dlv_nope", ACME, None).await,
        StatusCode::NOT_FOUND,
        "not_found",
        "delivery",
    );
    assert_eq!(
        call(
            &f.app,
            Method::GET,
            &format!("/v1/deliveries/{dlv}"),
            OP,
            None
        )
        .await
        .status,
        StatusCode::OK
    );
    assert_eq!(
        call(
            &f.app,
            Method::GET,
            &format!("/v1/endpoints/{ep}/deliveries"),
            GLOBEX,
            None
        )
        .await
        .status,
        StatusCode::NOT_FOUND
    );
    // After the endpoint is deleted its history stays readable by its owner only.
    assert_eq!(
        call(
            &f.app,
            Method::DELETE,
            &format!("/v1/endpoints/{ep}"),
            ACME,
            None
        )
        .await
        .status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        call(
            &f.app,
            Method::GET,
            &format!("/v1/endpoints/{ep}/deliveries"),
            ACME,
            None
        )
        .await
        .json["data"]
            .as_array()
            .unwrap()
            .len(),
        6
    );
    assert_eq!(
        call(
            &f.app,
            Method::GET,
            &format!("/v1/endpoints/{ep}/deliveries"),
            GLOBEX,
            None
        )
        .await
        .status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        call(
            &f.app,
            Method::GET,
            &format!("/v1/endpoints/{}/deliveries", EndpointId::generate()),
            OP,
            None
        )
        .await
        .status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test(start_paused = true)]
async fn event_deliveries_are_filtered_to_the_callers_tenant() {
    let f = fixture();
    // One event id fanned out to two acme endpoints, and (same id) one globex endpoint.
    record(
        &f.store,
        "evt_x",
        "ep_b",
        "acme",
        1,
        AttemptOutcome::Succeeded,
    )
    .await;
    record(
        &f.store,
        "evt_x",
        "ep_a",
        "acme",
        2,
        AttemptOutcome::Succeeded,
    )
    .await;
    record(
        &f.store,
        "evt_x",
        "ep_g",
        "globex",
        3,
        AttemptOutcome::Succeeded,
    )
    .await;
    let a = call(
        &f.app,
        Method::GET,
        "/v1/events/evt_x/deliveries",
        ACME,
        None,
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    let eps: Vec<_> = a.json["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["endpoint_id"].as_str().unwrap())
        .collect();
    assert_eq!(eps, ["ep_a", "ep_b"]);
    assert!(a.json.get("next_cursor").is_none());
    assert_eq!(
        call(&f.app, Method::GET, "/v1/events/evt_x/deliveries", OP, None)
            .await
            .json["data"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    record(
        &f.store,
        "evt_only_acme",
        "ep_a",
        "acme",
        4,
        AttemptOutcome::Succeeded,
    )
    .await;
    let foreign = call(
        &f.app,
        Method::GET,
        "/v1/events/evt_only_acme/deliveries",
        GLOBEX,
        None,
    )
    .await;
    let absent = call(
        &f.app,
        Method::GET,
        "/v1/events/evt_none/deliveries",
        GLOBEX,
        None,
    )
    .await;
    assert_error(
        &foreign,
        StatusCode::NOT_FOUND,
        "not_found",
        "evt_only_acme",
    );
    assert_error(&absent, StatusCode::NOT_FOUND, "not_found", "evt_none");
}

/// An endpoint store whose view never caught up and whose writes time out.
struct Lagging(Arc<EndpointView>);

impl crate::registry::EndpointStore for Lagging {
    fn view(&self) -> &Arc<EndpointView> {
        &self.0
    }
    fn put<'a>(&'a self, _e: &'a Endpoint) -> BoxFuture<'a, Result<Arc<Endpoint>, RegistryError>> {
        Box::pin(async {
            Err(RegistryError::Timeout {
                what: "the endpoint view to apply the write",
                waited: Duration::from_secs(5),
            })
        })
    }
    fn delete<'a>(&'a self, _id: &'a EndpointId) -> BoxFuture<'a, Result<(), RegistryError>> {
        Box::pin(async { Err(RegistryError::Kafka("broker down at 10.0.0.1".into())) })
    }
}

#[tokio::test(start_paused = true)]
async fn readiness_follows_kafka_and_the_endpoint_view() {
    let f = fixture();
    let ready = || send(&f.app, request(Method::GET, "/v1/health/ready", None, None));
    let r = ready().await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["status"], "ready");
    f.kafka.send_replace(false);
    let r = ready().await;
    assert_error(&r, StatusCode::SERVICE_UNAVAILABLE, "unavailable", "kafka");
    assert_eq!(
        r.json["checks"][0],
        json!({"name": "kafka", "ok": false, "detail": "kafka is not reachable"})
    );
    assert_eq!(r.json["checks"][1]["ok"], true);
    // Liveness does not care.
    assert_eq!(
        send(&f.app, request(Method::GET, "/v1/health", None, None))
            .await
            .status,
        StatusCode::OK
    );
    f.kafka.send_replace(true);
    assert_eq!(ready().await.status, StatusCode::OK);

    // A view still reading its backlog is not ready; registry failures are 503 without internals.
    let (_tx, rx) = watch::channel(true);
    let lagging = Arc::new(Lagging(Arc::new(EndpointView::new(MasterKey::generate()))));
    let state = AdminState::new(
        lagging,
        Arc::new(MemoryStore::default()),
        Arc::new(MemoryEventSink::default()),
        auth(),
        rx,
    );
    let app = router(state);
    let r = send(&app, request(Method::GET, "/v1/health/ready", None, None)).await;
    assert_error(
        &r,
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "endpoint_view",
    );
    let c = create(&app, OP, acme_endpoint()).await;
    assert_error(
        &c,
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "endpoint registry",
    );
    // A store error that is not the caller's fault is not echoed.
    assert!(!c.text.contains("timed out"));
}

#[tokio::test(start_paused = true)]
async fn registry_errors_map_to_statuses() {
    let f = fixture();
    let id = created_id(&f.app, OP).await;
    // Someone else bumped the version underneath: the store refuses a stale write with 409.
    let current = f
        .endpoints
        .view()
        .get(&EndpointId::parse(&id).unwrap())
        .unwrap();
    let err = ApiError::from(RegistryError::Conflict {
        id: current.id.clone(),
        current: 3,
        attempted: 2,
    });
    assert_eq!(
        (err.status(), err.code()),
        (StatusCode::CONFLICT, "conflict")
    );
    let err = ApiError::from(RegistryError::Kafka("broker down at 10.0.0.1".into()));
    assert_eq!(err.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(!err.body().detail.contains("10.0.0.1"));
    let err = ApiError::Internal("cql: table x missing".into());
    assert!(!err.body().detail.contains("cql"));
    assert_eq!(err.status(), StatusCode::INTERNAL_SERVER_ERROR);
}

/// Real I/O on librdkafka's mock cluster: the envelope lands keyed by event id, acknowledged.
#[tokio::test]
async fn kafka_sink_produces_the_envelope_keyed_by_event_id() {
    use crate::kafka::{EmbeddedKafka, TopicSpec, consumer_config};
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::{Message, Offset, TopicPartitionList};

    let kafka = EmbeddedKafka::start(&[TopicSpec {
        name: "hookline.events".into(),
        partitions: 1,
        compacted: false,
    }])
    .unwrap();
    let config = crate::config::KafkaConfig {
        bootstrap_servers: kafka.bootstrap_servers().to_owned(),
        client: BTreeMap::from([("linger.ms".to_owned(), "0".to_owned())]).into(),
        ..Default::default()
    };
    let sink = super::events::KafkaEventSink::new(&config).unwrap();
    let event = NativeEvent {
        id: crate::id::EventId::parse("evt_k").unwrap(),
        tenant: Tenant::parse("acme").unwrap(),
        event_type: crate::event_type::EventType::parse("order.created").unwrap(),
        occurred_at: SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_250),
        payload: serde_json::value::RawValue::from_string("{\"a\": 1}".into()).unwrap(),
    };
    sink.publish(&event).await.unwrap();

    let consumer: StreamConsumer =
        consumer_config(kafka.bootstrap_servers(), "t", &BTreeMap::new())
            .create()
            .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("hookline.events", 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let msg = tokio::time::timeout(Duration::from_secs(20), consumer.recv())
        .await
        .expect("a record within 20 s")
        .unwrap();
    assert_eq!(msg.key(), Some(&b"evt_k"[..]));
    assert_eq!(msg.payload(), Some(&event.to_envelope()[..]));
    assert_eq!(
        String::from_utf8(event.to_envelope()).unwrap(),
        r#"{"id":"evt_k","tenant":"acme","type":"order.created","occurred_at":"2023-11-14T22:13:20.250Z","payload":{"a": 1}}"#
    );
}

/// A Kafka sink on a port where no broker listens, with `client` properties, and a native
/// event with `payload` to publish through it.
fn unreachable_sink(
    client: &[(&str, &str)],
    timeout: Duration,
    payload: String,
) -> (super::events::KafkaEventSink, NativeEvent) {
    let client: BTreeMap<String, String> = client
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let producer: crate::kafka::Producer = crate::kafka::producer_config("127.0.0.1:9", &client)
        .create_with_context(crate::kafka::ProducerLog::default())
        .unwrap();
    let sink =
        super::events::KafkaEventSink::from_producer(producer, "hookline.events".into(), timeout);
    let event = NativeEvent {
        id: crate::id::EventId::parse("evt_t").unwrap(),
        tenant: Tenant::parse("acme").unwrap(),
        event_type: crate::event_type::EventType::parse("a").unwrap(),
        occurred_at: SystemTime::UNIX_EPOCH,
        payload: serde_json::value::RawValue::from_string(payload).unwrap(),
    };
    (sink, event)
}

#[tokio::test]
async fn kafka_sink_gives_up_at_its_timeout_when_no_broker_answers() {
    let (sink, event) = unreachable_sink(&[], Duration::from_millis(300), "1".into());
    let err = sink.publish(&event).await.unwrap_err();
    assert!(
        matches!(err, SinkError::Timeout(_) | SinkError::Unavailable(_)),
        "{err:?}"
    );
    assert_eq!(
        ApiError::from(err).status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[tokio::test]
async fn kafka_sink_answers_413_for_an_event_larger_than_its_record_limit() {
    // librdkafka refuses the record itself, before any broker is asked.
    let (sink, event) = unreachable_sink(
        &[("message.max.bytes", "1000")],
        Duration::from_secs(5),
        format!("\"{}\"", "x".repeat(2000)),
    );
    let err = sink.publish(&event).await.unwrap_err();
    assert!(matches!(err, SinkError::Rejected(_)), "{err:?}");
    let err = ApiError::from(err);
    assert_eq!(err.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        err.to_string().contains("too large for its Kafka record"),
        "{err}"
    );
}

/// `POST /v1/endpoints` of an endpoint of acme's at `url`, with an operator token.
async fn register(app: &Router, url: &str) -> Answer {
    let body = json!({"tenant": "acme", "url": url, "event_types": ["a"]}).to_string();
    call(app, Method::POST, "/v1/endpoints", OP, Some(&body)).await
}

#[tokio::test]
async fn urls_the_sender_would_refuse_are_refused_at_registration() {
    let f = fixture();
    let strict = router(f.state.clone().with_url_rules(UrlRules {
        policy: Policy::new(),
        allow_http: false,
    }));
    let refused = "url: refused by SSRF policy:";
    for (url, detail) in [
        (
            "https://169.254.169.254/latest/meta-data/",
            "169.254.169.254 is in blocked range",
        ),
        ("https://10.0.0.1/x", "10.0.0.1"),
        ("https://0.0.0.0:19000/", "0.0.0.0"),
        ("https://[fd00::1]/", "fd00::1"),
        ("https://[::ffff:127.0.0.1]/", ""),
    ] {
        let r = register(&strict, url).await;
        let want = format!("{refused} {detail}");
        assert_error(
            &r,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            want.trim_end(),
        );
    }
    let r = register(&strict, "http://example.com/").await;
    assert_error(
        &r,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid",
        "url: plain http:// is refused",
    );
    assert!(
        f.endpoints.view().all().is_empty(),
        "nothing refused was stored"
    );
    // Host names pass (they are checked on every resolved address at send time).
    let ok = register(&strict, "https://example.com/h").await;
    assert_eq!(ok.status, StatusCode::CREATED, "{}", ok.text);
    // A change of URL is checked the same way, and a refused one changes nothing.
    let uri = format!("/v1/endpoints/{}", ok.json["id"].as_str().unwrap());
    let r = call(
        &strict,
        Method::PATCH,
        &uri,
        OP,
        Some(r#"{"url":"https://127.0.0.1:9/"}"#),
    )
    .await;
    assert_error(
        &r,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid",
        &format!("{refused} 127.0.0.1"),
    );
    let g = call(&strict, Method::GET, &uri, OP, None).await;
    assert_eq!(g.json["url"], "https://example.com/h");
    // What the operator allowed (as `hookline dev` allows loopback and http) is accepted.
    let dev = router(f.state.clone().with_url_rules(UrlRules {
        policy: Policy::with_allowed(["127.0.0.0/8".parse().unwrap()]),
        allow_http: true,
    }));
    let r = register(&dev, "http://127.0.0.1:9/h").await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let r = register(&dev, "http://169.254.169.254/").await;
    assert_error(
        &r,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid",
        "http.allow_cidrs can allow",
    );
}

#[tokio::test]
async fn a_patch_of_an_unknown_endpoint_is_404_whatever_its_body() {
    let f = fixture();
    let r = call(
        &f.app,
        Method::PATCH,
        "/v1/endpoints/ep_0123456789abcdef0123456789abcdef",
        OP,
        Some(r#"{"bogus":1}"#),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
}

/// A sink that panics: stands for a bug anywhere under a handler.
struct PanickingSink;

#[async_trait]
impl EventSink for PanickingSink {
    async fn publish(&self, _event: &NativeEvent) -> Result<(), SinkError> {
        panic!("sink bug");
    }
}

#[tokio::test]
async fn a_handler_that_panics_still_answers_500() {
    let f = fixture_with(
        Arc::new(PanickingSink),
        Arc::new(MemoryEventSink::default()),
    );
    let body = r#"{"id":"evt_p","tenant":"acme","type":"a","payload":1}"#;
    let r = call(&f.app, Method::POST, "/v1/events", OP, Some(body)).await;
    assert_error(
        &r,
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "server log",
    );
    // The API goes on answering.
    let h = call(&f.app, Method::GET, "/v1/health", OP, None).await;
    assert_eq!(h.status, StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn a_repeated_body_field_is_refused_not_last_wins() {
    let f = fixture();
    let id = created_id(&f.app, OP).await;
    let uri = format!("/v1/endpoints/{id}");
    let cases = [
        (
            Method::POST,
            "/v1/endpoints",
            r#"{"tenant":"acme","url":"https://a.example","url":"https://b.example","event_types":["*"]}"#,
            "duplicate field `url`",
        ),
        (
            Method::PATCH,
            uri.as_str(),
            r#"{"enabled":false,"enabled":true}"#,
            "duplicate field `enabled`",
        ),
        (
            Method::POST,
            "/v1/events",
            r#"{"tenant":"acme","type":"a","type":"b","payload":1}"#,
            "duplicate field `type`",
        ),
    ];
    for (method, path, body, needle) in cases {
        let r = call(&f.app, method, path, OP, Some(body)).await;
        assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid", needle);
    }
    // Nothing changed on the way.
    let got = call(&f.app, Method::GET, &uri, OP, None).await;
    assert_eq!(got.json["enabled"], true, "{}", got.text);
    assert_eq!(got.json["url"], "https://example.com/hook", "{}", got.text);
    let list = call(&f.app, Method::GET, "/v1/endpoints", OP, None).await;
    assert_eq!(
        list.json["data"].as_array().map(Vec::len),
        Some(1),
        "{}",
        list.text
    );
}

/// A burst of new connections, none accepted yet, all complete their handshake: the listener's
/// queue holds them. Bound as `TcpListener::bind` binds (a queue of 128), the connections past
/// 129 wait for a retransmission of the SYN the kernel dropped (a second or more), and this
/// fails. The kernel caps the queue at `net.core.somaxconn`, so the burst is no larger than
/// that.
#[tokio::test]
async fn a_burst_of_connections_waits_in_the_listen_queue_not_for_retransmissions() {
    let somaxconn: usize = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .expect("reads net.core.somaxconn")
        .trim()
        .parse()
        .expect("net.core.somaxconn is a number");
    let burst = 400.min(somaxconn);
    assert!(
        burst > 129,
        "net.core.somaxconn = {somaxconn} caps every listen queue at {somaxconn}: this test \
         needs more than 129 (sysctl -w net.core.somaxconn=4096)"
    );
    let listener = listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut open = Vec::with_capacity(burst);
    for n in 0..burst {
        let conn = tokio::time::timeout(
            Duration::from_millis(500),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        .unwrap_or_else(|_| panic!("connection {n} of {burst} waited for a retransmission"))
        .unwrap();
        open.push(conn);
    }
    drop(listener);
}

/// Disables tenant acme's endpoint `ep` through the API.
async fn disable(app: &Router, ep: &str) {
    let p = call(
        app,
        Method::PATCH,
        &format!("/v1/endpoints/{ep}"),
        ACME,
        Some(r#"{"enabled":false}"#),
    )
    .await;
    assert_eq!(p.status, StatusCode::OK, "{}", p.text);
}

/// Replays as the admin API asks for them, answering as told.
#[derive(Default)]
struct FakeReplayer {
    asked: std::sync::Mutex<Vec<(String, String, String)>>,
    endpoint_asks: std::sync::Mutex<Vec<crate::replay::EndpointReplayRequest>>,
    gone: std::sync::atomic::AtomicBool,
}

#[async_trait]
impl crate::replay::ApiReplayer for FakeReplayer {
    async fn replay(
        &self,
        delivery: &crate::storage::DeliveryState,
        actor: String,
        reason: String,
    ) -> Result<crate::replay::DeliveryReplay, crate::replay::ReplayError> {
        if self.gone.load(Ordering::SeqCst) {
            return Err(crate::replay::ReplayError::DeadLetterGone {
                delivery: delivery.delivery_id.to_string(),
                dlq: "hookline.dlq".into(),
            });
        }
        self.asked
            .lock()
            .unwrap()
            .push((delivery.delivery_id.to_string(), actor, reason));
        Ok(crate::replay::DeliveryReplay {
            replay_id: "rpl_test".into(),
            topic: "hookline.dlq".into(),
            from: crate::replay::DlqPosition {
                partition: 2,
                offset: 41,
            },
        })
    }

    /// Answers a range by its partition: 7 does not exist, 8 does not hold the offsets.
    async fn replay_range(
        &self,
        request: &crate::replay::ReplayRequest,
    ) -> Result<crate::replay::ReplaySummary, crate::replay::ReplayError> {
        use crate::replay::ReplayError;
        match request.partition {
            7 => Err(ReplayError::NoPartition {
                topic: "hookline.dlq".into(),
                partitions: 4,
                partition: 7,
            }),
            8 => Err(ReplayError::OutOfRange {
                partition: 8,
                low: 0,
                high: 10,
                from: request.from_offset,
                to: request.to_offset,
            }),
            _ => {
                self.asked.lock().unwrap().push((
                    format!(
                        "{} {}..={} {:?} {}",
                        request.partition,
                        request.from_offset,
                        request.to_offset,
                        request.endpoint.as_ref().map(ToString::to_string),
                        request.dry_run
                    ),
                    request.actor.clone(),
                    request.reason.clone(),
                ));
                Ok(crate::replay::ReplaySummary {
                    replay_id: "rpl_offsets".into(),
                    scanned: 5,
                    replayed: 4,
                    filtered: 1,
                    undecodable: 0,
                    skipped_being_replayed: 0,
                    last_offset: request.to_offset,
                })
            }
        }
    }

    /// Covers what lies before 2025-10-09T08:53:25Z.
    async fn replay_endpoint(
        &self,
        request: &crate::replay::EndpointReplayRequest,
    ) -> Result<crate::replay::EndpointReplay, crate::replay::ReplayError> {
        self.endpoint_asks.lock().unwrap().push(request.clone());
        let cut = SystemTime::UNIX_EPOCH + Duration::from_secs(1_760_000_005);
        let short = request.until > cut;
        Ok(crate::replay::EndpointReplay {
            replay_id: "rpl_range".into(),
            replayed: 3,
            skipped: 1,
            resume_since: short.then_some(cut),
            stopped: short.then(|| "read the DLQ for 15s".to_owned()),
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_dead_delivery_replays_for_its_tenant_with_an_audited_actor() {
    let f = fixture();
    let ep = created_id(&f.app, ACME).await;
    let dead = AttemptOutcome::Dead {
        reason: crate::dead_reason::DeadReason::HttpStatus,
    };
    record(&f.store, "evt_dead", &ep, "acme", 1, dead).await;
    record(
        &f.store,
        "evt_done",
        &ep,
        "acme",
        2,
        AttemptOutcome::Succeeded,
    )
    .await;
    let retry = AttemptOutcome::RetryScheduled {
        next_attempt_at: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_100),
    };
    record(&f.store, "evt_retrying", &ep, "acme", 3, retry).await;
    let dead_id = delivery_id("evt_dead", &ep);
    let done_id = delivery_id("evt_done", &ep);
    let retrying_id = delivery_id("evt_retrying", &ep);
    let uri = |id: &crate::id::DeliveryId| format!("/v1/deliveries/{id}/replay");

    // A process without a replayer says so.
    let a = call(&f.app, Method::POST, &uri(&dead_id), ACME, None).await;
    assert_error(&a, StatusCode::SERVICE_UNAVAILABLE, "unavailable", "replay");

    let replayer = Arc::new(FakeReplayer::default());
    let app = router(f.state.clone().with_replayer(replayer.clone()));
    let body = r#"{"actor":"alice@acme.example","reason":"receiver fixed"}"#;
    let a = call(&app, Method::POST, &uri(&dead_id), ACME, Some(body)).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.text);
    assert_eq!(
        a.json,
        json!({"replay_id": "rpl_test", "delivery_id": dead_id.to_string(),
               "from": {"topic": "hookline.dlq", "partition": 2, "offset": 41}})
    );
    // No body at all: the token alone is the actor, with a default reason.
    let a = call(&app, Method::POST, &uri(&dead_id), OP, None).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.text);
    assert_eq!(
        *replayer.asked.lock().unwrap(),
        [
            (
                dead_id.to_string(),
                "alice@acme.example (with tenant acme's API token)".to_owned(),
                "receiver fixed".to_owned()
            ),
            (
                dead_id.to_string(),
                "with an operator's API token".to_owned(),
                "replayed through the admin API".to_owned()
            ),
        ]
    );

    // Another tenant's delivery is not there; nor is an unknown or malformed id.
    let a = call(&app, Method::POST, &uri(&dead_id), GLOBEX, None).await;
    assert_error(&a, StatusCode::NOT_FOUND, "not_found", "delivery");
    let a = call(
        &app,
        Method::POST,
        "/v1/deliveries/dlv_nope/replay",
        ACME,
        None,
    )
    .await;
    assert_error(&a, StatusCode::NOT_FOUND, "not_found", "dlv_nope");
    // A delivery being retried does not replay: it is attempted again anyway.
    let a = call(&app, Method::POST, &uri(&retrying_id), ACME, None).await;
    assert_error(&a, StatusCode::CONFLICT, "conflict", "is scheduled");
    // A delivered one does (sent again from its record in the deliveries topic).
    let a = call(&app, Method::POST, &uri(&done_id), ACME, None).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.text);
    assert_eq!(
        replayer
            .asked
            .lock()
            .unwrap()
            .last()
            .map(|(id, ..)| id.clone()),
        Some(done_id.to_string())
    );
    // Bad bodies name the field.
    for (body, field) in [
        (r#"{"reason":"  "}"#, "reason:"),
        (r#"{"actor":""}"#, "actor:"),
        (r#"{"actor":"a\nb"}"#, "actor:"),
        (r#"{"why":"x"}"#, "why"),
    ] {
        let a = call(&app, Method::POST, &uri(&dead_id), ACME, Some(body)).await;
        assert_error(&a, StatusCode::UNPROCESSABLE_ENTITY, "invalid", field);
    }
    let long = json!({ "reason": "x".repeat(501) }).to_string();
    let a = call(&app, Method::POST, &uri(&dead_id), ACME, Some(&long)).await;
    assert_error(
        &a,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid",
        "500 characters",
    );
    // A dead letter past the DLQ's retention is gone for good.
    replayer.gone.store(true, Ordering::SeqCst);
    let a = call(&app, Method::POST, &uri(&dead_id), ACME, None).await;
    assert_error(&a, StatusCode::GONE, "gone", "retention");
    replayer.gone.store(false, Ordering::SeqCst);
    // An endpoint that would dead-letter it again is refused, saying what to do.
    disable(&app, &ep).await;
    let a = call(&app, Method::POST, &uri(&dead_id), ACME, None).await;
    assert_error(&a, StatusCode::CONFLICT, "conflict", "re-enable it first");
    let d = call(
        &app,
        Method::DELETE,
        &format!("/v1/endpoints/{ep}"),
        ACME,
        None,
    )
    .await;
    assert!(d.status.is_success(), "{}", d.text);
    let a = call(&app, Method::POST, &uri(&dead_id), ACME, None).await;
    assert_error(&a, StatusCode::CONFLICT, "conflict", "was deleted");
    assert_eq!(
        replayer.asked.lock().unwrap().len(),
        3,
        "refusals replay nothing"
    );
}

/// One dead delivery of tenant acme's endpoint, and the admin API with a [`FakeReplayer`]:
/// the fixture, the endpoint, the delivery, its replay route, the replayer, the app, and the
/// outcome it died of.
type DeadOne = (
    Fixture,
    String,
    crate::id::DeliveryId,
    String,
    Arc<FakeReplayer>,
    Router,
    AttemptOutcome,
);

async fn dead_one() -> DeadOne {
    let f = fixture();
    let ep = created_id(&f.app, ACME).await;
    let dead = AttemptOutcome::Dead {
        reason: crate::dead_reason::DeadReason::HttpStatus,
    };
    record(&f.store, "evt_dead", &ep, "acme", 1, dead).await;
    let id = delivery_id("evt_dead", &ep);
    let uri = format!("/v1/deliveries/{id}/replay");
    let replayer = Arc::new(FakeReplayer::default());
    let app = router(f.state.clone().with_replayer(replayer.clone()));
    (f, ep, id, uri, replayer, app, dead)
}

#[tokio::test(start_paused = true)]
async fn a_delivery_on_its_way_from_a_replay_is_not_replayed_again() {
    let (f, ep, id, uri, replayer, app, dead) = dead_one().await;
    // A replay republished it; its attempt is not logged yet, so the log still shows it dead.
    let mark = crate::storage::ReplayMark {
        delivery_id: id.clone(),
        replay_id: "rpl_earlier".into(),
        at: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_100),
    };
    f.store.record_replay_mark(&mark).await.unwrap();
    let a = call(&app, Method::POST, &uri, ACME, None).await;
    assert_error(
        &a,
        StatusCode::CONFLICT,
        "conflict",
        "was replayed at 2027-01-15T08:01:40.000Z (replay rpl_earlier) and that replay's \
         attempt is not logged yet",
    );
    assert!(replayer.asked.lock().unwrap().is_empty());
    // An attempt of another replay does not settle this one.
    let mut other = crate::storage::conformance::attempt_row("evt_dead", &ep, 1);
    other.started_at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_050);
    other.replay_id = Some("rpl_older".into());
    other.outcome = dead;
    f.store.record_attempt(&other).await.unwrap();
    let a = call(&app, Method::POST, &uri, ACME, None).await;
    assert_error(&a, StatusCode::CONFLICT, "conflict", "rpl_earlier");
    // Its attempt came and it died again: it replays.
    let mut again = crate::storage::conformance::attempt_row("evt_dead", &ep, 1);
    again.started_at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_101);
    again.replay_id = Some("rpl_earlier".into());
    again.outcome = dead;
    f.store.record_attempt(&again).await.unwrap();
    let a = call(&app, Method::POST, &uri, ACME, None).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.text);
    assert_eq!(replayer.asked.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_delivery_another_replay_has_claimed_is_left_to_it() {
    let (f, ep, id, uri, replayer, app, dead) = dead_one().await;
    // Another replay claimed it a moment ago and has not republished it yet.
    let claim = |replay_id: &str, at: SystemTime| crate::storage::ReplayMark {
        delivery_id: id.clone(),
        replay_id: replay_id.into(),
        at,
    };
    let now = SystemTime::now();
    assert!(
        f.store
            .claim_replay(&claim("rpl_claimed", now), None)
            .await
            .unwrap()
    );
    let a = call(&app, Method::POST, &uri, ACME, None).await;
    assert_error(
        &a,
        StatusCode::CONFLICT,
        "conflict",
        "is being replayed by replay rpl_claimed",
    );
    assert!(replayer.asked.lock().unwrap().is_empty());
    // That replay's attempt came (its mark was lost) and it died again: it replays.
    let mut again = crate::storage::conformance::attempt_row("evt_dead", &ep, 1);
    again.started_at = now;
    again.replay_id = Some("rpl_claimed".into());
    again.outcome = dead;
    f.store.record_attempt(&again).await.unwrap();
    let a = call(&app, Method::POST, &uri, ACME, None).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.text);
    // A claim older than the limit, with no mark and no attempt of its replay: its process
    // stopped before republishing, and it holds the delivery no longer.
    let stale = now - crate::replay::CLAIM_LIMIT - Duration::from_secs(1);
    assert!(
        f.store
            .claim_replay(&claim("rpl_stopped", stale), Some("rpl_claimed"))
            .await
            .unwrap()
    );
    let a = call(&app, Method::POST, &uri, ACME, None).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.text);
    assert_eq!(replayer.asked.lock().unwrap().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_replay_audit_trail_is_read_newest_first_and_tenants_read_their_own() {
    let f = fixture();
    for (i, actor) in ["oncall", "alice (with tenant acme's API token)"]
        .iter()
        .enumerate()
    {
        f.store
            .record_replay(&crate::storage::ReplayAudit {
                replay_id: format!("rpl_{i}"),
                actor: (*actor).to_owned(),
                reason: "receiver fixed".into(),
                at: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + i as u64),
                scope: "hookline.dlq partition 2 offsets 41..=41".into(),
                count: 1,
                dry_run: i == 0,
                tenant: (i == 1).then(|| Tenant::parse("acme").unwrap()),
                asked_by: None,
            })
            .await
            .unwrap();
    }
    let a = call(&f.app, Method::GET, "/v1/replays", OP, None).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    assert_eq!(
        a.json["data"][0],
        json!({"replay_id": "rpl_1", "actor": "alice (with tenant acme's API token)",
               "reason": "receiver fixed", "at": "2027-01-15T08:00:01.000Z",
               "scope": "hookline.dlq partition 2 offsets 41..=41", "count": 1,
               "dry_run": false, "tenant": "acme"})
    );
    assert_eq!(a.json["data"][1]["replay_id"], "rpl_0");
    assert_eq!(a.json["data"][1]["dry_run"], true);
    assert_eq!(a.json["data"][1]["tenant"], Value::Null);
    let one = call(&f.app, Method::GET, "/v1/replays?limit=1", OP, None).await;
    assert_eq!(
        one.json["data"].as_array().unwrap().len(),
        1,
        "{}",
        one.text
    );
    // A tenant reads the replays of its own deliveries, not an operator's range.
    let a = call(&f.app, Method::GET, "/v1/replays", ACME, None).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    let ids: Vec<&Value> = a.json["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["replay_id"])
        .collect();
    assert_eq!(ids, [&json!("rpl_1")], "{}", a.text);
    let a = call(&f.app, Method::GET, "/v1/replays", GLOBEX, None).await;
    assert_eq!(a.json, json!({"data": []}), "{}", a.text);
    for (q, needle) in [
        ("limit=0", "limit:"),
        ("limit=1001", "limit:"),
        ("since=x", "since"),
    ] {
        let a = call(&f.app, Method::GET, &format!("/v1/replays?{q}"), OP, None).await;
        assert_error(&a, StatusCode::UNPROCESSABLE_ENTITY, "invalid", needle);
    }
}

#[tokio::test(start_paused = true)]
async fn an_endpoints_dead_deliveries_replay_over_a_time_range() {
    let f = fixture();
    let ep = created_id(&f.app, ACME).await;
    let replayer = Arc::new(FakeReplayer::default());
    let app = router(f.state.clone().with_replayer(replayer.clone()));
    let uri = format!("/v1/endpoints/{ep}/replay");
    let body =
        r#"{"since":"2025-10-09T08:53:20Z","until":"2025-10-09T08:53:24Z","reason":"outage over"}"#;
    let a = call(&app, Method::POST, &uri, ACME, Some(body)).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.text);
    assert_eq!(
        a.json,
        json!({"replay_id": "rpl_range", "endpoint_id": ep, "replayed": 3, "skipped": 1,
               "complete": true, "resume_since": null, "detail": null})
    );
    {
        let asked = replayer.endpoint_asks.lock().unwrap();
        let r = &asked[0];
        assert_eq!(r.endpoint.to_string(), ep);
        assert_eq!(
            r.tenant.as_str(),
            "acme",
            "the audit entry names the tenant"
        );
        assert_eq!(
            (r.since, r.until),
            (
                SystemTime::UNIX_EPOCH + Duration::from_secs(1_760_000_000),
                SystemTime::UNIX_EPOCH + Duration::from_secs(1_760_000_004)
            )
        );
        assert_eq!(
            (r.actor.as_str(), r.reason.as_str()),
            ("with tenant acme's API token", "outage over")
        );
    }
    // Until now by default; a range cut short says where to resume.
    let a = call(
        &app,
        Method::POST,
        &uri,
        OP,
        Some(r#"{"since":"2025-10-09T08:53:20Z"}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.text);
    assert_eq!(a.json["complete"], false);
    assert_eq!(a.json["resume_since"], "2025-10-09T08:53:25.000Z");
    assert_eq!(a.json["detail"], "read the DLQ for 15s");

    for (body, field) in [
        (r#"{}"#, "since"),
        (r#"{"since":"yesterday"}"#, "since:"),
        (
            r#"{"since":"2099-01-01T00:00:00Z"}"#,
            "since: is in the future",
        ),
        (
            r#"{"since":"2025-10-09T08:53:20Z","until":"2025-10-08T08:53:20Z"}"#,
            "until: is before since",
        ),
        (r#"{"since":"2025-10-09T08:53:20Z","actor":" "}"#, "actor:"),
        (r#"{"since":"2025-10-09T08:53:20Z","from":1}"#, "from"),
    ] {
        let a = call(&app, Method::POST, &uri, ACME, Some(body)).await;
        assert_error(&a, StatusCode::UNPROCESSABLE_ENTITY, "invalid", field);
    }
    let body = Some(r#"{"since":"2025-10-09T08:53:20Z"}"#);
    let a = call(&app, Method::POST, &uri, GLOBEX, body).await;
    assert_error(&a, StatusCode::NOT_FOUND, "not_found", "endpoint");
    disable(&app, &ep).await;
    let a = call(&app, Method::POST, &uri, ACME, body).await;
    assert_error(&a, StatusCode::CONFLICT, "conflict", "re-enable it first");
    assert_eq!(
        replayer.endpoint_asks.lock().unwrap().len(),
        2,
        "refusals replay nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn operators_replay_a_dlq_range_through_the_api() {
    let f = fixture();
    let ep = created_id(&f.app, ACME).await;
    let replayer = Arc::new(FakeReplayer::default());
    let app = router(f.state.clone().with_replayer(replayer.clone()));
    let body = json!({"partition": 2, "from_offset": 10, "to_offset": 14, "endpoint": ep,
                      "actor": "oncall", "reason": "receiver fixed"})
    .to_string();
    let a = call(&app, Method::POST, "/v1/replays", OP, Some(&body)).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.text);
    assert_eq!(
        a.json,
        json!({"replay_id": "rpl_offsets", "scanned": 5, "replayed": 4, "filtered": 1,
               "skipped_not_dead_letters": 0, "skipped_being_replayed": 0, "last_offset": 14,
               "dry_run": false})
    );
    let dry = r#"{"partition":2,"from_offset":10,"to_offset":10,"dry_run":true}"#;
    let a = call(&app, Method::POST, "/v1/replays", OP, Some(dry)).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    assert_eq!(a.json["dry_run"], true);
    assert_eq!(
        *replayer.asked.lock().unwrap(),
        [
            (
                format!("2 10..=14 Some(\"{ep}\") false"),
                "oncall (with an operator's API token)".to_owned(),
                "receiver fixed".to_owned()
            ),
            (
                "2 10..=10 None true".to_owned(),
                "with an operator's API token".to_owned(),
                "replayed through the admin API".to_owned()
            ),
        ]
    );
    let a = call(&app, Method::POST, "/v1/replays", ACME, Some(&body)).await;
    assert_error(&a, StatusCode::FORBIDDEN, "forbidden", "operator tokens");
    for (body, needle) in [
        (
            r#"{"partition":-1,"from_offset":0,"to_offset":0}"#,
            "partition: must be 0 or more",
        ),
        (
            r#"{"partition":0,"from_offset":-1,"to_offset":0}"#,
            "from_offset:",
        ),
        (
            r#"{"partition":0,"from_offset":5,"to_offset":4}"#,
            "to_offset: is before from_offset",
        ),
        (
            r#"{"partition":0,"from_offset":0,"to_offset":0,"endpoint":"no such id!"}"#,
            "endpoint:",
        ),
        (r#"{"partition":0,"from_offset":0}"#, "to_offset"),
        (
            r#"{"partition":0,"from_offset":0,"to_offset":0,"reason":""}"#,
            "reason:",
        ),
        (
            r#"{"partition":7,"from_offset":0,"to_offset":0}"#,
            "partition: 7 is not a partition of hookline.dlq, which has 4 (0 to 3)",
        ),
        (
            r#"{"partition":8,"from_offset":20,"to_offset":30}"#,
            "from_offset: 20..=30 is not in DLQ partition 8",
        ),
    ] {
        let a = call(&app, Method::POST, "/v1/replays", OP, Some(body)).await;
        assert_error(&a, StatusCode::UNPROCESSABLE_ENTITY, "invalid", needle);
    }
    assert_eq!(
        replayer.asked.lock().unwrap().len(),
        2,
        "refusals replay nothing"
    );
}
