//! The CQL store's rows for deliveries in every state (schema version 7) against the real
//! server: dead-lettered without an attempt and listed with the dead letters, events fanned out
//! to many endpoints in one batch, and the event index of older versions read alongside.

use std::time::{Duration, SystemTime};

use hookline::dead_reason::DeadReason;
use hookline::id::{DeliveryId, EndpointId, EventId, Tenant};
use hookline::storage::conformance::attempt_row;
use hookline::storage::scylla::DeadLetterQuery;
use hookline::storage::{
    DeliveryNote, DeliveryStatus, DeliveryStore, EventQuery, EventRow, HistoryQuery, NoteKind,
};

use crate::cql_store::cql;

fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

/// Now, at the millisecond precision the CQL store keeps.
fn now_ms() -> SystemTime {
    let ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    SystemTime::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap())
}

fn event(tenant: &Tenant, endpoints: Vec<EndpointId>, received: SystemTime) -> EventRow {
    let event_id = EventId::parse(unique("evt")).unwrap();
    EventRow {
        tenant: tenant.clone(),
        body: bytes::Bytes::from(format!(r#"{{"id":"{event_id}","data":{{}}}}"#)),
        event_id,
        event_type: "order.created".into(),
        occurred_at: received,
        received_at: received,
        fingerprint: "fp".into(),
        endpoints,
    }
}

/// A delivery dead-lettered without an attempt (its endpoint disabled) is in the endpoint's
/// dead letters, as the attempt that dead-letters one puts it there, so DLQ listings and
/// endpoint replays see it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_note_is_a_dead_letter() {
    cql()
        .await
        .run(|c| async move {
            c.migrate().await;
            let store = c.store().await;
            let endpoint = EndpointId::generate();
            let t0 = SystemTime::UNIX_EPOCH + Duration::from_millis(1_800_000_000_250);
            let row = event(&Tenant::parse("acme").unwrap(), vec![endpoint.clone()], t0);
            store.record_event(&row).await.unwrap();
            let delivery_id = DeliveryId::derive(&row.event_id, &endpoint);
            let note = DeliveryNote {
                delivery_id: delivery_id.clone(),
                event_id: row.event_id.clone(),
                endpoint_id: endpoint.clone(),
                tenant: row.tenant.clone(),
                event_type: row.event_type.clone(),
                at: t0 + Duration::from_secs(1),
                kind: NoteKind::Dead {
                    reason: DeadReason::EndpointDisabled,
                },
                replay_id: None,
            };
            store.record_note(&note).await.unwrap();
            let letters = store
                .dead_letters(
                    &endpoint,
                    &DeadLetterQuery {
                        limit: 10,
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
            assert_eq!(letters.items.len(), 1, "{letters:?}");
            let letter = &letters.items[0];
            assert_eq!(letter.delivery_id, delivery_id);
            assert_eq!(letter.reason, DeadReason::EndpointDisabled);
            assert_eq!(letter.attempt, 0, "no attempt was made");
            assert_eq!(letter.last_status, None);
            assert_eq!(letter.dead_at, note.at);
            let history = store
                .endpoint_deliveries(
                    &endpoint,
                    &HistoryQuery {
                        status: Some(DeliveryStatus::Dead),
                        limit: 10,
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
            assert_eq!(history.items.len(), 1);
            assert_eq!(history.items[0].created_at, t0, "listed at its creation");
        })
        .await;
}

/// An event fanned out to many endpoints is one batch for its own partition, and reads back
/// whole: its endpoints, its deliveries, its place in the tenant's events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_with_many_endpoints_is_recorded_whole() {
    cql()
        .await
        .run(|c| async move {
            c.migrate().await;
            let store = c.store().await;
            let tenant = Tenant::parse(unique("tnt")).unwrap();
            let mut endpoints: Vec<EndpointId> = (0..300).map(|_| EndpointId::generate()).collect();
            endpoints.sort();
            let row = event(&tenant, endpoints.clone(), now_ms());
            store.record_event(&row).await.unwrap();
            assert_eq!(
                store.event(&tenant, &row.event_id).await.unwrap(),
                Some(row.clone())
            );
            let deliveries = store.event_deliveries(&row.event_id).await.unwrap();
            assert_eq!(deliveries.len(), 300);
            assert!(
                deliveries
                    .iter()
                    .all(|d| d.status == DeliveryStatus::Pending)
            );
            let page = store
                .events(
                    &tenant,
                    &EventQuery {
                        limit: 10,
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
            assert_eq!(page.items, [row]);
            assert_eq!(page.next_cursor, None);
        })
        .await;
}

/// Attempts no longer write `deliveries_by_event`; an event's deliveries are read from its
/// `events` partition and, for events fanned out before version 7, from the rows attempts
/// wrote there then: both, each delivery once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_deliveries_join_the_event_index_of_older_versions() {
    cql()
        .await
        .run(|c| async move {
            c.migrate().await;
            let store = c.store().await;
            let ks = &c.config.keyspace;
            let (recorded, legacy) = (EndpointId::generate(), EndpointId::generate());
            let tenant = Tenant::parse("acme").unwrap();
            let row = event(&tenant, vec![recorded.clone()], now_ms());
            store.record_event(&row).await.unwrap();
            let mut attempts = vec![];
            for endpoint in [&recorded, &legacy] {
                let mut a = attempt_row(row.event_id.as_str(), endpoint.as_str(), 1);
                a.started_at = row.received_at + Duration::from_millis(5);
                store.record_attempt(&a).await.unwrap();
                attempts.push(a);
            }
            let written: Vec<(String,)> = c
                .session
                .query_unpaged(
                    format!("SELECT delivery_id FROM {ks}.deliveries_by_event WHERE event_id = ?"),
                    (row.event_id.as_str(),),
                )
                .await
                .unwrap()
                .into_rows_result()
                .unwrap()
                .rows::<(String,)>()
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            assert!(written.is_empty(), "attempts write no event index row");
            // As attempts logged before version 7 wrote them: one of a delivery the events
            // partition lists too, one of a delivery only the old index knows.
            for a in &attempts {
                c.session
                    .query_unpaged(
                        format!(
                            "INSERT INTO {ks}.deliveries_by_event (event_id, delivery_id, \
                             endpoint_id) VALUES (?, ?, ?)"
                        ),
                        (
                            a.event_id.as_str(),
                            a.delivery_id.as_str(),
                            a.endpoint_id.as_str(),
                        ),
                    )
                    .await
                    .unwrap();
            }
            let listed = store.event_deliveries(&row.event_id).await.unwrap();
            let mut endpoints: Vec<&EndpointId> = listed.iter().map(|s| &s.endpoint_id).collect();
            endpoints.sort();
            let mut expected = vec![&recorded, &legacy];
            expected.sort();
            assert_eq!(endpoints, expected, "each delivery once");
            assert!(listed.iter().all(|s| s.status == DeliveryStatus::Succeeded));
            let legacy_state = listed.iter().find(|s| s.endpoint_id == legacy).unwrap();
            assert_eq!(
                legacy_state.created_at, attempts[1].started_at,
                "without a creation, created at its first attempt"
            );
        })
        .await;
}
