//! The writer's memory of the bucket-index rows it wrote (`endpoint_buckets`,
//! `tenant_event_buckets`), so that a bucket's index row is written once per (owner, bucket)
//! and process rather than once per row written into the bucket.
//!
//! An entry is trusted for [`REFRESH`]: the index row's TTL is [`SLACK`] longer than the rows
//! it points to, so it outlives every row written into its bucket while the entry is trusted.
//! The memory is bounded by [`CAPACITY`]. Writers move on to a new bucket every minute, so
//! when it is full the entries not used for [`KEEP`] go first; forgetting an entry only costs
//! one redundant idempotent write.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use scylla::value::CqlTimestamp;
use tokio::time::Instant;

/// How long a written index row is trusted before it is written again.
pub const REFRESH: Duration = Duration::from_secs(86_400);
/// How much longer than the rows it points to an index row lives.
pub const SLACK: Duration = Duration::from_secs(2 * 86_400);
// An index row must outlive every row written into its bucket while its entry is trusted.
const _: () = assert!(REFRESH.as_secs() < SLACK.as_secs());

/// Most entries kept.
pub const CAPACITY: usize = 65_536;
/// Entries used this recently survive a full memory's pruning: a bucket is written into for
/// about its own minute, plus the attempts that were in flight when it ended.
pub const KEEP: Duration = Duration::from_secs(120);

/// See the module documentation. `O` names the owner of a set of buckets: an endpoint and
/// the kind of its rows, or a tenant.
#[derive(Debug)]
pub struct WrittenBuckets<O> {
    /// When each index row was written, and when the entry was last used.
    written: Mutex<HashMap<(O, CqlTimestamp), Entry>>,
}

impl<O> Default for WrittenBuckets<O> {
    fn default() -> Self {
        WrittenBuckets {
            written: Mutex::new(HashMap::new()),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    written: Instant,
    used: Instant,
}

impl<O: std::hash::Hash + Eq + Clone> WrittenBuckets<O> {
    /// Whether the index row of `owner`'s `bucket` still needs writing by this process.
    pub fn needs_write(&self, owner: &O, bucket: CqlTimestamp, now: Instant) -> bool {
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        match written.get_mut(&(owner.clone(), bucket)) {
            Some(entry) if now.saturating_duration_since(entry.written) < REFRESH => {
                entry.used = now;
                false
            }
            _ => true,
        }
    }

    /// Records that the index row of `owner`'s `bucket`, issued at `at`, is durable.
    pub fn record(&self, owner: &O, bucket: CqlTimestamp, at: Instant) {
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        if written.len() >= CAPACITY {
            written.retain(|_, e| at.saturating_duration_since(e.used) < KEEP);
            // Still crowded (that many endpoints busy at once): start again rather than prune
            // on every insert.
            if written.len() >= CAPACITY / 2 {
                written.clear();
            }
        }
        written.insert(
            (owner.clone(), bucket),
            Entry {
                written: at,
                used: at,
            },
        );
    }

    /// How many entries are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.written.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::EndpointId;
    use crate::storage::scylla::row::BucketKind;

    fn ep(i: usize) -> EndpointId {
        EndpointId::parse(format!("ep_{i}")).unwrap()
    }

    #[test]
    fn a_bucket_is_written_once_per_kind_until_its_refresh() {
        let cache = WrittenBuckets::<(EndpointId, BucketKind)>::default();
        let t0 = Instant::now();
        let b = CqlTimestamp(1_800_000_000_000);
        assert!(cache.needs_write(&(ep(1), BucketKind::History), b, t0));
        cache.record(&(ep(1), BucketKind::History), b, t0);
        assert!(!cache.needs_write(&(ep(1), BucketKind::History), b, t0));
        // Another kind, bucket or endpoint is another index row.
        assert!(cache.needs_write(&(ep(1), BucketKind::Dead), b, t0));
        assert!(cache.needs_write(
            &(ep(1), BucketKind::History),
            CqlTimestamp(b.0 + 60_000),
            t0
        ));
        assert!(cache.needs_write(&(ep(2), BucketKind::History), b, t0));
        // Trusted until REFRESH after it was written, however often it is used meanwhile.
        let almost = t0 + REFRESH - Duration::from_secs(1);
        assert!(!cache.needs_write(&(ep(1), BucketKind::History), b, almost));
        assert!(cache.needs_write(&(ep(1), BucketKind::History), b, t0 + REFRESH));
    }

    #[test]
    fn a_full_memory_forgets_idle_buckets_first_and_stays_bounded() {
        let cache = WrittenBuckets::<(EndpointId, BucketKind)>::default();
        let t0 = Instant::now();
        let b = CqlTimestamp(0);
        for i in 0..CAPACITY - 1 {
            cache.record(&(ep(i), BucketKind::History), b, t0);
        }
        // A bucket still in use when the memory fills up is kept.
        let later = t0 + KEEP * 2;
        assert!(!cache.needs_write(&(ep(0), BucketKind::History), b, later));
        cache.record(&(ep(CAPACITY), BucketKind::History), b, later);
        cache.record(&(ep(CAPACITY + 1), BucketKind::History), b, later);
        assert_eq!(cache.len(), 3);
        assert!(!cache.needs_write(&(ep(0), BucketKind::History), b, later));
        assert!(cache.needs_write(&(ep(1), BucketKind::History), b, later));

        // All of them busy: it starts again instead of growing.
        let cache = WrittenBuckets::<(EndpointId, BucketKind)>::default();
        for i in 0..CAPACITY * 2 {
            cache.record(&(ep(i), BucketKind::History), b, t0);
            assert!(cache.len() <= CAPACITY);
        }
    }
}
