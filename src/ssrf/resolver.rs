//! The resolver the sender's HTTP client dials through: it resolves with hickory, checks EVERY
//! resolved address against the [`Policy`], and hands the connector only checked addresses. One
//! lookup per connection, so a DNS answer cannot change between the check and the connect.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{LookupIpStrategy, NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::xfer::Protocol;
use hyper_util::client::legacy::connect::dns::Name;

use super::{Blocked, Policy};

/// Why a host name yielded no usable address. The sender finds this in a request error's source
/// chain to tell an SSRF refusal from a plain DNS failure.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// At least one resolved address is blocked; the request is refused as a whole.
    #[error("{name} resolved to a blocked address: {blocked}")]
    Blocked {
        /// The host name looked up.
        name: String,
        /// The first blocked address found.
        blocked: Blocked,
    },
    /// The lookup failed (NXDOMAIN, no records, no server answered, ...).
    #[error("{name} did not resolve: {source}")]
    Dns {
        /// The host name looked up.
        name: String,
        /// What hickory reported.
        source: hickory_resolver::ResolveError,
    },
}

/// A hickory resolver with the SSRF policy applied to every answer. Cheap to clone: the HTTP
/// client clones its connector, and so this resolver, for every request, and a hickory
/// resolver's own clone copies its configuration and cache handles (allocations on the
/// delivery path), so it is shared behind an `Arc`.
#[derive(Clone)]
pub struct Resolver {
    inner: Arc<TokioResolver>,
    policy: Arc<Policy>,
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolver")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Resolver {
    /// Builds the resolver. With no `dns_servers` it uses the system configuration
    /// (`/etc/resolv.conf`, hosts file); otherwise it asks exactly those servers, over UDP with
    /// TCP for truncated answers. `lookup_timeout` bounds one query to one server; the sender
    /// passes a fraction of its connect timeout so a slow DNS reports as `dns`, not `connect`.
    pub fn new(
        policy: Arc<Policy>,
        dns_servers: &[SocketAddr],
        lookup_timeout: Duration,
    ) -> Result<Self, hickory_resolver::ResolveError> {
        let provider = TokioConnectionProvider::default();
        let mut builder = if dns_servers.is_empty() {
            TokioResolver::builder(provider)?
        } else {
            let mut config = ResolverConfig::new();
            for &addr in dns_servers {
                for protocol in [Protocol::Udp, Protocol::Tcp] {
                    let mut server = NameServerConfig::new(addr, protocol);
                    // An authoritative "no such name" from the configured server is final.
                    server.trust_negative_responses = true;
                    config.add_name_server(server);
                }
            }
            TokioResolver::builder_with_config(config, provider)
        };
        let opts: &mut ResolverOpts = builder.options_mut();
        // Both families: a name is refused if ANY of its addresses is blocked, so we must see all.
        opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        opts.timeout = lookup_timeout;
        opts.attempts = 2;
        Ok(Resolver {
            inner: Arc::new(builder.build()),
            policy,
        })
    }

    /// Resolves `name` and checks every address; all of them, or a refusal.
    pub async fn lookup(&self, name: &str) -> Result<Vec<IpAddr>, LookupError> {
        let answer = self
            .inner
            .lookup_ip(name)
            .await
            .map_err(|source| LookupError::Dns {
                name: name.to_owned(),
                source,
            })?;
        let addrs: Vec<IpAddr> = answer.iter().collect();
        for &addr in &addrs {
            if let Err(blocked) = self.policy.check(addr) {
                return Err(LookupError::Blocked {
                    name: name.to_owned(),
                    blocked,
                });
            }
        }
        Ok(addrs)
    }
}

/// What the sender's connector asks for: the checked addresses of one host name, each with
/// port 0 (the connector substitutes the URL's port or the scheme's default).
impl tower_service::Service<Name> for Resolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = LookupError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, LookupError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), LookupError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let addrs = this.lookup(name.as_str()).await?;
            Ok(addrs
                .into_iter()
                .map(|ip| SocketAddr::new(ip, 0))
                .collect::<Vec<_>>()
                .into_iter())
        })
    }
}
