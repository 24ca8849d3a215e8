//! Every statement the SQL Server sink sends, built in one place from validated, quoted names.
//!
//! One delivery is one T-SQL batch run with `sp_executesql` under `SET XACT_ABORT ON`, so any error rolls the
//! whole batch back (no partial upsert) and a connection lost mid-way leaves nothing behind. Rows travel as
//! JSON parameters read with `OPENJSON ... WITH (...)` (column names matched exactly, binary decoded from
//! base64 by OPENJSON itself), at most [`ROWS_PER_STATEMENT`] rows per statement like the official output
//! binding, upserted by `MERGE ... WITH (HOLDLOCK)` on the primary key.
//!
//! Parameters: `@P1` app/function, `@P2` fencing token, `@P3` batch id, `@P4`/`@P5` the batch's from/to
//! positions as JSON text, `@P6` rows, then one JSON array per statement from `@P7` on, or, past
//! [`MAX_ROW_PARAMS`] statements, one array of such arrays per few statements. The batch ends with one
//! result row: `status` 0 = written, 1 = fenced (`stored` is the newer token), 2 = already applied.
//!
//! Identifiers of the database are quoted as they are spelled (`[name]`); catalog views are named in lower
//! case (`sys.columns`), as a case-sensitive database requires. Positions are compared as binary text
//! (`COLLATE Latin1_General_100_BIN2`): under a case-insensitive collation two different positions could
//! otherwise compare equal.

use crate::ident::{Ident, TableName};
use crate::sink::upsert::{Column, RowGroup, TableShape, WritePlan};
use std::fmt;
use std::ops::Range;

/// Rows per statement, as the official output binding batches its MERGE.
pub const ROWS_PER_STATEMENT: usize = 1000;
/// The first parameter that carries rows.
pub const FIRST_ROWS_PARAM: usize = 7;
/// The parameters a delivery's statements may read rows from. SQL Server takes at most 2,100 parameters in
/// one request (error 8003; "parameters per stored procedure", Maximum capacity specifications), and
/// `sp_executesql` spends two of them on the statement and its parameter declarations (ADO.NET's batching
/// stops at 2,098 for that reason); the first six are the delivery's own.
pub const MAX_ROW_PARAMS: usize = 2100 - 2 - (FIRST_ROWS_PARAM - 1);

/// `N'...'` with quotes doubled.
fn literal(s: &str) -> String {
    format!("N'{}'", s.replace('\'', "''"))
}

/// The JSON path of a property named exactly `name`: `$."name"`, the name spelled as `upsert::plan` spells
/// it in every item (as serde_json writes a string), since OPENJSON matches a path against a name as written.
fn path(name: &Ident) -> String {
    let spelled = serde_json::to_string(name.as_str()).expect("a string serializes");
    literal(&format!("$.{spelled}"))
}

/// The type a column is read as from JSON. Character columns are read as `nvarchar(max)`, whatever their
/// own type: OPENJSON's conversion to `varchar` uses the database's default code page, so a value for a
/// `varchar` column with another collation would lose its characters to `?`. Read as Unicode, the value
/// is converted by the assignment to the column, in the column's own code page.
fn read_as(c: &Column) -> &str {
    if c.sql_type == "varchar(max)" {
        "nvarchar(max)"
    } else {
        &c.sql_type
    }
}

/// Where a statement's rows are: the JSON array `@Pn`, or the `index`-th array inside `@Pn` when statements
/// share parameters (read with the path `$[index]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rows {
    pub param: usize,
    pub index: Option<usize>,
}

#[cfg(test)]
impl Rows {
    /// The whole of `@P{param}`.
    pub fn param(param: usize) -> Self {
        Self { param, index: None }
    }
}

impl fmt::Display for Rows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            None => write!(f, "@P{}", self.param),
            Some(i) => write!(f, "@P{}, N'$[{i}]'", self.param),
        }
    }
}

/// A character column: one that can hold a JSON object or array, as its text.
pub fn character(c: &Column) -> bool {
    matches!(c.sql_type.as_str(), "nvarchar(max)" | "varchar(max)")
}

/// Whether column `i` is read twice: a character column outside the key. OPENJSON reads a property holding
/// an object or array as NULL unless the column is declared `AS JSON`, and reads a scalar as NULL if it is;
/// so such a column is read both ways and written as whichever is not NULL (a PostgreSQL json, jsonb or
/// array column arrives as nested JSON, and must not become NULL). A key holding an object is no key: it
/// reads as NULL, and the statement fails on it.
fn twinned(shape: &TableShape, i: usize) -> bool {
    character(&shape.columns[i]) && !shape.key.contains(&i)
}

/// The name column `i`'s `AS JSON` reading goes by: `[#json3]` for column 3, with more `#` while a column of
/// the table has that name (compared as a case-insensitive database would).
fn json_alias(shape: &TableShape, i: usize) -> String {
    let mut alias = format!("#json{i}");
    while shape.columns.iter().any(|c| c.name.as_str().eq_ignore_ascii_case(&alias)) {
        alias.insert(0, '#');
    }
    format!("[{alias}]")
}

/// What is written to column `i` from the rows read as `rows`.
fn value(shape: &TableShape, i: usize, rows: &str) -> String {
    let n = shape.columns[i].name.mssql();
    if twinned(shape, i) {
        format!("COALESCE({rows}.{n}, {rows}.{})", json_alias(shape, i))
    } else {
        format!("{rows}.{n}")
    }
}

/// `OPENJSON(@Pn) WITH ([col] type N'$."col"', ...)`, with the `AS JSON` reading of each twinned column
/// after it when `nested` (rows that are written, not deletes, which read only the key).
fn openjson(shape: &TableShape, rows: Rows, columns: &[usize], nested: bool) -> String {
    let mut cols = Vec::with_capacity(columns.len());
    for &i in columns {
        let c = &shape.columns[i];
        cols.push(format!("{} {} {}", c.name.mssql(), read_as(c), path(&c.name)));
        if nested && twinned(shape, i) {
            cols.push(format!("{} nvarchar(max) {} AS JSON", json_alias(shape, i), path(&c.name)));
        }
    }
    format!("OPENJSON({rows}) WITH ({})", cols.join(", "))
}

/// `t.[k] = s.[k] AND ...`. A character key is compared under its column's collation: OPENJSON's columns
/// carry the database's default collation, which would conflict with another (error 468) or compare by
/// other rules; a `varchar` key is also cast back to `varchar` in that collation's code page, so the column
/// is not converted to `nvarchar` for the comparison (which would cost the index seek under a SQL
/// collation, and take range locks over the whole table under HOLDLOCK). Cast to `varchar(max)`, not the
/// column's length: a longer value must not match a key it was cut down to.
fn key_match(shape: &TableShape, left: &str, right: &str) -> String {
    shape
        .key_columns()
        .map(|c| {
            let n = c.name.mssql();
            let value = match &c.collation {
                None => format!("{right}.{n}"),
                Some(collation) if c.sql_type == "varchar(max)" => {
                    format!("CAST({right}.{n} COLLATE {collation} AS varchar(max))")
                }
                Some(collation) => format!("{right}.{n} COLLATE {collation}"),
            };
            format!("{left}.{n} = {value}")
        })
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// Deletes by primary key the items at `rows`.
pub fn delete(shape: &TableShape, rows: Rows) -> String {
    format!(
        "DELETE t FROM {} AS t INNER JOIN {} AS d ON {};",
        shape.table.mssql(),
        openjson(shape, rows, &shape.key, false),
        key_match(shape, "t", "d")
    )
}

/// Upserts (MERGE on the key) or, for a keyless group, inserts the items at `rows`.
pub fn write(shape: &TableShape, group: &RowGroup<'_>, rows: Rows) -> String {
    let names: Vec<String> = group.columns.iter().map(|&i| shape.columns[i].name.mssql()).collect();
    let source = openjson(shape, rows, &group.columns, true);
    let values: Vec<String> = group.columns.iter().map(|&i| value(shape, i, "s")).collect();
    let statement = if group.keyed {
        let set: Vec<String> = group
            .columns
            .iter()
            .filter(|&&i| !shape.key.contains(&i) && !shape.columns[i].identity)
            .map(|&i| format!("t.{} = {}", shape.columns[i].name.mssql(), value(shape, i, "s")))
            .collect();
        let matched =
            if set.is_empty() { String::new() } else { format!(" WHEN MATCHED THEN UPDATE SET {}", set.join(", ")) };
        format!(
            "MERGE INTO {} WITH (HOLDLOCK) AS t USING {source} AS s ON {}{matched} WHEN NOT MATCHED THEN INSERT ({}) VALUES ({});",
            shape.table.mssql(),
            key_match(shape, "t", "s"),
            names.join(", "),
            values.join(", ")
        )
    } else {
        format!(
            "INSERT INTO {} ({}) SELECT {} FROM {source} AS s;",
            shape.table.mssql(),
            names.join(", "),
            values.join(", ")
        )
    };
    // Explicit values for an identity column need IDENTITY_INSERT, which is per session: set, then reset.
    if group.columns.iter().any(|&i| shape.columns[i].identity) {
        let t = shape.table.mssql();
        format!("SET IDENTITY_INSERT {t} ON; {statement} SET IDENTITY_INSERT {t} OFF;")
    } else {
        statement
    }
}

/// Creates the fence table unless it exists.
pub fn create_fence(table: &TableName) -> String {
    format!(
        "IF OBJECT_ID({}, N'U') IS NULL CREATE TABLE {} ([function] nvarchar(450) NOT NULL PRIMARY KEY, [token] bigint NOT NULL, [updated_at] datetime2 NOT NULL);",
        literal(&table.mssql()),
        table.mssql()
    )
}

/// Creates the exactly-once checkpoint table unless it exists.
pub fn create_checkpoint(table: &TableName) -> String {
    format!(
        "IF OBJECT_ID({}, N'U') IS NULL CREATE TABLE {} ([function] nvarchar(450) NOT NULL PRIMARY KEY, [batch_id] bigint NOT NULL, [from_position] nvarchar(max) NOT NULL, [to_position] nvarchar(max) NOT NULL, [fence] bigint NOT NULL, [rows] bigint NOT NULL, [applied_at] datetime2 NOT NULL);",
        literal(&table.mssql()),
        table.mssql()
    )
}

/// The rows one statement reads: a slice of the deletes (`group: None`) or of a group's rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    pub group: Option<usize>,
    pub rows: Range<usize>,
}

/// What one row parameter (`@P7` on) carries: one statement's rows, sent as a JSON array of items; or, when
/// `packed`, the rows of a few statements, sent as an array of such arrays (see [`Rows`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowsParam {
    pub slices: Vec<Slice>,
    pub packed: bool,
}

/// The whole delivery: fence, exactly-once check, the writes of `plan` in statements of at most
/// `rows_per_statement` rows, the checkpoint row, commit, and the status row. Returns the batch's text and
/// what each row parameter (`@P7` on, in order) carries.
///
/// A statement reads its own parameter while there are at most `max_row_params` statements
/// ([`MAX_ROW_PARAMS`] but in tests); past that, consecutive statements share parameters, as few to one as
/// keep the request within the bound, each reading its own array inside. A small `maxRowsPerStatement`
/// with a large batch (or many column sets) would otherwise ask for more parameters than SQL Server takes
/// (error 8003), and the batch would be refused every time until quarantined.
pub fn delivery(
    shape: &TableShape,
    plan: &WritePlan<'_>,
    fence_table: &TableName,
    checkpoint: Option<&TableName>,
    rows_per_statement: usize,
    max_row_params: usize,
) -> (String, Vec<RowsParam>) {
    let per = rows_per_statement.max(1);
    let mut statements = Vec::new();
    let mut slices = |group: Option<usize>, rows: usize| {
        statements.extend((0..rows).step_by(per).map(|start| Slice { group, rows: start..(start + per).min(rows) }));
    };
    slices(None, plan.deletes.len());
    for (g, group) in plan.groups.iter().enumerate() {
        slices(Some(g), group.rows.len());
    }
    // Statements per parameter: 1 unless that would pass the bound.
    let share = statements.len().div_ceil(max_row_params.max(1)).max(1);
    let packed = share > 1;
    let mut body = String::new();
    for (n, slice) in statements.iter().enumerate() {
        let rows = Rows { param: FIRST_ROWS_PARAM + n / share, index: packed.then_some(n % share) };
        body.push_str(&match slice.group {
            None => delete(shape, rows),
            Some(g) => write(shape, &plan.groups[g], rows),
        });
        body.push('\n');
    }
    let params = statements.chunks(share).map(|c| RowsParam { slices: c.to_vec(), packed }).collect();
    let (applied_check, record) = match checkpoint {
        Some(table) => {
            let t = table.mssql();
            (
                format!(
                    "IF @status = 0 AND EXISTS (SELECT * FROM {t} WITH (UPDLOCK, HOLDLOCK) WHERE [function] = @P1 AND [batch_id] = @P3 AND [from_position] = @P4 COLLATE {BINARY} AND [to_position] = @P5 COLLATE {BINARY}) SET @status = 2;\n"
                ),
                format!(
                    "MERGE INTO {t} WITH (HOLDLOCK) AS c USING (SELECT @P1 AS [function]) AS s ON c.[function] = s.[function] \
WHEN MATCHED THEN UPDATE SET [batch_id] = @P3, [from_position] = @P4, [to_position] = @P5, [fence] = @P2, [rows] = @P6, [applied_at] = SYSUTCDATETIME() \
WHEN NOT MATCHED THEN INSERT ([function], [batch_id], [from_position], [to_position], [fence], [rows], [applied_at]) VALUES (@P1, @P3, @P4, @P5, @P2, @P6, SYSUTCDATETIME());\n"
                ),
            )
        }
        None => (String::new(), String::new()),
    };
    let fence = fence_table.mssql();
    // T-SQL refuses an empty BEGIN ... END: the write block is left out when there is nothing to write.
    let writes = format!("{body}{record}");
    let writes = if writes.is_empty() { writes } else { format!("IF @status = 0\nBEGIN\n{writes}END\n") };
    let text = format!(
        "SET NOCOUNT ON;\nSET XACT_ABORT ON;\nDECLARE @stored bigint, @status int = 0;\nBEGIN TRANSACTION;\n\
SELECT @stored = [token] FROM {fence} WITH (UPDLOCK, HOLDLOCK) WHERE [function] = @P1;\n\
IF @stored > @P2 SET @status = 1;\n\
IF @status = 0 AND @stored IS NULL INSERT INTO {fence} ([function], [token], [updated_at]) VALUES (@P1, @P2, SYSUTCDATETIME());\n\
IF @status = 0 AND @stored IS NOT NULL UPDATE {fence} SET [token] = @P2, [updated_at] = SYSUTCDATETIME() WHERE [function] = @P1;\n\
{applied_check}{writes}\
IF @status = 1 ROLLBACK TRANSACTION; ELSE COMMIT TRANSACTION;\n\
SELECT @status AS [status], @stored AS [stored];"
    );
    (text, params)
}

/// A binary collation: positions are compared byte for byte.
const BINARY: &str = "Latin1_General_100_BIN2";

/// What the destination recorded for one function, for a trigger whose state document was lost: the
/// fence row's token and, with `checkpoint`, the last batch applied. Always one row. `@P1` = app/function.
pub fn resume(fence_table: &TableName, checkpoint: Option<&TableName>) -> String {
    let fence = format!("(SELECT f.[token] FROM {} AS f WHERE f.[function] = @P1) AS [fence]", fence_table.mssql());
    match checkpoint {
        Some(table) => format!(
            "SELECT {fence}, c.[batch_id], c.[from_position], c.[to_position] FROM (SELECT @P1 AS [function]) AS k LEFT JOIN {} AS c ON c.[function] = k.[function];",
            table.mssql()
        ),
        None => format!("SELECT {fence};"),
    }
}

/// Columns in table order: name, type, max length in bytes (-1 = max), precision, scale, nullable, has a
/// default, identity, never written (computed, rowversion, or `GENERATED ALWAYS`: a temporal table's period
/// columns and a ledger table's columns, which SQL Server fills in itself when an INSERT's column list
/// leaves them out), position in the primary key (NULL outside it), collation (empty for a column that has
/// none). Numbers and flags are read as `int`. `@P1` = the table's quoted name.
///
/// The type is the column's own (`sys.types` by `user_type_id`, which every column has) or, for an alias
/// type, the system type it is made from: joining on `system_type_id` alone would drop CLR-typed columns
/// (geography, geometry, hierarchyid share system type 240, which names no row of `sys.types`) from the
/// shape, so an item carrying one would be refused as "not a column" instead of naming its type.
pub const COLUMNS: &str = "SELECT c.name, COALESCE(b.name, u.name) AS [type_name], CAST(c.max_length AS int) AS [max_length], \
CAST(c.precision AS int) AS [precision], CAST(c.scale AS int) AS [scale], CAST(c.is_nullable AS int) AS [is_nullable], \
CASE WHEN c.default_object_id <> 0 THEN 1 ELSE 0 END AS [has_default], CAST(c.is_identity AS int) AS [is_identity], \
CASE WHEN c.is_computed = 1 OR c.generated_always_type <> 0 OR COALESCE(b.name, u.name) IN (N'timestamp', N'rowversion') THEN 1 ELSE 0 END AS [is_generated], \
CAST(ic.key_ordinal AS int) AS [key_ordinal], COALESCE(c.collation_name, N'') AS [collation] \
FROM sys.columns AS c JOIN sys.types AS u ON u.user_type_id = c.user_type_id \
LEFT JOIN sys.types AS b ON b.user_type_id = c.system_type_id AND u.is_assembly_type = 0 \
LEFT JOIN sys.indexes AS i ON i.object_id = c.object_id AND i.is_primary_key = 1 \
LEFT JOIN sys.index_columns AS ic ON ic.object_id = i.object_id AND ic.index_id = i.index_id AND ic.column_id = c.column_id \
WHERE c.object_id = OBJECT_ID(@P1) ORDER BY c.column_id";

/// The type of a column's family at its widest, from its catalog type: what it is read as in `OPENJSON ...
/// WITH` (but see `read_as`: `varchar` is read as `nvarchar`). Only known type names reach a statement;
/// `Err` says why a column cannot be written.
///
/// Strings and binary are read at their `(max)` width, not the column's: OPENJSON converts as `CONVERT` does,
/// and a conversion to a shorter string type cuts the value off instead of failing. Read whole, an over-long
/// value reaches the column itself, whose assignment refuses it under `ANSI_WARNINGS` (on for tiberius'
/// logins, which the server treats as ODBC's), as the official output binding refuses it.
pub fn type_sql(name: &str, _max_length: i32, precision: i32, scale: i32) -> Result<String, String> {
    let name = name.to_ascii_lowercase();
    Ok(match name.as_str() {
        "bit" | "tinyint" | "smallint" | "int" | "bigint" | "money" | "smallmoney" | "real" | "date"
        | "smalldatetime" | "datetime" | "uniqueidentifier" | "xml" => name,
        "float" => format!("float({precision})"),
        "decimal" | "numeric" => format!("{name}({precision}, {scale})"),
        "datetime2" | "datetimeoffset" | "time" => format!("{name}({scale})"),
        "char" | "varchar" => "varchar(max)".into(),
        "nchar" | "nvarchar" => "nvarchar(max)".into(),
        "binary" | "varbinary" => "varbinary(max)".into(),
        "text" | "ntext" | "image" => {
            return Err(format!("{name} columns cannot be written (deprecated types the output binding rejects too); use varchar(max), nvarchar(max) or varbinary(max)"))
        }
        other => return Err(format!("{other} columns cannot be written by the sink")),
    })
}

#[cfg(test)]
mod tests;
