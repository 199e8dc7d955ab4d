//! A replay's id and its audit entry: who replayed what, why, and how many.

use crate::storage::{DeliveryStore, ReplayAudit, StoreError};

/// A fresh replay id (`rpl_` + UUIDv7).
pub fn new_replay_id() -> String {
    format!("rpl_{}", uuid::Uuid::now_v7().simple())
}

/// Records a replay's audit entry in `store`, and logs it once recorded.
pub(super) async fn record_audit(
    store: &dyn DeliveryStore,
    audit: &ReplayAudit,
) -> Result<(), StoreError> {
    store.record_replay(audit).await?;
    tracing::info!(replay_id = %audit.replay_id, actor = %audit.actor,
        reason = %audit.reason, scope = %audit.scope, count = audit.count,
        dry_run = audit.dry_run, "replay recorded");
    Ok(())
}
