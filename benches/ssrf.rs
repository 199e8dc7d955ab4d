//! How long the SSRF policy takes to decide a resolved address list (it runs on every attempt).

use std::hint::black_box;
use std::net::IpAddr;

use criterion::{Criterion, criterion_group, criterion_main};
use hookline::ssrf::Policy;

fn addresses() -> Vec<IpAddr> {
    [
        "93.184.216.34",
        "10.0.0.1",
        "169.254.169.254",
        "203.0.114.7",
        "2606:4700::1111",
        "fd00::1",
        "::ffff:192.168.1.1",
        "64:ff9b::808:808",
    ]
    .iter()
    .map(|s| s.parse().unwrap())
    .collect()
}

fn check_list(c: &mut Criterion) {
    let addrs = addresses();
    let default = Policy::new();
    let allowing = Policy::with_allowed([
        "10.0.0.0/8".parse().unwrap(),
        "192.168.0.0/16".parse().unwrap(),
        "fd00::/8".parse().unwrap(),
    ]);
    c.bench_function("check 8 mixed addresses, default policy", |b| {
        b.iter(|| {
            black_box(&addrs)
                .iter()
                .filter(|&&a| default.check(a).is_ok())
                .count()
        })
    });
    c.bench_function("check 8 mixed addresses, 3 allowed CIDRs", |b| {
        b.iter(|| {
            black_box(&addrs)
                .iter()
                .filter(|&&a| allowing.check(a).is_ok())
                .count()
        })
    });
    let public: IpAddr = "93.184.216.34".parse().unwrap();
    c.bench_function("check 1 public v4 address", |b| {
        b.iter(|| default.check(black_box(public)).is_ok())
    });
}

criterion_group!(benches, check_list);
criterion_main!(benches);
