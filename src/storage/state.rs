//! A delivery's state, derived from the entries a store holds of it: its creation at fan-out,
//! its attempts, and the notes the delivery stage left (parked, dead without an attempt).
//!
//! Both stores fold their entries through [`Derivation`], in whatever order they read or
//! receive them: the result depends only on the set of entries. Entries are ordered by time;
//! at one time a creation comes before a note, a note before an attempt, and attempts by
//! number. The latest entry that is not a creation sets the status, so a creation written
//! after the first attempt (the fan-out records its event once every record is acknowledged,
//! and the delivery stage may be faster) never sets a delivery back to pending.

use std::time::SystemTime;

use crate::attempt::ErrorClass;
use crate::id::{DeliveryId, EndpointId, EventId, Tenant};

use super::{
    AttemptOutcome, AttemptRow, DeliveryNote, DeliveryState, DeliveryStatus, NoteKind,
    ScheduleReason, Scheduled,
};

/// What one entry says of a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// The fan-out produced it.
    Created,
    /// The delivery stage parked it or dead-lettered it without an attempt.
    Note(NoteKind),
    /// An HTTP attempt.
    Attempt {
        /// Its number.
        attempt: u32,
        /// Its HTTP status, if a response arrived.
        status: Option<u16>,
        /// Its error class, `None` for a 2xx.
        error_class: Option<ErrorClass>,
        /// What it led to.
        outcome: AttemptOutcome,
    },
}

/// One entry: what it says, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The entry's time (fan-out's `received_at`, the note's time, the attempt's start).
    pub at: SystemTime,
    /// What it says.
    pub kind: EntryKind,
}

impl Entry {
    /// The entry of an attempt.
    pub fn attempt(row: &AttemptRow) -> Entry {
        Entry {
            at: row.started_at,
            kind: EntryKind::Attempt {
                attempt: row.attempt,
                status: row.status,
                error_class: row.error_class,
                outcome: row.outcome,
            },
        }
    }

    /// The entry of a note.
    pub fn note(note: &DeliveryNote) -> Entry {
        Entry {
            at: note.at,
            kind: EntryKind::Note(note.kind),
        }
    }

    /// The entry of the delivery's creation at `at`.
    pub fn created(at: SystemTime) -> Entry {
        Entry {
            at,
            kind: EntryKind::Created,
        }
    }

    /// Where the entry sorts: time, then creation < note < attempt, then attempt number.
    fn key(&self) -> (SystemTime, u8, u32) {
        match self.kind {
            EntryKind::Created => (self.at, 0, 0),
            EntryKind::Note(_) => (self.at, 1, 0),
            EntryKind::Attempt { attempt, .. } => (self.at, 2, attempt),
        }
    }
}

/// What every entry of a delivery repeats: which delivery it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The delivery.
    pub delivery_id: DeliveryId,
    /// The event.
    pub event_id: EventId,
    /// The endpoint.
    pub endpoint_id: EndpointId,
    /// The endpoint's tenant.
    pub tenant: Tenant,
    /// The event's type.
    pub event_type: String,
}

impl Identity {
    /// The identity an attempt row names.
    pub fn of_attempt(row: &AttemptRow) -> Identity {
        Identity {
            delivery_id: row.delivery_id.clone(),
            event_id: row.event_id.clone(),
            endpoint_id: row.endpoint_id.clone(),
            tenant: row.tenant.clone(),
            event_type: row.event_type.clone(),
        }
    }

    /// The identity a note names.
    pub fn of_note(note: &DeliveryNote) -> Identity {
        Identity {
            delivery_id: note.delivery_id.clone(),
            event_id: note.event_id.clone(),
            endpoint_id: note.endpoint_id.clone(),
            tenant: note.tenant.clone(),
            event_type: note.event_type.clone(),
        }
    }
}

/// A delivery's entries folded so far; [`Derivation::state`] is the state they imply. Adding
/// the same entries in any order gives the same state; of two entries with the same place in
/// the order (the same row, written twice), the one added last counts, as a CQL row's last
/// write does.
#[derive(Debug, Clone, PartialEq)]
pub struct Derivation {
    identity: Identity,
    /// The earliest creation entry's time.
    created: Option<SystemTime>,
    earliest: SystemTime,
    latest_any: SystemTime,
    /// The latest entry that is not a creation.
    latest: Option<Entry>,
    /// The latest attempt.
    latest_attempt: Option<Entry>,
    attempts: u32,
    first_attempt_at: Option<SystemTime>,
}

impl Derivation {
    /// The fold of one entry of the delivery `identity` names.
    pub fn new(identity: Identity, entry: Entry) -> Derivation {
        let mut d = Derivation {
            identity,
            created: None,
            earliest: entry.at,
            latest_any: entry.at,
            latest: None,
            latest_attempt: None,
            attempts: 0,
            first_attempt_at: None,
        };
        d.add(entry);
        d
    }

    /// Folds in one more entry.
    pub fn add(&mut self, entry: Entry) {
        self.earliest = self.earliest.min(entry.at);
        self.latest_any = self.latest_any.max(entry.at);
        let later = |kept: &Option<Entry>| kept.is_none_or(|k| entry.key() >= k.key());
        match entry.kind {
            EntryKind::Created => {
                self.created = Some(self.created.map_or(entry.at, |c| c.min(entry.at)));
                return;
            }
            EntryKind::Attempt { .. } => {
                self.attempts = self.attempts.saturating_add(1);
                self.first_attempt_at =
                    Some(self.first_attempt_at.map_or(entry.at, |f| f.min(entry.at)));
                if later(&self.latest_attempt) {
                    self.latest_attempt = Some(entry);
                }
            }
            EntryKind::Note(_) => {}
        }
        if later(&self.latest) {
            self.latest = Some(entry);
        }
    }

    /// When the store first heard of the delivery: its creation, else its earliest entry. The
    /// delivery's place in its endpoint's history.
    pub fn created_at(&self) -> SystemTime {
        self.created.unwrap_or(self.earliest)
    }

    /// Which delivery this is.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The state the entries imply.
    pub fn state(&self) -> DeliveryState {
        let (status, scheduled, dead_reason) = match self.latest.map(|e| e.kind) {
            None | Some(EntryKind::Created) => (DeliveryStatus::Pending, None, None),
            Some(EntryKind::Attempt { outcome, .. }) => match outcome {
                AttemptOutcome::Succeeded => (DeliveryStatus::Succeeded, None, None),
                AttemptOutcome::RetryScheduled { next_attempt_at } => (
                    DeliveryStatus::Scheduled,
                    Some(Scheduled {
                        reason: ScheduleReason::Retry,
                        next_attempt_at,
                    }),
                    None,
                ),
                AttemptOutcome::Dead { reason } => (DeliveryStatus::Dead, None, Some(reason)),
            },
            Some(EntryKind::Note(NoteKind::Parked {
                reason,
                next_attempt_at,
            })) => (
                DeliveryStatus::Scheduled,
                Some(Scheduled {
                    reason: ScheduleReason::Parked(reason),
                    next_attempt_at,
                }),
                None,
            ),
            Some(EntryKind::Note(NoteKind::Dead { reason })) => {
                (DeliveryStatus::Dead, None, Some(reason))
            }
        };
        let (last_attempt_at, last_status, last_error_class) = match self.latest_attempt {
            Some(Entry {
                at,
                kind:
                    EntryKind::Attempt {
                        status,
                        error_class,
                        ..
                    },
            }) => (Some(at), status, error_class),
            _ => (None, None, None),
        };
        let id = &self.identity;
        DeliveryState {
            delivery_id: id.delivery_id.clone(),
            event_id: id.event_id.clone(),
            endpoint_id: id.endpoint_id.clone(),
            tenant: id.tenant.clone(),
            event_type: id.event_type.clone(),
            status,
            attempts: self.attempts,
            created_at: self.created_at(),
            updated_at: self.latest_any,
            first_attempt_at: self.first_attempt_at,
            last_attempt_at,
            scheduled,
            dead_reason,
            last_status,
            last_error_class,
        }
    }
}

/// The state `entries` imply for the delivery `identity` names; `None` without entries.
pub fn derive(
    identity: Identity,
    entries: impl IntoIterator<Item = Entry>,
) -> Option<DeliveryState> {
    let mut entries = entries.into_iter();
    let mut d = Derivation::new(identity, entries.next()?);
    for e in entries {
        d.add(e);
    }
    Some(d.state())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::dead_reason::DeadReason;
    use crate::park_reason::ParkReason;

    fn t(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s)
    }

    fn identity() -> Identity {
        let event_id = EventId::parse("evt_1").unwrap();
        let endpoint_id = EndpointId::parse("ep_1").unwrap();
        Identity {
            delivery_id: DeliveryId::derive(&event_id, &endpoint_id),
            event_id,
            endpoint_id,
            tenant: Tenant::parse("acme").unwrap(),
            event_type: "order.created".into(),
        }
    }

    fn attempt(at: u64, n: u32, outcome: AttemptOutcome) -> Entry {
        let status = match outcome {
            AttemptOutcome::Succeeded => Some(200),
            _ => Some(503),
        };
        Entry {
            at: t(at),
            kind: EntryKind::Attempt {
                attempt: n,
                status,
                error_class: (status != Some(200)).then_some(ErrorClass::HttpStatus),
                outcome,
            },
        }
    }

    fn retry(at: u64, n: u32) -> Entry {
        attempt(
            at,
            n,
            AttemptOutcome::RetryScheduled {
                next_attempt_at: t(at + 30),
            },
        )
    }

    fn parked(at: u64, reason: ParkReason) -> Entry {
        Entry {
            at: t(at),
            kind: EntryKind::Note(NoteKind::Parked {
                reason,
                next_attempt_at: t(at + 60),
            }),
        }
    }

    fn dead_note(at: u64, reason: DeadReason) -> Entry {
        Entry {
            at: t(at),
            kind: EntryKind::Note(NoteKind::Dead { reason }),
        }
    }

    /// Every order of `entries`, for small lists.
    fn permutations(entries: &[Entry]) -> Vec<Vec<Entry>> {
        if entries.len() <= 1 {
            return vec![entries.to_vec()];
        }
        let mut out = vec![];
        for i in 0..entries.len() {
            let mut rest = entries.to_vec();
            let first = rest.remove(i);
            for mut p in permutations(&rest) {
                p.insert(0, first);
                out.push(p);
            }
        }
        out
    }

    fn derive_all_orders(entries: &[Entry]) -> DeliveryState {
        let states: Vec<DeliveryState> = permutations(entries)
            .into_iter()
            .map(|p| derive(identity(), p).unwrap())
            .collect();
        for s in &states {
            assert_eq!(s, &states[0], "the order entries come in changes nothing");
        }
        states[0].clone()
    }

    #[test]
    fn no_entries_no_state() {
        assert_eq!(derive(identity(), []), None);
    }

    #[test]
    fn a_created_delivery_alone_is_pending_with_no_attempts() {
        let s = derive(identity(), [Entry::created(t(0))]).unwrap();
        assert_eq!(s.status, DeliveryStatus::Pending);
        assert_eq!(s.attempts, 0);
        assert_eq!((s.created_at, s.updated_at), (t(0), t(0)));
        assert_eq!((s.first_attempt_at, s.last_attempt_at), (None, None));
        assert_eq!((s.scheduled, s.dead_reason), (None, None));
        assert_eq!((s.last_status, s.last_error_class), (None, None));
        assert_eq!(s.event_id.as_str(), "evt_1");
    }

    #[test]
    fn the_latest_attempt_sets_the_status_in_any_order() {
        let s = derive_all_orders(&[
            Entry::created(t(0)),
            retry(1, 1),
            attempt(40, 2, AttemptOutcome::Succeeded),
        ]);
        assert_eq!(s.status, DeliveryStatus::Succeeded);
        assert_eq!(s.attempts, 2);
        assert_eq!(s.first_attempt_at, Some(t(1)));
        assert_eq!(s.last_attempt_at, Some(t(40)));
        assert_eq!((s.created_at, s.updated_at), (t(0), t(40)));
        assert_eq!((s.last_status, s.last_error_class), (Some(200), None));
        assert_eq!(s.scheduled, None);

        let s = derive_all_orders(&[Entry::created(t(0)), retry(1, 1)]);
        assert_eq!(s.status, DeliveryStatus::Scheduled);
        assert_eq!(
            s.scheduled,
            Some(Scheduled {
                reason: ScheduleReason::Retry,
                next_attempt_at: t(31)
            })
        );
        assert_eq!(s.last_error_class, Some(ErrorClass::HttpStatus));
    }

    #[test]
    fn a_creation_written_after_an_attempt_never_overrides_it() {
        // The fan-out's creation can be later in time than the first attempt (clocks) and is
        // often written after it: neither makes the delivery pending again.
        let s = derive_all_orders(&[
            attempt(5, 1, AttemptOutcome::Succeeded),
            Entry::created(t(10)),
        ]);
        assert_eq!(s.status, DeliveryStatus::Succeeded);
        assert_eq!(s.attempts, 1);
        assert_eq!(
            s.created_at,
            t(10),
            "the creation's time, when there is one"
        );
        assert_eq!(s.updated_at, t(10));
        let mut d = Derivation::new(identity(), retry(5, 1));
        d.add(Entry::created(t(0)));
        assert_eq!(d.state().status, DeliveryStatus::Scheduled);
        assert_eq!(d.state().created_at, t(0));
    }

    #[test]
    fn notes_alone_are_not_attempts() {
        let s = derive_all_orders(&[
            parked(3, ParkReason::BreakerOpen),
            dead_note(9, DeadReason::WindowExhausted),
        ]);
        assert_eq!(s.status, DeliveryStatus::Dead);
        assert_eq!(s.dead_reason, Some(DeadReason::WindowExhausted));
        assert_eq!(s.attempts, 0);
        assert_eq!((s.first_attempt_at, s.last_attempt_at), (None, None));
        assert_eq!(s.created_at, t(3), "no creation: the earliest entry");
        assert_eq!(s.updated_at, t(9));

        let s = derive_all_orders(&[Entry::created(t(0)), parked(2, ParkReason::LaneFull)]);
        assert_eq!(s.status, DeliveryStatus::Scheduled);
        assert_eq!(
            s.scheduled,
            Some(Scheduled {
                reason: ScheduleReason::Parked(ParkReason::LaneFull),
                next_attempt_at: t(62)
            })
        );
        assert_eq!(s.attempts, 0);
    }

    #[test]
    fn notes_and_attempts_interleave_by_time() {
        // A retry, then parked behind an open breaker: scheduled for the breaker, with the
        // attempt's status kept.
        let s = derive_all_orders(&[
            Entry::created(t(0)),
            retry(1, 1),
            parked(31, ParkReason::BreakerOpen),
        ]);
        assert_eq!(
            s.scheduled.map(|x| x.reason),
            Some(ScheduleReason::Parked(ParkReason::BreakerOpen))
        );
        assert_eq!(s.attempts, 1);
        assert_eq!(s.last_status, Some(503));
        assert_eq!(s.last_attempt_at, Some(t(1)));
        // Then attempted once the breaker let it through.
        let s = derive_all_orders(&[
            Entry::created(t(0)),
            retry(1, 1),
            parked(31, ParkReason::BreakerOpen),
            attempt(91, 2, AttemptOutcome::Succeeded),
        ]);
        assert_eq!(s.status, DeliveryStatus::Succeeded);
        assert_eq!(s.scheduled, None);
    }

    #[test]
    fn ties_order_creation_then_note_then_attempts_by_number() {
        let s = derive_all_orders(&[
            Entry::created(t(7)),
            dead_note(7, DeadReason::EndpointDisabled),
            retry(7, 1),
        ]);
        assert_eq!(s.status, DeliveryStatus::Scheduled, "the attempt is last");
        let s = derive_all_orders(&[
            Entry::created(t(7)),
            dead_note(7, DeadReason::EndpointDisabled),
        ]);
        assert_eq!(s.status, DeliveryStatus::Dead, "a note beats a creation");
        let s = derive_all_orders(&[attempt(7, 2, AttemptOutcome::Succeeded), retry(7, 1)]);
        assert_eq!(s.status, DeliveryStatus::Succeeded, "attempt 2 is after 1");
        assert_eq!(s.last_status, Some(200));
    }

    #[test]
    fn a_creation_or_note_written_twice_changes_nothing() {
        let once = derive(
            identity(),
            [Entry::created(t(0)), parked(1, ParkReason::Stalled)],
        );
        let twice = derive(
            identity(),
            [
                Entry::created(t(0)),
                parked(1, ParkReason::Stalled),
                Entry::created(t(0)),
                parked(1, ParkReason::Stalled),
            ],
        );
        assert_eq!(once, twice);
    }
}
