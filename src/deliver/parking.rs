//! Parking: a record the stage will not attempt now goes to the delay tier that brings it back
//! when it is due, and settles once the broker has it and the store has a note of it (the
//! delivery shows as scheduled, with the reason and the time it is due). A parked copy spends
//! no retry budget.

use std::time::SystemTime;

use super::attempt::note_for;
use super::stage::Stage;
use crate::dead_reason::DeadReason;
use crate::id::EndpointId;
use crate::record::{DeliveryRecord, UnixMillis};
use crate::stage::{Tp, outgoing, produce_until_acked};
use crate::storage::NoteKind;
use crate::telemetry::{self, ParkReason};

impl Stage {
    /// Parks `record` until the shortest tier brings it back (see [`Stage::park`]).
    pub(super) fn park_briefly(
        &self,
        tp: Tp,
        offset: i64,
        record: DeliveryRecord,
        reason: ParkReason,
    ) {
        let due = SystemTime::now() + self.deps.tiers.shortest().delay;
        self.park(tp, offset, record, due, reason);
    }

    /// Parks `record` in the tier matching `due`; settles it once the broker has it and its
    /// note is durable.
    ///
    /// A record never attempted and held back because its endpoint is failing (breaker open, or
    /// stalled) starts its window then, as a first attempt would, and is dead-lettered
    /// (`window_exhausted`) rather than parked once the window is spent. Otherwise a dead
    /// endpoint's backlog would cycle through the tiers for ever and never reach the DLQ. A
    /// record attempted before waits for the breaker's probe as it did: its last attempt's
    /// answer belongs in its DLQ record, and there are few of them (what was in flight when the
    /// breaker opened). A record whose attempt panicked, or whose endpoint view is not confirmed
    /// current, starts its window as well, attempted before or not: one that panics every time,
    /// or waits on a view that cannot be confirmed, is dead-lettered once its window is spent
    /// instead of coming back for ever.
    pub(super) fn park(
        &self,
        tp: Tp,
        offset: i64,
        record: DeliveryRecord,
        due: SystemTime,
        reason: ParkReason,
    ) {
        let held_back = match reason {
            ParkReason::BreakerOpen | ParkReason::Stalled => record.attempts == 0,
            ParkReason::ViewBehind | ParkReason::Panicked => true,
            ParkReason::LaneFull | ParkReason::SlowEndpoint => false,
        };
        let record = if held_back {
            let now = SystemTime::now();
            let record = record.with_first_attempt_at(now);
            let first = record
                .first_attempt_at
                .map_or(now, UnixMillis::to_system_time);
            if now.duration_since(first).unwrap_or_default() >= self.deps.policy.window {
                self.spawn_refusal(tp, offset, record, DeadReason::WindowExhausted);
                return;
            }
            record
        } else {
            record
        };
        telemetry::parked(reason);
        let now = SystemTime::now();
        let note = note_for(
            &record,
            now,
            NoteKind::Parked {
                reason,
                next_attempt_at: due,
            },
        );
        let wait = due.duration_since(now).unwrap_or_default();
        let tier = self.deps.tiers.for_delay(wait);
        let out = outgoing(tier.topic.clone(), &record.for_park(due));
        let (deps, producer, stop) = (self.deps.clone(), self.producer.clone(), self.stop.clone());
        self.spawn_settling(tp, offset, async move {
            let (parked, noted) = tokio::join!(
                produce_until_acked(&producer, out, &stop),
                deps.note(&note, &stop)
            );
            parked && noted
        });
    }

    /// When `id` is stalled (its lane full and silent for `stall_after`), parks its whole queue
    /// and returns when its records are due again: they should not wait here either. Its queue
    /// would otherwise grow to the partition's window and pause the endpoints sharing the
    /// partition until the hanging requests time out. They come back no sooner than those
    /// requests end (by then the breaker knows), in the tier that fits: a shorter wait would
    /// only cycle them through a tier again and again.
    pub(super) fn park_if_stalled(&mut self, id: &EndpointId) -> Option<SystemTime> {
        if !self
            .lanes
            .stalled(id, tokio::time::Instant::now(), self.deps.stall_after)
        {
            return None;
        }
        let due = SystemTime::now() + self.deps.tiers.at_least(self.deps.stalled_wait).delay;
        for q in self.queues.remove(id).unwrap_or_default() {
            self.park(q.tp, q.offset, q.record, due, ParkReason::Stalled);
        }
        Some(due)
    }
}
