//! The PostgreSQL upsert sink: each batch applied to a table in one transaction, by the rules of the
//! official SQL output binding (see `upsert`), guarded by the fencing token, and optionally exactly once.
//!
//! One delivery is one transaction, in this order:
//! 1. the fence row of the app/function is raised to the batch's fencing token, or the write is refused
//!    because a newer owner already wrote (first, so its row lock also serializes two owners);
//! 2. with `exactlyOnce`, the checkpoint row is read: if it names this very batch (id and range), the
//!    batch was applied before its acknowledgement was lost, and nothing more is written;
//! 3. deletes by primary key, then upserts (or plain inserts), each a few statements of thousands of rows;
//! 4. with `exactlyOnce`, the checkpoint row is set to this batch;
//! 5. commit. Any error before it rolls everything back: no partial upsert.
//!
//! The table's columns and key are read from the catalog on first use and cached (`super::table`); a rejected
//! write drops the cache, so a schema change is seen by the next attempt.

mod sql;

use super::table::{Dialect, TableSink};
use super::target::{chunk_ranges, chunks, json_array, Target};
use super::upsert::{self, Column, RowGroup, TableShape};
use super::{Applied, Resume, SinkBatch, SinkError};
use crate::config::TableTarget;
use crate::db::postgres::shared_pool;
use crate::db::postgres::{classify, connect_failure, PostgresTls, Verdict};
use crate::ident::{Ident, TableName};
use deadpool_postgres::Pool;
use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::HashMap;
use std::time::Instant;
use tokio_postgres::types::ToSql;

/// Rows per statement unless `maxRowsPerStatement` says otherwise: large enough that the per-statement
/// round trip disappears, small enough that one parameter stays a few megabytes.
pub const DEFAULT_ROWS_PER_STATEMENT: usize = 5000;
/// A statement's JSON parameter stops growing here even if `maxRowsPerStatement` allows more rows.
const MAX_STATEMENT_BYTES: usize = 16 << 20;

/// The PostgreSQL sink.
pub type PostgresSink = TableSink<Postgres>;

/// Builds the sink `spec` names, and its pool, without connecting.
pub fn new(spec: &TableTarget, tls: &PostgresTls) -> Result<PostgresSink, String> {
    let target = Target::new(spec, DEFAULT_ROWS_PER_STATEMENT);
    let pool = shared_pool(&target.setting, &target.connection, tls)?;
    Ok(TableSink::new(target, Postgres { pool }))
}

/// PostgreSQL's way of writing a batch: a pool of connections to the target database.
#[derive(Debug)]
pub struct Postgres {
    pool: Pool,
}

impl Postgres {
    async fn client(&self, target: &Target) -> Result<deadpool_postgres::Client, SinkError> {
        // Transient even when the certificate is not trusted: the batch is fine, so it must not count toward
        // quarantine; the message names the fix and the batch waits in flight until it is made.
        self.pool
            .get()
            .await
            .map_err(|e| SinkError::Transient(connect_failure(&target.setting, &e).message().to_string()))
    }

    /// Creates `table` with `ddl` unless it exists. Checked first, so a login without CREATE rights works
    /// with tables an administrator made.
    async fn ensure(
        &self,
        target: &Target,
        client: &deadpool_postgres::Client,
        table: &TableName,
        ddl: &str,
    ) -> Result<(), SinkError> {
        let oid: Option<u32> =
            client.query_one(sql::TABLE_OID, &[&table.pg()]).await.map_err(|e| error(target, e))?.get(0);
        if oid.is_some() {
            return Ok(());
        }
        match client.batch_execute(ddl).await {
            Ok(()) => {
                tracing::info!(table = %table, "created the sink's bookkeeping table");
                Ok(())
            }
            // Another instance created it at the same moment.
            Err(e) if e.as_db_error().is_some_and(|d| matches!(d.code().code(), "42P07" | "23505")) => Ok(()),
            Err(e) => Err(SinkError::Rejected(format!(
                "cannot create {table} ({}); create it once with a login that may: {ddl}",
                e.as_db_error().map_or_else(|| e.to_string(), |d| d.message().to_string())
            ))),
        }
    }

    /// The first column of `group` whose values in `array` (a failed statement's rows) PostgreSQL cannot
    /// convert to the column's type, found by converting each column alone on the failed write's connection,
    /// once its transaction is rolled back (nothing is written; no second connection of the shared, capped pool
    /// is taken while one is held): a data error does not say which column it came from. `None` when the rows
    /// cannot be read at all, each column converts alone, or the probe cannot run; the refusal then names the
    /// table.
    async fn refused_column(
        client: &tokio_postgres::Client,
        shape: &TableShape,
        group: &RowGroup<'_>,
        array: &str,
    ) -> Option<usize> {
        client.query_one(sql::PROBE_ROWS, &[&array]).await.ok()?;
        for &column in group.columns.iter().filter(|&&i| !shape.columns[i].raw_json) {
            if let Err(e) = client.query_one(&sql::probe(shape, column), &[&array]).await {
                if bad_value(&e) {
                    return Some(column);
                }
            }
        }
        None
    }
}

#[async_trait::async_trait]
impl Dialect for Postgres {
    fn name(&self) -> &'static str {
        "postgres"
    }

    async fn discover(&self, target: &Target) -> Result<TableShape, SinkError> {
        let client = self.client(target).await?;
        let table = &target.table;
        let oid: Option<u32> =
            client.query_one(sql::TABLE_OID, &[&table.pg()]).await.map_err(|e| error(target, e))?.get(0);
        let Some(oid) = oid else {
            return Err(SinkError::Rejected(format!(
                "sink table {table} does not exist (or the login cannot see it); create it, or check the sink's tableName and the search_path"
            )));
        };
        let rows = client.query(sql::COLUMNS, &[&oid]).await.map_err(|e| error(target, e))?;
        let mut columns = Vec::with_capacity(rows.len());
        let mut key: Vec<(i32, usize)> = Vec::new();
        for (i, r) in rows.iter().enumerate() {
            let name: String = r.get(0);
            let typname: String = r.get(2);
            columns.push(Column {
                name: Ident::new(&name).map_err(SinkError::Rejected)?,
                sql_type: r.get(1),
                nullable: !r.get::<_, bool>(3),
                has_default: r.get(4),
                identity: r.get(5),
                generated: r.get(6),
                binary: typname == "bytea",
                // PostgreSQL converts nested JSON into json, jsonb, arrays and text, and refuses it loudly
                // elsewhere: nothing becomes NULL.
                holds_json: true,
                // json takes its value's own text (`\u0000` included); text, jsonb and the rest cannot store
                // U+0000, so the plan refuses such a value for them, naming the column.
                raw_json: typname == "json",
                holds_nul: typname == "json",
                collation: None,
            });
            if let Some(position) = r.get::<_, Option<i32>>(7) {
                key.push((position, i));
            }
        }
        if key.is_empty() {
            return Err(SinkError::Rejected(format!(
                "sink table {table} has no primary key; the sink upserts and deletes by primary key: add one (ALTER TABLE {} ADD PRIMARY KEY (...))",
                table.pg()
            )));
        }
        key.sort_unstable();
        self.ensure(target, &client, &target.fence_table, &sql::create_fence(&target.fence_table)).await?;
        if let Some(checkpoint) = &target.checkpoint_table {
            self.ensure(target, &client, checkpoint, &sql::create_checkpoint(checkpoint)).await?;
        }
        tracing::debug!(table = %table, columns = columns.len(), "discovered the sink table");
        Ok(TableShape { table: table.clone(), columns, key: key.into_iter().map(|(_, i)| i).collect() })
    }

    async fn write(&self, target: &Target, shape: &TableShape, batch: &SinkBatch<'_>) -> Result<(), SinkError> {
        let started = Instant::now();
        let exactly_once = target.checkpoint_table.as_ref().map(|table| (table, (&batch.range.from, &batch.range.to)));
        let plan = upsert::plan(shape, batch.changes).map_err(SinkError::Rejected)?;
        let key = batch.owner_key();
        let fence = i64::try_from(batch.fence).unwrap_or(i64::MAX);
        let err = |e| error(target, e);

        let mut client = self.client(target).await?;
        let tx = client.transaction().await.map_err(err)?;
        let fenced = tx.prepare_cached(&sql::fence(&target.fence_table)).await.map_err(err)?;
        if tx.query(&fenced, &[&key, &fence]).await.map_err(err)?.is_empty() {
            let stored = tx.query_opt(&sql::fence_token(&target.fence_table), &[&key]).await.map_err(err)?;
            let stored = stored.map_or(0, |r| r.get::<_, i64>(0));
            return Err(SinkError::Fenced { ours: batch.fence, stored: u64::try_from(stored).unwrap_or(0) });
        }
        if let Some((table, (from, to))) = exactly_once {
            let read = tx.prepare_cached(&sql::read_checkpoint(table)).await.map_err(err)?;
            if let Some(row) = tx.query_opt(&read, &[&key]).await.map_err(err)? {
                let same = |text: String, position: &Value| {
                    serde_json::from_str::<Value>(&text).ok().as_ref() == Some(position)
                };
                if u64::try_from(row.get::<_, i64>(0)).ok() == Some(batch.range.batch_id)
                    && same(row.get(1), from)
                    && same(row.get(2), to)
                {
                    tx.commit().await.map_err(err)?;
                    tracing::info!(function = batch.function, batch_id = batch.range.batch_id, table = %target.table,
                        "batch already applied (exactly-once checkpoint row); nothing written again");
                    return Ok(());
                }
            }
        }
        if !plan.deletes.is_empty() {
            let statement = tx.prepare_cached(&sql::delete(shape)).await.map_err(err)?;
            for rows in chunks(&plan.deletes, target.max_rows_per_statement, MAX_STATEMENT_BYTES) {
                tx.execute(&statement, &[&rows]).await.map_err(err)?;
            }
        }
        for group in &plan.groups {
            let statement = tx.prepare_cached(&sql::write(shape, group)).await.map_err(err)?;
            let recordset = sql::reads_recordset(shape, group);
            let sizes = (0..group.rows.len()).map(|r| {
                let raw: usize = group.raw.iter().map(|(_, values)| values[r].map_or(0, str::len)).sum();
                if recordset {
                    group.rows[r].len() + raw
                } else {
                    raw
                }
            });
            for rows in chunk_ranges(sizes, target.max_rows_per_statement, MAX_STATEMENT_BYTES) {
                let array = json_array(&group.rows[rows.clone()]);
                let raw: Vec<&[Option<&str>]> = group.raw.iter().map(|(_, values)| &values[rows.clone()]).collect();
                let mut params: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(raw.len() + 1);
                if recordset {
                    params.push(&array);
                }
                params.extend(raw.iter().map(|values| values as &(dyn ToSql + Sync)));
                if let Err(e) = tx.execute(&statement, &params).await {
                    let column = if bad_value(&e) && tx.rollback().await.is_ok() {
                        Self::refused_column(&client, shape, group, &array).await
                    } else {
                        None
                    };
                    return Err(match column {
                        Some(column) => refused_value(target, shape, column, &e, &array),
                        None => err(e),
                    });
                }
            }
        }
        if let Some((table, (from, to))) = exactly_once {
            let batch_id = i64::try_from(batch.range.batch_id).unwrap_or(i64::MAX);
            let rows = i64::try_from(batch.changes.len()).unwrap_or(i64::MAX);
            let record = tx.prepare_cached(&sql::write_checkpoint(table)).await.map_err(err)?;
            tx.execute(&record, &[&key, &batch_id, &from.to_string(), &to.to_string(), &fence, &rows])
                .await
                .map_err(err)?;
        }
        crate::failpoint::hit("sink-before-commit");
        tx.commit().await.map_err(err)?;
        tracing::debug!(function = batch.function, batch_id = batch.range.batch_id, rows = plan.rows(),
            superseded = plan.superseded, deletes = plan.deletes.len(), table = %target.table,
            elapsed_ms = started.elapsed().as_secs_f64() * 1000.0, "batch written");
        Ok(())
    }

    async fn recorded(&self, target: &Target, app: &str, function: &str) -> Result<Resume, SinkError> {
        let key = format!("{app}/{function}");
        let err = |e| error(target, e);
        let client = self.client(target).await?;
        let fence = client.query_opt(&sql::fence_token(&target.fence_table), &[&key]).await.map_err(err)?;
        let fence = fence.map_or(0, |r| u64::try_from(r.get::<_, i64>(0)).unwrap_or(0));
        let Some(table) = &target.checkpoint_table else { return Ok(Resume { fence, applied: None }) };
        let applied = match client.query_opt(&sql::read_checkpoint(table), &[&key]).await.map_err(err)? {
            None => None,
            Some(row) => {
                let position = |n: usize| -> Result<Value, SinkError> {
                    serde_json::from_str(row.get::<_, &str>(n)).map_err(|e| {
                        SinkError::Rejected(format!(
                            "the checkpoint row of {key} in {table} holds a position that is not JSON ({e}); delete the row to start over from startFrom"
                        ))
                    })
                };
                let batch_id = u64::try_from(row.get::<_, i64>(0)).unwrap_or(0);
                Some(Applied { batch_id, from: position(1)?, to: position(2)? })
            }
        };
        Ok(Resume { fence, applied })
    }
}

/// True for a data error (class 22): a value the target cannot take.
fn bad_value(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|d| classify(Some(d.code().code())) == Verdict::BadValue)
}

/// A data error PostgreSQL raised for `column`, in words naming the column, its type and the kinds of JSON
/// value the failed statement carried for it (`array`), never a value: the server's message quotes it.
fn refused_value(
    target: &Target,
    shape: &TableShape,
    column: usize,
    e: &tokio_postgres::Error,
    array: &str,
) -> SinkError {
    let c = &shape.columns[column];
    let code = e.as_db_error().map_or("22000", |d| d.code().code());
    let rows: Vec<HashMap<&str, &RawValue>> = serde_json::from_str(array).unwrap_or_default();
    let mut kinds: Vec<&str> = rows
        .iter()
        .filter_map(|row| row.get(c.name.as_str()))
        .filter_map(|v| match v.get().as_bytes().first() {
            Some(b'"') => Some("a JSON string"),
            Some(b'{') => Some("a JSON object"),
            Some(b'[') => Some("a JSON array"),
            Some(b't' | b'f') => Some("a JSON boolean"),
            Some(b'n') | None => None,
            Some(_) => Some("a JSON number"),
        })
        .collect();
    kinds.sort_unstable();
    kinds.dedup();
    if kinds.is_empty() {
        kinds.push("a value");
    }
    SinkError::Rejected(format!(
        "PostgreSQL refused a value for column {:?} of {} ({}) (SQLSTATE {code}): the batch holds {} for it that the column's type cannot take; change the column's type, or the value at the source (the server's message is not logged because it quotes the value)",
        c.name.as_str(),
        target.table,
        c.sql_type,
        kinds.join(" or ")
    ))
}

/// A failed statement in the sink's words: what waiting fixes is transient; the rest says what to change.
/// Data errors are reported without the server's message, which quotes the offending value.
fn error(target: &Target, e: tokio_postgres::Error) -> SinkError {
    let table = &target.table;
    let Some(db) = e.as_db_error() else {
        return SinkError::Transient(format!("PostgreSQL connection failed while writing {table}: {e}"));
    };
    let code = db.code().code();
    let msg = db.message();
    let at = |what: &str, v: Option<&str>| v.map(|v| format!(", {what} {v}")).unwrap_or_default();
    match classify(Some(code)) {
        Verdict::Transient => SinkError::Transient(format!("PostgreSQL: {msg} (SQLSTATE {code})")),
        Verdict::Denied => SinkError::Rejected(format!(
            "PostgreSQL: {msg} (SQLSTATE {code}); grant the login INSERT, UPDATE and DELETE on {table}, and INSERT, UPDATE and SELECT on {}{}",
            target.fence_table,
            target.checkpoint_table.as_ref().map(|c| format!(" and {c}")).unwrap_or_default()
        )),
        Verdict::BadValue => SinkError::Rejected(format!(
            "PostgreSQL refused a value for {table} (SQLSTATE {code}{}{}): a value does not fit its column's type; the server's message is not logged because it quotes the value",
            at("column", db.column()),
            at("type", db.datatype())
        )),
        Verdict::Refused => SinkError::Rejected(format!(
            "PostgreSQL: {msg} (SQLSTATE {code}{}) while writing {table}",
            at("constraint", db.constraint())
        )),
    }
}
