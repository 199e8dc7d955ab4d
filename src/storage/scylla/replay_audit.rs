//! Replay audit: each replay's row by id, and its rows in the feeds that list recent replays,
//! newest first: one feed of every replay, and one per tenant the replay names.

use scylla::value::CqlTimestamp;
use scylla::{DeserializeRow, SerializeRow};

use super::error::{backend_error, exec_error};
use super::row::{from_cql, to_cql};
use super::{MAX_REPLAYS_READ, ScyllaStore};
use crate::id::Tenant;
use crate::storage::{ReplayAudit, StoreError};

/// The partition of `recent_replays` that lists every replay.
const REPLAY_FEED: &str = "all";

/// The partition of `recent_replays` that holds the replays naming `tenant`, besides
/// [`REPLAY_FEED`]; the prefix keeps every tenant's apart from that one.
fn tenant_feed(tenant: &Tenant) -> String {
    format!("tenant:{tenant}")
}

/// A `replay_audit` row.
#[derive(SerializeRow)]
struct ReplayValues<'a> {
    replay_id: &'a str,
    actor: &'a str,
    reason: &'a str,
    at: CqlTimestamp,
    scope: &'a str,
    count: i64,
    dry_run: bool,
    tenant: Option<&'a str>,
    asked_by: Option<&'a str>,
    ttl: i32,
}

/// A replay's row in one partition of `recent_replays`: its `replay_audit` row's values.
#[derive(SerializeRow)]
struct RecentReplayValues<'a> {
    feed: &'a str,
    #[scylla(flatten)]
    audit: &'a ReplayValues<'a>,
}

/// A `recent_replays` row as read.
#[derive(DeserializeRow)]
struct ReplayCols {
    replay_id: String,
    actor: Option<String>,
    reason: Option<String>,
    at: CqlTimestamp,
    scope: Option<String>,
    count: Option<i64>,
    dry_run: Option<bool>,
    tenant: Option<String>,
    asked_by: Option<String>,
}

impl ScyllaStore {
    /// Writes `audit` by id and into its feeds.
    pub(super) async fn log_replay(&self, audit: &ReplayAudit) -> Result<(), StoreError> {
        let values = ReplayValues {
            replay_id: &audit.replay_id,
            actor: &audit.actor,
            reason: &audit.reason,
            at: to_cql(audit.at),
            scope: &audit.scope,
            count: i64::try_from(audit.count).unwrap_or(i64::MAX),
            dry_run: audit.dry_run,
            tenant: audit.tenant.as_ref().map(Tenant::as_str),
            asked_by: audit.asked_by.as_deref(),
            ttl: self.audit_ttl,
        };
        let by_id = self.write(&self.st.replay.insert_replay, &values);
        let in_feed = |feed| {
            self.write(
                &self.st.replay.insert_recent_replay,
                RecentReplayValues {
                    feed,
                    audit: &values,
                },
            )
        };
        let own = audit.tenant.as_ref().map(tenant_feed);
        let tenants = async {
            match &own {
                Some(feed) => in_feed(feed).await,
                None => Ok(()),
            }
        };
        tokio::try_join!(by_id, in_feed(REPLAY_FEED), tenants)?;
        Ok(())
    }

    /// The newest replays, at most `limit` (and [`MAX_REPLAYS_READ`]): all of them, or those
    /// naming `tenant`.
    pub(super) async fn read_replays(
        &self,
        tenant: Option<&Tenant>,
        limit: u32,
    ) -> Result<Vec<ReplayAudit>, StoreError> {
        if limit == 0 {
            return Ok(vec![]);
        }
        let limit = i32::try_from(limit.min(MAX_REPLAYS_READ)).unwrap_or(1);
        let feed = tenant.map_or_else(|| REPLAY_FEED.to_owned(), tenant_feed);
        let _permit = self.permit().await?;
        let result = self
            .session
            .execute_unpaged(
                &self.st.replay.select_recent_replays,
                (feed.as_str(), limit),
            )
            .await
            .map_err(exec_error)?;
        let rows = result.into_rows_result().map_err(backend_error)?;
        let mut out = Vec::new();
        for r in rows.rows::<ReplayCols>().map_err(backend_error)? {
            let r = r.map_err(backend_error)?;
            out.push(ReplayAudit {
                replay_id: r.replay_id,
                actor: r.actor.unwrap_or_default(),
                reason: r.reason.unwrap_or_default(),
                at: from_cql(r.at),
                scope: r.scope.unwrap_or_default(),
                count: r.count.and_then(|c| u64::try_from(c).ok()).unwrap_or(0),
                dry_run: r.dry_run.unwrap_or(false),
                // Written from a checked tenant; rows written before the column existed have none.
                tenant: r.tenant.and_then(|t| Tenant::parse(t).ok()),
                asked_by: r.asked_by,
            });
        }
        Ok(out)
    }
}
