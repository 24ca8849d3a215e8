//! PostgreSQL cursor source: a table polled by `(cursor, primary key)` keyset with a late-commit guard.
//!
//! The recommended cursor is an `xid8` column set to `pg_current_xact_id()` on every insert and update
//! (a default plus a trigger). Reading only below `pg_snapshot_xmin(pg_current_snapshot())` means a row is
//! read only once no transaction that could still commit an older cursor value is running, so a transaction
//! that commits late is delivered rather than skipped. Timestamp cursors get a safety lag instead (documented
//! as best effort); other cursor types must opt out of the guard explicitly with `cursorGuard: none`.
//!
//! Item JSON is built by PostgreSQL (`row_to_json`): numerics keep every digit, timestamps are ISO 8601,
//! json/jsonb stay JSON, and bytea is sent as base64 like the official trigger's binary columns.
//!
//! The lag (status) dates the first pending row: a timestamp cursor by its own value, any other cursor by the
//! commit timestamp of the row's last writer, which PostgreSQL keeps only with `track_commit_timestamp = on`.
//!
//! A partition (`spec.partition`) reads only the keys whose hash modulo the partition count is its index, in
//! every statement that reads or counts changes (sql.rs, `Shape::partition_expression`); at first use the plan
//! of its fetch is checked for the index that keeps it a range scan, and the catalog says what is missing
//! (`index_advice.rs`; docs/postgres.md, "Partitions").
//!
//! # Layout
//! [`PostgresCursor`] holds the parts and answers [`Source`]; each part is a file that owns what it keeps:
//! `connection` (the pool, failures in the source's words, `EXPLAIN`), `discover` (the table's [`Shape`], checked
//! on first use, with `index_advice` for a partition's plan), `sql` (every live statement), `position` (stored
//! positions' texts), `position_order` (the earliest of several checkpoints), `backfill` (the chunks, and the
//! column types a filter needs). The files below `mod.rs` import only from each other, downward.

mod backfill;
mod connection;
mod discover;
mod index_advice;
pub(crate) mod position;
mod position_order;
mod sql;

pub use sql::Guard;

use super::{BackfillPlan, ChunkRead, ChunkRequest, Fetched, Filter, Lag, Position, Source, SourceError, StartFrom};
use crate::change::{Change, Operation};
use crate::config::{PostgresCursorOptions, SourceSpec};
use crate::db::postgres::PostgresTls;
use backfill::Backfill;
use connection::Connection;
use sql::{Age, Shape};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::OnceCell;
use tokio_postgres::types::ToSql;

/// The cursor source of one function: its configuration, its [`Connection`], the table's [`Shape`] (discovered on
/// first use), its [`Backfill`], and whether the log already said why the lag is unknown. Built by `app.rs` from
/// the `postgres-cursor` variant of `SourceOptions`; called by the engine through [`Source`].
#[derive(Debug)]
pub struct PostgresCursor {
    spec: SourceSpec,
    options: PostgresCursorOptions,
    conn: Connection,
    shape: OnceCell<Shape>,
    backfill: Backfill,
    /// Whether the log already said why the lag is unknown: status is polled every few seconds, and the reason
    /// (a server setting) does not change until a restart.
    lag_reason_logged: AtomicBool,
}

impl PostgresCursor {
    /// Builds the source from its spec and the `postgres-cursor` keys of it, without connecting: the pool opens
    /// connections on first use, through `tls`.
    pub fn new(spec: SourceSpec, options: PostgresCursorOptions, tls: &PostgresTls) -> Result<Self, SourceError> {
        let conn = Connection::new(&spec, tls)?;
        Ok(Self {
            spec,
            options,
            conn,
            shape: OnceCell::new(),
            backfill: Backfill::default(),
            lag_reason_logged: AtomicBool::new(false),
        })
    }

    async fn shape(&self) -> Result<&Shape, SourceError> {
        self.shape.get_or_try_init(|| discover::discover(&self.conn, &self.spec, &self.options)).await
    }

    /// The plan PostgreSQL chooses now for the fetch after `after` (`null`: from the beginning), as
    /// `EXPLAIN (FORMAT JSON)` gives it: for tests and diagnosis of a partition's index.
    pub async fn explain_fetch(&self, after: &Position, limit: usize) -> Result<serde_json::Value, SourceError> {
        let shape = self.shape().await?;
        let limit = limit as i64;
        if after.is_null() {
            return self.conn.explain(&shape.fetch_first(), &[&limit], false).await;
        }
        let texts = self.position_texts(shape, after)?;
        let mut params: Vec<&(dyn ToSql + Sync)> = texts.iter().map(|t| t as &(dyn ToSql + Sync)).collect();
        params.push(&limit);
        self.conn.explain(&shape.fetch_after(), &params, false).await
    }

    /// The texts of a stored position, checked against the key's arity.
    fn position_texts(&self, shape: &Shape, p: &Position) -> Result<Vec<String>, SourceError> {
        position::checkpoint_texts(shape, &self.spec.table.to_string(), p)
    }

    async fn run(&self, statement: &str, texts: &[String], limit: Option<i64>) -> Result<Fetched, SourceError> {
        let shape = self.shape().await?;
        let client = self.conn.client().await?;
        let stmt = client.prepare_cached(statement).await.map_err(|e| self.conn.error(e))?;
        let mut params: Vec<&(dyn ToSql + Sync)> = texts.iter().map(|t| t as &(dyn ToSql + Sync)).collect();
        if let Some(limit) = &limit {
            params.push(limit);
        }
        let rows = client.query(&stmt, &params).await.map_err(|e| self.conn.error(e))?;
        let arity = shape.position_arity();
        let mut changes = Vec::with_capacity(rows.len());
        let mut last = None;
        for (i, row) in rows.iter().enumerate() {
            let code: i32 = row.get(arity);
            let item: String = row.get(arity + 1);
            let operation = Operation::from_code(code.into())
                .ok_or_else(|| SourceError::Invalid(format!("unexpected operation code {code}")))?;
            changes.push(
                Change::from_json(operation, item)
                    .map_err(|e| SourceError::Invalid(format!("PostgreSQL returned invalid row JSON: {e}")))?,
            );
            if i + 1 == rows.len() {
                let texts: Vec<serde_json::Value> =
                    (0..arity).map(|c| serde_json::Value::String(row.get::<_, String>(c))).collect();
                last = Some(serde_json::Value::Array(texts));
            }
        }
        Ok(Fetched { changes, last, advance: None })
    }
}

#[async_trait::async_trait]
impl Source for PostgresCursor {
    /// Positions are the cursor's text then the key's: ordered here only when both cursors read as integers
    /// (xid8, bigint), the cursor types whose text order is not the database's.
    fn position_order(&self, a: &Position, b: &Position) -> Option<std::cmp::Ordering> {
        super::order_by_leading_integer(a, b, |p| p.as_array()?.first()?.as_str()?.parse().ok())
    }

    /// Ordered by the database (`position_order.rs`): checkpoints of one transaction step back one cursor unit.
    async fn no_later_than(&self, positions: &[Position]) -> Result<Option<Position>, SourceError> {
        if positions.iter().any(serde_json::Value::is_null) {
            return Ok(Some(Position::Null));
        }
        position_order::no_later_than(&self.conn, self.shape().await?, positions).await
    }

    fn name(&self) -> String {
        format!("postgres-cursor:{}", self.spec.table)
    }

    fn fingerprint(&self) -> String {
        super::fingerprint(&self.spec, Some(self.options.cursor_column.as_str()))
    }

    async fn validate(&self) -> Result<(), SourceError> {
        self.shape().await.map(|_| ())
    }

    async fn start_position(&self, from: StartFrom) -> Result<Position, SourceError> {
        match from {
            StartFrom::Earliest => Ok(Position::Null),
            // The rows that exist come through a backfill bounded by this position (the engine starts it).
            StartFrom::Snapshot => backfill::snapshot_position(&self.conn, self.shape().await?).await,
            StartFrom::Now => {
                let shape = self.shape().await?;
                let client = self.conn.client().await?;
                let rows = client.query(&shape.newest(), &[]).await.map_err(|e| self.conn.error(e))?;
                Ok(match rows.first() {
                    Some(row) => serde_json::Value::Array(
                        (0..shape.position_arity())
                            .map(|c| serde_json::Value::String(row.get::<_, String>(c)))
                            .collect(),
                    ),
                    None => Position::Null,
                })
            }
        }
    }

    async fn backfill_start(
        &self,
        checkpoint: &Position,
        filter: Option<&Filter>,
    ) -> Result<BackfillPlan, SourceError> {
        self.backfill.start(&self.conn, self.shape().await?, checkpoint, filter).await
    }

    async fn backfill_chunk(&self, r: ChunkRequest<'_>) -> Result<ChunkRead, SourceError> {
        self.backfill.chunk(&self.conn, self.shape().await?, &r).await.map(ChunkRead::Rows)
    }

    async fn fetch(&self, after: &Position, limit: usize) -> Result<Fetched, SourceError> {
        let shape = self.shape().await?;
        let limit = Some(limit as i64);
        if after.is_null() {
            return self.run(&shape.fetch_first(), &[], limit).await;
        }
        let texts = self.position_texts(shape, after)?;
        self.run(&shape.fetch_after(), &texts, limit).await
    }

    async fn refetch(&self, after: &Position, upto: &Position, limit: usize) -> Result<Fetched, SourceError> {
        let shape = self.shape().await?;
        let upto_texts = self.position_texts(shape, upto)?;
        let limit = Some(limit as i64);
        if after.is_null() {
            return self.run(&shape.fetch_range_first(), &upto_texts, limit).await;
        }
        let mut texts = self.position_texts(shape, after)?;
        texts.extend(upto_texts);
        self.run(&shape.fetch_range(), &texts, limit).await
    }

    async fn pending(&self, after: &Position) -> Result<u64, SourceError> {
        let shape = self.shape().await?;
        let client = self.conn.client().await?;
        let row = if after.is_null() {
            client.query_one(&shape.pending_all(), &[]).await
        } else {
            let texts = self.position_texts(shape, after)?;
            let params: Vec<&(dyn ToSql + Sync)> = texts.iter().map(|t| t as &(dyn ToSql + Sync)).collect();
            client.query_one(&shape.pending_after(), &params).await
        }
        .map_err(|e| self.conn.error(e))?;
        Ok(row.get::<_, i64>(0).max(0) as u64)
    }

    async fn oldest_pending_age(&self, after: &Position) -> Result<Lag, SourceError> {
        let shape = self.shape().await?;
        let client = self.conn.client().await?;
        let table = &self.spec.table;
        let dated = match shape.age {
            Age::Cursor { .. } => true,
            // Asked every time: the setting changes only with a restart, which this process would not notice.
            Age::CommitTimestamp => {
                client.query_one(sql::COMMIT_TIMESTAMPS, &[]).await.map_err(|e| self.conn.error(e))?.get::<_, bool>(0)
            }
        };
        let row = if after.is_null() {
            client.query_opt(&shape.oldest_first(dated), &[]).await
        } else {
            let texts = self.position_texts(shape, after)?;
            let params: Vec<&(dyn ToSql + Sync)> = texts.iter().map(|t| t as &(dyn ToSql + Sync)).collect();
            client.query_opt(&shape.oldest_after(dated), &params).await
        }
        .map_err(|e| self.conn.error(e))?;
        let Some(row) = row else { return Ok(Lag::CaughtUp) };
        let seconds: Option<f64> = row.get(0);
        if let Some(age) = seconds.and_then(|s| Duration::try_from_secs_f64(s.max(0.0)).ok()) {
            return Ok(Lag::Behind(age));
        }
        let reason = match (dated, shape.age) {
            (false, _) => format!(
                "cursorColumn {} is not a time and track_commit_timestamp is off, so PostgreSQL does not record when a change was committed; turn it on (ALTER SYSTEM SET track_commit_timestamp = on, then restart PostgreSQL; on Azure set the server parameter) or use a timestamptz cursor",
                shape.cursor
            ),
            (true, Age::CommitTimestamp) => "the first pending change has no recorded commit timestamp: it was committed before track_commit_timestamp was turned on, or its timestamp was already truncated; the lag is known again once it is delivered".to_string(),
            (true, Age::Cursor { .. }) => format!("the first pending change's {} is not a finite time", shape.cursor),
        };
        if !self.lag_reason_logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(table = %table, "the lag of this function is unknown: {reason}");
        }
        Ok(Lag::Unknown(reason))
    }
}
