//! A [`MemoryStore`] with hooks on the calls a unit test needs to stall, fail or line up, for
//! the tests of the stages that use a store.

use async_trait::async_trait;

use super::memory::MemoryStore;
use super::{
    AttemptRow, DeliveryNote, DeliveryState, DeliveryStore, EventQuery, EventRow, HistoryQuery,
    Page, ReplayAudit, ReplayMark, StoreError,
};
use crate::id::{DeliveryId, EndpointId, EventId, Tenant};

/// What a test does around a [`Hooked`] store's calls; each does nothing unless overridden.
#[async_trait]
pub trait Hooks: Send + Sync + 'static {
    /// Runs before an attempt is logged.
    async fn before_record_attempt(&self, _row: &AttemptRow) {}
    /// Runs before a note is recorded; an error is the store's answer instead.
    async fn before_record_note(&self, _note: &DeliveryNote) -> Result<(), StoreError> {
        Ok(())
    }
    /// Runs before an event is recorded; an error is the store's answer instead.
    async fn before_record_event(&self, _event: &EventRow) -> Result<(), StoreError> {
        Ok(())
    }
    /// Runs after a replay claim was read, before it is returned.
    async fn after_replay_claim_read(&self) {}
    /// Runs before a replay claims a delivery; an error is the store's answer instead.
    async fn before_claim_replay(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// A memory store whose calls run `hooks`.
pub struct Hooked<H> {
    /// The store the calls go to.
    pub inner: MemoryStore,
    /// What runs around them.
    pub hooks: H,
}

impl<H> Hooked<H> {
    /// `hooks` around a memory store of `capacity` deliveries.
    pub fn new(hooks: H, capacity: usize) -> Hooked<H> {
        Hooked {
            inner: MemoryStore::with_capacity(capacity),
            hooks,
        }
    }
}

#[async_trait]
impl<H: Hooks> DeliveryStore for Hooked<H> {
    async fn record_attempt(&self, row: &AttemptRow) -> Result<(), StoreError> {
        self.hooks.before_record_attempt(row).await;
        self.inner.record_attempt(row).await
    }
    async fn record_note(&self, note: &DeliveryNote) -> Result<(), StoreError> {
        self.hooks.before_record_note(note).await?;
        self.inner.record_note(note).await
    }
    async fn record_event(&self, event: &EventRow) -> Result<(), StoreError> {
        self.hooks.before_record_event(event).await?;
        self.inner.record_event(event).await
    }
    async fn event(&self, tenant: &Tenant, id: &EventId) -> Result<Option<EventRow>, StoreError> {
        self.inner.event(tenant, id).await
    }
    async fn events(
        &self,
        tenant: &Tenant,
        query: &EventQuery,
    ) -> Result<Page<EventRow>, StoreError> {
        self.inner.events(tenant, query).await
    }
    async fn delivery(&self, id: &DeliveryId) -> Result<Option<DeliveryState>, StoreError> {
        self.inner.delivery(id).await
    }
    async fn attempts(&self, id: &DeliveryId) -> Result<Vec<AttemptRow>, StoreError> {
        self.inner.attempts(id).await
    }
    async fn endpoint_deliveries(
        &self,
        endpoint: &EndpointId,
        query: &HistoryQuery,
    ) -> Result<Page<DeliveryState>, StoreError> {
        self.inner.endpoint_deliveries(endpoint, query).await
    }
    async fn event_deliveries(&self, event: &EventId) -> Result<Vec<DeliveryState>, StoreError> {
        self.inner.event_deliveries(event).await
    }
    async fn record_replay(&self, audit: &ReplayAudit) -> Result<(), StoreError> {
        self.inner.record_replay(audit).await
    }
    async fn replays(
        &self,
        tenant: Option<&Tenant>,
        limit: u32,
    ) -> Result<Vec<ReplayAudit>, StoreError> {
        self.inner.replays(tenant, limit).await
    }
    async fn record_replay_mark(&self, mark: &ReplayMark) -> Result<(), StoreError> {
        self.inner.record_replay_mark(mark).await
    }
    async fn replay_mark(&self, id: &DeliveryId) -> Result<Option<ReplayMark>, StoreError> {
        self.inner.replay_mark(id).await
    }
    async fn replay_claim(&self, id: &DeliveryId) -> Result<Option<ReplayMark>, StoreError> {
        let claim = self.inner.replay_claim(id).await;
        self.hooks.after_replay_claim_read().await;
        claim
    }
    async fn claim_replay(
        &self,
        claim: &ReplayMark,
        over: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.hooks.before_claim_replay().await?;
        self.inner.claim_replay(claim, over).await
    }
}
