//! Exact values whatever the database's settings (issue 31, the source side): a database whose sessions default
//! to `DateStyle` `SQL, DMY`, `IntervalStyle` `postgres_verbose`, `extra_float_digits` 0, `bytea_output`
//! `escape` and the time zone `Asia/Kolkata` (`IST`, which reads back as Israel time, and local mean time
//! `+05:53:28` before 1854). Through the cursor source (JSON and `messageFormat` text), the logical stream and
//! the logical SQL reader, every `Item` must be byte for byte PostgreSQL's own `row_to_json` of the row read in a
//! canonical session: the session contract's settings (`db::postgres::session`), written out here by hand as
//! the witness, and the database's time zone, which the contract keeps.

use crate::common::*;
use crate::logical::{answered_until, first_firing, logical_app, Db};
use crate::support;
use serde_json::{json, Value};
use testbed::driver::{HostDriver, Received};
use testbed::embedded;

/// The watched table, and the database's hostile defaults (new sessions get them; this one keeps the server's).
const HOSTILE: &str = r#"CREATE DOMAIN public.blob AS bytea;
CREATE TYPE public.pair AS (n int, b bytea);
CREATE TABLE public.vals (
    id int8 PRIMARY KEY, tz timestamptz, d date, f8 float8, f4 float4, dr daterange, iv interval, tr tsrange,
    tzm tstzmultirange, b bytea, ba bytea[], bd public.blob, bc public.pair,
    created_version xid8 NOT NULL DEFAULT pg_current_xact_id(),
    version xid8 NOT NULL DEFAULT pg_current_xact_id()
);
DO $$ BEGIN
    EXECUTE format('ALTER DATABASE %I SET timezone TO %L', current_database(), 'Asia/Kolkata');
    EXECUTE format('ALTER DATABASE %I SET DateStyle TO %L', current_database(), 'SQL, DMY');
    EXECUTE format('ALTER DATABASE %I SET IntervalStyle TO %L', current_database(), 'postgres_verbose');
    EXECUTE format('ALTER DATABASE %I SET extra_float_digits TO %L', current_database(), '0');
    EXECUTE format('ALTER DATABASE %I SET bytea_output TO %L', current_database(), 'escape');
END $$;"#;

/// The values of every defect filed: an instant `IST` would shift, local mean time, a BC date, the largest
/// double and real, a date range, an interval, a timestamp range and multirange, bytea at the top and nested
/// (an array, a domain, a composite). One transaction, so one batch.
const ROWS: &str = r#"INSERT INTO public.vals (id, tz, d, f8, f4, dr, iv, tr, tzm, b, ba, bd, bc) VALUES
    (1, '2024-01-02 03:04:05+00', '2024-01-02', 1.7976931348623157e308, 3.4028235e38, '[2024-01-02,2024-03-04)',
     '1 year 2 mons 3 days 04:05:06.789', '[2024-01-02 03:04:05,2024-03-04 05:06:07)',
     '{[2024-01-02 03:04:05+00,2024-03-04 05:06:07+00)}', '\x00ff10', ARRAY['\x0102'::bytea, '\xff'::bytea],
     '\x0a0b', ROW(1, '\x0c0d')::public.pair),
    (2, '1850-01-01 00:00+00', NULL, -2.2250738585072014e-308, 1.17549435e-38, NULL, NULL, NULL, NULL, NULL, NULL,
     NULL, NULL),
    (3, '4713-01-01 00:00+00 BC', '4713-01-01 BC', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"#;

/// The columns every function here delivers (not the cursor's own xid8 columns).
const COLUMNS: [&str; 13] = ["id", "tz", "d", "f8", "f4", "dr", "iv", "tr", "tzm", "b", "ba", "bd", "bc"];

/// The sources' projection (a top-level bytea as base64, the rest as `row_to_json` writes it) of each row.
const ITEMS: &str = r#"SELECT row_to_json(r)::text FROM public.vals t CROSS JOIN LATERAL (SELECT t.id AS id,
    t.tz AS tz, t.d AS d, t.f8 AS f8, t.f4 AS f4, t.dr AS dr, t.iv AS iv, t.tr AS tr, t.tzm AS tzm,
    translate(encode(t.b, 'base64'), E'\n', '') AS b, t.ba AS ba, t.bd AS bd, t.bc AS bc) r ORDER BY t.id"#;

/// The settings a canonical session writes values with: the contract's, by hand (an independent witness).
const CANONICAL: &str =
    "SET DateStyle = 'ISO, MDY'; SET IntervalStyle = 'postgres'; SET extra_float_digits = 3; SET bytea_output = 'hex'";

/// The `Item`s a canonical session's `row_to_json` gives, by id. Checked first against a session with the
/// database's defaults: those must differ (or the database is not hostile and the test could not fail), and
/// the canonical text must hold the values as written.
async fn canonical_items(url: &str) -> Vec<String> {
    let hostile = embedded::connect(url).await.expect("a session with the database's defaults");
    let hostile: Vec<String> = hostile.query(ITEMS, &[]).await.expect("items").iter().map(|r| r.get(0)).collect();
    let canonical = embedded::connect(url).await.expect("a canonical session");
    canonical.batch_execute(CANONICAL).await.expect("canonical settings");
    let items: Vec<String> = canonical.query(ITEMS, &[]).await.expect("items").iter().map(|r| r.get(0)).collect();
    assert_eq!(items.len(), 3, "{items:#?}");
    assert_ne!(items, hostile, "the database's defaults change no text: the test proves nothing");
    for text in [
        r#""tz":"2024-01-02T08:34:05+05:30""#,
        r#""f8":1.7976931348623157e+308,"f4":3.4028235e+38,"dr":"[2024-01-02,2024-03-04)""#,
        r#""iv":"1 year 2 mons 3 days 04:05:06.789""#,
        r#""tzm":"{[\"2024-01-02 08:34:05+05:30\",\"2024-03-04 10:36:07+05:30\")}""#,
        r#""b":"AP8Q","ba":["\\x0102","\\xff"],"bd":"\\x0a0b","bc":{"n":1,"b":"\\x0c0d"}"#,
    ] {
        assert!(items[0].contains(text), "{text} not in {}", items[0]);
    }
    assert!(items[1].contains(r#""tz":"1850-01-01T05:53:28+05:53:28""#), "{}", items[1]);
    assert!(items[2].contains(r#""tz":"4713-01-01T05:53:28+05:53:28 BC","d":"4713-01-01 BC""#), "{}", items[2]);
    items
}

/// Starts the handler on a cursor function over `public.vals` of `url` with `message_format`.
async fn cursor_host(url: &str, message_format: Option<&str>) -> (HostDriver, support::AppFolder) {
    let mut trigger = json!({
        "source": "postgres-cursor", "tableName": "public.vals", "connectionStringSetting": "PostgresConnectionString",
        "cursorColumn": "version", "insertedColumn": "created_version", "startFrom": "earliest", "columns": COLUMNS
    });
    if let Some(format) = message_format {
        trigger["messageFormat"] = json!(format);
    }
    let app = app_on(url, &unique_app_name("hostile"), support::timer_function_json(Some(3)), trigger, &[]);
    (start(&app).await, app)
}

/// The text of each queue message the host wrote (messageFormat text: the handler's bytes), in order.
fn messages(host: &HostDriver) -> Vec<String> {
    host.received("changes")
        .iter()
        .map(|r| match r {
            Received::Message(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            other => panic!("expected queue messages, got {other:?}"),
        })
        .collect()
}

/// Every `Item` as inserted, by id.
fn inserted(items: Vec<String>) -> Vec<(i64, String)> {
    items.into_iter().map(|item| (0, item)).collect()
}

#[tokio::test]
async fn the_cursor_source_answers_every_value_as_a_canonical_session_writes_it_whatever_the_databases_defaults() {
    // GIVEN a database whose sessions default to hostile settings, and rows of every value filed
    let url = support::fixture().fresh_database("hostile_cursor").await;
    let db = embedded::connect(&url).await.expect("connect");
    db.batch_execute(HOSTILE).await.expect("schema");
    db.batch_execute(ROWS).await.expect("rows");
    let expected = canonical_items(&url).await;

    // WHEN the cursor source answers the host
    let (host, _app) = cursor_host(&url, None).await;
    let items = answered_until(&host, 3).await;

    // THEN each Item is byte for byte row_to_json of a canonical session
    assert_eq!(items, inserted(expected), "{}", host.output());
}

#[tokio::test]
async fn with_message_format_text_the_cursor_source_delivers_a_canonical_sessions_bytes_whatever_the_databases_defaults(
) {
    // GIVEN the same database and rows, and messageFormat text (the host passes each message's text through)
    let url = support::fixture().fresh_database("hostile_text").await;
    let db = embedded::connect(&url).await.expect("connect");
    db.batch_execute(HOSTILE).await.expect("schema");
    db.batch_execute(ROWS).await.expect("rows");
    let expected = canonical_items(&url).await;

    // WHEN the host writes the handler's answer
    let (host, _app) = cursor_host(&url, Some("text")).await;
    fire_until_delivered(&host, FUNCTION).await;

    // THEN the queue holds exactly the canonical bytes, one message per row
    let want: Vec<String> = expected.iter().map(|item| format!(r#"{{"Operation":0,"Item":{item}}}"#)).collect();
    assert_eq!(messages(&host), want, "{}", host.output());
}

/// A logical function (`extra`: the reader) over the hostile table: the rows are written after its first
/// firing, and every answered `Item` must be the canonical one.
async fn logical_case(prefix: &str, extra: Value) {
    // GIVEN a database with hostile defaults, and a logical function whose slot exists
    let db = Db::shared(prefix, HOSTILE).await;
    let mut extra = extra;
    extra["columns"] = json!(COLUMNS);
    let (app, _) = logical_app(&db, "public.vals", extra, &[]);
    let host = start(&app).await;
    first_firing(&host).await;

    // WHEN rows of every value filed are written, and the function answers the host
    db.db.batch_execute(ROWS).await.expect("rows");
    let items = answered_until(&host, 3).await;

    // THEN each Item is byte for byte row_to_json of a canonical session
    assert_eq!(items, inserted(canonical_items(&db.url).await), "{}", host.output());
}

#[tokio::test]
async fn the_logical_stream_answers_every_value_as_a_canonical_session_writes_it_whatever_the_databases_defaults() {
    logical_case("hostile_stream", json!({})).await;
}

#[tokio::test]
async fn the_logical_sql_reader_answers_every_value_as_a_canonical_session_writes_it_whatever_the_databases_defaults() {
    logical_case("hostile_sqlreader", json!({ "reader": "sql" })).await;
}

/// A table whose `big` text is stored out of line, beside nested bytea and a date range.
const DOCS: &str = r#"CREATE TYPE public.pair AS (n int, b bytea);
CREATE TABLE public.docs (id int8 PRIMARY KEY, n int, "Odd ""k"" é\" text, ba bytea[], bc public.pair,
    dr daterange, big text);
ALTER TABLE public.docs ALTER COLUMN big SET STORAGE EXTERNAL;
DO $$ BEGIN
    EXECUTE format('ALTER DATABASE %I SET DateStyle TO %L', current_database(), 'SQL, DMY');
    EXECUTE format('ALTER DATABASE %I SET bytea_output TO %L', current_database(), 'escape');
END $$;"#;

#[tokio::test]
async fn an_update_whose_toasted_value_is_gone_with_its_row_is_row_to_jsons_bytes_without_that_column() {
    // GIVEN the SQL reader over a table with a TOAST-ed text, in a database with hostile defaults
    let db = Db::shared("hostile_toast", DOCS).await;
    let (app, _) = logical_app(&db, "public.docs", json!({ "reader": "sql" }), &[]);
    let host = start(&app).await;
    first_firing(&host).await;
    let big = "(SELECT string_agg(md5(g::text || random()::text), '') FROM generate_series(1, 3200) g)";
    db.db
        .batch_execute(&format!(
            r#"INSERT INTO docs VALUES (3, 10, 'q"\é', ARRAY['\x0102'::bytea], ROW(1, '\x0c0d'),
                '[2024-01-02,2024-03-04)', {big})"#
        ))
        .await
        .expect("insert");

    // WHEN an update leaves the big text alone, and the row is deleted before the function reads the update
    db.db.execute("UPDATE docs SET n = 11 WHERE id = 3", &[]).await.expect("update");
    let canonical = embedded::connect(&db.url).await.expect("a canonical session");
    canonical.batch_execute(CANONICAL).await.expect("canonical settings");
    let without_big = r#"SELECT row_to_json(r)::text FROM (SELECT id, n, "Odd ""k"" é\", ba, bc, dr FROM docs) r"#;
    let expected: String = canonical.query_one(without_big, &[]).await.expect("the update's row").get(0);
    db.db.execute("DELETE FROM docs WHERE id = 3", &[]).await.expect("delete");
    let items = answered_until(&host, 3).await;

    // THEN the update's Item is row_to_json of the row without the unknowable column, byte for byte
    assert!(
        expected.contains(r#""ba":["\\x0102"],"bc":{"n":1,"b":"\\x0c0d"},"dr":"[2024-01-02,2024-03-04)""#),
        "{expected}"
    );
    assert_eq!(items.iter().map(|(op, _)| *op).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(items[1], (1, expected), "{}", host.output());
    assert_eq!(items[2], (2, r#"{"id":3}"#.to_string()));
}

#[tokio::test]
async fn with_message_format_text_a_soft_deleted_rows_item_is_row_to_jsons_bytes_of_its_key() {
    // GIVEN the cursor source over the demo orders table (soft delete), with messageFormat text
    let orders = Orders::new("hostile_softdelete").await;
    let app = orders_app(&orders, &unique_app_name("softdelete"), json!({ "messageFormat": "text" }), &[]);
    let host = start(&app).await;
    orders.insert([3]).await;
    fire_until_delivered(&host, FUNCTION).await;

    // WHEN the row is soft-deleted and the host writes the handler's answer
    orders.soft_delete(3).await;
    fire_until_delivered(&host, FUNCTION).await;

    // THEN the delete's message is its key exactly as row_to_json writes it, like every other Item
    let key: String = orders
        .db
        .query_one("SELECT row_to_json(k)::text FROM (SELECT id FROM orders WHERE id = 3) k", &[])
        .await
        .expect("the key's row_to_json")
        .get(0);
    let received = messages(&host);
    assert_eq!(received.len(), 2, "{received:?}");
    assert_eq!(received[1], format!(r#"{{"Operation":2,"Item":{key}}}"#));
}
