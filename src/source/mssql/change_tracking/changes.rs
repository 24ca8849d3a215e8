//! The change reads and the version and retention rules: a read of `CHANGETABLE(CHANGES t, @base)` bounded by
//! the versions its statement started at, whether the base is still inside retention, how a backlog's base moves
//! up to stay inside it, and what a lost position becomes (`onPositionLost`). What this process proved delivered
//! by an empty poll is kept in [`Idle`].

use super::payload::{self, ChangeRow};
use super::snapshot;
use super::tracked::{Tracked, Values};
use crate::change::Change;
use crate::db::mssql::Param;
use crate::source::mssql::catalog::{big, int, one_row, required, text};
use crate::source::mssql::options::OnPositionLost;
use crate::source::mssql::position::{CtPosition, Last};
use crate::source::mssql::read::Reads;
use crate::source::mssql::sql::{self, After, CtShape, Upto};
use crate::source::{Fetched, Position, SourceError};

/// The result of a change read: the versions it was bounded by, and its rows.
#[derive(Debug)]
pub(super) struct Read {
    pub current: Option<i64>,
    pub min_valid: Option<i64>,
    pub rows: Vec<ChangeRow>,
}

/// Where a range re-read stops.
#[derive(Debug, Clone, Copy)]
pub(super) enum Until<'a> {
    Version(i64),
    Key(&'a Last),
}

/// A position this process polled and found nothing after, with the version that poll was bounded by:
/// everything up to that version is delivered, so the next read may start there. Set by an empty fetch and an
/// empty resync; read by the next fetch.
#[derive(Debug, Default)]
pub(super) struct Idle(std::sync::Mutex<Option<(Position, i64)>>);

impl Idle {
    fn get(&self) -> Option<(Position, i64)> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, after: &Position, proven: i64) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some((after.clone(), proven));
    }
}

/// Runs a change read (fetch or range re-read).
async fn read_changes(
    t: &Tracked,
    shape: &CtShape,
    base: i64,
    after: Option<&Last>,
    until: Option<Until<'_>>,
    limit: usize,
) -> Result<Read, SourceError> {
    let from = if after.is_some() { After::Key } else { After::Start };
    let (upto, upto_version, upto_key) = match until {
        None => (Upto::Current, None, None),
        Some(Until::Version(v)) => (Upto::Version, Some(v), None),
        Some(Until::Key(l)) => (Upto::Key, Some(l.version), Some(l.key.as_slice())),
    };
    let s = shape.changes(from, upto);
    let params =
        t.bind(&s, &Values { base, after, upto_version, upto_key, limit: limit as i64, ..Default::default() })?;
    let ctx = "reading changes";
    let rows = t.pool.query(&s.sql, &params, ctx).await?;
    let mut read = Read { current: None, min_valid: None, rows: Vec::new() };
    for (i, r) in rows.iter().enumerate() {
        if i == 0 {
            read.current = big(r, 0, ctx)?;
            read.min_valid = big(r, 1, ctx)?;
        }
        let Some(version) = big(r, 2, ctx)? else { continue };
        let key = (0..shape.key.len())
            .map(|k| required(text(r, 7 + k, ctx)?, "key text", ctx))
            .collect::<Result<Vec<_>, _>>()?;
        read.rows.push(ChangeRow {
            version,
            op: required(int(r, 3, ctx)?, "OP", ctx)?,
            item: required(text(r, 4, ctx)?, "ITEM", ctx)?,
            created: big(r, 5, ctx)?,
            mask: text(r, 6, ctx)?,
            key,
        });
    }
    if rows.is_empty() {
        return Err(SourceError::Invalid(format!(
            "unexpected answer from SQL Server while {ctx}: no row (expected at least the version row)"
        )));
    }
    Ok(read)
}

/// Checks a read's versions: tracking still on, and the base still inside retention.
pub(super) fn liveness(t: &Tracked, read: &Read, base: i64) -> Result<bool, SourceError> {
    let (db, table) = (t.db_name(), &t.spec.table);
    if read.current.is_none() {
        return Err(SourceError::Invalid(format!(
            "change tracking was turned off for database {db}; turn it on again (ALTER DATABASE {db} SET CHANGE_TRACKING = ON) and reset the function's state: the changes in between are gone"
        )));
    }
    let Some(min_valid) = read.min_valid else {
        return Err(SourceError::Invalid(format!(
            "change tracking was turned off for table {table}; run ALTER TABLE {} ENABLE CHANGE_TRACKING and reset the function's state (`handler state reset <function> --to now --confirm`): the changes in between are gone",
            table.mssql()
        )));
    };
    Ok(base >= min_valid)
}

/// The refusal of a position whose base retention has passed.
pub(super) fn lost(t: &Tracked, base: i64, min_valid: Option<i64>) -> SourceError {
    let retention = t.retention_text();
    SourceError::PositionLost(format!(
        "change tracking for {} no longer holds the changes after version {base} (the minimum valid version is {}; retention is {retention}): changes made before cleanup ran were never delivered and are lost. \
To go on, either set \"onPositionLost\": \"resync\" in sqltrigger.json (re-sends every current row as an Insert; deletes in the gap are not reported) or reset the state with `handler state reset <function> --to now --confirm`; \
then make retention longer than the longest outage (ALTER DATABASE {} SET CHANGE_TRACKING (CHANGE_RETENTION = 7 DAYS))",
        t.spec.table,
        min_valid.map(|v| v.to_string()).unwrap_or_else(|| "unknown".into()),
        t.db_name()
    ))
}

/// The table's minimum valid and current change-tracking versions.
pub(super) async fn versions(t: &Tracked) -> Result<(i64, i64), SourceError> {
    let ctx = "reading change-tracking versions";
    let s = sql::versions();
    let row = one_row(t.pool.query(&s.sql, &[Param::Text(t.spec.table.mssql())], ctx).await?, ctx)?;
    let read = Read { min_valid: big(&row, 0, ctx)?, current: big(&row, 1, ctx)?, rows: Vec::new() };
    liveness(t, &read, i64::MAX)?;
    Ok((read.min_valid.unwrap_or_default(), read.current.unwrap_or_default()))
}

/// A stored position; before everything (`null`), what change tracking still holds.
pub(super) async fn parse(t: &Tracked, p: &Position) -> Result<CtPosition, SourceError> {
    let shape = t.shape().await?;
    match CtPosition::parse(p, shape.key.len(), &t.table_text())? {
        Some(pos) => Ok(pos),
        None => Ok(CtPosition::Changes { base: versions(t).await?.0, last: None }),
    }
}

fn changes_of(t: &Tracked, read: &Read, shape: &CtShape) -> Result<Vec<Change>, SourceError> {
    read.rows.iter().map(|r| payload::change(r, shape, t.options.include_metadata)).collect()
}

/// Changes after `(base, last)`, up to the current version.
pub(super) async fn fetch_changes(
    t: &Tracked,
    idle: &Idle,
    shape: &CtShape,
    after: &Position,
    (base, last): (i64, Option<&Last>),
    limit: usize,
) -> Result<Fetched, SourceError> {
    let (mut base, mut last) = (base, last);
    if let Some((pos, proven)) = idle.get().filter(|(pos, proven)| pos == after && *proven > base) {
        // Everything up to `proven` is delivered (an empty poll, or a resync that found the table empty).
        tracing::debug!(position = %pos, proven, "starting after the version this process proved delivered");
        (base, last) = (proven, None);
    }
    let mut read = read_changes(t, shape, base, last, None, limit).await?;
    if !liveness(t, &read, base)? {
        match last {
            // Everything below the last delivered version is delivered: start just below it.
            Some(l) if read.min_valid.is_some_and(|m| l.version > m) => {
                tracing::info!(table = %t.spec.table, from = base, to = l.version - 1, "moving the base version up to stay inside change-tracking retention");
                base = l.version - 1;
                read = read_changes(t, shape, base, last, None, limit).await?;
                if !liveness(t, &read, base)? {
                    return on_lost(t, idle, shape, after, base, &read, limit).await;
                }
            }
            _ => return on_lost(t, idle, shape, after, base, &read, limit).await,
        }
    }
    let current = read.current.unwrap_or(base);
    if read.rows.is_empty() {
        idle.set(after, current);
        // Nothing in (base, current]: the engine may record `current` as the base now and then, so a quiet
        // table's position survives restarts longer than the retention period.
        let advance = (current > base).then(|| CtPosition::Changes { base: current, last: None }.to_json());
        return Ok(Fetched { advance, ..Fetched::default() });
    }
    let changes = changes_of(t, &read, shape)?;
    let last = if read.rows.len() >= limit {
        let r = read.rows.last().map(|r| Last { version: r.version, key: r.key.clone() });
        CtPosition::Changes { base, last: r }
    } else {
        // Drained: everything up to the version this statement started at is delivered.
        CtPosition::Changes { base: current.max(base), last: None }
    };
    Ok(Fetched { changes, last: Some(last.to_json()), advance: None })
}

/// Re-reads `(after, until]` of the change stream; the lost-position rules are the fetch's. `Ok(Err(read))`:
/// retention passed the base, `read` says where it is now.
pub(super) async fn range(
    t: &Tracked,
    shape: &CtShape,
    (base, last): (i64, Option<&Last>),
    until: Until<'_>,
    limit: usize,
) -> Result<Result<Vec<Change>, Read>, SourceError> {
    let mut base = base;
    let mut read = read_changes(t, shape, base, last, Some(until), limit).await?;
    if !liveness(t, &read, base)? {
        match last {
            Some(l) if read.min_valid.is_some_and(|m| l.version > m) => {
                base = l.version - 1;
                read = read_changes(t, shape, base, last, Some(until), limit).await?;
                if !liveness(t, &read, base)? {
                    return Ok(Err(read));
                }
            }
            _ => return Ok(Err(read)),
        }
    }
    Ok(Ok(changes_of(t, &read, shape)?))
}

/// A fetch whose base retention passed: refused ([`lost`]), or under `onPositionLost: resync` the first step
/// of a walk of the current rows.
async fn on_lost(
    t: &Tracked,
    idle: &Idle,
    shape: &CtShape,
    after: &Position,
    base: i64,
    read: &Read,
    limit: usize,
) -> Result<Fetched, SourceError> {
    if t.options.on_position_lost != OnPositionLost::Resync {
        return Err(lost(t, base, read.min_valid));
    }
    let from = read.current.unwrap_or(base);
    tracing::warn!(table = %t.spec.table, base, min_valid = ?read.min_valid, "change-tracking position lost; resyncing by walking the table (onPositionLost: resync)");
    let (changes, key) = snapshot::walk(t, shape, None, None, limit).await?;
    if changes.is_empty() {
        // An empty table: the resync is complete at once, and the lost position is replaced by the version
        // read before the walk. Remembered here for the next tick, and offered to the engine to record,
        // so the walk is not repeated every tick (and the lost position not reported again).
        idle.set(after, from);
        let advance = CtPosition::Changes { base: from, last: None }.to_json();
        return Ok(Fetched { advance: Some(advance), ..Fetched::default() });
    }
    Ok(snapshot::walk_result(changes, key, from, limit))
}
