//! A tenant's events: read one by one, and paged newest first with filters, stably while new
//! events arrive.

use std::time::{Duration, SystemTime};

use super::states::event_row;
use super::unique;
use crate::id::{EventId, Tenant};
use crate::storage::{DeliveryStore, EventQuery, EventRow, Page, StoreError};

pub(super) async fn run<S: DeliveryStore + ?Sized>(store: &S) {
    an_event_reads_back_as_recorded(store).await;
    events_page_newest_first_and_stable_under_inserts(store).await;
    events_filter_by_type_and_time(store).await;
}

/// 2027-01-15T08:00:00Z plus `s` seconds.
fn at(s: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s)
}

fn tenant() -> Tenant {
    Tenant::parse(unique("tnt")).expect("valid tenant")
}

async fn an_event_reads_back_as_recorded<S: DeliveryStore + ?Sized>(store: &S) {
    let (acme, globex) = (tenant(), tenant());
    let event = unique("evt");
    let endpoints = [unique("ep"), unique("ep")];
    let mut row = event_row(&acme, &event, "invoice.paid", at(0), &endpoints);
    row.received_at += Duration::from_millis(123);
    // Bodies are bytes as sent, not necessarily UTF-8.
    row.body = bytes::Bytes::from_static(b"\xff\x00{\"not\": \"utf-8\"}");
    store.record_event(&row).await.expect("record event");
    assert_eq!(
        store.event(&acme, &row.event_id).await.unwrap(),
        Some(row.clone()),
        "every field round-trips"
    );
    assert_eq!(
        store.event(&globex, &row.event_id).await.unwrap(),
        None,
        "another tenant's event of the same id is not this one"
    );
    // The same id used by another tenant is its own event.
    let theirs = event_row(&globex, &event, "user.created", at(5), &[unique("ep")]);
    store.record_event(&theirs).await.unwrap();
    assert_eq!(
        store.event(&globex, &row.event_id).await.unwrap(),
        Some(theirs.clone())
    );
    assert_eq!(
        store.event(&acme, &row.event_id).await.unwrap(),
        Some(row.clone())
    );
    assert_eq!(
        store.event_deliveries(&row.event_id).await.unwrap().len(),
        3,
        "every tenant's deliveries of the id"
    );
    let unknown = EventId::parse(unique("evt")).unwrap();
    assert_eq!(store.event(&acme, &unknown).await.unwrap(), None);
}

async fn page<S: DeliveryStore + ?Sized>(
    store: &S,
    tenant: &Tenant,
    query: &EventQuery,
) -> Result<Page<EventRow>, StoreError> {
    store.events(tenant, query).await
}

/// Every event `query` lists, page after page.
async fn every_event<S: DeliveryStore + ?Sized>(
    store: &S,
    tenant: &Tenant,
    query: EventQuery,
) -> Vec<EventId> {
    let mut query = query;
    let mut seen = vec![];
    loop {
        let p = page(store, tenant, &query).await.expect("read events");
        assert!(p.items.len() <= query.limit as usize);
        seen.extend(p.items.into_iter().map(|e| e.event_id));
        match p.next_cursor {
            Some(c) => query.cursor = Some(c),
            None => return seen,
        }
    }
}

async fn events_page_newest_first_and_stable_under_inserts<S: DeliveryStore + ?Sized>(store: &S) {
    let acme = tenant();
    let mut recorded = vec![];
    // Three events a second for about ten seconds, two of them at the very same time: the
    // event id orders those.
    for i in 0..25u64 {
        let row = event_row(
            &acme,
            &unique("evt"),
            "order.created",
            at(i / 3),
            &[unique("ep")],
        );
        store.record_event(&row).await.unwrap();
        recorded.push(row);
    }
    // Newest first: by time, then by id (descending) among events of one time.
    recorded.sort_by(|a, b| (b.received_at, &b.event_id).cmp(&(a.received_at, &a.event_id)));
    let mut query = EventQuery {
        limit: 10,
        ..Default::default()
    };
    let first = page(store, &acme, &query).await.unwrap();
    assert_eq!(first.items.len(), 10);
    assert_eq!(first.items[0], recorded[0], "the newest first, every field");
    // Newer events arriving between pages neither shift nor repeat what follows.
    for i in 0..5u64 {
        let row = event_row(&acme, &unique("evt"), "order.created", at(100 + i), &[]);
        store.record_event(&row).await.unwrap();
    }
    let mut seen: Vec<EventId> = first.items.iter().map(|e| e.event_id.clone()).collect();
    query.cursor = first.next_cursor.clone();
    assert!(query.cursor.is_some(), "more than a page");
    seen.extend(every_event(store, &acme, query).await);
    let expected: Vec<EventId> = recorded.iter().map(|e| e.event_id.clone()).collect();
    assert_eq!(
        seen, expected,
        "paging is complete, ordered and free of duplicates"
    );
    let whole = every_event(
        store,
        &acme,
        EventQuery {
            limit: 500,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        whole.len(),
        30,
        "a fresh listing shows the newer events too"
    );

    let bad = EventQuery {
        cursor: Some("not a cursor".into()),
        limit: 10,
        ..Default::default()
    };
    assert!(
        matches!(page(store, &acme, &bad).await, Err(StoreError::BadCursor)),
        "garbage cursor is refused"
    );
    let nobody = tenant();
    let empty = page(store, &nobody, &EventQuery::default()).await.unwrap();
    assert_eq!(
        empty,
        Page {
            items: vec![],
            next_cursor: None
        }
    );
}

async fn events_filter_by_type_and_time<S: DeliveryStore + ?Sized>(store: &S) {
    let acme = tenant();
    let mut paid = vec![];
    let mut all = vec![];
    for i in 0..12u64 {
        let kind = if i % 3 == 0 {
            "invoice.paid"
        } else {
            "order.created"
        };
        // A minute and a half apart: the listing crosses many minutes.
        let row = event_row(&acme, &unique("evt"), kind, at(i * 90), &[]);
        store.record_event(&row).await.unwrap();
        if kind == "invoice.paid" {
            paid.push(row.event_id.clone());
        }
        all.push(row);
    }
    paid.reverse();
    let by_type = every_event(
        store,
        &acme,
        EventQuery {
            event_type: Some("invoice.paid".into()),
            limit: 2,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(by_type, paid, "type filter, paged");
    // Events received at or after 3 min and before 9 min: those at 3, 4.5, 6 and 7.5 min.
    let window = every_event(
        store,
        &acme,
        EventQuery {
            since: Some(at(180)),
            until: Some(at(540)),
            limit: 3,
            ..Default::default()
        },
    )
    .await;
    let expected: Vec<EventId> = all[2..6].iter().rev().map(|e| e.event_id.clone()).collect();
    assert_eq!(window, expected, "since is inclusive, until exclusive");
    let paid_window = every_event(
        store,
        &acme,
        EventQuery {
            event_type: Some("invoice.paid".into()),
            since: Some(at(100)),
            until: Some(at(900)),
            limit: 10,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        paid_window,
        [
            all[9].event_id.clone(),
            all[6].event_id.clone(),
            all[3].event_id.clone()
        ]
    );
    let none = every_event(
        store,
        &acme,
        EventQuery {
            event_type: Some("nothing.here".into()),
            limit: 10,
            ..Default::default()
        },
    )
    .await;
    assert!(none.is_empty());
}
