//! The fan-out's per-event work: finding the subscribed endpoints and building the body once.

use std::hint::black_box;
use std::time::SystemTime;

use criterion::{Criterion, criterion_group, criterion_main};
use hookline::event_type::EventType;
use hookline::id::{EndpointId, EventId, Tenant};
use hookline::input::InputEvent;
use hookline::subscription::{SubscriptionIndex, parse_filters};
use serde_json::value::RawValue;

fn bench(c: &mut Criterion) {
    // 1,000 endpoints in one tenant: a third exact, a third prefix, a few match-all, the rest on
    // types this event does not have; plus another tenant of the same size that must be skipped.
    let tenant = Tenant::parse("acme").unwrap();
    let other = Tenant::parse("globex").unwrap();
    let mut index = SubscriptionIndex::new();
    for i in 0..1_000 {
        let patterns: &[&str] = match i % 10 {
            0..=2 => &["order.created"],
            3..=5 => &["order.*", "invoice.paid"],
            6 => &["*"],
            _ => &["user.signed_up", "user.*"],
        };
        let filters = parse_filters(patterns).unwrap();
        index.upsert(
            EndpointId::parse(format!("ep_{i:05}")).unwrap(),
            tenant.clone(),
            filters.clone(),
            true,
        );
        index.upsert(
            EndpointId::parse(format!("ep_x{i:05}")).unwrap(),
            other.clone(),
            filters,
            true,
        );
    }
    c.bench_function("matching/1000_endpoints_700_match", |b| {
        b.iter(|| index.matching(black_box(&tenant), black_box("order.created")))
    });
    c.bench_function("matching_refs/1000_endpoints_700_match", |b| {
        b.iter(|| index.matching_refs(black_box(&tenant), black_box("order.created")))
    });
    c.bench_function("matching/1000_endpoints_none_match", |b| {
        b.iter(|| index.matching(black_box(&tenant), black_box("billing.cycle.closed")))
    });

    let data = format!(r#"{{"blob":"{}"}}"#, "x".repeat(1024 - 11));
    let event = InputEvent {
        id: EventId::parse("evt_01HZX3Q9").unwrap(),
        tenant,
        event_type: EventType::parse("order.created").unwrap(),
        occurred_at: SystemTime::now(),
        payload: RawValue::from_string(data).unwrap(),
    };
    c.bench_function("body/1KiB", |b| b.iter(|| black_box(&event).body_bytes()));
}

criterion_group!(benches, bench);
criterion_main!(benches);
