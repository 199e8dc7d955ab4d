//! The bytes of delivery records the fan-out has handed to its producer and not yet seen
//! acknowledged, and the pause of its input that bounds them.

use crate::stage::{Outgoing, PauseReason, Settlements, StageConsumer, Tp};

/// The bytes of the records the fan-out has handed to its producer and not yet seen
/// acknowledged. The window of each partition bounds its events in records, but an event's
/// records are its body (up to the payload limit) times its endpoints, and librdkafka copies
/// each: 5,000 events of 256 KiB for ten endpoints each is 12 GiB. While Kafka is slow or
/// refusing, that is what would pile up. Past `limit` ([`MAX_HELD_BYTES`](super::MAX_HELD_BYTES)
/// in service), every partition is paused (as a hold, beside its window); once acknowledgements
/// bring it down to half, they resume. An event is always taken when nothing is held, whatever
/// its size.
pub(super) struct HeldBytes {
    held: usize,
    limit: usize,
    /// Whether partitions were paused for it.
    holding: bool,
}

impl HeldBytes {
    pub(super) fn new(limit: usize) -> HeldBytes {
        HeldBytes {
            held: 0,
            limit: limit.max(1),
            holding: false,
        }
    }

    pub(super) fn add(&mut self, bytes: usize) {
        self.held = self.held.saturating_add(bytes);
    }

    pub(super) fn remove(&mut self, bytes: usize) {
        self.held = self.held.saturating_sub(bytes);
    }

    /// Pauses every tracked partition while over the limit (those assigned since included), and
    /// resumes them once down to half of it.
    pub(super) fn apply(&mut self, settlements: &mut Settlements, consumer: &StageConsumer) {
        let (on, tps): (bool, Vec<Tp>) = if self.held >= self.limit {
            let tps = settlements
                .partitions()
                .filter(|tp| !settlements.paused_for(tp, PauseReason::Hold))
                .cloned()
                .collect();
            (true, tps)
        } else if self.holding && self.held <= self.limit / 2 {
            let tps = settlements
                .partitions()
                .filter(|tp| settlements.paused_for(tp, PauseReason::Hold))
                .cloned()
                .collect();
            (false, tps)
        } else {
            return;
        };
        if on && !self.holding {
            tracing::info!(
                held_bytes = self.held,
                limit = self.limit,
                "records waiting for Kafka's acknowledgement reached the fan-out's byte limit; pausing its input"
            );
        }
        self.holding = on;
        if !tps.is_empty() {
            let _ = settlements.set_pause_reason(consumer, &tps, PauseReason::Hold, on);
        }
    }
}

/// Bytes a record takes while it waits for the broker (its body is shared here, copied by
/// librdkafka).
pub(super) fn record_bytes(records: &[Outgoing]) -> usize {
    records.iter().map(|r| r.key.len() + r.payload.len()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_bytes_pause_past_the_limit_and_resume_at_half() {
        let mut held = HeldBytes::new(100);
        held.add(99);
        assert!(held.held < held.limit);
        held.add(1);
        assert!(held.held >= held.limit);
        held.remove(40);
        assert_eq!(held.held, 60);
        held.remove(1_000);
        assert_eq!(held.held, 0, "never below nothing");
        assert_eq!(HeldBytes::new(0).limit, 1);
    }
}
