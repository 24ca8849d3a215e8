//! What both SQL Server sources' backfills share (docs/operations.md, "Backfill"): the backfill's key position,
//! binding a chunk's parameters, and decoding a chunk. Each source decides its own bound (`rowversion`,
//! `change_tracking::backfill`); why the bounds are sound is argued in docs/architecture.md, "Backfill".
//!
//! A backfill position is the key's texts, `["7", "b"]` (the texts live positions hold too, see `types`); the
//! bound is the source's, stored in the state document as a number.

use super::catalog::{big, one_row, required, text};
use super::read::Reads;
use super::schema::ColumnFacts;
use super::sql::{MssqlFilter, Slot, Statement};
use super::types::SqlType;
use crate::change::{Change, Operation};
use crate::config::Partition;
use crate::db::mssql::{Param, Pool};
use crate::source::{backfill_key_texts as key_texts, ChunkRequest, Fetched, Filter, Position, SourceError};

/// The bound a backfill stored (`BackfillPlan::bound`): `None` for `Null`, nothing to backfill.
pub(super) fn bound(b: &Position, table: &str) -> Result<Option<i64>, SourceError> {
    match b {
        Position::Null => Ok(None),
        other => other.as_i64().map(Some).ok_or_else(|| {
            SourceError::Invalid(format!(
                "the stored backfill bound {other} of {table} is not a version; cancel the backfill (handler state backfill <function> --cancel) and start it again"
            ))
        }),
    }
}

/// The filter checked against the table's columns; the error names what is wrong and what would work.
pub(super) fn check_filter(
    filter: Option<&Filter>,
    table: &str,
    columns: &[ColumnFacts],
) -> Result<Option<MssqlFilter>, SourceError> {
    let Some(filter) = filter else { return Ok(None) };
    let columns: Vec<(String, SqlType)> = columns.iter().map(|c| (c.name.clone(), c.ty.clone())).collect();
    MssqlFilter::new(filter, table, &columns).map(Some).map_err(|e| SourceError::Invalid(format!("--where: {e}")))
}

/// The values of a backfill statement's parameters, in its slots' order: for the chunk `r` asks for (its
/// statement built from `r` too, `sql::backfill`) over a key of `key_len` columns of `table`, under `filter` (the
/// request's, checked by [`check_filter`]), for `partition`. `None` when the backfill has no bound (nothing to
/// backfill). A stored bound or key that does not fit is refused with the fix. Both sources bind a chunk (and
/// their estimate, a request from the first key) so; only the statement differs.
pub(super) fn bind(
    s: &Statement,
    r: &ChunkRequest<'_>,
    (key_len, table): (usize, &str),
    filter: Option<&MssqlFilter>,
    partition: Option<Partition>,
) -> Result<Option<Vec<Param>>, SourceError> {
    let Some(bound) = bound(r.bound, table)? else { return Ok(None) };
    let after = key_texts(r.after, key_len, table)?;
    let upto = r.upto.map(|u| key_texts(u, key_len, table)).transpose()?.flatten();
    let limit = r.limit.max(1);
    let missing = |what: &str| SourceError::Invalid(format!("internal error: statement parameter {what} has no value"));
    let filter = filter.map(MssqlFilter::values).unwrap_or_default();
    let key = |k: Option<&Vec<String>>, i: usize, what: &str| {
        k.and_then(|k| k.get(i)).cloned().map(Param::Text).ok_or_else(|| missing(what))
    };
    s.slots
        .iter()
        .map(|slot| match slot {
            Slot::Limit => Ok(Param::Int(limit as i64)),
            Slot::Bound => Ok(Param::Int(bound)),
            Slot::AfterKey(i) => key(after.as_ref(), *i, "after key"),
            Slot::UptoKey(i) => key(upto.as_ref(), *i, "upto key"),
            Slot::Filter(i) => filter.get(*i).cloned().map(Param::Text).ok_or_else(|| missing("filter value")),
            Slot::PartitionIndex => {
                partition.map(|p| Param::Int(i64::from(p.index))).ok_or_else(|| missing("partition"))
            }
            Slot::PartitionCount => {
                partition.map(|p| Param::Int(i64::from(p.count.get()))).ok_or_else(|| missing("partitions"))
            }
            _ => Err(missing("of another statement")),
        })
        .collect::<Result<_, _>>()
        .map(Some)
}

/// A request for the whole walk under `bound`, from the first key: what an estimate counts.
pub(super) fn whole<'a>(bound: &'a Position, filter: Option<&'a Filter>) -> ChunkRequest<'a> {
    const NULL: &Position = &Position::Null;
    ChunkRequest { bound, after: NULL, upto: None, filter, limit: 0, live: NULL }
}

/// Reads one chunk: every row an insert (operation 0), `last` the last row's key texts; `None` (no bound):
/// nothing to read.
pub(super) async fn read(
    pool: &Pool,
    s: &Statement,
    params: Option<Vec<Param>>,
    key_len: usize,
) -> Result<Fetched, SourceError> {
    let Some(params) = params else { return Ok(Fetched::default()) };
    let params = params.as_slice();
    let ctx = "reading a backfill chunk";
    let rows = pool.query(&s.sql, params, ctx).await?;
    let mut changes = Vec::with_capacity(rows.len());
    let mut last = None;
    for r in &rows {
        let item = required(text(r, 0, ctx)?, "ITEM", ctx)?;
        changes.push(
            Change::from_json(Operation::Insert, item)
                .map_err(|e| SourceError::Invalid(format!("SQL Server returned invalid row JSON: {e}")))?,
        );
        let key =
            (0..key_len).map(|k| required(text(r, 1 + k, ctx)?, "key text", ctx)).collect::<Result<Vec<_>, _>>()?;
        last = Some(Position::Array(key.into_iter().map(Position::String).collect()));
    }
    Ok(Fetched { changes, last, advance: None })
}

/// Runs an estimate statement (one row, `ESTIMATE`); `None` (no bound): nothing to count.
pub(super) async fn estimate(pool: &Pool, s: &Statement, params: Option<Vec<Param>>) -> Result<u64, SourceError> {
    let Some(params) = params else { return Ok(0) };
    let params = params.as_slice();
    let ctx = "counting the rows to backfill";
    let row = one_row(pool.query(&s.sql, params, ctx).await?, ctx)?;
    Ok(big(&row, 0, ctx)?.unwrap_or(0).max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_stored_position_or_bound_that_does_not_fit_says_how_to_start_again() {
        assert_eq!(key_texts(&json!(["7", "b"]), 2, "t").expect("fits"), Some(vec!["7".into(), "b".into()]));
        assert_eq!(key_texts(&Position::Null, 2, "t").expect("start"), None);
        for wrong in [json!(["7"]), json!([7, 8]), json!({"rv": 1})] {
            let e = key_texts(&wrong, 2, "[dbo].[T]").unwrap_err().to_string();
            assert!(e.contains("[dbo].[T]") && e.contains("--cancel"), "{e}");
        }
        assert_eq!(bound(&json!(42), "t").expect("a version"), Some(42));
        assert_eq!(bound(&Position::Null, "t").expect("nothing to do"), None);
        assert!(bound(&json!("42"), "t").unwrap_err().to_string().contains("--cancel"));
    }
}
