//! Recording a note: a change of a delivery's state that no attempt made (parked in a delay
//! tier, dead-lettered unsent), as a row of the delivery's log (attempt 0), with, for a dead
//! note, its dead letter, as a dead attempt has ([`entry_index`](super::entry_index)): DLQ
//! listings and endpoint replays see deliveries dead-lettered without an attempt too. Like an
//! attempt, a note writes a history entry only for a delivery fanned out before version 7.

use scylla::SerializeRow;
use scylla::value::CqlTimestamp;

use super::ScyllaStore;
use super::entry_index::{DeadLetterRow, Entry};
use super::row::{bucket_of, to_cql};
use crate::storage::{DeliveryNote, NoteKind, StoreError};

/// The `note` column of a parked note.
pub(super) const PARKED: &str = "parked";
/// The `note` column of a dead note.
pub(super) const DEAD: &str = "dead";

/// The columns every note row of a delivery's log has.
#[derive(SerializeRow)]
pub(super) struct LogRowKey<'a> {
    pub(super) delivery_id: &'a str,
    /// The row's time (the column is named for attempts).
    pub(super) started_at: CqlTimestamp,
    pub(super) event_id: &'a str,
    pub(super) endpoint_id: &'a str,
    pub(super) tenant: &'a str,
    pub(super) event_type: &'a str,
    pub(super) ttl: i32,
}

/// A note's row in `attempts_by_delivery`.
#[derive(SerializeRow)]
struct NoteValues<'a> {
    #[scylla(flatten)]
    key: LogRowKey<'a>,
    replay_id: Option<&'a str>,
    note: &'static str,
    park_reason: Option<&'static str>,
    next_attempt_at: Option<CqlTimestamp>,
    dead_reason: Option<&'static str>,
}

impl ScyllaStore {
    /// Writes `note`'s row, its dead letter (a dead note), its history entry (a delivery
    /// fanned out before version 7) and the bucket-index rows not written yet, concurrently;
    /// `Ok` once all are durable.
    pub(super) async fn log_note(&self, note: &DeliveryNote) -> Result<(), StoreError> {
        let at = to_cql(note.at);
        let (kind, park_reason, next_attempt_at, dead_reason) = match note.kind {
            NoteKind::Parked {
                reason,
                next_attempt_at,
            } => (
                PARKED,
                Some(reason.as_str()),
                Some(to_cql(next_attempt_at)),
                None,
            ),
            NoteKind::Dead { reason } => (DEAD, None, None, Some(reason.as_str())),
        };
        let dead = dead_reason.map(|reason| DeadLetterRow {
            endpoint_id: note.endpoint_id.as_str().to_owned(),
            bucket: bucket_of(at),
            dead_at: at,
            delivery_id: note.delivery_id.as_str().to_owned(),
            event_id: note.event_id.as_str().to_owned(),
            tenant: note.tenant.as_str().to_owned(),
            event_type: note.event_type.clone(),
            attempt: 0,
            reason,
            last_status: None,
            ttl: self.attempt_ttl,
        });
        let row = self.write(
            &self.st.attempt.insert_note,
            NoteValues {
                key: LogRowKey {
                    delivery_id: note.delivery_id.as_str(),
                    started_at: at,
                    event_id: note.event_id.as_str(),
                    endpoint_id: note.endpoint_id.as_str(),
                    tenant: note.tenant.as_str(),
                    event_type: &note.event_type,
                    ttl: self.attempt_ttl,
                },
                replay_id: note.replay_id.as_deref(),
                note: kind,
                park_reason,
                next_attempt_at,
                dead_reason,
            },
        );
        let entry = Entry::of_log(&note.delivery_id, &note.event_id);
        let index = self.index_entry(&note.endpoint_id, &note.delivery_id, at, entry, dead);
        tokio::try_join!(row, index)?;
        Ok(())
    }
}
