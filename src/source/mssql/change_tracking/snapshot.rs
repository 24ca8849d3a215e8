//! The walk of the current rows: `startFrom: snapshot`, and the resync after a lost position
//! (`onPositionLost: resync`). Every row is an `Insert`; positions stay in the snapshot phase until a walk
//! returns fewer rows than asked.

use super::{MssqlChangeTracking, Read, Values};
use crate::change::{Change, Operation};
use crate::source::mssql::catalog::{required, text};
use crate::source::mssql::options::OnPositionLost;
use crate::source::mssql::position::CtPosition;
use crate::source::mssql::read::Reads;
use crate::source::mssql::sql::CtShape;
use crate::source::{Fetched, Position, SourceError};

impl MssqlChangeTracking {
    /// A walk of the current rows: `Insert` for each, positions in the snapshot phase.
    pub(super) async fn walk(
        &self,
        shape: &CtShape,
        after: Option<&[String]>,
        upto: Option<&[String]>,
        limit: usize,
    ) -> Result<(Vec<Change>, Option<Vec<String>>), SourceError> {
        let s = shape.walk(after.is_some(), upto.is_some());
        let params =
            self.bind(&s, &Values { after_key: after, upto_key: upto, limit: limit as i64, ..Default::default() })?;
        let ctx = "walking the table";
        let rows = self.pool.query(&s.sql, &params, ctx).await?;
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

    pub(super) async fn on_lost(
        &self,
        shape: &CtShape,
        after: &Position,
        base: i64,
        read: &Read,
        limit: usize,
    ) -> Result<Fetched, SourceError> {
        if self.options.on_position_lost != OnPositionLost::Resync {
            return Err(self.lost(base, read.min_valid));
        }
        let from = read.current.unwrap_or(base);
        tracing::warn!(table = %self.spec.table, base, min_valid = ?read.min_valid, "change-tracking position lost; resyncing by walking the table (onPositionLost: resync)");
        let (changes, key) = self.walk(shape, None, None, limit).await?;
        if changes.is_empty() {
            // An empty table: the resync is complete at once, and the lost position is replaced by the version
            // read before the walk. Remembered here for the next tick, and offered to the engine to record,
            // so the walk is not repeated every tick (and the lost position not reported again).
            *self.idle.lock().unwrap_or_else(|p| p.into_inner()) = Some((after.clone(), from));
            let advance = CtPosition::Changes { base: from, last: None }.to_json();
            return Ok(Fetched { advance: Some(advance), ..Fetched::default() });
        }
        Ok(self.walk_result(changes, key, from, limit))
    }

    pub(super) fn walk_result(
        &self,
        changes: Vec<Change>,
        key: Option<Vec<String>>,
        base: i64,
        limit: usize,
    ) -> Fetched {
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
}
