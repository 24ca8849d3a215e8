//! The checks of a table and its columns, and the shape each source reads it by: pure functions of the facts,
//! every failure with the message that says what to run.

use super::facts::{invalid, quote, ColumnFacts, DatabaseFacts, TableFacts};
use crate::config::{RowversionOptions, SourceSpec};
use crate::ident::{Ident, TableName};
use crate::source::mssql::sql::{CtShape, ItemColumn, KeyColumn, PartitionFilter, RvShape};
use crate::source::SourceError;

/// The official trigger rejects primary-key columns with this prefix (its lease tables use it); we keep the
/// rule so a table that works here also works there.
const RESERVED_PREFIX: &str = "_az_func_";

/// The `ALTER` statements that turn change tracking on, for messages.
fn enable_ct(db: &DatabaseFacts, table: &TableName, track_columns: bool) -> String {
    let with = if track_columns { " WITH (TRACK_COLUMNS_UPDATED = ON)" } else { "" };
    format!(
        "ALTER DATABASE {} SET CHANGE_TRACKING = ON (CHANGE_RETENTION = 2 DAYS, AUTO_CLEANUP = ON); ALTER TABLE {} ENABLE CHANGE_TRACKING{with}",
        db.quoted_name(),
        table.mssql()
    )
}

/// Checks shared by both sources: the table exists, is a table, and the login may read it.
fn check_table(db: &DatabaseFacts, t: &TableFacts, table: &TableName) -> Result<(), SourceError> {
    if t.object_id.is_none() {
        return Err(invalid(format!(
            "table {table} was not found in database {} (or login user {} cannot see it); check tableName (schema.table, e.g. dbo.Orders) and the Database in the connection string",
            db.quoted_name(),
            quote(&db.user)
        )));
    }
    if !t.is_base_table {
        return Err(invalid(format!(
            "{table} is not a table (a view or synonym?); change tracking and rowversion polling work on base tables: point tableName at the table itself"
        )));
    }
    if !t.can_select {
        return Err(invalid(format!(
            "login user {} may not read {table}: run GRANT SELECT ON {} TO {}",
            quote(&db.user),
            table.mssql(),
            quote(&db.user)
        )));
    }
    Ok(())
}

/// The primary key in key order, from the catalog, checked against `primaryKey` if configured.
fn primary_key(cols: &[ColumnFacts], spec: &SourceSpec, must_match: bool) -> Result<Vec<KeyColumn>, SourceError> {
    let table = &spec.table;
    let mut pk: Vec<&ColumnFacts> = cols.iter().filter(|c| c.pk_ordinal.is_some()).collect();
    pk.sort_by_key(|c| c.pk_ordinal);
    let chosen: Vec<&ColumnFacts> = match &spec.primary_key {
        Some(names) => {
            let mut out = Vec::new();
            for n in names {
                let c = cols.iter().find(|c| c.name == n.as_str()).ok_or_else(|| {
                    invalid(format!(
                        "primaryKey column {:?} is not a column of {table}; column names are case-sensitive",
                        n.as_str()
                    ))
                })?;
                out.push(c);
            }
            if must_match && out.iter().map(|c| &c.name).ne(pk.iter().map(|c| &c.name)) {
                let actual: Vec<&str> = pk.iter().map(|c| c.name.as_str()).collect();
                return Err(invalid(format!(
                    "primaryKey in sqltrigger.json must be the table's primary key for change tracking ({}); remove primaryKey or set it to [{}]",
                    if actual.is_empty() { "it has none".to_string() } else { actual.join(", ") },
                    actual.iter().map(|a| format!("{a:?}")).collect::<Vec<_>>().join(", ")
                )));
            }
            out
        }
        None => pk,
    };
    if chosen.is_empty() {
        return Err(invalid(format!(
            "table {table} has no primary key; the trigger needs one to identify rows: run ALTER TABLE {} ADD CONSTRAINT [PK_{}] PRIMARY KEY (<key columns>)",
            table.mssql(),
            table.table.as_str().replace(']', "")
        )));
    }
    if let Some(c) = chosen.iter().find(|c| c.name.starts_with(RESERVED_PREFIX)) {
        return Err(invalid(format!(
            "primary key column {:?} of {table} starts with the reserved prefix {RESERVED_PREFIX}; rename it",
            c.name
        )));
    }
    chosen
        .iter()
        .map(|c| {
            c.ty.convert_target().map_err(|why| {
                invalid(format!("primary key column {:?} of {table} has type {}: {why}", c.name, c.ty))
            })?;
            Ok(KeyColumn { name: Ident::new(&c.name).map_err(invalid)?, ty: c.ty.clone() })
        })
        .collect()
}

/// The columns of `Item`: all, or `columns` from sqltrigger.json; each serializable by `FOR JSON`.
fn item_columns(cols: &[ColumnFacts], spec: &SourceSpec) -> Result<Vec<ItemColumn>, SourceError> {
    let table = &spec.table;
    let wanted: Vec<&ColumnFacts> = match &spec.columns {
        Some(names) => names
            .iter()
            .map(|n| {
                cols.iter().find(|c| c.name == n.as_str()).ok_or_else(|| {
                    invalid(format!(
                        "columns lists {:?}, which is not a column of {table}; column names are case-sensitive",
                        n.as_str()
                    ))
                })
            })
            .collect::<Result<_, _>>()?,
        None => cols.iter().collect(),
    };
    let mut out = Vec::new();
    for c in wanted {
        if c.ty.is_unsupported() {
            return Err(invalid(format!(
                "column {:?} of {table} has type {}, which the trigger cannot send as JSON; list the other columns in \"columns\" in sqltrigger.json, or add a computed column that converts it (e.g. [{}_text] AS CONVERT(nvarchar(max), [{}]))",
                c.name, c.ty, c.name.replace(']', ""), c.name.replace(']', "]]")
            )));
        }
        if c.name.contains('.') {
            return Err(invalid(format!(
                "column {:?} of {table} has a dot in its name, which FOR JSON PATH would turn into a nested object; leave it out with \"columns\" in sqltrigger.json",
                c.name
            )));
        }
        out.push(ItemColumn { name: Ident::new(&c.name).map_err(invalid)?, column_id: c.column_id, ty: c.ty.clone() });
    }
    Ok(out)
}

/// Change tracking must be on for the database before anything about the table can be checked.
pub fn change_tracking_database(spec: &SourceSpec, db: &DatabaseFacts, metadata: bool) -> Result<(), SourceError> {
    if db.ct_version.is_none() {
        return Err(invalid(format!(
            "change tracking is not enabled on database {}: run {}",
            db.quoted_name(),
            enable_ct(db, &spec.table, metadata)
        )));
    }
    Ok(())
}

/// The table checks of the change-tracking source (existence, permissions), which need no column list.
pub fn change_tracking_table(
    spec: &SourceSpec,
    db: &DatabaseFacts,
    t: &TableFacts,
    metadata: bool,
) -> Result<(), SourceError> {
    let table = &spec.table;
    change_tracking_database(spec, db, metadata)?;
    check_table(db, t, table)?;
    if !t.can_view_change_tracking {
        return Err(invalid(format!(
            "login user {} may not read the changes of {table}: run GRANT VIEW CHANGE TRACKING ON {} TO {}",
            quote(&db.user),
            table.mssql(),
            quote(&db.user)
        )));
    }
    Ok(())
}

/// The table checks of the rowversion source.
pub fn readable_table(spec: &SourceSpec, db: &DatabaseFacts, t: &TableFacts) -> Result<(), SourceError> {
    check_table(db, t, &spec.table)
}

/// Every check of the change-tracking source, in the order an operator would fix them.
pub fn change_tracking_shape(
    spec: &SourceSpec,
    db: &DatabaseFacts,
    t: &TableFacts,
    cols: &[ColumnFacts],
    skip_context: bool,
    metadata: bool,
) -> Result<CtShape, SourceError> {
    let table = &spec.table;
    change_tracking_table(spec, db, t, metadata)?;
    // The key first: change tracking cannot be enabled on a table without one.
    let key = primary_key(cols, spec, true)?;
    if t.min_valid_version.is_none() {
        let with = if metadata { " WITH (TRACK_COLUMNS_UPDATED = ON)" } else { "" };
        return Err(invalid(format!(
            "change tracking is not enabled on table {table}: run ALTER TABLE {} ENABLE CHANGE_TRACKING{with}",
            table.mssql()
        )));
    }
    let item = item_columns(cols, spec)?;
    Ok(CtShape {
        table: table.clone(),
        key,
        item,
        snapshot: db.snapshot_allowed(),
        skip_context,
        metadata,
        partitioned: spec.partition.is_some_and(|p| p.count.get() > 1),
    })
}

/// Every check of the rowversion source.
pub fn rowversion_shape(
    spec: &SourceSpec,
    options: &RowversionOptions,
    db: &DatabaseFacts,
    t: &TableFacts,
    cols: &[ColumnFacts],
) -> Result<RvShape, SourceError> {
    let table = &spec.table;
    check_table(db, t, table)?;
    let find = |what: &str, n: &Ident| {
        cols.iter().find(|c| c.name == n.as_str()).ok_or_else(|| {
            invalid(format!("{what} {:?} is not a column of {table}; column names are case-sensitive", n.as_str()))
        })
    };
    let version = match &options.cursor_column {
        Some(c) => {
            let col = find("cursorColumn", c)?;
            if col.ty.name != "timestamp" {
                return Err(invalid(format!(
                    "cursorColumn {:?} of {table} is {}; mssql-rowversion needs a rowversion column: ALTER TABLE {} ADD [RowVersion] rowversion",
                    col.name, col.ty, table.mssql()
                )));
            }
            c.clone()
        }
        None => {
            let found: Vec<&ColumnFacts> = cols.iter().filter(|c| c.ty.name == "timestamp").collect();
            match found.as_slice() {
                [one] => Ident::new(&one.name).map_err(invalid)?,
                [] => {
                    return Err(invalid(format!(
                        "table {table} has no rowversion column; add one (ALTER TABLE {} ADD [RowVersion] rowversion) or use source mssql-change-tracking",
                        table.mssql()
                    )))
                }
                _ => return Err(invalid(format!("table {table} has several rowversion columns; name one in cursorColumn"))),
            }
        }
    };
    let key = primary_key(cols, spec, false)?;
    let partition = match (spec.partition.filter(|p| p.count.get() > 1), &options.partition_column) {
        (None, _) => None,
        (Some(_), None) => Some(PartitionFilter::Inline),
        (Some(_), Some(c)) => {
            find("partitionColumn", c)?;
            Some(PartitionFilter::Column(c.clone()))
        }
    };
    // The partition column is the handler's, not the app's: it stays out of Item unless `columns` names it.
    let item_source: Vec<ColumnFacts> = match (&partition, &spec.columns) {
        (Some(PartitionFilter::Column(c)), None) => cols.iter().filter(|x| x.name != c.as_str()).cloned().collect(),
        _ => cols.to_vec(),
    };
    let item = item_columns(&item_source, spec)?;
    let soft_delete = match &options.soft_delete_column {
        Some(c) => Some((c.clone(), find("softDeleteColumn", c)?.ty.name == "bit")),
        None => None,
    };
    let inserted = match &options.inserted_column {
        Some(c) => {
            let col = find("insertedColumn", c)?;
            let is_binary = match col.ty.name.as_str() {
                "binary" | "varbinary" if col.ty.max_length == Some(8) => true,
                "bigint" => false,
                other => {
                    return Err(invalid(format!(
                        "insertedColumn {:?} of {table} is {other}; it must be binary(8) or bigint, set once at insert to a value comparable with the rowversion (e.g. DEFAULT @@DBTS)",
                        col.name
                    )))
                }
            };
            Some((c.clone(), is_binary))
        }
        None => None,
    };
    Ok(RvShape {
        table: table.clone(),
        key,
        version,
        item,
        soft_delete,
        inserted,
        snapshot: db.snapshot_allowed(),
        partition,
    })
}
