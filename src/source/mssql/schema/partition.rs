//! A partitioned rowversion source's partition column: the expression it must hold for N partitions, the
//! statements that add it and its index, and the check of the column the catalog describes.

use super::facts::{invalid, quote};
use crate::config::Partition;
use crate::ident::{Ident, TableName};
use crate::source::mssql::sql::{KeyColumn, PartitionFilter, RvShape, PARTITION_MASK};
use crate::source::SourceError;

/// `sql::partition_column()`, decoded: the computed column's definition as SQL Server stores it, whether it is
/// persisted, and how many usable indexes lead with (it, the rowversion column).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionColumnFacts {
    pub definition: String,
    pub persisted: bool,
    pub indexes: i32,
}

/// The expression a `partitionColumn` must hold for `count` partitions of `key`, as the DDL writes it.
fn partition_expression(key: &[KeyColumn], count: u32) -> String {
    let cols: Vec<String> = key.iter().map(|k| k.name.mssql()).collect();
    format!("(CHECKSUM({}) & {PARTITION_MASK}) % {count}", cols.join(", "))
}

/// The statements that give a rowversion table its partition column and the index a partition's fetch seeks:
/// `(partition, rowversion, key)`, so a fetch is a seek on the partition, a range on the rowversion, and rows in
/// the fetch's order (no sort).
fn partition_ddl(table: &TableName, key: &[KeyColumn], version: &Ident, column: &str, count: u32) -> String {
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
fn suggested_partition_column(count: u32) -> String {
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
