//! The outbound HTTP client: one signed request in, one [`Attempt`] out.
//!
//! It never decides whether to retry (that is [`crate::retry_policy`]'s job); it only reports
//! what happened in the shared [`ErrorClass`] vocabulary. Safety properties, all enforced here:
//! SSRF checks on literal hosts and inside the resolver ([`crate::ssrf`]), https unless the
//! dangerous switch allows http, no redirects (a 3xx is returned as a response), no proxy, no
//! decompression, separate connect and total timeouts, and a capped body read.
//!
//! The client is hyper-util's pooled HTTP/1.1 client over a TLS (rustls) connector that dials
//! only what hookline's resolver returns. A higher-level client adds work per request that a
//! delivery never uses: a redirect layer that parses the URL again, a retry layer that copies
//! every request in case it is retried, a second copy of the headers kept for redirects. At a
//! steady high rate that work is a large share of the CPU of the whole exchange.
//! Here the request URI is built once per endpoint ([`Target`]) and each attempt is one
//! `http::Request` handed to the pool.
//!
//! Error classes for failures without a response:
//! - `ssrf_blocked`, `insecure_scheme`, `invalid_url`: refused before any connection.
//! - `dns`: the name did not resolve (NXDOMAIN, no records, no DNS server answered).
//! - `connect`: the connection could not be established, **including the connect timeout**
//!   (which covers resolve + TCP + TLS handshake); the receiver was never reached, so it is a
//!   connection problem, as [`ErrorClass::Connect`] documents. Also used for a connection that
//!   broke before a response head arrived (reset, closed, malformed response).
//! - `tls`: the TLS handshake or certificate verification failed.
//! - `timeout`: the total timeout ran out (while connecting, sending or awaiting the response).

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{
    AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER, USER_AGENT as UA,
};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
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
    /// The TLS configuration could not be built.
    #[error("cannot configure TLS: {0}")]
    Tls(#[from] rustls::Error),
}

/// Why a URL cannot be a [`Target`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// Not an http(s) URL with a host.
    #[error("must be an https:// (or http://) URL with a host")]
    NotHttp,
    /// The URL is not a valid HTTP request target.
    #[error("is not a valid request URI: {0}")]
    Uri(String),
}

/// An endpoint URL ready to send to: the parsed [`Url`] the SSRF checks read, and the request
/// URI built from it once, not per attempt. A clone (one per attempt) copies no string: the
/// URL is shared and the URI's parts are reference-counted.
///
/// Credentials in the URL (`user:pass@`, which registered endpoints never have but a URL given
/// to `hookline send` may) are taken out of the request URI and sent as HTTP Basic
/// authorization, marked sensitive. `Debug` shows the scheme, host and port only: paths and
/// queries can carry tokens.
#[derive(Clone)]
pub struct Target {
    url: Arc<Url>,
    uri: Uri,
    authorization: Option<HeaderValue>,
}

impl Target {
    /// Builds the target for `url`.
    pub fn new(mut url: Url) -> Result<Target, TargetError> {
        if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
            return Err(TargetError::NotHttp);
        }
        let authorization = basic_authorization(&url);
        if authorization.is_some() {
            // A URL with a host can always drop its credentials.
            let _ = url.set_username("");
            let _ = url.set_password(None);
        }
        let uri = url
            .as_str()
            .parse::<Uri>()
            .map_err(|e| TargetError::Uri(e.to_string()))?;
        Ok(Target {
            url: Arc::new(url),
            uri,
            authorization,
        })
    }

    /// Parses `text` and builds its target.
    pub fn parse(text: &str) -> Result<Target, String> {
        let url = Url::parse(text).map_err(|e| format!("does not parse: {e}"))?;
        Target::new(url).map_err(|e| e.to_string())
    }

    /// The URL.
    pub fn url(&self) -> &Url {
        &self.url
    }
}

/// `Basic base64(user:password)` for a URL that carries credentials (percent-decoded).
fn basic_authorization(url: &Url) -> Option<HeaderValue> {
    use base64::Engine as _;
    if url.username().is_empty() && url.password().is_none() {
        return None;
    }
    let decode = |s: &str| percent_encoding::percent_decode_str(s).collect::<Vec<u8>>();
    let mut pair = decode(url.username());
    pair.push(b':');
    pair.extend(decode(url.password().unwrap_or("")));
    let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
    let mut value = HeaderValue::try_from(format!("Basic {encoded}")).ok()?;
    value.set_sensitive(true);
    Some(value)
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = self.url.host_str().unwrap_or("");
        match self.url.port() {
            Some(port) => write!(f, "Target({}://{host}:{port}/…)", self.url.scheme()),
            None => write!(f, "Target({}://{host}/…)", self.url.scheme()),
        }
    }
}

/// Adds the headers every request carries besides its own: `content-type: application/json`
/// when it has none, and `user-agent` ([`USER_AGENT`]). The sender adds them itself; a caller
/// that logs a request's headers adds them first, so that the log shows them as sent.
pub fn standard_headers(headers: &mut HeaderMap) {
    headers
        .entry(CONTENT_TYPE)
        .or_insert(HeaderValue::from_static("application/json"));
    headers.insert(UA, HeaderValue::from_static(USER_AGENT));
}

/// One request to deliver. The caller has already signed it; the sender sends it as it is.
#[derive(Debug, Clone)]
pub struct OutboundRequest {
    /// Where it goes.
    pub target: Target,
    /// Headers to send (the `webhook-*` signature headers and anything endpoint-specific).
    /// `content-type: application/json` is added when absent; `user-agent` is [`USER_AGENT`].
    pub headers: HeaderMap,
    /// The body, sent byte for byte: it is what was signed.
    pub body: Bytes,
}

/// The connector: TCP through hookline's resolver, TLS by rustls, under one connect timeout.
type Connector = ConnectTimeout<HttpsConnector<HttpConnector<Resolver>>>;

/// The SSRF-safe HTTP sender. Build once; clones share one connection pool and resolver.
#[derive(Clone)]
pub struct Sender {
    client: Client<Connector, Full<Bytes>>,
    policy: Arc<Policy>,
    allow_http: bool,
    total_timeout: Duration,
}

impl fmt::Debug for Sender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender")
            .field("policy", &self.policy)
            .field("allow_http", &self.allow_http)
            .field("total_timeout", &self.total_timeout)
            .finish_non_exhaustive()
    }
}

/// The TLS client settings: Mozilla's root store (webpki-roots), TLS 1.2 and 1.3, ring.
fn tls_config() -> Result<rustls::ClientConfig, rustls::Error> {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth())
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
        let mut tcp = HttpConnector::new_with_resolver(resolver);
        // The TLS layer sees https URIs through this connector.
        tcp.enforce_http(false);
        tcp.set_nodelay(true);
        let tls = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls_config()?);
        let tls = if config.allow_http {
            tls.https_or_http()
        } else {
            tls.https_only()
        };
        let connector = ConnectTimeout {
            inner: tls.enable_http1().wrap_connector(tcp),
            timeout: config.connect_timeout,
        };
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
        Ok(Sender {
            client,
            policy,
            allow_http: config.allow_http,
            total_timeout: config.total_timeout,
        })
    }

    /// Makes one attempt. Never panics and never returns an error: every outcome is an
    /// [`Attempt`], with the latency measured from the start of the call to the end of the body
    /// read.
    pub async fn send(&self, request: OutboundRequest) -> Attempt {
        let started = Instant::now();
        let result = self.attempt(request, started).await;
        Attempt {
            result,
            latency: started.elapsed(),
        }
    }

    async fn attempt(&self, request: OutboundRequest, started: Instant) -> AttemptResult {
        let OutboundRequest {
            target,
            mut headers,
            body,
        } = request;
        // Literal-IP hosts never reach the resolver, so they are checked here.
        if let Err(refusal) = ssrf::check_scheme(&target.url, self.allow_http)
            .and_then(|()| self.policy.check_url(&target.url))
        {
            return AttemptResult::Failed {
                class: refusal.class(),
                detail: refusal.to_string(),
            };
        }
        standard_headers(&mut headers);
        if let Some(authorization) = target.authorization {
            headers.insert(AUTHORIZATION, authorization);
        }
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = Method::POST;
        *req.uri_mut() = target.uri;
        *req.headers_mut() = headers;

        let deadline = tokio::time::Instant::from_std(started + self.total_timeout);
        let response = match tokio::time::timeout_at(deadline, self.client.request(req)).await {
            Ok(Ok(response)) => response,
            Ok(Err(err)) => {
                let (class, detail) = classify_error(&err);
                return AttemptResult::Failed { class, detail };
            }
            Err(_) => return timed_out(self.total_timeout),
        };
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let body = read_capped(response.into_body(), deadline).await;
        AttemptResult::Response(HttpResponse {
            status,
            retry_after,
            body,
        })
    }
}

fn timed_out(total: Duration) -> AttemptResult {
    AttemptResult::Failed {
        class: ErrorClass::Timeout,
        detail: format!("no complete answer within the total timeout of {total:?}"),
    }
}

/// Reads at most [`MAX_STORED_BODY`] bytes (plus at most one frame already in flight) and then
/// drops the body, which closes the connection instead of downloading the rest. A body that
/// fails mid-way (timeout, reset) keeps what arrived: the status is the receiver's answer, the
/// body only a diagnostic.
async fn read_capped(mut body: hyper::body::Incoming, deadline: tokio::time::Instant) -> Vec<u8> {
    let mut read = Vec::new();
    while read.len() < MAX_STORED_BODY {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Ok(chunk) = frame.into_data() {
                    let take = chunk.len().min(MAX_STORED_BODY - read.len());
                    read.extend_from_slice(&chunk[..take]);
                }
            }
            Ok(Some(Err(_)) | None) | Err(_) => break,
        }
    }
    read
}

/// The connect timeout did not leave room for the connection (resolve + TCP + TLS).
#[derive(Debug, thiserror::Error)]
#[error("connecting took longer than the connect timeout of {0:?}")]
pub struct ConnectTimedOut(Duration);

/// A connector whose whole connect (resolve, TCP, TLS handshake) is bounded by one timeout.
#[derive(Clone)]
pub struct ConnectTimeout<C> {
    inner: C,
    timeout: Duration,
}

type BoxError = Box<dyn StdError + Send + Sync>;

impl<C> tower_service::Service<Uri> for ConnectTimeout<C>
where
    C: tower_service::Service<Uri>,
    C::Error: Into<BoxError>,
    C::Future: Send + 'static,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let connecting = self.inner.call(dst);
        let timeout = self.timeout;
        Box::pin(async move {
            match tokio::time::timeout(timeout, connecting).await {
                Ok(connected) => connected.map_err(Into::into),
                Err(_) => Err(Box::new(ConnectTimedOut(timeout)) as BoxError),
            }
        })
    }
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

/// Maps a client failure to its class and a detail line. Requests carry no URL in their errors
/// (endpoint URLs can carry credentials in their query), so none is stripped here.
fn classify_error(err: &hyper_util::client::legacy::Error) -> (ErrorClass, String) {
    let detail = causes(err)
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join(": ");
    for cause in causes(err) {
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
    // Connect failures (refused, unreachable, the connect timeout) and connections that broke
    // before a response head arrived: the receiver never answered.
    (ErrorClass::Connect, detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_keeps_the_url_and_builds_its_request_uri_once() {
        let target = Target::parse("https://hooks.example.com:8443/in?token=s3cret").unwrap();
        assert_eq!(target.uri.host(), Some("hooks.example.com"));
        assert_eq!(target.uri.port_u16(), Some(8443));
        assert_eq!(target.uri.path_and_query().unwrap(), "/in?token=s3cret");
        assert!(target.authorization.is_none());
        assert_eq!(
            target.url().as_str(),
            "https://hooks.example.com:8443/in?token=s3cret"
        );
    }

    #[test]
    fn url_credentials_become_sensitive_basic_authorization() {
        let target = Target::parse("http://us%65r:p%40ss@127.0.0.1:9/hook").unwrap();
        let auth = target.authorization.clone().unwrap();
        // base64("user:p@ss")
        assert_eq!(auth, "Basic dXNlcjpwQHNz");
        assert!(auth.is_sensitive());
        assert_eq!(target.uri.authority().unwrap().as_str(), "127.0.0.1:9");
        assert!(!target.url().as_str().contains("p%40ss"));
    }

    #[test]
    fn debug_shows_no_path_query_or_credentials() {
        let target = Target::parse("https://u:pw@hooks.example.com/in/abc?token=s3cret").unwrap();
        let shown = format!("{target:?}");
        assert_eq!(shown, "Target(https://hooks.example.com/…)");
        let request = OutboundRequest {
            target,
            headers: HeaderMap::new(),
            body: Bytes::new(),
        };
        let shown = format!("{request:?}");
        for secret in ["s3cret", "abc", "pw", "Basic"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
    }

    #[test]
    fn only_http_urls_with_a_host_are_targets() {
        for bad in [
            "ftp://example.com/",
            "mailto:a@example.com",
            "file:///etc/passwd",
        ] {
            let url = Url::parse(bad).unwrap();
            assert_eq!(Target::new(url).unwrap_err(), TargetError::NotHttp, "{bad}");
        }
        assert!(
            Target::parse("not a url")
                .unwrap_err()
                .starts_with("does not parse")
        );
    }
}
