//! Every statement the SQL Server sources run, built in one place from validated, quoted names.
//!
//! Rules every statement here keeps (the golden tests in `tests/golden/mssql/` pin the exact text):
//! - Identifiers reach SQL only through [`Ident::mssql`] / [`TableName::mssql`]; values only as `@Pn`
//!   parameters, bound in the order [`Statement::slots`] lists. Type names come from [`SqlType`]'s fixed list.
//! - Keywords, aliases and literals are upper case, and catalog reads go through `INFORMATION_SCHEMA` (whose
//!   names are upper case) and built-in functions. In a case-sensitive database `sys.objects` must be written
//!   in lower case and `INFORMATION_SCHEMA.COLUMNS` in upper case; staying upper case everywhere a value is
//!   bound keeps one spelling valid in every collation. The one statement that reads `sys.databases` binds
//!   nothing and writes those names in lower case; the lag's read of `sys.dm_tran_commit_table` binds values
//!   and writes exactly that view's names in lower case (`golden::SYSTEM_NAMES` checks), and the partition column's
//!   catalog read the `sys` names it needs (`golden::PARTITION_CATALOG_NAMES`); everything else upper case.
//! - SQL Server has no row-value comparison, so the keyset `(v, k1, k2) > (@v, @k1, @k2)` is expanded to
//!   `v >= @v AND (v > @v OR (v = @v AND (k1 > @k1 OR (k1 = @k1 AND k2 > @k2))))`: the leading `v >= @v`
//!   is redundant for the result but gives the optimizer a bounded range to seek.
//! - `SET TRANSACTION ISOLATION LEVEL SNAPSHOT` inside a parameterized batch lasts only for that batch
//!   (SQL Server restores the caller's level when `sp_executesql` returns), so a pooled connection never
//!   carries it into another statement.

mod backfill;
mod change_tracking;
mod filter;
mod partition;
mod rowversion;

pub use change_tracking::CtShape;
pub use filter::MssqlFilter;
pub use partition::partition_column;
pub use rowversion::{Labels, RvShape};

use super::types::SqlType;
use crate::ident::Ident;

/// What a statement parameter holds; the source binds values in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// The quoted table name, for `OBJECT_ID`.
    Table,
    /// The change-tracking base version passed to `CHANGETABLE`; for the rowversion source, the base
    /// rowversion of the backlog (rows inserted since are Inserts).
    Base,
    /// The version (or rowversion) of the last delivered change.
    AfterVersion,
    /// The text of the last delivered change's key column `i`.
    AfterKey(usize),
    UptoVersion,
    UptoKey(usize),
    /// The `CHANGE_TRACKING_CONTEXT` whose changes are skipped.
    Context,
    /// `TOP (@Pn)`.
    Limit,
    /// The partition this source reads (`Partition::index`).
    PartitionIndex,
    /// How many partitions there are (`Partition::count`), for the hash written inline.
    PartitionCount,
    /// The name of the rowversion source's `partitionColumn` (catalog read).
    PartitionColumnName,
    /// The name of the rowversion column (catalog read).
    VersionColumnName,
    /// What a backfill's chunks are bounded by (rowversion: the checkpoint's rowversion; change tracking: the
    /// checkpoint's version).
    Bound,
    /// The text of literal `i` of a backfill's filter, in the order the filter is written.
    Filter(usize),
}

/// The mask that keeps `CHECKSUM`'s int non-negative before the modulo (T-SQL's `%` keeps the dividend's sign).
pub const PARTITION_MASK: i64 = 2_147_483_647;

/// `(CHECKSUM(k1, k2, ...) & 2147483647)`: the partition hash of a key, before `% N`. `CHECKSUM` is deterministic
/// (SQL Server indexes computed columns over it) and documented to return one value for lists whose elements
/// have the same types and compare equal with `=`: keys the primary key calls equal (under the column's
/// collation) hash together, as a partition of keys must. `cols` are the key columns in key order, each already
/// qualified (`T.[Id]`, `CT.[Id]`).
pub fn partition_hash(cols: &[String]) -> String {
    format!("(CHECKSUM({}) & {PARTITION_MASK})", cols.join(", "))
}

/// How a partitioned read keeps only its partition's keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartitionFilter {
    /// The hash modulo N is computed inline from the key columns: every row of the read range is read and hashed
    /// (the change-tracking source always; the rowversion source without `partitionColumn`).
    Inline,
    /// A computed column holding `(CHECKSUM(key) & 2147483647) % N` (rowversion `partitionColumn`): an equality
    /// an index on (column, rowversion, key) seeks.
    Column(Ident),
}

impl PartitionFilter {
    /// The predicate for the rows of `alias` whose key columns are `key`, binding the partition's index (and
    /// the count, inline). The index is cast to `INT` so the comparison with the int column or hash needs no
    /// conversion of the column side (a bigint parameter would convert the column and lose the seek).
    fn predicate(&self, p: &mut Params, alias: &str, key: &[KeyColumn]) -> String {
        match self {
            Self::Inline => {
                let cols: Vec<String> = key.iter().map(|k| format!("{alias}.{}", k.name.mssql())).collect();
                format!(
                    "{} % CAST({} AS INT) = CAST({} AS INT)",
                    partition_hash(&cols),
                    p.p(Slot::PartitionCount),
                    p.p(Slot::PartitionIndex)
                )
            }
            Self::Column(c) => format!("{alias}.{} = CAST({} AS INT)", c.mssql(), p.p(Slot::PartitionIndex)),
        }
    }
}

/// A statement and the meaning of each of its parameters, `@P1` first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    pub sql: String,
    pub slots: Vec<Slot>,
}

/// Numbers parameters in order of first use; a slot used twice reuses its parameter.
#[derive(Debug, Default)]
struct Params(Vec<Slot>);

impl Params {
    fn p(&mut self, slot: Slot) -> String {
        let n = match self.0.iter().position(|s| *s == slot) {
            Some(i) => i + 1,
            None => {
                self.0.push(slot);
                self.0.len()
            }
        };
        format!("@P{n}")
    }
}

/// A key column: its name and type (for the text round trip of positions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyColumn {
    pub name: Ident,
    pub ty: SqlType,
}

/// A column of `Item`, with its `column_id` (for `CHANGE_TRACKING_IS_COLUMN_IN_MASK`) and type (for its JSON form).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemColumn {
    pub name: Ident,
    pub column_id: i32,
    pub ty: SqlType,
}

/// Which side of a keyset a statement starts from or stops at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// No lower bound (the base version alone bounds change reads).
    Start,
    /// After a version (rowversion) only: `v > @v`.
    Version,
    /// After a version and key: the expanded row-value comparison.
    Key,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upto {
    /// Up to `CHANGE_TRACKING_CURRENT_VERSION()` read in the same statement (fetch).
    Current,
    /// Up to and including a version (re-reading a batch that ended with a drained read).
    Version,
    /// Up to and including a version and key (re-reading a batch that ended inside a version).
    Key,
}

fn isolation(snapshot: bool) -> &'static str {
    if snapshot {
        "SET TRANSACTION ISOLATION LEVEL SNAPSHOT; "
    } else {
        ""
    }
}

/// `FOR JSON PATH` object of `cols` read from `alias`: `Item` exactly as the official trigger sends it
/// (keys are the column names, NULLs included, binary as base64, dates ISO 8601).
fn json_object<'a>(alias: &str, cols: impl Iterator<Item = (&'a Ident, &'a SqlType)>) -> String {
    let list: Vec<String> =
        cols.map(|(c, ty)| format!("{} AS {}", ty.json_value(&format!("{alias}.{}", c.mssql())), c.mssql())).collect();
    format!("(SELECT {} FOR JSON PATH, INCLUDE_NULL_VALUES, WITHOUT_ARRAY_WRAPPER)", list.join(", "))
}

/// `(c1, c2, ...) > (p1, p2, ...)` (or `<=` when `upto`), expanded for a dialect without row values, with
/// the leading column bounded for a seek.
fn keyset(cols: &[(String, String)], upto: bool) -> String {
    fn nest(cols: &[(String, String)], upto: bool) -> String {
        let (c, p) = &cols[0];
        if cols.len() == 1 {
            return format!("{c} {} {p}", if upto { "<=" } else { ">" });
        }
        let rest = nest(&cols[1..], upto);
        let rest = if cols.len() > 2 { format!("({rest})") } else { rest };
        format!("{c} {} {p} OR ({c} = {p} AND {rest})", if upto { "<" } else { ">" })
    }
    let (c, p) = &cols[0];
    if cols.len() == 1 {
        return nest(cols, upto);
    }
    format!("{c} {} {p} AND ({})", if upto { "<=" } else { ">=" }, nest(cols, upto))
}

/// The minimum valid and current change-tracking versions (start positions). Row shape: `MINV, CUR`. (Not
/// in the order the fetch reads them, so neither text contains the other.)
pub fn versions() -> Statement {
    Statement {
        sql:
            "SELECT CHANGE_TRACKING_MIN_VALID_VERSION(OBJECT_ID(@P1)) AS MINV, CHANGE_TRACKING_CURRENT_VERSION() AS CUR"
                .into(),
        slots: vec![Slot::Table],
    }
}

/// Database facts, read once per source: binds nothing, so it may name `sys` views in their own case.
/// Row shape: `COMPAT, SNAPSHOT_STATE, RCSI, CT_VERSION, RETENTION, RETENTION_UNITS, DB, LOGIN_USER`.
pub const DATABASE: &str = "SELECT CAST(d.compatibility_level AS INT) AS COMPAT, \
CAST(d.snapshot_isolation_state AS INT) AS SNAPSHOT_STATE, \
CAST(d.is_read_committed_snapshot_on AS INT) AS RCSI, \
CHANGE_TRACKING_CURRENT_VERSION() AS CT_VERSION, \
CAST(ct.retention_period AS INT) AS RETENTION, \
CAST(ct.retention_period_units AS INT) AS RETENTION_UNITS, \
DB_NAME() AS DB, USER_NAME() AS LOGIN_USER \
FROM sys.databases AS d LEFT JOIN sys.change_tracking_databases AS ct ON ct.database_id = d.database_id \
WHERE d.database_id = DB_ID()";

/// Table facts: object id, whether it is a base table, the login's permissions and the table's minimum
/// valid change-tracking version (NULL when tracking is off for it).
/// Row shape: `ID, IS_TABLE, CAN_SELECT, CAN_VIEW_CT, MINV`.
pub fn table() -> Statement {
    Statement {
        sql: "SELECT OBJECT_ID(@P1) AS ID, \
CAST((SELECT COUNT(*) FROM INFORMATION_SCHEMA.TABLES AS IT WHERE IT.TABLE_SCHEMA = OBJECT_SCHEMA_NAME(OBJECT_ID(@P1)) AND IT.TABLE_NAME = OBJECT_NAME(OBJECT_ID(@P1)) AND IT.TABLE_TYPE = N'BASE TABLE') AS INT) AS IS_TABLE, \
CAST(HAS_PERMS_BY_NAME(@P1, N'OBJECT', N'SELECT') AS INT) AS CAN_SELECT, \
CAST(HAS_PERMS_BY_NAME(@P1, N'OBJECT', N'VIEW CHANGE TRACKING') AS INT) AS CAN_VIEW_CT, \
CHANGE_TRACKING_MIN_VALID_VERSION(OBJECT_ID(@P1)) AS MINV"
            .into(),
        slots: vec![Slot::Table],
    }
}

/// The table's columns in order with their types, column ids and primary-key ordinal (NULL when not in
/// the key), and the collation of character columns. Row shape: `NAME, TYPE, LEN, PREC, SCALE, DT_PREC,
/// COLUMN_ID, PK_ORDINAL, COLL`.
pub fn columns() -> Statement {
    Statement {
        sql: "SELECT C.COLUMN_NAME AS NAME, C.DATA_TYPE AS TYPE, C.CHARACTER_MAXIMUM_LENGTH AS LEN, \
CAST(C.NUMERIC_PRECISION AS INT) AS PREC, CAST(C.NUMERIC_SCALE AS INT) AS SCALE, CAST(C.DATETIME_PRECISION AS INT) AS DT_PREC, \
CAST(COLUMNPROPERTY(OBJECT_ID(@P1), C.COLUMN_NAME, N'COLUMNID') AS INT) AS COLUMN_ID, K.ORDINAL_POSITION AS PK_ORDINAL, \
C.COLLATION_NAME AS COLL \
FROM INFORMATION_SCHEMA.COLUMNS AS C \
LEFT JOIN (INFORMATION_SCHEMA.KEY_COLUMN_USAGE AS K JOIN INFORMATION_SCHEMA.TABLE_CONSTRAINTS AS TC \
ON TC.CONSTRAINT_SCHEMA = K.CONSTRAINT_SCHEMA AND TC.CONSTRAINT_NAME = K.CONSTRAINT_NAME AND TC.CONSTRAINT_TYPE = N'PRIMARY KEY') \
ON K.TABLE_SCHEMA = C.TABLE_SCHEMA AND K.TABLE_NAME = C.TABLE_NAME AND K.COLUMN_NAME = C.COLUMN_NAME \
WHERE C.TABLE_SCHEMA = OBJECT_SCHEMA_NAME(OBJECT_ID(@P1)) AND C.TABLE_NAME = OBJECT_NAME(OBJECT_ID(@P1)) \
ORDER BY C.ORDINAL_POSITION"
            .into(),
        slots: vec![Slot::Table],
    }
}

#[cfg(test)]
mod golden;
