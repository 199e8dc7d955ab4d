//! Pure conversions between the store's Rust types and CQL columns: times, time buckets, the
//! listing cursor, outcome columns. No I/O, so all of it is unit-tested without a server.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use scylla::value::CqlTimestamp;

use super::super::{AttemptOutcome, StoreError};
use crate::dead_reason::DeadReason;
use crate::id::{DeliveryId, EventId};

/// Width of the time buckets that partition an endpoint's history and dead letters: one
/// minute, so a busy endpoint's partition holds a minute of entries, not a day's. Part
/// of schema version 2 (`schemas/cql/002_history_buckets.cql`), not a setting: rows are found
/// by recomputing their bucket, so another width would orphan every row written with this one.
pub const BUCKET_MS: i64 = 60_000;

/// Which bucketed table a row of `endpoint_buckets` points into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BucketKind {
    /// `deliveries_by_endpoint_bucket`.
    History,
    /// `dead_letters_by_endpoint_bucket`.
    Dead,
}

impl BucketKind {
    /// The `kind` column.
    pub const fn as_str(self) -> &'static str {
        match self {
            BucketKind::History => "history",
            BucketKind::Dead => "dead",
        }
    }
}

/// Milliseconds since the epoch (negative before it), as CQL `timestamp` stores time.
pub fn to_cql(t: SystemTime) -> CqlTimestamp {
    CqlTimestamp(millis(t))
}

fn millis(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        // Round towards the past so that truncation is monotonic on both sides of the epoch.
        Err(e) => {
            let d = e.duration();
            let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
            if d.as_nanos() % 1_000_000 == 0 {
                -ms
            } else {
                -ms - 1
            }
        }
    }
}

/// The `SystemTime` of a CQL `timestamp`.
pub fn from_cql(t: CqlTimestamp) -> SystemTime {
    if t.0 >= 0 {
        UNIX_EPOCH + Duration::from_millis(t.0.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_millis(t.0.unsigned_abs())
    }
}

/// The bucket a time falls in: the start of its minute (rounded towards the past on both sides
/// of the epoch).
pub fn bucket_of(t: CqlTimestamp) -> CqlTimestamp {
    CqlTimestamp(t.0.div_euclid(BUCKET_MS).saturating_mul(BUCKET_MS))
}

/// A position in an endpoint's history or dead letters: a row's bucket, time and delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketKey {
    /// The bucket of `at`.
    pub bucket: CqlTimestamp,
    /// The row's time (for history, the delivery's first attempt, for kept entries).
    pub at: CqlTimestamp,
    /// The delivery.
    pub delivery_id: DeliveryId,
}

/// First character of a cursor: names the bucket scheme, so that a cursor of another scheme
/// (schema version 1 issued `day.at_ms.delivery_id`, starting with a digit) is refused rather
/// than read as a position in the wrong tables.
const CURSOR_TAG: char = 'm';

impl BucketKey {
    /// The key of a row at `at`.
    pub fn new(at: CqlTimestamp, delivery_id: DeliveryId) -> BucketKey {
        BucketKey {
            bucket: bucket_of(at),
            at,
            delivery_id,
        }
    }

    /// The opaque cursor form: `m<bucket_ms>.<at_ms>.<delivery_id>`.
    pub fn encode(&self) -> String {
        format!(
            "{CURSOR_TAG}{}.{}.{}",
            self.bucket.0, self.at.0, self.delivery_id
        )
    }

    /// Parses a cursor this store issued; anything else is [`StoreError::BadCursor`].
    pub fn decode(cursor: &str) -> Result<BucketKey, StoreError> {
        let (bucket, at, id) = split_cursor(CURSOR_TAG, cursor)?;
        let delivery_id = DeliveryId::parse(id).map_err(|_| StoreError::BadCursor)?;
        Ok(BucketKey {
            bucket,
            at,
            delivery_id,
        })
    }
}

/// The parts of a cursor `<tag><bucket_ms>.<at_ms>.<id>`, checked: the bucket must be the
/// one of its time (a cursor this store issued).
fn split_cursor(tag: char, cursor: &str) -> Result<(CqlTimestamp, CqlTimestamp, &str), StoreError> {
    let rest = cursor.strip_prefix(tag).ok_or(StoreError::BadCursor)?;
    let mut parts = rest.splitn(3, '.');
    let (Some(bucket), Some(at), Some(id)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(StoreError::BadCursor);
    };
    let bucket = CqlTimestamp(bucket.parse().map_err(|_| StoreError::BadCursor)?);
    let at = CqlTimestamp(at.parse().map_err(|_| StoreError::BadCursor)?);
    if bucket_of(at) != bucket {
        return Err(StoreError::BadCursor);
    }
    Ok((bucket, at, id))
}

/// A position in a tenant's events: an event's bucket, time of receipt and id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventKey {
    /// The bucket of `at`.
    pub bucket: CqlTimestamp,
    /// When the event was received.
    pub at: CqlTimestamp,
    /// The event.
    pub event_id: EventId,
}

/// First character of an events cursor, so that a history cursor is refused as one.
const EVENT_CURSOR_TAG: char = 'e';

impl EventKey {
    /// The key of an event received at `at`.
    pub fn new(at: CqlTimestamp, event_id: EventId) -> EventKey {
        EventKey {
            bucket: bucket_of(at),
            at,
            event_id,
        }
    }

    /// The opaque cursor form: `e<bucket_ms>.<at_ms>.<event_id>`.
    pub fn encode(&self) -> String {
        format!(
            "{EVENT_CURSOR_TAG}{}.{}.{}",
            self.bucket.0, self.at.0, self.event_id
        )
    }

    /// Parses a cursor this store issued; anything else is [`StoreError::BadCursor`].
    pub fn decode(cursor: &str) -> Result<EventKey, StoreError> {
        let (bucket, at, id) = split_cursor(EVENT_CURSOR_TAG, cursor)?;
        let event_id = EventId::parse(id).map_err(|_| StoreError::BadCursor)?;
        Ok(EventKey {
            bucket,
            at,
            event_id,
        })
    }
}

/// The `status` column of an HTTP status.
pub fn status_col(status: Option<u16>) -> Option<i32> {
    status.map(i32::from)
}

/// The HTTP status a `status` column holds; `None` for one out of range.
pub fn status_from_col(status: Option<i32>) -> Option<u16> {
    status.and_then(|s| u16::try_from(s).ok())
}

/// The `attempt` column of an attempt number.
pub fn attempt_col(attempt: u32) -> Result<i32, StoreError> {
    i32::try_from(attempt)
        .map_err(|_| StoreError::Backend(format!("attempt number {attempt} exceeds CQL int")))
}

/// The `outcome`, `next_attempt_at` and `dead_reason` columns of an attempt row.
pub fn outcome_columns(
    outcome: &AttemptOutcome,
) -> (&'static str, Option<CqlTimestamp>, Option<&'static str>) {
    match outcome {
        AttemptOutcome::Succeeded => ("succeeded", None, None),
        AttemptOutcome::RetryScheduled { next_attempt_at } => {
            ("retry", Some(to_cql(*next_attempt_at)), None)
        }
        AttemptOutcome::Dead { reason } => ("dead", None, Some(reason.as_str())),
    }
}

/// Reads the outcome columns back; `None` when they are inconsistent.
pub fn outcome_from_columns(
    outcome: &str,
    next_attempt_at: Option<CqlTimestamp>,
    dead_reason: Option<&str>,
) -> Option<AttemptOutcome> {
    match outcome {
        "succeeded" => Some(AttemptOutcome::Succeeded),
        "retry" => Some(AttemptOutcome::RetryScheduled {
            next_attempt_at: from_cql(next_attempt_at?),
        }),
        "dead" => Some(AttemptOutcome::Dead {
            reason: DeadReason::parse(dead_reason?)?,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_at_millisecond_precision() {
        let t = UNIX_EPOCH + Duration::from_millis(1_800_000_000_123);
        assert_eq!(from_cql(to_cql(t)), t);
        let before = UNIX_EPOCH - Duration::from_millis(1_500);
        assert_eq!(from_cql(to_cql(before)), before);
        // Sub-millisecond parts are dropped towards the past on both sides of the epoch.
        let t = UNIX_EPOCH + Duration::from_micros(1_999);
        assert_eq!(to_cql(t), CqlTimestamp(1));
        let t = UNIX_EPOCH - Duration::from_micros(1_001);
        assert_eq!(to_cql(t), CqlTimestamp(-2));
    }

    #[test]
    fn buckets_split_at_whole_minutes() {
        assert_eq!(bucket_of(CqlTimestamp(0)), CqlTimestamp(0));
        assert_eq!(bucket_of(CqlTimestamp(BUCKET_MS - 1)), CqlTimestamp(0));
        assert_eq!(bucket_of(CqlTimestamp(BUCKET_MS)), CqlTimestamp(BUCKET_MS));
        assert_eq!(bucket_of(CqlTimestamp(-1)), CqlTimestamp(-BUCKET_MS));
        assert_eq!(
            bucket_of(CqlTimestamp(-BUCKET_MS)),
            CqlTimestamp(-BUCKET_MS)
        );
        // 2027-01-15T08:00:00Z plus 59.999 s is still in its minute; one more ms is the next.
        let minute = CqlTimestamp(1_800_000_000_000);
        assert_eq!(minute.0 % BUCKET_MS, 0);
        assert_eq!(bucket_of(CqlTimestamp(minute.0 + 59_999)), minute);
        assert_eq!(
            bucket_of(CqlTimestamp(minute.0 + 60_000)),
            CqlTimestamp(minute.0 + BUCKET_MS)
        );
        // The extremes do not overflow, and every bucket holds its own start.
        assert!(bucket_of(CqlTimestamp(i64::MIN)).0 <= i64::MIN + BUCKET_MS);
        assert!(bucket_of(CqlTimestamp(i64::MAX)).0 > i64::MAX - BUCKET_MS);
        for t in [-123_456_789, -1, 0, 1, 1_790_000_000_456] {
            let b = bucket_of(CqlTimestamp(t));
            assert!(b.0 <= t && t < b.0 + BUCKET_MS, "{t}");
            assert_eq!(bucket_of(b), b);
        }
    }

    #[test]
    fn the_bucket_width_is_the_schemas() {
        let schema = super::super::migrate::MIGRATIONS
            .iter()
            .find(|m| m.name == "history_buckets")
            .expect("the bucketed schema is embedded");
        assert!(
            schema.cql.contains("Bucket width: 60 seconds, fixed"),
            "BUCKET_MS and the schema's documented width must agree"
        );
        assert_eq!(BUCKET_MS, 60_000);
    }

    #[test]
    fn cursors_round_trip_and_reject_garbage() {
        for at in [1_800_000_000_000, 1_800_000_059_999, -1, 0] {
            let key = BucketKey::new(CqlTimestamp(at), DeliveryId::parse("dlv_a.b").unwrap());
            assert_eq!(BucketKey::decode(&key.encode()).unwrap(), key);
        }
        let key = BucketKey::new(
            CqlTimestamp(1_800_000_000_123),
            DeliveryId::parse("dlv_1").unwrap(),
        );
        assert_eq!(key.encode(), "m1800000000000.1800000000123.dlv_1");
        for bad in [
            "not a cursor",
            "",
            "m",
            "m1.2",
            "mx.1.dlv_1",
            "m0.x.dlv_1",
            "m0.2.",
            // The bucket must be the start of the time's minute.
            "m60000.0.dlv_1",
            "m1.2.dlv_1",
            // A schema-1 cursor (day.at_ms.delivery_id), even one that would parse as a
            // position, is refused.
            "20833.1800000000000.dlv_1",
            "0.5.dlv_1",
        ] {
            assert!(
                matches!(BucketKey::decode(bad), Err(StoreError::BadCursor)),
                "{bad}"
            );
        }
    }

    #[test]
    fn event_cursors_round_trip_and_reject_garbage() {
        for (at, id) in [(1_800_000_000_123, "evt_1"), (-1, "a.b.c"), (0, "x")] {
            let key = EventKey::new(CqlTimestamp(at), EventId::parse(id).unwrap());
            assert_eq!(EventKey::decode(&key.encode()).unwrap(), key);
        }
        let key = EventKey::new(
            CqlTimestamp(1_800_000_000_123),
            EventId::parse("evt_1").unwrap(),
        );
        assert_eq!(key.encode(), "e1800000000000.1800000000123.evt_1");
        for bad in [
            "m1800000000000.1800000000123.dlv_1",
            "e60000.0.evt_1",
            "e0.0.",
            "e0.0",
            "ex.0.evt_1",
            "",
        ] {
            assert!(
                matches!(EventKey::decode(bad), Err(StoreError::BadCursor)),
                "{bad}"
            );
        }
    }

    #[test]
    fn outcome_columns_round_trip() {
        let t = UNIX_EPOCH + Duration::from_secs(5);
        for outcome in [
            AttemptOutcome::Succeeded,
            AttemptOutcome::RetryScheduled { next_attempt_at: t },
            AttemptOutcome::Dead {
                reason: DeadReason::Gone,
            },
        ] {
            let (o, next, reason) = outcome_columns(&outcome);
            assert_eq!(outcome_from_columns(o, next, reason), Some(outcome));
        }
        assert_eq!(outcome_from_columns("retry", None, None), None);
        assert_eq!(outcome_from_columns("dead", None, Some("nope")), None);
    }
}
