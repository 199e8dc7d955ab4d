//! The endpoint registry: every instance's materialised view of the compacted endpoints topic.
//!
//! [`EndpointView`] is the in-memory map (endpoint id → opened [`Endpoint`]) that the fan-out's
//! subscription index, the delivery workers and the admin API read. Records are applied to it
//! in topic order; a malformed record is logged and skipped, never a crash, and a tombstone
//! deletes. Readers learn of changes through a `watch` of [`ViewStatus`] (a sequence number that
//! moves on every applied record, and whether the start-up backlog has been read).
//!
//! Writes go through an [`EndpointStore`]: [`kafka::KafkaEndpointStore`] produces to the topic and
//! waits until this instance's own view has applied that offset, so the admin API answers only
//! with what every later read on this instance will see; [`MemoryEndpointStore`] applies directly
//! (tests and `hookline dev` without Kafka). [`kafka::spawn_materializer`] feeds the view from
//! the topic.
//!
//! The topic also holds tenant records, API keys and ceilings (`tenant`): the view keeps them
//! beside the endpoints, and serves each endpoint as it applies under its tenant's ceilings
//! ([`EndpointView::get`]), so that every stage reading the view honours them.
//!
//! Files: `mod.rs` the view and the store trait, `kafka.rs` the materialiser and the Kafka
//! writer, `tenant.rs` the tenant records.

pub mod kafka;
pub mod tenant;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use tokio::sync::watch;

use crate::endpoint::{Endpoint, EndpointRecord};
use crate::id::{EndpointId, Tenant};
use crate::record::UnixMillis;
use crate::sealed::MasterKey;
use crate::tenant::{Ceilings, TenantDefaults, TenantError, TenantKey, TenantKeyId, TenantLimits};

use self::tenant::{TenantRecord, TenantState};

/// Longest endpoint record value the view accepts; larger ones are skipped as malformed (a
/// valid endpoint is a few tens of KiB at most).
pub const MAX_RECORD_BYTES: usize = 1 << 20;

/// What went wrong writing to or waiting on the registry.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Waited too long (for the broker's acknowledgement or for the view to catch up).
    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: &'static str,
        /// How long.
        waited: Duration,
    },
    /// The view already holds this endpoint at the same or a newer version: someone else wrote
    /// it first.
    #[error("endpoint {id} is at version {current}; the write carried version {attempted}")]
    Conflict {
        /// The endpoint.
        id: EndpointId,
        /// The version the view holds.
        current: u64,
        /// The version the write carried.
        attempted: u64,
    },
    /// The endpoint is not valid (checked again before it is written).
    #[error(transparent)]
    Invalid(#[from] crate::endpoint::EndpointError),
    /// A tenant key or ceilings record is not valid (checked before it is written).
    #[error(transparent)]
    Tenant(#[from] TenantError),
    /// Kafka refused or failed.
    #[error("kafka: {0}")]
    Kafka(String),
    /// The view's sender is gone (the process is shutting down).
    #[error("the endpoint view is closed")]
    Closed,
    /// Endpoint records whose secrets do not open with the configured master key.
    #[error(
        "{count} endpoint record(s) do not open with security.master_key (endpoint {first}: \
         {error}): it is not the key they were sealed with, or they were altered. hookline does \
         not start, since events for those endpoints would not be delivered; start it with the \
         key they were sealed with, or delete those endpoints' records (a tombstone keyed by \
         the endpoint id in the endpoints topic)"
    )]
    Unopened {
        /// How many endpoints' latest records do not open.
        count: usize,
        /// One of them.
        first: EndpointId,
        /// Why that one does not open.
        error: String,
    },
}

/// What applying one record did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// An endpoint was inserted or replaced.
    Upserted,
    /// A tombstone removed an endpoint (or found none to remove).
    Deleted,
    /// The record was malformed or its secrets did not open; it was logged and skipped.
    Skipped,
}

/// The view's progress, published on every applied record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ViewStatus {
    /// Moves by one on every applied record (including skipped ones).
    pub seq: u64,
    /// The backlog present at start-up has been read.
    pub caught_up: bool,
}

#[derive(Default)]
struct State {
    /// Endpoints as they apply: lowered to their tenant's ceilings.
    endpoints: HashMap<EndpointId, Arc<Endpoint>>,
    /// Endpoints as written (the same `Arc` as in `endpoints` when nothing is lowered).
    written: HashMap<EndpointId, Arc<Endpoint>>,
    /// API keys, ceilings and the config's defaults.
    tenants: TenantState,
    /// Endpoints whose latest record did not open (most likely the wrong master key), with why.
    unopened: BTreeMap<EndpointId, String>,
    /// Per partition, the offset after the last applied record.
    next_offsets: HashMap<i32, i64>,
}

/// The thread-safe materialised view of the endpoints topic. Locks are never held across an
/// await.
pub struct EndpointView {
    key: MasterKey,
    state: RwLock<State>,
    status: watch::Sender<ViewStatus>,
    /// Unix milliseconds before which every write to the endpoints topic is known to be
    /// applied here (see [`EndpointView::holds_writes_before`]); `u64::MAX` for a view that
    /// is written directly and so is always current.
    confirmed_ms: AtomicU64,
    /// Wakes the task that confirms the view (see [`EndpointView::request_confirmation`]).
    confirm_wanted: tokio::sync::Notify,
}

impl std::fmt::Debug for EndpointView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointView")
            .field("endpoints", &self.len())
            .field("status", &*self.status.borrow())
            .finish()
    }
}

impl EndpointView {
    /// An empty view that opens secrets with `key`; no tenant ceilings unless
    /// [`EndpointView::with_tenant_defaults`] gives some.
    pub fn new(key: MasterKey) -> EndpointView {
        EndpointView {
            key,
            state: RwLock::new(State::default()),
            status: watch::Sender::new(ViewStatus::default()),
            confirmed_ms: AtomicU64::new(0),
            confirm_wanted: tokio::sync::Notify::new(),
        }
    }

    /// Sets the ceilings every tenant has unless an operator set its own (the config's
    /// `[tenants]`), and the service's default `max_in_flight`. Set before records are applied.
    pub fn with_tenant_defaults(self, defaults: TenantDefaults) -> EndpointView {
        self.write().tenants.defaults = defaults;
        self
    }

    /// Whether every record written to the endpoints topic before `t` is known to be applied
    /// here. A reader that does not find an endpoint it was sent work for asks this of the time
    /// the work reached it: the work was made by an instance that found the endpoint, so before
    /// then. If the view holds every write before that time, the endpoint is gone (deleted, or
    /// disabled since); if not, this instance's view may just be behind the other's, and the
    /// reader should [request a confirmation](EndpointView::request_confirmation) and look again.
    pub fn holds_writes_before(&self, t: SystemTime) -> bool {
        self.confirmed_ms.load(Ordering::Acquire) > UnixMillis::from(t).0
    }

    /// Asks the view's feeder to confirm that the view holds every write made so far (it reads
    /// the topic's high watermarks and waits until the view has applied that far). Calls while
    /// a confirmation runs add one more round at most.
    pub fn request_confirmation(&self) {
        self.confirm_wanted.notify_one();
    }

    /// Waits for a [confirmation request](EndpointView::request_confirmation).
    pub async fn confirmation_requested(&self) {
        self.confirm_wanted.notified().await;
    }

    /// Records that every write to the topic made before `asked_at` is applied.
    pub fn confirm_as_of(&self, asked_at: SystemTime) {
        self.confirmed_ms
            .fetch_max(UnixMillis::from(asked_at).0, Ordering::AcqRel);
    }

    /// Declares the view always current: it is written directly, not fed from a topic.
    pub fn mark_always_current(&self) {
        self.confirmed_ms.store(u64::MAX, Ordering::Release);
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        // A panic while holding the lock cannot leave the map half-updated (each update is one
        // insert or remove), so a poisoned lock is still consistent.
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies one record without a position (the in-memory store, tests).
    pub fn apply(&self, key: &[u8], value: Option<&[u8]>) -> Applied {
        self.apply_inner(None, key, value)
    }

    /// Applies the record at (`partition`, `offset`) of the endpoints topic and records the
    /// position, so writers waiting for it are released.
    pub fn apply_at(
        &self,
        partition: i32,
        offset: i64,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Applied {
        self.apply_inner(Some((partition, offset)), key, value)
    }

    fn apply_inner(&self, at: Option<(i32, i64)>, key: &[u8], value: Option<&[u8]>) -> Applied {
        let parsed = self.decode(key, value);
        let applied = {
            let mut state = self.write();
            if let Some((partition, offset)) = at {
                let next = state.next_offsets.entry(partition).or_insert(0);
                *next = (*next).max(offset + 1);
            }
            state.apply(parsed)
        };
        self.status.send_modify(|s| s.seq += 1);
        applied
    }

    /// Parses and opens a record outside the lock (opening secrets is the slow part).
    fn decode(&self, key: &[u8], value: Option<&[u8]>) -> Decoded {
        if let Some(record) = std::str::from_utf8(key)
            .ok()
            .and_then(|k| tenant::decode(k, value))
        {
            return Decoded::Tenant(record);
        }
        let id = match std::str::from_utf8(key)
            .ok()
            .and_then(|k| EndpointId::parse(k).ok())
        {
            Some(id) => id,
            None => {
                tracing::warn!(
                    key_len = key.len(),
                    "skipping endpoint record with an invalid key"
                );
                return Decoded::Skip;
            }
        };
        let Some(value) = value else {
            return Decoded::Delete(id);
        };
        if value.len() > MAX_RECORD_BYTES {
            tracing::warn!(endpoint = %id, bytes = value.len(), "skipping oversized endpoint record");
            return Decoded::Skip;
        }
        let record: EndpointRecord = match serde_json::from_slice(value) {
            Ok(r) => r,
            Err(error) => {
                tracing::warn!(endpoint = %id, %error, "skipping malformed endpoint record");
                return Decoded::Skip;
            }
        };
        if record.id != id {
            tracing::warn!(endpoint = %id, body_id = %record.id, "skipping endpoint record whose body names another id");
            return Decoded::Skip;
        }
        match record.open(&self.key) {
            Ok(endpoint) => Decoded::Upsert(Arc::new(endpoint)),
            Err(error) => {
                // Usually the wrong master key: the previous state is kept rather than lost.
                tracing::error!(endpoint = %id, %error, "skipping endpoint record that does not open");
                Decoded::Unopened(id, error.to_string())
            }
        }
    }

    /// Fails when endpoints' latest records do not open with the view's key: the view lacks
    /// them (or holds an older version), and events for them would go undelivered.
    pub fn check_opened(&self) -> Result<(), RegistryError> {
        let state = self.read();
        match state.unopened.iter().next() {
            None => Ok(()),
            Some((first, error)) => Err(RegistryError::Unopened {
                count: state.unopened.len(),
                first: first.clone(),
                error: error.clone(),
            }),
        }
    }

    /// The endpoint with this id, as it applies: its `max_in_flight` and `rate_limit_per_s`
    /// lowered to its tenant's ceilings.
    pub fn get(&self, id: &EndpointId) -> Option<Arc<Endpoint>> {
        self.read().endpoints.get(id).cloned()
    }

    /// The endpoint with this id as it was written (a change starts from this, so that raising
    /// a ceiling later gives the endpoint back what it asked for).
    pub fn written(&self, id: &EndpointId) -> Option<Arc<Endpoint>> {
        self.read().written.get(id).cloned()
    }

    /// How many endpoints `tenant` holds.
    pub fn count(&self, tenant: &Tenant) -> usize {
        self.read()
            .endpoints
            .values()
            .filter(|e| &e.tenant == tenant)
            .count()
    }

    /// The tenant API key with this id (revoked ones included).
    pub fn tenant_key(&self, id: &TenantKeyId) -> Option<Arc<TenantKey>> {
        self.read().tenants.keys.get(id).cloned()
    }

    /// `tenant`'s API keys, revoked ones included, oldest first.
    pub fn tenant_keys(&self, tenant: &Tenant) -> Vec<Arc<TenantKey>> {
        let mut v: Vec<_> = self
            .read()
            .tenants
            .keys
            .values()
            .filter(|k| &k.tenant == tenant)
            .cloned()
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    /// The ceilings that apply to `tenant`: the config's defaults with what an operator set.
    pub fn ceilings(&self, tenant: &Tenant) -> Ceilings {
        self.read().tenants.ceilings(tenant)
    }

    /// The ceilings an operator set for `tenant`, if any.
    pub fn tenant_limits(&self, tenant: &Tenant) -> Option<TenantLimits> {
        self.read().tenants.limits.get(tenant).cloned()
    }

    /// A tenant's endpoints, ordered by id (ids sort by creation).
    pub fn list(&self, tenant: &Tenant) -> Vec<Arc<Endpoint>> {
        let mut v: Vec<_> = self
            .read()
            .endpoints
            .values()
            .filter(|e| &e.tenant == tenant)
            .cloned()
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    /// Every endpoint, ordered by id (for rebuilding the subscription index).
    pub fn all(&self) -> Vec<Arc<Endpoint>> {
        let mut v: Vec<_> = self.read().endpoints.values().cloned().collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    /// How many endpoints the view holds.
    pub fn len(&self) -> usize {
        self.read().endpoints.len()
    }

    /// Whether the view holds no endpoints.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until the view has applied every record below `highs` (partition → offset),
    /// or fails after `timeout`.
    pub async fn wait_for_offsets(
        &self,
        highs: &HashMap<i32, i64>,
        timeout: Duration,
    ) -> Result<(), RegistryError> {
        self.wait_for_ends("the endpoint view to reach the topic's end", highs, timeout)
            .await
    }

    /// Waits until every partition of `ends` has been applied up to (not including) its
    /// offset; on timeout the error says it waited for `what`.
    async fn wait_for_ends(
        &self,
        what: &'static str,
        ends: &HashMap<i32, i64>,
        timeout: Duration,
    ) -> Result<(), RegistryError> {
        self.wait_until(what, timeout, |_, view| {
            let state = view.read();
            ends.iter()
                .all(|(p, end)| state.next_offsets.get(p).is_some_and(|n| n >= end))
        })
        .await
    }

    /// The offset after the last record applied from `partition`.
    pub fn next_offset(&self, partition: i32) -> Option<i64> {
        self.read().next_offsets.get(&partition).copied()
    }

    /// Change notifications: the receiver sees the latest [`ViewStatus`].
    pub fn subscribe(&self) -> watch::Receiver<ViewStatus> {
        self.status.subscribe()
    }

    /// The current status.
    pub fn status(&self) -> ViewStatus {
        *self.status.borrow()
    }

    /// Declares the start-up backlog read (the materialiser calls it).
    pub fn mark_caught_up(&self) {
        self.status
            .send_if_modified(|s| !std::mem::replace(&mut s.caught_up, true));
    }

    /// Waits until the start-up backlog has been read.
    pub async fn wait_caught_up(&self, timeout: Duration) -> Result<(), RegistryError> {
        self.wait_until("the endpoint view to catch up", timeout, |s, _| s.caught_up)
            .await
    }

    /// Waits until the record at (`partition`, `offset`) has been applied.
    pub async fn wait_for_offset(
        &self,
        partition: i32,
        offset: i64,
        timeout: Duration,
    ) -> Result<(), RegistryError> {
        let next = HashMap::from([(partition, offset.saturating_add(1))]);
        self.wait_for_ends("the endpoint view to apply the write", &next, timeout)
            .await
    }

    async fn wait_until(
        &self,
        what: &'static str,
        timeout: Duration,
        done: impl Fn(&ViewStatus, &EndpointView) -> bool,
    ) -> Result<(), RegistryError> {
        let mut rx = self.subscribe();
        let wait = async {
            loop {
                let status = *rx.borrow_and_update();
                if done(&status, self) {
                    return Ok(());
                }
                rx.changed().await.map_err(|_| RegistryError::Closed)?;
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .map_err(|_| RegistryError::Timeout {
                what,
                waited: timeout,
            })?
    }

    /// Refuses a write that does not move the endpoint's version forward.
    fn check_version(&self, endpoint: &Endpoint) -> Result<(), RegistryError> {
        match self.get(&endpoint.id) {
            Some(current) if current.version >= endpoint.version => Err(RegistryError::Conflict {
                id: endpoint.id.clone(),
                current: current.version,
                attempted: endpoint.version,
            }),
            _ => Ok(()),
        }
    }
}

enum Decoded {
    Upsert(Arc<Endpoint>),
    Delete(EndpointId),
    /// Its secrets do not open; why.
    Unopened(EndpointId, String),
    Tenant(TenantRecord),
    Skip,
}

impl State {
    /// Applies a decoded record.
    fn apply(&mut self, parsed: Decoded) -> Applied {
        match parsed {
            Decoded::Upsert(endpoint) => {
                self.unopened.remove(&endpoint.id);
                let applied = self.tenants.applied(&endpoint);
                self.endpoints.insert(endpoint.id.clone(), applied);
                self.written.insert(endpoint.id.clone(), endpoint);
                Applied::Upserted
            }
            Decoded::Delete(id) => {
                self.unopened.remove(&id);
                self.endpoints.remove(&id);
                self.written.remove(&id);
                Applied::Deleted
            }
            Decoded::Unopened(id, error) => {
                self.unopened.insert(id, error);
                Applied::Skipped
            }
            Decoded::Tenant(TenantRecord::Key(key)) => {
                self.tenants.keys.insert(key.id.clone(), key);
                Applied::Upserted
            }
            Decoded::Tenant(TenantRecord::KeyDeleted(id)) => {
                self.tenants.keys.remove(&id);
                Applied::Deleted
            }
            Decoded::Tenant(TenantRecord::Limits(limits)) => {
                let tenant = limits.tenant.clone();
                self.tenants.limits.insert(tenant.clone(), limits);
                self.reapply(&tenant);
                Applied::Upserted
            }
            Decoded::Tenant(TenantRecord::LimitsDeleted(tenant)) => {
                self.tenants.limits.remove(&tenant);
                self.reapply(&tenant);
                Applied::Deleted
            }
            Decoded::Tenant(TenantRecord::Skip) | Decoded::Skip => Applied::Skipped,
        }
    }

    /// Applies `tenant`'s ceilings afresh to each of its endpoints.
    fn reapply(&mut self, tenant: &Tenant) {
        for (id, written) in &self.written {
            if &written.tenant == tenant {
                self.endpoints
                    .insert(id.clone(), self.tenants.applied(written));
            }
        }
    }
}

/// Serialises an endpoint's stored form: secrets sealed under `key`.
pub fn encode(endpoint: &Endpoint, key: &MasterKey) -> Vec<u8> {
    serde_json::to_vec(&endpoint.seal(key)).expect("an endpoint record always serialises")
}

/// Where endpoint writes go. Implemented over Kafka and in memory; object-safe so the admin
/// API can hold an `Arc<dyn EndpointStore>`.
pub trait EndpointStore: Send + Sync {
    /// The view this store's writes become visible in.
    fn view(&self) -> &Arc<EndpointView>;

    /// Writes an endpoint (its `version` must be newer than the view's) and returns it once the
    /// view shows it.
    fn put<'a>(
        &'a self,
        endpoint: &'a Endpoint,
    ) -> BoxFuture<'a, Result<Arc<Endpoint>, RegistryError>>;

    /// Deletes an endpoint (a tombstone) and returns once the view no longer shows it.
    fn delete<'a>(&'a self, id: &'a EndpointId) -> BoxFuture<'a, Result<(), RegistryError>>;

    /// Writes a tenant API key's record (a new key, or one revoked) and returns once the view
    /// shows it.
    fn put_tenant_key<'a>(&'a self, key: &'a TenantKey)
    -> BoxFuture<'a, Result<(), RegistryError>>;

    /// Writes a tenant's ceilings and returns once the view applies them.
    fn put_tenant_limits<'a>(
        &'a self,
        limits: &'a TenantLimits,
    ) -> BoxFuture<'a, Result<(), RegistryError>>;
}

/// A tenant key's record: its key and value, once checked.
pub fn encode_tenant_key(key: &TenantKey) -> Result<(String, Vec<u8>), RegistryError> {
    key.validate()?;
    let value = serde_json::to_vec(key).expect("a tenant key always serialises");
    Ok((tenant::key_record_key(&key.id), value))
}

/// A tenant's ceilings record: its key and value, once checked.
pub fn encode_tenant_limits(limits: &TenantLimits) -> Result<(String, Vec<u8>), RegistryError> {
    limits.validate()?;
    let value = serde_json::to_vec(limits).expect("tenant limits always serialise");
    Ok((tenant::limits_record_key(&limits.tenant), value))
}

/// The in-memory store: writes go straight into the view through the same encode/apply path
/// as Kafka records, so sealing and validation behave identically.
#[derive(Debug)]
pub struct MemoryEndpointStore {
    view: Arc<EndpointView>,
    key: MasterKey,
}

impl MemoryEndpointStore {
    /// A store with an empty, caught-up view and no tenant ceilings.
    pub fn new(key: MasterKey) -> MemoryEndpointStore {
        MemoryEndpointStore::with_tenant_defaults(key, TenantDefaults::default())
    }

    /// A store with an empty, caught-up view whose tenants have `defaults`.
    pub fn with_tenant_defaults(key: MasterKey, defaults: TenantDefaults) -> MemoryEndpointStore {
        let view = Arc::new(EndpointView::new(key.clone()).with_tenant_defaults(defaults));
        view.mark_caught_up();
        view.mark_always_current();
        MemoryEndpointStore { view, key }
    }

    fn put_raw(&self, key: &str, value: &[u8]) -> Result<(), RegistryError> {
        match self.view.apply(key.as_bytes(), Some(value)) {
            Applied::Upserted => Ok(()),
            other => unreachable!("a checked tenant record always applies, got {other:?}"),
        }
    }
}

impl EndpointStore for MemoryEndpointStore {
    fn view(&self) -> &Arc<EndpointView> {
        &self.view
    }

    fn put<'a>(
        &'a self,
        endpoint: &'a Endpoint,
    ) -> BoxFuture<'a, Result<Arc<Endpoint>, RegistryError>> {
        Box::pin(async move {
            endpoint.validate()?;
            self.view.check_version(endpoint)?;
            let bytes = encode(endpoint, &self.key);
            match self
                .view
                .apply(endpoint.id.as_str().as_bytes(), Some(&bytes))
            {
                Applied::Upserted => self.view.get(&endpoint.id).ok_or(RegistryError::Closed),
                other => unreachable!("a validated endpoint always applies, got {other:?}"),
            }
        })
    }

    fn delete<'a>(&'a self, id: &'a EndpointId) -> BoxFuture<'a, Result<(), RegistryError>> {
        Box::pin(async move {
            self.view.apply(id.as_str().as_bytes(), None);
            Ok(())
        })
    }

    fn put_tenant_key<'a>(
        &'a self,
        key: &'a TenantKey,
    ) -> BoxFuture<'a, Result<(), RegistryError>> {
        Box::pin(async move {
            let (k, v) = encode_tenant_key(key)?;
            self.put_raw(&k, &v)
        })
    }

    fn put_tenant_limits<'a>(
        &'a self,
        limits: &'a TenantLimits,
    ) -> BoxFuture<'a, Result<(), RegistryError>> {
        Box::pin(async move {
            let (k, v) = encode_tenant_limits(limits)?;
            self.put_raw(&k, &v)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::{CreateEndpoint, PatchEndpoint};
    use std::time::SystemTime;

    pub(crate) fn endpoint(tenant: &str) -> Endpoint {
        let req: CreateEndpoint = serde_json::from_value(serde_json::json!({
            "tenant": tenant, "url": "https://example.com/hook", "event_types": ["order.*"]
        }))
        .unwrap();
        Endpoint::create(req, SystemTime::now()).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn memory_store_put_get_list_delete() {
        let key = MasterKey::generate();
        let store = MemoryEndpointStore::new(key);
        let view = Arc::clone(store.view());
        let mut rx = view.subscribe();
        let a = endpoint("acme");
        let b = endpoint("acme");
        let c = endpoint("globex");
        for e in [&a, &b, &c] {
            store.put(e).await.unwrap();
        }
        assert!(rx.has_changed().unwrap());
        assert_eq!(rx.borrow_and_update().seq, 3);
        assert_eq!(
            *view.get(&a.id).unwrap(),
            a,
            "secrets survive seal and open"
        );
        let acme: Vec<_> = view
            .list(&Tenant::parse("acme").unwrap())
            .iter()
            .map(|e| e.id.clone())
            .collect();
        assert_eq!(acme, vec![a.id.clone(), b.id.clone()]);
        // A stale version is refused; a bumped one is accepted.
        assert!(matches!(
            store.put(&a).await,
            Err(RegistryError::Conflict { current: 1, .. })
        ));
        let mut a2 = a.clone();
        a2.apply_patch(
            PatchEndpoint {
                enabled: Some(false),
                ..Default::default()
            },
            SystemTime::now(),
        )
        .unwrap();
        assert_eq!(store.put(&a2).await.unwrap().version, 2);
        store.delete(&a.id).await.unwrap();
        assert!(view.get(&a.id).is_none());
        assert_eq!(view.len(), 2);
    }

    #[test]
    fn malformed_records_and_tombstones() {
        let key = MasterKey::generate();
        let view = EndpointView::new(key.clone());
        let e = endpoint("acme");
        let id = e.id.as_str().as_bytes();
        assert_eq!(
            view.apply_at(0, 0, id, Some(&encode(&e, &key))),
            Applied::Upserted
        );
        assert_eq!(
            view.apply_at(0, 1, id, Some(b"{not json")),
            Applied::Skipped
        );
        assert_eq!(view.apply_at(0, 2, b"", Some(b"{}")), Applied::Skipped);
        assert_eq!(view.apply_at(0, 3, &[0xff, 0xfe], None), Applied::Skipped);
        // Body naming another id.
        assert_eq!(
            view.apply_at(0, 4, b"ep_other", Some(&encode(&e, &key))),
            Applied::Skipped
        );
        // Sealed under another key: skipped, the previous state kept.
        let foreign = encode(&e, &MasterKey::generate());
        assert_eq!(view.apply_at(0, 5, id, Some(&foreign)), Applied::Skipped);
        assert_eq!(*view.get(&e.id).unwrap(), e);
        assert_eq!(view.next_offset(0), Some(6));
        assert_eq!(view.apply_at(0, 6, id, None), Applied::Deleted);
        assert!(view.get(&e.id).is_none());
        assert_eq!(
            view.apply_at(0, 7, id, None),
            Applied::Deleted,
            "tombstone for nothing"
        );
        assert_eq!(view.status().seq, 8);
    }

    #[test]
    fn records_that_do_not_open_are_reported_until_replaced() {
        let key = MasterKey::generate();
        let view = EndpointView::new(key.clone());
        let (a, b) = (endpoint("acme"), endpoint("acme"));
        let other = MasterKey::generate();
        view.apply(a.id.as_str().as_bytes(), Some(&encode(&a, &other)));
        view.apply(b.id.as_str().as_bytes(), Some(&encode(&b, &other)));
        assert!(view.is_empty(), "nothing opened");
        let err = view.check_opened().unwrap_err().to_string();
        assert!(
            err.starts_with("2 endpoint record(s) do not open with security.master_key"),
            "{err}"
        );
        assert!(err.contains("does not open with this key"), "{err}");
        // A later record that opens, or a tombstone, settles each.
        view.apply(a.id.as_str().as_bytes(), Some(&encode(&a, &key)));
        assert!(
            view.check_opened()
                .unwrap_err()
                .to_string()
                .starts_with("1 endpoint")
        );
        view.apply(b.id.as_str().as_bytes(), None);
        assert!(view.check_opened().is_ok());
        assert_eq!(view.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_view_is_confirmed_only_as_of_a_time_and_only_once_it_reached_the_end() {
        let key = MasterKey::generate();
        let view = Arc::new(EndpointView::new(key.clone()));
        let before = SystemTime::now();
        assert!(!view.holds_writes_before(before), "never confirmed");

        // Waiting for the topic's end: partition 0 up to 2, partition 1 up to 1.
        let e = endpoint("acme");
        let bytes = encode(&e, &key);
        let highs = HashMap::from([(0, 2), (1, 1)]);
        let waiter = {
            let (view, highs) = (Arc::clone(&view), highs.clone());
            tokio::spawn(async move { view.wait_for_offsets(&highs, Duration::from_secs(5)).await })
        };
        view.apply_at(0, 1, e.id.as_str().as_bytes(), Some(&bytes));
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "partition 1 not read yet");
        view.apply_at(1, 0, e.id.as_str().as_bytes(), None);
        waiter.await.unwrap().unwrap();
        let err = view
            .wait_for_offsets(&HashMap::from([(0, 3)]), Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(matches!(err, RegistryError::Timeout { .. }), "{err}");

        let asked_at = SystemTime::now();
        view.confirm_as_of(asked_at);
        assert!(view.holds_writes_before(asked_at - Duration::from_millis(1)));
        assert!(!view.holds_writes_before(asked_at), "only what came before");
        // An older confirmation finishing late does not move it back.
        view.confirm_as_of(before);
        assert!(view.holds_writes_before(asked_at - Duration::from_millis(1)));

        let memory = MemoryEndpointStore::new(key);
        assert!(
            memory
                .view()
                .holds_writes_before(SystemTime::now() + Duration::from_secs(3600)),
            "a view written directly is always current"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn tenant_keys_and_ceilings_are_materialised_beside_endpoints() {
        use crate::tenant::{Ceilings, Scope, TenantDefaults};
        let key = MasterKey::generate();
        let defaults = TenantDefaults {
            ceilings: Ceilings {
                max_endpoints: Some(10),
                max_in_flight: Some(8),
                rate_limit_per_s: None,
            },
            default_max_in_flight: 16,
        };
        let store = MemoryEndpointStore::with_tenant_defaults(key, defaults);
        let view = Arc::clone(store.view());
        let acme = Tenant::parse("acme").unwrap();
        let mut e = endpoint("acme");
        e.max_in_flight = Some(32);
        store.put(&e).await.unwrap();
        assert_eq!(
            view.get(&e.id).unwrap().max_in_flight,
            Some(8),
            "the default ceiling"
        );
        assert_eq!(view.written(&e.id).unwrap().max_in_flight, Some(32));
        assert_eq!(view.count(&acme), 1);

        let (k, secret) =
            TenantKey::issue(acme.clone(), Scope::Read, None, SystemTime::now()).unwrap();
        store.put_tenant_key(&k).await.unwrap();
        assert!(view.tenant_key(&k.id).unwrap().accepts(secret.expose()));
        assert_eq!(view.tenant_keys(&acme).len(), 1);
        assert!(
            view.tenant_keys(&Tenant::parse("globex").unwrap())
                .is_empty()
        );
        assert_eq!(view.len(), 1, "a key is not an endpoint");

        let set = TenantLimits {
            tenant: acme.clone(),
            max_endpoints: None,
            max_in_flight: Some(None),
            rate_limit_per_s: Some(Some(2.0)),
            updated_at: SystemTime::now(),
        };
        store.put_tenant_limits(&set).await.unwrap();
        let applied = view.get(&e.id).unwrap();
        assert_eq!(
            (applied.max_in_flight, applied.rate_limit_per_s),
            (Some(32), Some(2.0))
        );
        assert_eq!(
            view.ceilings(&acme).max_endpoints,
            Some(10),
            "left to the default"
        );
        assert_eq!(view.tenant_limits(&acme), Some(set.clone()));
        let bad = TenantLimits {
            max_in_flight: Some(Some(0)),
            ..set
        };
        assert!(matches!(
            store.put_tenant_limits(&bad).await,
            Err(RegistryError::Tenant(_))
        ));

        // Tombstones remove them; malformed records and mismatched keys are skipped.
        let limits_key = tenant::limits_record_key(&acme);
        assert_eq!(view.apply(limits_key.as_bytes(), None), Applied::Deleted);
        assert_eq!(view.get(&e.id).unwrap().max_in_flight, Some(8));
        let key_key = tenant::key_record_key(&k.id);
        let other = TenantKey::issue(acme.clone(), Scope::Write, None, SystemTime::now())
            .unwrap()
            .0;
        let value = serde_json::to_vec(&other).unwrap();
        assert_eq!(
            view.apply(key_key.as_bytes(), Some(&value)),
            Applied::Skipped
        );
        assert_eq!(view.apply(key_key.as_bytes(), Some(b"{")), Applied::Skipped);
        assert_eq!(view.apply(b"tenant-key:nope", None), Applied::Skipped);
        assert_eq!(view.apply(b"tenant-limits:", Some(b"{}")), Applied::Skipped);
        assert!(view.tenant_key(&k.id).is_some(), "the previous record kept");
        assert_eq!(view.apply(key_key.as_bytes(), None), Applied::Deleted);
        assert!(view.tenant_key(&k.id).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn waits_release_on_apply_and_time_out_otherwise() {
        let key = MasterKey::generate();
        let view = Arc::new(EndpointView::new(key.clone()));
        let err = view
            .wait_for_offset(3, 10, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(err, RegistryError::Timeout { .. }), "{err}");
        assert!(view.wait_caught_up(Duration::from_secs(1)).await.is_err());

        let e = endpoint("acme");
        let bytes = encode(&e, &key);
        let waiter = {
            let view = Arc::clone(&view);
            tokio::spawn(async move { view.wait_for_offset(3, 10, Duration::from_secs(5)).await })
        };
        tokio::task::yield_now().await;
        view.apply_at(3, 9, e.id.as_str().as_bytes(), Some(&bytes));
        tokio::task::yield_now().await;
        assert!(
            !waiter.is_finished(),
            "offset 9 does not satisfy a wait for 10"
        );
        view.apply_at(3, 10, e.id.as_str().as_bytes(), Some(&bytes));
        waiter.await.unwrap().unwrap();

        view.mark_caught_up();
        view.wait_caught_up(Duration::from_secs(1)).await.unwrap();
    }
}
