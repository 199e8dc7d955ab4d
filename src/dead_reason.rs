//! Why a delivery was dead-lettered: the reasons the retry policy and the delivery stage give.

use std::fmt;

/// Why a delivery was dead-lettered. The string forms appear in DLQ headers, the attempt log and
/// metric labels, and must not change.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    strum::EnumIter,
    strum::IntoStaticStr,
    strum::EnumString,
)]
#[strum(serialize_all = "snake_case")]
pub enum DeadReason {
    /// A status that retrying cannot fix (4xx other than the retryable ones, 1xx, unknown).
    HttpStatus,
    /// A 3xx: redirects are never followed.
    Redirect,
    /// 410 Gone: the endpoint is disabled as well.
    Gone,
    /// The endpoint's address is blocked by the SSRF policy.
    SsrfBlocked,
    /// Plain http while it is not allowed.
    InsecureScheme,
    /// The endpoint's URL is unusable.
    InvalidUrl,
    /// Retries were still warranted, but the total window since the first attempt is spent.
    WindowExhausted,
    /// The endpoint was deleted while the delivery was pending.
    EndpointDeleted,
    /// The endpoint is disabled (by its owner, or after a 410).
    EndpointDisabled,
    /// The endpoint has no active signing secret, so nothing may be sent.
    NoSigningKey,
}

impl DeadReason {
    /// Every reason, in declaration order (for metrics pre-registration and tests).
    pub fn all() -> impl Iterator<Item = DeadReason> {
        <DeadReason as strum::IntoEnumIterator>::iter()
    }

    /// The stable string form: the variant's name in snake case.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Parses the string form back.
    pub fn parse(s: &str) -> Option<DeadReason> {
        s.parse().ok()
    }
}

impl fmt::Display for DeadReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_reason_strings_round_trip() {
        for r in DeadReason::all() {
            assert_eq!(DeadReason::parse(r.as_str()), Some(r));
        }
        assert_eq!(DeadReason::parse("Gone"), None);
    }

    /// The strings are hookline's interface (DLQ headers, stored attempt rows, metric labels):
    /// pinned here.
    #[test]
    fn dead_reason_strings_are_stable() {
        let all: Vec<&str> = DeadReason::all().map(DeadReason::as_str).collect();
        assert_eq!(
            all,
            [
                "http_status",
                "redirect",
                "gone",
                "ssrf_blocked",
                "insecure_scheme",
                "invalid_url",
                "window_exhausted",
                "endpoint_deleted",
                "endpoint_disabled",
                "no_signing_key",
            ]
        );
    }
}
