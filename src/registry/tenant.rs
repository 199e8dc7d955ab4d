//! The tenant records that share the endpoints topic with endpoints: API keys
//! (`tenant-key:<tk_...>`) and ceilings (`tenant-limits:<tenant>`). They ride the same compacted
//! topic so that every instance's view holds them, and a revocation or a lowered ceiling
//! reaches every instance as fast as an endpoint change does. Their keys cannot be endpoint
//! ids (those are `ep_` and hex), and an older instance skips them as records whose body
//! names another id.
//!
//! [`TenantState`] is the view's part for them: keys by id, ceilings by tenant, and the
//! config's defaults; it also says how an endpoint applies under its tenant's ceilings.

use std::collections::HashMap;
use std::sync::Arc;

use crate::endpoint::Endpoint;
use crate::id::Tenant;
use crate::tenant::{Ceilings, TenantDefaults, TenantKey, TenantKeyId, TenantLimits, effective};

/// Record key prefix of a tenant API key.
pub const KEY_RECORD_PREFIX: &str = "tenant-key:";
/// Record key prefix of a tenant's ceilings.
pub const LIMITS_RECORD_PREFIX: &str = "tenant-limits:";

/// The record key of API key `id`.
pub fn key_record_key(id: &TenantKeyId) -> String {
    format!("{KEY_RECORD_PREFIX}{id}")
}

/// The record key of `tenant`'s ceilings.
pub fn limits_record_key(tenant: &Tenant) -> String {
    format!("{LIMITS_RECORD_PREFIX}{tenant}")
}

/// A tenant record, decoded.
pub(super) enum TenantRecord {
    Key(Arc<TenantKey>),
    KeyDeleted(TenantKeyId),
    Limits(TenantLimits),
    LimitsDeleted(Tenant),
    /// Malformed (already logged).
    Skip,
}

/// Decodes the record under `key` when it is a tenant record; `None` when it is not one.
pub(super) fn decode(key: &str, value: Option<&[u8]>) -> Option<TenantRecord> {
    if let Some(raw) = key.strip_prefix(KEY_RECORD_PREFIX) {
        let Some(id) = TenantKeyId::parse(raw) else {
            tracing::warn!(
                key_len = key.len(),
                "skipping tenant key record with an invalid key"
            );
            return Some(TenantRecord::Skip);
        };
        let Some(value) = value else {
            return Some(TenantRecord::KeyDeleted(id));
        };
        return Some(match serde_json::from_slice::<TenantKey>(value) {
            Ok(k) if k.id == id && k.validate().is_ok() => TenantRecord::Key(Arc::new(k)),
            Ok(_) => {
                tracing::warn!(key_id = %id, "skipping tenant key record whose body does not match its key");
                TenantRecord::Skip
            }
            Err(error) => {
                tracing::warn!(key_id = %id, %error, "skipping malformed tenant key record");
                TenantRecord::Skip
            }
        });
    }
    let raw = key.strip_prefix(LIMITS_RECORD_PREFIX)?;
    let Ok(tenant) = Tenant::parse(raw) else {
        tracing::warn!(
            key_len = key.len(),
            "skipping tenant limits record with an invalid key"
        );
        return Some(TenantRecord::Skip);
    };
    let Some(value) = value else {
        return Some(TenantRecord::LimitsDeleted(tenant));
    };
    Some(match serde_json::from_slice::<TenantLimits>(value) {
        Ok(l) if l.tenant == tenant && l.validate().is_ok() => TenantRecord::Limits(l),
        Ok(_) => {
            tracing::warn!(%tenant, "skipping tenant limits record whose body does not match its key");
            TenantRecord::Skip
        }
        Err(error) => {
            tracing::warn!(%tenant, %error, "skipping malformed tenant limits record");
            TenantRecord::Skip
        }
    })
}

/// The view's tenant records.
#[derive(Default)]
pub(super) struct TenantState {
    pub(super) keys: HashMap<TenantKeyId, Arc<TenantKey>>,
    pub(super) limits: HashMap<Tenant, TenantLimits>,
    pub(super) defaults: TenantDefaults,
}

impl TenantState {
    /// `tenant`'s ceilings: the defaults with what an operator set.
    pub(super) fn ceilings(&self, tenant: &Tenant) -> Ceilings {
        self.defaults
            .ceilings
            .overridden_by(self.limits.get(tenant))
    }

    /// `endpoint` as it applies under its tenant's ceilings: the same `Arc` when nothing is
    /// lowered.
    pub(super) fn applied(&self, endpoint: &Arc<Endpoint>) -> Arc<Endpoint> {
        let ceilings = self.ceilings(&endpoint.tenant);
        match effective(endpoint, &ceilings, self.defaults.default_max_in_flight) {
            Some(lowered) => Arc::new(lowered),
            None => Arc::clone(endpoint),
        }
    }
}
