//! What the delivery stage's tasks report back to its loop: an attempt's answer and end, and
//! whether a record a settling task wrote was acknowledged.

use crate::breaker;
use crate::id::EndpointId;
use crate::lane::Permit;
use crate::record::DeliveryRecord;
use crate::stage::Tp;

/// What an attempt task reports back to the stage loop: first that the endpoint answered (its
/// lane slot is free), then that the attempt is logged and its follow-up produced, or that it
/// panicked.
pub(super) enum Done {
    /// The endpoint answered, or the attempt gave its slot back unanswered: the slot is free.
    Answered {
        permit: Permit,
        health: Option<breaker::Outcome>,
        /// When the answer came (or the attempt gave its slot back unsent).
        at: tokio::time::Instant,
    },
    /// The attempt is logged and its follow-up produced (`settled`), or `stop` came first.
    Finished {
        tp: Tp,
        offset: i64,
        disable: Option<EndpointId>,
        settled: bool,
    },
    /// The attempt panicked (a bug in hookline); `record` is the record as it was read, to be
    /// parked for a later attempt.
    Panicked {
        tp: Tp,
        offset: i64,
        record: Box<DeliveryRecord>,
    },
}
