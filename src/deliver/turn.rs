//! Turns for endpoints that send slower than their records arrive (a rate limit, or few request
//! slots and long answers): such an endpoint keeps queued only what it sends within the
//! shortest tier, and the rest is parked until its turn, so its backlog holds no place in its
//! partition's window.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use super::stage::Stage;
use crate::endpoint::Endpoint;
use crate::id::EndpointId;
use crate::telemetry::{self, ParkReason};

/// How many records an endpoint that sends `rate` a second may keep queued: what it sends within
/// `horizon` (the shortest tier's delay), at least one. A record beyond that waits no longer
/// parked until its turn than it would have in the queue, and holds no place in its partition's
/// window meanwhile.
pub(super) fn queue_room(rate: f64, horizon: Duration) -> usize {
    // A float-to-int cast saturates: an unmeasurably fast endpoint gets all the room there is.
    ((rate * horizon.as_secs_f64()).ceil() as usize).max(1)
}

/// The turns booked for the records of endpoints that send slower than their records arrive:
/// per endpoint, the next free turn. Records beyond an endpoint's queue room are parked until
/// their turn, so they come back about when the endpoint can take them.
#[derive(Default)]
pub(super) struct Turns {
    next: HashMap<EndpointId, SystemTime>,
}

impl Turns {
    /// Books the turn of a record of `id` (which sends `rate` records a second) parked at `now`
    /// behind `queued` records: one interval of the rate after the last turn booked, and no
    /// sooner than those queued are sent. Returns when the record is due: its turn, or
    /// `now + horizon` when its turn lies beyond that (the longest tier). Such a record is not
    /// booked: it books again when it comes back. Booked, it would push every later turn back,
    /// and the records that came back from the longest tier together would book turns behind
    /// one another's, so that the endpoint got a few records per round of the longest tier
    /// rather than its rate.
    pub(super) fn book(
        &mut self,
        id: &EndpointId,
        rate: f64,
        queued: usize,
        now: SystemTime,
        horizon: Duration,
    ) -> SystemTime {
        let step = Duration::from_secs_f64(1.0 / rate);
        let after_queue = now + step.mul_f64(queued as f64);
        let turn = self
            .next
            .get(id)
            .map_or(after_queue, |next| (*next).max(after_queue));
        let latest = now + horizon;
        if turn > latest {
            return latest;
        }
        if self.next.len() >= crate::limits::MAX_ENDPOINT_ENTRIES {
            self.next.retain(|_, next| *next > now);
        }
        self.next.insert(id.clone(), turn + step);
        turn
    }
}

/// How fast an endpoint sends, and how many of its records may wait in its queue for that.
struct Pace {
    /// Records a second.
    rate: f64,
    /// Records its queue may hold.
    room: usize,
}

impl Stage {
    /// How many records a second `endpoint` sends: its rate limit, or what its lane completes at
    /// its concurrency limit and recent answer time, whichever is lower. `None` when neither is
    /// known (no rate limit, and no answer yet).
    fn send_rate(&self, endpoint: &Endpoint) -> Option<f64> {
        let limit = endpoint.rate_limit_per_s.filter(|r| *r > 0.0);
        let completes = self.lanes.throughput(&endpoint.id);
        match (limit, completes) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// `endpoint`'s pace: its send rate and the room its queue has at that rate (see
    /// [`queue_room`]), what it sends within the shortest tier's delay. `None` while its rate
    /// is not known.
    fn pace(&self, endpoint: &Endpoint) -> Option<Pace> {
        let rate = self.send_rate(endpoint)?;
        Some(Pace {
            rate,
            room: queue_room(rate, self.deps.tiers.shortest().delay),
        })
    }

    /// When `endpoint`'s queue (`queued` records) already holds what it sends within the
    /// shortest tier's delay (see [`Stage::send_rate`] and [`queue_room`]): the time a record
    /// arriving now gets its turn (see [`Turns::book`]). The record is parked until then. Held
    /// here instead, a slow endpoint's backlog would fill its partition's window (at 1 request
    /// a second, 1,000 records wait 17 minutes), and every endpoint sharing the partition would
    /// wait behind it. An endpoint whose send rate is not known yet queues up to `lane_queue`;
    /// [`Stage::shed_excess`] parks the surplus once its first answer gives it a rate.
    pub(super) fn booked_turn(&mut self, endpoint: &Endpoint, queued: usize) -> Option<SystemTime> {
        // The room is at least one record: an empty queue takes it without a look at the rate.
        if queued == 0 {
            return None;
        }
        let Pace { rate, room } = self.pace(endpoint)?;
        if queued < room {
            return None;
        }
        telemetry::slow_endpoint(endpoint.id.as_str(), rate, room);
        let longest = self.deps.tiers.longest().delay;
        Some(
            self.turns
                .book(&endpoint.id, rate, queued, SystemTime::now(), longest),
        )
    }

    /// Parks what `id`'s queue holds beyond what the endpoint sends within the shortest tier,
    /// each record until its turn. Records queued before the endpoint's first answer (when its
    /// send rate was not known), or while it answered faster, would otherwise stay and hold
    /// their partition's window until the endpoint got through them.
    pub(super) fn shed_excess(&mut self, id: &EndpointId) {
        let Some(endpoint) = self
            .queues
            .get(id)
            .and_then(|q| q.front())
            .map(|front| front.endpoint.clone())
        else {
            return;
        };
        let Some(Pace { rate, room }) = self.pace(&endpoint) else {
            return;
        };
        let Some(queue) = self.queues.get_mut(id).filter(|q| q.len() > room) else {
            return;
        };
        let excess = queue.split_off(room);
        telemetry::slow_endpoint(id.as_str(), rate, room);
        let longest = self.deps.tiers.longest().delay;
        let now = SystemTime::now();
        for q in excess {
            let due = self.turns.book(id, rate, room, now, longest);
            self.park(q.tp, q.offset, q.record, due, ParkReason::SlowEndpoint);
        }
    }
}
