//! Replaying dead letters: republishing a range of DLQ offsets to the deliveries topic with a
//! fresh retry window and a replay id that receivers see (`hookline-replay-id`), through the
//! same lanes and limits as any delivery, with an audit entry of who, why, what and how many.
//! Each delivery is claimed before it is republished, and one that another replay is sending
//! at that moment is left to it, so that two replays at once send it once.
//!
//! Where each part lives:
//! - `range`: a range of DLQ offsets (`hookline replay`, and the admin API's range replay):
//!   [`check`], then [`Checked::run`] with its window of sends.
//! - `delivery`: one delivery by its id; `endpoint`: an endpoint's dead letters in a time
//!   range; both find their records through `scan`, which reads the DLQ by time.
//! - `api`: [`ApiReplayer`], the replays the admin API starts, and [`KafkaReplayer`].
//! - `claim`: where a delivery stands for a replay, and claiming it.
//! - `consumer` reads the DLQ, `republisher` writes the deliveries topic, `audit` records the
//!   entry; `request` and `error` hold the types every replay shares.

mod api;
mod audit;
mod claim;
mod consumer;
mod delivery;
mod endpoint;
mod error;
mod range;
mod republisher;
mod request;
mod scan;

#[cfg(test)]
mod fixture;

pub use api::{ApiReplayer, KafkaReplayer};
pub use audit::new_replay_id;
pub use claim::{CLAIM_LIMIT, Standing, refusal, standing};
pub use delivery::{DeliveryReplay, DlqPosition, LOCATE_LIMIT, locate, replay_delivery};
pub use endpoint::{ENDPOINT_SCAN_LIMIT, EndpointReplay, EndpointReplayRequest, replay_endpoint};
pub use error::{Incomplete, ReplayError, StopCause};
pub use range::{Checked, IDLE_LIMIT, PUBLISH_DEADLINE, Progress, WINDOW, check, replay};
pub use request::{Asked, ReplayRequest, ReplaySummary, ReplayTarget};
