//! The offset tracker runs once per consumed record (track) and once per completion (settle) on
//! every partition: it must stay O(1) amortised when records settle roughly in order, and cheap
//! when a slow head holds many settled successors.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use hookline::offsets::OffsetTracker;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

const N: i64 = 10_048; // a multiple of 64

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("offsets");
    group.throughput(Throughput::Elements(N as u64));

    group.bench_function("track_then_settle_in_order/10k", |b| {
        b.iter(|| {
            let mut t = OffsetTracker::new();
            for o in 0..N {
                t.track(o).unwrap();
                black_box(t.settle(o).unwrap());
            }
            black_box(t.committable())
        })
    });

    // 64 in flight at a time, completing in a shuffled order within each batch: the shape of a
    // partition dispatching to many lanes.
    let mut rng = StdRng::seed_from_u64(7);
    let batches: Vec<Vec<i64>> = (0..N / 64)
        .map(|b| {
            let mut batch: Vec<i64> = (b * 64..(b + 1) * 64).collect();
            batch.shuffle(&mut rng);
            batch
        })
        .collect();
    group.bench_function("settle_shuffled_batches_of_64/10k", |b| {
        b.iter(|| {
            let mut t = OffsetTracker::new();
            for (i, batch) in batches.iter().enumerate() {
                let first = i as i64 * 64;
                for o in first..first + 64 {
                    t.track(o).unwrap();
                }
                for &o in batch {
                    black_box(t.settle(o).unwrap());
                }
            }
            black_box(t.committable())
        })
    });

    // A slow head: offset 0 stays unsettled while 10k successors settle behind it.
    group.bench_function("settle_behind_a_slow_head/10k", |b| {
        b.iter_batched(
            || {
                let mut t = OffsetTracker::new();
                for o in 0..=N {
                    t.track(o).unwrap();
                }
                t
            },
            |mut t| {
                for o in (1..=N).rev() {
                    t.settle(o).unwrap();
                }
                black_box(t.settle(0).unwrap())
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
