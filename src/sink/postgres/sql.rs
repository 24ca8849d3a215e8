//! Every statement the PostgreSQL sink runs, built in one place from validated, quoted names.
//!
//! Rows travel as one text parameter holding a JSON array of the items, read by `json_to_recordset` with the
//! column types from the catalog: one statement writes thousands of rows (never one statement per row), the
//! item text is parsed once by the server, and numerics keep every digit. `json` rather than `jsonb`: the
//! array is read once, so converting it to `jsonb` first would only cost time. Binary columns arrive as
//! base64 text (as every source here sends them) and are decoded in the select list.
//!
//! `json` columns are the exception: `json_to_recordset` de-escapes every string of its input, and a `\u0000`
//! cannot become text (SQLSTATE 22P05), so one such value failed the whole batch. Their values travel apart,
//! one `text[]` parameter per column holding each row's JSON text, zipped with the recordset by `ROWS FROM`
//! and cast to `json`, which keeps the text as it is.

use crate::ident::TableName;
use crate::sink::upsert::{RowGroup, TableShape};

/// The recordset's column list: the table's type for each column, `text` for base64-carried binary.
fn recordset_columns(shape: &TableShape, columns: &[usize]) -> String {
    columns
        .iter()
        .map(|&i| {
            let c = &shape.columns[i];
            let ty = if c.binary { "text" } else { c.sql_type.as_str() };
            format!("{} {ty}", c.name.pg())
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `alias."col"`, decoded from base64 for binary columns and cast from its own text for raw-JSON ones.
fn value(shape: &TableShape, alias: &str, column: usize) -> String {
    let c = &shape.columns[column];
    if c.binary {
        format!("decode({alias}.{}, 'base64')", c.name.pg())
    } else if c.raw_json {
        format!("{alias}.{}::{}", c.name.pg(), c.sql_type)
    } else {
        format!("{alias}.{}", c.name.pg())
    }
}

/// True when the group's statement reads a JSON array of rows (`$1`): it has a column outside the raw-JSON
/// ones. The raw-JSON columns' `text[]` parameters follow, in the order of `group.raw`.
pub fn reads_recordset(shape: &TableShape, group: &RowGroup<'_>) -> bool {
    group.columns.iter().any(|&i| !shape.columns[i].raw_json)
}

/// The rows a group's statement reads, as `r`: the recordset of `$1` alone, or zipped with one `unnest` per
/// raw-JSON column.
fn rows_of(shape: &TableShape, group: &RowGroup<'_>) -> String {
    let recordset: Vec<usize> = group.columns.iter().copied().filter(|&i| !shape.columns[i].raw_json).collect();
    if group.raw.is_empty() {
        return format!("json_to_recordset($1::text::json) AS r({})", recordset_columns(shape, &recordset));
    }
    let mut functions = Vec::new();
    let mut names: Vec<String> = recordset.iter().map(|&i| shape.columns[i].name.pg()).collect();
    let first = if recordset.is_empty() {
        1
    } else {
        functions.push(format!("json_to_recordset($1::text::json) AS ({})", recordset_columns(shape, &recordset)));
        2
    };
    for (n, (i, _)) in group.raw.iter().enumerate() {
        functions.push(format!("unnest(${}::text[])", first + n));
        names.push(shape.columns[*i].name.pg());
    }
    format!("ROWS FROM ({}) AS r({})", functions.join(", "), names.join(", "))
}

/// Inserts a group's rows; upserts them on the primary key when the group carries it. `$1` = the JSON array
/// (see [`reads_recordset`] for the raw-JSON columns' parameters).
pub fn write(shape: &TableShape, group: &RowGroup<'_>) -> String {
    // `r`'s columns are the recordset's then the raw ones; the insert names them in table order.
    let names: Vec<String> = group.columns.iter().map(|&i| shape.columns[i].name.pg()).collect();
    let values: Vec<String> = group.columns.iter().map(|&i| value(shape, "r", i)).collect();
    // An identity column given a value: GENERATED ALWAYS refuses it without this clause; BY DEFAULT ignores it.
    let overriding =
        if group.columns.iter().any(|&i| shape.columns[i].identity) { " OVERRIDING SYSTEM VALUE" } else { "" };
    let mut sql = format!(
        "INSERT INTO {} ({}){overriding} SELECT {} FROM {}",
        shape.table.pg(),
        names.join(", "),
        values.join(", "),
        rows_of(shape, group)
    );
    if group.keyed {
        let key: Vec<String> = shape.key_columns().map(|c| c.name.pg()).collect();
        // Identity columns outside the key are left alone on update: GENERATED ALWAYS cannot be set.
        let set: Vec<String> = group
            .columns
            .iter()
            .filter(|&&i| !shape.key.contains(&i) && !shape.columns[i].identity)
            .map(|&i| {
                let name = shape.columns[i].name.pg();
                format!("{name} = EXCLUDED.{name}")
            })
            .collect();
        if set.is_empty() {
            sql.push_str(&format!(" ON CONFLICT ({}) DO NOTHING", key.join(", ")));
        } else {
            sql.push_str(&format!(" ON CONFLICT ({}) DO UPDATE SET {}", key.join(", "), set.join(", ")));
        }
    }
    sql
}

/// Converts one column of a statement's rows alone, to find which column a data error (class 22) came from:
/// PostgreSQL does not say. Reads no table. `$1` = the statement's JSON array. (Raw-JSON columns, which take
/// any JSON text, are never asked.)
pub fn probe(shape: &TableShape, column: usize) -> String {
    format!(
        "SELECT count({}) FROM json_to_recordset($1::text::json) AS r({})",
        value(shape, "r", column),
        recordset_columns(shape, &[column])
    )
}

/// Reads a statement's rows converting no column: fails only when the JSON array itself cannot be read (a
/// `\u0000` in any string, which the plan keeps out), which no column is to blame for. `$1` = the array.
pub const PROBE_ROWS: &str = "SELECT count(*) FROM json_to_recordset($1::text::json) AS r(probe text)";

/// Deletes the rows whose primary key is in the items. `$1` = the JSON array of delete items.
pub fn delete(shape: &TableShape) -> String {
    let matches: Vec<String> =
        shape.key.iter().map(|&k| format!("t.{} = {}", shape.columns[k].name.pg(), value(shape, "d", k))).collect();
    format!(
        "DELETE FROM {} AS t USING json_to_recordset($1::text::json) AS d({}) WHERE {}",
        shape.table.pg(),
        recordset_columns(shape, &shape.key),
        matches.join(" AND ")
    )
}

/// The table's oid, if it exists and the login can see it. `$1` = the quoted name.
pub const TABLE_OID: &str = "SELECT to_regclass($1)::oid";

/// Columns in table order: name, type, typname, NOT NULL, has default, identity, generated, position in the
/// primary key (NULL outside it). `$1` = the table's oid.
pub const COLUMNS: &str = "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), t.typname::text, \
     a.attnotnull, a.atthasdef, a.attidentity <> '', a.attgenerated <> '', \
     (SELECT k.ord::int4 FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) \
      WHERE i.indrelid = a.attrelid AND i.indisprimary AND k.attnum = a.attnum) \
     FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
     WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum";

/// The fence table: the largest fencing token that wrote for each app/function.
pub fn create_fence(table: &TableName) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\"function\" text PRIMARY KEY, \"token\" bigint NOT NULL, \
         \"updated_at\" timestamptz NOT NULL DEFAULT now())",
        table.pg()
    )
}

/// Raises the stored token to `$2` unless it is already larger; returns a row only when the write may go on.
/// The row lock it takes serializes concurrent writers of one function until the transaction ends, so a
/// deposed owner waiting on it re-reads the newer token and is refused. `$1` = app/function, `$2` = token.
pub fn fence(table: &TableName) -> String {
    format!(
        "INSERT INTO {} AS f (\"function\", \"token\") VALUES ($1, $2) ON CONFLICT (\"function\") \
         DO UPDATE SET \"token\" = EXCLUDED.\"token\", \"updated_at\" = now() WHERE f.\"token\" <= EXCLUDED.\"token\" \
         RETURNING f.\"token\"",
        table.pg()
    )
}

/// The token that refused a write. `$1` = app/function.
pub fn fence_token(table: &TableName) -> String {
    format!("SELECT \"token\" FROM {} WHERE \"function\" = $1", table.pg())
}

/// The exactly-once checkpoint table: the last batch applied for each app/function, written in the same
/// transaction as its rows.
pub fn create_checkpoint(table: &TableName) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\"function\" text PRIMARY KEY, \"batch_id\" bigint NOT NULL, \
         \"from_position\" jsonb NOT NULL, \"to_position\" jsonb NOT NULL, \"fence\" bigint NOT NULL, \
         \"rows\" bigint NOT NULL, \"applied_at\" timestamptz NOT NULL DEFAULT now())",
        table.pg()
    )
}

/// The last batch applied: batch id, from, to (as JSON text). `$1` = app/function.
pub fn read_checkpoint(table: &TableName) -> String {
    format!(
        "SELECT \"batch_id\", \"from_position\"::text, \"to_position\"::text FROM {} WHERE \"function\" = $1",
        table.pg()
    )
}

/// Records the batch as applied. `$1` app/function, `$2` batch id, `$3`/`$4` from/to JSON, `$5` fence, `$6` rows.
pub fn write_checkpoint(table: &TableName) -> String {
    format!(
        "INSERT INTO {} (\"function\", \"batch_id\", \"from_position\", \"to_position\", \"fence\", \"rows\") \
         VALUES ($1, $2, $3::text::jsonb, $4::text::jsonb, $5, $6) ON CONFLICT (\"function\") DO UPDATE SET \
         \"batch_id\" = EXCLUDED.\"batch_id\", \"from_position\" = EXCLUDED.\"from_position\", \
         \"to_position\" = EXCLUDED.\"to_position\", \"fence\" = EXCLUDED.\"fence\", \"rows\" = EXCLUDED.\"rows\", \
         \"applied_at\" = now()",
        table.pg()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::beside;
    use crate::sink::upsert::Column;

    fn shape() -> TableShape {
        let mut blob = Column::plain("blob", "bytea");
        blob.binary = true;
        TableShape {
            table: TableName::parse("public.\"Target Table\"").expect("valid"),
            columns: vec![
                Column::plain("id", "bigint"),
                Column::plain("order", "integer"),
                Column::plain("Ünïcode Col", "numeric(12,2)"),
                blob,
            ],
            key: vec![0],
        }
    }

    #[test]
    fn an_upsert_reads_one_json_array_with_the_catalog_types_and_updates_the_non_key_columns() {
        let group = RowGroup { columns: vec![0, 1, 2, 3], keyed: true, rows: vec![], raw: vec![] };
        assert_eq!(
            write(&shape(), &group),
            "INSERT INTO \"public\".\"Target Table\" (\"id\", \"order\", \"Ünïcode Col\", \"blob\") \
SELECT r.\"id\", r.\"order\", r.\"Ünïcode Col\", decode(r.\"blob\", 'base64') \
FROM json_to_recordset($1::text::json) AS r(\"id\" bigint, \"order\" integer, \"Ünïcode Col\" numeric(12,2), \"blob\" text) \
ON CONFLICT (\"id\") DO UPDATE SET \"order\" = EXCLUDED.\"order\", \"Ünïcode Col\" = EXCLUDED.\"Ünïcode Col\", \"blob\" = EXCLUDED.\"blob\""
        );
    }

    #[test]
    fn a_key_only_row_does_nothing_on_conflict_and_a_keyless_group_is_a_plain_insert() {
        let s = shape();
        let key_only = RowGroup { columns: vec![0], keyed: true, rows: vec![], raw: vec![] };
        assert!(write(&s, &key_only).ends_with("ON CONFLICT (\"id\") DO NOTHING"));
        let keyless = RowGroup { columns: vec![1], keyed: false, rows: vec![], raw: vec![] };
        assert_eq!(
            write(&s, &keyless),
            "INSERT INTO \"public\".\"Target Table\" (\"order\") SELECT r.\"order\" FROM json_to_recordset($1::text::json) AS r(\"order\" integer)"
        );
    }

    #[test]
    fn json_columns_are_zipped_in_as_text_arrays_and_cast_from_their_own_text() {
        // GIVEN "doc" of json type beside the table's columns
        let mut s = shape();
        let mut doc = Column::plain("doc", "json");
        doc.raw_json = true;
        s.columns.push(doc);
        let group = RowGroup { columns: vec![0, 4], keyed: true, rows: vec![], raw: vec![(4, vec![])] };
        // THEN it is read from its own text[] parameter, zipped with the recordset, and cast to json
        assert!(reads_recordset(&s, &group));
        assert_eq!(
            write(&s, &group),
            "INSERT INTO \"public\".\"Target Table\" (\"id\", \"doc\") SELECT r.\"id\", r.\"doc\"::json \
FROM ROWS FROM (json_to_recordset($1::text::json) AS (\"id\" bigint), unnest($2::text[])) AS r(\"id\", \"doc\") \
ON CONFLICT (\"id\") DO UPDATE SET \"doc\" = EXCLUDED.\"doc\""
        );
        // AND a group of json columns alone reads no recordset: its first text[] is $1
        let alone = RowGroup { columns: vec![4], keyed: false, rows: vec![], raw: vec![(4, vec![])] };
        assert!(!reads_recordset(&s, &alone));
        assert!(
            write(&s, &alone).ends_with("FROM ROWS FROM (unnest($1::text[])) AS r(\"doc\")"),
            "{}",
            write(&s, &alone)
        );
        // AND a probe converts one column alone
        assert_eq!(
            probe(&s, 1),
            "SELECT count(r.\"order\") FROM json_to_recordset($1::text::json) AS r(\"order\" integer)"
        );
    }

    #[test]
    fn an_identity_column_given_a_value_overrides_the_system_value() {
        let mut s = shape();
        s.columns[0].identity = true;
        let group = RowGroup { columns: vec![0, 1], keyed: true, rows: vec![], raw: vec![] };
        assert!(write(&s, &group).contains("(\"id\", \"order\") OVERRIDING SYSTEM VALUE SELECT"));
    }

    #[test]
    fn a_delete_joins_the_key_columns_of_the_items() {
        let mut s = shape();
        s.key = vec![0, 3];
        assert_eq!(
            delete(&s),
            "DELETE FROM \"public\".\"Target Table\" AS t USING json_to_recordset($1::text::json) AS d(\"id\" bigint, \"blob\" text) \
WHERE t.\"id\" = d.\"id\" AND t.\"blob\" = decode(d.\"blob\", 'base64')"
        );
    }

    #[test]
    fn the_fence_refuses_a_smaller_token_in_the_same_statement_that_records_a_larger_one() {
        let t = beside(&TableName::parse("app.orders").expect("valid"), "sql_pseudo_trigger_fence");
        assert_eq!(
            fence(&t),
            "INSERT INTO \"app\".\"sql_pseudo_trigger_fence\" AS f (\"function\", \"token\") VALUES ($1, $2) ON CONFLICT (\"function\") \
DO UPDATE SET \"token\" = EXCLUDED.\"token\", \"updated_at\" = now() WHERE f.\"token\" <= EXCLUDED.\"token\" RETURNING f.\"token\""
        );
    }
}
