//! Pure conversions between the store's Rust types and CQL columns: times, day buckets, the
//! history cursor, outcome columns. No I/O, so all of it is unit-tested without a server.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use scylla::value::CqlTimestamp;

use super::super::{AttemptOutcome, StoreError};
use crate::id::DeliveryId;
use crate::retry_policy::DeadReason;

const DAY_MS: i64 = 86_400_000;

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

/// The day bucket (whole UTC days since the epoch) a time falls in.
pub fn day_of(t: CqlTimestamp) -> i32 {
    i32::try_from(t.0.div_euclid(DAY_MS)).unwrap_or(if t.0 < 0 { i32::MIN } else { i32::MAX })
}

/// A position in an endpoint's history: an entry's bucket, time and delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryKey {
    /// Day bucket of `at`.
    pub day: i32,
    /// The entry's time (the delivery's first attempt, for kept entries).
    pub at: CqlTimestamp,
    /// The delivery.
    pub delivery_id: DeliveryId,
}

impl HistoryKey {
    /// The opaque cursor form: `day.at_ms.delivery_id`.
    pub fn encode(&self) -> String {
        format!("{}.{}.{}", self.day, self.at.0, self.delivery_id)
    }

    /// Parses a cursor this store issued; anything else is [`StoreError::BadCursor`].
    pub fn decode(cursor: &str) -> Result<HistoryKey, StoreError> {
        let mut parts = cursor.splitn(3, '.');
        let (Some(day), Some(at), Some(id)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(StoreError::BadCursor);
        };
        let day: i32 = day.parse().map_err(|_| StoreError::BadCursor)?;
        let at = CqlTimestamp(at.parse().map_err(|_| StoreError::BadCursor)?);
        let delivery_id = DeliveryId::parse(id).map_err(|_| StoreError::BadCursor)?;
        // A cursor whose bucket does not hold its time was not issued by this store.
        if day_of(at) != day {
            return Err(StoreError::BadCursor);
        }
        Ok(HistoryKey {
            day,
            at,
            delivery_id,
        })
    }
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
    fn day_buckets_split_at_utc_midnight() {
        assert_eq!(day_of(CqlTimestamp(0)), 0);
        assert_eq!(day_of(CqlTimestamp(DAY_MS - 1)), 0);
        assert_eq!(day_of(CqlTimestamp(DAY_MS)), 1);
        assert_eq!(day_of(CqlTimestamp(-1)), -1);
    }

    #[test]
    fn cursors_round_trip_and_reject_garbage() {
        let key = HistoryKey {
            day: day_of(CqlTimestamp(1_800_000_000_000)),
            at: CqlTimestamp(1_800_000_000_000),
            delivery_id: DeliveryId::parse("dlv_a.b").unwrap(),
        };
        assert_eq!(HistoryKey::decode(&key.encode()).unwrap(), key);
        for bad in [
            "not a cursor",
            "1.2",
            "x.1.dlv_1",
            "1.x.dlv_1",
            "1.2.",
            "5.0.dlv_1",
        ] {
            assert!(HistoryKey::decode(bad).is_err(), "{bad}");
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
