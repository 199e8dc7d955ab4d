//! The outbound HTTP client: one signed request in, one [`Attempt`] out.
//!
//! It never decides whether to retry (that is [`crate::retry_policy`]'s job); it only reports
//! what happened in the shared [`ErrorClass`] vocabulary. Safety properties, all enforced here:
//! SSRF checks on literal hosts and inside the resolver ([`crate::ssrf`]), https unless the
//! dangerous switch allows http, no redirects (a 3xx is returned as a response), no proxy from the
//! environment, no decompression, separate connect and total timeouts, and a capped body read.
//!
//! Error classes for failures without a response:
//! - `ssrf_blocked`, `insecure_scheme`, `invalid_url`: refused before any connection.
//! - `dns`: the name did not resolve (NXDOMAIN, no records, no DNS server answered).
//! - `connect`: the connection could not be established, **including the connect timeout**
//!   (which covers resolve + TCP + TLS handshake in reqwest); the receiver was never reached, so
//!   it is a connection problem, as [`ErrorClass::Connect`] documents. Also used for a connection
//!   that broke before a response head arrived (reset, closed, malformed response).
//! - `tls`: the TLS handshake or certificate verification failed.
//! - `timeout`: the total timeout ran out (while connecting, sending or awaiting the response).

use std::error::Error as StdError;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER};
use url::Url;

use crate::attempt::{Attempt, AttemptResult, ErrorClass, HttpResponse, MAX_STORED_BODY};
use crate::ssrf::resolver::{LookupError, Resolver};
use crate::ssrf::{self, Policy};

/// The `User-Agent` every attempt carries.
pub const USER_AGENT: &str = concat!("hookline/", env!("CARGO_PKG_VERSION"));

/// How a [`Sender`] is built. Defaults: connect 3 s, total 15 s, https only, default SSRF policy,
/// system DNS.
#[derive(Debug, Clone)]
pub struct SenderConfig {
    /// Bound on establishing a connection (DNS lookup, TCP connect, TLS handshake).
    pub connect_timeout: Duration,
    /// Bound on the whole attempt, from the first byte out to the last body byte read.
    pub total_timeout: Duration,
    /// DANGEROUS: allow plain `http://` URLs. For development and tests only.
    pub allow_http: bool,
    /// Which addresses may be reached.
    pub policy: Policy,
    /// DNS servers to ask instead of the system configuration (empty: system configuration).
    pub dns_servers: Vec<SocketAddr>,
}

impl Default for SenderConfig {
    fn default() -> Self {
        SenderConfig {
            connect_timeout: Duration::from_secs(3),
            total_timeout: Duration::from_secs(15),
            allow_http: false,
            policy: Policy::new(),
            dns_servers: Vec::new(),
        }
    }
}

/// Why a [`Sender`] could not be built (reported at start-up, never per attempt).
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A timeout was zero.
    #[error("{0} must be greater than zero")]
    ZeroTimeout(&'static str),
    /// The DNS resolver could not be configured (e.g. unreadable system configuration).
    #[error("cannot configure the DNS resolver: {0}")]
    Dns(#[from] hickory_resolver::ResolveError),
    /// The HTTP client could not be built (e.g. TLS roots).
    #[error("cannot build the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

/// One request to deliver. The caller has already signed it; the sender sends it as it is.
#[derive(Debug, Clone)]
pub struct OutboundRequest {
    /// The endpoint URL.
    pub url: Url,
    /// Headers to send (the `webhook-*` signature headers and anything endpoint-specific).
    /// `content-type: application/json` is added when absent; `user-agent` is [`USER_AGENT`].
    pub headers: HeaderMap,
    /// The body, sent byte for byte: it is what was signed.
    pub body: Bytes,
}

/// The SSRF-safe HTTP sender. Build once; clones share one connection pool and resolver.
#[derive(Debug, Clone)]
pub struct Sender {
    client: reqwest::Client,
    policy: Arc<Policy>,
    allow_http: bool,
}

impl Sender {
    /// Builds the client and resolver. Does no network I/O.
    pub fn new(config: SenderConfig) -> Result<Sender, BuildError> {
        if config.connect_timeout.is_zero() {
            return Err(BuildError::ZeroTimeout("connect timeout"));
        }
        if config.total_timeout.is_zero() {
            return Err(BuildError::ZeroTimeout("total timeout"));
        }
        let policy = Arc::new(config.policy);
        // Two tries per server must fit in the connect timeout, or a slow DNS would be reported
        // as a connect timeout.
        let lookup_timeout = (config.connect_timeout / 3).max(Duration::from_millis(50));
        let resolver = Resolver::new(policy.clone(), &config.dns_servers, lookup_timeout)?;
        let client = reqwest::Client::builder()
            .use_rustls_tls()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .https_only(!config.allow_http)
            .connect_timeout(config.connect_timeout)
            .timeout(config.total_timeout)
            .dns_resolver(Arc::new(resolver))
            .user_agent(USER_AGENT)
            .build()?;
        Ok(Sender {
            client,
            policy,
            allow_http: config.allow_http,
        })
    }

    /// Makes one attempt. Never panics and never returns an error: every outcome is an
    /// [`Attempt`], with the latency measured from the start of the call to the end of the body
    /// read.
    pub async fn send(&self, request: OutboundRequest) -> Attempt {
        let started = Instant::now();
        let result = self.attempt(request).await;
        Attempt {
            result,
            latency: started.elapsed(),
        }
    }

    async fn attempt(&self, request: OutboundRequest) -> AttemptResult {
        let OutboundRequest {
            url,
            mut headers,
            body,
        } = request;
        // Literal-IP hosts never reach the resolver, so they are checked here.
        if let Err(refusal) =
            ssrf::check_scheme(&url, self.allow_http).and_then(|()| self.policy.check_url(&url))
        {
            return AttemptResult::Failed {
                class: refusal.class(),
                detail: refusal.to_string(),
            };
        }
        headers
            .entry(CONTENT_TYPE)
            .or_insert(HeaderValue::from_static("application/json"));
        let response = match self
            .client
            .post(url)
            .headers(headers)
            .body(body)
            .send()
            .await
        {
            Ok(response) => response,
            Err(err) => {
                let (class, detail) = classify_error(err);
                return AttemptResult::Failed { class, detail };
            }
        };
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let body = read_capped(response).await;
        AttemptResult::Response(HttpResponse {
            status,
            retry_after,
            body,
        })
    }
}

/// Reads at most [`MAX_STORED_BODY`] bytes (plus at most one chunk already in flight) and then
/// drops the response, which closes the connection instead of downloading the rest. A body that
/// fails mid-way (timeout, reset) keeps what arrived: the status is the receiver's answer, the
/// body only a diagnostic.
async fn read_capped(mut response: reqwest::Response) -> Vec<u8> {
    let mut body = Vec::new();
    while body.len() < MAX_STORED_BODY {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let take = chunk.len().min(MAX_STORED_BODY - body.len());
                body.extend_from_slice(&chunk[..take]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    body
}

/// Every error in `err`'s source chain, looking inside `io::Error`s too (their `source()` skips
/// the wrapped error, and rustls hands its errors over wrapped in one).
fn causes<'a>(
    err: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    std::iter::successors(Some(err), |&e: &&'a (dyn StdError + 'static)| {
        match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn StdError + 'static)),
            None => e.source(),
        }
    })
}

/// Maps a reqwest failure to its class and a detail line (the URL is stripped: endpoint URLs can
/// carry credentials in their query).
fn classify_error(err: reqwest::Error) -> (ErrorClass, String) {
    let err = err.without_url();
    let detail = causes(&err)
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join(": ");
    for cause in causes(&err) {
        if let Some(lookup) = cause.downcast_ref::<LookupError>() {
            let class = match lookup {
                LookupError::Blocked { .. } => ErrorClass::SsrfBlocked,
                LookupError::Dns { .. } => ErrorClass::Dns,
            };
            return (class, lookup.to_string());
        }
        if cause.is::<rustls::Error>() {
            return (ErrorClass::Tls, detail);
        }
    }
    let class = if err.is_connect() {
        ErrorClass::Connect
    } else if err.is_timeout() {
        ErrorClass::Timeout
    } else if err.is_builder() {
        ErrorClass::InvalidUrl
    } else {
        ErrorClass::Connect
    };
    (class, detail)
}
