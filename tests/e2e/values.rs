//! Exact values through the host: what a consumer receives of a large numeric and an offset timestamp, with the
//! official payload (the host re-reads it with Newtonsoft: a double, the host's zone, indented) and with
//! `messageFormat` `text` (the host passes each message's text through). docs/values.md has the whole table.

use crate::common::*;
use crate::support;
use serde_json::json;
use testbed::driver::Received;

/// A table with a numeric wider than a double and a timestamptz, watched by an xid8 cursor.
const EXACT_SCHEMA: &str = r#"
CREATE TABLE public.exact (
    id bigint PRIMARY KEY,
    amount numeric(30, 2) NOT NULL,
    at timestamptz NOT NULL,
    created_version xid8 NOT NULL DEFAULT pg_current_xact_id(),
    version xid8 NOT NULL DEFAULT pg_current_xact_id()
);
-- Every session of this database (the handler's) renders timestamptz at +02:00, all year round.
DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET timezone TO %L', current_database(), 'Etc/GMT-2'); END $$;
"#;

/// The change the handler answers for the row inserted below, as PostgreSQL's `row_to_json` built it.
const EXACT_CHANGE: &str =
    r#"{"Operation":0,"Item":{"id":1,"amount":12345678901234567.89,"at":"2024-07-02T03:04:05.12+02:00"}}"#;

/// Starts the handler on a function that sends `public.exact` to a queue and to a blob, with `message_format`.
async fn exact_values(message_format: Option<&str>) -> (testbed::driver::HostDriver, support::AppFolder) {
    let url = support::fixture().fresh_database("exact").await;
    let db = testbed::embedded::connect(&url).await.expect("connect");
    db.batch_execute(EXACT_SCHEMA).await.expect("schema");
    db.batch_execute(
        "INSERT INTO public.exact (id, amount, at) VALUES (1, 12345678901234567.89, '2024-07-02 01:04:05.12Z')",
    )
    .await
    .expect("insert");
    let mut function = support::timer_function_json(Some(3));
    function["bindings"].as_array_mut().expect("bindings").push(json!({
        "type": "blob", "direction": "out", "name": "archive", "path": "archive/{rand-guid}.json",
        "connection": "AzureWebJobsStorage"
    }));
    let mut trigger = json!({
        "source": "postgres-cursor", "tableName": "public.exact", "connectionStringSetting": "PostgresConnectionString",
        "cursorColumn": "version", "insertedColumn": "created_version", "startFrom": "earliest",
        "columns": ["id", "amount", "at"]
    });
    if let Some(format) = message_format {
        trigger["messageFormat"] = json!(format);
    }
    let app = app_on(&url, &unique_app_name("exact"), function, trigger, &[]);
    let host = start(&app).await;
    fire_until_delivered(&host, FUNCTION).await;
    (host, app)
}

fn blob_content(received: &[Received]) -> String {
    match received {
        [Received::Blob { path, content }] => {
            assert!(path.starts_with("archive/") && !path.contains('{'), "a path resolved per write: {path}");
            String::from_utf8(content.clone()).expect("UTF-8")
        }
        other => panic!("expected one blob, got {other:?}"),
    }
}

#[tokio::test]
async fn the_official_payload_reaches_consumers_with_doubles_and_the_hosts_time_zone() {
    // GIVEN a row with numeric 12345678901234567.89 and a timestamptz rendered at +02:00, sent as JSON values
    // WHEN the host writes the handler's answer
    let (host, _app) = exact_values(None).await;

    // THEN the queue message is Newtonsoft's re-serialization: indented, the numeric a double (17 digits,
    // ".0" added), the timestamp moved to the host's zone (UTC)
    assert_eq!(
        host.received("changes"),
        [Received::Message(
            b"{\n  \"Operation\": 0,\n  \"Item\": {\n    \"id\": 1,\n    \"amount\": 12345678901234568.0,\n    \"at\": \"2024-07-02T01:04:05.12+00:00\"\n  }\n}".to_vec()
        )]
    );
    // AND the blob holds the whole batch as one compact document, with the same changes
    assert_eq!(
        blob_content(&host.received("archive")),
        r#"[{"Operation":0,"Item":{"id":1,"amount":12345678901234568.0,"at":"2024-07-02T01:04:05.12+00:00"}}]"#
    );
}

#[tokio::test]
async fn message_format_text_delivers_every_value_exactly() {
    // GIVEN the same row, with messageFormat text
    // WHEN the host writes the handler's answer
    let (host, _app) = exact_values(Some("text")).await;

    // THEN the queue message is the change's JSON text exactly as the handler built it from PostgreSQL
    assert_eq!(host.received("changes"), [Received::Message(EXACT_CHANGE.as_bytes().to_vec())]);
    assert_eq!(host.delivered("changes")[0]["Item"]["at"], json!("2024-07-02T03:04:05.12+02:00"));
    // AND the blob is the batch's JSON text exactly
    assert_eq!(blob_content(&host.received("archive")), format!("[{EXACT_CHANGE}]"));
}
