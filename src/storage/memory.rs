//! The embedded store: everything in memory, bounded, for `hookline dev` and tests.
//!
//! Attempts are recorded from the delivery stage's tasks under one lock, so no insert may do
//! work that grows with the store: a hash table that doubles or rehashes while the lock is
//! held stalls every delivery behind it. The tables
//! are therefore sized for the store's capacity at half load when the store is made, and
//! deliveries are boxed so that a table slot stays small. At that load a removal almost always
//! frees its slot outright, so evicting the oldest delivery for each new one never piles up
//! the tombstones that force a rehash.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use super::{
    AttemptRow, DeliveryState, DeliveryStore, HistoryQuery, MAX_PAGE, Page, ReplayAudit,
    ReplayMark, StoreError,
};
use crate::id::{DeliveryId, EndpointId, EventId, Tenant};

/// Ordering key of an endpoint's history: newest first means iterating this in reverse.
type HistoryKey = (u128, DeliveryId);

/// The tables' hasher: foldhash, not SipHash. Every attempt does five or six lookups under the
/// store's lock, and the keys are ids hookline made, not attacker-chosen.
type Hasher = foldhash::fast::RandomState;
type Table<K, V> = HashMap<K, V, Hasher>;

/// One delivery: its state, its attempts, oldest first, its latest replay mark and its latest
/// replay claim.
struct Entry {
    state: DeliveryState,
    attempts: Vec<AttemptRow>,
    mark: Option<ReplayMark>,
    claim: Option<ReplayMark>,
}

struct Inner {
    deliveries: Table<DeliveryId, Box<Entry>>,
    by_endpoint: Table<EndpointId, BTreeSet<HistoryKey>>,
    /// An event's deliveries, in the order they were first seen (one per endpoint: short).
    by_event: Table<EventId, Vec<DeliveryId>>,
    /// Deliveries in the order they were first seen, for eviction.
    arrival: VecDeque<DeliveryId>,
    replays: VecDeque<ReplayAudit>,
}

/// In-memory [`DeliveryStore`]. Keeps at most `capacity` deliveries; the oldest are forgotten
/// first, so a long `hookline dev` session cannot grow without bound.
pub struct MemoryStore {
    inner: Mutex<Inner>,
    capacity: usize,
}

/// Default number of deliveries the embedded store keeps.
pub const DEFAULT_CAPACITY: usize = 200_000;
const MAX_REPLAYS: usize = 1_000;
/// Table slots per delivery the store may hold: at most half of each table is ever in use.
const SLOTS_PER_DELIVERY: usize = 2;

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::with_capacity(DEFAULT_CAPACITY)
    }
}

fn nanos(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

fn encode_cursor(key: &HistoryKey) -> String {
    format!("{}.{}", key.0, key.1)
}

fn decode_cursor(cursor: &str) -> Result<HistoryKey, StoreError> {
    let (t, id) = cursor.split_once('.').ok_or(StoreError::BadCursor)?;
    let t = t.parse().map_err(|_| StoreError::BadCursor)?;
    let id = DeliveryId::parse(id).map_err(|_| StoreError::BadCursor)?;
    Ok((t, id))
}

impl MemoryStore {
    /// A store that keeps at most `capacity` deliveries (at least 1).
    pub fn with_capacity(capacity: usize) -> MemoryStore {
        let capacity = capacity.max(1);
        MemoryStore {
            inner: Mutex::new(Inner::sized_for(capacity)),
            capacity,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that
        // matters for a dev store; keep serving rather than poisoning every later call.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Inner {
    /// Empty tables that hold `capacity` deliveries (and as many events) without growing.
    fn sized_for(capacity: usize) -> Inner {
        let slots = capacity.saturating_mul(SLOTS_PER_DELIVERY);
        Inner {
            deliveries: HashMap::with_capacity_and_hasher(slots, Hasher::default()),
            by_endpoint: HashMap::default(),
            by_event: HashMap::with_capacity_and_hasher(slots, Hasher::default()),
            arrival: VecDeque::with_capacity(capacity),
            replays: VecDeque::new(),
        }
    }

    fn evict_oldest(&mut self) {
        let Some(id) = self.arrival.pop_front() else {
            return;
        };
        if let Some(entry) = self.deliveries.remove(&id) {
            let state = &entry.state;
            if let Some(set) = self.by_endpoint.get_mut(&state.endpoint_id) {
                set.remove(&(nanos(state.first_attempt_at), id.clone()));
                if set.is_empty() {
                    self.by_endpoint.remove(&state.endpoint_id);
                }
            }
            if let Some(set) = self.by_event.get_mut(&state.event_id) {
                set.retain(|d| *d != id);
                if set.is_empty() {
                    self.by_event.remove(&state.event_id);
                }
            }
        }
    }
}

#[async_trait]
impl DeliveryStore for MemoryStore {
    async fn record_attempt(&self, row: &AttemptRow) -> Result<(), StoreError> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        if !inner.deliveries.contains_key(&row.delivery_id) {
            while inner.deliveries.len() >= self.capacity {
                inner.evict_oldest();
            }
            inner.arrival.push_back(row.delivery_id.clone());
            let state = DeliveryState::after(None, row);
            inner
                .by_endpoint
                .entry(row.endpoint_id.clone())
                .or_default()
                .insert((nanos(state.first_attempt_at), row.delivery_id.clone()));
            inner
                .by_event
                .entry(row.event_id.clone())
                .or_default()
                .push(row.delivery_id.clone());
            inner.deliveries.insert(
                row.delivery_id.clone(),
                Box::new(Entry {
                    state,
                    attempts: vec![row.clone()],
                    mark: None,
                    claim: None,
                }),
            );
            return Ok(());
        }
        let entry = inner
            .deliveries
            .get_mut(&row.delivery_id)
            .expect("checked above");
        let next = DeliveryState::after(Some(&entry.state), row);
        let old_first = nanos(entry.state.first_attempt_at);
        let new_first = nanos(next.first_attempt_at);
        if old_first != new_first {
            let history = inner
                .by_endpoint
                .entry(row.endpoint_id.clone())
                .or_default();
            history.remove(&(old_first, row.delivery_id.clone()));
            history.insert((new_first, row.delivery_id.clone()));
        }
        entry.state = next;
        entry.attempts.push(row.clone());
        // Attempts mostly arrive in order; sort only when this one did not.
        if entry
            .attempts
            .windows(2)
            .last()
            .is_some_and(|w| (w[0].started_at, w[0].attempt) > (w[1].started_at, w[1].attempt))
        {
            entry.attempts.sort_by_key(|r| (r.started_at, r.attempt));
        }
        Ok(())
    }

    async fn delivery(&self, id: &DeliveryId) -> Result<Option<DeliveryState>, StoreError> {
        Ok(self.lock().deliveries.get(id).map(|e| e.state.clone()))
    }

    async fn attempts(&self, id: &DeliveryId) -> Result<Vec<AttemptRow>, StoreError> {
        Ok(self
            .lock()
            .deliveries
            .get(id)
            .map(|e| e.attempts.clone())
            .unwrap_or_default())
    }

    async fn endpoint_deliveries(
        &self,
        endpoint: &EndpointId,
        query: &HistoryQuery,
    ) -> Result<Page<DeliveryState>, StoreError> {
        let limit = query.limit.clamp(1, MAX_PAGE) as usize;
        let before = query.cursor.as_deref().map(decode_cursor).transpose()?;
        let since = query.since.map(nanos).unwrap_or(0);
        let inner = self.lock();
        let Some(history) = inner.by_endpoint.get(endpoint) else {
            return Ok(Page {
                items: vec![],
                next_cursor: None,
            });
        };
        let mut items = Vec::with_capacity(limit);
        let mut last_key = None;
        let mut more = false;
        let range = match &before {
            Some(k) => history.range(..k.clone()),
            None => history.range(..),
        };
        for key in range.rev() {
            if key.0 < since {
                break;
            }
            let Some(state) = inner.deliveries.get(&key.1).map(|e| &e.state) else {
                continue;
            };
            if query.status.is_some_and(|s| s != state.status) {
                continue;
            }
            if items.len() == limit {
                more = true;
                break;
            }
            items.push(state.clone());
            last_key = Some(key.clone());
        }
        let next_cursor = if more {
            last_key.as_ref().map(encode_cursor)
        } else {
            None
        };
        Ok(Page { items, next_cursor })
    }

    async fn event_deliveries(&self, event: &EventId) -> Result<Vec<DeliveryState>, StoreError> {
        let inner = self.lock();
        let mut states: Vec<DeliveryState> = inner
            .by_event
            .get(event)
            .into_iter()
            .flatten()
            .filter_map(|id| inner.deliveries.get(id).map(|e| e.state.clone()))
            .collect();
        // Ordered by delivery id, as the CQL store's clustering orders them.
        states.sort_by(|a, b| a.delivery_id.cmp(&b.delivery_id));
        Ok(states)
    }

    async fn record_replay(&self, audit: &ReplayAudit) -> Result<(), StoreError> {
        let mut inner = self.lock();
        if inner.replays.len() == MAX_REPLAYS {
            inner.replays.pop_front();
        }
        inner.replays.push_back(audit.clone());
        Ok(())
    }

    async fn replays(
        &self,
        tenant: Option<&Tenant>,
        limit: u32,
    ) -> Result<Vec<ReplayAudit>, StoreError> {
        let inner = self.lock();
        Ok(inner
            .replays
            .iter()
            .rev()
            .filter(|a| tenant.is_none_or(|t| a.tenant.as_ref() == Some(t)))
            .take(limit as usize)
            .cloned()
            .collect())
    }

    /// Kept with its delivery, and forgotten with it: a mark of a delivery this store does
    /// not hold (never logged, or forgotten for capacity) is dropped, since nothing could be
    /// replayed through the admin API without its state anyway.
    async fn record_replay_mark(&self, mark: &ReplayMark) -> Result<(), StoreError> {
        if let Some(entry) = self.lock().deliveries.get_mut(&mark.delivery_id) {
            entry.mark = Some(mark.clone());
        }
        Ok(())
    }

    async fn replay_mark(&self, id: &DeliveryId) -> Result<Option<ReplayMark>, StoreError> {
        Ok(self.lock().deliveries.get(id).and_then(|e| e.mark.clone()))
    }

    async fn replay_claim(&self, id: &DeliveryId) -> Result<Option<ReplayMark>, StoreError> {
        Ok(self.lock().deliveries.get(id).and_then(|e| e.claim.clone()))
    }

    /// Under the store's lock. A delivery this store does not hold (never logged here, or
    /// forgotten for capacity) is granted without a claim being kept, as its mark is dropped:
    /// only a replay of a range of DLQ offsets asks for one, and nothing replays it through the
    /// admin API without its state.
    async fn claim_replay(
        &self,
        claim: &ReplayMark,
        over: Option<&str>,
    ) -> Result<bool, StoreError> {
        let mut inner = self.lock();
        let Some(entry) = inner.deliveries.get_mut(&claim.delivery_id) else {
            return Ok(true);
        };
        if entry.claim.as_ref().map(|c| c.replay_id.as_str()) != over {
            return Ok(false);
        }
        entry.claim = Some(claim.clone());
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn passes_the_conformance_suite() {
        crate::storage::conformance::run(&MemoryStore::default()).await;
    }

    #[tokio::test]
    async fn forgets_the_oldest_deliveries_beyond_capacity() {
        let store = MemoryStore::with_capacity(3);
        for i in 0..5 {
            let row = crate::storage::conformance::attempt_row(&format!("e{i}"), "ep_cap", 1);
            store.record_attempt(&row).await.unwrap();
        }
        let ep = EndpointId::parse("ep_cap").unwrap();
        let page = store
            .endpoint_deliveries(
                &ep,
                &HistoryQuery {
                    limit: 10,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(page.items.len(), 3);
        assert_eq!(page.items[0].event_id.as_str(), "e4");
        assert!(
            store
                .event_deliveries(&EventId::parse("e0").unwrap())
                .await
                .unwrap()
                .is_empty()
        );
    }

    /// Filling the store several times over (each new delivery evicting the oldest) leaves its
    /// tables at the size they were made with, with most of their room still free: no insert
    /// ever has to grow or rehash a table under the lock.
    #[tokio::test]
    async fn tables_never_grow_while_the_store_turns_over() {
        const CAP: usize = 2_000;
        let store = MemoryStore::with_capacity(CAP);
        let sizes = |i: &Inner| {
            (
                i.deliveries.capacity(),
                i.by_event.capacity(),
                i.arrival.capacity(),
            )
        };
        let made = sizes(&store.lock());
        assert!(
            made.0 >= 2 * CAP && made.1 >= 2 * CAP && made.2 >= CAP,
            "{made:?}"
        );
        for i in 0..4 * CAP {
            let row = crate::storage::conformance::attempt_row(&format!("t{i}"), "ep_turn", 1);
            store.record_attempt(&row).await.unwrap();
        }
        let inner = store.lock();
        assert_eq!(inner.deliveries.len(), CAP);
        assert_eq!(inner.by_event.len(), CAP);
        let after = sizes(&inner);
        assert!(
            after.0 <= made.0 && after.1 <= made.1,
            "a table grew: {made:?} -> {after:?}"
        );
        assert_eq!(after.2, made.2, "the arrival queue grew");
        // Slots lost to tombstones count against the room left; a rehash is due only when
        // none is left.
        for (table, slots, used) in [
            ("deliveries", after.0, inner.deliveries.len()),
            ("by_event", after.1, inner.by_event.len()),
        ] {
            assert!(
                slots - used > CAP / 2,
                "{table}: {} of {slots} slots left",
                slots - used
            );
        }
    }

    #[test]
    fn cursors_reject_garbage() {
        assert!(decode_cursor("nope").is_err());
        assert!(decode_cursor("12.").is_err());
        assert!(decode_cursor("x.dlv_1").is_err());
    }
}
