//! Golden statements: exact text, compared with the reviewed files in `tests/golden/mssql_sink/`.
//! Rerun with `UPDATE_GOLDEN=1 cargo test --lib sink::mssql` to rewrite them, then review `git diff`.

use super::*;
use crate::change::{Change, Operation};
use crate::config::beside;
use crate::sink::upsert::{plan, Column};
use std::path::PathBuf;

fn golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/mssql_sink").join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("golden dir");
        std::fs::write(&path, actual).expect("write golden");
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run with UPDATE_GOLDEN=1 to create it", path.display()));
    assert_eq!(actual, expected, "{} differs; rerun with UPDATE_GOLDEN=1 and review the diff", path.display());
}

/// `[Sales Ünïcode].[Order]] Lines]`: key (Id, Line), a reserved word, a quote, a binary column.
fn shape() -> TableShape {
    TableShape {
        table: TableName::parse("[Sales Ünïcode].[Order]] Lines]").expect("valid"),
        columns: vec![
            Column::plain("Id", "bigint"),
            Column::plain("Line", "int"),
            Column::plain("order", "nvarchar(max)"),
            Column::plain("Qty \"x\"", "decimal(12, 2)"),
            Column::plain("Photo", "varbinary(max)"),
        ],
        key: vec![0, 1],
    }
}

fn change(op: Operation, item: &str) -> Change {
    Change::from_json(op, item.into()).expect("json")
}

#[test]
fn golden_upsert_with_deletes_fence_and_exactly_once_in_1000_row_statements() {
    let mut changes: Vec<Change> = (0..2500)
        .map(|i| {
            change(Operation::Insert, &format!(r#"{{"Id":{i},"Line":1,"order":"x","Qty \"x\"":1,"Photo":"AA=="}}"#))
        })
        .collect();
    changes.push(change(Operation::Delete, r#"{"Id":-1,"Line":1}"#));
    let s = shape();
    let p = plan(&s, &changes).expect("valid");
    let fence = beside(&s.table, "sql_pseudo_trigger_fence");
    let cp = beside(&s.table, "sql_pseudo_trigger_checkpoint");
    let (text, params) = delivery(&s, &p, &fence, Some(&cp), ROWS_PER_STATEMENT, MAX_ROW_PARAMS);
    golden("delivery_exactly_once.sql", &text);
    // One parameter of deletes, then 1000 + 1000 + 500 rows.
    assert_eq!(slices(params), vec![(None, 0..1), (Some(0), 0..1000), (Some(0), 1000..2000), (Some(0), 2000..2500)]);
}

/// The changes `tests/mssql_sink_wire.rs` delivers with `maxRowsPerStatement: 2`, so the wire test can
/// compare what tiberius sends with this reviewed text.
#[test]
fn golden_exactly_once_delivery_of_a_delete_and_five_rows_in_statements_of_two() {
    let mut changes = vec![change(Operation::Delete, r#"{"Id":-1,"Line":1}"#)];
    changes.extend((1..=5).map(|i| {
        change(Operation::Insert, &format!(r#"{{"Id":{i},"Line":1,"order":"o{i}","Qty \"x\"":1.5,"Photo":"AQID"}}"#))
    }));
    let s = shape();
    let p = plan(&s, &changes).expect("valid");
    let fence = beside(&s.table, "sql_pseudo_trigger_fence");
    let cp = beside(&s.table, "sql_pseudo_trigger_checkpoint");
    let (text, params) = delivery(&s, &p, &fence, Some(&cp), 2, MAX_ROW_PARAMS);
    golden("delivery_exactly_once_split.sql", &text);
    assert_eq!(slices(params), vec![(None, 0..1), (Some(0), 0..2), (Some(0), 2..4), (Some(0), 4..5)]);
}

/// One parameter's statements: `(group, rows)` each, when each statement has its own parameter.
fn slices(params: Vec<RowsParam>) -> Vec<(Option<usize>, Range<usize>)> {
    params
        .into_iter()
        .map(|p| {
            assert!(!p.packed && p.slices.len() == 1, "{p:?}");
            (p.slices[0].group, p.slices[0].rows.clone())
        })
        .collect()
}

/// The same changes as the split delivery, with room for only two row parameters.
#[test]
fn golden_statements_past_the_parameter_bound_share_parameters_and_read_their_own_array() {
    let mut changes = vec![change(Operation::Delete, r#"{"Id":-1,"Line":1}"#)];
    changes.extend((1..=5).map(|i| {
        change(Operation::Insert, &format!(r#"{{"Id":{i},"Line":1,"order":"o{i}","Qty \"x\"":1.5,"Photo":"AQID"}}"#))
    }));
    let s = shape();
    let p = plan(&s, &changes).expect("valid");
    let fence = beside(&s.table, "sql_pseudo_trigger_fence");
    let (text, params) = delivery(&s, &p, &fence, None, 2, 2);
    golden("delivery_packed.sql", &text);
    // Four statements in two parameters of two arrays each.
    let slice = |group, rows| Slice { group, rows };
    assert_eq!(
        params,
        vec![
            RowsParam { slices: vec![slice(None, 0..1), slice(Some(0), 0..2)], packed: true },
            RowsParam { slices: vec![slice(Some(0), 2..4), slice(Some(0), 4..5)], packed: true },
        ]
    );
}

#[test]
fn no_delivery_asks_for_more_parameters_than_sql_server_takes() {
    // GIVEN 5,000 rows, one per statement (maxRowsPerStatement 1), and exactly the bound's worth
    let s = shape();
    let changes: Vec<Change> =
        (0..5000).map(|i| change(Operation::Update, &format!(r#"{{"Id":{i},"Line":1}}"#))).collect();
    let p = plan(&s, &changes).expect("valid");
    let fence = beside(&s.table, "sql_pseudo_trigger_fence");
    for (rows, want) in [(5000, 1667), (MAX_ROW_PARAMS, MAX_ROW_PARAMS), (MAX_ROW_PARAMS + 1, (MAX_ROW_PARAMS + 2) / 2)]
    {
        // WHEN delivered
        let (text, params) = delivery(&s, &p_of(&p, rows), &fence, None, 1, MAX_ROW_PARAMS);
        // THEN the request stays within 2,100 parameters (sp_executesql's two, the six fixed ones, the
        // rows'), and every statement still reads exactly one row
        assert_eq!(params.len(), want, "{rows} rows");
        assert!(2 + FIRST_ROWS_PARAM - 1 + params.len() <= 2100);
        assert_eq!(params.iter().map(|p| p.slices.len()).sum::<usize>(), rows);
        assert!(params.iter().flat_map(|p| &p.slices).all(|s| s.rows.len() == 1));
        assert_eq!(text.matches("MERGE INTO").count(), rows);
        assert_eq!(params[0].packed, rows > MAX_ROW_PARAMS);
    }
}

/// `plan` with only its first `rows` rows.
fn p_of<'a>(p: &WritePlan<'a>, rows: usize) -> WritePlan<'a> {
    let mut p = p.clone();
    p.groups[0].rows.truncate(rows);
    p
}

#[test]
fn golden_plain_insert_of_an_identity_table_and_a_merge_with_identity_insert() {
    let mut s = shape();
    s.columns[0].identity = true;
    let keyless = RowGroup { columns: vec![1, 2], keyed: false, rows: vec![], raw: vec![] };
    let keyed = RowGroup { columns: vec![0, 1, 2], keyed: true, rows: vec![], raw: vec![] };
    golden("insert_identity_absent.sql", &write(&s, &keyless, Rows::param(7)));
    golden("merge_identity_present.sql", &write(&s, &keyed, Rows::param(8)));
    let fence = beside(&s.table, "sql_pseudo_trigger_fence");
    golden("create_fence.sql", &create_fence(&fence));
    golden("create_checkpoint.sql", &create_checkpoint(&beside(&s.table, "sql_pseudo_trigger_checkpoint")));
    golden("catalog_columns.sql", COLUMNS);
    golden("resume_exactly_once.sql", &resume(&fence, Some(&beside(&s.table, "sql_pseudo_trigger_checkpoint"))));
    golden("resume_fence.sql", &resume(&fence, None));
}

/// `[dbo].[codes]`: key (code varchar, Greek_CI_AS; region nchar, a UTF-16 collation), and a varchar and
/// an nvarchar column outside the key.
fn coded() -> TableShape {
    let collated =
        |name: &str, ty: &str, collation: &str| Column { collation: Some(collation.into()), ..Column::plain(name, ty) };
    TableShape {
        table: TableName::parse("dbo.codes").expect("valid"),
        columns: vec![
            collated("code", "varchar(max)", "Greek_CI_AS"),
            collated("region", "nvarchar(max)", "Latin1_General_100_CI_AS_SC"),
            collated("label", "varchar(max)", "Cyrillic_General_CI_AS"),
            collated("note", "nvarchar(max)", "SQL_Latin1_General_CP1_CI_AS"),
        ],
        key: vec![0, 1],
    }
}

#[test]
fn golden_character_columns_are_read_as_unicode_and_keys_compared_under_their_collation() {
    let s = coded();
    let group = RowGroup { columns: vec![0, 1, 2, 3], keyed: true, rows: vec![], raw: vec![] };
    golden("merge_character_keys.sql", &write(&s, &group, Rows::param(8)));
    golden("delete_character_keys.sql", &delete(&s, Rows::param(7)));
}

#[test]
fn golden_at_least_once_delivery_has_no_checkpoint() {
    let s = shape();
    let changes = vec![change(Operation::Update, r#"{"Id":1,"Line":2}"#)];
    let p = plan(&s, &changes).expect("valid");
    let (text, _) =
        delivery(&s, &p, &beside(&s.table, "sql_pseudo_trigger_fence"), None, ROWS_PER_STATEMENT, MAX_ROW_PARAMS);
    golden("delivery_key_only.sql", &text);
    assert!(!text.contains("sql_pseudo_trigger_checkpoint"));
}

#[test]
fn types_come_from_a_fixed_list() {
    // Strings and binary are read whole; the column's own length check applies on assignment.
    assert_eq!(type_sql("nvarchar", 200, 0, 0).as_deref(), Ok("nvarchar(max)"));
    assert_eq!(type_sql("nchar", 20, 0, 0).as_deref(), Ok("nvarchar(max)"));
    assert_eq!(type_sql("char", 3, 0, 0).as_deref(), Ok("varchar(max)"));
    assert_eq!(type_sql("binary", 2, 0, 0).as_deref(), Ok("varbinary(max)"));
    assert_eq!(type_sql("varbinary", -1, 0, 0).as_deref(), Ok("varbinary(max)"));
    assert_eq!(type_sql("decimal", 9, 12, 2).as_deref(), Ok("decimal(12, 2)"));
    assert_eq!(type_sql("datetime2", 8, 27, 7).as_deref(), Ok("datetime2(7)"));
    assert!(type_sql("ntext", 16, 0, 0).unwrap_err().contains("nvarchar(max)"));
    assert!(type_sql("geography", -1, 0, 0).is_err());
}
