//! The window of a range replay's sends: up to [`WINDOW`] dead letters claimed and republished
//! at once, and where the replay stops when one of them fails.

use std::collections::BTreeSet;
use std::time::Duration;

use super::super::claim::claim_in_range;
use super::super::republisher::{Republished, Republisher};
use super::super::{ReplaySummary, StopCause};
use crate::id::Tenant;
use crate::record::DeliveryRecord;
use crate::storage::DeliveryStore;

/// How many dead letters a replay of a range claims and republishes at once, unless
/// [`Checked::window`](super::Checked::window) says otherwise. Sent one at a time, each record
/// would wait for its claim (a lightweight transaction in the CQL store), the broker's
/// acknowledgement and its note in the store, one after the other.
pub const WINDOW: usize = 64;

/// How far past the lowest offset still being sent the reader may go, in windows: a failure
/// then leaves at most this many windows of records sent past the offset a resumed replay
/// starts at.
pub(super) const SPAN_WINDOWS: usize = 4;

/// How long the reader waits for a send to finish when the DLQ has nothing for it at once.
pub(in crate::replay) const SEND_STEP: Duration = Duration::from_millis(5);

/// The tenants whose deliveries a replay of a range republished (or, in a dry run, counted).
#[derive(Debug, Default)]
pub(super) enum Covered {
    /// None yet.
    #[default]
    Nobody,
    /// One tenant's alone.
    One(Tenant),
    /// More than one tenant's.
    Several,
}

impl Covered {
    /// Counts a delivery of `tenant`'s.
    pub(super) fn add(&mut self, tenant: &Tenant) {
        match self {
            Covered::Nobody => *self = Covered::One(tenant.clone()),
            Covered::One(one) if one != tenant => *self = Covered::Several,
            _ => {}
        }
    }

    /// The tenant the audit entry names: the one whose deliveries alone it covered.
    pub(super) fn tenant(self) -> Option<Tenant> {
        match self {
            Covered::One(tenant) => Some(tenant),
            Covered::Nobody | Covered::Several => None,
        }
    }
}

/// How one dead letter's send ended.
pub(super) enum Sent {
    /// Claimed and republished, for this tenant.
    Replayed(Tenant),
    /// Another replay is sending it: left to that one.
    LeftToAnother,
    /// The claim or the republish failed: the replay stops at this record.
    Failed(StopCause),
}

/// Claims `record`'s delivery for replay `replay_id` and republishes it.
pub(super) async fn send(
    store: &dyn DeliveryStore,
    republisher: &Republisher,
    record: DeliveryRecord,
    replay_id: &str,
    deadline: Duration,
) -> Sent {
    match claim_in_range(store, &record.delivery_id, replay_id).await {
        Ok(true) => {}
        Ok(false) => {
            tracing::info!(delivery = %record.delivery_id, replay_id,
                "another replay is sending this delivery; left to it");
            return Sent::LeftToAnother;
        }
        Err(e) => return Sent::Failed(StopCause::Claim(e)),
    }
    let tenant = record.tenant.clone();
    let topic = || republisher.deliveries.to_string();
    match republisher
        .republish(record, replay_id, deadline, store)
        .await
    {
        Republished::Yes => Sent::Replayed(tenant),
        Republished::Refused(source) => Sent::Failed(StopCause::Refused {
            topic: topic(),
            source,
        }),
        Republished::NotAcknowledged => Sent::Failed(StopCause::Publish {
            topic: topic(),
            deadline,
        }),
    }
}

/// The sends of a replay of a range that are under way, by DLQ offset.
pub(super) struct Window {
    /// At most this many at once.
    limit: usize,
    /// And none this far or further past the lowest under way.
    span: i64,
    /// The offsets whose sends are under way.
    pub(super) in_flight: BTreeSet<i64>,
    /// Republished offsets above an offset still in flight, or above one that failed: sent
    /// past where the replay may stop. Fewer than `span` of them.
    ahead: BTreeSet<i64>,
    /// The lowest offset whose send failed, and why.
    pub(super) failed: Option<(i64, StopCause)>,
}

impl Window {
    /// Room for `limit` sends at once (at least 1).
    pub(super) fn new(limit: usize) -> Window {
        let limit = limit.max(1);
        Window {
            limit,
            span: i64::try_from(limit.saturating_mul(SPAN_WINDOWS)).unwrap_or(i64::MAX),
            in_flight: BTreeSet::new(),
            ahead: BTreeSet::new(),
            failed: None,
        }
    }

    /// Whether the reader waits for a send to finish before it reads the record at `next`.
    pub(super) fn is_full(&self, next: i64) -> bool {
        self.in_flight.len() >= self.limit
            || self
                .in_flight
                .first()
                .is_some_and(|&lowest| next - lowest >= self.span)
    }

    /// Counts the send of the record at `offset`.
    pub(super) fn settle(
        &mut self,
        offset: i64,
        sent: Sent,
        summary: &mut ReplaySummary,
        covered: &mut Covered,
    ) {
        self.in_flight.remove(&offset);
        match sent {
            Sent::Replayed(tenant) => {
                summary.replayed += 1;
                covered.add(&tenant);
                self.ahead.insert(offset);
            }
            Sent::LeftToAnother => summary.skipped_being_replayed += 1,
            Sent::Failed(cause) => {
                if self.failed.as_ref().is_none_or(|(at, _)| offset < *at) {
                    self.failed = Some((offset, cause));
                }
            }
        }
        // Everything below the lowest offset still in flight went through: no failure can
        // come before it any more.
        if self.failed.is_none() {
            let floor = self.in_flight.first().copied().unwrap_or(i64::MAX);
            self.ahead = self.ahead.split_off(&floor);
        }
    }

    /// How many records after `offset` were republished.
    pub(super) fn sent_past(&self, offset: i64) -> u64 {
        self.ahead.range(offset + 1..).count() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::StoreError;
    /// The window stops at the lowest failed offset, whichever send finished first, and
    /// counts the records republished after it; with no failure it keeps no record of them
    /// once everything below them went through.
    #[test]
    fn the_window_stops_at_the_lowest_failure_and_counts_what_went_past_it() {
        let acme = Tenant::parse("acme").unwrap();
        let claim_failed =
            || Sent::Failed(StopCause::Claim(StoreError::Unavailable("down".into())));
        let mut summary = ReplaySummary {
            replay_id: "rpl_1".into(),
            scanned: 0,
            replayed: 0,
            filtered: 0,
            undecodable: 0,
            skipped_being_replayed: 0,
            last_offset: 0,
        };
        let mut covered = Covered::default();
        let mut w = Window::new(WINDOW);
        w.in_flight.extend(10..20);
        assert!(!w.is_full(20));
        assert!(w.is_full(10 + w.span), "the reader stays within the span");
        for offset in [11, 15, 19] {
            w.settle(
                offset,
                Sent::Replayed(acme.clone()),
                &mut summary,
                &mut covered,
            );
        }
        w.settle(16, claim_failed(), &mut summary, &mut covered);
        w.settle(13, claim_failed(), &mut summary, &mut covered);
        w.settle(12, Sent::LeftToAnother, &mut summary, &mut covered);
        for offset in [10, 14, 17, 18] {
            w.settle(
                offset,
                Sent::Replayed(acme.clone()),
                &mut summary,
                &mut covered,
            );
        }
        assert!(w.in_flight.is_empty());
        assert_eq!(w.failed.as_ref().map(|(at, _)| *at), Some(13));
        assert_eq!(w.sent_past(13), 5, "14, 15, 17, 18 and 19");
        assert_eq!((summary.replayed, summary.skipped_being_replayed), (7, 1));

        let mut w = Window::new(WINDOW);
        w.in_flight.extend(0..4);
        for offset in [3, 1, 0, 2] {
            w.settle(
                offset,
                Sent::Replayed(acme.clone()),
                &mut summary,
                &mut covered,
            );
        }
        assert!(w.failed.is_none());
        assert!(w.ahead.is_empty(), "{:?}", w.ahead);
    }

    #[test]
    fn a_range_names_its_tenant_only_when_it_covered_one_alone() {
        let (acme, globex) = (
            Tenant::parse("acme").unwrap(),
            Tenant::parse("globex").unwrap(),
        );
        assert_eq!(Covered::default().tenant(), None, "nothing republished");
        let mut one = Covered::default();
        one.add(&acme);
        one.add(&acme);
        assert_eq!(one.tenant(), Some(acme.clone()));
        let mut two = Covered::default();
        for t in [&acme, &globex, &acme] {
            two.add(t);
        }
        assert_eq!(two.tenant(), None, "several tenants'");
    }
}
