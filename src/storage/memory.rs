//! The embedded store: everything in memory, bounded, for `hookline dev` and tests.
//!
//! Entries are recorded from the pipeline's tasks under one lock, so no insert may do work
//! that grows with the store: a hash table that doubles or rehashes while the lock is held
//! stalls every delivery behind it. The tables are therefore sized for the store's capacity
//! at half load when the store is made, and deliveries are boxed so that a table slot stays
//! small. At that load a removal almost always frees its slot outright, so evicting the oldest
//! delivery (or event) for each new one never piles up the tombstones that force a rehash.
//!
//! A delivery's state is folded from its entries as they arrive ([`Derivation`]), in any
//! order, with the rules the CQL store applies on read.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use super::state::{Derivation, Entry, Identity};
use super::{
    AttemptRow, DeliveryNote, DeliveryState, DeliveryStore, EventQuery, EventRow, HistoryQuery,
    MAX_PAGE, Page, ReplayAudit, ReplayMark, StoreError,
};
use crate::id::{DeliveryId, EndpointId, EventId, Tenant};

/// Ordering key of an endpoint's history (creation time, delivery) or of a tenant's events
/// (receipt time, event): newest first means iterating these in reverse.
type HistoryKey = (u128, DeliveryId);
type EventKey = (u128, EventId);

/// The tables' hasher: foldhash, not SipHash. Every attempt does five or six lookups under the
/// store's lock, and the keys are ids hookline made, not attacker-chosen.
type Hasher = foldhash::fast::RandomState;
type Table<K, V> = HashMap<K, V, Hasher>;

/// One delivery: its entries folded, the state they imply, its attempts, oldest first, its
/// latest replay mark and its latest replay claim.
struct Held {
    fold: Derivation,
    state: DeliveryState,
    attempts: Vec<AttemptRow>,
    mark: Option<ReplayMark>,
    claim: Option<ReplayMark>,
}

struct Inner {
    deliveries: Table<DeliveryId, Box<Held>>,
    by_endpoint: Table<EndpointId, BTreeSet<HistoryKey>>,
    /// An event's deliveries, in the order they were first seen (one per endpoint: short).
    by_event: Table<EventId, Vec<DeliveryId>>,
    /// Deliveries in the order they were first seen, for eviction.
    arrival: VecDeque<DeliveryId>,
    events: Table<(Tenant, EventId), Box<EventRow>>,
    events_by_tenant: Table<Tenant, BTreeSet<EventKey>>,
    /// Events in the order they were first recorded, for eviction.
    event_arrival: VecDeque<(Tenant, EventId)>,
    replays: VecDeque<ReplayAudit>,
}

/// In-memory [`DeliveryStore`]. Keeps at most `capacity` deliveries and as many events; the
/// oldest are forgotten first, so a long `hookline dev` session cannot grow without bound.
pub struct MemoryStore {
    inner: Mutex<Inner>,
    capacity: usize,
}

/// Default number of deliveries (and of events) the embedded store keeps.
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

/// A page cursor: `<nanos>.<id>` of the last item listed.
fn encode_cursor(time: u128, id: &str) -> String {
    format!("{time}.{id}")
}

fn decode_cursor<I: TryFrom<String>>(cursor: &str) -> Result<(u128, I), StoreError> {
    let (t, id) = cursor.split_once('.').ok_or(StoreError::BadCursor)?;
    let t = t.parse().map_err(|_| StoreError::BadCursor)?;
    let id = I::try_from(id.to_owned()).map_err(|_| StoreError::BadCursor)?;
    Ok((t, id))
}

impl MemoryStore {
    /// A store that keeps at most `capacity` deliveries and `capacity` events (at least 1).
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
    /// Empty tables that hold `capacity` deliveries and as many events without growing.
    fn sized_for(capacity: usize) -> Inner {
        let slots = capacity.saturating_mul(SLOTS_PER_DELIVERY);
        let table = || HashMap::with_capacity_and_hasher(slots, Hasher::default());
        Inner {
            deliveries: table(),
            by_endpoint: HashMap::default(),
            by_event: HashMap::with_capacity_and_hasher(slots, Hasher::default()),
            arrival: VecDeque::with_capacity(capacity),
            events: HashMap::with_capacity_and_hasher(slots, Hasher::default()),
            events_by_tenant: HashMap::default(),
            event_arrival: VecDeque::with_capacity(capacity),
            replays: VecDeque::new(),
        }
    }

    fn evict_oldest(&mut self) {
        let Some(id) = self.arrival.pop_front() else {
            return;
        };
        if let Some(held) = self.deliveries.remove(&id) {
            let state = &held.state;
            if let Some(set) = self.by_endpoint.get_mut(&state.endpoint_id) {
                set.remove(&(nanos(state.created_at), id.clone()));
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

    fn evict_oldest_event(&mut self) {
        let Some(key) = self.event_arrival.pop_front() else {
            return;
        };
        if let Some(row) = self.events.remove(&key)
            && let Some(set) = self.events_by_tenant.get_mut(&key.0)
        {
            set.remove(&(nanos(row.received_at), key.1.clone()));
            if set.is_empty() {
                self.events_by_tenant.remove(&key.0);
            }
        }
    }

    /// Folds `entry` into its delivery's state, making the delivery (and its history and
    /// event index entries) when it is new, evicting the oldest beyond `capacity`; moves its
    /// history entry when its creation time changed. Returns the delivery.
    fn add_entry(
        &mut self,
        capacity: usize,
        identity: impl FnOnce() -> Identity,
        entry: Entry,
        id: &DeliveryId,
    ) -> &mut Held {
        if !self.deliveries.contains_key(id) {
            while self.deliveries.len() >= capacity {
                self.evict_oldest();
            }
            let fold = Derivation::new(identity(), entry);
            let state = fold.state();
            self.arrival.push_back(id.clone());
            self.by_endpoint
                .entry(state.endpoint_id.clone())
                .or_default()
                .insert((nanos(state.created_at), id.clone()));
            self.by_event
                .entry(state.event_id.clone())
                .or_default()
                .push(id.clone());
            self.deliveries.insert(
                id.clone(),
                Box::new(Held {
                    fold,
                    state,
                    attempts: vec![],
                    mark: None,
                    claim: None,
                }),
            );
        } else {
            let held = self.deliveries.get_mut(id).expect("checked above");
            let old_created = nanos(held.state.created_at);
            held.fold.add(entry);
            held.state = held.fold.state();
            let new_created = nanos(held.state.created_at);
            if old_created != new_created {
                let history = self
                    .by_endpoint
                    .entry(held.state.endpoint_id.clone())
                    .or_default();
                history.remove(&(old_created, id.clone()));
                history.insert((new_created, id.clone()));
            }
        }
        self.deliveries.get_mut(id).expect("held")
    }

    /// Keeps `event` (its endpoints joined to those of an earlier record of it), evicting the
    /// oldest event beyond `capacity`.
    fn keep_event(&mut self, capacity: usize, event: &EventRow) {
        let key = (event.tenant.clone(), event.event_id.clone());
        if let Some(kept) = self.events.get_mut(&key) {
            let mut endpoints = kept.endpoints.clone();
            for ep in &event.endpoints {
                if !endpoints.contains(ep) {
                    endpoints.push(ep.clone());
                }
            }
            let old = nanos(kept.received_at);
            **kept = EventRow {
                endpoints,
                ..event.clone()
            };
            if old != nanos(event.received_at) {
                let set = self.events_by_tenant.entry(key.0.clone()).or_default();
                set.remove(&(old, key.1.clone()));
                set.insert((nanos(event.received_at), key.1.clone()));
            }
            return;
        }
        while self.events.len() >= capacity {
            self.evict_oldest_event();
        }
        self.events_by_tenant
            .entry(key.0.clone())
            .or_default()
            .insert((nanos(event.received_at), key.1.clone()));
        self.event_arrival.push_back(key.clone());
        self.events.insert(key, Box::new(event.clone()));
    }
}

#[async_trait]
impl DeliveryStore for MemoryStore {
    async fn record_attempt(&self, row: &AttemptRow) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let held = inner.add_entry(
            self.capacity,
            || Identity::of_attempt(row),
            Entry::attempt(row),
            &row.delivery_id,
        );
        held.attempts.push(row.clone());
        // Attempts mostly arrive in order; sort only when this one did not.
        if held
            .attempts
            .windows(2)
            .last()
            .is_some_and(|w| (w[0].started_at, w[0].attempt) > (w[1].started_at, w[1].attempt))
        {
            held.attempts.sort_by_key(|r| (r.started_at, r.attempt));
        }
        Ok(())
    }

    async fn record_note(&self, note: &DeliveryNote) -> Result<(), StoreError> {
        self.lock().add_entry(
            self.capacity,
            || Identity::of_note(note),
            Entry::note(note),
            &note.delivery_id,
        );
        Ok(())
    }

    async fn record_event(&self, event: &EventRow) -> Result<(), StoreError> {
        let mut inner = self.lock();
        inner.keep_event(self.capacity, event);
        for endpoint in &event.endpoints {
            let id = DeliveryId::derive(&event.event_id, endpoint);
            let identity = || Identity {
                delivery_id: id.clone(),
                event_id: event.event_id.clone(),
                endpoint_id: endpoint.clone(),
                tenant: event.tenant.clone(),
                event_type: event.event_type.clone(),
            };
            inner.add_entry(
                self.capacity,
                identity,
                Entry::created(event.received_at),
                &id,
            );
        }
        Ok(())
    }

    async fn event(&self, tenant: &Tenant, id: &EventId) -> Result<Option<EventRow>, StoreError> {
        Ok(self
            .lock()
            .events
            .get(&(tenant.clone(), id.clone()))
            .map(|e| (**e).clone()))
    }

    async fn events(
        &self,
        tenant: &Tenant,
        query: &EventQuery,
    ) -> Result<Page<EventRow>, StoreError> {
        let limit = query.limit.clamp(1, MAX_PAGE) as usize;
        let before = query
            .cursor
            .as_deref()
            .map(decode_cursor::<EventId>)
            .transpose()?;
        let since = query.since.map(nanos).unwrap_or(0);
        let until = query.until.map(nanos);
        let inner = self.lock();
        let Some(listed) = inner.events_by_tenant.get(tenant) else {
            return Ok(Page {
                items: vec![],
                next_cursor: None,
            });
        };
        let range = match before {
            Some(k) => listed.range(..k),
            None => listed.range(..),
        };
        let mut items = Vec::with_capacity(limit);
        let mut next_cursor = None;
        for key in range.rev().skip_while(|k| until.is_some_and(|u| k.0 >= u)) {
            if key.0 < since {
                break;
            }
            let Some(row) = inner.events.get(&(tenant.clone(), key.1.clone())) else {
                continue;
            };
            if query
                .event_type
                .as_deref()
                .is_some_and(|t| t != row.event_type)
            {
                continue;
            }
            if items.len() == limit {
                next_cursor = items
                    .last()
                    .map(|r: &EventRow| encode_cursor(nanos(r.received_at), r.event_id.as_str()));
                break;
            }
            items.push((**row).clone());
        }
        Ok(Page { items, next_cursor })
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
        let before = query
            .cursor
            .as_deref()
            .map(decode_cursor::<DeliveryId>)
            .transpose()?;
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
        let range = match before {
            Some(k) => history.range(..k),
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
            last_key = Some(key);
        }
        let next_cursor = if more {
            last_key.map(|k| encode_cursor(k.0, k.1.as_str()))
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

    #[tokio::test]
    async fn forgets_the_oldest_events_beyond_capacity() {
        let store = MemoryStore::with_capacity(3);
        let tenant = Tenant::parse("acme").unwrap();
        let t0 = UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
        for i in 0..5u64 {
            let row = EventRow {
                tenant: tenant.clone(),
                event_id: EventId::parse(format!("e{i}")).unwrap(),
                event_type: "order.created".into(),
                occurred_at: t0,
                received_at: t0 + std::time::Duration::from_secs(i),
                body: bytes::Bytes::from_static(b"{}"),
                fingerprint: "f".into(),
                endpoints: vec![],
            };
            store.record_event(&row).await.unwrap();
        }
        let query = EventQuery {
            limit: 10,
            ..Default::default()
        };
        let page = store.events(&tenant, &query).await.unwrap();
        let ids: Vec<&str> = page.items.iter().map(|e| e.event_id.as_str()).collect();
        assert_eq!(ids, ["e4", "e3", "e2"]);
        let e0 = EventId::parse("e0").unwrap();
        assert_eq!(store.event(&tenant, &e0).await.unwrap(), None);
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
                i.events.capacity(),
                i.event_arrival.capacity(),
            )
        };
        let made = sizes(&store.lock());
        assert!(
            made.0 >= 2 * CAP
                && made.1 >= 2 * CAP
                && made.2 >= CAP
                && made.3 >= 2 * CAP
                && made.4 >= CAP,
            "{made:?}"
        );
        let tenant = Tenant::parse("acme").unwrap();
        for i in 0..4 * CAP {
            // Half the deliveries made by their event's record, half by their first attempt.
            let event = format!("t{i}");
            if i % 2 == 0 {
                let row = crate::storage::conformance::attempt_row(&event, "ep_turn", 1);
                store.record_attempt(&row).await.unwrap();
            }
            let row = EventRow {
                tenant: tenant.clone(),
                event_id: EventId::parse(&event).unwrap(),
                event_type: "order.created".into(),
                occurred_at: SystemTime::now(),
                received_at: SystemTime::now(),
                body: bytes::Bytes::from_static(b"{}"),
                fingerprint: "f".into(),
                endpoints: vec![EndpointId::parse("ep_turn").unwrap()],
            };
            store.record_event(&row).await.unwrap();
        }
        let inner = store.lock();
        assert_eq!(inner.deliveries.len(), CAP);
        assert_eq!(inner.by_event.len(), CAP);
        assert_eq!(inner.events.len(), CAP);
        assert_eq!(inner.events_by_tenant[&tenant].len(), CAP);
        let after = sizes(&inner);
        assert!(
            after.0 <= made.0 && after.1 <= made.1 && after.3 <= made.3,
            "a table grew: {made:?} -> {after:?}"
        );
        assert_eq!(after.2, made.2, "the arrival queue grew");
        assert_eq!(after.4, made.4, "the event arrival queue grew");
        // Slots lost to tombstones count against the room left; a rehash is due only when
        // none is left.
        for (table, slots, used) in [
            ("deliveries", after.0, inner.deliveries.len()),
            ("by_event", after.1, inner.by_event.len()),
            ("events", after.3, inner.events.len()),
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
        for bad in ["nope", "12.", "x.dlv_1", "-1.dlv_1"] {
            assert!(decode_cursor::<DeliveryId>(bad).is_err(), "{bad}");
            assert!(decode_cursor::<EventId>(bad).is_err(), "{bad}");
        }
        assert_eq!(
            decode_cursor::<EventId>("12.evt.a.b").unwrap(),
            (12, EventId::parse("evt.a.b").unwrap()),
            "an id with dots"
        );
    }
}
