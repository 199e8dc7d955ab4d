//! Router tests of the tenant routes (API keys, scopes, portal links, limits) on the in-memory
//! registry, through `oneshot`.

use std::time::{Duration, SystemTime};

use axum::Router;
use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use super::router;
use super::tests::{
    ACME, Answer, GLOBEX, OP, acme_endpoint, assert_error, call, create, fixture, request, send,
};
use crate::id::Tenant;
use crate::registry::EndpointStore;
use crate::sealed::MasterKey;
use crate::tenant::{PortalClaims, PortalSigner, Scope};

async fn issue(app: &Router, token: &str, tenant: &str, body: Value) -> Answer {
    let uri = format!("/v1/tenants/{tenant}/keys");
    call(app, Method::POST, &uri, token, Some(&body.to_string())).await
}

/// Issues a key for `tenant` as the operator and returns (id, key).
async fn issued(app: &Router, tenant: &str, scope: &str) -> (String, String) {
    let a = issue(app, OP, tenant, json!({"scope": scope, "name": "ci"})).await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text);
    let s = |f: &str| a.json[f].as_str().unwrap().to_owned();
    (s("id"), s("key"))
}

#[tokio::test(start_paused = true)]
async fn keys_are_issued_once_listed_without_the_key_and_revoked() {
    let f = fixture();
    let a = issue(&f.app, OP, "acme", json!({"scope": "read", "name": "ci"})).await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text);
    let (id, key) = (
        a.json["id"].as_str().unwrap().to_owned(),
        a.json["key"].as_str().unwrap().to_owned(),
    );
    assert!(
        id.starts_with("tk_") && key.starts_with("hlk_"),
        "{}",
        a.text
    );
    assert_eq!(
        (&a.json["scope"], &a.json["name"], &a.json["tenant"]),
        (&json!("read"), &json!("ci"), &json!("acme"))
    );
    assert!(a.json["created_at"].as_str().unwrap().ends_with('Z'));

    let list = call(&f.app, Method::GET, "/v1/tenants/acme/keys", OP, None).await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.text);
    assert_eq!(
        list.json["data"][0],
        json!({"id": id, "tenant": "acme", "scope": "read", "name": "ci",
               "created_at": a.json["created_at"], "revoked_at": null})
    );
    assert!(!list.text.contains(&key), "the key is shown once");
    let view = f.endpoints.view();
    let stored = view.tenant_keys(&Tenant::parse("acme").unwrap());
    assert!(!format!("{stored:?}").contains(&key), "Debug redacts");
    assert!(!format!("{:?}", f.state).contains(&key));

    // The key reads as its tenant.
    let mine = create(&f.app, ACME, acme_endpoint()).await;
    assert_eq!(mine.status, StatusCode::CREATED, "{}", mine.text);
    let theirs = create(
        &f.app,
        GLOBEX,
        json!({"tenant": "globex", "url": "https://example.com/g", "event_types": ["*"]}),
    )
    .await;
    let seen = call(&f.app, Method::GET, "/v1/endpoints", &key, None).await;
    assert_eq!(seen.status, StatusCode::OK, "{}", seen.text);
    assert_eq!(seen.json["data"].as_array().unwrap().len(), 1);
    assert_eq!(seen.json["data"][0]["id"], mine.json["id"]);
    let other = format!("/v1/endpoints/{}", theirs.json["id"].as_str().unwrap());
    let a = call(&f.app, Method::GET, &other, &key, None).await;
    assert_error(&a, StatusCode::NOT_FOUND, "not_found", "endpoint");

    // Revoked: refused at once, and listed with when.
    let uri = format!("/v1/tenants/acme/keys/{id}");
    let a = call(&f.app, Method::DELETE, &uri, OP, None).await;
    assert_eq!(a.status, StatusCode::NO_CONTENT, "{}", a.text);
    let a = call(&f.app, Method::GET, "/v1/endpoints", &key, None).await;
    assert_error(&a, StatusCode::UNAUTHORIZED, "unauthorized", "was revoked");
    assert_eq!(a.headers["www-authenticate"], "Bearer");
    let list = call(&f.app, Method::GET, "/v1/tenants/acme/keys", OP, None).await;
    assert!(
        list.json["data"][0]["revoked_at"].is_string(),
        "{}",
        list.text
    );
    let again = call(&f.app, Method::DELETE, &uri, OP, None).await;
    assert_eq!(
        again.status,
        StatusCode::NO_CONTENT,
        "revoking twice is harmless"
    );
}

#[tokio::test(start_paused = true)]
async fn a_read_key_reads_and_is_refused_every_write_naming_its_scope() {
    let f = fixture();
    let (_, read) = issued(&f.app, "acme", "read").await;
    let (_, write) = issued(&f.app, "acme", "write").await;
    let a = create(&f.app, &read, acme_endpoint()).await;
    assert_error(&a, StatusCode::FORBIDDEN, "forbidden", "scope is read");
    let ep = create(&f.app, &write, acme_endpoint()).await;
    assert_eq!(ep.status, StatusCode::CREATED, "{}", ep.text);
    let ep = ep.json["id"].as_str().unwrap().to_owned();
    for (method, uri, body) in [
        (
            Method::PATCH,
            format!("/v1/endpoints/{ep}"),
            Some(r#"{"enabled":false}"#),
        ),
        (Method::DELETE, format!("/v1/endpoints/{ep}"), None),
        (Method::POST, format!("/v1/endpoints/{ep}/secrets"), None),
        (
            Method::POST,
            "/v1/events".to_owned(),
            Some(r#"{"type":"a.b","data":{}}"#),
        ),
        (
            Method::POST,
            format!("/v1/endpoints/{ep}/replay"),
            Some("{}"),
        ),
        (
            Method::POST,
            "/v1/tenants/acme/keys".to_owned(),
            Some(r#"{"scope":"read"}"#),
        ),
    ] {
        let a = call(&f.app, method.clone(), &uri, &read, body).await;
        assert_error(&a, StatusCode::FORBIDDEN, "forbidden", "scope");
        assert!(
            a.json["detail"].as_str().unwrap().contains(method.as_str()),
            "{}",
            a.text
        );
    }
    let a = call(
        &f.app,
        Method::GET,
        &format!("/v1/endpoints/{ep}"),
        &read,
        None,
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    // Managing keys takes a write credential, even to list them.
    let a = call(&f.app, Method::GET, "/v1/tenants/acme/keys", &read, None).await;
    assert_error(&a, StatusCode::FORBIDDEN, "forbidden", "scope is read");
}

#[tokio::test(start_paused = true)]
async fn tenants_manage_their_own_keys_and_another_tenants_are_404() {
    let f = fixture();
    // A tenant's config token and its write keys manage its own keys.
    let a = issue(&f.app, ACME, "acme", json!({"scope": "write"})).await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text);
    assert_eq!(a.json["name"], Value::Null);
    let write = a.json["key"].as_str().unwrap().to_owned();
    let a = issue(
        &f.app,
        &write,
        "acme",
        json!({"scope": "read", "name": "dash"}),
    )
    .await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text);
    let read_id = a.json["id"].as_str().unwrap().to_owned();
    let a = call(&f.app, Method::GET, "/v1/tenants/acme/keys", &write, None).await;
    assert_eq!(a.json["data"].as_array().unwrap().len(), 2, "{}", a.text);

    // Another tenant's: 404 for each route, and for its keys' ids.
    let uri = format!("/v1/tenants/acme/keys/{read_id}");
    for (method, uri, body) in [
        (Method::GET, "/v1/tenants/acme/keys".to_owned(), None),
        (
            Method::POST,
            "/v1/tenants/acme/keys".to_owned(),
            Some(r#"{"scope":"read"}"#),
        ),
        (Method::DELETE, uri.clone(), None),
        (
            Method::POST,
            "/v1/tenants/acme/portal-links".to_owned(),
            None,
        ),
        (Method::GET, "/v1/tenants/acme/limits".to_owned(), None),
        (
            Method::PUT,
            "/v1/tenants/acme/limits".to_owned(),
            Some("{}"),
        ),
    ] {
        let a = call(&f.app, method, &uri, GLOBEX, body).await;
        assert_error(&a, StatusCode::NOT_FOUND, "not_found", "tenant acme");
    }
    // An id that is not this tenant's key, or not a key id at all.
    let wrong_tenant = format!("/v1/tenants/globex/keys/{read_id}");
    let a = call(&f.app, Method::DELETE, &wrong_tenant, OP, None).await;
    assert_error(&a, StatusCode::NOT_FOUND, "not_found", "key");
    for id in ["tk_00000000000000000000000000000000", "nope"] {
        let a = call(
            &f.app,
            Method::DELETE,
            &format!("/v1/tenants/acme/keys/{id}"),
            OP,
            None,
        )
        .await;
        assert_error(&a, StatusCode::NOT_FOUND, "not_found", id);
    }
    // The write key revokes the read one.
    let a = call(&f.app, Method::DELETE, &uri, &write, None).await;
    assert_eq!(a.status, StatusCode::NO_CONTENT, "{}", a.text);
}

#[tokio::test(start_paused = true)]
async fn the_tenant_routes_need_a_credential_and_name_the_field_at_fault() {
    let f = fixture();
    for (method, uri) in [
        (Method::GET, "/v1/tenants/acme/keys"),
        (Method::POST, "/v1/tenants/acme/keys"),
        (
            Method::DELETE,
            "/v1/tenants/acme/keys/tk_00000000000000000000000000000000",
        ),
        (Method::POST, "/v1/tenants/acme/portal-links"),
        (Method::GET, "/v1/tenants/acme/limits"),
        (Method::PUT, "/v1/tenants/acme/limits"),
    ] {
        let a = send(&f.app, request(method, uri, None, Some("{}"))).await;
        assert_error(&a, StatusCode::UNAUTHORIZED, "unauthorized", "bearer token");
    }
    // Keys of the right shape that are not keys: an unknown id, a wrong secret.
    let (_, key) = issued(&f.app, "acme", "write").await;
    let wrong_secret = format!("{}x", &key[..key.len() - 1]);
    for bad in [
        "hlk_00000000000000000000000000000000_secret".to_owned(),
        wrong_secret,
        "hlk_nothing".to_owned(),
    ] {
        let a = call(&f.app, Method::GET, "/v1/endpoints", &bad, None).await;
        assert_error(&a, StatusCode::UNAUTHORIZED, "unauthorized", "bearer token");
    }
    for (body, field) in [
        (r#"{"scope":"admin"}"#, "scope"),
        (r#"{"name":"ci"}"#, "scope"),
        (r#"{"scope":"read","name":" "}"#, "name: must not be blank"),
        (r#"{"scope":"read","name":42}"#, "name"),
        (r#"{"scope":"read","owner":"x"}"#, "owner"),
    ] {
        let a = call(
            &f.app,
            Method::POST,
            "/v1/tenants/acme/keys",
            OP,
            Some(body),
        )
        .await;
        assert_error(&a, StatusCode::UNPROCESSABLE_ENTITY, "invalid", field);
    }
    let a = call(
        &f.app,
        Method::POST,
        "/v1/tenants/acme/keys",
        OP,
        Some("{no"),
    )
    .await;
    assert_error(&a, StatusCode::BAD_REQUEST, "bad_request", "JSON");
    let a = call(&f.app, Method::GET, "/v1/tenants/a%20b/keys", OP, None).await;
    assert_error(&a, StatusCode::UNPROCESSABLE_ENTITY, "invalid", "tenant");
}

#[tokio::test(start_paused = true)]
async fn portal_links_authenticate_as_their_tenant_until_they_expire() {
    let f = fixture();
    let a = call(
        &f.app,
        Method::POST,
        "/v1/tenants/acme/portal-links",
        OP,
        None,
    )
    .await;
    assert_error(
        &a,
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "portal links",
    );

    let master = MasterKey::generate();
    let app = router(
        f.state
            .clone()
            .with_portal_links(&master, "https://hooks.example.com".into()),
    );
    let before = SystemTime::now();
    let a = call(
        &app,
        Method::POST,
        "/v1/tenants/acme/portal-links",
        OP,
        None,
    )
    .await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text);
    assert_eq!(a.json["scope"], "write");
    let url = a.json["url"].as_str().unwrap();
    let token = url
        .strip_prefix("https://hooks.example.com/portal/#token=")
        .unwrap_or_else(|| panic!("{url}"))
        .to_owned();
    let expires = crate::admin::events::parse_time(a.json["expires_at"].as_str().unwrap()).unwrap();
    let ttl = expires.duration_since(before).unwrap();
    assert!(
        ttl > Duration::from_secs(3590) && ttl <= Duration::from_secs(3600),
        "{ttl:?}"
    );

    // The link acts for acme, with a write scope.
    let ep = create(
        &app,
        &token,
        json!({"url": "https://example.com/p", "event_types": ["*"]}),
    )
    .await;
    assert_eq!(ep.status, StatusCode::CREATED, "{}", ep.text);
    assert_eq!(ep.json["tenant"], "acme");
    let a = create(
        &app,
        &token,
        json!({"tenant": "globex", "url": "https://example.com/p", "event_types": ["*"]}),
    )
    .await;
    assert_error(&a, StatusCode::FORBIDDEN, "forbidden", "tenant");
    // It may not mint a key or a fresh link: it must not outlive its expiry.
    for uri in ["/v1/tenants/acme/keys", "/v1/tenants/acme/portal-links"] {
        let a = call(&app, Method::POST, uri, &token, Some(r#"{"scope":"read"}"#)).await;
        assert_error(&a, StatusCode::FORBIDDEN, "forbidden", "portal link");
    }

    // A read link, made by the tenant itself.
    let body = r#"{"ttl":"10m","scope":"read"}"#;
    let a = call(
        &app,
        Method::POST,
        "/v1/tenants/acme/portal-links",
        ACME,
        Some(body),
    )
    .await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text);
    assert_eq!(a.json["scope"], "read");
    let read = a.json["url"]
        .as_str()
        .unwrap()
        .split("#token=")
        .nth(1)
        .unwrap()
        .to_owned();
    let a = call(&app, Method::GET, "/v1/endpoints", &read, None).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    let a = create(&app, &read, acme_endpoint()).await;
    assert_error(&a, StatusCode::FORBIDDEN, "forbidden", "scope is read");

    // Expired, and forged.
    let expired = PortalSigner::new(&master).issue(&PortalClaims {
        tenant: Tenant::parse("acme").unwrap(),
        scope: Scope::Write,
        expires_at: SystemTime::now() - Duration::from_secs(1),
    });
    let a = call(&app, Method::GET, "/v1/endpoints", &expired, None).await;
    assert_error(
        &a,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "expired; ask for a new link",
    );
    let other_key = PortalSigner::new(&MasterKey::generate()).issue(&PortalClaims {
        tenant: Tenant::parse("acme").unwrap(),
        scope: Scope::Write,
        expires_at: SystemTime::now() + Duration::from_secs(60),
    });
    let mut tampered = token.clone();
    tampered.pop();
    for bad in [other_key, tampered, "hlp_garbage".to_owned()] {
        let a = call(&app, Method::GET, "/v1/endpoints", &bad, None).await;
        assert_error(&a, StatusCode::UNAUTHORIZED, "unauthorized", "not valid");
    }

    for (body, field) in [
        (r#"{"ttl":"25h"}"#, "ttl: must be from 1s to 24h"),
        (r#"{"ttl":"0s"}"#, "ttl"),
        (r#"{"ttl":"soon"}"#, "ttl: must be a duration"),
        (r#"{"scope":"admin"}"#, "scope"),
        (r#"{"tenant":"globex"}"#, "tenant"),
    ] {
        let a = call(
            &app,
            Method::POST,
            "/v1/tenants/acme/portal-links",
            OP,
            Some(body),
        )
        .await;
        assert_error(&a, StatusCode::UNPROCESSABLE_ENTITY, "invalid", field);
    }
}

#[tokio::test(start_paused = true)]
async fn a_tenant_is_refused_above_its_ceilings_which_operators_set() {
    let f = fixture();
    let limits = "/v1/tenants/acme/limits";
    let a = call(&f.app, Method::GET, limits, ACME, None).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    assert_eq!(
        a.json,
        json!({"tenant": "acme", "max_endpoints": null, "max_in_flight": null,
               "rate_limit_per_s": null, "endpoints": 0, "set": {}, "updated_at": null})
    );
    let a = call(&f.app, Method::PUT, limits, ACME, Some("{}")).await;
    assert_error(&a, StatusCode::FORBIDDEN, "forbidden", "operators");
    let body = r#"{"max_endpoints":2,"max_in_flight":16,"rate_limit_per_s":50}"#;
    let a = call(&f.app, Method::PUT, limits, OP, Some(body)).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    assert_eq!(
        (
            &a.json["max_endpoints"],
            &a.json["max_in_flight"],
            &a.json["rate_limit_per_s"]
        ),
        (&json!(2), &json!(16), &json!(50.0))
    );
    assert_eq!(
        a.json["set"],
        json!({"max_endpoints": 2, "max_in_flight": 16, "rate_limit_per_s": 50.0})
    );

    let with = |extra: Value| {
        let mut e = acme_endpoint();
        e.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        e
    };
    let a = create(&f.app, ACME, with(json!({"max_in_flight": 64}))).await;
    assert_error(
        &a,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid",
        "max_in_flight: 64 is above tenant acme's ceiling of 16",
    );
    let a = create(&f.app, ACME, with(json!({"rate_limit_per_s": 100}))).await;
    assert_error(
        &a,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid",
        "rate_limit_per_s: 100 is above tenant acme's ceiling of 50",
    );
    // Left out, the rate ceiling applies; the default concurrency (16) is within its ceiling.
    let a = create(&f.app, ACME, acme_endpoint()).await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text);
    assert_eq!(
        (&a.json["max_in_flight"], &a.json["rate_limit_per_s"]),
        (&Value::Null, &json!(50.0))
    );
    let ep = a.json["id"].as_str().unwrap().to_owned();
    let a = create(
        &f.app,
        ACME,
        with(json!({"max_in_flight": 8, "rate_limit_per_s": 5})),
    )
    .await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text);
    let a = create(&f.app, ACME, acme_endpoint()).await;
    assert_error(
        &a,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid",
        "max_endpoints) of 2",
    );
    // Operators are not held to a tenant's ceilings.
    let a = create(&f.app, OP, with(json!({"max_in_flight": 64}))).await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text);
    assert_eq!(
        a.json["max_in_flight"], 16,
        "what applies is shown: {}",
        a.text
    );

    // Changes: above the ceiling, or clearing the rate limit, are refused.
    let uri = format!("/v1/endpoints/{ep}");
    for (body, needle) in [
        (
            r#"{"max_in_flight":17}"#,
            "max_in_flight: 17 is above tenant acme's ceiling of 16",
        ),
        (
            r#"{"rate_limit_per_s":null}"#,
            "rate_limit_per_s: cannot be cleared",
        ),
        (
            r#"{"rate_limit_per_s":50.5}"#,
            "rate_limit_per_s: 50.5 is above",
        ),
    ] {
        let a = call(&f.app, Method::PATCH, &uri, ACME, Some(body)).await;
        assert_error(&a, StatusCode::UNPROCESSABLE_ENTITY, "invalid", needle);
    }
    let a = call(
        &f.app,
        Method::PATCH,
        &uri,
        ACME,
        Some(r#"{"max_in_flight":12}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);

    // A lowered ceiling lowers what applies to existing endpoints; raised, they get theirs back.
    let a = call(
        &f.app,
        Method::PUT,
        limits,
        OP,
        Some(r#"{"max_in_flight":4}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    assert_eq!(a.json["endpoints"], 3);
    assert_eq!(a.json["set"], json!({"max_in_flight": 4}));
    let a = call(&f.app, Method::GET, &uri, ACME, None).await;
    assert_eq!(
        (&a.json["max_in_flight"], &a.json["rate_limit_per_s"]),
        (&json!(4), &Value::Null)
    );
    let a = call(&f.app, Method::PUT, limits, OP, Some("{}")).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    let a = call(&f.app, Method::GET, &uri, ACME, None).await;
    assert_eq!(a.json["max_in_flight"], 12, "{}", a.text);

    for (body, field) in [
        (r#"{"max_in_flight":0}"#, "max_in_flight: must be between 1"),
        (r#"{"max_in_flight":"many"}"#, "max_in_flight"),
        (r#"{"rate_limit_per_s":-1}"#, "rate_limit_per_s"),
        (r#"{"max_endpoints":-1}"#, "max_endpoints"),
        (r#"{"endpoints":3}"#, "endpoints"),
    ] {
        let a = call(&f.app, Method::PUT, limits, OP, Some(body)).await;
        assert_error(&a, StatusCode::UNPROCESSABLE_ENTITY, "invalid", field);
    }
}
