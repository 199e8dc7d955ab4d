//! Signing cost per attempt, against the floor of a plain HMAC-SHA256 + base64 of the same bytes.
//!
//! `cargo bench --bench signing -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::time::Instant;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use criterion::{Criterion, Throughput, criterion_group};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use hookline::signing::{
    Ed25519SigningKey, SignedHeaders, Signer, SignerKey, SigningKey, SigningSecret, Verifier,
};

const ID: &str = "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W";
const TS: u64 = 1_674_087_231;

fn body() -> Vec<u8> {
    (0..1024).map(|i| b'a' + (i % 26) as u8).collect()
}

fn signer(keys: &[SigningKey]) -> Signer {
    let keys: Vec<SignerKey> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| SignerKey::new(format!("k{i}"), k.clone()))
        .collect();
    Signer::new(&keys).unwrap()
}

fn benches(c: &mut Criterion) {
    let body = body();
    let secret = SigningSecret::generate();
    let raw_key = {
        let whsec = secret.expose_whsec();
        STANDARD.decode(&whsec["whsec_".len()..]).unwrap()
    };
    let second = SigningKey::Hmac(SigningSecret::generate());
    let hmac = SigningKey::Hmac(secret);
    let ed = SigningKey::Ed25519(Ed25519SigningKey::generate());

    let mut group = c.benchmark_group("signing_1KiB");
    group.throughput(Throughput::Bytes(body.len() as u64));

    // The floor: what a straightforward implementation pays for one v1 signature, given the
    // signed content already in one buffer (building it is not charged to the baseline).
    let content = [ID.as_bytes(), b".", TS.to_string().as_bytes(), b".", &body].concat();
    group.bench_function("baseline_hmac_sha256_base64", |b| {
        b.iter(|| {
            let mut mac = Hmac::<Sha256>::new_from_slice(black_box(&raw_key)).unwrap();
            mac.update(black_box(&content));
            STANDARD.encode(mac.finalize().into_bytes())
        })
    });

    let one = signer(std::slice::from_ref(&hmac));
    group.bench_function("sign_1_secret", |b| {
        b.iter(|| one.sign(black_box(ID), black_box(TS), black_box(&body)))
    });
    let mut buf = String::new();
    group.bench_function("sign_into_1_secret_reused_buffer", |b| {
        b.iter(|| {
            buf.clear();
            one.sign_into(black_box(ID), black_box(TS), black_box(&body), &mut buf);
        })
    });
    let two = signer(&[hmac.clone(), second]);
    group.bench_function("sign_2_secrets", |b| {
        b.iter(|| two.sign(black_box(ID), black_box(TS), black_box(&body)))
    });

    let sig = one.sign(ID, TS, &body);
    let ts = TS.to_string();
    let verifier = Verifier::new(&[hmac.verification_key()]);
    let headers = SignedHeaders {
        id: ID,
        timestamp: &ts,
        signature: &sig,
    };
    group.bench_function("verify_1_secret", |b| {
        b.iter(|| verifier.verify(black_box(&headers), black_box(&body), TS))
    });

    let ed_signer = signer(std::slice::from_ref(&ed));
    group.bench_function("sign_ed25519", |b| {
        b.iter(|| ed_signer.sign(black_box(ID), black_box(TS), black_box(&body)))
    });
    let ed_sig = ed_signer.sign(ID, TS, &body);
    let ed_verifier = Verifier::new(&[ed.verification_key()]);
    let ed_headers = SignedHeaders {
        id: ID,
        timestamp: &ts,
        signature: &ed_sig,
    };
    group.bench_function("verify_ed25519", |b| {
        b.iter(|| ed_verifier.verify(black_box(&ed_headers), black_box(&body), TS))
    });
    group.finish();

    // What the pipeline pays if it rebuilds the Signer per attempt instead of caching it.
    let keys = [SignerKey::new("k", hmac.clone())];
    c.bench_function("signer_new_1_secret", |b| {
        b.iter(|| Signer::new(black_box(&keys)).unwrap())
    });
}

/// Median over short alternating rounds of time(candidate) / time(baseline). On a shared machine
/// the load drifts between criterion's benchmarks, which run one after another; alternating every
/// few hundred microseconds exposes both sides to the same load, so the ratio stays meaningful.
fn interleaved_ratio(mut baseline: impl FnMut(), mut candidate: impl FnMut()) -> f64 {
    const ROUNDS: usize = 301;
    const ITERS: u32 = 100;
    let mut ratios = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let start = Instant::now();
        for _ in 0..ITERS {
            baseline();
        }
        let mid = Instant::now();
        for _ in 0..ITERS {
            candidate();
        }
        let end = Instant::now();
        ratios.push((end - mid).as_secs_f64() / (mid - start).as_secs_f64());
    }
    ratios.sort_by(f64::total_cmp);
    ratios[ROUNDS / 2]
}

fn print_ratios() {
    let body = body();
    let hmac = SigningKey::Hmac(SigningSecret::generate());
    let raw_key = {
        let whsec = hmac.expose();
        STANDARD.decode(&whsec["whsec_".len()..]).unwrap()
    };
    let content = [ID.as_bytes(), b".", TS.to_string().as_bytes(), b".", &body].concat();
    let baseline = || {
        let mut mac = Hmac::<Sha256>::new_from_slice(black_box(&raw_key)).unwrap();
        mac.update(black_box(&content));
        black_box(STANDARD.encode(mac.finalize().into_bytes()));
    };
    let one = signer(std::slice::from_ref(&hmac));
    let two = signer(&[hmac.clone(), SigningKey::Hmac(SigningSecret::generate())]);
    let mut buf = String::new();
    println!("interleaved median ratios to baseline_hmac_sha256_base64 (1 KiB body):");
    let sign_1 = interleaved_ratio(baseline, || {
        black_box(one.sign(black_box(ID), black_box(TS), black_box(&body)));
    });
    println!("  sign_1_secret                     {sign_1:.2}x");
    let sign_into = interleaved_ratio(baseline, || {
        buf.clear();
        one.sign_into(black_box(ID), black_box(TS), black_box(&body), &mut buf);
    });
    println!("  sign_into_1_secret_reused_buffer  {sign_into:.2}x");
    let sign_2 = interleaved_ratio(baseline, || {
        black_box(two.sign(black_box(ID), black_box(TS), black_box(&body)));
    });
    println!("  sign_2_secrets                    {sign_2:.2}x");
}

criterion_group!(signing, benches);

fn main() {
    signing();
    Criterion::default().configure_from_args().final_summary();
    // `cargo test --benches` runs this binary without `--bench`: only criterion's smoke run then.
    if std::env::args().any(|a| a == "--bench") {
        print_ratios();
    }
}
