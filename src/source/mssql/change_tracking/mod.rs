//! The change-tracking source: `CHANGETABLE(CHANGES t, @base)` read in `(SYS_CHANGE_VERSION, key)` order,
//! keyset-paged from the stored position, the official trigger's mechanism without its database-wide app
//! lock or lease tables.
//!
//! # How a position moves
//! A position is a base version B (the argument of `CHANGETABLE`) plus the last delivered `(version, key)`.
//! The base stays fixed while a backlog is paged through, so `Operation` stays relative to one point: a row
//! created after B is an Insert even when its insert and later updates are delivered in different batches
//! (it may then arrive as Insert twice, which at-least-once consumers handle anyway; moving the base
//! mid-backlog, as the official trigger does, would instead report a never-delivered insert as an Update).
//! When a read returns fewer rows than asked, everything up to the version read at the start of that
//! statement has been delivered, and the next position is simply that version as the new base.
//!
//! # Consistency
//! Each read is one statement that takes `CHANGE_TRACKING_CURRENT_VERSION()` and
//! `CHANGE_TRACKING_MIN_VALID_VERSION()` and reads changes up to that current version, so a batch is bounded
//! by a version captured at its start. Under SNAPSHOT isolation (used when the database allows it) the
//! changes and the joined current rows are one consistent view. Under READ COMMITTED the joined row can be
//! newer than its change: it is then delivered with newer values and delivered again when its newer change
//! comes (a duplicate, never a loss), and a row deleted in between is reported as a Delete.
//!
//! # Retention
//! If cleanup has passed the stored base, changes may be gone. This source refuses with
//! `SourceError::PositionLost` (the official trigger silently skips ahead) unless `onPositionLost` is
//! `resync`, which walks the table again. Two cases are not losses and continue silently: a backlog whose
//! last delivered version is still valid (the base moves up to just below it), and a table that was polled
//! empty by this process since the base (the base moves to the version that poll proved empty).

mod backfill;
mod payload;
mod snapshot;
mod status;

use super::catalog::{big, int, one_row, required, text};
use super::options::{OnPositionLost, Options};
use super::position::{CtPosition, Last};
use super::read::Reads;
use super::schema::{self, ColumnFacts, DatabaseFacts};
use super::sql::{self, After, CtShape, Slot, Statement, Upto};
use crate::change::Change;
use crate::config::SourceSpec;
use crate::db::mssql::{Param, Pool, Settings};
use crate::source::{BackfillPlan, Fetched, Filter, Lag, Position, Source, SourceError, StartFrom};
use std::sync::atomic::AtomicBool;
use tokio::sync::OnceCell;

/// SQL Server's answers to a statement the login lacks a permission for: 229 (an object permission), 297 and
/// 300 (a database permission such as VIEW DATABASE STATE).
const PERMISSION_DENIED: &[u32] = &[229, 297, 300];

#[derive(Debug)]
pub struct MssqlChangeTracking {
    spec: SourceSpec,
    options: Options,
    pool: Pool,
    /// The table's shape, the database's facts, and every column of the table (a backfill's filter is checked
    /// against them).
    discovered: OnceCell<(CtShape, DatabaseFacts, Vec<ColumnFacts>)>,
    /// A position this process polled and found nothing after, with the version that poll was bounded by:
    /// everything up to that version is delivered, so the next read may start there.
    idle: std::sync::Mutex<Option<(Position, i64)>>,
    /// Whether the log already said why the lag is unknown (status is polled every few seconds).
    lag_reason_logged: AtomicBool,
}

/// Values for a statement's parameter slots.
#[derive(Debug, Default)]
struct Values<'a> {
    base: i64,
    after: Option<&'a Last>,
    after_key: Option<&'a [String]>,
    upto_version: Option<i64>,
    upto_key: Option<&'a [String]>,
    limit: i64,
}

/// One row of `CtShape::changes`.
#[derive(Debug)]
struct ChangeRow {
    version: i64,
    op: i32,
    item: String,
    created: Option<i64>,
    mask: Option<String>,
    key: Vec<String>,
}

/// The result of a change read: the versions it was bounded by, and its rows.
#[derive(Debug)]
struct Read {
    current: Option<i64>,
    min_valid: Option<i64>,
    rows: Vec<ChangeRow>,
}

/// Where a range re-read stops.
#[derive(Debug, Clone, Copy)]
enum Until<'a> {
    Version(i64),
    Key(&'a Last),
}

impl MssqlChangeTracking {
    /// Parses the connection string and options; connects on first use.
    pub fn new(spec: SourceSpec) -> Result<Self, SourceError> {
        let settings = Settings::parse(&spec.connection_setting, &spec.connection).map_err(SourceError::Invalid)?;
        let options = Options::from_spec(&spec)?;
        Ok(Self {
            spec,
            options,
            pool: Pool::new(settings),
            discovered: OnceCell::new(),
            idle: Default::default(),
            lag_reason_logged: AtomicBool::new(false),
        })
    }

    async fn shape(&self) -> Result<&CtShape, SourceError> {
        Ok(&self.facts().await?.0)
    }

    async fn facts(&self) -> Result<&(CtShape, DatabaseFacts, Vec<ColumnFacts>), SourceError> {
        self.discovered.get_or_try_init(|| self.discover()).await
    }

    async fn discover(&self) -> Result<(CtShape, DatabaseFacts, Vec<ColumnFacts>), SourceError> {
        let db = super::catalog::database(&self.pool).await?;
        let table = &self.spec.table;
        // A database without change tracking fails here, before the table checks need it.
        schema::change_tracking_database(&self.spec, &db, self.options.include_metadata)?;
        let facts = super::catalog::table(&self.pool, table).await?;
        schema::change_tracking_table(&self.spec, &db, &facts, self.options.include_metadata)?;
        let columns = super::catalog::columns(&self.pool, table).await?;
        let shape = schema::change_tracking_shape(
            &self.spec,
            &db,
            &facts,
            &columns,
            self.options.skip_context.is_some(),
            self.options.include_metadata,
        )?;
        tracing::info!(
            table = %table,
            isolation = if shape.snapshot { "snapshot" } else { "read committed" },
            retention = %db.retention_text(),
            partition = %self.spec.partition.map(|p| p.to_string()).unwrap_or_else(|| "all keys".into()),
            "sql server change tracking source ready"
        );
        Ok((shape, db, columns))
    }

    fn table_text(&self) -> String {
        self.spec.table.to_string()
    }

    fn bind(&self, s: &Statement, v: &Values) -> Result<Vec<Param>, SourceError> {
        let missing =
            |what: &str| SourceError::Invalid(format!("internal error: statement parameter {what} has no value"));
        s.slots
            .iter()
            .map(|slot| {
                Ok(match slot {
                    Slot::Table => Param::Text(self.spec.table.mssql()),
                    Slot::Base => Param::Int(v.base),
                    Slot::AfterVersion => {
                        Param::Int(v.after.map(|l| l.version).ok_or_else(|| missing("after version"))?)
                    }
                    Slot::AfterKey(i) => Param::Text(
                        v.after_key
                            .or(v.after.map(|l| l.key.as_slice()))
                            .and_then(|k| k.get(*i))
                            .cloned()
                            .ok_or_else(|| missing("after key"))?,
                    ),
                    Slot::UptoVersion => Param::Int(v.upto_version.ok_or_else(|| missing("upto version"))?),
                    Slot::UptoKey(i) => {
                        Param::Text(v.upto_key.and_then(|k| k.get(*i)).cloned().ok_or_else(|| missing("upto key"))?)
                    }
                    Slot::Context => Param::Bytes(self.options.skip_context.clone().ok_or_else(|| missing("context"))?),
                    Slot::Limit => Param::Int(v.limit),
                    Slot::PartitionIndex => {
                        Param::Int(self.spec.partition.map(|p| i64::from(p.index)).ok_or_else(|| missing("partition"))?)
                    }
                    Slot::PartitionCount => Param::Int(
                        self.spec.partition.map(|p| i64::from(p.count.get())).ok_or_else(|| missing("partitions"))?,
                    ),
                    Slot::PartitionColumnName | Slot::VersionColumnName | Slot::Bound | Slot::Filter(_) => {
                        return Err(missing("of another statement"))
                    }
                })
            })
            .collect()
    }

    /// Runs a change read (fetch or range re-read).
    async fn read(
        &self,
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
            self.bind(&s, &Values { base, after, upto_version, upto_key, limit: limit as i64, ..Default::default() })?;
        let ctx = "reading changes";
        let rows = self.pool.query(&s.sql, &params, ctx).await?;
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
    fn liveness(&self, read: &Read, base: i64) -> Result<bool, SourceError> {
        let (db, table) = (self.db_name(), &self.spec.table);
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

    fn db_name(&self) -> String {
        self.discovered.get().map(|(_, db, _)| db.quoted_name()).unwrap_or_else(|| "[database]".into())
    }

    fn lost(&self, base: i64, min_valid: Option<i64>) -> SourceError {
        let retention = self.discovered.get().map(|(_, db, _)| db.retention_text()).unwrap_or_default();
        SourceError::PositionLost(format!(
            "change tracking for {} no longer holds the changes after version {base} (the minimum valid version is {}; retention is {retention}): changes made before cleanup ran were never delivered and are lost. \
To go on, either set \"onPositionLost\": \"resync\" in sqltrigger.json (re-sends every current row as an Insert; deletes in the gap are not reported) or reset the state with `handler state reset <function> --to now --confirm`; \
then make retention longer than the longest outage (ALTER DATABASE {} SET CHANGE_TRACKING (CHANGE_RETENTION = 7 DAYS))",
            self.spec.table,
            min_valid.map(|v| v.to_string()).unwrap_or_else(|| "unknown".into()),
            self.db_name()
        ))
    }

    async fn versions(&self) -> Result<(i64, i64), SourceError> {
        let ctx = "reading change-tracking versions";
        let s = sql::versions();
        let row = one_row(self.pool.query(&s.sql, &[Param::Text(self.spec.table.mssql())], ctx).await?, ctx)?;
        let read = Read { min_valid: big(&row, 0, ctx)?, current: big(&row, 1, ctx)?, rows: Vec::new() };
        self.liveness(&read, i64::MAX)?;
        Ok((read.min_valid.unwrap_or_default(), read.current.unwrap_or_default()))
    }

    async fn parse(&self, p: &Position) -> Result<CtPosition, SourceError> {
        let shape = self.shape().await?;
        match CtPosition::parse(p, shape.key.len(), &self.table_text())? {
            Some(pos) => Ok(pos),
            // Before everything: what change tracking still holds.
            None => Ok(CtPosition::Changes { base: self.versions().await?.0, last: None }),
        }
    }

    /// Changes after `(base, last)`, up to the current version.
    async fn fetch_changes(
        &self,
        shape: &CtShape,
        after: &Position,
        base: i64,
        last: Option<&Last>,
        limit: usize,
    ) -> Result<Fetched, SourceError> {
        let (mut base, mut last) = (base, last);
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some((pos, proven)) = idle.filter(|(pos, proven)| pos == after && *proven > base) {
            // Everything up to `proven` is delivered (an empty poll, or a resync that found the table empty).
            tracing::debug!(position = %pos, proven, "starting after the version this process proved delivered");
            (base, last) = (proven, None);
        }
        let mut read = self.read(shape, base, last, None, limit).await?;
        if !self.liveness(&read, base)? {
            match last {
                // Everything below the last delivered version is delivered: start just below it.
                Some(l) if read.min_valid.is_some_and(|m| l.version > m) => {
                    tracing::info!(table = %self.spec.table, from = base, to = l.version - 1, "moving the base version up to stay inside change-tracking retention");
                    base = l.version - 1;
                    read = self.read(shape, base, last, None, limit).await?;
                    if !self.liveness(&read, base)? {
                        return self.on_lost(shape, after, base, &read, limit).await;
                    }
                }
                _ => return self.on_lost(shape, after, base, &read, limit).await,
            }
        }
        let current = read.current.unwrap_or(base);
        if read.rows.is_empty() {
            *self.idle.lock().unwrap_or_else(|p| p.into_inner()) = Some((after.clone(), current));
            // Nothing in (base, current]: the engine may record `current` as the base now and then, so a quiet
            // table's position survives restarts longer than the retention period.
            let advance = (current > base).then(|| CtPosition::Changes { base: current, last: None }.to_json());
            return Ok(Fetched { advance, ..Fetched::default() });
        }
        let changes = read.rows.iter().map(|r| self.change(r, shape)).collect::<Result<Vec<_>, _>>()?;
        let last = if read.rows.len() >= limit {
            let r = read.rows.last().map(|r| Last { version: r.version, key: r.key.clone() });
            CtPosition::Changes { base, last: r }
        } else {
            // Drained: everything up to the version this statement started at is delivered.
            CtPosition::Changes { base: current.max(base), last: None }
        };
        Ok(Fetched { changes, last: Some(last.to_json()), advance: None })
    }

    /// Re-reads `(after, until]` of the change stream; the lost-position rules are the fetch's.
    async fn range(
        &self,
        shape: &CtShape,
        base: i64,
        last: Option<&Last>,
        until: Until<'_>,
        limit: usize,
    ) -> Result<Result<Vec<Change>, Read>, SourceError> {
        let mut base = base;
        let mut read = self.read(shape, base, last, Some(until), limit).await?;
        if !self.liveness(&read, base)? {
            match last {
                Some(l) if read.min_valid.is_some_and(|m| l.version > m) => {
                    base = l.version - 1;
                    read = self.read(shape, base, last, Some(until), limit).await?;
                    if !self.liveness(&read, base)? {
                        return Ok(Err(read));
                    }
                }
                _ => return Ok(Err(read)),
            }
        }
        Ok(Ok(read.rows.iter().map(|r| self.change(r, shape)).collect::<Result<Vec<_>, _>>()?))
    }
}

#[async_trait::async_trait]
impl Source for MssqlChangeTracking {
    /// Ordered by change-tracking version (the last change's, or the base's) when the two differ.
    fn position_order(&self, a: &Position, b: &Position) -> Option<std::cmp::Ordering> {
        let version = |p: &Position| {
            let last = p.get("last").and_then(|l| l.get("version")).and_then(Position::as_i64);
            last.or_else(|| p.get("base")?.as_i64()).map(i128::from)
        };
        crate::source::order_by_leading_integer(a, b, version)
    }

    /// One version before the smallest (`position.rs`, `ct_no_later_than`).
    async fn no_later_than(&self, positions: &[Position]) -> Result<Option<Position>, SourceError> {
        Ok(crate::source::mssql::position::ct_no_later_than(positions))
    }

    fn name(&self) -> String {
        format!("mssql-change-tracking:{}", self.spec.table)
    }

    fn fingerprint(&self) -> String {
        crate::source::fingerprint(&self.spec, None)
    }

    async fn validate(&self) -> Result<(), SourceError> {
        self.shape().await.map(|_| ())
    }

    async fn start_position(&self, from: StartFrom) -> Result<Position, SourceError> {
        self.shape().await?;
        let (min_valid, current) = self.versions().await?;
        let pos = match from {
            // What the official trigger does: replay everything retention still holds.
            StartFrom::Earliest => CtPosition::Changes { base: min_valid, last: None },
            // `Snapshot`: the live path follows the changes after the current version, and the engine backfills
            // the rows as they are at or below it (`backfill_start` takes it as the bound). Functions whose state
            // was written in the walk phase before backfills existed go on walking (`fetch`, `snapshot`).
            StartFrom::Now | StartFrom::Snapshot => CtPosition::Changes { base: current, last: None },
        };
        Ok(pos.to_json())
    }

    async fn fetch(&self, after: &Position, limit: usize) -> Result<Fetched, SourceError> {
        let shape = self.shape().await?;
        let limit = limit.max(1);
        match self.parse(after).await? {
            CtPosition::Changes { base, last } => self.fetch_changes(shape, after, base, last.as_ref(), limit).await,
            CtPosition::Snapshot { base, key } => {
                let (changes, last_key) = self.walk(shape, key.as_deref(), None, limit).await?;
                if changes.is_empty() {
                    // The walk is complete: continue with the changes made since it began.
                    let next = CtPosition::Changes { base, last: None }.to_json();
                    return self.fetch_changes(shape, &next, base, None, limit).await;
                }
                Ok(self.walk_result(changes, last_key, base, limit))
            }
        }
    }

    async fn refetch(&self, after: &Position, upto: &Position, limit: usize) -> Result<Fetched, SourceError> {
        let shape = self.shape().await?;
        let limit = limit.max(1);
        let from = self.parse(after).await?;
        let to = CtPosition::parse(upto, shape.key.len(), &self.table_text())?.ok_or_else(|| {
            SourceError::Invalid("a batch in flight has no end position; reset the function's state".into())
        })?;
        let changes = match (&from, &to) {
            (CtPosition::Snapshot { key: a, .. }, CtPosition::Snapshot { key: u, .. }) => {
                self.walk(shape, a.as_deref(), u.as_deref(), limit).await?.0
            }
            (CtPosition::Snapshot { base, key }, CtPosition::Changes { base: ub, last: ul }) => {
                let mut changes = self.walk(shape, key.as_deref(), None, limit).await?.0;
                let until = match ul {
                    Some(l) => Some(Until::Key(l)),
                    None if ub > base => Some(Until::Version(*ub)),
                    None => None,
                };
                if let (Some(until), true) = (until, changes.len() < limit) {
                    match self.range(shape, *base, None, until, limit - changes.len()).await? {
                        Ok(more) => changes.extend(more),
                        Err(read) => return Err(self.lost(*base, read.min_valid)),
                    }
                }
                changes
            }
            // The batch was a resync walk: walk again up to where it ended.
            (CtPosition::Changes { .. }, CtPosition::Snapshot { key, .. }) => {
                self.walk(shape, None, key.as_deref(), limit).await?.0
            }
            (CtPosition::Changes { base, last }, CtPosition::Changes { base: ub, last: ul }) => {
                let until = match ul {
                    Some(l) => Until::Key(l),
                    None => Until::Version(*ub),
                };
                match self.range(shape, *base, last.as_ref(), until, limit).await? {
                    Ok(changes) => changes,
                    Err(_) if self.options.on_position_lost == OnPositionLost::Resync => {
                        self.walk(shape, None, None, limit).await?.0
                    }
                    Err(read) => return Err(self.lost(*base, read.min_valid)),
                }
            }
        };
        // Re-deliveries keep the batch's recorded end; `last` is informational here.
        Ok(Fetched { changes, last: Some(upto.clone()), advance: None })
    }

    async fn pending(&self, after: &Position) -> Result<u64, SourceError> {
        self.count_pending(after).await
    }

    async fn oldest_pending_age(&self, after: &Position) -> Result<Lag, SourceError> {
        self.date_oldest_pending(after).await
    }

    async fn backfill_start(
        &self,
        checkpoint: &Position,
        filter: Option<&Filter>,
    ) -> Result<BackfillPlan, SourceError> {
        self.start_backfill(checkpoint, filter).await
    }

    /// Its rule needs no live position: the version bound leaves every key the live path owes to it.
    async fn backfill_chunk(
        &self,
        r: crate::source::ChunkRequest<'_>,
    ) -> Result<crate::source::ChunkRead, SourceError> {
        self.read_chunk(&r).await.map(crate::source::ChunkRead::Rows)
    }
}
