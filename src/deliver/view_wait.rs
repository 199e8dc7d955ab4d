//! Deliveries waiting for the endpoint view to be confirmed current: an endpoint created or
//! re-enabled a moment ago on another instance may look deleted or disabled here only because
//! this instance's view is behind.

use std::time::{Duration, SystemTime};

use super::stage::Stage;
use crate::id::EndpointId;
use crate::record::DeliveryRecord;
use crate::stage::Tp;
use crate::telemetry::ParkReason;

/// A delivery waiting for the endpoint view to be confirmed current (see
/// [`Stage::view_may_be_behind`]).
pub(super) struct AwaitingView {
    pub(super) tp: Tp,
    pub(super) offset: i64,
    pub(super) record: DeliveryRecord,
    /// Since when.
    pub(super) since: tokio::time::Instant,
}

/// How long a delivery waits in memory for the endpoint view to be confirmed before it is
/// parked in the shortest tier instead.
const VIEW_PATIENCE: Duration = Duration::from_secs(10);

impl Stage {
    /// Whether this instance's endpoint view may lack a write that the instance which made a
    /// delivery for `id` had seen, so that `id` looks deleted or disabled here only because the
    /// view is behind (an endpoint created or re-enabled a moment ago, on another instance).
    ///
    /// That instance found the endpoint usable before this stage first met a delivery for it
    /// that it could not use. Once the view is confirmed to hold every write made before that
    /// moment, what it says stands. Until then a confirmation is requested and the delivery
    /// waits here (see [`Stage::recheck_awaiting_view`]); a confirmation takes a watermark
    /// request and the view's catching up, a few milliseconds normally.
    pub(super) fn view_may_be_behind(&mut self, id: &EndpointId) -> bool {
        if self.unusable_since.len() >= crate::limits::MAX_ENDPOINT_ENTRIES
            && !self.unusable_since.contains_key(id)
        {
            self.unusable_since.clear();
        }
        let since = *self
            .unusable_since
            .entry(id.clone())
            .or_insert_with(SystemTime::now);
        if self.deps.endpoints.holds_writes_before(since) {
            return false;
        }
        self.deps.endpoints.request_confirmation();
        true
    }

    /// Looks again at the deliveries waiting for the endpoint view (see
    /// [`Stage::view_may_be_behind`]): each whose endpoint is usable now, or whose view is now
    /// confirmed, goes on as it would have; one that has waited [`VIEW_PATIENCE`] is parked in
    /// the shortest tier (`view_behind`, its window started) so its offset does not hold its
    /// partition while the view cannot be confirmed; the rest wait on, with the confirmation
    /// asked for again.
    pub(super) fn recheck_awaiting_view(&mut self) {
        if self.awaiting_view.is_empty() {
            return;
        }
        let now = tokio::time::Instant::now();
        for a in std::mem::take(&mut self.awaiting_view) {
            let usable = self
                .deps
                .endpoints
                .get(&a.record.endpoint_id)
                .is_some_and(|e| e.enabled);
            if usable || !self.view_may_be_behind(&a.record.endpoint_id) {
                self.on_record(a.tp, a.offset, Ok(a.record), None);
            } else if now.duration_since(a.since) >= VIEW_PATIENCE {
                self.park_briefly(a.tp, a.offset, a.record, ParkReason::ViewBehind);
            } else {
                self.awaiting_view.push(a);
            }
        }
    }
}
