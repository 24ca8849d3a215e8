//! The checks' messages, each tested without a server.

use super::*;
use crate::config::Env;
use crate::config::{Partition, RowversionOptions, SourceSpec};
use crate::ident::Ident;
use crate::source::mssql::sql::{CtShape, PartitionFilter};
use crate::source::mssql::types::SqlType;
use crate::source::SourceError;

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
    assert!(err(change_tracking_shape(&spec("dbo.V"), &db(), &view, &cols(), false, false)).contains("is not a table"));
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
    let shape = change_tracking_shape(&spec("dbo.Orders"), &db(), &table_ok(), &cols(), false, false).expect("valid");
    assert!(shape.snapshot);
    let d = DatabaseFacts { snapshot_state: 0, ..db() };
    assert!(
        !change_tracking_shape(&spec("dbo.Orders"), &d, &table_ok(), &cols(), false, false).expect("valid").snapshot
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
    let shape = rowversion_shape(&s, &with_column("sqltrigger_p8"), &db(), &table_ok(), &items_cols()).expect("valid");
    assert_eq!(shape.partition, Some(PartitionFilter::Column(Ident::new("sqltrigger_p8").expect("valid"))));
    let item: Vec<&str> = shape.item.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(item, ["Id", "Name", "RV"], "the handler's column is not the app's data");
    let inline = rowversion_shape(&s, &RowversionOptions::default(), &db(), &table_ok(), &items_cols()).expect("valid");
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
    let shape = rowversion_shape(&s, &with_column("sqltrigger_p8"), &db(), &table_ok(), &items_cols()).expect("valid");
    let p = s.partition.expect("a partition");
    let stored = "((checksum([Id])&(2147483647))%(8))";

    // THEN the definition as SQL Server stores it passes, and with an index nothing is said
    assert_eq!(check_partition_column(&shape, p, Some(&facts(stored, 1))).expect("valid"), None);
    // AND without the index the source works and says what to run and what a fetch costs
    let warning = check_partition_column(&shape, p, Some(&facts(stored, 0))).expect("valid").expect("a warning");
    assert!(warning.contains("has no index leading with ([sqltrigger_p8], [RV])"), "{warning}");
    assert!(warning.contains("to keep about 1 in 8, and each partition does it again"), "{warning}");
    assert!(
        warning.ends_with("Run CREATE INDEX [IX_Items_sqltrigger_p8] ON [dbo].[Items] ([sqltrigger_p8], [RV], [Id])"),
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
    let shape = rowversion_shape(&s, &RowversionOptions::default(), &db(), &table_ok(), &items_cols()).expect("valid");
    let warning = inline_partition_warning(&shape, s.partition.expect("a partition")).expect("a warning");
    assert_eq!(
        warning,
        "dbo.Items is split into 8 partitions without a partition column: each fetch of a partition reads the rows changed since its position (a scan of the table, or of an index on the rowversion column alone), hashes every key and keeps about 1 in 8, and each of the 8 partitions does it again. Add the column and its index, then set \"partitionColumn\": \"sqltrigger_p8\" in sqltrigger.json: ALTER TABLE [dbo].[Items] ADD [sqltrigger_p8] AS ((CHECKSUM([Id]) & 2147483647) % 8) PERSISTED; CREATE INDEX [IX_Items_sqltrigger_p8] ON [dbo].[Items] ([sqltrigger_p8], [RV], [Id])"
    );
}
