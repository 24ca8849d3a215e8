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
//!   and writes exactly that view's names in lower case (`golden::SYSTEM_NAMES` checks), everything else upper case.
//! - SQL Server has no row-value comparison, so the keyset `(v, k1, k2) > (@v, @k1, @k2)` is expanded to
//!   `v >= @v AND (v > @v OR (v = @v AND (k1 > @k1 OR (k1 = @k1 AND k2 > @k2))))`: the leading `v >= @v`
//!   is redundant for the result but gives the optimizer a bounded range to seek.
//! - `SET TRANSACTION ISOLATION LEVEL SNAPSHOT` inside a parameterized batch lasts only for that batch
//!   (SQL Server restores the caller's level when `sp_executesql` returns), so a pooled connection never
//!   carries it into another statement.

use super::types::SqlType;
use crate::ident::{Ident, TableName};

/// What a statement parameter holds; the source binds values in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// The quoted table name, for `OBJECT_ID`.
    Table,
    /// The change-tracking base version passed to `CHANGETABLE`.
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

/// A column of `Item`, with its `column_id` (for `CHANGE_TRACKING_IS_COLUMN_IN_MASK`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemColumn {
    pub name: Ident,
    pub column_id: i32,
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
fn json_object<'a>(alias: &str, cols: impl Iterator<Item = &'a Ident>) -> String {
    let list: Vec<String> = cols.map(|c| format!("{alias}.{} AS {}", c.mssql(), c.mssql())).collect();
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

/// The table's shape as the change-tracking source reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtShape {
    pub table: TableName,
    /// Primary key columns in key order (what `CHANGETABLE` returns).
    pub key: Vec<KeyColumn>,
    pub item: Vec<ItemColumn>,
    /// Read under SNAPSHOT isolation (the database allows it).
    pub snapshot: bool,
    pub skip_context: bool,
    /// Return creation version and changed-column mask for `Metadata`.
    pub metadata: bool,
}

impl CtShape {
    fn key_params(&self, p: &mut Params, version: Slot, key: fn(usize) -> Slot, alias: &str) -> Vec<(String, String)> {
        let mut cols = vec![(format!("{alias}.SYS_CHANGE_VERSION"), p.p(version))];
        for (i, k) in self.key.iter().enumerate() {
            cols.push((format!("{alias}.{}", k.name.mssql()), k.ty.parse_text(&p.p(key(i)))));
        }
        cols
    }

    fn context_filter(&self, p: &mut Params) -> Option<String> {
        self.skip_context
            .then(|| format!("(CT.SYS_CHANGE_CONTEXT IS NULL OR CT.SYS_CHANGE_CONTEXT <> {})", p.p(Slot::Context)))
    }

    /// Net changes after a position, with the current and minimum valid versions read in the same statement.
    ///
    /// Row shape: `CUR, MINV, VER, OP, ITEM, CREATED, MASK, K1..Kn`. The outer query always returns one
    /// row (NULL change columns when there is no change), so an empty read still reports both versions.
    /// `OP` is 2 for a delete, and also when the row is gone from the table although the change says
    /// insert or update (possible only without SNAPSHOT: it was deleted between the two reads, and its
    /// delete follows).
    pub fn changes(&self, from: After, upto: Upto) -> Statement {
        let mut p = Params::default();
        let table = self.table.mssql();
        let table_param = p.p(Slot::Table);
        let limit = p.p(Slot::Limit);
        let base = p.p(Slot::Base);
        let first = self.key[0].name.mssql();
        let gone = format!("CT.SYS_CHANGE_OPERATION = N'D' OR T.{first} IS NULL");
        let op = format!("CAST(CASE WHEN {gone} THEN 2 WHEN CT.SYS_CHANGE_OPERATION = N'I' THEN 0 ELSE 1 END AS INT)");
        let item = format!(
            "CASE WHEN {gone} THEN {} ELSE {} END",
            json_object("CT", self.key.iter().map(|k| &k.name)),
            json_object("T", self.item.iter().map(|c| &c.name))
        );
        let (created, mask) = if self.metadata {
            let bits: Vec<String> = self
                .item
                .iter()
                .map(|c| format!("CHANGE_TRACKING_IS_COLUMN_IN_MASK({}, CT.SYS_CHANGE_COLUMNS)", c.column_id))
                .collect();
            (
                "CT.SYS_CHANGE_CREATION_VERSION".to_string(),
                format!("CASE WHEN CT.SYS_CHANGE_COLUMNS IS NULL THEN NULL ELSE CONCAT(N'', {}) END", bits.join(", ")),
            )
        } else {
            ("CAST(NULL AS BIGINT)".to_string(), "CAST(NULL AS NVARCHAR(MAX))".to_string())
        };
        let mut select = vec![
            "CT.SYS_CHANGE_VERSION AS VER".to_string(),
            format!("{op} AS OP"),
            format!("{item} AS ITEM"),
            format!("{created} AS CREATED"),
            format!("{mask} AS MASK"),
        ];
        for (i, k) in self.key.iter().enumerate() {
            select.push(format!("{} AS K{}", k.ty.to_text(&format!("CT.{}", k.name.mssql())), i + 1));
        }
        for (i, k) in self.key.iter().enumerate() {
            select.push(format!("CT.{} AS N{}", k.name.mssql(), i + 1));
        }
        let join: Vec<String> =
            self.key.iter().map(|k| format!("T.{} = CT.{}", k.name.mssql(), k.name.mssql())).collect();

        let mut preds = vec!["CT.SYS_CHANGE_VERSION <= V.CUR".to_string()];
        match from {
            After::Start => {}
            After::Version => preds.push(format!("CT.SYS_CHANGE_VERSION > {}", p.p(Slot::AfterVersion))),
            After::Key => preds.push(format!(
                "({})",
                keyset(&self.key_params(&mut p, Slot::AfterVersion, Slot::AfterKey, "CT"), false)
            )),
        }
        match upto {
            Upto::Current => {}
            Upto::Version => preds.push(format!("CT.SYS_CHANGE_VERSION <= {}", p.p(Slot::UptoVersion))),
            Upto::Key => preds
                .push(format!("({})", keyset(&self.key_params(&mut p, Slot::UptoVersion, Slot::UptoKey, "CT"), true))),
        }
        preds.extend(self.context_filter(&mut p));

        let order: Vec<String> = std::iter::once("CT.SYS_CHANGE_VERSION".to_string())
            .chain(self.key.iter().map(|k| format!("CT.{}", k.name.mssql())))
            .collect();
        let outer_cols: Vec<String> = ["V.CUR", "V.MINV", "C.VER", "C.OP", "C.ITEM", "C.CREATED", "C.MASK"]
            .iter()
            .map(|s| s.to_string())
            .chain((1..=self.key.len()).map(|i| format!("C.K{i}")))
            .collect();
        let outer_order: Vec<String> =
            std::iter::once("C.VER".to_string()).chain((1..=self.key.len()).map(|i| format!("C.N{i}"))).collect();
        let sql = format!(
            "{}SELECT {} FROM (SELECT CHANGE_TRACKING_CURRENT_VERSION() AS CUR, CHANGE_TRACKING_MIN_VALID_VERSION(OBJECT_ID({table_param})) AS MINV) AS V \
OUTER APPLY (SELECT TOP ({limit}) {} FROM CHANGETABLE(CHANGES {table}, {base}) AS CT LEFT JOIN {table} AS T ON {} WHERE {} ORDER BY {}) AS C \
ORDER BY {}",
            isolation(self.snapshot),
            outer_cols.join(", "),
            select.join(", "),
            join.join(" AND "),
            preds.join(" AND "),
            order.join(", "),
            outer_order.join(", ")
        );
        Statement { sql, slots: p.0 }
    }

    /// How many net changes wait after a position (same predicate as the fetch, counted).
    /// Row shape: `MINV, PENDING`.
    pub fn pending(&self, from: After) -> Statement {
        let mut p = Params::default();
        let table = self.table.mssql();
        let table_param = p.p(Slot::Table);
        let base = p.p(Slot::Base);
        let mut preds = vec!["CT.SYS_CHANGE_VERSION <= CHANGE_TRACKING_CURRENT_VERSION()".to_string()];
        match from {
            After::Start => {}
            After::Version => preds.push(format!("CT.SYS_CHANGE_VERSION > {}", p.p(Slot::AfterVersion))),
            After::Key => preds.push(format!(
                "({})",
                keyset(&self.key_params(&mut p, Slot::AfterVersion, Slot::AfterKey, "CT"), false)
            )),
        }
        preds.extend(self.context_filter(&mut p));
        let sql = format!(
            "SELECT CHANGE_TRACKING_MIN_VALID_VERSION(OBJECT_ID({table_param})) AS MINV, COUNT_BIG(*) AS PENDING \
FROM CHANGETABLE(CHANGES {table}, {base}) AS CT WHERE {}",
            preds.join(" AND ")
        );
        Statement { sql, slots: p.0 }
    }

    /// The age of the first pending change after a position (the lag in status): its version is a
    /// `commit_ts` of `sys.dm_tran_commit_table`, whose `commit_time` says when it committed. Same predicate
    /// and order as the fetch, first row only. Row shape: `VER, AGE_S`; no row when nothing waits, and a NULL
    /// `AGE_S` when the commit table no longer holds that version. Reading the view needs VIEW DATABASE STATE.
    ///
    /// The view's names must be lower case (a case-sensitive database knows them only so); they come last, in
    /// an `OUTER APPLY` after every bound parameter, so the upper-case part a mock can match holds the whole
    /// predicate. `commit_time` is compared with `SYSUTCDATETIME()`: the view's documentation does not name
    /// its time zone; UTC is assumed (Azure SQL runs in UTC), and only a real server (tier 3) can confirm it.
    pub fn oldest(&self, from: After) -> Statement {
        let mut p = Params::default();
        let table = self.table.mssql();
        let base = p.p(Slot::Base);
        let mut preds = vec!["CT.SYS_CHANGE_VERSION <= CHANGE_TRACKING_CURRENT_VERSION()".to_string()];
        match from {
            After::Start => {}
            After::Version => preds.push(format!("CT.SYS_CHANGE_VERSION > {}", p.p(Slot::AfterVersion))),
            After::Key => preds.push(format!(
                "({})",
                keyset(&self.key_params(&mut p, Slot::AfterVersion, Slot::AfterKey, "CT"), false)
            )),
        }
        preds.extend(self.context_filter(&mut p));
        let order: Vec<String> = std::iter::once("CT.SYS_CHANGE_VERSION".to_string())
            .chain(self.key.iter().map(|k| format!("CT.{}", k.name.mssql())))
            .collect();
        let sql = format!(
            "SELECT C.VER, A.AGE_S FROM (SELECT TOP (1) CT.SYS_CHANGE_VERSION AS VER FROM CHANGETABLE(CHANGES {table}, {base}) AS CT \
WHERE {} ORDER BY {}) AS C \
OUTER APPLY (SELECT DATEDIFF(SECOND, TC.commit_time, SYSUTCDATETIME()) AS AGE_S FROM sys.dm_tran_commit_table AS TC WHERE TC.commit_ts = C.VER) AS A",
            preds.join(" AND "),
            order.join(", ")
        );
        Statement { sql, slots: p.0 }
    }

    /// The current rows in key order, for `startFrom: snapshot` and resync. Row shape: `OP, ITEM, K1..Kn`
    /// with `OP` always 0 (insert), as a first sync reports every existing row.
    pub fn walk(&self, after: bool, upto: bool) -> Statement {
        let mut p = Params::default();
        let limit = p.p(Slot::Limit);
        let cols = |p: &mut Params, key: fn(usize) -> Slot| -> Vec<(String, String)> {
            self.key
                .iter()
                .enumerate()
                .map(|(i, k)| (format!("T.{}", k.name.mssql()), k.ty.parse_text(&p.p(key(i)))))
                .collect()
        };
        let mut preds = Vec::new();
        if after {
            preds.push(format!("({})", keyset(&cols(&mut p, Slot::AfterKey), false)));
        }
        if upto {
            preds.push(format!("({})", keyset(&cols(&mut p, Slot::UptoKey), true)));
        }
        let mut select = vec![
            "CAST(0 AS INT) AS OP".to_string(),
            format!("{} AS ITEM", json_object("T", self.item.iter().map(|c| &c.name))),
        ];
        for (i, k) in self.key.iter().enumerate() {
            select.push(format!("{} AS K{}", k.ty.to_text(&format!("T.{}", k.name.mssql())), i + 1));
        }
        let order: Vec<String> = self.key.iter().map(|k| format!("T.{}", k.name.mssql())).collect();
        let filter = if preds.is_empty() { String::new() } else { format!(" WHERE {}", preds.join(" AND ")) };
        let sql = format!(
            "{}SELECT TOP ({limit}) {} FROM {} AS T{filter} ORDER BY {}",
            isolation(self.snapshot),
            select.join(", "),
            self.table.mssql(),
            order.join(", ")
        );
        Statement { sql, slots: p.0 }
    }

    /// Rows the walk has not reached yet (status only). Row shape: `PENDING`.
    pub fn walk_pending(&self, after: bool) -> Statement {
        let mut p = Params::default();
        let filter = if after {
            let cols: Vec<(String, String)> = self
                .key
                .iter()
                .enumerate()
                .map(|(i, k)| (format!("T.{}", k.name.mssql()), k.ty.parse_text(&p.p(Slot::AfterKey(i)))))
                .collect();
            format!(" WHERE ({})", keyset(&cols, false))
        } else {
            String::new()
        };
        Statement {
            sql: format!("SELECT COUNT_BIG(*) AS PENDING FROM {} AS T{filter}", self.table.mssql()),
            slots: p.0,
        }
    }
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
/// the key). Row shape: `NAME, TYPE, LEN, PREC, SCALE, DT_PREC, COLUMN_ID, PK_ORDINAL`.
pub fn columns() -> Statement {
    Statement {
        sql: "SELECT C.COLUMN_NAME AS NAME, C.DATA_TYPE AS TYPE, C.CHARACTER_MAXIMUM_LENGTH AS LEN, \
CAST(C.NUMERIC_PRECISION AS INT) AS PREC, CAST(C.NUMERIC_SCALE AS INT) AS SCALE, CAST(C.DATETIME_PRECISION AS INT) AS DT_PREC, \
CAST(COLUMNPROPERTY(OBJECT_ID(@P1), C.COLUMN_NAME, N'COLUMNID') AS INT) AS COLUMN_ID, K.ORDINAL_POSITION AS PK_ORDINAL \
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

/// The table's shape as the rowversion source reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RvShape {
    pub table: TableName,
    pub key: Vec<KeyColumn>,
    /// The `rowversion` column.
    pub version: Ident,
    pub item: Vec<Ident>,
    /// Soft-delete column, and whether it is `bit` (`= 1`) or anything else (`IS NOT NULL`).
    pub soft_delete: Option<(Ident, bool)>,
    /// A column set once at insert to a value comparable with the rowversion (`binary(8)` or `bigint`).
    pub inserted: Option<(Ident, bool)>,
    pub snapshot: bool,
}

impl RvShape {
    fn rv_param(p: &mut Params, slot: Slot) -> String {
        format!("CAST({} AS BINARY(8))", p.p(slot))
    }

    fn key_params(&self, p: &mut Params, version: Slot, key: fn(usize) -> Slot) -> Vec<(String, String)> {
        let mut cols = vec![(format!("T.{}", self.version.mssql()), Self::rv_param(p, version))];
        for (i, k) in self.key.iter().enumerate() {
            cols.push((format!("T.{}", k.name.mssql()), k.ty.parse_text(&p.p(key(i)))));
        }
        cols
    }

    /// Rows changed after a position and below `MIN_ACTIVE_ROWVERSION()`: a row is read only once no
    /// transaction that could still commit a smaller rowversion is open, so a late commit is not skipped.
    /// Row shape: `RV, OP, ITEM, K1..Kn`. `upto` bounds a re-read of a batch.
    pub fn changes(&self, from: After, upto: bool) -> Statement {
        let mut p = Params::default();
        let limit = p.p(Slot::Limit);
        let rv = format!("T.{}", self.version.mssql());
        let mut preds = vec![format!("{rv} < MIN_ACTIVE_ROWVERSION()")];
        match from {
            After::Start => {}
            After::Version => preds.push(format!("{rv} > {}", Self::rv_param(&mut p, Slot::AfterVersion))),
            After::Key => {
                preds.push(format!("({})", keyset(&self.key_params(&mut p, Slot::AfterVersion, Slot::AfterKey), false)))
            }
        }
        if upto {
            preds.push(format!("({})", keyset(&self.key_params(&mut p, Slot::UptoVersion, Slot::UptoKey), true)));
        }
        let deleted = self.soft_delete.as_ref().map(|(c, is_bit)| {
            if *is_bit {
                format!("T.{} = 1", c.mssql())
            } else {
                format!("T.{} IS NOT NULL", c.mssql())
            }
        });
        let inserted = match (&self.inserted, from) {
            (Some(_), After::Start) => Some("1 = 1".to_string()),
            (Some((c, is_binary)), _) => {
                let after =
                    if *is_binary { Self::rv_param(&mut p, Slot::AfterVersion) } else { p.p(Slot::AfterVersion) };
                Some(format!("T.{} > {after}", c.mssql()))
            }
            (None, _) => None,
        };
        let op = match (&deleted, &inserted) {
            (Some(d), Some(i)) => format!("CASE WHEN {d} THEN 2 WHEN {i} THEN 0 ELSE 1 END"),
            (Some(d), None) => format!("CASE WHEN {d} THEN 2 ELSE 1 END"),
            (None, Some(i)) => format!("CASE WHEN {i} THEN 0 ELSE 1 END"),
            (None, None) => "1".to_string(),
        };
        let row = json_object("T", self.item.iter());
        let item = match &deleted {
            Some(d) => {
                format!("CASE WHEN {d} THEN {} ELSE {row} END", json_object("T", self.key.iter().map(|k| &k.name)))
            }
            None => row,
        };
        let mut select =
            vec![format!("CAST({rv} AS BIGINT) AS RV"), format!("CAST({op} AS INT) AS OP"), format!("{item} AS ITEM")];
        for (i, k) in self.key.iter().enumerate() {
            select.push(format!("{} AS K{}", k.ty.to_text(&format!("T.{}", k.name.mssql())), i + 1));
        }
        let order: Vec<String> =
            std::iter::once(rv.clone()).chain(self.key.iter().map(|k| format!("T.{}", k.name.mssql()))).collect();
        let sql = format!(
            "{}SELECT TOP ({limit}) {} FROM {} AS T WHERE {} ORDER BY {}",
            isolation(self.snapshot),
            select.join(", "),
            self.table.mssql(),
            preds.join(" AND "),
            order.join(", ")
        );
        Statement { sql, slots: p.0 }
    }

    /// Readable rows after a position (status). Row shape: `PENDING`.
    pub fn pending(&self, from: After) -> Statement {
        let mut p = Params::default();
        let rv = format!("T.{}", self.version.mssql());
        let mut preds = vec![format!("{rv} < MIN_ACTIVE_ROWVERSION()")];
        match from {
            After::Start => {}
            After::Version => preds.push(format!("{rv} > {}", Self::rv_param(&mut p, Slot::AfterVersion))),
            After::Key => {
                preds.push(format!("({})", keyset(&self.key_params(&mut p, Slot::AfterVersion, Slot::AfterKey), false)))
            }
        }
        Statement {
            sql: format!(
                "SELECT COUNT_BIG(*) AS PENDING FROM {} AS T WHERE {}",
                self.table.mssql(),
                preds.join(" AND ")
            ),
            slots: p.0,
        }
    }

    /// The newest readable rowversion (for `startFrom: now`): everything below the oldest open transaction.
    /// Row shape: `RV`.
    pub fn newest() -> Statement {
        Statement { sql: "SELECT CAST(MIN_ACTIVE_ROWVERSION() AS BIGINT) - 1 AS RV".into(), slots: vec![] }
    }
}

#[cfg(test)]
#[path = "golden.rs"]
mod golden;
