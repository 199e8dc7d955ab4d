//! Classifying an attempt and scheduling its retry: both run once per attempt on the hot path.

use std::hint::black_box;
use std::time::{Duration, SystemTime};

use criterion::{Criterion, criterion_group, criterion_main};
use hookline::attempt::{AttemptResult, ErrorClass, HttpResponse};
use hookline::retry_policy::{RetryPolicy, classify};
use rand::SeedableRng;
use rand::rngs::StdRng;

fn bench(c: &mut Criterion) {
    let now = SystemTime::now();
    let results = [
        AttemptResult::Response(HttpResponse {
            status: 200,
            retry_after: None,
            body: vec![],
        }),
        AttemptResult::Response(HttpResponse {
            status: 503,
            retry_after: Some("30".into()),
            body: vec![],
        }),
        AttemptResult::Response(HttpResponse {
            status: 429,
            retry_after: Some("Wed, 21 Oct 2026 07:28:00 GMT".into()),
            body: vec![],
        }),
        AttemptResult::Response(HttpResponse {
            status: 410,
            retry_after: None,
            body: vec![],
        }),
        AttemptResult::Failed {
            class: ErrorClass::Timeout,
            detail: String::new(),
        },
    ];
    c.bench_function("classify/5_results", |b| {
        b.iter(|| {
            for r in &results {
                black_box(classify(black_box(r), now));
            }
        })
    });

    let policy = RetryPolicy::default();
    let mut rng = StdRng::seed_from_u64(1);
    let verdict = classify(&results[1], now);
    c.bench_function("decide/retry", |b| {
        b.iter(|| {
            black_box(policy.decide(black_box(verdict), 3, Duration::from_secs(90), &mut rng))
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
