//! Replay marks and claims: which replay last re-sent a delivery (a mark, a plain write), and
//! which replay owns re-sending it (a claim, taken and handed over by lightweight transactions
//! so that two replays never both own one delivery).

use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlTimestamp;
use scylla::{DeserializeRow, SerializeRow};

use super::ScyllaStore;
use super::error::{backend_error, exec_error};
use super::row::{from_cql, to_cql};
use crate::id::DeliveryId;
use crate::storage::{ReplayMark, StoreError};

/// A `replay_marks` row, or a new `replay_claims` row.
#[derive(SerializeRow)]
struct MarkValues<'a> {
    delivery_id: &'a str,
    replay_id: &'a str,
    at: CqlTimestamp,
    ttl: i32,
}

impl<'a> MarkValues<'a> {
    /// The columns of `mark`, to live `ttl` seconds.
    fn of(mark: &'a ReplayMark, ttl: i32) -> Self {
        MarkValues {
            delivery_id: mark.delivery_id.as_str(),
            replay_id: &mark.replay_id,
            at: to_cql(mark.at),
            ttl,
        }
    }
}

/// A `replay_claims` row handed over from the replay `over`.
#[derive(SerializeRow)]
struct ClaimOverValues<'a> {
    #[scylla(flatten)]
    claim: &'a MarkValues<'a>,
    over: &'a str,
}

/// A mark or claim as read.
#[derive(DeserializeRow)]
struct MarkCols {
    replay_id: String,
    at: CqlTimestamp,
}

impl ScyllaStore {
    /// Writes `mark`.
    pub(super) async fn write_mark(&self, mark: &ReplayMark) -> Result<(), StoreError> {
        self.write(
            &self.st.claim.insert_replay_mark,
            MarkValues::of(mark, self.attempt_ttl),
        )
        .await
    }

    /// A delivery's replay mark or claim, as `statement` (`SELECT replay_id, at`) reads it.
    pub(super) async fn read_mark(
        &self,
        statement: &PreparedStatement,
        id: &DeliveryId,
    ) -> Result<Option<ReplayMark>, StoreError> {
        let mark = self
            .read_row::<MarkCols>(statement, (id.as_str(),))
            .await?
            .map(|r| ReplayMark {
                delivery_id: id.clone(),
                replay_id: r.replay_id,
                at: from_cql(r.at),
            });
        Ok(mark)
    }

    /// Takes a claim on a delivery: over no claim (`over`: `None`) or over the named replay's;
    /// whether it was taken.
    pub(super) async fn try_claim(
        &self,
        claim: &ReplayMark,
        over: Option<&str>,
    ) -> Result<bool, StoreError> {
        let _permit = self.permit().await?;
        let values = MarkValues::of(claim, self.attempt_ttl);
        let result = match over {
            None => {
                self.session
                    .execute_unpaged(&self.st.claim.insert_replay_claim, &values)
                    .await
            }
            Some(over) => {
                let values = ClaimOverValues {
                    claim: &values,
                    over,
                };
                self.session
                    .execute_unpaged(&self.st.claim.update_replay_claim, values)
                    .await
            }
        }
        .map_err(exec_error)?;
        lwt_applied(result, &claim.replay_id)
    }
}

/// Whether a lightweight transaction writing `replay_id` took effect: its `[applied]` column,
/// or, when not applied, whether the row already names `replay_id` (this very claim, made by
/// an earlier try of the same request). Cassandra answers `[applied]` alone when applied and
/// adds the columns its condition read when not; ScyllaDB always adds every column. Read by
/// name for both.
fn lwt_applied(
    result: scylla::response::query_result::QueryResult,
    replay_id: &str,
) -> Result<bool, StoreError> {
    use scylla::value::{CqlValue, Row};
    let rows = result.into_rows_result().map_err(backend_error)?;
    let column = |name: &str| rows.column_specs().iter().position(|c| c.name() == name);
    let (Some(applied), replay_col) = (column("[applied]"), column("replay_id")) else {
        return Err(backend_error(
            "a lightweight transaction's answer has no [applied] column",
        ));
    };
    let Some(row) = rows.maybe_first_row::<Row>().map_err(backend_error)? else {
        return Err(backend_error("a lightweight transaction answered no row"));
    };
    let value = |i: usize| row.columns.get(i).cloned().flatten();
    match value(applied) {
        Some(CqlValue::Boolean(true)) => Ok(true),
        Some(CqlValue::Boolean(false)) => {
            Ok(replay_col.and_then(value) == Some(CqlValue::Text(replay_id.to_owned())))
        }
        other => Err(backend_error(format!(
            "a lightweight transaction's [applied] column holds {other:?}"
        ))),
    }
}
