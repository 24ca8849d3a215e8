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

mod backfill;
mod index_advice;
pub(crate) mod position;
mod position_order;
mod sql;

pub use sql::Guard;

use super::{Fetched, Lag, Position, Source, SourceError, StartFrom};
use crate::change::{Change, Operation};
use crate::config::{CursorGuard, Partition, PostgresCursorOptions, SourceKind, SourceOptions, SourceSpec};
use crate::db::pools;
use crate::db::postgres::{classify, connect_failure, ConnectFailure, PostgresTls, Verdict};
use crate::ident::Ident;
use deadpool_postgres::Pool;
use sql::{Age, Shape};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::OnceCell;
use tokio_postgres::types::ToSql;

#[derive(Debug)]
pub struct PostgresCursor {
    spec: SourceSpec,
    options: PostgresCursorOptions,
    pool: Pool,
    shape: OnceCell<Shape>,
    /// Whether the log already said why the lag is unknown: status is polled every few seconds, and the reason
    /// (a server setting) does not change until a restart.
    lag_reason_logged: AtomicBool,
    /// Every column and its type, read on a backfill's first use of a filter (`backfill.rs`).
    column_types: OnceCell<Vec<(String, String)>>,
}

impl PostgresCursor {
    /// Builds the source without connecting: the pool opens connections on first use, through `tls`.
    pub fn new(spec: SourceSpec, tls: &PostgresTls) -> Result<Self, SourceError> {
        let SourceOptions::PostgresCursor(options) = spec.options.clone() else {
            return Err(super::wrong_kind(&spec, SourceKind::PostgresCursor));
        };
        let pool = pools::postgres(&spec.connection_setting, &spec.connection, tls).map_err(SourceError::Invalid)?;
        Ok(Self {
            spec,
            options,
            pool,
            shape: OnceCell::new(),
            lag_reason_logged: AtomicBool::new(false),
            column_types: OnceCell::new(),
        })
    }

    /// A pooled connection. A certificate that is not trusted or `sslmode=require` against a server without
    /// TLS needs an operator (`Invalid`); anything else may pass on the next tick.
    async fn client(&self) -> Result<deadpool_postgres::Client, SourceError> {
        self.pool.get().await.map_err(|e| match connect_failure(&self.spec.connection_setting, &e) {
            ConnectFailure::Misconfigured(m) => SourceError::Invalid(m),
            ConnectFailure::Unavailable(m) => SourceError::Unavailable(m),
        })
    }

    async fn shape(&self) -> Result<&Shape, SourceError> {
        self.shape.get_or_try_init(|| self.discover()).await
    }

    /// Reads the table's columns and key from the catalog and checks the configuration against them.
    async fn discover(&self) -> Result<Shape, SourceError> {
        let client = self.client().await?;
        let table = &self.spec.table;
        let quoted = table.pg();
        let oid: Option<u32> =
            client.query_one(sql::TABLE_OID, &[&quoted]).await.map_err(|e| db_error(e, table))?.get(0);
        let Some(oid) = oid else {
            return Err(SourceError::Invalid(format!(
                "table {table} does not exist (or the login cannot see it); check tableName and the search_path"
            )));
        };
        let rows = client.query(sql::COLUMNS, &[&oid]).await.map_err(|e| db_error(e, table))?;
        let columns: Vec<(String, String, String)> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
        let not_null: Vec<String> = rows.iter().filter(|r| r.get::<_, bool>(3)).map(|r| r.get(0)).collect();
        let find = |c: &Ident| columns.iter().find(|(n, _, _)| n == c.as_str());
        let missing = |what: &str, c: &Ident| {
            SourceError::Invalid(format!(
                "{what} {:?} is not a column of {table}; column names are case-sensitive",
                c.as_str()
            ))
        };

        let key_names: Vec<Ident> = match &self.spec.primary_key {
            Some(k) => k.clone(),
            None => {
                let rows = client.query(sql::PRIMARY_KEY, &[&oid]).await.map_err(|e| db_error(e, table))?;
                let names: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
                if names.is_empty() {
                    return Err(SourceError::Invalid(format!(
                        "table {table} has no primary key; add one, or name a unique, non-null key in primaryKey"
                    )));
                }
                names.iter().map(|n| Ident::new(n).map_err(SourceError::Invalid)).collect::<Result<_, _>>()?
            }
        };
        let mut key = Vec::new();
        for k in &key_names {
            let (_, ty, typname) = find(k).ok_or_else(|| missing("primary key column", k))?;
            if let Some(p) = self.spec.partition {
                partition_key_fits(table, p, k, typname, not_null.iter().any(|n| n == k.as_str()))?;
            }
            key.push((k.clone(), ty.clone()));
        }

        let cursor = self.options.cursor_column.clone();
        let (_, cursor_type, cursor_typname) = find(&cursor).ok_or_else(|| missing("cursorColumn", &cursor))?.clone();
        let guard = match (self.options.cursor_guard, cursor_typname.as_str()) {
            (None | Some(CursorGuard::Xid8), "xid8") => Guard::Xid8,
            (Some(CursorGuard::Xid8), other) => {
                return Err(SourceError::Invalid(format!(
                    "cursorGuard xid8 needs an xid8 cursor column, but {cursor} is {other}"
                )))
            }
            (None | Some(CursorGuard::Lag), "timestamptz" | "timestamp") => Guard::Lag {
                seconds: self.options.safety_lag.as_secs_f64(),
                with_time_zone: cursor_typname == "timestamptz",
            },
            (Some(CursorGuard::Lag), other) => {
                return Err(SourceError::Invalid(format!("cursorGuard lag needs a timestamp cursor column, but {cursor} is {other}")))
            }
            (Some(CursorGuard::Unguarded), "xid8" | "timestamptz" | "timestamp" | "int2" | "int4" | "int8" | "numeric") => Guard::None,
            (None, "int2" | "int4" | "int8" | "numeric") => {
                return Err(SourceError::Invalid(format!(
                    "cursorColumn {cursor} is {cursor_typname}: a value assigned before commit can become visible after newer values were read, and that row would be skipped. Use an xid8 column set to pg_current_xact_id() (exact), or set cursorGuard to none to accept the risk"
                )))
            }
            (_, other) => {
                return Err(SourceError::Invalid(format!(
                    "cursorColumn {cursor} has type {other}; use xid8 (recommended), timestamptz, timestamp or an integer"
                )))
            }
        };

        let wanted = super::item_column_names(&self.spec, columns.iter().map(|(n, _, _)| n.as_str()))?;
        let mut item_columns = Vec::new();
        for c in &wanted {
            let (_, _, typname) = find(c).ok_or_else(|| missing("column", c))?;
            item_columns.push((c.clone(), typname == "bytea"));
        }
        let soft_delete = match &self.options.soft_delete_column {
            Some(c) => {
                let (_, _, typname) = find(c).ok_or_else(|| missing("softDeleteColumn", c))?;
                Some((c.clone(), typname == "bool"))
            }
            None => None,
        };
        if let Some(c) = &self.options.inserted_column {
            let (_, ty, _) = find(c).ok_or_else(|| missing("insertedColumn", c))?;
            if *ty != cursor_type {
                return Err(SourceError::Invalid(format!(
                    "insertedColumn {c} is {ty} but cursorColumn {cursor} is {cursor_type}; they must have the same type"
                )));
            }
        }

        // A keyset walk without a matching index scans the table every batch: warn, since it still works.
        let order: Vec<String> = std::iter::once(cursor.as_str().to_string())
            .chain(key_names.iter().map(|k| k.as_str().to_string()))
            .collect();
        let indexes: Vec<Vec<String>> = client
            .query(sql::INDEX_KEYS, &[&oid])
            .await
            .map_err(|e| db_error(e, table))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        // A partition needs its own index, led by the partition expression: checked on the plan below.
        let keyset_indexed = indexes.iter().any(|ix| ix.len() >= order.len() && ix[..order.len()] == order[..]);
        if self.spec.partition.is_none() && !keyset_indexed {
            tracing::warn!(
                table = %table,
                "no index on ({}); every batch will scan the table. Create one: CREATE INDEX ON {} ({})",
                order.join(", "),
                quoted,
                order.iter().map(|c| format!("\"{}\"", c.replace('"', "\"\""))).collect::<Vec<_>>().join(", ")
            );
        }

        let age = match cursor_typname.as_str() {
            "timestamptz" => Age::Cursor { with_time_zone: true },
            "timestamp" => Age::Cursor { with_time_zone: false },
            _ => Age::CommitTimestamp,
        };
        let shape = Shape {
            table: quoted,
            cursor,
            cursor_type,
            key,
            columns: item_columns,
            soft_delete,
            inserted: self.options.inserted_column.clone(),
            guard,
            age,
            partition: self.spec.partition,
        };
        // The plan check takes a connection of its own: this one goes back first, or N partitions discovering at
        // once over a pool of N would each hold one and wait for a second until the pool's wait timeout.
        drop(client);
        if let Some(p) = self.spec.partition {
            self.check_partition_index(&shape, (p, oid), keyset_indexed).await?;
        }
        Ok(shape)
    }

    /// `EXPLAIN (FORMAT JSON)` of `statement` with `params`, in a transaction that is rolled back;
    /// `discourage_seqscan` sets `enable_seqscan = off` for it, so the planner shows whether any index serves.
    async fn explain(
        &self,
        statement: &str,
        params: &[&(dyn ToSql + Sync)],
        discourage_seqscan: bool,
    ) -> Result<serde_json::Value, SourceError> {
        let table = &self.spec.table;
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| db_error(e, table))?;
        if discourage_seqscan {
            tx.batch_execute("SET LOCAL enable_seqscan = off").await.map_err(|e| db_error(e, table))?;
        }
        let row = tx
            .query_one(&format!("EXPLAIN (FORMAT JSON) {statement}"), params)
            .await
            .map_err(|e| db_error(e, table))?;
        // Read-only: nothing to keep, and the rollback also ends the SET LOCAL.
        let _ = tx.rollback().await;
        let JsonText(text) = row.get(0);
        serde_json::from_str(&text)
            .map_err(|e| SourceError::Unavailable(format!("PostgreSQL returned a plan that is not JSON: {e}")))
    }

    /// The plan PostgreSQL chooses now for the fetch after `after` (`null`: from the beginning), as
    /// `EXPLAIN (FORMAT JSON)` gives it: for tests and diagnosis of a partition's index.
    pub async fn explain_fetch(&self, after: &Position, limit: usize) -> Result<serde_json::Value, SourceError> {
        let shape = self.shape().await?;
        let limit = limit as i64;
        if after.is_null() {
            return self.explain(&shape.fetch_first(), &[&limit], false).await;
        }
        let texts = self.position_texts(shape, after)?;
        let mut params: Vec<&(dyn ToSql + Sync)> = texts.iter().map(|t| t as &(dyn ToSql + Sync)).collect();
        params.push(&limit);
        self.explain(&shape.fetch_after(), &params, false).await
    }

    /// The texts of a stored position, checked against the key's arity.
    fn position_texts(&self, shape: &Shape, p: &Position) -> Result<Vec<String>, SourceError> {
        let texts: Option<Vec<String>> =
            p.as_array().and_then(|a| a.iter().map(|v| v.as_str().map(str::to_string)).collect());
        match texts {
            Some(t) if t.len() == shape.position_arity() => {
                let types = std::iter::once(&shape.cursor_type).chain(shape.key.iter().map(|(_, ty)| ty));
                position::check_iso(position::Stored::Checkpoint, &self.spec.table.to_string(), types, &t)
                    .map_err(SourceError::Invalid)?;
                Ok(t)
            }
            _ => Err(SourceError::Invalid(format!(
                "stored position {p} does not fit {} (expected {} values); reset the function's state",
                self.spec.table,
                shape.position_arity()
            ))),
        }
    }

    async fn run(&self, statement: &str, texts: &[String], limit: Option<i64>) -> Result<Fetched, SourceError> {
        let shape = self.shape().await?;
        let client = self.client().await?;
        let stmt = client.prepare_cached(statement).await.map_err(|e| db_error(e, &self.spec.table))?;
        let mut params: Vec<&(dyn ToSql + Sync)> = texts.iter().map(|t| t as &(dyn ToSql + Sync)).collect();
        if let Some(limit) = &limit {
            params.push(limit);
        }
        let rows = client.query(&stmt, &params).await.map_err(|e| db_error(e, &self.spec.table))?;
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
        self.no_later_than_all(positions).await
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
            StartFrom::Snapshot => self.snapshot_position().await,
            StartFrom::Now => {
                let shape = self.shape().await?;
                let client = self.client().await?;
                let rows = client.query(&shape.newest(), &[]).await.map_err(|e| db_error(e, &self.spec.table))?;
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
        filter: Option<&super::Filter>,
    ) -> Result<super::BackfillPlan, SourceError> {
        self.start_backfill(checkpoint, filter).await
    }

    async fn backfill_chunk(&self, r: super::ChunkRequest<'_>) -> Result<super::ChunkRead, SourceError> {
        self.read_chunk(&r).await.map(super::ChunkRead::Rows)
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
        let client = self.client().await?;
        let row = if after.is_null() {
            client.query_one(&shape.pending_all(), &[]).await
        } else {
            let texts = self.position_texts(shape, after)?;
            let params: Vec<&(dyn ToSql + Sync)> = texts.iter().map(|t| t as &(dyn ToSql + Sync)).collect();
            client.query_one(&shape.pending_after(), &params).await
        }
        .map_err(|e| db_error(e, &self.spec.table))?;
        Ok(row.get::<_, i64>(0).max(0) as u64)
    }

    async fn oldest_pending_age(&self, after: &Position) -> Result<Lag, SourceError> {
        let shape = self.shape().await?;
        let client = self.client().await?;
        let table = &self.spec.table;
        let dated = match shape.age {
            Age::Cursor { .. } => true,
            // Asked every time: the setting changes only with a restart, which this process would not notice.
            Age::CommitTimestamp => {
                client.query_one(sql::COMMIT_TIMESTAMPS, &[]).await.map_err(|e| db_error(e, table))?.get::<_, bool>(0)
            }
        };
        let row = if after.is_null() {
            client.query_opt(&shape.oldest_first(dated), &[]).await
        } else {
            let texts = self.position_texts(shape, after)?;
            let params: Vec<&(dyn ToSql + Sync)> = texts.iter().map(|t| t as &(dyn ToSql + Sync)).collect();
            client.query_opt(&shape.oldest_after(dated), &params).await
        }
        .map_err(|e| db_error(e, table))?;
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

/// A `json` value as its text (`EXPLAIN (FORMAT JSON)` answers in type json, whose wire form is its text).
struct JsonText(String);

impl<'a> tokio_postgres::types::FromSql<'a> for JsonText {
    fn from_sql(
        _: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Self(std::str::from_utf8(raw)?.to_string()))
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        matches!(*ty, tokio_postgres::types::Type::JSON | tokio_postgres::types::Type::TEXT)
    }
}

/// A key column of a partitioned function must hash the same in every session and never be NULL: a key whose
/// hash changes or is NULL would be read by another partition, or by none.
fn partition_key_fits(
    table: &crate::ident::TableName,
    p: Partition,
    column: &Ident,
    typname: &str,
    not_null: bool,
) -> Result<(), SourceError> {
    if !sql::PARTITION_KEY_TYPES.contains(&typname) {
        return Err(SourceError::Invalid(format!(
            "{table} is read in {} partitions, but its key column {column} is {typname}, whose text form is not IMMUTABLE (it can depend on the session's settings), so a key could hash to different partitions and PostgreSQL refuses to index the partition expression (\"functions in index expression must be marked IMMUTABLE\"). Partition by a key of type {}, name such a unique key in primaryKey, or remove \"partitions\"",
            p.count,
            sql::PARTITION_KEY_TYPES.join(", ")
        )));
    }
    if !not_null {
        return Err(SourceError::Invalid(format!(
            "{table} is read in {} partitions, but its key column {column} may be NULL, and a row whose key is NULL hashes to no partition and would never be delivered. Declare it NOT NULL (ALTER TABLE {table} ALTER COLUMN {} SET NOT NULL) or name a non-null unique key in primaryKey",
            p.count,
            column.pg()
        )));
    }
    Ok(())
}

/// A failed statement in the source's words: what waiting fixes is `Unavailable`, the rest says what to change.
fn db_error(e: tokio_postgres::Error, table: &crate::ident::TableName) -> SourceError {
    let Some(db) = e.as_db_error() else {
        return SourceError::Unavailable(format!("PostgreSQL connection failed: {e}"));
    };
    let code = db.code().code();
    let msg = db.message();
    match classify(Some(code)) {
        Verdict::Transient => SourceError::Unavailable(format!("PostgreSQL: {msg} (SQLSTATE {code})")),
        Verdict::Denied => {
            SourceError::Invalid(format!("PostgreSQL: {msg}; grant the login SELECT on {table} (SQLSTATE {code})"))
        }
        Verdict::BadValue | Verdict::Refused => {
            SourceError::Invalid(format!("PostgreSQL: {msg} (SQLSTATE {code}) while reading {table}"))
        }
    }
}
