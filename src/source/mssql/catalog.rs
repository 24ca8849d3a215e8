//! Reads the catalog facts both sources validate against, and decodes result rows strictly: a missing row
//! or a column of the wrong type is an error, never a default (a silent default would let an unexpected
//! server answer pass validation).

use super::read::Reads;
use super::schema::{ColumnFacts, DatabaseFacts, PartitionColumnFacts, TableFacts};
use super::sql;
use super::types::SqlType;
use crate::db::mssql::{Param, Pool};
use crate::ident::{Ident, TableName};
use crate::source::SourceError;
use tiberius::Row;

fn decode(context: &str, e: tiberius::error::Error) -> SourceError {
    SourceError::Invalid(format!("unexpected answer from SQL Server while {context}: {e}"))
}

pub fn int(row: &Row, i: usize, context: &str) -> Result<Option<i32>, SourceError> {
    row.try_get::<i32, usize>(i).map_err(|e| decode(context, e))
}

pub fn big(row: &Row, i: usize, context: &str) -> Result<Option<i64>, SourceError> {
    row.try_get::<i64, usize>(i).map_err(|e| decode(context, e))
}

pub fn text(row: &Row, i: usize, context: &str) -> Result<Option<String>, SourceError> {
    row.try_get::<&str, usize>(i).map(|s| s.map(str::to_string)).map_err(|e| decode(context, e))
}

pub fn required<T>(v: Option<T>, what: &str, context: &str) -> Result<T, SourceError> {
    v.ok_or_else(|| SourceError::Invalid(format!("unexpected answer from SQL Server while {context}: {what} is NULL")))
}

pub fn one_row(rows: Vec<Row>, context: &str) -> Result<Row, SourceError> {
    let n = rows.len();
    rows.into_iter().next().filter(|_| n == 1).ok_or_else(|| {
        SourceError::Invalid(format!("unexpected answer from SQL Server while {context}: expected one row, got {n}"))
    })
}

pub async fn database(pool: &Pool) -> Result<DatabaseFacts, SourceError> {
    let ctx = "reading the database settings";
    let row = one_row(pool.batch(sql::DATABASE, ctx).await?, ctx)?;
    Ok(DatabaseFacts {
        compatibility_level: required(int(&row, 0, ctx)?, "compatibility_level", ctx)?,
        snapshot_state: int(&row, 1, ctx)?.unwrap_or(0),
        read_committed_snapshot: int(&row, 2, ctx)? == Some(1),
        ct_version: big(&row, 3, ctx)?,
        retention: match (int(&row, 4, ctx)?, int(&row, 5, ctx)?) {
            (Some(n), Some(unit)) => Some((n, unit)),
            _ => None,
        },
        name: required(text(&row, 6, ctx)?, "DB_NAME()", ctx)?,
        user: text(&row, 7, ctx)?.unwrap_or_else(|| "?".into()),
    })
}

pub async fn table(pool: &Pool, table: &TableName) -> Result<TableFacts, SourceError> {
    let ctx = "checking the table";
    let s = sql::table();
    let row = one_row(pool.query(&s.sql, &[Param::Text(table.mssql())], ctx).await?, ctx)?;
    Ok(TableFacts {
        object_id: int(&row, 0, ctx)?,
        is_base_table: int(&row, 1, ctx)? == Some(1),
        can_select: int(&row, 2, ctx)? == Some(1),
        can_view_change_tracking: int(&row, 3, ctx)? == Some(1),
        min_valid_version: big(&row, 4, ctx)?,
    })
}

pub async fn columns(pool: &Pool, table: &TableName) -> Result<Vec<ColumnFacts>, SourceError> {
    let ctx = "reading the table's columns";
    let s = sql::columns();
    let rows = pool.query(&s.sql, &[Param::Text(table.mssql())], ctx).await?;
    if rows.is_empty() {
        return Err(SourceError::Invalid(format!(
            "no columns of {table} are visible to the login: grant it SELECT on the table (INFORMATION_SCHEMA shows only what a login may use)"
        )));
    }
    rows.iter()
        .map(|r| {
            let mut ty = SqlType::new(&required(text(r, 1, ctx)?, "DATA_TYPE", ctx)?);
            ty.max_length = int(r, 2, ctx)?;
            ty.precision = int(r, 3, ctx)?;
            ty.scale = int(r, 4, ctx)?;
            ty.datetime_precision = int(r, 5, ctx)?;
            ty.collation = text(r, 8, ctx)?;
            Ok(ColumnFacts {
                name: required(text(r, 0, ctx)?, "COLUMN_NAME", ctx)?,
                ty,
                column_id: required(int(r, 6, ctx)?, "column id", ctx)?,
                pk_ordinal: int(r, 7, ctx)?,
            })
        })
        .collect()
}

/// The rowversion source's `partitionColumn`: `None` when it is not a computed column.
pub async fn partition_column(
    pool: &Pool,
    table: &TableName,
    column: &Ident,
    version: &Ident,
) -> Result<Option<PartitionColumnFacts>, SourceError> {
    let ctx = "checking the partition column";
    let s = sql::partition_column();
    let params =
        [Param::Text(table.mssql()), Param::Text(column.as_str().into()), Param::Text(version.as_str().into())];
    let rows = pool.query(&s.sql, &params, ctx).await?;
    if rows.len() > 1 {
        return Err(SourceError::Invalid(format!(
            "unexpected answer from SQL Server while {ctx}: expected at most one row, got {}",
            rows.len()
        )));
    }
    let Some(row) = rows.first() else { return Ok(None) };
    Ok(Some(PartitionColumnFacts {
        definition: required(text(row, 0, ctx)?, "definition", ctx)?,
        persisted: int(row, 1, ctx)? == Some(1),
        indexes: int(row, 2, ctx)?.unwrap_or(0),
    }))
}
