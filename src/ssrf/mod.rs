//! Which addresses a delivery may reach.
//!
//! Endpoints are customer-supplied URLs, so every outbound attempt is a potential server-side
//! request forgery. [`Policy`] decides per address; it is applied twice on every send: to literal-IP
//! hosts before the request is built ([`Policy::check_url`]), and inside the DNS resolver to every
//! address a name resolves to ([`resolver::Resolver`]), so the connection only ever dials checked
//! addresses and a rebinding DNS answer has no second lookup to exploit.
//!
//! Embedded IPv4 addresses are unwrapped where the embedding means "this v6 address reaches that
//! v4 address": IPv4-mapped (`::ffff:a.b.c.d`, the same socket as the v4 address on dual-stack
//! hosts), NAT64 well-known prefix (`64:ff9b::/96`, translated by a gateway), 6to4 (`2002::/16`)
//! and Teredo (`2001::/32`, server and de-obfuscated client). Forms that have no legitimate use for
//! webhooks are blocked outright instead of unwrapped: IPv4-compatible (`::/96`, deprecated),
//! IPv4-translated (`::ffff:0:0:0/96`) and the local-use NAT64 prefix (`64:ff9b:1::/48`, whose
//! embedding position depends on the operator's prefix length).

pub mod resolver;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use url::{Host, Url};

use crate::attempt::ErrorClass;

const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8) -> Ipv4Net {
    Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), len)
}

const fn v6(segments: [u16; 8], len: u8) -> Ipv6Net {
    let [a, b, c, d, e, f, g, h] = segments;
    Ipv6Net::new_assert(Ipv6Addr::new(a, b, c, d, e, f, g, h), len)
}

/// IPv4 ranges blocked by default. More specific entries come first so that a refusal names the
/// narrowest range (255.255.255.255 is "broadcast", not "reserved").
const BLOCKED_V4: [(Ipv4Net, &str); 15] = [
    (v4(0, 0, 0, 0, 8), "unspecified"),
    (v4(10, 0, 0, 0, 8), "private"),
    (v4(100, 64, 0, 0, 10), "cgnat"),
    (v4(127, 0, 0, 0, 8), "loopback"),
    (v4(169, 254, 0, 0, 16), "link_local"),
    (v4(172, 16, 0, 0, 12), "private"),
    (v4(192, 0, 0, 0, 24), "ietf_protocol"),
    (v4(192, 0, 2, 0, 24), "documentation"),
    (v4(192, 168, 0, 0, 16), "private"),
    (v4(198, 18, 0, 0, 15), "benchmarking"),
    (v4(198, 51, 100, 0, 24), "documentation"),
    (v4(203, 0, 113, 0, 24), "documentation"),
    (v4(224, 0, 0, 0, 4), "multicast"),
    (v4(255, 255, 255, 255, 32), "broadcast"),
    (v4(240, 0, 0, 0, 4), "reserved"),
];

/// IPv6 ranges blocked whole by default (IPv4-mapped addresses never reach this table: they are
/// checked as the IPv4 address they are; NAT64, 6to4 and Teredo are unwrapped, not listed).
const BLOCKED_V6: [(Ipv6Net, &str); 12] = [
    (v6([0, 0, 0, 0, 0, 0, 0, 0], 128), "unspecified"),
    (v6([0, 0, 0, 0, 0, 0, 0, 1], 128), "loopback"),
    (v6([0, 0, 0, 0, 0, 0, 0, 0], 96), "ipv4_compatible"),
    (v6([0, 0, 0, 0, 0xffff, 0, 0, 0], 96), "ipv4_translated"),
    (v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48), "nat64_local"),
    (v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64), "discard_only"),
    (v6([0x2001, 2, 0, 0, 0, 0, 0, 0], 48), "benchmarking"),
    (v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32), "documentation"),
    (v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7), "unique_local"),
    (v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10), "link_local"),
    (v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10), "site_local"),
    (v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8), "multicast"),
];

const NAT64: Ipv6Net = v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96);
const SIX_TO_FOUR: Ipv6Net = v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16);
const TEREDO: Ipv6Net = v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32);

/// How an IPv6 address carries the IPv4 address that was found blocked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Embedding {
    /// `::ffff:a.b.c.d`.
    Ipv4Mapped,
    /// `64:ff9b::a.b.c.d` (NAT64 well-known prefix).
    Nat64,
    /// `2002:AABB:CCDD::/48` (6to4).
    SixToFour,
    /// The Teredo server field of `2001:0::/32`.
    TeredoServer,
    /// The obfuscated Teredo client field of `2001:0::/32`.
    TeredoClient,
}

impl Embedding {
    /// A short stable name for messages.
    pub const fn as_str(self) -> &'static str {
        match self {
            Embedding::Ipv4Mapped => "ipv4_mapped",
            Embedding::Nat64 => "nat64",
            Embedding::SixToFour => "6to4",
            Embedding::TeredoServer => "teredo_server",
            Embedding::TeredoClient => "teredo_client",
        }
    }
}

/// Why an address was refused: which range it (or the IPv4 address it embeds) falls in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub struct Blocked {
    /// The address as it was checked (resolved, or the URL's literal host).
    pub addr: IpAddr,
    /// Stable name of the blocked range (`private`, `loopback`, `link_local`, ...).
    pub range_name: &'static str,
    /// The blocked range itself.
    pub range: IpNet,
    /// When the range matched an IPv4 address embedded in `addr`: how, and which address.
    pub embedded: Option<(Embedding, Ipv4Addr)>,
}

impl fmt::Display for Blocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.embedded {
            None => write!(
                f,
                "{} is in blocked range {} ({})",
                self.addr, self.range_name, self.range
            ),
            Some((how, inner)) => write!(
                f,
                "{} embeds {} ({}), which is in blocked range {} ({})",
                self.addr,
                inner,
                how.as_str(),
                self.range_name,
                self.range
            ),
        }
    }
}

/// Why a URL was refused before any connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// Not an `http`/`https` URL with a host.
    #[error("invalid URL: {0}")]
    Invalid(&'static str),
    /// `http://` while plain http is not allowed.
    #[error("plain http:// is refused: https is required (the dangerous allow-http switch is off)")]
    InsecureScheme,
    /// The literal IP host is blocked.
    #[error("refused by SSRF policy: {0}")]
    Blocked(#[from] Blocked),
}

impl UrlError {
    /// The shared error class this refusal is logged under.
    pub const fn class(&self) -> ErrorClass {
        match self {
            UrlError::Invalid(_) => ErrorClass::InvalidUrl,
            UrlError::InsecureScheme => ErrorClass::InsecureScheme,
            UrlError::Blocked(_) => ErrorClass::SsrfBlocked,
        }
    }
}

/// Checks that `url` is an http(s) URL with a host, and that it is `https` unless `allow_http`
/// (the dangerous switch) is on.
pub fn check_scheme(url: &Url, allow_http: bool) -> Result<(), UrlError> {
    match url.scheme() {
        "https" => {}
        "http" if allow_http => {}
        "http" => return Err(UrlError::InsecureScheme),
        _ => return Err(UrlError::Invalid("scheme must be https (or http)")),
    }
    if url.host().is_none() {
        return Err(UrlError::Invalid("URL has no host"));
    }
    Ok(())
}

/// The address policy: the fixed block list of DESIGN.md plus CIDRs an operator allowed.
///
/// Allowed CIDRs override the block list. An allowed CIDR matches the address as checked, its
/// IPv4 form when it is IPv4-mapped, and the IPv4 address behind a NAT64 (`64:ff9b::/96`)
/// address, since those reach exactly that IPv4 address. 6to4 and Teredo go through relays, so
/// allowing their embedded IPv4 address does not allow them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    allowed: Vec<IpNet>,
}

impl Policy {
    /// The default policy: everything in the block list refused, nothing extra allowed.
    pub fn new() -> Self {
        Self::default()
    }

    /// A policy that additionally allows these CIDRs.
    pub fn with_allowed(allowed: impl IntoIterator<Item = IpNet>) -> Self {
        Policy {
            allowed: allowed.into_iter().map(|n| n.trunc()).collect(),
        }
    }

    /// The CIDRs that override the block list.
    pub fn allowed(&self) -> &[IpNet] {
        &self.allowed
    }

    /// Every range blocked whole by default, with its name (for docs, config echo and tests).
    /// IPv4-mapped, NAT64, 6to4 and Teredo addresses are blocked by what they embed.
    pub fn blocked_ranges() -> impl Iterator<Item = (IpNet, &'static str)> {
        BLOCKED_V4
            .iter()
            .map(|&(n, name)| (IpNet::V4(n), name))
            .chain(BLOCKED_V6.iter().map(|&(n, name)| (IpNet::V6(n), name)))
    }

    fn is_allowed(&self, addr: IpAddr) -> bool {
        // `with_allowed` truncated every CIDR to its network address, as `in_v4`/`in_v6` need.
        self.allowed.iter().any(|net| match (net, addr) {
            (IpNet::V4(net), IpAddr::V4(a)) => in_v4(net, a.to_bits()),
            (IpNet::V6(net), IpAddr::V6(a)) => in_v6(net, a.to_bits()),
            _ => false,
        })
    }

    /// Decides one address. Pure and allocation-free: it runs for every resolved address of
    /// every attempt.
    pub fn check(&self, addr: IpAddr) -> Result<(), Blocked> {
        let canonical = addr.to_canonical();
        if self.is_allowed(addr) || self.is_allowed(canonical) {
            return Ok(());
        }
        match canonical {
            IpAddr::V4(a) => match blocked_v4(a) {
                None => Ok(()),
                Some((range, name)) => Err(Blocked {
                    addr,
                    range_name: name,
                    range: IpNet::V4(range),
                    embedded: addr.is_ipv6().then_some((Embedding::Ipv4Mapped, a)),
                }),
            },
            IpAddr::V6(a) => self.check_v6(addr, a),
        }
    }

    fn check_v6(&self, addr: IpAddr, a: Ipv6Addr) -> Result<(), Blocked> {
        let bits = a.to_bits();
        if let Some(&(range, name)) = BLOCKED_V6.iter().find(|(net, _)| in_v6(net, bits)) {
            return Err(Blocked {
                addr,
                range_name: name,
                range: IpNet::V6(range),
                embedded: None,
            });
        }
        let embedded = if in_v6(&NAT64, bits) {
            let inner = Ipv4Addr::from_bits(bits as u32);
            if self.is_allowed(IpAddr::V4(inner)) {
                return Ok(());
            }
            [Some((Embedding::Nat64, inner)), None]
        } else if in_v6(&SIX_TO_FOUR, bits) {
            [
                Some((
                    Embedding::SixToFour,
                    Ipv4Addr::from_bits((bits >> 80) as u32),
                )),
                None,
            ]
        } else if in_v6(&TEREDO, bits) {
            [
                Some((
                    Embedding::TeredoServer,
                    Ipv4Addr::from_bits((bits >> 64) as u32),
                )),
                Some((Embedding::TeredoClient, Ipv4Addr::from_bits(!(bits as u32)))),
            ]
        } else {
            return Ok(());
        };
        for (how, inner) in embedded.into_iter().flatten() {
            if let Some((range, name)) = blocked_v4(inner) {
                return Err(Blocked {
                    addr,
                    range_name: name,
                    range: IpNet::V4(range),
                    embedded: Some((how, inner)),
                });
            }
        }
        Ok(())
    }

    /// Checks a URL's host when it is an IP literal; host names pass here and are checked by the
    /// resolver at send time. The `url` crate has already normalised the legacy IPv4 spellings
    /// (decimal `2130706433`, hex `0x7f.1`, octal `0177.0.0.1`, short `127.1`) for http(s) URLs,
    /// so they arrive here as plain addresses.
    pub fn check_url(&self, url: &Url) -> Result<(), UrlError> {
        match url.host() {
            None => Err(UrlError::Invalid("URL has no host")),
            Some(Host::Domain(_)) => Ok(()),
            Some(Host::Ipv4(a)) => Ok(self.check(IpAddr::V4(a))?),
            Some(Host::Ipv6(a)) => Ok(self.check(IpAddr::V6(a))?),
        }
    }
}

fn blocked_v4(a: Ipv4Addr) -> Option<(Ipv4Net, &'static str)> {
    let bits = a.to_bits();
    BLOCKED_V4.iter().find(|(net, _)| in_v4(net, bits)).copied()
}

// Plain mask-and-compare on integers: the tables hold network addresses (host bits zero), and
// this is the whole hot path of a check, where ipnet's generic `contains` is slower.
fn in_v4(net: &Ipv4Net, bits: u32) -> bool {
    let mask = u32::MAX
        .checked_shl(32 - u32::from(net.prefix_len()))
        .unwrap_or(0);
    bits & mask == net.addr().to_bits()
}

fn in_v6(net: &Ipv6Net, bits: u128) -> bool {
    let mask = u128::MAX
        .checked_shl(128 - u32::from(net.prefix_len()))
        .unwrap_or(0);
    bits & mask == net.addr().to_bits()
}

#[cfg(test)]
mod tests;
