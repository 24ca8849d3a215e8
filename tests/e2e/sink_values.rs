//! Every value exact through the handler's own sinks (issue 31, the sink side): the real `handler run --once`
//! reading real PostgreSQL with the cursor source and writing to standard output or to a PostgreSQL table.
//!
//! - stdout: a `json` column keeps its own whitespace in the item the source builds; every line must still be
//!   one JSON object, and the set of changes exact.
//! - PostgreSQL: a copy of a table holding every kind of value the source delivers (json with `\u0000` and
//!   its own whitespace, jsonb, numeric NaN/Infinity and 40 digits, BC dates, infinite timestamps, ranges,
//!   multiranges, arrays, domains, enums, composites, bytea, ...) must read back equal, value by value.
//! - A value the target column cannot hold is refused naming the column; its batch alone is quarantined
//!   after `Sql_Trigger_MaxAttempts`, and the other batches arrive.

use crate::common::*;
use crate::operations::handler_cli;
use crate::support::{self, AppFolder};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Types the tables below use.
const TYPES: &str = "
    CREATE TYPE mood AS ENUM ('sad', 'happy');
    CREATE TYPE pair AS (a integer, b text);
    CREATE DOMAIN positive AS integer CHECK (VALUE > 0);";

/// The columns a change carries, with their types: the source table has them plus its cursor columns, the
/// target copy has them alone.
const VALUE_COLUMNS: &[(&str, &str)] = &[
    ("id", "bigint PRIMARY KEY"),
    ("j", "json"),
    ("jb", "jsonb"),
    ("n", "numeric"),
    ("big", "numeric"),
    ("d", "date"),
    ("ts", "timestamp"),
    ("tstz", "timestamptz"),
    ("rng", "int4range"),
    ("mr", "int4multirange"),
    ("arr", "integer[]"),
    ("tarr", "text[]"),
    ("dom", "positive"),
    ("e", "mood"),
    ("c", "pair"),
    ("carr", "pair[]"),
    ("b", "bytea"),
    ("f", "double precision"),
    ("iv", "interval"),
    ("tz", "timetz"),
    ("u", "uuid"),
    ("txt", "text"),
    ("m", "money"),
    ("tm", "time"),
    ("re", "real"),
];

/// Rows holding the edge of each type, in `VALUE_COLUMNS` order after `id`. Row 1 is what a json column
/// can hold with its own whitespace, row 2 a json string with `\u0000`, row 3 all NULL.
const VALUE_ROWS: &str = r#"
    INSERT INTO public.vals (id, j, jb, n, big, d, ts, tstz, rng, mr, arr, tarr, dom, e, c, carr, b, f, iv, tz, u, txt, m, tm, re)
    VALUES
    (1, E'{"tab":\t"x",\n"nl" : [1, 2.50]}', '{"a": [1, 2.50], "s": "é\n"}', 'NaN',
     1234567890123456789012345678901234567890.0123456789, '0044-03-15 BC', 'infinity', '-infinity',
     '[1,5)', '{[1,3),[7,9)}', '{1,NULL,3}', '{{a,"b c"},{"d\"e",f}}', 5, 'happy', ROW(1, 'x y'),
     ARRAY[ROW(2, 'z')::pair, ROW(NULL, NULL)::pair], '\x00ff10', 'NaN', '1 day 02:03:04.5', '12:00+02',
     'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', E'tab\there "quoted" \\ back', 1234567.89, '23:59:59.999999', 1.1),
    (2, '{"nul": "\u0000 end", "n": 1.10}', '"just a string"', 'Infinity',
     -0.000000000000000000000000000000000000001, '2024-02-29', '2024-01-02 03:04:05.123456',
     '2024-07-02 03:04:05.12+02', 'empty', '{}', '{}', '{}', 1, 'sad', ROW(NULL, NULL), '{}', '\x', '-Infinity',
     '-3 years 1 mon', '00:00:00-11:30', '00000000-0000-0000-0000-000000000000', '', -0.01, '00:00', 'Infinity'),
    (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
     NULL, NULL, NULL, NULL, NULL, NULL, NULL);"#;

/// `name type, ...` of `columns`, for a CREATE TABLE.
fn column_list(columns: &[(&str, &str)]) -> String {
    columns.iter().map(|(name, ty)| format!("{name} {ty}")).collect::<Vec<_>>().join(", ")
}

/// A fresh database with `source` watched by an xid8 cursor (columns `columns` plus the cursor's), and
/// `extra` DDL.
async fn database(
    prefix: &str,
    source: &str,
    columns: &[(&str, &str)],
    extra: &str,
) -> (String, tokio_postgres::Client) {
    let url = support::fixture().fresh_database(prefix).await;
    let db = testbed::embedded::connect(&url).await.expect("connect to the test database");
    let ddl = format!(
        "{TYPES}
        CREATE TABLE public.{source} ({},
            created_version xid8 NOT NULL DEFAULT pg_current_xact_id(),
            version xid8 NOT NULL DEFAULT pg_current_xact_id());
        {extra}",
        column_list(columns)
    );
    db.batch_execute(&ddl).await.expect("create the tables");
    (url, db)
}

/// An app for `handler run` whose one function reads `public.{source}` (the `columns` of a change) with
/// `extra` sqltrigger.json keys, state in files.
fn app(url: &str, source: &str, columns: &[(&str, &str)], extra: Value, settings: &[(&str, &str)]) -> AppFolder {
    let names: Vec<&str> = columns.iter().map(|(name, _)| *name).collect();
    let mut trigger = json!({
        "source": "postgres-cursor", "tableName": format!("public.{source}"),
        "connectionStringSetting": "PostgresConnectionString", "cursorColumn": "version",
        "insertedColumn": "created_version", "startFrom": "earliest", "columns": names
    });
    if let (Some(t), Some(extra)) = (trigger.as_object_mut(), extra.as_object()) {
        t.extend(extra.clone());
    }
    let function = json!({ "bindings": [
        { "type": "timerTrigger", "direction": "in", "name": "timer", "schedule": "*/5 * * * * *" }
    ]});
    let app_name = unique_app_name(source);
    let mut all = vec![
        ("PostgresConnectionString", url),
        ("TargetDb", url),
        ("Sql_Trigger_StateStore", "file"),
        ("Sql_Trigger_AppName", app_name.as_str()),
    ];
    all.extend_from_slice(settings);
    support::write_app(FUNCTION, function, trigger, &all)
}

/// The sqltrigger.json keys that send changes to the PostgreSQL table `public.{table}` in sink mode.
fn postgres_sink(table: &str) -> Value {
    json!({ "deliveryMode": "sink", "sink": {
        "type": "postgres", "tableName": format!("public.{table}"), "connectionStringSetting": "TargetDb"
    }})
}

/// `handler run --once`, again and again until `done` holds (the xid8 guard may hold fresh rows back for a
/// moment), for at most 30 s; returns every run's stdout and stderr, concatenated.
async fn run_until<F, Fut>(app: &AppFolder, mut done: F) -> (String, String)
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut stdout, mut stderr) = (String::new(), String::new());
    loop {
        let output = handler_cli(app.root(), &["run", "--once"].map(String::from)).await;
        stdout.push_str(&String::from_utf8_lossy(&output.stdout));
        stderr.push_str(&String::from_utf8_lossy(&output.stderr));
        assert!(output.status.success(), "handler run --once failed:\n{stderr}");
        if done(stdout.clone()).await {
            return (stdout, stderr);
        }
        assert!(Instant::now() < deadline, "not done within 30 s\nstdout:\n{stdout}\nstderr:\n{stderr}");
    }
}

/// Each row of `query` as its text (`row::text`), in the query's order: equal texts read in one session are
/// equal values.
async fn row_texts(db: &tokio_postgres::Client, query: &str) -> Vec<String> {
    let sql = format!("SELECT r::text FROM ({query}) r");
    db.query(&sql, &[]).await.unwrap_or_else(|e| panic!("{sql}: {e}")).iter().map(|r| r.get(0)).collect()
}

#[tokio::test]
async fn the_stdout_sink_writes_one_compact_json_object_per_line_whatever_a_json_column_holds() {
    // GIVEN json values with tabs, newlines and carriage returns between their tokens (and escapes inside
    // their strings), read by `handler run` with its default sink, stdout
    let columns = [("id", "bigint PRIMARY KEY"), ("doc", "json")];
    let (url, db) = database("sink_stdout_lines", "docs", &columns, "").await;
    let docs = [
        (1, "{\"tab\":\t\"x\",\n\"nl\":1}"),
        (2, "[1,\r\n 2.50 ,\n\t{\"a\" :\n\"b\\nc\\t\"}]"),
        (3, "\n  \"a string\"  \n"),
        (4, "{\"nul\": \"\\u0000\", \"n\": 12345678901234567890.000000000000000000001}"),
    ];
    for (id, doc) in docs {
        db.execute("INSERT INTO public.docs (id, doc) VALUES ($1, $2::text::json)", &[&i64::from(id), &doc])
            .await
            .expect("insert a doc");
    }
    let app = app(&url, "docs", &columns, json!({}), &[]);

    // WHEN `handler run --once` drains it
    let lines_of = |stdout: &str| stdout.lines().map(str::to_string).collect::<Vec<_>>();
    let (stdout, _) = run_until(&app, |stdout| {
        let n = lines_of(&stdout).len();
        async move { n >= docs.len() }
    })
    .await;

    // THEN every line is one JSON object of the documented shape, and the changes are exactly the rows, each
    // document equal to what PostgreSQL holds (numbers compared by their exact text)
    let mut changes = BTreeSet::new();
    for line in lines_of(&stdout) {
        let change: Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not one JSON object ({e}): {line:?}"));
        let keys: BTreeSet<&str> = change.as_object().expect("an object").keys().map(String::as_str).collect();
        assert_eq!(keys, BTreeSet::from(["function", "batch_id", "Operation", "Item"]), "{line}");
        assert_eq!(change["function"], FUNCTION);
        changes.insert((
            change["Operation"].as_i64(),
            change["Item"]["id"].as_i64(),
            change["Item"]["doc"].to_string(),
        ));
    }
    let expected: BTreeSet<(Option<i64>, Option<i64>, String)> = docs
        .iter()
        .map(|(id, doc)| {
            let value: Value = serde_json::from_str(doc).expect("a JSON document");
            (Some(0), Some(i64::from(*id)), value.to_string())
        })
        .collect();
    assert_eq!(changes, expected, "{stdout}");
    // AND the numbers kept their digits (serde_json would have rounded them, so compare the text)
    assert!(stdout.contains(r#""n":12345678901234567890.000000000000000000001}"#), "{stdout}");
    assert!(stdout.contains(r#""nul":"\u0000""#), "{stdout}");
}

#[tokio::test]
async fn the_postgres_sink_writes_every_value_the_source_delivers_and_it_reads_back_equal() {
    // GIVEN a table with a column of every kind of value, its copy with the same types, and the PostgreSQL
    // sink writing one into the other
    let copy = format!("CREATE TABLE public.vals_copy ({});", column_list(VALUE_COLUMNS));
    let (url, db) = database("sink_every_value", "vals", VALUE_COLUMNS, &copy).await;
    db.batch_execute(VALUE_ROWS).await.expect("insert the values");
    let app = app(&url, "vals", VALUE_COLUMNS, postgres_sink("vals_copy"), &[]);
    let names: Vec<&str> = VALUE_COLUMNS.iter().map(|(name, _)| *name).collect();
    let select = |table: &str| format!("SELECT {} FROM public.{table} ORDER BY id", names.join(", "));

    // WHEN `handler run --once` drains it
    let (_, stderr) =
        run_until(&app, |_| async { row_texts(&db, "SELECT id FROM public.vals_copy").await.len() == 3 }).await;

    // THEN the copy holds every row, and every value equals the source's
    let (source, copied) = (row_texts(&db, &select("vals")).await, row_texts(&db, &select("vals_copy")).await);
    assert_eq!(copied, source, "{stderr}");
    // AND the json columns kept their text as it was, whitespace and `\u0000` included
    let json: Vec<Option<String>> = db
        .query("SELECT j::text FROM public.vals_copy ORDER BY id", &[])
        .await
        .expect("read j")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        json,
        [
            Some("{\"tab\":\t\"x\",\n\"nl\" : [1, 2.50]}".to_string()),
            Some(r#"{"nul": "\u0000 end", "n": 1.10}"#.to_string()),
            None
        ]
    );
    assert!(!stderr.contains("quarantined"), "{stderr}");
}

#[tokio::test]
async fn a_value_the_target_column_cannot_hold_is_refused_naming_the_column_and_only_its_batch_is_quarantined() {
    // GIVEN rows 1-5 in batches of one, copied into a table whose jsonb column cannot hold row 2's `\u0000` and
    // whose varchar(3) cannot hold row 4's label; MaxAttempts 2
    let columns = [("id", "bigint PRIMARY KEY"), ("body", "json"), ("label", "text")];
    let copy = "CREATE TABLE public.notes_copy (id bigint PRIMARY KEY, body jsonb, label varchar(3));";
    let (url, db) = database("sink_refused_value", "notes", &columns, copy).await;
    for (id, body, label) in [
        (1, r#"{"ok": 1}"#, "a"),
        (2, r#"{"x": "\u0000"}"#, "b"),
        (3, r#"[3, "three"]"#, "c"),
        (4, r#"{"ok": 4}"#, "too long"),
        (5, r#""five""#, "e"),
    ] {
        db.execute(
            "INSERT INTO public.notes (id, body, label) VALUES ($1, $2::text::json, $3)",
            &[&(id as i64), &body, &label],
        )
        .await
        .expect("insert a note");
    }
    let mut extra = postgres_sink("notes_copy");
    extra["maxBatchSize"] = json!(1);
    // One connection for the source and the sink together (the smallest cap there is): finding the refused
    // column must not take a second connection while the failed write holds the first.
    let settings = [
        ("Sql_Trigger_MaxAttempts", "2"),
        ("Sql_Trigger_PoisonAfterMs", "0"),
        ("Sql_Trigger_MaxConnectionsPerDatabase", "1"),
    ];
    let app = app(&url, "notes", &columns, extra, &settings);

    // WHEN `handler run --once` drains it (until rows 1, 3 and 5 arrived and nothing is left to read)
    const COPIED: &str = "SELECT id, body, label FROM public.notes_copy ORDER BY id";
    let (_, stderr) =
        run_until(&app, |_| async { row_texts(&db, COPIED).await.len() == 3 && quarantined(&app).await.len() == 2 })
            .await;

    // THEN exactly the rows that fit arrived, equal to the source's
    let expected =
        row_texts(&db, "SELECT id, body::jsonb, label FROM public.notes WHERE id IN (1, 3, 5) ORDER BY id").await;
    assert_eq!(row_texts(&db, COPIED).await, expected, "{stderr}");
    // AND each refusal names the column, its type and the kind of value, never the value
    assert!(
        stderr.contains(r#"property "body" of change 0 holds a JSON string with the character U+0000 (\u0000), which column "body" of public.notes_copy (jsonb) cannot store"#),
        "{stderr}"
    );
    assert!(
        stderr.contains(r#"PostgreSQL refused a value for column "label" of public.notes_copy (character varying(3)) (SQLSTATE 22001): the batch holds a JSON string for it"#),
        "{stderr}"
    );
    assert!(!stderr.contains("too long"), "values are never logged: {stderr}");
    // AND only the batches holding rows 2 and 4 are in quarantine, each after MaxAttempts refusals
    let held = quarantined(&app).await;
    let ids: Vec<Vec<i64>> = held.iter().map(|doc| ids_of(doc["changes"].as_array().expect("changes"))).collect();
    assert_eq!(ids, [vec![2], vec![4]]);
    assert!(held.iter().all(|doc| doc["failures"] == 2), "{held:?}");
    // AND each quarantine document's reason carries the last refusal, naming the column it could not hold
    let columns = [r#"column "body" of public.notes_copy (jsonb)"#, r#"column "label" of public.notes_copy"#];
    for (doc, column) in held.iter().zip(columns) {
        let reason = doc["reason"].as_str().expect("a reason");
        let head = format!("batch {} failed 2 time(s) (Sql_Trigger_MaxAttempts); last error: ", doc["batch_id"]);
        assert!(reason.starts_with(&head) && reason.contains(column), "{column} in {reason}");
    }
}

/// The quarantine documents of [`FUNCTION`], in batch order (`handler state quarantine list` and `show`).
async fn quarantined(app: &AppFolder) -> Vec<Value> {
    let cli = |args: Vec<String>| async move {
        let output = handler_cli(app.root(), &args).await;
        assert!(output.status.success(), "handler {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice::<Value>(&output.stdout).expect("JSON on stdout")
    };
    let args = |rest: &[&str]| ["state", "quarantine"].iter().chain(rest).map(|a| a.to_string()).collect::<Vec<_>>();
    let listed = cli(args(&["list", FUNCTION])).await;
    let mut held = Vec::new();
    for doc in listed["documents"].as_array().cloned().unwrap_or_default() {
        let key = doc.as_str().expect("a document key");
        let batch = key.trim_end_matches(".json").rsplit('/').next().expect("a batch id").trim_start_matches('0');
        held.push(cli(args(&["show", FUNCTION, batch])).await);
    }
    held
}
