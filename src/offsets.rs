//! The contiguous-offset tracker: which offset of one partition may be committed.
//!
//! The delivery stage hands a partition's records to per-endpoint lanes, so they complete out of
//! order. Committing a record's offset while an earlier one is still in flight would lose the
//! earlier one on a crash, so the committed position only ever advances to the lowest offset that
//! is not settled yet (Kafka's convention: the committed offset is the next one to read).
//!
//! Records are tracked in the order they are consumed, which is increasing offset order, possibly
//! with gaps (compacted records, transaction markers). Gaps are harmless: an offset nobody tracked
//! has nothing to wait for.
//!
//! One tracker per assigned partition; it is plain data with no I/O and no clock, and every misuse
//! (untracked offset, double settle, out-of-order track, commit past the frontier) is an error
//! rather than a panic, because the caller's bug must not take down the other partitions.
//!
//! Memory: the tracker keeps one 8-byte slot per record from the lowest unsettled offset to the
//! newest tracked one, settled or not (the offset, with the settled flag in its top bit).
//! Bounding the number of in-flight records is therefore not enough on its own: a slow head
//! keeps its settled successors in the window too, so the caller bounds
//! [`OffsetTracker::window_len`] (pausing the partition when it is reached).

use std::collections::VecDeque;

/// A misuse of the tracker. None of these changes the tracker's state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OffsetError {
    /// Kafka offsets are never negative.
    #[error("offset {offset} is negative")]
    Negative {
        /// The offending offset.
        offset: i64,
    },
    /// `track` was called with an offset that is not above every offset tracked before.
    #[error("offset {offset} tracked after {highest}: offsets must be tracked in increasing order")]
    NotIncreasing {
        /// The offending offset.
        offset: i64,
        /// The highest offset tracked so far.
        highest: i64,
    },
    /// `settle` was called with an offset that is not in flight: never tracked, or settled and
    /// already passed by the frontier.
    #[error("offset {offset} is not in flight (never tracked, or settled and already passed)")]
    NotInFlight {
        /// The offending offset.
        offset: i64,
    },
    /// `settle` was called twice for an offset still held behind an unsettled one.
    #[error("offset {offset} was already settled")]
    AlreadySettled {
        /// The offending offset.
        offset: i64,
    },
    /// `mark_committed` was given an offset past what may be committed.
    #[error("cannot commit offset {offset}: at most {frontier} may be committed")]
    CommitAhead {
        /// The offending offset.
        offset: i64,
        /// The highest offset that may be committed now.
        frontier: i64,
    },
    /// `mark_committed` was called before anything was tracked.
    #[error("cannot commit offset {offset}: nothing was tracked yet")]
    NothingTracked {
        /// The offending offset.
        offset: i64,
    },
    /// `mark_committed` was given an offset below one committed before: that would rewind the
    /// consumer group and redeliver settled records.
    #[error("cannot commit offset {offset}: offset {committed} was committed already")]
    CommitBackwards {
        /// The offending offset.
        offset: i64,
        /// The offset committed before.
        committed: i64,
    },
}

/// Tracks one partition's in-flight offsets and tells which offset may be committed.
///
/// Every operation is O(1) amortised when records settle roughly in order (the common case);
/// settling an offset deep inside the window costs a binary search.
#[derive(Debug, Clone, Default)]
pub struct OffsetTracker {
    /// Tracked offsets from the lowest unsettled one on, increasing, each with [`SETTLED`] set
    /// once it has settled. Invariant: the front, when there is one, is unsettled (settled heads
    /// are popped).
    window: VecDeque<u64>,
    /// How many entries of `window` are unsettled.
    unsettled: usize,
    /// The highest offset ever tracked.
    highest: Option<i64>,
    /// The offset last passed to `mark_committed`.
    committed: Option<i64>,
}

/// The settled flag of a window slot; the other bits are the offset (never negative).
const SETTLED: u64 = 1 << 63;

/// A window slot's offset.
fn offset_of(slot: u64) -> i64 {
    i64::try_from(slot & !SETTLED).expect("offsets are below 2^63")
}

impl OffsetTracker {
    /// An empty tracker, for a freshly assigned partition.
    pub fn new() -> OffsetTracker {
        OffsetTracker::default()
    }

    /// Starts tracking a consumed record. Offsets must increase from call to call; gaps are fine.
    pub fn track(&mut self, offset: i64) -> Result<(), OffsetError> {
        if offset < 0 {
            return Err(OffsetError::Negative { offset });
        }
        if let Some(highest) = self.highest
            && offset <= highest
        {
            return Err(OffsetError::NotIncreasing { offset, highest });
        }
        self.window
            .push_back(u64::try_from(offset).expect("checked non-negative"));
        self.unsettled += 1;
        self.highest = Some(offset);
        Ok(())
    }

    /// Marks a tracked record as settled (delivered, parked, retried or dead-lettered, with the
    /// write behind it acknowledged). Returns the new commit frontier when this settle moved it.
    pub fn settle(&mut self, offset: i64) -> Result<Option<i64>, OffsetError> {
        let front = self.lowest_unsettled();
        let index = match front {
            // The common case: the oldest record finishes first.
            Some(front) if front == offset => 0,
            Some(front) if offset > front => self
                .window
                .binary_search_by_key(&offset, |&s| offset_of(s))
                .map_err(|_| OffsetError::NotInFlight { offset })?,
            _ => return Err(OffsetError::NotInFlight { offset }),
        };
        let slot = &mut self.window[index];
        if *slot & SETTLED != 0 {
            return Err(OffsetError::AlreadySettled { offset });
        }
        *slot |= SETTLED;
        self.unsettled -= 1;
        if index != 0 {
            return Ok(None);
        }
        while self.window.front().is_some_and(|&s| s & SETTLED != 0) {
            self.window.pop_front();
        }
        Ok(self.frontier())
    }

    /// The highest offset that may be committed now: the lowest unsettled offset, or one past the
    /// highest tracked offset when everything settled. `None` before anything was tracked.
    pub fn frontier(&self) -> Option<i64> {
        match self.lowest_unsettled() {
            Some(offset) => Some(offset),
            None => self.highest.map(|h| h + 1),
        }
    }

    /// The offset to commit now, or `None` when there is nothing new since the last
    /// [`mark_committed`](Self::mark_committed).
    pub fn committable(&self) -> Option<i64> {
        let frontier = self.frontier()?;
        if self.committed == Some(frontier) {
            None
        } else {
            Some(frontier)
        }
    }

    /// Records that `offset` was committed, so [`committable`](Self::committable) reports only
    /// progress past it. Commits past the frontier or backwards are refused.
    pub fn mark_committed(&mut self, offset: i64) -> Result<(), OffsetError> {
        let Some(frontier) = self.frontier() else {
            return Err(OffsetError::NothingTracked { offset });
        };
        if offset > frontier {
            return Err(OffsetError::CommitAhead { offset, frontier });
        }
        if let Some(committed) = self.committed
            && offset < committed
        {
            return Err(OffsetError::CommitBackwards { offset, committed });
        }
        self.committed = Some(offset);
        Ok(())
    }

    /// The offset last marked committed.
    pub fn committed(&self) -> Option<i64> {
        self.committed
    }

    /// How many tracked records have not settled.
    pub fn in_flight(&self) -> usize {
        self.unsettled
    }

    /// The lowest offset that is tracked and not settled.
    pub fn lowest_unsettled(&self) -> Option<i64> {
        self.window.front().map(|&s| offset_of(s))
    }

    /// The highest offset ever tracked.
    pub fn highest_tracked(&self) -> Option<i64> {
        self.highest
    }

    /// How many records the tracker holds: every record from the lowest unsettled one to the
    /// newest, settled or not. This is what the caller bounds.
    pub fn window_len(&self) -> usize {
        self.window.len()
    }

    /// Whether every tracked record has settled (the drain on revoke waits for this).
    pub fn is_idle(&self) -> bool {
        self.unsettled == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tracking(offsets: &[i64]) -> OffsetTracker {
        let mut t = OffsetTracker::new();
        for &o in offsets {
            t.track(o).unwrap();
        }
        t
    }

    #[test]
    fn empty_tracker_has_nothing_to_commit() {
        let t = OffsetTracker::new();
        assert_eq!(t.committable(), None);
        assert_eq!(t.frontier(), None);
        assert_eq!(t.lowest_unsettled(), None);
        assert_eq!(t.in_flight(), 0);
        assert!(t.is_idle());
    }

    #[test]
    fn in_order_settles_advance_one_by_one() {
        let mut t = tracking(&[10, 11, 12]);
        assert_eq!(
            t.committable(),
            Some(10),
            "nothing settled: commit the first"
        );
        assert_eq!(t.settle(10), Ok(Some(11)));
        assert_eq!(t.settle(11), Ok(Some(12)));
        assert_eq!(t.settle(12), Ok(Some(13)));
        assert_eq!(t.committable(), Some(13));
        assert_eq!(t.window_len(), 0);
        assert!(t.is_idle());
    }

    #[test]
    fn out_of_order_settles_wait_for_the_head() {
        let mut t = tracking(&[0, 1, 2, 3]);
        assert_eq!(t.settle(2), Ok(None));
        assert_eq!(t.settle(3), Ok(None));
        assert_eq!(t.committable(), Some(0));
        assert_eq!(t.in_flight(), 2);
        assert_eq!(t.window_len(), 4);
        assert_eq!(t.settle(1), Ok(None));
        assert_eq!(
            t.settle(0),
            Ok(Some(4)),
            "the head releases everything behind it"
        );
        assert_eq!(t.window_len(), 0);
        assert_eq!(t.lowest_unsettled(), None);
    }

    #[test]
    fn gaps_are_skipped() {
        let mut t = tracking(&[5, 9, 20]);
        assert_eq!(t.settle(5), Ok(Some(9)), "6..=8 were never consumed");
        assert_eq!(t.settle(20), Ok(None));
        assert_eq!(t.settle(9), Ok(Some(21)));
        t.track(30).unwrap();
        assert_eq!(t.committable(), Some(30));
        assert_eq!(t.lowest_unsettled(), Some(30));
    }

    #[test]
    fn far_jumps_are_tracked_like_any_gap() {
        let far = 3_000_000_000;
        let mut t = tracking(&[7, 8, far, far + 1]);
        assert_eq!(t.settle(8), Ok(None));
        assert_eq!(t.settle(far + 1), Ok(None));
        assert_eq!(
            t.settle(far - 1),
            Err(OffsetError::NotInFlight { offset: far - 1 })
        );
        assert_eq!(t.settle(7), Ok(Some(far)));
        t.track(far + 2_200_000_000).unwrap();
        assert_eq!(t.settle(far), Ok(Some(far + 2_200_000_000)));
        assert_eq!(t.settle(far + 2_200_000_000), Ok(Some(far + 2_200_000_001)));
        assert!(t.is_idle());
    }

    #[test]
    fn committable_reports_only_progress() {
        let mut t = tracking(&[0, 1]);
        t.mark_committed(0).unwrap();
        assert_eq!(t.committable(), None);
        t.settle(1).unwrap();
        assert_eq!(t.committable(), None, "head still unsettled");
        t.settle(0).unwrap();
        assert_eq!(t.committable(), Some(2));
        t.mark_committed(2).unwrap();
        assert_eq!(t.committable(), None);
        assert_eq!(t.committed(), Some(2));
        t.track(7).unwrap();
        assert_eq!(t.committable(), Some(7));
    }

    #[test]
    fn misuse_is_an_error_and_changes_nothing() {
        let mut t = tracking(&[3, 4]);
        assert_eq!(
            t.track(4),
            Err(OffsetError::NotIncreasing {
                offset: 4,
                highest: 4
            })
        );
        assert_eq!(
            t.track(1),
            Err(OffsetError::NotIncreasing {
                offset: 1,
                highest: 4
            })
        );
        assert_eq!(t.track(-1), Err(OffsetError::Negative { offset: -1 }));
        assert_eq!(t.settle(2), Err(OffsetError::NotInFlight { offset: 2 }));
        assert_eq!(t.settle(9), Err(OffsetError::NotInFlight { offset: 9 }));
        t.settle(4).unwrap();
        assert_eq!(t.settle(4), Err(OffsetError::AlreadySettled { offset: 4 }));
        t.settle(3).unwrap();
        assert_eq!(
            t.settle(3),
            Err(OffsetError::NotInFlight { offset: 3 }),
            "passed by the frontier"
        );
        assert_eq!(
            t.mark_committed(6),
            Err(OffsetError::CommitAhead {
                offset: 6,
                frontier: 5
            })
        );
        t.mark_committed(5).unwrap();
        assert_eq!(
            t.mark_committed(4),
            Err(OffsetError::CommitBackwards {
                offset: 4,
                committed: 5
            })
        );
        assert_eq!(t.committed(), Some(5));
        assert_eq!(t.in_flight(), 0);
        assert_eq!(t.highest_tracked(), Some(4));
        let mut empty = OffsetTracker::new();
        assert_eq!(
            empty.mark_committed(0),
            Err(OffsetError::NothingTracked { offset: 0 })
        );
        assert_eq!(empty.settle(0), Err(OffsetError::NotInFlight { offset: 0 }));
    }

    #[test]
    fn errors_read_well() {
        assert_eq!(
            OffsetError::NotIncreasing {
                offset: 1,
                highest: 4
            }
            .to_string(),
            "offset 1 tracked after 4: offsets must be tracked in increasing order"
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Track(i64),
        Settle(usize),
        Commit,
    }

    /// Random interleavings of tracking (with gaps), settling any unsettled record, and
    /// committing whatever is committable.
    fn ops() -> impl Strategy<Value = Vec<Op>> {
        prop::collection::vec(
            prop_oneof![
                (1i64..4).prop_map(Op::Track),
                any::<usize>().prop_map(Op::Settle),
                Just(Op::Commit),
            ],
            0..300,
        )
    }

    proptest! {
        #[test]
        fn frontier_never_passes_an_unsettled_offset(start in 0i64..1_000_000, ops in ops()) {
            let mut t = OffsetTracker::new();
            let mut next = start;
            let mut unsettled: Vec<i64> = vec![];
            let mut tracked = 0usize;
            let mut last_commit: Option<i64> = None;
            for op in ops {
                match op {
                    Op::Track(gap) => {
                        t.track(next).unwrap();
                        unsettled.push(next);
                        tracked += 1;
                        next += gap;
                    }
                    Op::Settle(pick) if !unsettled.is_empty() => {
                        let offset = unsettled.swap_remove(pick % unsettled.len());
                        t.settle(offset).unwrap();
                        prop_assert_eq!(t.settle(offset).is_err(), true);
                    }
                    Op::Settle(_) => {}
                    Op::Commit => {
                        if let Some(c) = t.committable() {
                            t.mark_committed(c).unwrap();
                            prop_assert!(last_commit.is_none_or(|l| c > l));
                            last_commit = Some(c);
                        }
                    }
                }
                let lowest = unsettled.iter().min().copied();
                prop_assert_eq!(t.lowest_unsettled(), lowest);
                prop_assert_eq!(t.in_flight(), unsettled.len());
                if let Some(f) = t.frontier() {
                    prop_assert!(unsettled.iter().all(|&u| f <= u));
                }
                if tracked > 0 && unsettled.is_empty() {
                    prop_assert_eq!(t.frontier(), t.highest_tracked().map(|h| h + 1));
                }
            }
            // Settle the rest in a scrambled order: the frontier reaches the end.
            unsettled.reverse();
            for offset in unsettled.drain(..) {
                t.settle(offset).unwrap();
            }
            prop_assert!(t.is_idle());
            prop_assert_eq!(t.window_len(), 0);
            prop_assert_eq!(t.frontier(), t.highest_tracked().map(|h| h + 1));
        }
    }
}
