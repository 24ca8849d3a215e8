//! Column names a user may pick that the sources' statements also use as aliases (`t` for the table, `r` for the
//! projected row, `k` for a soft delete's key, `o` for the SQL reader's rows). A statement that wrote
//! `row_to_json(r)` over a table with a column `r` failed every read with "column reference "r" is ambiguous"
//! (42702): the whole-row references are qualified (`r.*`), so every name a table may hold is delivered.

use crate::common::*;
use crate::logical::{answered_until, first_firing, logical_app, Db};
use crate::support;
use serde_json::json;
use testbed::embedded;

/// A table whose columns are named like the statements' aliases; its key is `k`, soft-deleted through `deleted`.
/// The float8 column makes the logical SQL reader have PostgreSQL build its Items (the handler renders fewer types).
const TABLE: &str = r#"CREATE TABLE public.aliases (
    k int8 PRIMARY KEY, r text, t text, o int, f float8, deleted boolean NOT NULL DEFAULT false,
    created_version xid8 NOT NULL DEFAULT pg_current_xact_id(),
    version xid8 NOT NULL DEFAULT pg_current_xact_id()
);"#;

/// The delivered columns, in the table's order.
const COLUMNS: [&str; 5] = ["k", "r", "t", "o", "f"];

/// PostgreSQL's own `row_to_json` of each row's delivered columns, by key.
async fn oracle(db: &tokio_postgres::Client) -> Vec<String> {
    db.query("SELECT row_to_json(x.*)::text FROM (SELECT k, r, t, o, f FROM public.aliases ORDER BY k) x", &[])
        .await
        .expect("row_to_json")
        .iter()
        .map(|row| row.get(0))
        .collect()
}

const ROWS: &str =
    "INSERT INTO public.aliases (k, r, t, o, f) VALUES (1, 'r1', 't1', 10, 1.5), (2, NULL, 't2', 20, NULL)";

#[tokio::test]
async fn the_cursor_source_delivers_columns_named_like_its_statements_aliases_and_their_soft_delete() {
    // GIVEN a cursor function over a table whose columns are named k, r, t and o
    let url = support::fixture().fresh_database("aliases_cursor").await;
    let db = embedded::connect(&url).await.expect("connect");
    db.batch_execute(TABLE).await.expect("schema");
    db.batch_execute(ROWS).await.expect("rows");
    let trigger = json!({
        "source": "postgres-cursor", "tableName": "public.aliases", "connectionStringSetting": "PostgresConnectionString",
        "cursorColumn": "version", "insertedColumn": "created_version", "softDeleteColumn": "deleted",
        "startFrom": "earliest", "columns": COLUMNS
    });
    let app = app_on(&url, &unique_app_name("aliases"), support::timer_function_json(Some(3)), trigger, &[]);
    let host = start(&app).await;

    // WHEN both rows are delivered, then row 2 is soft-deleted
    let inserted = answered_until(&host, 2).await;
    let expected = oracle(&db).await;
    db.execute("UPDATE public.aliases SET deleted = true, version = pg_current_xact_id() WHERE k = 2", &[])
        .await
        .expect("soft delete");
    let deleted = answered_until(&host, 1).await;

    // THEN every Item is row_to_json of the row, and the delete's Item is its key
    assert_eq!(inserted, expected.iter().map(|item| (0, item.clone())).collect::<Vec<_>>(), "{}", host.output());
    assert_eq!(deleted, [(2, r#"{"k":2}"#.to_string())], "{}", host.output());
}

#[tokio::test]
async fn the_logical_sql_reader_delivers_columns_named_like_its_statements_aliases() {
    // GIVEN the logical source's SQL reader over the same table
    let db = Db::shared("aliases_sqlreader", TABLE).await;
    let (app, _) = logical_app(&db, "public.aliases", json!({ "reader": "sql", "columns": COLUMNS }), &[]);
    let host = start(&app).await;
    first_firing(&host).await;

    // WHEN rows are written after its first firing
    db.db.batch_execute(ROWS).await.expect("rows");
    let items = answered_until(&host, 2).await;

    // THEN every Item is row_to_json of the row
    let expected: Vec<(i64, String)> = oracle(&db.db).await.into_iter().map(|item| (0, item)).collect();
    assert_eq!(items, expected, "{}", host.output());
}
