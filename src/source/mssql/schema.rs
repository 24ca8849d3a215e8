//! Validation on first use: the catalog facts the sources read, and every check with the message that says
//! what to do. Pure functions of the facts, so each message is tested without a server.

use super::sql::{CtShape, ItemColumn, KeyColumn, PartitionFilter, RvShape, PARTITION_MASK};
use super::types::SqlType;
use crate::config::{Partition, RowversionOptions, SourceSpec};
use crate::ident::{Ident, TableName};
use crate::source::SourceError;

/// The official trigger rejects primary-key columns with this prefix (its lease tables use it); we keep the
/// rule so a table that works here also works there.
const RESERVED_PREFIX: &str = "_az_func_";

/// `sql::DATABASE`, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabaseFacts {
    pub compatibility_level: i32,
    /// `snapshot_isolation_state`: 1 = ON.
    pub snapshot_state: i32,
    pub read_committed_snapshot: bool,
    /// NULL when change tracking is off for the database.
    pub ct_version: Option<i64>,
    /// Retention and its unit code (1 minutes, 2 hours, 3 days).
    pub retention: Option<(i32, i32)>,
    pub name: String,
    pub user: String,
}

impl DatabaseFacts {
    pub fn snapshot_allowed(&self) -> bool {
        self.snapshot_state == 1
    }

    pub fn quoted_name(&self) -> String {
        quote(&self.name)
    }

    pub fn retention_text(&self) -> String {
        match self.retention {
            Some((n, unit)) => {
                let unit = match unit {
                    1 => "MINUTES",
                    2 => "HOURS",
                    _ => "DAYS",
                };
                format!("{n} {unit}")
            }
            None => "unknown".into(),
        }
    }
}

/// `sql::table()`, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableFacts {
    pub object_id: Option<i32>,
    pub is_base_table: bool,
    pub can_select: bool,
    pub can_view_change_tracking: bool,
    pub min_valid_version: Option<i64>,
}

/// One row of `sql::columns()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnFacts {
    pub name: String,
    pub ty: SqlType,
    pub column_id: i32,
    pub pk_ordinal: Option<i32>,
}

fn quote(name: &str) -> String {
    Ident::new(name).map(|i| i.mssql()).unwrap_or_else(|_| "[?]".into())
}

fn invalid(msg: String) -> SourceError {
    SourceError::Invalid(msg)
}

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

/// `sql::partition_column()`, decoded: the computed column's definition as SQL Server stores it, whether it is
/// persisted, and how many usable indexes lead with (it, the rowversion column).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionColumnFacts {
    pub definition: String,
    pub persisted: bool,
    pub indexes: i32,
}

/// The expression a `partitionColumn` must hold for `count` partitions of `key`, as the DDL writes it.
pub fn partition_expression(key: &[KeyColumn], count: u32) -> String {
    let cols: Vec<String> = key.iter().map(|k| k.name.mssql()).collect();
    format!("(CHECKSUM({}) & {PARTITION_MASK}) % {count}", cols.join(", "))
}

/// The statements that give a rowversion table its partition column and the index a partition's fetch seeks:
/// `(partition, rowversion, key)`, so a fetch is a seek on the partition, a range on the rowversion, and rows in
/// the fetch's order (no sort).
pub fn partition_ddl(table: &TableName, key: &[KeyColumn], version: &Ident, column: &str, count: u32) -> String {
    format!(
        "ALTER TABLE {} ADD {} AS ({}) PERSISTED; {}",
        table.mssql(),
        quote(column),
        partition_expression(key, count),
        partition_index_ddl(table, key, version, column)
    )
}

fn partition_index_ddl(table: &TableName, key: &[KeyColumn], version: &Ident, column: &str) -> String {
    let name = quote(&format!("IX_{}_{column}", table.table.as_str()));
    let cols: Vec<String> =
        [quote(column), version.mssql()].into_iter().chain(key.iter().map(|k| k.name.mssql())).collect();
    format!("CREATE INDEX {name} ON {} ({})", table.mssql(), cols.join(", "))
}

/// SQL Server stores a computed column's definition re-written (`((checksum([Id])&(2147483647))%(8))`): compared
/// without case, blanks, parentheses and brackets. Looser than the text, but every expression it lets through
/// with these tokens in this order is a function of the key alone whose values lie in 0..N (a misplaced
/// parenthesis gives `CHECKSUM(key) & (2147483647 % N)`, still below N): no key is left out of every partition.
fn definition_tokens(definition: &str) -> String {
    definition.chars().filter(|c| !c.is_whitespace() && !"()[]".contains(*c)).flat_map(char::to_lowercase).collect()
}

/// A suggested name for the partition column of `count` partitions.
pub fn suggested_partition_column(count: u32) -> String {
    format!("sqltrigger_p{count}")
}

/// Checks the rowversion source's partition column against what N partitions need, and words what a fetch costs
/// when the index is missing. `Err`: the column cannot partition the keys (a fetch could skip rows); `Ok(Some)`:
/// a warning to log once (no index: correct but every fetch reads the whole range).
pub fn check_partition_column(
    shape: &RvShape,
    partition: Partition,
    facts: Option<&PartitionColumnFacts>,
) -> Result<Option<String>, SourceError> {
    let table = &shape.table;
    let n = partition.count.get();
    let Some(PartitionFilter::Column(column)) = &shape.partition else { return Ok(None) };
    let ddl = partition_ddl(table, &shape.key, &shape.version, column.as_str(), n);
    let expected = partition_expression(&shape.key, n);
    let Some(facts) = facts else {
        return Err(invalid(format!(
            "partitionColumn {:?} of {table} is not a computed column; it must hold ({expected}) for \"partitions\": {n}. Drop it and run {ddl}",
            column.as_str()
        )));
    };
    if definition_tokens(&facts.definition) != definition_tokens(&expected) {
        return Err(invalid(format!(
            "partitionColumn {:?} of {table} is defined as {}, but {n} partitions of the key need ({expected}): with another expression some keys would be read by no partition. Add a column for {n} partitions and name it in partitionColumn: {}",
            column.as_str(),
            facts.definition,
            partition_ddl(table, &shape.key, &shape.version, &suggested_partition_column(n), n)
        )));
    }
    if facts.indexes > 0 {
        return Ok(None);
    }
    let persisted = if facts.persisted { "" } else { " (and make the column PERSISTED, so writes compute it once)" };
    Ok(Some(format!(
        "partitionColumn {} of {table} has no index leading with ({}, {}): each fetch of a partition reads every row of the table changed since its position (a scan of the table, or of an index on the rowversion column alone) to keep about 1 in {n}, and each partition does it again. Run {}{persisted}",
        column.mssql(),
        column.mssql(),
        shape.version.mssql(),
        partition_index_ddl(table, &shape.key, &shape.version, column.as_str())
    )))
}

/// The warning for a partitioned rowversion source without `partitionColumn`: the hash is computed inline, so
/// no index can seek a partition.
pub fn inline_partition_warning(shape: &RvShape, partition: Partition) -> Option<String> {
    if shape.partition != Some(PartitionFilter::Inline) {
        return None;
    }
    let n = partition.count.get();
    let column = suggested_partition_column(n);
    Some(format!(
        "{} is split into {n} partitions without a partition column: each fetch of a partition reads the rows changed since its position (a scan of the table, or of an index on the rowversion column alone), hashes every key and keeps about 1 in {n}, and each of the {n} partitions does it again. Add the column and its index, then set \"partitionColumn\": \"{column}\" in sqltrigger.json: {}",
        shape.table,
        partition_ddl(&shape.table, &shape.key, &shape.version, &column, n)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Env;

    fn spec(table: &str) -> SourceSpec {
        let env = Env::from_pairs([("SqlConnectionString".into(), "Server=tcp:x,1433;Password=hunter2".into())]);
        let sqltrigger = serde_json::json!({ "tableName": table, "connectionStringSetting": "SqlConnectionString" });
        SourceSpec::from_json(&sqltrigger, &env).expect("a valid spec")
    }

    fn db() -> DatabaseFacts {
        DatabaseFacts {
            compatibility_level: 160,
            snapshot_state: 1,
            read_committed_snapshot: true,
            ct_version: Some(10),
            retention: Some((2, 3)),
            name: "app db".into(),
            user: "func_app".into(),
        }
    }

    fn table_ok() -> TableFacts {
        TableFacts {
            object_id: Some(42),
            is_base_table: true,
            can_select: true,
            can_view_change_tracking: true,
            min_valid_version: Some(1),
        }
    }

    fn col(name: &str, ty: SqlType, id: i32, pk: Option<i32>) -> ColumnFacts {
        ColumnFacts { name: name.into(), ty, column_id: id, pk_ordinal: pk }
    }

    fn cols() -> Vec<ColumnFacts> {
        vec![col("Id", SqlType::new("int"), 1, Some(1)), col("Name", SqlType::new("nvarchar").with_length(50), 2, None)]
    }

    fn err(r: Result<CtShape, SourceError>) -> String {
        match r {
            Err(SourceError::Invalid(m)) => m,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn change_tracking_off_on_the_database_gives_both_statements() {
        let d = DatabaseFacts { ct_version: None, ..db() };
        assert_eq!(
            err(change_tracking_shape(&spec("dbo.Orders"), &d, &table_ok(), &cols(), false, false)),
            "change tracking is not enabled on database [app db]: run ALTER DATABASE [app db] SET CHANGE_TRACKING = ON (CHANGE_RETENTION = 2 DAYS, AUTO_CLEANUP = ON); ALTER TABLE [dbo].[Orders] ENABLE CHANGE_TRACKING"
        );
    }

    #[test]
    fn change_tracking_off_on_the_table_gives_the_alter_table() {
        let t = TableFacts { min_valid_version: None, ..table_ok() };
        assert_eq!(
            err(change_tracking_shape(&spec("dbo.Orders"), &db(), &t, &cols(), false, true)),
            "change tracking is not enabled on table dbo.Orders: run ALTER TABLE [dbo].[Orders] ENABLE CHANGE_TRACKING WITH (TRACK_COLUMNS_UPDATED = ON)"
        );
    }

    #[test]
    fn a_missing_table_a_view_and_missing_permissions_say_what_to_do() {
        let missing = TableFacts { object_id: None, ..table_ok() };
        assert!(err(change_tracking_shape(&spec("dbo.Nope"), &db(), &missing, &cols(), false, false))
            .starts_with("table dbo.Nope was not found in database [app db] (or login user [func_app] cannot see it)"));
        let view = TableFacts { is_base_table: false, ..table_ok() };
        assert!(
            err(change_tracking_shape(&spec("dbo.V"), &db(), &view, &cols(), false, false)).contains("is not a table")
        );
        let no_select = TableFacts { can_select: false, ..table_ok() };
        assert_eq!(
            err(change_tracking_shape(&spec("dbo.Orders"), &db(), &no_select, &cols(), false, false)),
            "login user [func_app] may not read dbo.Orders: run GRANT SELECT ON [dbo].[Orders] TO [func_app]"
        );
        let no_ct = TableFacts { can_view_change_tracking: false, ..table_ok() };
        assert_eq!(
            err(change_tracking_shape(&spec("dbo.Orders"), &db(), &no_ct, &cols(), false, false)),
            "login user [func_app] may not read the changes of dbo.Orders: run GRANT VIEW CHANGE TRACKING ON [dbo].[Orders] TO [func_app]"
        );
    }

    #[test]
    fn key_problems_are_named() {
        let no_pk = vec![col("Id", SqlType::new("int"), 1, None)];
        assert!(err(change_tracking_shape(&spec("dbo.Orders"), &db(), &table_ok(), &no_pk, false, false))
            .starts_with("table dbo.Orders has no primary key"));
        let reserved = vec![col("_az_func_Id", SqlType::new("int"), 1, Some(1))];
        assert!(err(change_tracking_shape(&spec("dbo.Orders"), &db(), &table_ok(), &reserved, false, false))
            .contains("reserved prefix _az_func_"));
        let mut s = spec("dbo.Orders");
        s.primary_key = Some(vec![Ident::new("Name").expect("valid")]);
        assert!(err(change_tracking_shape(&s, &db(), &table_ok(), &cols(), false, false))
            .contains("must be the table's primary key for change tracking (Id)"));
    }

    #[test]
    fn unsupported_types_are_rejected_unless_left_out_with_columns() {
        let mut c = cols();
        c.push(col("Shape", SqlType::new("geography"), 3, None));
        let m = err(change_tracking_shape(&spec("dbo.Orders"), &db(), &table_ok(), &c, false, false));
        assert!(m.starts_with("column \"Shape\" of dbo.Orders has type geography"), "{m}");
        let mut s = spec("dbo.Orders");
        s.columns = Some(vec![Ident::new("Id").expect("valid"), Ident::new("Name").expect("valid")]);
        let shape = change_tracking_shape(&s, &db(), &table_ok(), &c, false, false).expect("valid");
        assert_eq!(shape.item.len(), 2);
        s.columns = Some(vec![Ident::new("Nope").expect("valid")]);
        assert!(err(change_tracking_shape(&s, &db(), &table_ok(), &c, false, false))
            .contains("\"Nope\", which is not a column"));
    }

    #[test]
    fn snapshot_isolation_is_used_only_when_the_database_allows_it() {
        let shape =
            change_tracking_shape(&spec("dbo.Orders"), &db(), &table_ok(), &cols(), false, false).expect("valid");
        assert!(shape.snapshot);
        let d = DatabaseFacts { snapshot_state: 0, ..db() };
        assert!(
            !change_tracking_shape(&spec("dbo.Orders"), &d, &table_ok(), &cols(), false, false)
                .expect("valid")
                .snapshot
        );
    }

    #[test]
    fn rowversion_needs_a_rowversion_column() {
        let m = match rowversion_shape(&spec("dbo.Items"), &RowversionOptions::default(), &db(), &table_ok(), &cols()) {
            Err(SourceError::Invalid(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(m.starts_with("table dbo.Items has no rowversion column"), "{m}");
        let mut c = cols();
        c.push(col("RV", SqlType::new("timestamp"), 3, None));
        let shape =
            rowversion_shape(&spec("dbo.Items"), &RowversionOptions::default(), &db(), &table_ok(), &c).expect("valid");
        assert_eq!(shape.version.as_str(), "RV");
    }

    fn partitioned(table: &str, count: u32) -> SourceSpec {
        let mut s = spec(table);
        s.partition = Partition::new(1, std::num::NonZeroU32::new(count).expect("above 0"));
        s
    }

    fn items_cols() -> Vec<ColumnFacts> {
        let mut c = cols();
        c.push(col("RV", SqlType::new("timestamp"), 3, None));
        c.push(col("sqltrigger_p8", SqlType::new("int"), 4, None));
        c
    }

    fn with_column(name: &str) -> RowversionOptions {
        RowversionOptions { partition_column: Some(Ident::new(name).expect("valid")), ..Default::default() }
    }

    fn facts(definition: &str, indexes: i32) -> PartitionColumnFacts {
        PartitionColumnFacts { definition: definition.into(), persisted: true, indexes }
    }

    #[test]
    fn a_partition_column_is_read_through_and_left_out_of_item() {
        let s = partitioned("dbo.Items", 8);
        let shape =
            rowversion_shape(&s, &with_column("sqltrigger_p8"), &db(), &table_ok(), &items_cols()).expect("valid");
        assert_eq!(shape.partition, Some(PartitionFilter::Column(Ident::new("sqltrigger_p8").expect("valid"))));
        let item: Vec<&str> = shape.item.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(item, ["Id", "Name", "RV"], "the handler's column is not the app's data");
        let inline =
            rowversion_shape(&s, &RowversionOptions::default(), &db(), &table_ok(), &items_cols()).expect("valid");
        assert_eq!(inline.partition, Some(PartitionFilter::Inline));
        let unpartitioned =
            rowversion_shape(&spec("dbo.Items"), &RowversionOptions::default(), &db(), &table_ok(), &items_cols());
        assert_eq!(unpartitioned.expect("valid").partition, None);
        let missing = rowversion_shape(&s, &with_column("p16"), &db(), &table_ok(), &items_cols());
        assert!(
            matches!(missing, Err(SourceError::Invalid(m)) if m.starts_with("partitionColumn \"p16\" is not a column of dbo.Items"))
        );
    }

    #[test]
    fn the_change_tracking_source_is_partitioned_when_its_spec_names_a_partition() {
        let shape = change_tracking_shape(&partitioned("dbo.Orders", 4), &db(), &table_ok(), &cols(), false, false);
        assert!(shape.expect("valid").partitioned);
        let shape = change_tracking_shape(&spec("dbo.Orders"), &db(), &table_ok(), &cols(), false, false);
        assert!(!shape.expect("valid").partitioned);
    }

    #[test]
    fn the_partition_column_must_hold_the_hash_modulo_n_and_its_index_is_checked() {
        // GIVEN partition 1 of 8 of dbo.Items read through sqltrigger_p8
        let s = partitioned("dbo.Items", 8);
        let shape =
            rowversion_shape(&s, &with_column("sqltrigger_p8"), &db(), &table_ok(), &items_cols()).expect("valid");
        let p = s.partition.expect("a partition");
        let stored = "((checksum([Id])&(2147483647))%(8))";

        // THEN the definition as SQL Server stores it passes, and with an index nothing is said
        assert_eq!(check_partition_column(&shape, p, Some(&facts(stored, 1))).expect("valid"), None);
        // AND without the index the source works and says what to run and what a fetch costs
        let warning = check_partition_column(&shape, p, Some(&facts(stored, 0))).expect("valid").expect("a warning");
        assert!(warning.contains("has no index leading with ([sqltrigger_p8], [RV])"), "{warning}");
        assert!(warning.contains("to keep about 1 in 8, and each partition does it again"), "{warning}");
        assert!(
            warning
                .ends_with("Run CREATE INDEX [IX_Items_sqltrigger_p8] ON [dbo].[Items] ([sqltrigger_p8], [RV], [Id])"),
            "{warning}"
        );
        // AND a column for another N, another key or no computed column at all is refused
        for bad in ["((checksum([Id])&(2147483647))%(4))", "(checksum([Name])&(2147483647))%(8)", "[Id]%(8)"] {
            let err = check_partition_column(&shape, p, Some(&facts(bad, 1))).expect_err(bad);
            assert!(
                err.to_string().contains("but 8 partitions of the key need ((CHECKSUM([Id]) & 2147483647) % 8)"),
                "{err}"
            );
        }
        let err = check_partition_column(&shape, p, None).expect_err("not computed");
        assert!(err.to_string().contains("is not a computed column"), "{err}");
    }

    #[test]
    fn a_partitioned_rowversion_source_without_a_column_says_what_each_fetch_costs_and_what_to_add() {
        let s = partitioned("dbo.Items", 8);
        let shape =
            rowversion_shape(&s, &RowversionOptions::default(), &db(), &table_ok(), &items_cols()).expect("valid");
        let warning = inline_partition_warning(&shape, s.partition.expect("a partition")).expect("a warning");
        assert_eq!(
            warning,
            "dbo.Items is split into 8 partitions without a partition column: each fetch of a partition reads the rows changed since its position (a scan of the table, or of an index on the rowversion column alone), hashes every key and keeps about 1 in 8, and each of the 8 partitions does it again. Add the column and its index, then set \"partitionColumn\": \"sqltrigger_p8\" in sqltrigger.json: ALTER TABLE [dbo].[Items] ADD [sqltrigger_p8] AS ((CHECKSUM([Id]) & 2147483647) % 8) PERSISTED; CREATE INDEX [IX_Items_sqltrigger_p8] ON [dbo].[Items] ([sqltrigger_p8], [RV], [Id])"
        );
    }
}
