//! What a replay of a range of DLQ offsets is asked ([`ReplayRequest`]) and answers
//! ([`ReplaySummary`]), and where any replay reads and writes ([`ReplayTarget`]).

use crate::id::EndpointId;

use super::ReplayError;

/// What to replay.
#[derive(Debug, Clone)]
pub struct ReplayRequest {
    /// DLQ partition.
    pub partition: i32,
    /// First offset, inclusive.
    pub from_offset: i64,
    /// Last offset, inclusive.
    pub to_offset: i64,
    /// Only records for this endpoint.
    pub endpoint: Option<EndpointId>,
    /// Who asks.
    pub actor: String,
    /// Why.
    pub reason: String,
    /// Count what would be replayed, publish nothing.
    pub dry_run: bool,
}

/// Who asked for a replay of one delivery, and why, for its audit entry.
#[derive(Debug, Clone)]
pub struct Asked {
    /// Who asks, in the caller's words.
    pub actor: String,
    /// Why.
    pub reason: String,
    /// Which credential asked, as the admin API established it.
    pub asked_by: Option<String>,
}

impl ReplayRequest {
    /// Checks what needs no server: a non-negative partition, an offset range, and an actor and
    /// a reason that are not blank. Callers run it before connecting to anything, so a typo
    /// fails at once instead of after a store or broker timeout; [`replay`] runs it too.
    pub fn validate(&self) -> Result<(), ReplayError> {
        if self.partition < 0 {
            return Err(ReplayError::BadRequest(format!(
                "--partition {} is negative; DLQ partitions are numbered from 0",
                self.partition
            )));
        }
        if self.from_offset < 0 || self.to_offset < self.from_offset {
            return Err(ReplayError::BadRequest(format!(
                "--from-offset {} .. --to-offset {} is not a range (from must be >= 0 and <= to)",
                self.from_offset, self.to_offset
            )));
        }
        for (flag, value) in [("--actor", &self.actor), ("--reason", &self.reason)] {
            if value.trim().is_empty() {
                return Err(ReplayError::BadRequest(format!(
                    "{flag} must not be blank: it is recorded in the audit trail"
                )));
            }
        }
        Ok(())
    }
}

/// Where replay reads and writes.
#[derive(Debug, Clone)]
pub struct ReplayTarget {
    /// Bootstrap servers.
    pub bootstrap: String,
    /// Client overrides (`kafka.client`; secret ones redacted in `Debug`).
    pub client: crate::kafka::ClientProperties,
    /// The DLQ topic.
    pub dlq: String,
    /// The deliveries topic.
    pub deliveries: String,
}

/// What a replay did (the admin API answers with it).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReplaySummary {
    /// The replay id receivers see.
    pub replay_id: String,
    /// DLQ records read in the range.
    pub scanned: u64,
    /// Records republished (or, in a dry run, that would be).
    pub replayed: u64,
    /// Records skipped by the endpoint filter.
    pub filtered: u64,
    /// Records in the range that are not hookline DLQ records (left alone); named as
    /// `hookline replay` prints it.
    #[serde(rename = "skipped_not_dead_letters")]
    pub undecodable: u64,
    /// Records whose delivery another replay was sending at that moment (republished by it
    /// and not attempted yet, or claimed by it): left to that replay, so that it is sent once.
    pub skipped_being_replayed: u64,
    /// The range's last offset as replayed: `to_offset`, or the partition's last record when
    /// the replay began if that came first. A replay that stops short of it is an error,
    /// [`ReplayError::Incomplete`], never a summary.
    pub last_offset: i64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::fixture::request;

    fn problem(request: ReplayRequest) -> String {
        request
            .validate()
            .expect_err("the request should be refused")
            .to_string()
    }
    #[test]
    fn the_target_keeps_secret_client_properties_out_of_debug() {
        let target = ReplayTarget {
            bootstrap: "kafka:9092".into(),
            client: std::collections::BTreeMap::from([
                ("sasl.password".to_owned(), "supersecret_sasl".to_owned()),
                ("sasl.username".to_owned(), "replayer".to_owned()),
            ])
            .into(),
            dlq: "hookline.dlq".into(),
            deliveries: "hookline.deliveries".into(),
        };
        let dbg = format!("{target:?}");
        assert!(!dbg.contains("supersecret"), "{dbg}");
        assert!(dbg.contains("\"sasl.password\": \"<redacted>\""), "{dbg}");
        assert!(dbg.contains("\"sasl.username\": \"replayer\""), "{dbg}");
    }

    #[test]
    fn a_sound_request_passes_including_a_single_offset() {
        request().validate().unwrap();
        ReplayRequest {
            partition: 0,
            from_offset: 0,
            to_offset: 0,
            ..request()
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn each_local_mistake_is_named() {
        for (broken, expected) in [
            (
                ReplayRequest {
                    partition: -1,
                    ..request()
                },
                "--partition -1 is negative; DLQ partitions are numbered from 0",
            ),
            (
                ReplayRequest {
                    from_offset: 5,
                    to_offset: 1,
                    ..request()
                },
                "--from-offset 5 .. --to-offset 1 is not a range (from must be >= 0 and <= to)",
            ),
            (
                ReplayRequest {
                    from_offset: -2,
                    ..request()
                },
                "--from-offset -2 .. --to-offset 20 is not a range (from must be >= 0 and <= to)",
            ),
            (
                ReplayRequest {
                    actor: " \t".into(),
                    ..request()
                },
                "--actor must not be blank: it is recorded in the audit trail",
            ),
            (
                ReplayRequest {
                    reason: String::new(),
                    ..request()
                },
                "--reason must not be blank: it is recorded in the audit trail",
            ),
        ] {
            assert_eq!(problem(broken), expected);
        }
    }
}
