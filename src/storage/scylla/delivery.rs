//! Reading a delivery: its attempts, and its state, derived from its log.
//!
//! A delivery's state is not written at all: it is derived, on read, from the rows of the
//! delivery's log (one partition: its attempts and notes) and its creation (the row of its
//! event that names its endpoint) by the fold both stores share
//! ([`state`](crate::storage::state)). So a duplicate of a row (same time and number) is
//! stored once, and a row written late cannot overwrite a newer status, whatever order rows
//! are written in; and the state follows what the log still holds as rows expire.

use std::collections::BTreeSet;

use futures::{StreamExt, TryStreamExt};
use scylla::DeserializeRow;
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlTimestamp;

use super::error::{backend_error, corrupt, pager_error, row_error};
use super::note::{DEAD, PARKED};
use super::row::{self, from_cql, status_from_col};
use super::{MAX_ATTEMPTS_READ, MAX_EVENT_DELIVERIES, ScyllaStore};
use crate::attempt::ErrorClass;
use crate::dead_reason::DeadReason;
use crate::id::{DeliveryId, EndpointId, EventId, Tenant};
use crate::park_reason::ParkReason;
use crate::storage::NoteKind;
use crate::storage::state::{Derivation, Entry, EntryKind, Identity};
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
    request_headers: Option<Vec<(String, String)>>,
    /// Set on note rows, which are not attempts.
    note: Option<String>,
}

/// The columns of an `events` row read to find a delivery's creation.
#[derive(DeserializeRow)]
struct KeyCols {
    event_id: String,
    tenant: String,
    endpoint_id: String,
    event_type: Option<String>,
    received_at: Option<CqlTimestamp>,
    /// The endpoints the event went to (its own row, since version 8).
    endpoints: Option<Vec<String>>,
}

/// The columns of a log row that delivery state is derived from (no body).
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
    note: Option<String>,
    park_reason: Option<String>,
}

impl ScyllaStore {
    /// A delivery's state, derived from the rows of its log (at most [`MAX_ATTEMPTS_READ`]);
    /// `None` when no row is left (never written, or every row expired).
    pub(super) async fn read_state(&self, id: &str) -> Result<Option<DeliveryState>, StoreError> {
        let (created, log) = tokio::try_join!(self.read_creation(id), self.read_log(id))?;
        Ok(with_creation(log, created).map(|f| f.state()))
    }

    /// The state of the delivery `created` records, from its log and that creation.
    async fn read_created_state(
        &self,
        created: (Identity, Entry),
    ) -> Result<Option<DeliveryState>, StoreError> {
        let log = self.read_log(created.0.delivery_id.as_str()).await?;
        Ok(with_creation(log, Some(created)).map(|f| f.state()))
    }

    /// The creation of delivery `id`, from the row of its event that names its endpoint (found
    /// under the event key its id begins with), as an entry at the event's `received_at`.
    /// `None` when the id has no key or no event under it names the delivery.
    async fn read_creation(&self, id: &str) -> Result<Option<(Identity, Entry)>, StoreError> {
        let Some(key) = DeliveryId::parse(id).ok().and_then(|d| d.event_key()) else {
            return Ok(None);
        };
        let rows: Vec<KeyCols> = self
            .read_ids(&self.st.event.select_key_rows, (key,))
            .await?;
        Ok(creations(&rows, id, |_, delivery| delivery.as_str() == id)?
            .into_iter()
            .next())
    }

    /// The derivation of a delivery's state from the rows of its log (at most
    /// [`MAX_ATTEMPTS_READ`]), `None` without any.
    async fn read_log(&self, id: &str) -> Result<Option<Derivation>, StoreError> {
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
        Ok(fold)
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
        let mut read = 0usize;
        while let Some(cols) = stream.next().await {
            let cols = cols.map_err(row_error)?;
            read += 1;
            if cols.note.is_none() {
                rows.push(attempt_from_cols(cols)?);
            }
            if read == MAX_ATTEMPTS_READ {
                break;
            }
        }
        Ok(rows)
    }

    /// The states of an event's deliveries (every tenant's), at most
    /// [`MAX_EVENT_DELIVERIES`], by delivery id: those its `events` partition lists, and those
    /// the `deliveries_by_event` rows of attempts logged before version 7 list.
    pub(super) async fn read_event_deliveries(
        &self,
        event: &EventId,
    ) -> Result<Vec<DeliveryState>, StoreError> {
        let (rows, legacy) = tokio::try_join!(
            self.read_ids::<KeyCols>(&self.st.event.select_key_rows, (event.key(),)),
            self.read_ids::<(String,)>(&self.st.attempt.select_by_event, (event.as_str(),)),
        )?;
        // The deliveries the event's partition lists carry their creation from the rows just
        // read; those only the legacy index lists are read whole.
        let listed = creations(&rows, event.as_str(), |e, _| e == event)?;
        let listed_ids: BTreeSet<String> = listed
            .iter()
            .map(|(identity, _)| identity.delivery_id.as_str().to_owned())
            .collect();
        let legacy: BTreeSet<String> = legacy
            .into_iter()
            .map(|(id,)| id)
            .filter(|id| !listed_ids.contains(id))
            .collect();
        let listed = futures::stream::iter(listed)
            .take(MAX_EVENT_DELIVERIES)
            .map(|created| async move { self.read_created_state(created).await });
        let legacy = futures::stream::iter(legacy)
            .take(MAX_EVENT_DELIVERIES.saturating_sub(listed_ids.len()))
            .map(|id| async move { self.read_state(&id).await });
        let states: Vec<Option<DeliveryState>> = listed
            .buffered(READ_FAN_OUT)
            .chain(legacy.buffered(READ_FAN_OUT))
            .try_collect()
            .await?;
        let mut states: Vec<DeliveryState> = states
            .into_iter()
            .flatten()
            .filter(|s| &s.event_id == event)
            .collect();
        states.sort_by(|a, b| a.delivery_id.cmp(&b.delivery_id));
        Ok(states)
    }

    /// The rows `statement` reads with `values`, at most [`MAX_EVENT_DELIVERIES`].
    async fn read_ids<R>(
        &self,
        statement: &PreparedStatement,
        values: impl scylla::serialize::row::SerializeRow,
    ) -> Result<Vec<R>, StoreError>
    where
        R: for<'f, 'm> scylla::deserialize::row::DeserializeRow<'f, 'm>,
    {
        let _permit = self.permit().await?;
        let mut stream = self
            .session
            .execute_iter(statement.clone(), values)
            .await
            .map_err(pager_error)?
            .rows_stream::<R>()
            .map_err(backend_error)?;
        let mut rows = Vec::new();
        while let Some(row) = stream.next().await {
            rows.push(row.map_err(row_error)?);
            if rows.len() == MAX_EVENT_DELIVERIES {
                break;
            }
        }
        Ok(rows)
    }
}

/// `log` with the delivery's creation added, when there is one.
fn with_creation(
    log: Option<Derivation>,
    created: Option<(Identity, Entry)>,
) -> Option<Derivation> {
    let Some((identity, entry)) = created else {
        return log;
    };
    Some(match log {
        Some(mut f) => {
            f.add(entry);
            f
        }
        None => Derivation::new(identity, entry),
    })
}

/// The creations that `rows` (of one event key) record for the deliveries `keep` accepts (by
/// event and delivery id), each as an entry at its event's `received_at`; `what` names the
/// rows in a corruption error. An event's endpoints are listed in its own row (endpoint '')
/// and, when version 7 wrote it, in a row per endpoint after it.
fn creations(
    rows: &[KeyCols],
    what: &str,
    keep: impl Fn(&EventId, &DeliveryId) -> bool,
) -> Result<Vec<(Identity, Entry)>, StoreError> {
    let bad = || corrupt("event", what);
    let mut found = Vec::new();
    // Rows come by (event_id, tenant, endpoint_id): each event and tenant's own row (endpoint
    // '') before its endpoints' rows.
    let mut head: Option<&KeyCols> = None;
    let mut created = |head: &KeyCols, endpoint: &str| -> Result<(), StoreError> {
        let event = EventId::parse(head.event_id.as_str()).map_err(|_| bad())?;
        let endpoint = EndpointId::parse(endpoint).map_err(|_| bad())?;
        let delivery_id = DeliveryId::derive(&event, &endpoint);
        if !keep(&event, &delivery_id) {
            return Ok(());
        }
        let identity = Identity {
            delivery_id,
            event_id: event,
            endpoint_id: endpoint,
            tenant: Tenant::parse(head.tenant.as_str()).map_err(|_| bad())?,
            event_type: head.event_type.clone().ok_or_else(bad)?,
        };
        let at = from_cql(head.received_at.ok_or_else(bad)?);
        found.push((identity, Entry::created(at)));
        Ok(())
    };
    for row in rows {
        if row.endpoint_id.is_empty() {
            head = Some(row);
            for endpoint in row.endpoints.iter().flatten() {
                created(row, endpoint)?;
            }
            continue;
        }
        let Some(head) = head.filter(|h| h.event_id == row.event_id && h.tenant == row.tenant)
        else {
            return Err(bad());
        };
        // An event recorded again by version 8 lists version 7's endpoint rows in its own.
        if !head
            .endpoints
            .iter()
            .flatten()
            .any(|e| *e == row.endpoint_id)
        {
            created(head, &row.endpoint_id)?;
        }
    }
    Ok(found)
}

/// A row of a delivery's log as an entry of its state, with the delivery it names.
fn entry_from_cols(c: StateCols) -> Result<(Identity, Entry), StoreError> {
    let bad = || corrupt("delivery log", &c.delivery_id);
    let note = match c.note.as_deref() {
        None => None,
        Some(PARKED) => Some(EntryKind::Note(NoteKind::Parked {
            reason: c
                .park_reason
                .as_deref()
                .and_then(ParkReason::parse)
                .ok_or_else(bad)?,
            next_attempt_at: from_cql(c.next_attempt_at.ok_or_else(bad)?),
        })),
        Some(DEAD) => Some(EntryKind::Note(NoteKind::Dead {
            reason: c
                .dead_reason
                .as_deref()
                .and_then(DeadReason::parse)
                .ok_or_else(bad)?,
        })),
        Some(_) => return Err(bad()),
    };
    if let Some(kind) = note {
        let identity = identity_from_cols(
            &c.delivery_id,
            c.event_id,
            c.endpoint_id,
            c.tenant,
            c.event_type,
        )?;
        let at = from_cql(c.started_at);
        return Ok((identity, Entry { at, kind }));
    }
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
        request_headers: None,
        note: None,
    })?;
    Ok((Identity::of_attempt(&row), Entry::attempt(&row)))
}

/// The delivery a log row names; a row missing a column of it is corrupt.
fn identity_from_cols(
    delivery_id: &str,
    event_id: Option<String>,
    endpoint_id: Option<String>,
    tenant: Option<String>,
    event_type: Option<String>,
) -> Result<Identity, StoreError> {
    let bad = || corrupt("delivery log", delivery_id);
    Ok(Identity {
        delivery_id: DeliveryId::parse(delivery_id).map_err(|_| bad())?,
        event_id: EventId::parse(event_id.ok_or_else(bad)?).map_err(|_| bad())?,
        endpoint_id: EndpointId::parse(endpoint_id.ok_or_else(bad)?).map_err(|_| bad())?,
        tenant: Tenant::parse(tenant.ok_or_else(bad)?).map_err(|_| bad())?,
        event_type: event_type.ok_or_else(bad)?,
    })
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
    let id = identity_from_cols(
        &c.delivery_id,
        c.event_id,
        c.endpoint_id,
        c.tenant,
        c.event_type,
    )?;
    Ok(AttemptRow {
        delivery_id: id.delivery_id,
        event_id: id.event_id,
        endpoint_id: id.endpoint_id,
        tenant: id.tenant,
        event_type: id.event_type,
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
        // CQL stores an empty list as null.
        request_headers: c.request_headers.unwrap_or_default(),
    })
}
