//! Why the delivery stage parked a record in a delay tier instead of sending it: the reasons
//! metrics count and the store shows a scheduled delivery with.

/// Why a record was parked instead of sent.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    strum::EnumIter,
    strum::IntoStaticStr,
    strum::EnumString,
)]
#[strum(serialize_all = "snake_case")]
pub enum ParkReason {
    /// The endpoint's queue is full (as long as the partition's window) or the stage holds as
    /// many lanes as it may; also what is queued when the stage stops, and a record that
    /// arrived before it was due.
    LaneFull,
    /// The endpoint answers slower than its records arrive: its queue already holds what it
    /// sends within the shortest tier (at its rate limit, or its concurrency over its answer
    /// time), and the record waits parked for its turn.
    SlowEndpoint,
    /// The endpoint's breaker is open.
    BreakerOpen,
    /// The endpoint stopped answering: every slot its lane admits is taken and none has
    /// finished for a while.
    Stalled,
    /// This instance's endpoint view lacks the endpoint or has it disabled, and has not been
    /// confirmed current within 10 s: it may be behind the instance that made the delivery.
    ViewBehind,
    /// The record's attempt panicked (a bug in hookline; see [`super::attempt_panicked`]).
    Panicked,
}

impl ParkReason {
    /// Every reason, in declaration order.
    pub fn all() -> impl Iterator<Item = ParkReason> {
        <ParkReason as strum::IntoEnumIterator>::iter()
    }

    /// The label value: the variant's name in snake case.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Parses the string form.
    pub fn parse(s: &str) -> Option<ParkReason> {
        s.parse().ok()
    }
}
