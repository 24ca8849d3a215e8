//! Discovery on first use: the table's columns and key read from the catalog, the configuration checked against
//! them, and the [`Shape`] every statement is built from. Each failure says what to change.

use super::connection::{db_error, Connection};
use super::index_advice;
use super::sql::{self, Age, Guard, Shape};
use crate::config::{CursorGuard, Partition, PostgresCursorOptions, SourceSpec};
use crate::ident::{Ident, TableName};
use crate::source::SourceError;

/// What the catalog says about the table's columns: `(name, type as format_type prints it, typname)` in table
/// order, and the names of those declared NOT NULL.
struct Columns<'a> {
    table: &'a TableName,
    all: Vec<(String, String, String)>,
    not_null: Vec<String>,
}

impl Columns<'_> {
    /// Column `c`, or the error naming it as `what` (`"cursorColumn"`, ...).
    fn find(&self, what: &str, c: &Ident) -> Result<&(String, String, String), SourceError> {
        self.all.iter().find(|(n, _, _)| n == c.as_str()).ok_or_else(|| {
            SourceError::Invalid(format!(
                "{what} {:?} is not a column of {}; column names are case-sensitive",
                c.as_str(),
                self.table
            ))
        })
    }
}

/// Reads the table's columns and key from the catalog and checks the configuration against them; a partition's
/// fetch plan is checked last (`index_advice`).
pub(super) async fn discover(
    conn: &Connection,
    spec: &SourceSpec,
    options: &PostgresCursorOptions,
) -> Result<Shape, SourceError> {
    let client = conn.client().await?;
    let table = &spec.table;
    let quoted = table.pg();
    let oid: Option<u32> = client.query_one(sql::TABLE_OID, &[&quoted]).await.map_err(|e| db_error(e, table))?.get(0);
    let Some(oid) = oid else {
        return Err(SourceError::Invalid(format!(
            "table {table} does not exist (or the login cannot see it); check tableName and the search_path"
        )));
    };
    let rows = client.query(sql::COLUMNS, &[&oid]).await.map_err(|e| db_error(e, table))?;
    let columns = Columns {
        table,
        all: rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect(),
        not_null: rows.iter().filter(|r| r.get::<_, bool>(3)).map(|r| r.get(0)).collect(),
    };

    let key_names: Vec<Ident> = match &spec.primary_key {
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
        let (_, ty, typname) = columns.find("primary key column", k)?;
        if let Some(p) = spec.partition {
            partition_key_fits(table, p, k, typname, columns.not_null.iter().any(|n| n == k.as_str()))?;
        }
        key.push((k.clone(), ty.clone()));
    }

    let cursor = options.cursor_column.clone();
    let (_, cursor_type, cursor_typname) = columns.find("cursorColumn", &cursor)?.clone();
    let guard = guard(options, &cursor, &cursor_typname)?;

    let wanted = crate::source::item_column_names(spec, columns.all.iter().map(|(n, _, _)| n.as_str()))?;
    let mut item_columns = Vec::new();
    for c in &wanted {
        let (_, _, typname) = columns.find("column", c)?;
        item_columns.push((c.clone(), typname == "bytea"));
    }
    let soft_delete = match &options.soft_delete_column {
        Some(c) => {
            let (_, _, typname) = columns.find("softDeleteColumn", c)?;
            Some((c.clone(), typname == "bool"))
        }
        None => None,
    };
    if let Some(c) = &options.inserted_column {
        let (_, ty, _) = columns.find("insertedColumn", c)?;
        if *ty != cursor_type {
            return Err(SourceError::Invalid(format!(
                "insertedColumn {c} is {ty} but cursorColumn {cursor} is {cursor_type}; they must have the same type"
            )));
        }
    }

    let keyset_indexed = keyset_indexed(&client, (table, oid), &cursor, &key_names, spec.partition.is_none()).await?;
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
        inserted: options.inserted_column.clone(),
        guard,
        age,
        partition: spec.partition,
    };
    // The plan check takes a connection of its own: this one goes back first, or N partitions discovering at
    // once over a pool of N would each hold one and wait for a second until the pool's wait timeout.
    drop(client);
    if let Some(p) = spec.partition {
        index_advice::check_partition_index(conn, &shape, (p, oid), keyset_indexed).await?;
    }
    Ok(shape)
}

/// The late-commit guard the cursor column's type allows under `cursorGuard`, or the refusal saying what would.
fn guard(options: &PostgresCursorOptions, cursor: &Ident, cursor_typname: &str) -> Result<Guard, SourceError> {
    Ok(match (options.cursor_guard, cursor_typname) {
        (None | Some(CursorGuard::Xid8), "xid8") => Guard::Xid8,
        (Some(CursorGuard::Xid8), other) => {
            return Err(SourceError::Invalid(format!(
                "cursorGuard xid8 needs an xid8 cursor column, but {cursor} is {other}"
            )))
        }
        (None | Some(CursorGuard::Lag), "timestamptz" | "timestamp") => Guard::Lag {
            seconds: options.safety_lag.as_secs_f64(),
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
    })
}

/// Whether an index leads with `(cursor, key...)`. A keyset walk without one scans the table every batch: an
/// unpartitioned source (`warn`) warns, since it still works; a partition needs its own index, led by the
/// partition expression, which `index_advice` checks on the plan.
async fn keyset_indexed(
    client: &deadpool_postgres::Client,
    (table, oid): (&TableName, u32),
    cursor: &Ident,
    key_names: &[Ident],
    warn: bool,
) -> Result<bool, SourceError> {
    let order: Vec<String> =
        std::iter::once(cursor.as_str().to_string()).chain(key_names.iter().map(|k| k.as_str().to_string())).collect();
    let indexes: Vec<Vec<String>> = client
        .query(sql::INDEX_KEYS, &[&oid])
        .await
        .map_err(|e| db_error(e, table))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let keyset_indexed = indexes.iter().any(|ix| ix.len() >= order.len() && ix[..order.len()] == order[..]);
    if warn && !keyset_indexed {
        tracing::warn!(
            table = %table,
            "no index on ({}); every batch will scan the table. Create one: CREATE INDEX ON {} ({})",
            order.join(", "),
            table.pg(),
            order.iter().map(|c| format!("\"{}\"", c.replace('"', "\"\""))).collect::<Vec<_>>().join(", ")
        );
    }
    Ok(keyset_indexed)
}

/// A key column of a partitioned function must hash the same in every session and never be NULL: a key whose
/// hash changes or is NULL would be read by another partition, or by none.
fn partition_key_fits(
    table: &TableName,
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
