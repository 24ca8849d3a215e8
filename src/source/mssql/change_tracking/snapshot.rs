//! The walk of the current rows: `startFrom: snapshot` in states written before backfills existed, and the
//! resync after a lost position (`onPositionLost: resync`, decided in `changes`). Every row is an `Insert`;
//! positions stay in the snapshot phase until a walk returns fewer rows than asked.

use super::tracked::{Tracked, Values};
use crate::change::{Change, Operation};
use crate::source::mssql::catalog::{required, text};
use crate::source::mssql::position::CtPosition;
use crate::source::mssql::read::Reads;
use crate::source::mssql::sql::CtShape;
use crate::source::{Fetched, SourceError};

/// A walk of the current rows of `t` after key `after` (none: from the first) up to `upto` (none: to the
/// end): `Insert` for each, and the last key read.
pub(super) async fn walk(
    t: &Tracked,
    shape: &CtShape,
    after: Option<&[String]>,
    upto: Option<&[String]>,
    limit: usize,
) -> Result<(Vec<Change>, Option<Vec<String>>), SourceError> {
    let s = shape.walk(after.is_some(), upto.is_some());
    let params = t.bind(&s, &Values { after_key: after, upto_key: upto, limit: limit as i64, ..Default::default() })?;
    let ctx = "walking the table";
    let rows = t.pool.query(&s.sql, &params, ctx).await?;
    let mut changes = Vec::with_capacity(rows.len());
    let mut last_key = None;
    for r in &rows {
        let item = required(text(r, 1, ctx)?, "ITEM", ctx)?;
        changes.push(
            Change::from_json(Operation::Insert, item)
                .map_err(|e| SourceError::Invalid(format!("SQL Server returned invalid row JSON: {e}")))?,
        );
        last_key = Some(
            (0..shape.key.len())
                .map(|k| required(text(r, 2 + k, ctx)?, "key text", ctx))
                .collect::<Result<Vec<_>, _>>()?,
        );
    }
    Ok((changes, last_key))
}

/// What a walk step delivers: its rows, and a position still in the snapshot phase while the walk filled its
/// batch, or the changes after `base` once it did not.
pub(super) fn walk_result(changes: Vec<Change>, key: Option<Vec<String>>, base: i64, limit: usize) -> Fetched {
    if changes.is_empty() {
        return Fetched::default();
    }
    let last = if changes.len() >= limit {
        CtPosition::Snapshot { base, key }
    } else {
        CtPosition::Changes { base, last: None }
    };
    Fetched { changes, last: Some(last.to_json()), advance: None }
}
