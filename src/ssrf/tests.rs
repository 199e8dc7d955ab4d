use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;
use url::Url;

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn name_of(policy: &Policy, s: &str) -> Option<&'static str> {
    policy.check(ip(s)).err().map(|b| b.range_name)
}

#[test]
fn default_policy_blocks_every_listed_range() {
    let p = Policy::new();
    for (addr, name) in [
        ("0.0.0.0", "unspecified"),
        ("0.1.2.3", "unspecified"),
        ("10.0.0.1", "private"),
        ("100.64.0.1", "cgnat"),
        ("100.127.255.255", "cgnat"),
        ("127.0.0.1", "loopback"),
        ("127.255.255.254", "loopback"),
        ("169.254.169.254", "link_local"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.0.0.8", "ietf_protocol"),
        ("192.0.2.1", "documentation"),
        ("192.168.1.1", "private"),
        ("198.18.0.1", "benchmarking"),
        ("198.19.255.255", "benchmarking"),
        ("198.51.100.7", "documentation"),
        ("203.0.113.9", "documentation"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "broadcast"),
        ("::", "unspecified"),
        ("::1", "loopback"),
        ("::7f00:1", "ipv4_compatible"),
        ("::ffff:0:a00:1", "ipv4_translated"),
        ("64:ff9b:1::a00:1", "nat64_local"),
        ("100::1", "discard_only"),
        ("2001:2::1", "benchmarking"),
        ("2001:db8::1", "documentation"),
        ("fc00::1", "unique_local"),
        ("fd00::1", "unique_local"),
        ("fe80::1", "link_local"),
        ("fec0::1", "site_local"),
        ("ff02::1", "multicast"),
    ] {
        assert_eq!(name_of(&p, addr), Some(name), "{addr}");
    }
}

#[test]
fn public_addresses_pass() {
    let p = Policy::new();
    for addr in [
        "1.1.1.1",
        "8.8.8.8",
        "93.184.216.34",
        "100.63.255.255",
        "100.128.0.0",
        "172.15.255.255",
        "172.32.0.0",
        "192.0.1.1",
        "198.17.255.255",
        "198.20.0.0",
        "223.255.255.255",
        "2606:4700::1111",
        "2a00:1450:4001::200e",
        "::ffff:8.8.8.8",
        "64:ff9b::808:808",
        "2002:808:808::1",
    ] {
        assert_eq!(p.check(ip(addr)), Ok(()), "{addr}");
    }
}

#[test]
fn embedded_ipv4_forms_are_unwrapped() {
    let p = Policy::new();
    let b = p.check(ip("::ffff:127.0.0.1")).unwrap_err();
    assert_eq!(b.range_name, "loopback");
    assert_eq!(
        b.embedded,
        Some((Embedding::Ipv4Mapped, Ipv4Addr::new(127, 0, 0, 1)))
    );

    let b = p.check(ip("64:ff9b::a9fe:a9fe")).unwrap_err();
    assert_eq!(b.range_name, "link_local");
    assert_eq!(
        b.embedded,
        Some((Embedding::Nat64, Ipv4Addr::new(169, 254, 169, 254)))
    );

    let b = p.check(ip("2002:c0a8:0101::1")).unwrap_err();
    assert_eq!(b.range_name, "private");
    assert_eq!(
        b.embedded,
        Some((Embedding::SixToFour, Ipv4Addr::new(192, 168, 1, 1)))
    );

    // Teredo: server 10.0.0.1, client 8.8.8.8 (stored inverted).
    let server = p.check(ip("2001:0:a00:1::f7f7:f7f7")).unwrap_err();
    assert_eq!(server.embedded.unwrap().0, Embedding::TeredoServer);
    // Teredo: server 8.8.8.8, client 127.0.0.1 (inverted: 80ff:fffe).
    let client = p.check(ip("2001:0:808:808::80ff:fffe")).unwrap_err();
    assert_eq!(
        client.embedded,
        Some((Embedding::TeredoClient, Ipv4Addr::new(127, 0, 0, 1)))
    );
    assert_eq!(p.check(ip("2001:0:808:808::f7f7:f7f7")), Ok(()));
}

#[test]
fn allowed_cidrs_override_the_block_list() {
    let p = Policy::with_allowed(["127.0.0.1/32".parse().unwrap(), "fd00::/8".parse().unwrap()]);
    assert_eq!(p.check(ip("127.0.0.1")), Ok(()));
    assert_eq!(p.check(ip("::ffff:127.0.0.1")), Ok(()));
    assert_eq!(p.check(ip("64:ff9b::7f00:1")), Ok(()));
    assert_eq!(p.check(ip("fd00::1")), Ok(()));
    assert_eq!(name_of(&p, "127.0.0.2"), Some("loopback"));
    assert_eq!(name_of(&p, "::1"), Some("loopback"));
    // 6to4 reaches through a relay, so allowing the inner address does not allow it.
    assert_eq!(name_of(&p, "2002:7f00:1::"), Some("loopback"));
    // Host bits in an allowed CIDR are ignored rather than narrowing it to nothing.
    let p = Policy::with_allowed(["10.1.2.3/16".parse().unwrap()]);
    assert_eq!(p.check(ip("10.1.200.1")), Ok(()));
}

#[test]
fn blocked_display_names_the_range_and_embedding() {
    let p = Policy::new();
    assert_eq!(
        p.check(ip("169.254.169.254")).unwrap_err().to_string(),
        "169.254.169.254 is in blocked range link_local (169.254.0.0/16)"
    );
    assert_eq!(
        p.check(ip("64:ff9b::a00:1")).unwrap_err().to_string(),
        "64:ff9b::a00:1 embeds 10.0.0.1 (nat64), which is in blocked range private (10.0.0.0/8)"
    );
}

#[test]
fn url_crate_normalises_legacy_ipv4_spellings() {
    let p = Policy::new();
    for (raw, normal) in [
        ("https://2130706433/", "127.0.0.1"),
        ("https://0x7f000001/", "127.0.0.1"),
        ("https://0x7f.0.0.1/", "127.0.0.1"),
        ("https://0177.0.0.1/", "127.0.0.1"),
        ("https://017700000001/", "127.0.0.1"),
        ("https://127.1/", "127.0.0.1"),
        ("https://127.0.1/", "127.0.0.1"),
        ("https://0/", "0.0.0.0"),
        ("https://0xa9.0xfe.0xa9.0xfe/", "169.254.169.254"),
        ("https://0251.0376.0251.0376/", "169.254.169.254"),
        ("https://2852039166/", "169.254.169.254"),
        ("https://10.1/", "10.0.0.1"),
        ("https://[::ffff:10.0.0.1]/", "[::ffff:a00:1]"),
        ("https://[0:0:0:0:0:ffff:7f00:1]/", "[::ffff:7f00:1]"),
    ] {
        let url = Url::parse(raw).unwrap();
        assert_eq!(url.host_str(), Some(normal), "{raw}");
        assert!(
            matches!(p.check_url(&url), Err(UrlError::Blocked(_))),
            "{raw}"
        );
    }
}

#[test]
fn check_url_lets_names_through_to_the_resolver() {
    let p = Policy::new();
    for raw in [
        "https://example.com/",
        "https://localhost/",
        "https://internal./",
    ] {
        assert_eq!(p.check_url(&Url::parse(raw).unwrap()), Ok(()), "{raw}");
    }
}

#[test]
fn scheme_rules() {
    let u = |s: &str| Url::parse(s).unwrap();
    assert_eq!(check_scheme(&u("https://example.com/"), false), Ok(()));
    assert_eq!(
        check_scheme(&u("http://example.com/"), false),
        Err(UrlError::InsecureScheme)
    );
    assert_eq!(check_scheme(&u("http://example.com/"), true), Ok(()));
    assert_eq!(
        check_scheme(&u("ftp://example.com/"), true)
            .unwrap_err()
            .class(),
        ErrorClass::InvalidUrl
    );
    assert_eq!(
        check_scheme(&u("file:///etc/passwd"), true)
            .unwrap_err()
            .class(),
        ErrorClass::InvalidUrl
    );
}

proptest! {
    /// Whatever std itself recognises as non-public must be blocked.
    #[test]
    fn std_special_v4_is_blocked(bits in any::<u32>()) {
        let a = Ipv4Addr::from_bits(bits);
        let special = a.is_private() || a.is_loopback() || a.is_link_local() || a.is_broadcast()
            || a.is_documentation() || a.is_unspecified() || a.is_multicast()
            || a.octets()[0] == 0 || a.octets()[0] >= 240;
        if special {
            prop_assert!(Policy::new().check(IpAddr::V4(a)).is_err());
        }
    }

    #[test]
    fn std_special_v6_is_blocked(bits in any::<u128>()) {
        let a = Ipv6Addr::from_bits(bits);
        if a.is_loopback() || a.is_unspecified() || a.is_multicast() || a.is_unique_local()
            || a.is_unicast_link_local() {
            prop_assert!(Policy::new().check(IpAddr::V6(a)).is_err());
        }
    }

    /// An IPv4 address and its mapped, NAT64 and 6to4 forms get the same verdict.
    #[test]
    fn embedded_forms_agree_with_v4(bits in any::<u32>()) {
        let p = Policy::new();
        let plain = p.check(IpAddr::V4(Ipv4Addr::from_bits(bits))).is_ok();
        let mapped = IpAddr::V6(Ipv4Addr::from_bits(bits).to_ipv6_mapped());
        let nat64 = IpAddr::V6(Ipv6Addr::from_bits((0x64_ff9b_u128 << 96) | bits as u128));
        let six_to_four = IpAddr::V6(Ipv6Addr::from_bits((0x2002_u128 << 112) | ((bits as u128) << 80)));
        prop_assert_eq!(p.check(mapped).is_ok(), plain);
        prop_assert_eq!(p.check(nat64).is_ok(), plain);
        prop_assert_eq!(p.check(six_to_four).is_ok(), plain);
    }

    /// Anything inside an allowed CIDR passes, whatever the block list says.
    #[test]
    fn allowed_always_wins(bits in any::<u32>(), len in 0u8..=32) {
        let a = Ipv4Addr::from_bits(bits);
        let net = IpNet::new(IpAddr::V4(a), len).unwrap();
        let p = Policy::with_allowed([net]);
        prop_assert_eq!(p.check(IpAddr::V4(a)), Ok(()));
    }
}
