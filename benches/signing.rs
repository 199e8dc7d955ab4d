//! Signing cost per attempt, against the floor of a plain HMAC-SHA256 + base64 of the same bytes.
//!
//! `cargo bench --bench signing -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
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

criterion_group!(signing, benches);
criterion_main!(signing);
