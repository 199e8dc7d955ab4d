//! What one delivery attempt produced, in words every stage shares.
//!
//! The sender fills these in; it never decides whether to retry. The retry policy classifies them;
//! the attempt log, metrics and the CLI print the [`ErrorClass`] strings as they are.

use std::fmt;
use std::time::Duration;

/// Why an attempt did not end in an HTTP status, or what kind of status it ended in.
///
/// The string forms (`as_str`) are part of hookline's interface: they appear in the attempt log,
/// in metric labels and in `hookline send` output, and must not change.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    strum::EnumIter,
    strum::IntoStaticStr,
    strum::EnumString,
)]
#[strum(serialize_all = "snake_case")]
pub enum ErrorClass {
    /// The URL's host is, or resolved to, an address the SSRF policy blocks.
    SsrfBlocked,
    /// Plain `http://` while the dangerous switch that allows it is off.
    InsecureScheme,
    /// The URL cannot be parsed or is not an http(s) URL with a host.
    InvalidUrl,
    /// The host name did not resolve.
    Dns,
    /// The TCP connection failed (refused, reset, unreachable, connect timeout).
    Connect,
    /// The TLS handshake failed.
    Tls,
    /// The attempt ran past its total timeout.
    Timeout,
    /// The receiver answered with a non-2xx, non-3xx status.
    HttpStatus,
    /// The receiver answered with a 3xx; redirects are never followed.
    Redirect,
    /// Nothing was sent: the endpoint was deleted or disabled, has no signing secret, or held
    /// the delivery back past its window. The attempt row's error says which.
    NotSent,
}

impl ErrorClass {
    /// Every class, in declaration order (for metrics pre-registration and tests).
    pub fn all() -> impl Iterator<Item = ErrorClass> {
        <ErrorClass as strum::IntoEnumIterator>::iter()
    }

    /// The stable string form used in logs, metrics, the attempt log and CLI output: the
    /// variant's name in snake case.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Parses the string form back (attempt-log rows, headers).
    pub fn parse(s: &str) -> Option<ErrorClass> {
        s.parse().ok()
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The receiver's answer, as far as hookline reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    /// HTTP status code.
    pub status: u16,
    /// The raw `Retry-After` header value, if the receiver sent one (parsed by the retry policy).
    pub retry_after: Option<String>,
    /// The first bytes of the response body (at most [`MAX_STORED_BODY`]).
    pub body: Vec<u8>,
}

/// At most this many bytes of a response body are read and kept.
pub const MAX_STORED_BODY: usize = 4096;

/// What one attempt produced: an HTTP response, or an error before a response arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptResult {
    /// A response arrived (any status).
    Response(HttpResponse),
    /// No response: the request was refused before sending, or failed in transit.
    Failed {
        /// What went wrong, in the shared vocabulary.
        class: ErrorClass,
        /// A human-readable detail for logs and the CLI (never contains secrets).
        detail: String,
    },
}

/// An [`AttemptResult`] with how long it took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// What came back.
    pub result: AttemptResult,
    /// Wall time from the start of the attempt to its end.
    pub latency: Duration,
}

impl AttemptResult {
    /// The error class this result is logged under: `None` for a 2xx, `redirect` for a 3xx,
    /// `http_status` for any other status, and the failure's own class otherwise.
    pub fn error_class(&self) -> Option<ErrorClass> {
        match self {
            AttemptResult::Response(r) if (200..300).contains(&r.status) => None,
            AttemptResult::Response(r) if (300..400).contains(&r.status) => {
                Some(ErrorClass::Redirect)
            }
            AttemptResult::Response(_) => Some(ErrorClass::HttpStatus),
            AttemptResult::Failed { class, .. } => Some(*class),
        }
    }

    /// The HTTP status, when a response arrived.
    pub fn status(&self) -> Option<u16> {
        match self {
            AttemptResult::Response(r) => Some(r.status),
            AttemptResult::Failed { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_class_strings_round_trip() {
        for c in ErrorClass::all() {
            assert_eq!(ErrorClass::parse(c.as_str()), Some(c));
        }
        assert_eq!(ErrorClass::parse("nope"), None);
        assert_eq!(ErrorClass::parse("SsrfBlocked"), None);
    }

    /// The strings are hookline's interface (stored attempt rows, metric labels): pinned here.
    #[test]
    fn error_class_strings_are_stable() {
        let all: Vec<&str> = ErrorClass::all().map(ErrorClass::as_str).collect();
        assert_eq!(
            all,
            [
                "ssrf_blocked",
                "insecure_scheme",
                "invalid_url",
                "dns",
                "connect",
                "tls",
                "timeout",
                "http_status",
                "redirect",
                "not_sent",
            ]
        );
    }

    #[test]
    fn statuses_map_to_classes() {
        let r = |status| {
            AttemptResult::Response(HttpResponse {
                status,
                retry_after: None,
                body: vec![],
            })
        };
        assert_eq!(r(204).error_class(), None);
        assert_eq!(r(302).error_class(), Some(ErrorClass::Redirect));
        assert_eq!(r(404).error_class(), Some(ErrorClass::HttpStatus));
        assert_eq!(r(503).error_class(), Some(ErrorClass::HttpStatus));
    }
}
