//! Tier 2 for the SQL Server upsert sink: the sink, tiberius and a TDS server (`mssql-mock-tds`) on the wire.
//!
//! What this proves: the sink logs in over TDS and sends, as tiberius puts them on the wire, exactly the
//! reviewed golden statements (`tests/golden/mssql_sink/`) with exactly the expected parameters: one JSON
//! array per statement, at most `maxRowsPerStatement` rows each; that a delivery is one `sp_executesql`
//! request in autocommit mode (its transaction is the `BEGIN TRANSACTION ... COMMIT` inside the reviewed
//! text; no transaction-manager request, no second round trip); how the sink reads the server's answers,
//! each in the shape SQL Server gives it (the catalog's int and sysname columns, the status row, bigint
//! tokens and nvarchar(max) positions, DDL answered with no result set, error numbers: transient or
//! rejected, never quoting a value); and a full sink-mode tick of the engine over the wire, resuming from
//! the checkpoint row. What it cannot prove: T-SQL semantics (the mock has no engine: it answers what a
//! test registered); that is tier 3, `tests/mssql_real.rs`.
//!
//! Every statement the sink can send is sent here: the catalog read, both bookkeeping tables' DDL, every
//! shape of delivery (exactly once and at least once, deletes, upserts, plain inserts, IDENTITY_INSERT,
//! nested JSON, parameters packed past SQL Server's bound, and the reviewed packed text at a bound of two),
//! and both resume reads. The mock is strict (`tap.rs`): a request no test registered an answer for fails the
//! test. Answers are registered under a short upper-case fragment unique to one statement (the sink's
//! statements use lower-case identifiers, so a whole statement cannot be registered as the source's wire
//! tests do), DDL batches under their whole text.

use mssql_mock_tds::{ColumnDefinition as Col, ColumnValue as V, QueryResponse, Row, SqlDataType as T, TerminalError};
use serde_json::{json, Value};
use sql_pseudo_trigger::change::{Change, Operation};
use sql_pseudo_trigger::config::{DeliveryMode, Env, FunctionConfig, SourceSpec, TriggerSettings};
use sql_pseudo_trigger::engine::{OutcomeKind, Trigger};
use sql_pseudo_trigger::sink::{self, Applied, Resume, Sink, SinkBatch, SinkError};
use sql_pseudo_trigger::source::BatchRange;
use sql_pseudo_trigger::state::MemoryStore;
use std::sync::Arc;
use std::time::Duration;
use testbed::MemorySource;

#[path = "mssql_sink_wire/session.rs"]
mod session;
#[path = "mssql_sink_wire/tap.rs"]
mod tap;
mod tds_reader;

use tap::{text, Rpc, Server, Wire};

/// Registered fragments (upper case, each found in exactly one of the sink's statements).
const DELIVERY: &str = "SET XACT_ABORT ON;";
const CATALOG: &str = "= OBJECT_ID(@P1) ORDER BY ";
const RESUME: &str = "SELECT (SELECT ";

/// A reviewed golden statement of the sink.
fn golden(name: &str) -> String {
    let path = format!("{}/tests/golden/mssql_sink/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A sink on `table` with `extra` options, connecting through the tap.
fn sink(server: &Server, table: &str, extra: Value) -> Arc<dyn Sink> {
    let mut options = json!({ "type": "mssql", "tableName": table, "connectionStringSetting": "TargetDb" });
    if let (Some(o), Some(extra)) = (options.as_object_mut(), extra.as_object()) {
        o.extend(extra.clone());
    }
    let env = Env::from_pairs([("TargetDb".to_string(), server.connection_string())]);
    sink::from_options("F", Some(&options), &env, &Default::default()).unwrap_or_else(|e| panic!("a valid sink: {e}"))
}

/// The golden DDL of a bookkeeping table (`create_fence.sql`, `create_checkpoint.sql`), for one in `schema`.
fn create(name: &str, schema: &str) -> String {
    golden(name).replace("[Sales Ünïcode]", schema)
}

/// Accepts the DDL that creates the fence table (and, `exactly_once`, the checkpoint table) in `schema`:
/// SQL Server answers it with no result set.
fn accept_bookkeeping(server: &Server, schema: &str, exactly_once: bool) {
    server.answer_without_rows(&create("create_fence.sql", schema));
    if exactly_once {
        server.answer_without_rows(&create("create_checkpoint.sql", schema));
    }
}

/// One catalog row: name, type, max length, precision, scale, nullable, default, identity, generated, key.
type CatalogRow = (&'static str, &'static str, i32, i32, i32, bool, bool, bool, bool, Option<i32>);

/// The catalog read's answer, with SQL Server's default collation on character columns.
fn catalog(rows: &[CatalogRow]) -> QueryResponse {
    catalog_collated(rows, &[])
}

/// The catalog read's answer as SQL Server gives it (sysname and int columns; the collation empty outside
/// character columns), with `collations` naming a column's collation where it is not the default.
fn catalog_collated(rows: &[CatalogRow], collations: &[(&str, &str)]) -> QueryResponse {
    let names = ["name", "type_name", "max_length", "precision", "scale", "is_nullable"];
    let flags = ["has_default", "is_identity", "is_generated", "key_ordinal"];
    let mut columns: Vec<Col> =
        names.iter().enumerate().map(|(i, n)| Col::new(*n, if i < 2 { T::NVarChar } else { T::Int })).collect();
    columns.extend(flags.iter().map(|n| Col::new(*n, T::Int)));
    columns.push(Col::new("collation", T::NVarChar));
    let rows = rows
        .iter()
        .map(|(n, t, len, p, s, null, def, id, generated, key)| {
            let flag = |b: bool| V::Int(i32::from(b));
            let character = matches!(*t, "char" | "varchar" | "nchar" | "nvarchar");
            let collation = collations.iter().find(|(c, _)| c == n).map(|(_, c)| *c);
            let collation = collation.unwrap_or(if character { "SQL_Latin1_General_CP1_CI_AS" } else { "" });
            Row::new(vec![
                V::NVarChar((*n).into()),
                V::NVarChar((*t).into()),
                V::Int(*len),
                V::Int(*p),
                V::Int(*s),
                flag(*null),
                flag(*def),
                flag(*id),
                flag(*generated),
                key.map(V::Int).unwrap_or(V::Null),
                V::NVarChar(collation.into()),
            ])
        })
        .collect();
    QueryResponse::new(columns, rows)
}

/// `[Sales Ünïcode].[Order]] Lines]` as the golden files know it: key (Id, Line), a reserved word, a quote,
/// a binary column.
const ORDER_LINES: &str = "[Sales Ünïcode].[Order]] Lines]";
const ORDER_LINES_COLUMNS: &[CatalogRow] = &[
    ("Id", "bigint", 8, 19, 0, false, false, false, false, Some(1)),
    ("Line", "int", 4, 10, 0, false, false, false, false, Some(2)),
    ("order", "nvarchar", 200, 0, 0, true, false, false, false, None),
    ("Qty \"x\"", "decimal", 9, 12, 2, true, false, false, false, None),
    ("Photo", "varbinary", -1, 0, 0, true, false, false, false, None),
];

/// The answer of a delivery: `status` (0 written, 1 fenced, 2 already applied) and the stored token.
fn status(status: i32, stored: Option<i64>) -> QueryResponse {
    QueryResponse::new(
        vec![Col::new("status", T::Int), Col::new("stored", T::BigInt)],
        vec![Row::new(vec![V::Int(status), stored.map(V::BigInt).unwrap_or(V::Null)])],
    )
}

fn change(op: Operation, item: &str) -> Change {
    Change::from_json(op, item.to_string()).expect("json")
}

async fn deliver(
    sink: &dyn Sink,
    batch_id: u64,
    fence: u64,
    changes: &[Change],
    range: Option<(&Value, &Value)>,
) -> Result<(), SinkError> {
    let (from, to) = range.map_or((Value::Null, Value::Null), |(f, t)| (f.clone(), t.clone()));
    let range = BatchRange::new(batch_id, from, to, changes.len() as u64);
    sink.deliver(&SinkBatch { app: "app", function: "F", fence, changes, range: &range }).await
}

// ---------------------------------------------------------------------------------------------------------------
// What the sink sends
// ---------------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_delivery_is_one_request_holding_the_golden_batch_with_one_json_parameter_per_statement() {
    // GIVEN the golden table, an exactly-once sink writing two rows per statement, and a server that accepts
    let server = Server::start().await;
    server.answer(CATALOG, catalog(ORDER_LINES_COLUMNS)).await;
    accept_bookkeeping(&server, "[Sales Ünïcode]", true);
    server.answer(DELIVERY, status(0, None)).await;
    let sink = sink(&server, ORDER_LINES, json!({"exactlyOnce": true, "maxRowsPerStatement": 2}));
    let rows: Vec<String> =
        (1..=5).map(|i| format!(r#"{{"Id":{i},"Line":1,"order":"o{i}","Qty \"x\"":1.5,"Photo":"AQID"}}"#)).collect();
    let mut changes = vec![change(Operation::Delete, r#"{"Id":-1,"Line":1}"#)];
    changes.extend(rows.iter().map(|r| change(Operation::Insert, r)));

    // WHEN batch 7, range (null, [9,"x"]], is delivered under fencing token 3
    let (from, to) = (Value::Null, json!([9, "x"]));
    deliver(sink.as_ref(), 7, 3, &changes, Some((&from, &to))).await.expect("written");

    // THEN the sink read the catalog with the golden statement, created its tables with the golden batches,
    let rpcs = server.tap.rpcs();
    assert_eq!(rpcs[0].statement(), golden("catalog_columns.sql"));
    assert_eq!(rpcs[0].values(), vec![text(ORDER_LINES)]);
    assert_eq!(server.tap.batches(), vec![golden("create_fence.sql"), golden("create_checkpoint.sql")]);
    // AND wrote the batch in one request: the golden text, the fixed parameters, and one JSON array per
    // statement of at most two rows (the delete first), every item exactly as the source wrote it
    let deliveries = server.tap.rpcs_with(DELIVERY);
    assert_eq!(deliveries.len(), 1);
    assert_eq!(rpcs.len(), 2, "one catalog read and one delivery");
    assert_eq!(deliveries[0].statement(), golden("delivery_exactly_once_split.sql"));
    let json_array = |items: &[String]| text(&format!("[{}]", items.join(",")));
    assert_eq!(
        deliveries[0].values(),
        vec![
            text("app/F"),
            Wire::Int(3),
            Wire::Int(7),
            text("null"),
            text(r#"[9,"x"]"#),
            Wire::Int(6),
            text(r#"[{"Id":-1,"Line":1}]"#),
            json_array(&rows[0..2]),
            json_array(&rows[2..4]),
            json_array(&rows[4..5]),
        ]
    );
    server.assert_no_client_transactions();
}

#[tokio::test]
async fn a_batch_larger_than_rows_per_statement_is_split_into_statements_of_1000_rows() {
    // GIVEN an at-least-once sink with the default of 1000 rows per statement
    let server = Server::start().await;
    server.answer(CATALOG, catalog(ORDER_LINES_COLUMNS)).await;
    accept_bookkeeping(&server, "[Sales Ünïcode]", false);
    server.answer(DELIVERY, status(0, None)).await;
    let sink = sink(&server, ORDER_LINES, json!({}));

    // WHEN a batch of 1001 key-only updates is delivered (a request of eleven 4 KiB packets), then again on
    // the same pooled connection
    let items: Vec<String> = (1..=1001).map(|i| format!(r#"{{"Id":{i},"Line":2}}"#)).collect();
    let changes: Vec<Change> = items.iter().map(|i| change(Operation::Update, i)).collect();
    deliver(sink.as_ref(), 1, 1, &changes, None).await.expect("written");
    deliver(sink.as_ref(), 1, 1, &changes, None).await.expect("written again on the same connection");

    // THEN each is the golden key-only delivery with its MERGE twice, for @P7 (1000 rows) and @P8 (the last)
    let key_only = golden("delivery_key_only.sql");
    let merge = key_only.lines().find(|l| l.starts_with("MERGE INTO")).expect("a MERGE line").to_string();
    let expected = key_only.replace(&merge, &format!("{merge}\n{}", merge.replace("@P7", "@P8")));
    let deliveries = server.tap.rpcs_with(DELIVERY);
    assert_eq!(deliveries.len(), 2);
    assert_eq!(deliveries[0].statement(), expected);
    let values = deliveries[0].values();
    assert_eq!(values.len(), 8);
    assert_eq!(values[6], text(&format!("[{}]", items[..1000].join(","))));
    assert_eq!(values[7], text(&format!("[{}]", items[1000])));
    // AND without exactlyOnce no checkpoint table was created
    assert_eq!(server.tap.batches(), vec![golden("create_fence.sql")]);
    server.assert_no_client_transactions();
}

#[tokio::test]
async fn the_golden_delivery_of_2500_rows_and_a_delete_is_one_request_of_four_row_parameters() {
    // GIVEN the golden table and an exactly-once sink with the default 1000 rows per statement
    let server = Server::start().await;
    server.answer(CATALOG, catalog(ORDER_LINES_COLUMNS)).await;
    accept_bookkeeping(&server, "[Sales Ünïcode]", true);
    server.answer(DELIVERY, status(0, None)).await;
    let sink = sink(&server, ORDER_LINES, json!({"exactlyOnce": true}));
    let items: Vec<String> =
        (0..2500).map(|i| format!(r#"{{"Id":{i},"Line":1,"order":"x","Qty \"x\"":1,"Photo":"AA=="}}"#)).collect();
    let mut changes: Vec<Change> = items.iter().map(|i| change(Operation::Insert, i)).collect();
    changes.push(change(Operation::Delete, r#"{"Id":-1,"Line":1}"#));

    // WHEN it is delivered (a request of many 4 KiB packets)
    let (from, to) = (json!([1]), json!([2]));
    deliver(sink.as_ref(), 1, 1, &changes, Some((&from, &to))).await.expect("written");

    // THEN the request is the golden text with the deletes, then 1000 + 1000 + 500 rows
    let deliveries = server.tap.rpcs_with(DELIVERY);
    assert_eq!(deliveries.len(), 1);
    assert_eq!(deliveries[0].statement(), golden("delivery_exactly_once.sql"));
    let values = deliveries[0].values();
    assert_eq!(values.len(), 10);
    assert_eq!(values[6], text(r#"[{"Id":-1,"Line":1}]"#));
    assert_eq!(values[9], text(&format!("[{}]", items[2000..].join(","))));
    server.assert_no_client_transactions();
}

#[tokio::test]
async fn a_batch_of_more_statements_than_sql_server_takes_parameters_shares_parameters() {
    // GIVEN one row per statement, and a batch of 2,200 rows: one parameter each would make 2,208 in the
    // request, past SQL Server's 2,100 (error 8003, refused on every attempt)
    let server = Server::start().await;
    server.answer(CATALOG, catalog(ORDER_LINES_COLUMNS)).await;
    accept_bookkeeping(&server, "[Sales Ünïcode]", false);
    server.answer(DELIVERY, status(0, None)).await;
    let sink = sink(&server, ORDER_LINES, json!({"maxRowsPerStatement": 1}));
    let items: Vec<String> = (1..=2200).map(|i| format!(r#"{{"Id":{i},"Line":2}}"#)).collect();
    let changes: Vec<Change> = items.iter().map(|i| change(Operation::Update, i)).collect();

    // WHEN it is delivered
    deliver(sink.as_ref(), 1, 1, &changes, None).await.expect("written");

    // THEN the request holds 2,200 statements of one row but 1,108 parameters (sp_executesql's two, the six
    // fixed ones, 1,100 of rows), each an array of two statements' arrays, read by path
    let deliveries = server.tap.rpcs_with(DELIVERY);
    let request = &deliveries[0];
    assert_eq!(request.params.len(), 2 + 6 + 1100);
    assert_eq!(request.values()[6], text(&format!("[[{}],[{}]]", items[0], items[1])));
    assert_eq!(request.values()[1105], text(&format!("[[{}],[{}]]", items[2198], items[2199])));
    let statement = request.statement();
    assert_eq!(statement.matches("MERGE INTO").count(), 2200);
    assert!(statement.contains("USING OPENJSON(@P7, N'$[0]') WITH"), "{}", &statement[..2000]);
    assert!(statement.contains("USING OPENJSON(@P1106, N'$[1]') WITH"));
    assert!(!statement.contains("@P1107"));
}

#[tokio::test]
async fn the_golden_packed_delivery_is_one_request_whose_statements_read_their_own_array_of_a_shared_parameter() {
    // GIVEN the golden table and a sink writing two rows per statement whose requests may carry only two row
    // parameters: the reviewed packed text shows SQL Server's bound at that size (at 2,092 it would take over
    // 2,092 statements)
    let server = Server::start().await;
    server.answer(CATALOG, catalog(ORDER_LINES_COLUMNS)).await;
    accept_bookkeeping(&server, "[Sales Ünïcode]", false);
    server.answer(DELIVERY, status(0, None)).await;
    let options = json!({ "type": "mssql", "tableName": ORDER_LINES, "connectionStringSetting": "TargetDb",
        "maxRowsPerStatement": 2 });
    let env = Env::from_pairs([("TargetDb".to_string(), server.connection_string())]);
    let sink = sink::mssql_packing_rows_into(&options, &env, 2).unwrap_or_else(|e| panic!("a valid sink: {e}"));

    // WHEN a delete and five inserts are delivered: four statements (the delete, then 2 + 2 + 1 rows)
    let items: Vec<String> =
        (1..=5).map(|i| format!(r#"{{"Id":{i},"Line":1,"order":"o{i}","Qty \"x\"":1.5,"Photo":"AQID"}}"#)).collect();
    let mut changes = vec![change(Operation::Delete, r#"{"Id":-1,"Line":1}"#)];
    changes.extend(items.iter().map(|i| change(Operation::Insert, i)));
    deliver(&sink, 1, 1, &changes, None).await.expect("written");

    // THEN the request is the golden packed delivery: sp_executesql's two parameters, the six fixed ones and
    // two row parameters, each an array of two statements' arrays, read by path
    let deliveries = server.tap.rpcs_with(DELIVERY);
    assert_eq!(deliveries.len(), 1);
    let request = &deliveries[0];
    assert_eq!(request.statement(), golden("delivery_packed.sql"));
    assert_eq!(request.params.len(), 2 + 6 + 2);
    let values = request.values();
    assert_eq!(values[6], text(&format!(r#"[[{{"Id":-1,"Line":1}}],[{},{}]]"#, items[0], items[1])));
    assert_eq!(values[7], text(&format!("[[{},{}],[{}]]", items[2], items[3], items[4])));
    assert_eq!(server.tap.batches(), vec![golden("create_fence.sql")]);
    server.assert_no_client_transactions();
}

#[tokio::test]
async fn an_identity_table_gets_plain_inserts_and_identity_insert_merges_in_one_delivery() {
    // GIVEN the golden table whose Id is an identity
    let server = Server::start().await;
    let mut columns = ORDER_LINES_COLUMNS.to_vec();
    columns[0].7 = true;
    server.answer(CATALOG, catalog(&columns)).await;
    accept_bookkeeping(&server, "[Sales Ünïcode]", false);
    server.answer(DELIVERY, status(0, None)).await;
    let sink = sink(&server, ORDER_LINES, json!({}));

    // WHEN a row without Id and a row naming Id 5 are delivered
    let changes = [
        change(Operation::Insert, r#"{"Line":1,"order":"a"}"#),
        change(Operation::Insert, r#"{"Id":5,"Line":1,"order":"b"}"#),
    ];
    deliver(sink.as_ref(), 1, 1, &changes, None).await.expect("written");

    // THEN the delivery holds the golden plain INSERT (@P7) and the golden MERGE under IDENTITY_INSERT (@P8)
    let deliveries = server.tap.rpcs_with(DELIVERY);
    let lines: Vec<&str> = deliveries[0].statement().lines().collect();
    assert!(lines.contains(&golden("insert_identity_absent.sql").as_str()), "{lines:#?}");
    assert!(lines.contains(&golden("merge_identity_present.sql").as_str()), "{lines:#?}");
    assert_eq!(
        deliveries[0].values()[6..],
        [text(r#"[{"Line":1,"order":"a"}]"#), text(r#"[{"Id":5,"Line":1,"order":"b"}]"#)]
    );
}

#[tokio::test]
async fn a_temporal_tables_period_columns_are_left_to_the_server_and_a_clr_column_is_named_when_carried() {
    // GIVEN a system-versioned table as the golden catalog read describes it: NOT NULL period columns
    // without defaults, flagged generated (GENERATED ALWAYS), and a geography column (a CLR type the
    // catalog now keeps in the shape instead of dropping)
    let server = Server::start().await;
    server
        .answer(
            CATALOG,
            catalog(&[
                ("id", "int", 4, 10, 0, false, false, false, false, Some(1)),
                ("name", "nvarchar", 100, 0, 0, true, false, false, false, None),
                ("ValidFrom", "datetime2", 8, 27, 7, false, false, false, true, None),
                ("ValidTo", "datetime2", 8, 27, 7, false, false, false, true, None),
                ("place", "geography", -1, 0, 0, true, false, false, false, None),
            ]),
        )
        .await;
    accept_bookkeeping(&server, "[dbo]", false);
    server.answer(DELIVERY, status(0, None)).await;
    let sink = sink(&server, "dbo.accounts", json!({}));

    // WHEN items that leave the period columns out are delivered, then an item that carries the geography
    deliver(sink.as_ref(), 1, 1, &[change(Operation::Insert, r#"{"id":1,"name":"a"}"#)], None).await.expect("written");
    let e = deliver(sink.as_ref(), 2, 1, &[change(Operation::Insert, r#"{"id":2,"place":"POINT(1 2)"}"#)], None)
        .await
        .unwrap_err();

    // THEN the first was written without naming the period columns (SQL Server fills them in), and the
    // second is refused before anything is sent, naming the column and its type
    let deliveries = server.tap.rpcs_with(DELIVERY);
    assert_eq!(deliveries.len(), 1);
    assert!(!deliveries[0].statement().contains("Valid"), "{}", deliveries[0].statement());
    assert!(e.to_string().contains(r#"property "place" of change 0 is column "place" of dbo.accounts"#), "{e}");
    assert!(e.to_string().contains("(geography)"), "{e}");
}

#[tokio::test]
async fn character_columns_are_read_as_unicode_and_keys_compared_under_their_own_collation() {
    // GIVEN a table keyed on a varchar column in Greek_CI_AS and an nchar one, with a Cyrillic varchar column
    let server = Server::start().await;
    let columns = [
        ("code", "varchar", 10, 0, 0, false, false, false, false, Some(1)),
        ("region", "nchar", 4, 0, 0, false, false, false, false, Some(2)),
        ("label", "varchar", 50, 0, 0, true, false, false, false, None),
        ("note", "nvarchar", -1, 0, 0, true, false, false, false, None),
    ];
    let collations =
        [("code", "Greek_CI_AS"), ("region", "Latin1_General_100_CI_AS_SC"), ("label", "Cyrillic_General_CI_AS")];
    server.answer(CATALOG, catalog_collated(&columns, &collations)).await;
    accept_bookkeeping(&server, "[dbo]", false);
    server.answer(DELIVERY, status(0, None)).await;
    let sink = sink(&server, "dbo.codes", json!({}));

    // WHEN a delete and an upsert are delivered
    let changes = [
        change(Operation::Delete, r#"{"code":"α","region":"EU"}"#),
        change(Operation::Update, r#"{"code":"β","region":"EU","label":"л","note":"n"}"#),
    ];
    deliver(sink.as_ref(), 1, 1, &changes, None).await.expect("written");

    // THEN the delivery holds the golden statements: every character column read as nvarchar(max), the
    // keys compared under their collations (the varchar one cast back to varchar), the values sent as is
    let deliveries = server.tap.rpcs_with(DELIVERY);
    let lines: Vec<&str> = deliveries[0].statement().lines().collect();
    assert!(lines.contains(&golden("delete_character_keys.sql").as_str()), "{lines:#?}");
    assert!(lines.contains(&golden("merge_character_keys.sql").as_str()), "{lines:#?}");
    assert_eq!(
        deliveries[0].values()[6..],
        [text(r#"[{"code":"α","region":"EU"}]"#), text(r#"[{"code":"β","region":"EU","label":"л","note":"n"}]"#)]
    );
}

#[tokio::test]
async fn nested_json_is_read_as_json_text_for_character_columns_and_refused_for_others() {
    // GIVEN the golden table and items as a PostgreSQL source sends a jsonb column: an object
    let server = Server::start().await;
    server.answer(CATALOG, catalog(ORDER_LINES_COLUMNS)).await;
    accept_bookkeeping(&server, "[Sales Ünïcode]", false);
    server.answer(DELIVERY, status(0, None)).await;
    let sink = sink(&server, ORDER_LINES, json!({}));
    let nested = r#"{"Id":1,"Line":1,"order":{"lines":[1,2],"note":"x"}}"#;

    // WHEN it is delivered into the nvarchar column, then into the decimal one
    deliver(sink.as_ref(), 1, 1, &[change(Operation::Update, nested)], None).await.expect("written");
    let into_decimal = r#"{"Id":1,"Line":1,"Qty \"x\"":{"amount":1}}"#;
    let e = deliver(sink.as_ref(), 2, 1, &[change(Operation::Update, into_decimal)], None).await.unwrap_err();

    // THEN the first went as sent, read both as a scalar and AS JSON, and written as whichever is not NULL
    let deliveries = server.tap.rpcs_with(DELIVERY);
    assert_eq!(deliveries.len(), 1, "the refused batch was never sent");
    let statement = deliveries[0].statement();
    assert!(
        statement.contains(r#"[order] nvarchar(max) N'$."order"', [#json2] nvarchar(max) N'$."order"' AS JSON"#),
        "{statement}"
    );
    assert!(statement.contains("t.[order] = COALESCE(s.[order], s.[#json2])"), "{statement}");
    assert_eq!(deliveries[0].values()[6], text(&format!("[{nested}]")));
    // AND the second is refused, naming the column and its type, since OPENJSON would read NULL into it
    assert!(matches!(e, SinkError::Rejected(_)), "{e:?}");
    assert!(
        e.to_string()
            .contains(r#"which column "Qty \"x\"" of Sales Ünïcode.Order] Lines (decimal(12, 2)) cannot hold"#),
        "{e}"
    );
}

#[tokio::test]
async fn names_that_for_json_escapes_are_sent_spelled_as_the_statement_names_them() {
    // GIVEN a table with columns named with `/` and `\`, and items as the change-tracking source builds
    // them with FOR JSON, which writes `/` as `\/` in names and values alike
    let server = Server::start().await;
    server
        .answer(
            CATALOG,
            catalog(&[
                ("id", "int", 4, 10, 0, false, false, false, false, Some(1)),
                ("Name/Test", "nvarchar", 40, 0, 0, true, false, false, false, None),
                ("Cost\\Test", "int", 4, 10, 0, true, false, false, false, None),
            ]),
        )
        .await;
    accept_bookkeeping(&server, "[dbo]", false);
    server.answer(DELIVERY, status(0, None)).await;
    let sink = sink(&server, "dbo.products", json!({}));
    let for_json = r#"{"id":1,"Name\/Test":"a\/b","Cost\\Test":1}"#;

    // WHEN it is delivered
    deliver(sink.as_ref(), 1, 1, &[change(Operation::Insert, for_json)], None).await.expect("written");

    // THEN the statement's paths and the item sent spell the names the same way (OPENJSON matches a path
    // against a name as written): `/` plain, `\` escaped; the values are sent exactly as written
    let deliveries = server.tap.rpcs_with(DELIVERY);
    let statement = deliveries[0].statement();
    assert!(statement.contains(r#"[Name/Test] nvarchar(max) N'$."Name/Test"'"#), "{statement}");
    assert!(statement.contains(r#"[Cost\Test] int N'$."Cost\\Test"'"#), "{statement}");
    assert_eq!(deliveries[0].values()[6], text(r#"[{"id":1,"Name/Test":"a\/b","Cost\\Test":1}]"#));
}

#[tokio::test]
async fn bookkeeping_tables_another_instance_just_created_are_fine_and_a_refused_create_says_what_to_run() {
    // GIVEN a server on which creating the fence table fails because it now exists (2714), then a server
    // on which the login may not create tables (262)
    let server = Server::start().await;
    server.answer(CATALOG, catalog(ORDER_LINES_COLUMNS)).await;
    let fence_ddl = create("create_fence.sql", "[Sales Ünïcode]");
    let exists = "There is already an object named 'sql_pseudo_trigger_fence' in the database.";
    server.answer(&fence_ddl, QueryResponse::error_only(TerminalError::new(2714, 16, exists))).await;
    server.answer(DELIVERY, status(0, None)).await;
    let changes = [change(Operation::Update, r#"{"Id":1,"Line":2}"#)];

    // WHEN the sink first writes
    deliver(sink(&server, ORDER_LINES, json!({})).as_ref(), 1, 1, &changes, None).await.expect("written");
    let denied = "CREATE TABLE permission denied in database 'appdb'.";
    server.answer(&fence_ddl, QueryResponse::error_only(TerminalError::new(262, 14, denied))).await;
    let e = deliver(sink(&server, ORDER_LINES, json!({})).as_ref(), 1, 1, &changes, None).await.unwrap_err();

    // THEN the race is no error, and the refusal is a rejection that quotes the DDL to run once
    assert!(matches!(e, SinkError::Rejected(_)), "{e:?}");
    assert!(e.to_string().contains(&format!("create it once with a login that may: {fence_ddl}")), "{e}");
    assert_eq!(server.tap.batches(), vec![fence_ddl.clone(), fence_ddl]);
}

// ---------------------------------------------------------------------------------------------------------------
// How the sink reads the server's answers
// ---------------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_fence_refusal_is_fenced_with_both_tokens_and_an_already_applied_batch_is_success() {
    // GIVEN a server whose fence row holds token 9
    let server = Server::start().await;
    server.answer(CATALOG, catalog(ORDER_LINES_COLUMNS)).await;
    accept_bookkeeping(&server, "[Sales Ünïcode]", true);
    server.answer(DELIVERY, status(1, Some(9))).await;
    let sink = sink(&server, ORDER_LINES, json!({"exactlyOnce": true}));
    let changes = [change(Operation::Update, r#"{"Id":1,"Line":2}"#)];
    let (from, to) = (json!([1]), json!([2]));

    // WHEN a deposed owner (token 3) delivers, and later the batch turns out to be applied already
    let fenced = deliver(sink.as_ref(), 4, 3, &changes, Some((&from, &to))).await;
    server.answer(DELIVERY, status(2, Some(3))).await;
    let again = deliver(sink.as_ref(), 4, 3, &changes, Some((&from, &to))).await;

    // THEN the first is Fenced, naming both tokens, and the second succeeds (nothing was written again)
    assert!(matches!(fenced, Err(SinkError::Fenced { ours: 3, stored: 9 })), "{fenced:?}");
    assert!(again.is_ok(), "{again:?}");
    assert_eq!(server.tap.rpcs_with(DELIVERY).len(), 2);
}

#[tokio::test]
async fn server_errors_are_transient_or_rejected_by_number_and_never_quote_a_value() {
    let server = Server::start().await;
    server.answer(CATALOG, catalog(ORDER_LINES_COLUMNS)).await;
    accept_bookkeeping(&server, "[Sales Ünïcode]", false);
    let sink = sink(&server, ORDER_LINES, json!({}));
    let changes = [change(Operation::Update, r#"{"Id":42,"Line":2}"#)];

    // A deadlock victim (1205) is reported as transient at once: the next tick is the retry, not the sink
    server
        .answer(
            DELIVERY,
            QueryResponse::error_only(TerminalError::new(
                1205,
                13,
                "Transaction (Process ID 52) was deadlocked on lock resources with another process and has been chosen as the deadlock victim. Rerun the transaction.",
            )),
        )
        .await;
    let e = deliver(sink.as_ref(), 1, 1, &changes, None).await.unwrap_err();
    assert!(matches!(e, SinkError::Transient(_)), "{e:?}");
    assert!(
        e.to_string().starts_with("SQL Server error 1205 while writing Sales Ünïcode.Order] Lines: Transaction (Process ID 52) was deadlocked"),
        "{e}"
    );
    assert_eq!(server.tap.rpcs_with(DELIVERY).len(), 1, "the batch was sent once");

    // A constraint (547) is rejected with the server's message, which names the constraint and no value
    let check = "The MERGE statement conflicted with the CHECK constraint \"positive_line\". The conflict occurred in database \"appdb\", table \"Sales Ünïcode.Order] Lines\", column 'Line'.";
    server.answer(DELIVERY, QueryResponse::error_only(TerminalError::new(547, 16, check))).await;
    let e = deliver(sink.as_ref(), 1, 1, &changes, None).await.unwrap_err();
    assert!(matches!(e, SinkError::Rejected(_)), "{e:?}");
    assert_eq!(e.to_string(), format!("SQL Server error 547 while writing Sales Ünïcode.Order] Lines: {check}"));

    // A duplicate key (2627) and a conversion (245) quote the value: rejected without the server's message
    let duplicate = "Violation of PRIMARY KEY constraint 'PK_x'. Cannot insert duplicate key in object 'x'. The duplicate key value is (42, secret).";
    server.answer(DELIVERY, QueryResponse::error_only(TerminalError::new(2627, 14, duplicate))).await;
    let e = deliver(sink.as_ref(), 1, 1, &changes, None).await.unwrap_err();
    assert!(matches!(e, SinkError::Rejected(_)) && e.to_string().contains("violates a unique key"), "{e:?}");
    assert!(!e.to_string().contains("secret"), "{e}");
    let conversion = "Conversion failed when converting the nvarchar value 'secret' to data type int.";
    server.answer(DELIVERY, QueryResponse::error_only(TerminalError::new(245, 16, conversion))).await;
    let e = deliver(sink.as_ref(), 1, 1, &changes, None).await.unwrap_err();
    assert!(matches!(e, SinkError::Rejected(_)) && e.to_string().starts_with("SQL Server error 245:"), "{e:?}");
    assert!(!e.to_string().contains("secret"), "{e}");

    // AND each rejection dropped the cached table shape: the catalog was read again before each next write
    assert_eq!(server.tap.rpcs_with(CATALOG).len(), 3, "first use, then after each of the first two rejections");
    assert!(!format!("{sink:?}").contains("not-a-real-secret"), "the password never shows in Debug");
}

#[tokio::test]
async fn a_missing_table_and_a_table_without_primary_key_are_refused_with_what_to_do() {
    // GIVEN a catalog read that returns no rows, as SQL Server does for a table that does not exist
    let server = Server::start().await;
    server.answer(CATALOG, catalog(&[])).await;
    let e = deliver(sink(&server, "dbo.nope", json!({})).as_ref(), 1, 1, &[], None).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "sink table dbo.nope does not exist (or the login cannot see it); create it, or check the sink's tableName and grant the login access to it"
    );
    server.answer(CATALOG, catalog(&[("id", "bigint", 8, 19, 0, false, false, false, false, None)])).await;
    let e = deliver(sink(&server, "dbo.nokey", json!({})).as_ref(), 1, 1, &[], None).await.unwrap_err();
    assert!(
        e.to_string().contains("has no primary key")
            && e.to_string().contains("ALTER TABLE [dbo].[nokey] ADD PRIMARY KEY"),
        "{e}"
    );
}

#[tokio::test]
async fn what_the_sink_recorded_is_read_in_one_statement_with_the_fence_and_the_checkpoint_row() {
    // GIVEN a target whose fence row holds 4 and whose checkpoint row names batch 7, (null, [2,6]]
    let server = Server::start().await;
    server.answer(CATALOG, catalog(ORDER_LINES_COLUMNS)).await;
    server
        .answer(
            RESUME,
            QueryResponse::new(
                vec![
                    Col::new("fence", T::BigInt),
                    Col::new("batch_id", T::BigInt),
                    Col::new("from_position", T::NVarCharMax),
                    Col::new("to_position", T::NVarCharMax),
                ],
                vec![Row::new(vec![
                    V::BigInt(4),
                    V::BigInt(7),
                    V::NVarCharMax(vec!["null".encode_utf16().collect()]),
                    V::NVarCharMax(vec!["[2,6]".encode_utf16().collect()]),
                ])],
            ),
        )
        .await;
    accept_bookkeeping(&server, "[Sales Ünïcode]", true);
    let sink = sink(&server, ORDER_LINES, json!({"exactlyOnce": true}));

    // WHEN sink mode asks
    let resume = sink.resume_position("app", "F").await.expect("answered");

    // THEN it is the golden statement for app/F, read as the fence and the applied batch
    let asked: Vec<Rpc> = server.tap.rpcs_with(RESUME);
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].statement(), golden("resume_exactly_once.sql"));
    assert_eq!(asked[0].values(), vec![text("app/F")]);
    assert_eq!(
        resume,
        Some(Resume { fence: 4, applied: Some(Applied { batch_id: 7, from: Value::Null, to: json!([2, 6]) }) })
    );
}

#[tokio::test]
async fn an_at_least_once_sink_reads_only_its_fence_token() {
    // GIVEN a target whose fence row holds 6, and an at-least-once sink (no checkpoint table)
    let server = Server::start().await;
    server.answer(CATALOG, catalog(ORDER_LINES_COLUMNS)).await;
    accept_bookkeeping(&server, "[Sales Ünïcode]", false);
    server
        .answer(RESUME, QueryResponse::new(vec![Col::new("fence", T::BigInt)], vec![Row::new(vec![V::BigInt(6)])]))
        .await;
    let sink = sink(&server, ORDER_LINES, json!({}));

    // WHEN sink mode asks what it recorded
    let resume = sink.resume_position("app", "F").await.expect("answered");

    // THEN it sent the golden fence read and read the token, with no applied batch
    let asked = server.tap.rpcs_with(RESUME);
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].statement(), golden("resume_fence.sql"));
    assert_eq!(asked[0].values(), vec![text("app/F")]);
    assert_eq!(resume, Some(Resume { fence: 6, applied: None }));
}

#[tokio::test]
#[should_panic(expected = "the mock is strict: 1 request(s) had no registered answer")]
async fn a_request_nobody_registered_fails_the_test_even_when_the_code_under_test_shrugs_it_off() {
    // GIVEN a server with nothing registered
    let server = Server::start().await;
    // WHEN the sink reads the catalog, and the test ignores the outcome
    let _ = deliver(sink(&server, ORDER_LINES, json!({})).as_ref(), 1, 1, &[], None).await;
    // THEN dropping the server fails the test, naming the request
}

// ---------------------------------------------------------------------------------------------------------------
// The engine in sink mode, over the wire
// ---------------------------------------------------------------------------------------------------------------

fn sink_mode_function(server: &Server) -> FunctionConfig {
    let settings = TriggerSettings {
        polling_interval: Duration::from_millis(5),
        max_attempts: 3,
        delivery_mode: DeliveryMode::Sink,
        ..testbed::config::settings()
    };
    let env = Env::from_pairs([("SqlConnectionString".to_string(), server.connection_string())]);
    let sqltrigger = json!({ "tableName": "dbo.orders", "connectionStringSetting": "SqlConnectionString" });
    FunctionConfig {
        source: SourceSpec::from_json(&sqltrigger, &env).expect("a valid sqltrigger.json"),
        ..testbed::config::function("F", settings)
    }
}

#[tokio::test]
async fn a_sink_mode_tick_without_state_resumes_after_the_checkpoint_row_and_writes_under_a_newer_token() {
    // GIVEN rows 1-8 in three transactions, and a target whose checkpoint row says rows up to [2,6] (the
    // second transaction) were applied as batch 7 under fencing token 4, while the state document is lost
    let server = Server::start().await;
    server
        .answer(
            CATALOG,
            catalog(&[
                ("id", "bigint", 8, 19, 0, false, false, false, false, Some(1)),
                ("v", "bigint", 8, 19, 0, true, false, false, false, None),
            ]),
        )
        .await;
    server
        .answer(
            RESUME,
            QueryResponse::new(
                vec![
                    Col::new("fence", T::BigInt),
                    Col::new("batch_id", T::BigInt),
                    Col::new("from_position", T::NVarCharMax),
                    Col::new("to_position", T::NVarCharMax),
                ],
                vec![Row::new(vec![
                    V::BigInt(4),
                    V::BigInt(7),
                    V::NVarCharMax(vec!["[1,3]".encode_utf16().collect()]),
                    V::NVarCharMax(vec!["[2,6]".encode_utf16().collect()]),
                ])],
            ),
        )
        .await;
    accept_bookkeeping(&server, "[dbo]", true);
    server.answer(DELIVERY, status(0, None)).await;
    let source = Arc::new(MemorySource::new());
    source.upsert(1..=3, 1);
    source.upsert(4..=6, 2);
    source.upsert(7..=8, 3);
    let sink = sink(&server, "dbo.orders_copy", json!({"exactlyOnce": true}));
    let store = Arc::new(MemoryStore::new());
    let trigger = Trigger::new(sink_mode_function(&server), "app", source, store, "owner-1".into());

    // WHEN one sink-mode tick runs
    let out = trigger.tick_into(sink.as_ref()).await.expect("tick");

    // THEN it wrote only rows 7-8, as batch 8 after [2,6], under token 5, and acknowledged them
    assert_eq!((out.kind, out.batch_id), (OutcomeKind::Delivered, Some(8)));
    let deliveries = server.tap.rpcs_with(DELIVERY);
    assert_eq!(deliveries.len(), 1);
    assert_eq!(
        deliveries[0].values(),
        vec![
            text("app/F"),
            Wire::Int(5),
            Wire::Int(8),
            text("[2,6]"),
            text("[3,8]"),
            Wire::Int(2),
            text(r#"[{"id":7,"v":3},{"id":8,"v":3}]"#),
        ]
    );
    let (doc, _) = trigger.load().await.expect("load").expect("state written");
    assert_eq!(
        (doc.checkpoint().clone(), doc.in_flight().is_none(), doc.counters().delivered),
        (json!([3, 8]), true, 2)
    );
    server.assert_no_client_transactions();
}
