//! Size limits more than one layer needs: the largest Kafka record, the room hookline keeps
//! in it for what it adds around a payload, and the bound on per-endpoint maps.

/// The largest record a producer sends unless `kafka.client` sets `message.max.bytes`
/// (librdkafka's default).
pub const DEFAULT_MESSAGE_MAX_BYTES: u64 = 1_000_000;
/// Room a payload leaves in its Kafka record for what hookline adds around it: the delivered
/// body's envelope (`id`, `type`, `timestamp`) and a delivery record's headers (ids, tenant,
/// type, origin, signing key ids, attempt summary), each bounded to a few hundred bytes.
/// Without it a payload just under the record limit passes the checks and then no delivery
/// record for it can be written.
pub const RECORD_HEADROOM: u64 = 64 * 1024;

/// Entries each of the delivery stage's per-endpoint maps (send plans, booked turns, when an
/// endpoint was first found unusable, the slow endpoints' log) holds before it is cleared or
/// pruned.
pub const MAX_ENDPOINT_ENTRIES: usize = 10_000;
