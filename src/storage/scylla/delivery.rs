//! Reading a delivery: its attempts, and its state, derived from them.
//!
//! A delivery's state is not written at all: it is derived, on read, from the delivery's
//! attempt rows (one partition, oldest first). Their count is the attempt count, the first row
//! the first attempt, and the last row, the latest-started attempt, sets the status. So a
//! duplicate of an attempt (same start and number) is stored once and an older attempt logged
//! late cannot overwrite a newer status, whatever order attempts are logged in; and the state
//! follows what the attempt log still holds as rows expire.

use futures::{StreamExt, TryStreamExt};
use scylla::DeserializeRow;
use scylla::value::CqlTimestamp;

use super::error::{backend_error, corrupt, pager_error, row_error};
use super::row::{self, from_cql, status_from_col};
use super::{MAX_ATTEMPTS_READ, MAX_EVENT_DELIVERIES, ScyllaStore};
use crate::attempt::ErrorClass;
use crate::id::{DeliveryId, EndpointId, EventId, Tenant};
use crate::storage::state::{Derivation, Entry, Identity};
use crate::storage::{AttemptRow, DeliveryState, RecordPosition, StoreError};

/// Point reads in flight for one history page or event listing.
pub(super) const READ_FAN_OUT: usize = 16;

/// The columns of an attempt row.
#[derive(DeserializeRow)]
struct AttemptCols {
    delivery_id: String,
    started_at: CqlTimestamp,
    attempt: i32,
    event_id: Option<String>,
    endpoint_id: Option<String>,
    tenant: Option<String>,
    event_type: Option<String>,
    status: Option<i32>,
    latency_ms: Option<i64>,
    error_class: Option<String>,
    response_body: Option<Vec<u8>>,
    signing_key_ids: Option<Vec<String>>,
    replay_id: Option<String>,
    outcome: Option<String>,
    next_attempt_at: Option<CqlTimestamp>,
    dead_reason: Option<String>,
    record_partition: Option<i32>,
    record_offset: Option<i64>,
}

/// The columns of an attempt row that delivery state is derived from (no body).

#[derive(DeserializeRow)]
struct StateCols {
    delivery_id: String,
    started_at: CqlTimestamp,
    attempt: i32,
    event_id: Option<String>,
    endpoint_id: Option<String>,
    tenant: Option<String>,
    event_type: Option<String>,
    status: Option<i32>,
    error_class: Option<String>,
    outcome: Option<String>,
    next_attempt_at: Option<CqlTimestamp>,
    dead_reason: Option<String>,
}

impl ScyllaStore {
    /// A delivery's state, derived from its attempt rows: the count of rows is the attempt
    /// count, the first row (clustering order) the first attempt, the last row the
    /// latest-started attempt, which sets the status. `None` when no row is left (never logged,
    /// or every row expired).
    pub(super) async fn read_state(&self, id: &str) -> Result<Option<DeliveryState>, StoreError> {
        let _permit = self.permit().await?;
        let mut rows = self
            .session
            .execute_iter(self.st.attempt.select_state.clone(), (id,))
            .await
            .map_err(pager_error)?
            .rows_stream::<StateCols>()
            .map_err(backend_error)?;
        let mut fold: Option<Derivation> = None;
        let mut count = 0usize;
        while let Some(cols) = rows.next().await {
            let (identity, entry) = entry_from_cols(cols.map_err(row_error)?)?;
            match &mut fold {
                Some(f) => f.add(entry),
                None => fold = Some(Derivation::new(identity, entry)),
            }
            count += 1;
            if count == MAX_ATTEMPTS_READ {
                break;
            }
        }
        Ok(fold.map(|f| f.state()))
    }

    /// A delivery's attempts, oldest first, at most [`MAX_ATTEMPTS_READ`].
    pub(super) async fn read_attempts(
        &self,
        id: &DeliveryId,
    ) -> Result<Vec<AttemptRow>, StoreError> {
        let _permit = self.permit().await?;
        let mut stream = self
            .session
            .execute_iter(self.st.attempt.select_attempts.clone(), (id.as_str(),))
            .await
            .map_err(pager_error)?
            .rows_stream::<AttemptCols>()
            .map_err(backend_error)?;
        let mut rows = Vec::new();
        while let Some(cols) = stream.next().await {
            rows.push(attempt_from_cols(cols.map_err(row_error)?)?);
            if rows.len() == MAX_ATTEMPTS_READ {
                break;
            }
        }
        Ok(rows)
    }

    /// The states of an event's deliveries, at most [`MAX_EVENT_DELIVERIES`].
    pub(super) async fn read_event_deliveries(
        &self,
        event: &EventId,
    ) -> Result<Vec<DeliveryState>, StoreError> {
        let ids: Vec<String> = {
            let _permit = self.permit().await?;
            let mut stream = self
                .session
                .execute_iter(self.st.attempt.select_by_event.clone(), (event.as_str(),))
                .await
                .map_err(pager_error)?
                .rows_stream::<(String,)>()
                .map_err(backend_error)?;
            let mut ids = Vec::new();
            while let Some(row) = stream.next().await {
                ids.push(row.map_err(row_error)?.0);
                if ids.len() == MAX_EVENT_DELIVERIES {
                    break;
                }
            }
            ids
        };
        let states: Vec<Option<DeliveryState>> = futures::stream::iter(ids)
            .map(|id| async move { self.read_state(&id).await })
            .buffered(READ_FAN_OUT)
            .try_collect()
            .await?;
        Ok(states
            .into_iter()
            .flatten()
            .filter(|s| &s.event_id == event)
            .collect())
    }
}

/// A row of a delivery's log as an entry of its state, with the delivery it names.
fn entry_from_cols(c: StateCols) -> Result<(Identity, Entry), StoreError> {
    let row = attempt_from_cols(AttemptCols {
        delivery_id: c.delivery_id,
        started_at: c.started_at,
        attempt: c.attempt,
        event_id: c.event_id,
        endpoint_id: c.endpoint_id,
        tenant: c.tenant,
        event_type: c.event_type,
        status: c.status,
        latency_ms: None,
        error_class: c.error_class,
        response_body: None,
        signing_key_ids: None,
        replay_id: None,
        outcome: c.outcome,
        next_attempt_at: c.next_attempt_at,
        dead_reason: c.dead_reason,
        record_partition: None,
        record_offset: None,
    })?;
    Ok((Identity::of_attempt(&row), Entry::attempt(&row)))
}

/// An attempt row as the store's type; a row missing a column it needs is corrupt.
fn attempt_from_cols(c: AttemptCols) -> Result<AttemptRow, StoreError> {
    let bad = || corrupt("attempt", &c.delivery_id);
    let error_class = c
        .error_class
        .as_deref()
        .map(|s| ErrorClass::parse(s).ok_or_else(bad))
        .transpose()?;
    let outcome = row::outcome_from_columns(
        c.outcome.as_deref().ok_or_else(bad)?,
        c.next_attempt_at,
        c.dead_reason.as_deref(),
    )
    .ok_or_else(bad)?;
    Ok(AttemptRow {
        delivery_id: DeliveryId::parse(c.delivery_id.as_str()).map_err(|_| bad())?,
        event_id: EventId::parse(c.event_id.clone().ok_or_else(bad)?).map_err(|_| bad())?,
        endpoint_id: EndpointId::parse(c.endpoint_id.clone().ok_or_else(bad)?)
            .map_err(|_| bad())?,
        tenant: Tenant::parse(c.tenant.clone().ok_or_else(bad)?).map_err(|_| bad())?,
        event_type: c.event_type.clone().ok_or_else(bad)?,
        attempt: u32::try_from(c.attempt).map_err(|_| bad())?,
        started_at: from_cql(c.started_at),
        status: status_from_col(c.status),
        latency_ms: c
            .latency_ms
            .and_then(|l| u32::try_from(l).ok())
            .unwrap_or(0),
        error_class,
        response_body: c.response_body.unwrap_or_default(),
        // CQL stores an empty list as null.
        signing_key_ids: c.signing_key_ids.unwrap_or_default(),
        replay_id: c.replay_id,
        outcome,
        record: c
            .record_partition
            .zip(c.record_offset)
            .map(|(partition, offset)| RecordPosition { partition, offset }),
        request_headers: vec![],
    })
}
