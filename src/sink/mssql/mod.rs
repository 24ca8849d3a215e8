//! The SQL Server upsert sink: the same rules, fence and exactly-once checkpoint as the PostgreSQL sink, as
//! one atomic T-SQL batch per delivery (`sql`), over the connection layer it shares with the SQL Server
//! sources (`db::mssql`: connection strings as Azure shows them, Entra ID tokens, TLS unless `Encrypt=False`,
//! redirects, the failure classifier).
//!
//! One delivery is one `sp_executesql` round trip under `SET XACT_ABORT ON`, holding one transaction:
//! 1. the fence row of the app/function is locked (`UPDLOCK, HOLDLOCK`) and raised to the batch's fencing
//!    token, or the write is refused because a newer owner already wrote (status 1, rolled back);
//! 2. with `exactlyOnce`, the checkpoint row is checked: if it names this very batch (id and range), the
//!    batch was applied before its acknowledgement was lost, and nothing more is written (status 2);
//! 3. deletes by primary key, then `MERGE` upserts (or plain inserts), at most `maxRowsPerStatement` rows per
//!    statement (1000 by default, as the official output binding), each reading one JSON parameter (or its
//!    own array in a shared one, past SQL Server's 2,100 parameters: `sql::MAX_ROW_PARAMS`);
//! 4. with `exactlyOnce`, the checkpoint row is set to this batch;
//! 5. commit, then one status row. Any error rolls everything back: no partial upsert.
//!
//! Because the whole delivery is one atomic batch that the fence and the checkpoint make safe to repeat, a
//! transient failure (a deadlock, a dropped connection, Azure SQL failing over) leaves the batch in flight
//! and the next tick delivers it again; a delivery repeated after a commit whose answer was lost upserts the
//! same rows again (at-least-once) or, exactly once, finds the checkpoint row.
//!
//! The table's columns and key are read from `sys.columns` on first use and cached (`super::table`); a
//! rejected write drops the cache, so a changed table is seen by the next attempt. Columns of types the
//! sink cannot write (`sql::type_sql`) are treated like computed columns: an item that carries one is
//! refused, naming it.

mod sql;

use super::table::{Dialect, TableSink};
use super::target::Target;
use super::upsert::{self, Column, TableShape};
use super::{Applied, Resume, SinkBatch, SinkError};
use crate::config::TableTarget;
use crate::db::mssql::{describe, Failed, Failure, Param, Pool, Settings};
use crate::ident::{Ident, TableName};
use serde_json::Value;
use std::time::Instant;

/// SQL Server errors whose message quotes a row value (conversions, overflows, truncation, JSON parsing):
/// reported without the server's message, as the PostgreSQL sink does for its data errors.
fn quotes_a_value(code: u32) -> bool {
    matches!(code, 220 | 232 | 244 | 245 | 248 | 2628 | 13600..=13699)
}

/// The SQL Server sink.
pub type MssqlSink = TableSink<Mssql>;

/// Builds the sink `spec` names and parses its connection string, without connecting.
pub fn new(spec: &TableTarget) -> Result<MssqlSink, String> {
    packing_rows_into(spec, sql::MAX_ROW_PARAMS)
}

/// [`new`], with a request's rows in at most `max_row_params` parameters (cut to 1 to [`sql::MAX_ROW_PARAMS`],
/// SQL Server's bound, which every sink the handler builds uses). For the wire tier: it sends the reviewed
/// packed delivery (`tests/golden/mssql_sink/delivery_packed.sql`, four statements in two parameters) as
/// tiberius puts it on the wire, where the real bound would take over 2,092 statements.
pub fn packing_rows_into(spec: &TableTarget, max_row_params: usize) -> Result<MssqlSink, String> {
    let target = Target::new(spec, sql::ROWS_PER_STATEMENT);
    let settings = Settings::parse(&target.setting, &target.connection)?;
    let max_row_params = max_row_params.clamp(1, sql::MAX_ROW_PARAMS);
    Ok(TableSink::new(target, Mssql { pool: Pool::new(settings), max_row_params }))
}

/// SQL Server's way of writing a batch: a pool of connections to the target database.
#[derive(Debug)]
pub struct Mssql {
    pool: Pool,
    /// Row parameters per request: [`sql::MAX_ROW_PARAMS`] but in the wire tests ([`packing_rows_into`]).
    max_row_params: usize,
}

impl Mssql {
    /// Creates `table` with `ddl` unless it exists (the statement checks `OBJECT_ID` first, so a login
    /// without CREATE rights works with tables an administrator made).
    async fn ensure(&self, target: &Target, table: &TableName, ddl: &str) -> Result<(), SinkError> {
        match self.pool.execute_batch(ddl, "creating the sink's bookkeeping table").await {
            Ok(_) => Ok(()),
            // Another instance created it at the same moment.
            Err(f) if f.code() == Some(2714) => Ok(()),
            Err(f) if f.transient => Err(self.error(target, f)),
            Err(f) => Err(SinkError::Rejected(format!(
                "cannot create {table} ({}); create it once with a login that may: {ddl}",
                describe(&f.failure, self.pool.setting(), "creating the sink's bookkeeping table")
            ))),
        }
    }

    /// Words a failed statement: what a retry can fix is transient (the retry table of the connection
    /// layer); the rest says what to change. Messages that quote a row value are not passed on.
    fn error(&self, target: &Target, failed: Failed) -> SinkError {
        let table = &target.table;
        let context = format!("writing {table}");
        if failed.transient {
            return SinkError::Transient(describe(&failed.failure, self.pool.setting(), &context));
        }
        let message = match &failed.failure {
            Failure::Tds(tiberius::error::Error::Server(t)) => t.message().to_string(),
            other => return SinkError::Rejected(describe(other, self.pool.setting(), &context)),
        };
        let code = failed.code().unwrap_or(0);
        let bookkeeping = format!(
            "{}{}",
            target.fence_table,
            target.checkpoint_table.as_ref().map(|c| format!(" and {c}")).unwrap_or_default()
        );
        SinkError::Rejected(match code {
            2601 | 2627 => format!(
                "SQL Server error {code}: a row violates a unique key of {table}; the server's message is not logged because it quotes the key's value"
            ),
            c if quotes_a_value(c) => format!(
                "SQL Server error {code}: {table} refused a value (it does not fit its column's type or length, or is not valid JSON or base64); the server's message is not logged because it quotes the value"
            ),
            229 | 230 | 262 | 297 | 300 | 1088 => format!(
                "SQL Server error {code} while {context}: {message}; grant the login SELECT, INSERT, UPDATE and DELETE on {table} (and ALTER, for rows that carry an identity value), and SELECT, INSERT and UPDATE on {bookkeeping}"
            ),
            208 if message.contains("OPENJSON") => format!(
                "SQL Server error 208 while {context}: {message}; the sink reads rows with OPENJSON, which needs database compatibility level 130 or higher (ALTER DATABASE CURRENT SET COMPATIBILITY_LEVEL = 130)"
            ),
            _ => format!("SQL Server error {code} while {context}: {message}"),
        })
    }
}

/// An answer the sink's own statements cannot produce from a SQL Server: a driver or protocol surprise.
fn unexpected(what: &str) -> SinkError {
    SinkError::Rejected(format!("unexpected answer from SQL Server to the sink: expected {what}"))
}

#[async_trait::async_trait]
impl Dialect for Mssql {
    fn name(&self) -> &'static str {
        "mssql"
    }

    async fn discover(&self, target: &Target) -> Result<TableShape, SinkError> {
        let table = &target.table;
        let rows = self
            .pool
            .execute(sql::COLUMNS, &[Param::Text(table.mssql())], "reading the sink table's columns")
            .await
            .map_err(|f| self.error(target, f))?;
        if rows.is_empty() {
            return Err(SinkError::Rejected(format!(
                "sink table {table} does not exist (or the login cannot see it); create it, or check the sink's tableName and grant the login access to it"
            )));
        }
        let mut columns = Vec::with_capacity(rows.len());
        let mut key: Vec<(i32, usize)> = Vec::new();
        for (i, row) in rows.iter().enumerate() {
            let text = |n: usize| -> Result<String, SinkError> {
                row.try_get::<&str, _>(n)
                    .ok()
                    .flatten()
                    .map(str::to_string)
                    .ok_or_else(|| unexpected("a column's name and type"))
            };
            let int = |n: usize| -> Result<Option<i32>, SinkError> {
                row.try_get::<i32, _>(n).map_err(|_| unexpected("a column's sizes and flags as int"))
            };
            let flag = |n: usize| -> Result<bool, SinkError> { Ok(int(n)?.unwrap_or(0) != 0) };
            let name = text(0)?;
            let type_name = text(1)?;
            let (max_length, precision, scale) = (int(2)?.unwrap_or(0), int(3)?.unwrap_or(0), int(4)?.unwrap_or(0));
            // A type the sink cannot write is treated like a computed column: never written, and an item
            // that carries it is refused with the column named.
            let (sql_type, writable) = match sql::type_sql(&type_name, max_length, precision, scale) {
                Ok(t) => (t, true),
                Err(why) => {
                    tracing::debug!(table = %table, column = %name, "{why}");
                    (type_name.clone(), false)
                }
            };
            // A collation is named in statements as it is spelled (COLLATE takes no quoting): only a name
            // of letters, digits and underscores, as every SQL Server collation is, reaches one.
            let collation = text(10)?;
            if !collation.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(unexpected("a collation name of letters, digits and underscores"));
            }
            let column = Column {
                name: Ident::new(&name).map_err(SinkError::Rejected)?,
                sql_type,
                nullable: flag(5)?,
                has_default: flag(6)?,
                identity: flag(7)?,
                generated: flag(8)? || !writable,
                binary: matches!(type_name.to_ascii_lowercase().as_str(), "binary" | "varbinary"),
                holds_json: false,
                // OPENJSON reads every column from the batch's JSON itself, `\u0000` included.
                raw_json: false,
                holds_nul: true,
                collation: Some(collation).filter(|c| !c.is_empty()),
            };
            // Only a character column is read `AS JSON` too (`sql::character`); OPENJSON reads an object or
            // array as NULL into any other.
            columns.push(Column { holds_json: sql::character(&column), ..column });
            if let Some(position) = int(9)? {
                key.push((position, i));
            }
        }
        if key.is_empty() {
            return Err(SinkError::Rejected(format!(
                "sink table {table} has no primary key; the sink upserts and deletes by primary key: add one (ALTER TABLE {} ADD PRIMARY KEY (...))",
                table.mssql()
            )));
        }
        key.sort_unstable();
        self.ensure(target, &target.fence_table, &sql::create_fence(&target.fence_table)).await?;
        if let Some(checkpoint) = &target.checkpoint_table {
            self.ensure(target, checkpoint, &sql::create_checkpoint(checkpoint)).await?;
        }
        tracing::debug!(table = %table, columns = columns.len(), "discovered the sink table");
        Ok(TableShape { table: table.clone(), columns, key: key.into_iter().map(|(_, i)| i).collect() })
    }

    async fn write(&self, target: &Target, shape: &TableShape, batch: &SinkBatch<'_>) -> Result<(), SinkError> {
        let started = Instant::now();
        let plan = upsert::plan(shape, batch.changes).map_err(SinkError::Rejected)?;
        let (text, row_params) = sql::delivery(
            shape,
            &plan,
            &target.fence_table,
            target.checkpoint_table.as_ref(),
            target.max_rows_per_statement,
            self.max_row_params,
        );
        let (from, to) = (batch.range.from.to_string(), batch.range.to.to_string());
        let int = |n: u64| Param::Int(i64::try_from(n).unwrap_or(i64::MAX));
        let mut params = vec![
            Param::Text(batch.owner_key()),
            int(batch.fence),
            int(batch.range.batch_id),
            Param::Text(from),
            Param::Text(to),
            int(batch.changes.len() as u64),
        ];
        let mut statements = 0;
        for param in &row_params {
            let arrays: Vec<String> = param
                .slices
                .iter()
                .map(|slice| {
                    let rows = match slice.group {
                        None => &plan.deletes[slice.rows.clone()],
                        Some(g) => &plan.groups[g].rows[slice.rows.clone()],
                    };
                    format!("[{}]", rows.join(","))
                })
                .collect();
            statements += arrays.len();
            params.push(Param::Text(if param.packed { format!("[{}]", arrays.join(",")) } else { arrays.concat() }));
        }
        let answer = self
            .pool
            .execute(&text, &params, "writing a batch to the sink table")
            .await
            .map_err(|f| self.error(target, f))?;
        let [row] = answer.as_slice() else { return Err(unexpected("one status row")) };
        let status = row.try_get::<i32, _>(0).ok().flatten().ok_or_else(|| unexpected("one status row"))?;
        let stored = row.try_get::<i64, _>(1).ok().flatten();
        match status {
            0 => {
                tracing::debug!(function = batch.function, batch_id = batch.range.batch_id, rows = plan.rows(),
                    superseded = plan.superseded, deletes = plan.deletes.len(), statements,
                    table = %target.table, elapsed_ms = started.elapsed().as_secs_f64() * 1000.0, "batch written");
                Ok(())
            }
            1 => Err(SinkError::Fenced {
                ours: batch.fence,
                stored: stored.and_then(|s| u64::try_from(s).ok()).unwrap_or(0),
            }),
            2 => {
                tracing::info!(function = batch.function, batch_id = batch.range.batch_id, table = %target.table,
                    "batch already applied (exactly-once checkpoint row); nothing written again");
                Ok(())
            }
            other => Err(unexpected(&format!("status 0, 1 or 2, not {other}"))),
        }
    }

    async fn recorded(&self, target: &Target, app: &str, function: &str) -> Result<Resume, SinkError> {
        let statement = sql::resume(&target.fence_table, target.checkpoint_table.as_ref());
        let rows = self
            .pool
            .execute(&statement, &[Param::Text(format!("{app}/{function}"))], "reading what the sink recorded")
            .await
            .map_err(|f| self.error(target, f))?;
        let [row] = rows.as_slice() else { return Err(unexpected("one row of what the sink recorded")) };
        let fence = row.try_get::<i64, _>(0).ok().flatten().and_then(|t| u64::try_from(t).ok()).unwrap_or(0);
        let position = |n: usize| -> Result<Option<Value>, SinkError> {
            match row.try_get::<&str, _>(n).ok().flatten() {
                None => Ok(None),
                Some(text) => serde_json::from_str(text).map(Some).map_err(|e| {
                    SinkError::Rejected(format!(
                        "the checkpoint row of {function} in {} holds a position that is not JSON ({e}); delete the row to start over from startFrom",
                        target.checkpoint_table.as_ref().map_or_else(String::new, |t| t.to_string())
                    ))
                }),
            }
        };
        let applied = match target.checkpoint_table {
            None => None,
            Some(_) => {
                let batch_id = row.try_get::<i64, _>(1).ok().flatten().and_then(|b| u64::try_from(b).ok());
                match (batch_id, position(2)?, position(3)?) {
                    (Some(batch_id), Some(from), Some(to)) => Some(Applied { batch_id, from, to }),
                    _ => None,
                }
            }
        };
        Ok(Resume { fence, applied })
    }
}
