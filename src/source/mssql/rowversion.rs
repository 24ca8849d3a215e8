//! The rowversion source: a table polled by `(rowversion, key)` keyset below `MIN_ACTIVE_ROWVERSION()`.
//!
//! For tables where change tracking cannot be turned on. Every insert and update sets a `rowversion`
//! column; reading only rows below `MIN_ACTIVE_ROWVERSION()` (the lowest rowversion of any open
//! transaction) means a transaction that commits late is read, not skipped. A hard delete leaves no row to
//! read, so deletes are seen only through a soft-delete column (`softDeleteColumn`). Without
//! `insertedColumn` every change is an Update (1); with it, rows created since the backlog began are Inserts:
//! the base rowversion stays fixed while a backlog is paged, as the change-tracking source's base does, and
//! moves to the last delivered rowversion when a read drains the backlog.

use super::backfill;
use super::catalog::{big, int, one_row, required, text};
use super::position::RvPosition;
use super::read::Reads;
use super::schema::{self, ColumnFacts};
use super::sql::{After, Labels, PartitionFilter, RvShape, Slot, Statement};
use crate::change::{Change, Operation};
use crate::config::{RowversionOptions, SourceSpec};
use crate::db::mssql::{Param, Pool, Settings};
use crate::ident::Ident;
use crate::source::{
    BackfillPlan, ChunkRead, ChunkRequest, Fetched, Filter, Lag, Position, Source, SourceError, StartFrom,
};
use tokio::sync::OnceCell;

/// The rowversion source of one function: its configuration, its pool, and the table's shape (discovered on
/// first use). Built by `app.rs` from the `mssql-rowversion` variant of `SourceOptions`; called by the engine
/// through [`Source`].
#[derive(Debug)]
pub struct MssqlRowversion {
    spec: SourceSpec,
    options: RowversionOptions,
    pool: Pool,
    /// The table's shape, and every column of it with its type (what a backfill's filter is checked against).
    shape: OnceCell<(RvShape, Vec<ColumnFacts>)>,
}

impl MssqlRowversion {
    /// Parses the connection string; connects on first use.
    pub fn new(spec: SourceSpec, options: RowversionOptions) -> Result<Self, SourceError> {
        let settings = Settings::parse(&spec.connection_setting, &spec.connection).map_err(SourceError::Invalid)?;
        Ok(Self { spec, options, pool: Pool::new(settings), shape: OnceCell::new() })
    }

    async fn shape(&self) -> Result<&RvShape, SourceError> {
        Ok(&self.discovered().await?.0)
    }

    async fn discovered(&self) -> Result<&(RvShape, Vec<ColumnFacts>), SourceError> {
        self.shape
            .get_or_try_init(|| async {
                let db = super::catalog::database(&self.pool).await?;
                let facts = super::catalog::table(&self.pool, &self.spec.table).await?;
                schema::readable_table(&self.spec, &db, &facts)?;
                let columns = super::catalog::columns(&self.pool, &self.spec.table).await?;
                let shape = schema::rowversion_shape(&self.spec, &self.options, &db, &facts, &columns)?;
                self.check_partition(&shape).await?;
                Ok((shape, columns))
            })
            .await
    }

    /// A partitioned source checks its partition column (refusing one that could leave keys unread) and warns,
    /// once per process and table, when a partition's fetch cannot be an index seek.
    async fn check_partition(&self, shape: &RvShape) -> Result<(), SourceError> {
        let Some(partition) = self.spec.partition.filter(|p| p.count.get() > 1) else { return Ok(()) };
        let warning = match &shape.partition {
            Some(PartitionFilter::Column(column)) => {
                let facts = super::catalog::partition_column(&self.pool, &shape.table, column, &shape.version).await?;
                schema::check_partition_column(shape, partition, facts.as_ref())?
            }
            _ => schema::inline_partition_warning(shape, partition),
        };
        if let Some(warning) = warning {
            static WARNED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
            let mut warned = WARNED.lock().unwrap_or_else(|p| p.into_inner());
            if !warned.contains(&warning) {
                tracing::warn!(table = %shape.table, partitions = partition.count.get(), "{warning}");
                warned.push(warning);
            }
        }
        Ok(())
    }

    fn bind(
        &self,
        s: &Statement,
        after: Option<&RvPosition>,
        upto: Option<&RvPosition>,
        limit: i64,
    ) -> Result<Vec<Param>, SourceError> {
        let missing =
            |what: &str| SourceError::Invalid(format!("internal error: statement parameter {what} has no value"));
        s.slots
            .iter()
            .map(|slot| {
                Ok(match slot {
                    Slot::AfterVersion => Param::Int(after.map(|a| a.rv).ok_or_else(|| missing("after rowversion"))?),
                    Slot::AfterKey(i) => Param::Text(
                        after
                            .and_then(|a| a.key.as_ref())
                            .and_then(|k| k.get(*i))
                            .cloned()
                            .ok_or_else(|| missing("after key"))?,
                    ),
                    Slot::UptoVersion => Param::Int(upto.map(|u| u.rv).ok_or_else(|| missing("upto rowversion"))?),
                    Slot::UptoKey(i) => Param::Text(
                        upto.and_then(|u| u.key.as_ref())
                            .and_then(|k| k.get(*i))
                            .cloned()
                            .ok_or_else(|| missing("upto key"))?,
                    ),
                    Slot::Base => Param::Int(after.map(RvPosition::base).ok_or_else(|| missing("base rowversion"))?),
                    Slot::Limit => Param::Int(limit),
                    Slot::PartitionIndex => {
                        Param::Int(self.spec.partition.map(|p| i64::from(p.index)).ok_or_else(|| missing("partition"))?)
                    }
                    Slot::PartitionCount => Param::Int(
                        self.spec.partition.map(|p| i64::from(p.count.get())).ok_or_else(|| missing("partitions"))?,
                    ),
                    Slot::Table
                    | Slot::Context
                    | Slot::PartitionColumnName
                    | Slot::VersionColumnName
                    | Slot::Bound
                    | Slot::Filter(_) => return Err(missing("of another statement")),
                })
            })
            .collect()
    }

    fn after_kind(p: Option<&RvPosition>) -> After {
        match p {
            None => After::Start,
            Some(RvPosition { key: None, .. }) => After::Version,
            Some(_) => After::Key,
        }
    }

    async fn read(
        &self,
        after: Option<&RvPosition>,
        upto: Option<&RvPosition>,
        limit: usize,
    ) -> Result<Fetched, SourceError> {
        let shape = self.shape().await?;
        // Base 0 is "before everything": the first backlog, where every row is new.
        let labels = if after.is_none_or(|a| a.base() == 0) { Labels::All } else { Labels::Since };
        let s = shape.changes(Self::after_kind(after), upto.is_some(), labels);
        let limit = limit.max(1);
        let params = self.bind(&s, after, upto, limit as i64)?;
        let ctx = "reading changed rows";
        let rows = self.pool.query(&s.sql, &params, ctx).await?;
        let mut changes = Vec::with_capacity(rows.len());
        let mut last = None;
        for r in &rows {
            let code = required(int(r, 1, ctx)?, "OP", ctx)?;
            let op = Operation::from_code(code.into())
                .ok_or_else(|| SourceError::Invalid(format!("unexpected operation code {code} from SQL Server")))?;
            let item = required(text(r, 2, ctx)?, "ITEM", ctx)?;
            changes.push(
                Change::from_json(op, item)
                    .map_err(|e| SourceError::Invalid(format!("SQL Server returned invalid row JSON: {e}")))?,
            );
            let key = (0..shape.key.len())
                .map(|k| required(text(r, 3 + k, ctx)?, "key text", ctx))
                .collect::<Result<Vec<_>, _>>()?;
            last = Some(RvPosition { rv: required(big(r, 0, ctx)?, "RV", ctx)?, key: Some(key), base: None });
        }
        // A full batch stays in the backlog, under its base; a drained read ends it, and the next one starts
        // from the last delivered rowversion (`base: None`).
        if rows.len() >= limit {
            if let Some(l) = last.as_mut() {
                l.base = Some(after.map_or(0, RvPosition::base));
            }
        }
        Ok(Fetched { changes, last: last.map(|l| l.to_json()), advance: None })
    }

    fn parse(&self, p: &Position, shape: &RvShape) -> Result<Option<RvPosition>, SourceError> {
        RvPosition::parse(p, shape.key.len(), &self.spec.table.to_string())
    }
}

#[async_trait::async_trait]
impl Source for MssqlRowversion {
    /// Ordered by the rowversion (`rv`) when the two differ.
    fn position_order(&self, a: &Position, b: &Position) -> Option<std::cmp::Ordering> {
        crate::source::order_by_leading_integer(a, b, |p| p.get("rv")?.as_i64().map(i128::from))
    }

    /// One version before the smallest (`position.rs`, `rv_no_later_than`).
    async fn no_later_than(&self, positions: &[Position]) -> Result<Option<Position>, SourceError> {
        Ok(crate::source::mssql::position::rv_no_later_than(positions))
    }

    fn name(&self) -> String {
        format!("mssql-rowversion:{}", self.spec.table)
    }

    fn fingerprint(&self) -> String {
        let cursor = self.options.cursor_column.as_ref().map(Ident::as_str).unwrap_or("(rowversion)");
        crate::source::fingerprint(&self.spec, Some(cursor))
    }

    async fn validate(&self) -> Result<(), SourceError> {
        self.shape().await.map(|_| ())
    }

    async fn start_position(&self, from: StartFrom) -> Result<Position, SourceError> {
        self.shape().await?;
        match from {
            // Every current row, in rowversion order, as changes.
            StartFrom::Earliest => Ok(Position::Null),
            // The newest position below the guard: the live path starts there, and the engine backfills the rows
            // at or below it (`backfill_start` takes this position's rowversion as the bound).
            StartFrom::Now | StartFrom::Snapshot => {
                let ctx = "reading the newest rowversion";
                let s = RvShape::newest();
                let row = one_row(self.pool.query(&s.sql, &[], ctx).await?, ctx)?;
                Ok(RvPosition { rv: required(big(&row, 0, ctx)?, "RV", ctx)?, key: None, base: None }.to_json())
            }
        }
    }

    async fn fetch(&self, after: &Position, limit: usize) -> Result<Fetched, SourceError> {
        let shape = self.shape().await?;
        let after = self.parse(after, shape)?;
        self.read(after.as_ref(), None, limit).await
    }

    async fn refetch(&self, after: &Position, upto: &Position, limit: usize) -> Result<Fetched, SourceError> {
        let shape = self.shape().await?;
        let after = self.parse(after, shape)?;
        let upto = self.parse(upto, shape)?;
        if upto.as_ref().is_some_and(|u| u.key.is_none()) || upto.is_none() {
            return Err(SourceError::Invalid(
                "a batch in flight ends at a position without a key; reset the function's state".into(),
            ));
        }
        let mut fetched = self.read(after.as_ref(), upto.as_ref(), limit).await?;
        fetched.last = upto.map(|u| u.to_json());
        Ok(fetched)
    }

    async fn pending(&self, after: &Position) -> Result<u64, SourceError> {
        let shape = self.shape().await?;
        let after = self.parse(after, shape)?;
        let s = shape.pending(Self::after_kind(after.as_ref()));
        let params = self.bind(&s, after.as_ref(), None, 0)?;
        let ctx = "counting changed rows";
        let row = one_row(self.pool.query(&s.sql, &params, ctx).await?, ctx)?;
        Ok(big(&row, 0, ctx)?.unwrap_or(0).max(0) as u64)
    }

    /// The bound is the live checkpoint's rowversion (docs/architecture.md, "Backfill"); `Null` (nothing
    /// delivered yet): the live path reads every row from the start, so there is nothing to backfill.
    async fn backfill_start(
        &self,
        checkpoint: &Position,
        filter: Option<&Filter>,
    ) -> Result<BackfillPlan, SourceError> {
        let (shape, columns) = self.discovered().await?;
        let table = self.spec.table.to_string();
        let checked = backfill::check_filter(filter, &table, columns)?;
        let Some(at) = self.parse(checkpoint, shape)? else {
            return Ok(BackfillPlan { bound: Position::Null, estimate: Some(0) });
        };
        let bound = Position::from(at.rv);
        let s = shape.backfill_estimate(checked.as_ref());
        let whole = backfill::whole(&bound, filter);
        let params = backfill::bind(&s, &whole, (shape.key.len(), &table), checked.as_ref(), self.spec.partition)?;
        let estimate = backfill::estimate(&self.pool, &s, params).await?;
        Ok(BackfillPlan { bound, estimate: Some(estimate) })
    }

    /// Its rule needs no live position: the rowversion bound leaves every row written since the start to the
    /// live path.
    async fn backfill_chunk(&self, r: ChunkRequest<'_>) -> Result<ChunkRead, SourceError> {
        self.read_chunk(&r).await.map(ChunkRead::Rows)
    }

    /// A rowversion is a counter, not a time, and SQL Server keeps no commit time for it: the lag is unknown.
    async fn oldest_pending_age(&self, _after: &Position) -> Result<Lag, SourceError> {
        Ok(Lag::Unknown(
            "a rowversion says in what order rows changed, not when, and SQL Server records no commit time for it; use the change-tracking source (mssql-change-tracking) for a lag".into(),
        ))
    }
}

impl MssqlRowversion {
    /// A chunk of the backfill bounded by `bound` (see docs/architecture.md, "Backfill").
    async fn read_chunk(&self, r: &ChunkRequest<'_>) -> Result<Fetched, SourceError> {
        let (shape, columns) = self.discovered().await?;
        let table = self.spec.table.to_string();
        let filter = backfill::check_filter(r.filter, &table, columns)?;
        let s = shape.backfill_chunk(r, filter.as_ref());
        let params = backfill::bind(&s, r, (shape.key.len(), &table), filter.as_ref(), self.spec.partition)?;
        backfill::read(&self.pool, &s, params, shape.key.len()).await
    }
}
