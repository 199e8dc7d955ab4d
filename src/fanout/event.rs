//! One input record's own work, done in the future the fan-out runs for it, so that the stage
//! loop never waits on the store or the broker. For an event: whether the store already has it
//! (a repeat, dropped; or a different event reusing its id, for the invalid topic), producing its
//! delivery records, and recording it in the store once the broker has them all. Only then does
//! its input offset settle, so a crash at any point reads the event again, and a repeat read
//! after its record in the store is dropped rather than sent twice. A store that does not
//! answer the lookup does not stop delivery: the event is fanned out as new.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rdkafka::Message;
use rdkafka::message::OwnedMessage;
use tokio_util::sync::CancellationToken;

use super::invalid_record;
use crate::input::{InvalidInput, InvalidReason};
use crate::stage::{Outgoing, Tp, Written, produce_until_acked, until_stored};
use crate::storage::{DeliveryStore, EventMark, EventRow};
use crate::telemetry;

/// What the work of every input record shares.
pub(super) struct Shared {
    pub(super) producer: crate::kafka::Producer,
    pub(super) store: Arc<dyn DeliveryStore>,
    /// The same tenant and event id received within this long of each other are one event.
    pub(super) dedupe_window: Duration,
    pub(super) invalid_topic: Arc<str>,
    /// The largest record the producer writes.
    pub(super) max_record: usize,
    /// Cancelled when the drain deadline passes: the work under way then does not settle.
    pub(super) stop: CancellationToken,
}

/// An event taken from an input record: the row the store keeps of it (its endpoints
/// included), its delivery records, and the input record as it was read, should it go to the
/// invalid topic.
pub(super) struct Taken {
    pub(super) row: EventRow,
    pub(super) records: Vec<Outgoing>,
    pub(super) original: OwnedMessage,
}

/// What one input record comes to.
pub(super) enum Work {
    /// One record to produce: the input record itself, for the invalid topic.
    Forward(Outgoing),
    /// An event its partition has not taken lately.
    Event(Box<Taken>),
}

/// An input record's work, done: the record settles if the broker (and, for an event, the
/// store) took everything it came to; `bytes` are no longer held.
pub(super) struct Sent {
    pub(super) written: Written,
    pub(super) bytes: usize,
}

/// What the store's copy of an event (`stored`) makes of `row`, an event read now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Known {
    /// The store has no copy received within `window` of it: it is fanned out.
    New,
    /// The same event (same fingerprint) within the window: already fanned out.
    Repeat,
    /// A different event with the same tenant and id, received at `received_at`, within the
    /// window: this one reuses its id.
    Reused { received_at: SystemTime },
}

/// Whether `row` is new, a repeat of `stored` or a different event reusing its id: copies
/// received within `window` of each other (either way round: an old record read late, or
/// read again) are one event.
pub(super) fn known(stored: Option<&EventMark>, row: &EventRow, window: Duration) -> Known {
    let Some(stored) = stored else {
        return Known::New;
    };
    let apart = match row.received_at.duration_since(stored.received_at) {
        Ok(later) => later,
        Err(earlier) => earlier.duration(),
    };
    if apart > window {
        Known::New
    } else if stored.fingerprint == row.fingerprint {
        Known::Repeat
    } else {
        Known::Reused {
            received_at: stored.received_at,
        }
    }
}

/// The invalid topic's reason for `row`, whose tenant and id a different event received at
/// `received_at` holds within `window`.
pub(super) fn reused(row: &EventRow, received_at: SystemTime, window: Duration) -> InvalidInput {
    InvalidInput::new(
        InvalidReason::ReusedId,
        format!(
            "event id {} of tenant {} belongs to a different event (another type or payload) \
             received at {}, within ingest.dedupe_window ({}); this one is not fanned out: \
             send it with an id of its own",
            row.event_id,
            row.tenant,
            humantime::format_rfc3339_millis(received_at),
            humantime::format_duration(window),
        ),
    )
}

/// Does `work`, taken from the record at `offset` of `tp`, holding `bytes` of records.
pub(super) async fn settle(
    shared: Arc<Shared>,
    tp: Tp,
    offset: i64,
    work: Work,
    bytes: usize,
) -> Sent {
    let acked = match work {
        Work::Forward(out) => produce_until_acked(&shared.producer, out, &shared.stop).await,
        Work::Event(taken) => shared.event(*taken).await,
    };
    Sent {
        written: Written { tp, offset, acked },
        bytes,
    }
}

impl Shared {
    /// Looks the event up in the store and drops it, forwards it to the invalid topic, or
    /// fans it out and records it; whether its input record may settle. The record is asked of
    /// the store again until it takes it or the drain deadline passes.
    async fn event(&self, taken: Taken) -> bool {
        let Taken {
            row,
            records,
            original,
        } = taken;
        let store = &self.store;
        // A store that does not answer does not hold up delivery: the event is fanned out as
        // new (a repeat among them is sent again, with the same `webhook-id`), and its offset
        // waits for its row below, as attempts wait for theirs.
        let stored = match store.event_mark(&row.tenant, &row.event_id).await {
            Ok(stored) => stored,
            Err(e) => {
                telemetry::store_error("event lookup", e.kind(), &e);
                None
            }
        };
        match known(stored.as_ref(), &row, self.dedupe_window) {
            Known::Repeat => {
                telemetry::event_repeated(row.tenant.as_str(), row.event_id.as_str(), false);
                true
            }
            Known::Reused { received_at } => {
                let invalid = reused(&row, received_at, self.dedupe_window);
                telemetry::invalid_record(
                    original.topic(),
                    original.partition(),
                    original.offset(),
                    invalid.reason.kind(),
                    &invalid.detail,
                );
                let headers = original.headers().cloned().unwrap_or_default();
                let out = invalid_record(
                    &original,
                    headers,
                    invalid,
                    &self.invalid_topic,
                    self.max_record,
                );
                produce_until_acked(&self.producer, out, &self.stop).await
            }
            Known::New => {
                telemetry::fanned_out(records.len());
                let sends = records
                    .into_iter()
                    .map(|r| produce_until_acked(&self.producer, r, &self.stop));
                let acked = futures::future::join_all(sends)
                    .await
                    .into_iter()
                    .all(|ok| ok);
                acked
                    && until_stored("event", &self.stop, || store.record_event(&row))
                        .await
                        .is_some()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::{EventId, Tenant};

    fn row(fingerprint: &str, received_s: u64) -> EventRow {
        EventRow {
            tenant: Tenant::parse("acme").unwrap(),
            event_id: EventId::parse("evt_1").unwrap(),
            event_type: "order.created".into(),
            occurred_at: SystemTime::UNIX_EPOCH,
            received_at: SystemTime::UNIX_EPOCH + Duration::from_secs(received_s),
            body: bytes::Bytes::from_static(b"{}"),
            fingerprint: fingerprint.into(),
            endpoints: vec![],
        }
    }

    #[test]
    fn a_copy_within_the_window_is_a_repeat_or_a_reused_id() {
        let window = Duration::from_secs(100);
        let first = row("aa", 1_000);
        let first = EventMark {
            fingerprint: first.fingerprint,
            received_at: first.received_at,
        };
        assert_eq!(known(None, &row("aa", 1_000), window), Known::New);
        assert_eq!(
            known(Some(&first), &row("aa", 1_000), window),
            Known::Repeat
        );
        assert_eq!(
            known(Some(&first), &row("aa", 1_100), window),
            Known::Repeat
        );
        assert_eq!(
            known(Some(&first), &row("aa", 900), window),
            Known::Repeat,
            "an older record read late"
        );
        assert_eq!(
            known(Some(&first), &row("bb", 1_050), window),
            Known::Reused {
                received_at: first.received_at
            }
        );
        assert_eq!(known(Some(&first), &row("aa", 1_101), window), Known::New);
        assert_eq!(known(Some(&first), &row("bb", 899), window), Known::New);
    }

    #[test]
    fn a_reused_id_says_whose_and_since_when() {
        let first = row("aa", 1_000);
        let invalid = reused(
            &row("bb", 1_010),
            first.received_at,
            Duration::from_secs(3600),
        );
        assert_eq!(invalid.reason.code(), "reused_id");
        for part in [
            "evt_1",
            "acme",
            "1970-01-01T00:16:40.000Z",
            "1h",
            "dedupe_window",
        ] {
            assert!(invalid.detail.contains(part), "{part}: {}", invalid.detail);
        }
    }
}
