//! Golden tests: every statement the SQL Server sources emit, per option combination, compared as exact
//! text with the reviewed files in `tests/golden/mssql/`. The wire tests (`tests/mssql_wire.rs`) register
//! the same files with the mock server, so what was reviewed is what goes on the wire.
//!
//! Updating is deliberate: a changed statement fails here with the path and both texts; rerun with
//! `UPDATE_GOLDEN=1 cargo test --lib source::mssql` to rewrite the files, then review `git diff`.

use super::*;
use crate::ident::TableName;
use std::collections::BTreeMap;
use std::path::PathBuf;

mod backfill;

/// Names of a system view and its columns that statements binding values write in lower case, because a
/// case-sensitive database knows them only so: the lag's `sys.dm_tran_commit_table`.
const SYSTEM_NAMES: &[&str] = &["sys.dm_tran_commit_table", "commit_time", "commit_ts"];

/// The `sys` names only the partition column's catalog read (`catalog_partition_column`) writes in lower case,
/// for the same reason; allowed in that statement alone, so a stray lower-case `name` elsewhere still fails.
const PARTITION_CATALOG_NAMES: &[&str] = &[
    "sys.computed_columns",
    "sys.index_columns",
    "sys.indexes",
    "definition",
    "is_persisted",
    "is_disabled",
    "has_filter",
    "object_id",
    "column_id",
    "index_id",
    "key_ordinal",
    "type",
    "name",
];

fn id(s: &str) -> Ident {
    Ident::new(s).expect("valid identifier")
}

fn key(name: &str, ty: SqlType) -> KeyColumn {
    KeyColumn { name: id(name), ty }
}

fn item(name: &str, column_id: i32, ty: SqlType) -> ItemColumn {
    ItemColumn { name: id(name), column_id, ty }
}

/// The table the wire tests serve: upper-case names, because the mock matches parameterized statements by
/// their upper-cased text.
pub(super) fn orders() -> CtShape {
    CtShape {
        table: TableName::parse("[DBO].[ORDERS]").expect("parses"),
        key: vec![key("ID", SqlType::new("int"))],
        item: vec![
            item("ID", 1, SqlType::new("int")),
            item("NAME", 2, SqlType::new("nvarchar").with_length(100)),
            item("PRICE", 3, SqlType::new("decimal").with_precision(18, 2)),
            item("PHOTO", 4, SqlType::new("varbinary").with_length(-1)),
            item("CREATED_AT", 5, SqlType::new("datetime2").with_datetime_precision(7)),
        ],
        snapshot: true,
        skip_context: false,
        metadata: false,
        partitioned: false,
    }
}

/// Every option on: composite key with spaces, brackets and non-ASCII letters, column selection, context
/// filter, metadata, READ COMMITTED.
fn order_lines() -> CtShape {
    CtShape {
        table: TableName::parse("[Sales Ünïcode].[Order]] Lines]").expect("parses"),
        key: vec![key("Order Id", SqlType::new("bigint")), key("Line №", SqlType::new("nvarchar").with_length(20))],
        item: vec![
            item("Order Id", 1, SqlType::new("bigint")),
            item("Line №", 2, SqlType::new("nvarchar").with_length(20)),
            item("Qty", 4, SqlType::new("int")),
        ],
        snapshot: false,
        skip_context: true,
        metadata: true,
        partitioned: false,
    }
}

fn hostile() -> CtShape {
    CtShape {
        table: TableName::parse("[x]]; DROP TABLE y;--]").expect("parses"),
        key: vec![key("id]; --", SqlType::new("uniqueidentifier"))],
        item: vec![item("id]; --", 1, SqlType::new("uniqueidentifier")), item("v", 2, SqlType::new("date"))],
        snapshot: true,
        skip_context: false,
        metadata: false,
        partitioned: false,
    }
}

pub(super) fn items() -> RvShape {
    RvShape {
        table: TableName::parse("[DBO].[ITEMS]").expect("parses"),
        key: vec![key("ID", SqlType::new("int"))],
        version: id("RV"),
        item: vec![
            item("ID", 1, SqlType::new("int")),
            item("TITLE", 2, SqlType::new("nvarchar").with_length(200)),
            item("IS_DELETED", 3, SqlType::new("bit")),
        ],
        soft_delete: Some((id("IS_DELETED"), true)),
        inserted: None,
        snapshot: true,
        partition: None,
    }
}

fn items_with_options() -> RvShape {
    RvShape {
        table: TableName::parse("[app].[Item Log]").expect("parses"),
        key: vec![
            key("Tenant", SqlType::new("varchar").with_length(10).with_collation("Greek_100_CI_AS")),
            key("At", SqlType::new("datetime2").with_datetime_precision(7)),
        ],
        version: id("Row Version"),
        item: vec![
            item("Tenant", 1, SqlType::new("varchar").with_length(10).with_collation("Greek_100_CI_AS")),
            item("At", 2, SqlType::new("datetime2").with_datetime_precision(7)),
            item("Body", 3, SqlType::new("nvarchar").with_length(-1)),
        ],
        soft_delete: Some((id("Deleted At"), false)),
        inserted: Some((id("Created Version"), true)),
        snapshot: false,
        partition: None,
    }
}

/// The wire tests' orders, one partition of N: the hash of the key `CHANGETABLE` returns, inline.
pub(super) fn orders_partitioned() -> CtShape {
    CtShape { partitioned: true, ..orders() }
}

/// The wire tests' items, one partition of N read through the `partitionColumn` `P8`.
pub(super) fn items_partition_column() -> RvShape {
    RvShape { partition: Some(PartitionFilter::Column(id("P8"))), ..items() }
}

/// The wire tests' items, one partition of N without a partition column: the hash inline.
pub(super) fn items_partition_inline() -> RvShape {
    RvShape { partition: Some(PartitionFilter::Inline), ..items() }
}

/// Every statement, by golden file name.
fn all() -> BTreeMap<&'static str, Statement> {
    let o = orders();
    let l = order_lines();
    let r = items();
    let ro = items_with_options();
    let op = orders_partitioned();
    let lp = CtShape { partitioned: true, ..order_lines() };
    let rc = items_partition_column();
    let ri = items_partition_inline();
    let db = Statement { sql: DATABASE.to_string(), slots: vec![] };
    let mut all = BTreeMap::from([
        ("catalog_database", db),
        ("catalog_table", table()),
        ("catalog_columns", columns()),
        ("ct_versions", versions()),
        ("ct_fetch_start", o.changes(After::Start, Upto::Current)),
        ("ct_fetch_after_key", o.changes(After::Key, Upto::Current)),
        ("ct_refetch_start_to_version", o.changes(After::Start, Upto::Version)),
        ("ct_refetch_start_to_key", o.changes(After::Start, Upto::Key)),
        ("ct_refetch_key_to_version", o.changes(After::Key, Upto::Version)),
        ("ct_refetch_key_to_key", o.changes(After::Key, Upto::Key)),
        ("ct_pending_start", o.pending(After::Start)),
        ("ct_pending_after_key", o.pending(After::Key)),
        ("ct_oldest_start", o.oldest(After::Start)),
        ("ct_oldest_after_key", o.oldest(After::Key)),
        ("ct_options_oldest_after_key", l.oldest(After::Key)),
        ("ct_walk_first", o.walk(false, false)),
        ("ct_walk_after", o.walk(true, false)),
        ("ct_walk_upto", o.walk(false, true)),
        ("ct_walk_range", o.walk(true, true)),
        ("ct_walk_pending_first", o.walk_pending(false)),
        ("ct_walk_pending_after", o.walk_pending(true)),
        ("ct_options_fetch_after_key", l.changes(After::Key, Upto::Current)),
        (
            "ct_meta_fetch_start",
            CtShape { skip_context: true, metadata: true, ..orders() }.changes(After::Start, Upto::Current),
        ),
        ("ct_options_refetch_key_to_key", l.changes(After::Key, Upto::Key)),
        ("ct_options_pending_after_key", l.pending(After::Key)),
        ("ct_options_walk_range", l.walk(true, true)),
        ("ct_hostile_fetch_after_key", hostile().changes(After::Key, Upto::Current)),
        ("rv_fetch_start", r.changes(After::Start, false, Labels::All)),
        ("rv_fetch_after_version", r.changes(After::Version, false, Labels::Since)),
        ("rv_fetch_after_key", r.changes(After::Key, false, Labels::Since)),
        ("rv_refetch_start_to_key", r.changes(After::Start, true, Labels::All)),
        ("rv_refetch_key_to_key", r.changes(After::Key, true, Labels::Since)),
        ("rv_refetch_version_to_key", r.changes(After::Version, true, Labels::Since)),
        ("rv_pending_start", r.pending(After::Start)),
        ("rv_pending_after_version", r.pending(After::Version)),
        ("rv_pending_after_key", r.pending(After::Key)),
        ("rv_newest", RvShape::newest()),
        ("rv_options_fetch_after_key", ro.changes(After::Key, false, Labels::Since)),
        ("rv_options_fetch_after_key_first_backlog", ro.changes(After::Key, false, Labels::All)),
        ("rv_options_fetch_start", ro.changes(After::Start, false, Labels::All)),
        ("catalog_partition_column", partition_column()),
        ("ct_part_fetch_start", op.changes(After::Start, Upto::Current)),
        ("ct_part_fetch_after_key", op.changes(After::Key, Upto::Current)),
        ("ct_part_refetch_key_to_key", op.changes(After::Key, Upto::Key)),
        ("ct_part_pending_after_key", op.pending(After::Key)),
        ("ct_part_oldest_after_key", op.oldest(After::Key)),
        ("ct_part_walk_first", op.walk(false, false)),
        ("ct_part_walk_pending_first", op.walk_pending(false)),
        ("ct_part_options_fetch_after_key", lp.changes(After::Key, Upto::Current)),
        ("rv_part_column_fetch_start", rc.changes(After::Start, false, Labels::All)),
        ("rv_part_column_fetch_after_key", rc.changes(After::Key, false, Labels::Since)),
        ("rv_part_column_refetch_key_to_key", rc.changes(After::Key, true, Labels::Since)),
        ("rv_part_column_pending_after_key", rc.pending(After::Key)),
        ("rv_part_inline_fetch_start", ri.changes(After::Start, false, Labels::All)),
        ("rv_part_inline_pending_start", ri.pending(After::Start)),
    ]);
    all.extend(backfill::statements());
    all
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/mssql")
}

/// The file text: one comment line naming each parameter, then the statement on one line.
fn render(s: &Statement) -> String {
    let params: Vec<String> = s.slots.iter().enumerate().map(|(i, slot)| format!("@P{} = {slot:?}", i + 1)).collect();
    let header = if params.is_empty() { "-- no parameters".to_string() } else { format!("-- {}", params.join(", ")) };
    format!("{header}\n{}\n", s.sql)
}

#[test]
fn every_statement_matches_its_reviewed_golden_file() {
    let update = std::env::var("UPDATE_GOLDEN").is_ok_and(|v| v == "1");
    let dir = dir();
    let mut failures = Vec::new();
    let statements = all();
    for (name, statement) in &statements {
        let path = dir.join(format!("{name}.sql"));
        let want = render(statement);
        if update {
            std::fs::create_dir_all(&dir).expect("create golden dir");
            std::fs::write(&path, &want).expect("write golden file");
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(have) if have == want => {}
            Ok(have) => failures.push(format!("{}:\n  file: {have}\n  code: {want}", path.display())),
            Err(e) => failures.push(format!("{}: {e}", path.display())),
        }
    }
    if !update {
        for entry in std::fs::read_dir(&dir).expect("golden dir exists").flatten() {
            let file = entry.file_name().to_string_lossy().into_owned();
            if let Some(stem) = file.strip_suffix(".sql") {
                if !statements.contains_key(stem) {
                    failures.push(format!("{file} is not produced by any statement: delete it"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "golden statements differ; if the change is intended, run UPDATE_GOLDEN=1 cargo test --lib source::mssql and review git diff:\n{}",
        failures.join("\n")
    );
}

/// String literals in a statement: only the fixed ones below may appear. Anything else would be a value
/// spliced into the text.
fn literals(sql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = sql.char_indices().peekable();
    let mut in_ident = false;
    while let Some((i, c)) = chars.next() {
        match c {
            '[' if !in_ident => in_ident = true,
            ']' if in_ident => {
                if chars.peek().map(|(_, c)| *c) == Some(']') {
                    chars.next();
                } else {
                    in_ident = false;
                }
            }
            '\'' if !in_ident => {
                let mut lit = String::new();
                for (_, c) in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    lit.push(c);
                }
                let prefixed = i > 0 && &sql[i - 1..i] == "N";
                out.push(if prefixed { format!("N'{lit}'") } else { format!("'{lit}'") });
            }
            _ => {}
        }
    }
    out
}

#[test]
fn no_statement_splices_a_value() {
    const FIXED: &[&str] = &[
        "N'D'",
        "N'I'",
        "N''",
        "N'BASE TABLE'",
        "N'OBJECT'",
        "N'SELECT'",
        "N'VIEW CHANGE TRACKING'",
        "N'PRIMARY KEY'",
        "N'COLUMNID'",
        "N'VIEW SERVER STATE'",
    ];
    for (name, s) in all() {
        for lit in literals(&s.sql) {
            assert!(FIXED.contains(&lit.as_str()), "{name} contains the literal {lit}: values must be parameters");
        }
    }
}

#[test]
fn parameterized_statements_are_upper_case_outside_identifiers() {
    // Valid in case-sensitive databases (INFORMATION_SCHEMA is upper case there) and matchable by the mock.
    for (name, s) in all() {
        if s.slots.is_empty() && name == "catalog_database" {
            continue;
        }
        // The system view the lag reads has lower-case names only; nothing else may be lower case.
        let allowed =
            SYSTEM_NAMES.iter().chain(if name == "catalog_partition_column" { PARTITION_CATALOG_NAMES } else { &[] });
        let sql = allowed.fold(s.sql.clone(), |sql, name| sql.replace(name, ""));
        // A collation is named as the catalog spells it (collation names are not case-sensitive).
        let sql =
            sql.split(" COLLATE ")
                .enumerate()
                .map(|(i, part)| {
                    if i == 0 {
                        part
                    } else {
                        part.trim_start_matches(|c: char| c.is_ascii_alphanumeric() || c == '_')
                    }
                })
                .collect::<String>();
        let mut outside = String::new();
        let mut depth = false;
        let mut chars = sql.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '[' if !depth => depth = true,
                ']' if depth => {
                    if chars.peek() == Some(&']') {
                        chars.next();
                    } else {
                        depth = false;
                    }
                }
                c if !depth => outside.push(c),
                _ => {}
            }
        }
        assert!(
            !outside.chars().any(|c| c.is_ascii_lowercase()),
            "{name} has lower case outside identifiers: {outside}"
        );
    }
}

#[test]
fn a_hostile_table_name_is_quoted_never_spliced() {
    let s = hostile().changes(After::Key, Upto::Current).sql;
    assert!(s.contains("CHANGETABLE(CHANGES [x]]; DROP TABLE y;--], @P3)"), "{s}");
    assert!(s.contains("LEFT JOIN [x]]; DROP TABLE y;--] AS T ON T.[id]]; --] = CT.[id]]; --]"), "{s}");
    assert!(!s.replace("[x]]; DROP TABLE y;--]", "").contains("DROP TABLE"));
}

#[test]
fn the_keyset_is_expanded_and_bounded_for_a_seek() {
    let s = order_lines().changes(After::Key, Upto::Current).sql;
    assert!(s.contains(
        "(CT.SYS_CHANGE_VERSION >= @P4 AND (CT.SYS_CHANGE_VERSION > @P4 OR (CT.SYS_CHANGE_VERSION = @P4 AND \
(CT.[Order Id] > CONVERT(BIGINT, @P5) OR (CT.[Order Id] = CONVERT(BIGINT, @P5) AND CT.[Line №] > CONVERT(NVARCHAR(20), @P6))))))"
    ), "{s}");
    assert!(s.contains("(CT.SYS_CHANGE_CONTEXT IS NULL OR CT.SYS_CHANGE_CONTEXT <> @P7)"), "{s}");
    assert!(!s.starts_with("SET TRANSACTION"), "READ COMMITTED reads add no isolation prefix");
}

#[test]
fn the_rowversion_bound_is_captured_before_the_read_and_inserts_are_labelled_from_a_fixed_base() {
    // Issue 15, defects 3 and 2.
    let s = items_with_options().changes(After::Key, false, Labels::Since);
    let (capture, read) = s.sql.split_once("; ").expect("two statements");
    assert_eq!(capture, "DECLARE @BOUND BINARY(8) = MIN_ACTIVE_ROWVERSION()");
    assert!(!read.contains("MIN_ACTIVE_ROWVERSION()"), "the read must not evaluate the bound itself: {read}");
    assert!(read.contains("WHERE T.[Row Version] < @BOUND AND "), "{read}");
    let base = s.slots.iter().position(|slot| *slot == Slot::Base).expect("the base is bound") + 1;
    assert!(read.contains(&format!("WHEN T.[Created Version] >= CAST(@P{base} AS BINARY(8)) THEN 0")), "{read}");
    let after = s.slots.iter().position(|slot| *slot == Slot::AfterVersion).expect("after") + 1;
    assert!(
        !read.contains(&format!("[Created Version] > CAST(@P{after}")),
        "labels follow the moving position: {read}"
    );
}

#[test]
fn parameters_are_numbered_in_binding_order() {
    let s = orders().changes(After::Key, Upto::Key);
    assert_eq!(
        s.slots,
        vec![
            Slot::Table,
            Slot::Limit,
            Slot::Base,
            Slot::AfterVersion,
            Slot::AfterKey(0),
            Slot::UptoVersion,
            Slot::UptoKey(0)
        ]
    );
    for n in 1..=s.slots.len() {
        assert!(s.sql.contains(&format!("@P{n}")), "@P{n} is unused");
    }
    assert!(!s.sql.contains(&format!("@P{}", s.slots.len() + 1)));
}

#[test]
fn every_partitioned_read_filters_on_its_partition_and_only_one_partition() {
    // Each statement that reads or counts changes of a partitioned source carries exactly one partition predicate.
    let hash = "(CHECKSUM(CT.[ID]) & 2147483647) % CAST(";
    for (name, s) in all() {
        let filters = s.sql.matches("CHECKSUM(").count() + s.sql.matches("T.[P8] = CAST(").count();
        let partitioned = name.starts_with("ct_part_") || name.starts_with("rv_part_");
        assert_eq!(filters, usize::from(partitioned), "{name}: {}", s.sql);
        assert_eq!(s.slots.contains(&Slot::PartitionIndex), partitioned, "{name} binds the partition");
    }
    let fetch = orders_partitioned().changes(After::Key, Upto::Current);
    assert!(fetch.sql.contains(&format!("{hash}@P6 AS INT) = CAST(@P7 AS INT) ORDER BY")), "{}", fetch.sql);
    let walk = orders_partitioned().walk(false, false);
    assert!(
        walk.sql.contains("WHERE (CHECKSUM(T.[ID]) & 2147483647) % CAST(@P2 AS INT) = CAST(@P3 AS INT)"),
        "{}",
        walk.sql
    );
    // With a partition column the fetch is an equality then the rowversion range: a seek on (P8, RV, ID).
    let column = items_partition_column().changes(After::Key, false, Labels::Since);
    assert!(
        column.sql.contains("WHERE T.[RV] < @BOUND AND T.[P8] = CAST(@P2 AS INT) AND (T.[RV] >= "),
        "{}",
        column.sql
    );
    assert!(column.sql.ends_with("ORDER BY T.[RV], T.[ID]"), "the index's order: {}", column.sql);
    assert!(!column.slots.contains(&Slot::PartitionCount), "the column holds N already");
}
