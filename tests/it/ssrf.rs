//! The SSRF battery: URL forms and DNS answers that must all end `ssrf_blocked` without a
//! connection.
//!
//! Nothing here can leave the machine, even if the checks were broken:
//! - URL forms sent for real denote loopback addresses; a counting receiver listens where a
//!   broken check would connect, and must see zero connections.
//! - Host names resolve through a DNS server on 127.0.0.1; names sent for real answer loopback
//!   addresses only.
//! - Non-loopback answers (10/8, metadata, ULA, a public + private mix) are checked by calling the
//!   resolver directly: no HTTP client is involved, so there is nothing that could connect.
//! - Non-loopback literal URLs run `hookline send` inside a fresh network namespace
//!   (`unshare -rn`) whose only interface is a down loopback; fails where unshare is missing.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use hookline::ssrf::resolver::{LookupError, Resolver};
use hookline::ssrf::{Policy, UrlError};
use tokio::net::TcpListener;

use crate::send::send;
use crate::support::dns::DnsServer;
use crate::support::hookline_bin;
use crate::support::receiver::{Receiver, Reply};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A receiver on 127.0.0.1 and, where the host has IPv6, one on [::1] with the same port, so a
/// broken check would be counted on either family.
async fn counting_receivers() -> (Receiver, Option<Receiver>) {
    for _ in 0..20 {
        let v4 = Receiver::fixed(Reply::status(200)).await;
        match TcpListener::bind(("::1", v4.port())).await {
            Ok(l) => return (v4, Some(Receiver::on(l, Reply::status(200)))),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
            Err(_) => return (v4, None),
        }
    }
    panic!("no port free on both 127.0.0.1 and ::1");
}

fn assert_untouched(v4: &Receiver, v6: &Option<Receiver>) {
    assert_eq!(v4.connections(), 0, "a connection reached 127.0.0.1");
    if let Some(v6) = v6 {
        assert_eq!(v6.connections(), 0, "a connection reached [::1]");
    }
}

#[tokio::test]
async fn literal_loopback_forms_are_refused_before_connecting() {
    let (v4, v6) = counting_receivers().await;
    let p = v4.port();
    let forms = [
        format!("http://127.0.0.1:{p}/"),
        format!("https://127.0.0.1:{p}/"),
        format!("http://127.1:{p}/"),
        format!("http://127.0.1:{p}/"),
        format!("http://2130706433:{p}/"),
        format!("http://0x7f000001:{p}/"),
        format!("http://0x7f.0.0.1:{p}/"),
        format!("http://0177.0.0.1:{p}/"),
        format!("http://017700000001:{p}/"),
        format!("http://0x7F.000.00.01:{p}/"),
        format!("http://127.0.0.1.:{p}/"),
        format!("http://%31%32%37.0.0.1:{p}/"),
        format!("http://user:pass@127.0.0.1:{p}/"),
        format!("http://127.255.255.254:{p}/"),
        format!("http://0.0.0.0:{p}/"),
        format!("http://0:{p}/"),
        format!("http://[::1]:{p}/"),
        format!("http://[0:0:0:0:0:0:0:1]:{p}/"),
        format!("http://[::]:{p}/"),
        format!("http://[::ffff:127.0.0.1]:{p}/"),
        format!("http://[::ffff:7f00:1]:{p}/"),
        format!("http://[0:0:0:0:0:ffff:7f00:1]:{p}/"),
    ];
    for url in &forms {
        // An allowed range elsewhere must not open loopback.
        let run = send(
            url,
            &["--dangerous-allow-http", "--allow-cidr", "10.0.0.0/8"],
        )
        .await;
        let json = run.json.unwrap_or_else(|| panic!("{url}: {}", run.stderr));
        assert_eq!(json["error_class"], "ssrf_blocked", "{url}: {json}");
        assert_eq!(json["outcome"], "dead", "{url}");
        assert_eq!(run.code, 1, "{url}");
    }
    assert_untouched(&v4, &v6);
}

#[tokio::test]
async fn dns_answers_pointing_at_loopback_are_refused_before_connecting() {
    let (v4, v6) = counting_receivers().await;
    let dns = DnsServer::start([
        ("loopback.test", vec![ip("127.0.0.1")]),
        ("loopback2.test", vec![ip("127.0.0.2")]),
        ("loopback6.test", vec![ip("::1")]),
        ("mapped.test", vec![ip("::ffff:127.0.0.1")]),
        ("both.test", vec![ip("127.0.0.1"), ip("::1")]),
        ("localhost", vec![ip("127.0.0.1"), ip("::1")]),
        ("rebind.test", vec![ip("127.0.0.1")]),
    ])
    .await;
    let dns_arg = dns.addr().to_string();
    let p = v4.port();
    for host in [
        "loopback.test",
        "LOOPBACK.test",
        "loopback.test.",
        "loopback2.test",
        "loopback6.test",
        "mapped.test",
        "both.test",
        "localhost",
    ] {
        let url = format!("http://{host}:{p}/");
        let run = send(&url, &["--dangerous-allow-http", "--dns-server", &dns_arg]).await;
        let json = run.json.unwrap_or_else(|| panic!("{url}: {}", run.stderr));
        assert_eq!(json["error_class"], "ssrf_blocked", "{url}: {json}");
        assert_eq!(json["outcome"], "dead", "{url}");
    }
    assert!(dns.queries() > 0, "the names were looked up");
    assert_untouched(&v4, &v6);
}

#[tokio::test]
async fn the_resolver_refuses_any_internal_answer() {
    let dns = DnsServer::start([
        ("private.test", vec![ip("10.0.0.1")]),
        ("metadata.test", vec![ip("169.254.169.254")]),
        ("cgnat.test", vec![ip("100.64.0.1")]),
        ("ula.test", vec![ip("fd00::1")]),
        ("linklocal6.test", vec![ip("fe80::1")]),
        ("nat64.test", vec![ip("64:ff9b::a9fe:a9fe")]),
        ("sixtofour.test", vec![ip("2002:a00:1::1")]),
        ("mixed.test", vec![ip("93.184.216.34"), ip("10.0.0.1")]),
        (
            "mixed-family.test",
            vec![ip("93.184.216.34"), ip("fd00::1")],
        ),
        (
            "public.test",
            vec![ip("93.184.216.34"), ip("2606:2800:220:1::1")],
        ),
    ])
    .await;
    let resolver = Resolver::new(
        Arc::new(Policy::new()),
        &[dns.addr()],
        Duration::from_secs(1),
    )
    .unwrap();
    for (name, range) in [
        ("private.test", "private"),
        ("metadata.test", "link_local"),
        ("cgnat.test", "cgnat"),
        ("ula.test", "unique_local"),
        ("linklocal6.test", "link_local"),
        ("nat64.test", "link_local"),
        ("sixtofour.test", "private"),
        ("mixed.test", "private"),
        ("mixed-family.test", "unique_local"),
    ] {
        match resolver.lookup(name).await {
            Err(LookupError::Blocked { blocked, .. }) => {
                assert_eq!(blocked.range_name, range, "{name}")
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    // Only public answers: every address handed back (nothing dialled here).
    let mut addrs = resolver.lookup("public.test").await.unwrap();
    addrs.sort();
    assert_eq!(addrs, [ip("93.184.216.34"), ip("2606:2800:220:1::1")]);
    assert!(matches!(
        resolver.lookup("nxdomain.test").await,
        Err(LookupError::Dns { .. })
    ));

    // An operator's allow-list opens exactly what it names.
    let allowing = Resolver::new(
        Arc::new(Policy::with_allowed(["10.0.0.0/8".parse().unwrap()])),
        &[dns.addr()],
        Duration::from_secs(1),
    )
    .unwrap();
    assert_eq!(allowing.lookup("mixed.test").await.unwrap().len(), 2);
    assert!(matches!(
        allowing.lookup("metadata.test").await,
        Err(LookupError::Blocked { .. })
    ));
}

/// Non-loopback literal forms; checked purely here, and for real in an isolated namespace below.
const INTERNAL_LITERALS: [&str; 20] = [
    "https://10.0.0.1/",
    "https://10.1/",
    "https://172.16.0.1/",
    "https://192.168.0.1/",
    "https://169.254.169.254/latest/meta-data/",
    "https://0xa9fea9fe/",
    "https://2852039166/",
    "https://0251.0376.0251.0376/",
    "https://100.64.0.1/",
    "https://198.18.0.1/",
    "https://224.0.0.1/",
    "https://255.255.255.255/",
    "https://[fd00::1]/",
    "https://[fe80::1]/",
    "https://[fec0::1]/",
    "https://[::ffff:169.254.169.254]/",
    "https://[64:ff9b::a9fe:a9fe]/",
    "https://[2002:a9fe:a9fe::]/",
    "https://[::a9fe:a9fe]/",
    "https://[2001:db8::1]/",
];

#[test]
fn internal_literals_are_refused_by_the_url_check() {
    let policy = Policy::new();
    for raw in INTERNAL_LITERALS {
        let url = url::Url::parse(raw).unwrap();
        assert!(
            matches!(policy.check_url(&url), Err(UrlError::Blocked(_))),
            "{raw}"
        );
    }
}

fn unshare_works() -> bool {
    std::process::Command::new("unshare")
        .args(["-rn", "true"])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[tokio::test]
async fn internal_literals_are_refused_inside_an_isolated_network_namespace() {
    assert!(
        unshare_works(),
        "this test needs `unshare -rn` (util-linux, unprivileged user namespaces) to isolate the \
         network; install util-linux or enable user namespaces"
    );
    for raw in INTERNAL_LITERALS {
        // Inside the namespace nothing is routable: even a broken check could not send a packet.
        let output = tokio::process::Command::new("unshare")
            .args(["-rn", hookline_bin(), "send", raw, "--secret"])
            .arg("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
            .args(["--body", "{}", "--timeout", "2"])
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let json: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
            panic!(
                "{raw}: {stdout} {}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
        assert_eq!(json["error_class"], "ssrf_blocked", "{raw}: {json}");
        assert_eq!(output.status.code(), Some(1), "{raw}");
    }
}
