use std::time::Duration;

use proptest::prelude::*;

use super::*;

// The published Standard Webhooks test vector.
const VECTOR_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const VECTOR_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const VECTOR_TS: u64 = 1_614_265_330;
const VECTOR_BODY: &[u8] = br#"{"test": 2432232314}"#;
const VECTOR_SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

fn signer(keys: &[SigningKey]) -> Signer {
    let keys: Vec<SignerKey> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| SignerKey::new(format!("k{i}"), k.clone()))
        .collect();
    Signer::new(&keys).unwrap()
}

fn verifier(keys: &[SigningKey]) -> Verifier {
    let keys: Vec<VerificationKey> = keys.iter().map(SigningKey::verification_key).collect();
    Verifier::new(&keys)
}

fn headers<'a>(id: &'a str, ts: &'a str, sig: &'a str) -> SignedHeaders<'a> {
    SignedHeaders {
        id,
        timestamp: ts,
        signature: sig,
    }
}

fn vector_key() -> SigningKey {
    VECTOR_SECRET.parse().unwrap()
}

#[test]
fn signs_the_published_test_vector() {
    let signer = signer(&[vector_key()]);
    assert_eq!(signer.sign(VECTOR_ID, VECTOR_TS, VECTOR_BODY), VECTOR_SIG);
    let h = signer.headers(VECTOR_ID, VECTOR_TS, VECTOR_BODY);
    let pairs: Vec<_> = h.iter().collect();
    assert_eq!(
        pairs,
        [
            ("webhook-id", VECTOR_ID),
            ("webhook-timestamp", "1614265330"),
            ("webhook-signature", VECTOR_SIG),
        ]
    );
}

#[test]
fn verifies_the_published_test_vector() {
    let v = verifier(&[vector_key()]);
    let h = headers(VECTOR_ID, "1614265330", VECTOR_SIG);
    assert_eq!(v.verify(&h, VECTOR_BODY, VECTOR_TS), Ok(()));
    assert_eq!(
        v.verify(&h, br#"{"test": 2432232315}"#, VECTOR_TS),
        Err(VerifyError::NoMatch)
    );
}

#[test]
fn sign_into_appends_to_a_reused_buffer() {
    let signer = signer(&[vector_key()]);
    let mut out = String::from("prefix:");
    signer.sign_into(VECTOR_ID, VECTOR_TS, VECTOR_BODY, &mut out);
    assert_eq!(out, format!("prefix:{VECTOR_SIG}"));
}

#[test]
fn timestamp_digits_cover_the_edges() {
    let mut buf = [0u8; 20];
    for n in [0, 9, 10, 1_614_265_330, u64::MAX] {
        assert_eq!(timestamp_digits(n, &mut buf), n.to_string().as_bytes());
    }
}

#[test]
fn rotation_signs_with_every_key_and_either_verifies() {
    let old = SigningKey::Hmac(SigningSecret::generate());
    let new = SigningKey::Hmac(SigningSecret::generate());
    let sig = signer(&[new.clone(), old.clone()]).sign("msg_1", 1000, b"body");
    let parts: Vec<&str> = sig.split(' ').collect();
    assert_eq!(parts.len(), 2);
    assert!(parts.iter().all(|p| p.starts_with("v1,") && p.len() == 47));
    for key in [&old, &new] {
        let v = verifier(std::slice::from_ref(key));
        assert_eq!(
            v.verify(&headers("msg_1", "1000", &sig), b"body", 1000),
            Ok(())
        );
    }
    let stranger = verifier(&[SigningKey::Hmac(SigningSecret::generate())]);
    assert_eq!(
        stranger.verify(&headers("msg_1", "1000", &sig), b"body", 1000),
        Err(VerifyError::NoMatch)
    );
}

#[test]
fn signer_filters_keys_by_expiry() {
    let a = SignerKey::new("old", SigningSecret::generate()).expiring_at(100);
    let b = SignerKey::new("new", SigningSecret::generate());
    let keys = [a, b];
    let at_99: Vec<_> = Signer::active_at(&keys, 99)
        .unwrap()
        .key_ids()
        .map(str::to_owned)
        .collect();
    assert_eq!(at_99, ["old", "new"]);
    let at_100: Vec<_> = Signer::active_at(&keys, 100)
        .unwrap()
        .key_ids()
        .map(str::to_owned)
        .collect();
    assert_eq!(at_100, ["new"]);
    assert_eq!(Signer::active_at(&keys[..1], 100).unwrap_err(), NoActiveKey);
    assert_eq!(Signer::new(&[]).unwrap_err(), NoActiveKey);
}

#[test]
fn tolerance_holds_at_the_bounds_in_both_directions() {
    let key = vector_key();
    let v = verifier(std::slice::from_ref(&key)).with_tolerance(Duration::from_secs(300));
    let sig = signer(&[key]).sign("msg", 10_000, b"x");
    let check = |now| v.verify(&headers("msg", "10000", &sig), b"x", now);
    assert_eq!(check(10_000), Ok(()));
    assert_eq!(check(10_300), Ok(()));
    assert_eq!(check(9_700), Ok(()));
    assert_eq!(
        check(10_301),
        Err(VerifyError::Stale {
            age_secs: 301,
            tolerance_secs: 300
        })
    );
    assert_eq!(
        check(9_699),
        Err(VerifyError::Future {
            ahead_secs: 301,
            tolerance_secs: 300
        })
    );
    assert_eq!(Verifier::new(&[]).tolerance(), DEFAULT_TOLERANCE);
}

#[test]
fn timestamp_is_checked_before_signatures() {
    let v = verifier(&[vector_key()]);
    let err = v
        .verify(&headers("msg", "1", "v1,garbage"), b"", 1_000_000)
        .unwrap_err();
    assert!(matches!(err, VerifyError::Stale { .. }), "{err:?}");
}

#[test]
fn unknown_versions_are_skipped() {
    let v = verifier(&[vector_key()]);
    let sig = format!("v2,AAAA v0,whatever {VECTOR_SIG} v9");
    assert_eq!(
        v.verify(
            &headers(VECTOR_ID, "1614265330", &sig),
            VECTOR_BODY,
            VECTOR_TS
        ),
        Ok(())
    );
    assert_eq!(
        v.verify(
            &headers(VECTOR_ID, "1614265330", "v2,AAAA"),
            VECTOR_BODY,
            VECTOR_TS
        ),
        Err(VerifyError::NoMatch)
    );
}

#[test]
fn malformed_headers_are_reported() {
    let v = verifier(&[vector_key()]);
    let check =
        |id: &str, ts: &str, sig: &str| v.verify(&headers(id, ts, sig), VECTOR_BODY, VECTOR_TS);
    assert_eq!(
        check("", "1614265330", VECTOR_SIG),
        Err(VerifyError::MissingHeader(HEADER_ID))
    );
    assert_eq!(
        check(VECTOR_ID, "", VECTOR_SIG),
        Err(VerifyError::MissingHeader(HEADER_TIMESTAMP))
    );
    assert_eq!(
        check(VECTOR_ID, "1614265330", ""),
        Err(VerifyError::MissingHeader(HEADER_SIGNATURE))
    );
    for ts in [
        "01614265330",
        "1614265330.0",
        "-1",
        "+1614265330",
        "abc",
        " 1",
    ] {
        assert_eq!(
            check(VECTOR_ID, ts, VECTOR_SIG),
            Err(VerifyError::BadFormat(FormatError::Timestamp)),
            "{ts}"
        );
    }
    let bad = |sig: &str| check(VECTOR_ID, "1614265330", sig);
    assert_eq!(bad("v1"), Err(FormatError::Entry.into()));
    assert_eq!(
        bad("v1,not*base64"),
        Err(FormatError::Base64 { version: "v1" }.into())
    );
    assert_eq!(
        bad("v1,AAAA"),
        Err(FormatError::Length {
            version: "v1",
            len: 3,
            expected: 32
        }
        .into())
    );
    assert!(matches!(
        bad(&format!("v1,{}", "A".repeat(200))),
        Err(VerifyError::BadFormat(FormatError::Length { .. }))
    ));
    // A malformed entry does not veto a good one.
    assert_eq!(bad(&format!("v1 v1,AAAA  {VECTOR_SIG}")), Ok(()));
    assert_eq!(
        bad(&"v2,x ".repeat(40)),
        Err(VerifyError::BadFormat(FormatError::TooMany))
    );
}

#[test]
fn headers_come_from_a_lookup() {
    let v = verifier(&[vector_key()]);
    let lookup = |name: &str| match name {
        "webhook-id" => Some(VECTOR_ID),
        "webhook-timestamp" => Some("1614265330"),
        "webhook-signature" => Some(VECTOR_SIG),
        _ => None,
    };
    assert_eq!(v.verify_lookup(lookup, VECTOR_BODY, VECTOR_TS), Ok(()));
    let no_sig = |name: &str| (name != HEADER_SIGNATURE).then_some("1614265330");
    assert_eq!(
        v.verify_lookup(no_sig, VECTOR_BODY, VECTOR_TS),
        Err(VerifyError::MissingHeader(HEADER_SIGNATURE))
    );
}

#[test]
fn one_shot_verify_matches_the_verifier() {
    let keys = [vector_key().verification_key()];
    let h = headers(VECTOR_ID, "1614265330", VECTOR_SIG);
    assert_eq!(
        verify(&h, VECTOR_BODY, &keys, DEFAULT_TOLERANCE, VECTOR_TS + 300),
        Ok(())
    );
    assert!(verify(&h, VECTOR_BODY, &keys, DEFAULT_TOLERANCE, VECTOR_TS + 301).is_err());
}

#[test]
fn ed25519_signs_and_verifies_alone_and_mixed() {
    let ed = SigningKey::Ed25519(Ed25519SigningKey::generate());
    let hmac = vector_key();
    let sig = signer(&[hmac.clone(), ed.clone()]).sign("msg_e", 42, b"payload");
    let parts: Vec<&str> = sig.split(' ').collect();
    assert!(parts[0].starts_with("v1,"));
    assert!(parts[1].starts_with("v1a,") && parts[1].len() == 92);

    let h = headers("msg_e", "42", &sig);
    assert_eq!(
        verifier(std::slice::from_ref(&ed)).verify(&h, b"payload", 42),
        Ok(())
    );
    assert_eq!(
        verifier(std::slice::from_ref(&hmac)).verify(&h, b"payload", 42),
        Ok(())
    );
    assert_eq!(
        verifier(std::slice::from_ref(&ed)).verify(&h, b"payloae", 42),
        Err(VerifyError::NoMatch)
    );
    let other = SigningKey::Ed25519(Ed25519SigningKey::generate());
    assert_eq!(
        verifier(&[other]).verify(&h, b"payload", 42),
        Err(VerifyError::NoMatch)
    );
    // Only the v1a entry, verified through the whpk_ string form.
    let SigningKey::Ed25519(ed_key) = &ed else {
        unreachable!()
    };
    let whpk = ed_key.verifying_key().to_string();
    assert!(whpk.starts_with("whpk_"));
    let pk: VerificationKey = whpk.parse().unwrap();
    assert_eq!(
        Verifier::new(&[pk]).verify(&headers("msg_e", "42", parts[1]), b"payload", 42),
        Ok(())
    );
}

#[test]
fn ed25519_keys_round_trip_through_strings() {
    let key = Ed25519SigningKey::generate();
    let whsk = key.expose_whsk();
    assert!(whsk.starts_with("whsk_"));
    let back: Ed25519SigningKey = whsk.parse().unwrap();
    assert_eq!(back.verifying_key(), key.verifying_key());
    assert_eq!(back.fingerprint(), key.verifying_key().fingerprint());

    // A bare 32-byte seed is accepted and yields the same key pair.
    use base64::Engine as _;
    let pair = base64::engine::general_purpose::STANDARD
        .decode(&whsk["whsk_".len()..])
        .unwrap();
    let seed_form = format!(
        "whsk_{}",
        base64::engine::general_purpose::STANDARD.encode(&pair[..32])
    );
    let from_seed: Ed25519SigningKey = seed_form.parse().unwrap();
    assert_eq!(from_seed.verifying_key(), key.verifying_key());

    // A key pair whose halves disagree is refused.
    let mut bad = pair.clone();
    bad[40] ^= 1;
    let bad = format!(
        "whsk_{}",
        base64::engine::general_purpose::STANDARD.encode(&bad)
    );
    assert_eq!(
        bad.parse::<Ed25519SigningKey>().unwrap_err(),
        KeyParseError::KeypairMismatch
    );
    // whsk_ is accepted where a verification key is expected, reduced to its public half.
    let vk: VerificationKey = whsk.parse().unwrap();
    assert!(matches!(vk, VerificationKey::Ed25519(pk) if pk == key.verifying_key()));
}

#[test]
fn secrets_round_trip_and_generate_32_bytes() {
    let secret = SigningSecret::generate();
    let whsec = secret.expose_whsec();
    assert!(whsec.starts_with("whsec_"));
    assert_eq!(whsec.len(), "whsec_".len() + 44);
    let back: SigningSecret = whsec.parse().unwrap();
    assert_eq!(back.expose_whsec(), whsec);
    assert_ne!(
        SigningSecret::generate().expose_whsec(),
        whsec,
        "the RNG repeated itself"
    );
    // Unpadded base64 (as some senders write it) is read too.
    let unpadded = whsec.trim_end_matches('=');
    assert_eq!(
        unpadded.parse::<SigningSecret>().unwrap().expose_whsec(),
        whsec
    );
}

#[test]
fn key_parse_errors_say_what_is_wrong_without_the_key() {
    let cases: [(&str, &str); 7] = [
        (
            "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "secret must start with whsec_ or whsk_",
        ),
        (
            "whsec_MfKQ9r8GKYqrTwjU",
            "secret decodes to 12 bytes; at least 24 are required",
        ),
        (
            "whsec_MfKQ9r8G*YqrTwjUPD8ILPZIo2LaLaSw",
            "secret is not valid base64 after its whsec_ prefix",
        ),
        (
            "whsk_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "whsk_ key decodes to 24 bytes; 32 (seed) or 64 (key pair) are expected",
        ),
        (
            "whpk_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "secret must start with whsec_ or whsk_",
        ),
        (
            "whsec_",
            "secret decodes to 0 bytes; at least 24 are required",
        ),
        ("", "secret must start with whsec_ or whsk_"),
    ];
    for (input, message) in cases {
        let err = input.parse::<SigningKey>().unwrap_err().to_string();
        assert_eq!(err, message, "{input}");
        let b64 = input.split('_').nth(1).unwrap_or(input);
        assert!(b64.len() < 8 || !err.contains(b64), "{err} echoes the key");
    }
    assert_eq!(
        "whpk_AAAA"
            .parse::<VerificationKey>()
            .unwrap_err()
            .to_string(),
        "whpk_ key decodes to 3 bytes; 32 are expected"
    );
    assert_eq!(
        "whsk_x".parse::<VerificationKey>().unwrap_err(),
        KeyParseError::NotBase64 { prefix: "whsk_" }
    );
    assert_eq!(
        "nope".parse::<VerificationKey>().unwrap_err().to_string(),
        "secret must start with whsec_ or whpk_"
    );
}

#[test]
fn debug_and_display_never_show_key_material() {
    let secret = SigningSecret::generate();
    let ed = Ed25519SigningKey::generate();
    let whsec = secret.expose_whsec();
    let whsk = ed.expose_whsk();
    let hmac_b64 = &whsec["whsec_".len()..];
    let ed_b64 = &whsk["whsk_".len()..];
    let seed_b64 = &ed_b64[..40];
    let signer_keys = [
        SignerKey::new("hmac-key", secret.clone()),
        SignerKey::new("ed-key", ed.clone()),
    ];
    let rendered = [
        format!("{secret:?}"),
        format!("{secret}"),
        format!("{ed:?}"),
        format!("{ed}"),
        format!("{:?}", SigningKey::Hmac(secret.clone())),
        format!("{}", SigningKey::Ed25519(ed.clone())),
        format!("{:?}", VerificationKey::Hmac(secret.clone())),
        format!("{signer_keys:?}"),
        format!("{:?}", Signer::new(&signer_keys).unwrap()),
        format!(
            "{:?}",
            Verifier::new(&[VerificationKey::Hmac(secret.clone())])
        ),
    ];
    for text in &rendered {
        assert!(!text.contains(hmac_b64), "{text}");
        assert!(!text.contains(seed_b64), "{text}");
        assert!(!text.contains(&hmac_b64[..12]), "{text}");
    }
    assert!(rendered[0].contains(&secret.fingerprint()));
    assert!(rendered[8].contains("hmac-key") && rendered[8].contains("ed-key"));
}

fn any_key() -> impl Strategy<Value = SigningKey> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 24..80)
            .prop_map(|b| SigningKey::Hmac(SigningSecret::from_bytes(&b).unwrap())),
        any::<[u8; 32]>().prop_map(|seed| {
            use base64::Engine as _;
            let s = format!(
                "whsk_{}",
                base64::engine::general_purpose::STANDARD.encode(seed)
            );
            SigningKey::Ed25519(s.parse().unwrap())
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn sign_then_verify_round_trips(
        keys in prop::collection::vec(any_key(), 1..4),
        id in "[A-Za-z0-9_-]{1,40}",
        ts in 0u64..=u64::MAX / 2,
        body in prop::collection::vec(any::<u8>(), 0..2048),
        pick in any::<prop::sample::Index>(),
    ) {
        let sig = signer(&keys).sign(&id, ts, &body);
        let ts_str = ts.to_string();
        let h = headers(&id, &ts_str, &sig);
        // Any single key of the set verifies on its own.
        let one = pick.get(&keys);
        prop_assert_eq!(verifier(std::slice::from_ref(one)).verify(&h, &body, ts), Ok(()));
        prop_assert_eq!(verifier(&keys).verify(&h, &body, ts), Ok(()));
    }

    #[test]
    fn flipping_any_body_byte_fails(
        key in any_key(),
        body in prop::collection::vec(any::<u8>(), 1..1024),
        at in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        let sig = signer(std::slice::from_ref(&key)).sign("msg_p", 7, &body);
        let mut tampered = body.clone();
        tampered[at.index(body.len())] ^= 1 << bit;
        prop_assert_eq!(
            verifier(&[key]).verify(&headers("msg_p", "7", &sig), &tampered, 7),
            Err(VerifyError::NoMatch)
        );
    }

    #[test]
    fn changing_id_or_timestamp_fails(
        key in any_key(),
        body in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        let sig = signer(std::slice::from_ref(&key)).sign("msg_a", 100, &body);
        let v = verifier(&[key]);
        prop_assert_eq!(v.verify(&headers("msg_b", "100", &sig), &body, 100), Err(VerifyError::NoMatch));
        prop_assert_eq!(v.verify(&headers("msg_a", "101", &sig), &body, 100), Err(VerifyError::NoMatch));
    }
}
