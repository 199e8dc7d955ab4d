//! The stores' events: attempt-log writes and their failures, and the CQL store's TLS files.

use std::time::{Duration, Instant};

use metrics::{counter, gauge};

use super::handle::Hot;
use super::name;
use crate::repeat_log::RepeatLog;

/// An attempt's row became durable `took` after the first try to write it.
pub fn store_written(took: Duration) {
    Hot::with(|hot| hot.store_written.record(took.as_secs_f64()));
}

/// Which of the CQL store's TLS files: the CAs (`tls.ca_file`) or hookline's own certificate
/// and key (`tls.cert_file`, `tls.key_file`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CqlTlsFile {
    Ca,
    ClientCert,
}

impl CqlTlsFile {
    fn as_str(self) -> &'static str {
        match self {
            CqlTlsFile::Ca => "ca",
            CqlTlsFile::ClientCert => "client_cert",
        }
    }
}

/// Registers `file`'s re-read series at zero: the store reads it again when it changes.
pub fn cql_tls_watched(file: CqlTlsFile) {
    for outcome in ["used", "refused"] {
        counter!(name::STORE_TLS_REREADS, "file" => file.as_str(), "outcome" => outcome)
            .increment(0);
    }
}

/// The CQL client certificate now in use expires `at`.
pub fn cql_client_cert_expiry(at: std::time::SystemTime) {
    let secs = at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    gauge!(name::STORE_TLS_CERT_EXPIRY).set(secs);
}

/// Whether the CQL store's `file` on disk is refused (the files read before are in use).
pub fn cql_tls_refused(file: CqlTlsFile, refused: bool) {
    let label = file.as_str();
    gauge!(name::STORE_TLS_REFUSED, "file" => label).set(if refused { 1.0 } else { 0.0 });
}

/// The CQL store's `file` changed and was read again: `used`, or refused as unusable.
pub fn cql_tls_reread(file: CqlTlsFile, used: bool) {
    let outcome = if used { "used" } else { "refused" };
    counter!(name::STORE_TLS_REREADS, "file" => file.as_str(), "outcome" => outcome).increment(1);
}

/// The process's failed store calls, for [`store_error`]'s log.
static STORE_ERROR_LOG: RepeatLog = RepeatLog::new();

/// A store call the pipeline makes before settling a record failed (`what`: `attempt`,
/// `note`, `event`, `event lookup`); the record stays unsettled and the write is tried again
/// (a lookup is not: the fan-out goes on without its answer).
/// Counted every time; logged as [`RepeatLog`] allows, per call and `kind` of error
/// (unreachable, or anything else).
pub fn store_error(what: &'static str, kind: &'static str, error: &dyn std::fmt::Display) {
    counter!(name::STORE_ERRORS).increment(1);
    if let Some(held_back) = STORE_ERROR_LOG.admit(&format!("{what}:{kind}"), Instant::now()) {
        tracing::warn!(call = what, error = %error, held_back, "store call failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::capture::logged_and_exported;

    /// A store that is down fails every unsettled record's write every few seconds: each kind of
    /// failure of each call is one log line, while the counter counts every failure. (The only
    /// test in this binary that fails store calls, so the process-wide gate starts empty.)
    #[test]
    fn a_failing_attempt_log_is_logged_once_per_kind_and_counted_every_time() {
        let (text, rendered) = logged_and_exported(|| {
            for n in 0..500 {
                store_error(
                    "attempt",
                    "unavailable",
                    &format!("store unavailable: node {n} timed out"),
                );
            }
            store_error(
                "attempt",
                "backend",
                &"store error: keyspace hookline missing",
            );
            store_error(
                "attempt",
                "backend",
                &"store error: keyspace hookline missing",
            );
            store_error(
                "event",
                "backend",
                &"store error: keyspace hookline missing",
            );
        });
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines[0].contains("store unavailable: node 0 timed out"),
            "{text}"
        );
        assert!(lines[1].contains("keyspace hookline missing"), "{text}");
        assert!(
            lines[2].contains("call=\"event\"") || lines[2].contains("call=event"),
            "each call is its own kind: {text}"
        );
        assert!(
            rendered
                .lines()
                .any(|l| l == "hookline_store_errors_total 503"),
            "{rendered}"
        );
    }
}
