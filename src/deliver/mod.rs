//! The delivery stage: consumes `hookline.deliveries` (group `hookline-deliver`), and for each
//! record signs, sends, classifies, logs the attempt and settles it.
//!
//! Records of one partition are dispatched to per-endpoint lanes and complete out of order; the
//! partition's offset advances only over the settled prefix. A lane holds a bounded queue: a
//! healthy endpoint's burst waits there (when the partition's window fills, the partition pauses:
//! backpressure, nothing parks). Records are parked durably in a delay tier (without spending
//! retry budget) when the endpoint's breaker is open, or when it is stalled (every request slot
//! taken and no answer for `stall_after`: a receiver that hangs), so the endpoints sharing its
//! partition never wait behind it for the HTTP timeout. An endpoint that answers, but slower
//! than its records arrive (a rate limit, or few request slots and long answers), keeps queued
//! only what it sends within the shortest tier; the rest is parked until its turn (see
//! `turn`), so its backlog does not fill the partition's window either.
//!
//! Settled means: the attempt row is durable in the store AND the follow-up record (a retry in a
//! delay tier, or the DLQ record) is acknowledged by the broker; or a parked copy is
//! acknowledged AND its note (scheduled, why, until when) is durable; or, for a delivery that
//! cannot be sent at all, its dead note is durable AND its DLQ record acknowledged. Nothing else
//! moves the offset.
//!
//! Where each part lives:
//! - `stage`: the stage loop: taking records, queueing them per endpoint, dispatching them
//!   to their lanes, applying what the tasks report.
//! - `attempt`: one attempt and its settling: send, classify, log, build the follow-up; and
//!   the dead note of a delivery that cannot be sent.
//! - `request`: the signed request, and the send plan an endpoint's attempts share.
//! - `task`: the tasks the stage spawns, the lane slot each holds, and how a panic in one is
//!   contained.
//! - `report`: what the tasks report back to the stage loop.
//! - `parking`: parking records in the delay tiers.
//! - `turn`: the turns of endpoints that send slower than their records arrive.
//! - `view_wait`: deliveries waiting for the endpoint view to be confirmed current.

use std::sync::Arc;
use std::time::Duration;

use crate::delay_tier::Tiers;
use crate::lane::LanesConfig;
use crate::registry::{EndpointStore, EndpointView};
use crate::retry_policy::RetryPolicy;
use crate::sender::Sender;
use crate::storage::DeliveryStore;

mod attempt;
mod parking;
mod report;
mod request;
mod stage;
mod task;
mod turn;
mod view_wait;

#[cfg(test)]
mod tests;

pub use stage::run;

/// Header receivers see on replayed deliveries: the replay's id.
pub const REPLAY_HEADER: &str = "hookline-replay-id";

/// Header receivers see with the attempt number (1-based, per window).
pub const ATTEMPT_HEADER: &str = "hookline-attempt";

/// Everything the delivery stage works with.
pub struct DeliverDeps {
    /// The materialised endpoints.
    pub endpoints: Arc<EndpointView>,
    /// Writes endpoint changes (disabling after a 410).
    pub endpoint_writer: Arc<dyn EndpointStore>,
    /// The attempt log.
    pub store: Arc<dyn DeliveryStore>,
    /// The outbound HTTP client.
    pub sender: Sender,
    /// Classification and backoff.
    pub policy: RetryPolicy,
    /// Delay tiers for retries and parking.
    pub tiers: Arc<Tiers>,
    /// The DLQ topic.
    pub dlq_topic: Arc<str>,
    /// Where undecodable records go.
    pub invalid_topic: Arc<str>,
    /// Lane and breaker settings.
    pub lanes: LanesConfig,
    /// Concurrency ceiling for endpoints that set none.
    pub default_max_in_flight: u32,
    /// Records held per partition before it is paused.
    pub max_window: usize,
    /// Records queued per endpoint before new ones are parked.
    pub lane_queue: usize,
    /// A full lane with no request finished for this long is stalled: its queue parks.
    pub stall_after: Duration,
    /// How long a stalled endpoint's records stay parked at least: until its hanging requests
    /// have answered or timed out (the HTTP total timeout).
    pub stalled_wait: Duration,
    /// How long in-flight attempts may take to finish after shutdown starts.
    pub drain_deadline: Duration,
}
