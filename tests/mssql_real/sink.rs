//! Tier 3 for the SQL Server upsert sink: the scenarios of `tests/e2e/sinks.rs` (which prove the PostgreSQL
//! sink) against a real SQL Server, run by `real_server_suite` after the source scenarios, with the same
//! gate and skip line; each prints its name when it passes. What only this tier proves: that SQL Server
//! accepts the reviewed batches and does what they say (MERGE on the key, OPENJSON reading binary from
//! base64 and `Qty "x"`-style names, defaults left to the server, IDENTITY_INSERT, XACT_ABORT rolling a
//! batch back whole, the fence and the exactly-once checkpoint row under real locks; a temporal table's
//! period columns left to the server; varchar in other code pages and keys under their collations; nested
//! JSON kept as text; names `FOR JSON` escapes, from change tracking into the sink; more statements than
//! SQL Server takes parameters), and which error numbers real failures carry.
//!
//! Every table, including the fence and checkpoint tables, is named per run and dropped at the end.

use super::{drain, tracked, Ctx};
use serde_json::{json, Value};
use sql_pseudo_trigger::change::{Change, Operation};
use sql_pseudo_trigger::config::Env;
use sql_pseudo_trigger::sink::{self, Applied, Resume, Sink, SinkBatch, SinkError};
use sql_pseudo_trigger::source::BatchRange;
use sql_pseudo_trigger::source::{Source, StartFrom};

/// Runs each scenario in turn, and prints the name of each one that passed.
macro_rules! run {
    ($ctx:expr, $($scenario:ident),+ $(,)?) => {
        $(
            $scenario($ctx).await;
            println!("real-server suite: sink scenario passed: {}", stringify!($scenario));
        )+
    };
}

/// Runs every sink scenario.
pub async fn scenarios(ctx: &mut Ctx) {
    run!(
        ctx,
        upserts_and_deletes_by_key_with_odd_names_binary_and_defaults,
        an_identity_key_absent_is_a_plain_insert_and_present_is_an_upsert,
        a_failing_last_statement_rolls_the_whole_batch_back_and_values_are_not_quoted,
        a_deposed_owners_late_write_is_refused_by_the_fence,
        exactly_once_applies_a_batch_once_and_records_what_sink_mode_resumes_from,
        a_temporal_table_is_written_without_its_period_columns_and_a_clr_column_is_named,
        varchar_columns_keep_characters_of_their_own_code_page_and_keys_match_under_their_collation,
        nested_json_is_stored_as_its_text_in_character_columns_and_refused_elsewhere,
        change_tracking_into_the_sink_copies_columns_named_with_slashes_and_backslashes,
        more_statements_than_parameters_sql_server_takes_are_written_in_one_request,
    );
}

/// A sink on `dbo.{table}`, with its fence (and checkpoint) table named for this run after `name`.
fn sink_on(ctx: &mut Ctx, table: &str, name: &str, extra: Value) -> std::sync::Arc<dyn Sink> {
    let fence = ctx.table(&format!("{name}_fence"));
    let checkpoint = ctx.table(&format!("{name}_checkpoint"));
    let mut options = json!({
        "type": "mssql", "tableName": format!("dbo.{table}"), "connectionStringSetting": "TargetDb",
        "fenceTable": format!("dbo.{fence}"), "checkpointTable": format!("dbo.{checkpoint}")
    });
    if let (Some(o), Some(extra)) = (options.as_object_mut(), extra.as_object()) {
        o.extend(extra.clone());
    }
    let env = Env::from_pairs([("TargetDb".to_string(), ctx.cs.clone())]);
    sink::from_options("F", Some(&options), &env, &Default::default()).unwrap_or_else(|e| panic!("a valid sink: {e}"))
}

fn upsert(item: Value) -> Change {
    Change::from_json(Operation::Update, item.to_string()).expect("json")
}

fn delete(item: Value) -> Change {
    Change::from_json(Operation::Delete, item.to_string()).expect("json")
}

async fn deliver(sink: &dyn Sink, batch_id: u64, fence: u64, changes: &[Change]) -> Result<(), SinkError> {
    let range = BatchRange::new(batch_id, Value::Null, Value::Null, changes.len() as u64);
    sink.deliver(&SinkBatch { app: "app", function: "F", fence, changes, range: &range }).await
}

/// The rows of a `... FOR JSON PATH, INCLUDE_NULL_VALUES` query (SQL Server splits the text across rows).
async fn json_rows(ctx: &mut Ctx, sql: &str) -> Value {
    let rows = ctx
        .admin
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .into_first_result()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let text: String = rows.iter().filter_map(|r| r.get::<&str, _>(0)).collect();
    if text.is_empty() {
        return json!([]);
    }
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{sql}: {e}: {text}"))
}

async fn upserts_and_deletes_by_key_with_odd_names_binary_and_defaults(ctx: &mut Ctx) {
    // GIVEN a table keyed on (Id, Line) with a reserved word, a quote and a unicode name, binary, a default
    let t = ctx.table("sink_rules");
    ctx.exec(&format!(
        "CREATE TABLE [dbo].[{t}] ([Id] bigint NOT NULL, [Line] int NOT NULL, [order] nvarchar(100) NULL, \
         [Qty \"x\"] decimal(12, 2) NULL, [Photo] varbinary(max) NULL, [Ünïcode Col] nvarchar(20) NOT NULL, \
         [note] nvarchar(20) NULL DEFAULT N'none', PRIMARY KEY ([Id], [Line]))"
    ))
    .await;
    let sink = sink_on(ctx, &t, "rules", json!({}));

    // WHEN a batch inserts three rows (one of them twice: the last wins), and the next updates one and deletes one
    let first = [
        upsert(json!({"Id": 1, "Line": 1, "order": "één", "Qty \"x\"": 1.5, "Photo": "AQID", "Ünïcode Col": "a"})),
        upsert(json!({"Id": 2, "Line": 1, "order": "two", "Ünïcode Col": "b"})),
        upsert(json!({"Id": 3, "Line": 1, "Ünïcode Col": "c", "note": null})),
        upsert(json!({"Id": 2, "Line": 1, "order": "two, last", "Ünïcode Col": "b"})),
    ];
    deliver(sink.as_ref(), 1, 1, &first).await.expect("first batch");
    let second =
        [upsert(json!({"Id": 2, "Line": 1, "order": "TWO", "Ünïcode Col": "B"})), delete(json!({"Id": 3, "Line": 1}))];
    deliver(sink.as_ref(), 2, 1, &second).await.expect("second batch");

    // THEN the table holds exactly what the changes say: binary decoded from base64, the default where a row
    // left a column out, an omitted column untouched by an update
    let got = json_rows(
        ctx,
        &format!(
            "SELECT [Id], [Line], [order], [Qty \"x\"], CONVERT(varchar(max), [Photo], 2) AS [photo], [Ünïcode Col], [note] \
             FROM [dbo].[{t}] ORDER BY [Id] FOR JSON PATH, INCLUDE_NULL_VALUES"
        ),
    )
    .await;
    assert_eq!(
        got,
        json!([
            {"Id": 1, "Line": 1, "order": "één", "Qty \"x\"": 1.5, "photo": "010203", "Ünïcode Col": "a", "note": "none"},
            {"Id": 2, "Line": 1, "order": "TWO", "Qty \"x\"": null, "photo": null, "Ünïcode Col": "B", "note": "none"}
        ])
    );

    // AND an extra property or a missing NOT NULL column is refused naming it, before anything is sent
    let e = deliver(sink.as_ref(), 3, 1, &[upsert(json!({"Id": 9, "Line": 1, "Ünïcode Col": "x", "colour": "red"}))])
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("property \"colour\" of change 0 is not a column"), "{e}");
    let e = deliver(sink.as_ref(), 3, 1, &[upsert(json!({"Id": 9, "Line": 1}))]).await.expect_err("refused");
    assert!(e.to_string().contains("lacks column \"Ünïcode Col\""), "{e}");
}

async fn an_identity_key_absent_is_a_plain_insert_and_present_is_an_upsert(ctx: &mut Ctx) {
    // GIVEN an identity key
    let t = ctx.table("sink_identity");
    ctx.exec(&format!(
        "CREATE TABLE [dbo].[{t}] ([id] bigint IDENTITY(1,1) PRIMARY KEY, [name] nvarchar(20) NOT NULL)"
    ))
    .await;
    let sink = sink_on(ctx, &t, "identity", json!({}));

    // WHEN rows without the key arrive twice, then a row naming key 10, then the same key again
    let keyless = [upsert(json!({"name": "a"})), upsert(json!({"name": "a"}))];
    deliver(sink.as_ref(), 1, 1, &keyless).await.expect("plain inserts");
    deliver(sink.as_ref(), 2, 1, &keyless).await.expect("plain inserts again");
    deliver(sink.as_ref(), 3, 1, &[upsert(json!({"id": 10, "name": "named"}))]).await.expect("IDENTITY_INSERT");
    deliver(sink.as_ref(), 4, 1, &[upsert(json!({"id": 10, "name": "renamed"}))]).await.expect("update");

    // THEN keyless rows got new keys, and the named key was inserted, then updated
    let got = json_rows(ctx, &format!("SELECT [id], [name] FROM [dbo].[{t}] ORDER BY [id] FOR JSON PATH")).await;
    assert_eq!(
        got,
        json!([
            {"id": 1, "name": "a"}, {"id": 2, "name": "a"}, {"id": 3, "name": "a"}, {"id": 4, "name": "a"},
            {"id": 10, "name": "renamed"}
        ])
    );
}

async fn a_failing_last_statement_rolls_the_whole_batch_back_and_values_are_not_quoted(ctx: &mut Ctx) {
    // GIVEN a row already there, a CHECK constraint, and two rows per statement
    let t = ctx.table("sink_partial");
    ctx.exec(&format!(
        "CREATE TABLE [dbo].[{t}] ([id] bigint PRIMARY KEY, [n] int NOT NULL, [s] nvarchar(5) NULL, CONSTRAINT [positive_{t}] CHECK ([n] >= 0))"
    ))
    .await;
    let sink = sink_on(ctx, &t, "partial", json!({"maxRowsPerStatement": 2}));
    deliver(sink.as_ref(), 1, 1, &[upsert(json!({"id": 1, "n": 1}))]).await.expect("seed");

    // WHEN a batch of five statements (a delete first) breaks the constraint in its last row
    let mut batch = vec![delete(json!({"id": 1}))];
    batch.extend((2..=9).map(|i| upsert(json!({"id": i, "n": i}))));
    batch.push(upsert(json!({"id": 10, "n": -1})));
    let e = deliver(sink.as_ref(), 2, 1, &batch).await.expect_err("refused");

    // THEN it is rejected naming the constraint (error 547), and nothing of it was applied
    assert!(matches!(e, SinkError::Rejected(_)) && e.to_string().contains("SQL Server error 547"), "{e}");
    assert!(e.to_string().contains(&format!("positive_{t}")), "{e}");
    let got = json_rows(ctx, &format!("SELECT [id] FROM [dbo].[{t}] ORDER BY [id] FOR JSON PATH")).await;
    assert_eq!(got, json!([{"id": 1}]));

    // AND a value too long for its column (read whole by OPENJSON, so the column's own check refuses it
    // rather than a conversion cutting it off), or not a number, is rejected without quoting the value
    for bad in [json!({"id": 20, "n": 1, "s": "secret-and-too-long"}), json!({"id": 21, "n": "secret"})] {
        let e = deliver(sink.as_ref(), 3, 1, &[upsert(bad)]).await.expect_err("refused");
        assert!(matches!(e, SinkError::Rejected(_)), "{e:?}");
        // Error 2628 quotes the value as cut to the column's length ('secre'), 245 quotes it whole.
        assert!(!e.to_string().contains("secre"), "errors never quote values: {e}");
    }

    // AND the valid part goes through whole
    batch.pop();
    deliver(sink.as_ref(), 4, 1, &batch).await.expect("valid batch");
    let got = json_rows(ctx, &format!("SELECT COUNT(*) AS [rows] FROM [dbo].[{t}] FOR JSON PATH")).await;
    assert_eq!(got, json!([{"rows": 8}]));
}

async fn a_deposed_owners_late_write_is_refused_by_the_fence(ctx: &mut Ctx) {
    // GIVEN owner A (token 1) wrote, then owner B (token 2) wrote newer values
    let t = ctx.table("sink_fence");
    ctx.exec(&format!("CREATE TABLE [dbo].[{t}] ([id] bigint PRIMARY KEY, [v] nvarchar(20) NOT NULL)")).await;
    let sink = sink_on(ctx, &t, "fence", json!({}));
    deliver(sink.as_ref(), 1, 1, &[upsert(json!({"id": 1, "v": "a1"}))]).await.expect("A writes");
    deliver(sink.as_ref(), 1, 2, &[upsert(json!({"id": 1, "v": "b1"}))]).await.expect("B writes");

    // WHEN A, deposed, writes the stale batch it still held
    let late = deliver(sink.as_ref(), 1, 1, &[upsert(json!({"id": 1, "v": "stale"}))]).await;

    // THEN it is refused with both tokens, and B's values stay; a later owner writes again
    assert!(matches!(late, Err(SinkError::Fenced { ours: 1, stored: 2 })), "{late:?}");
    let got = json_rows(ctx, &format!("SELECT [v] FROM [dbo].[{t}] FOR JSON PATH")).await;
    assert_eq!(got, json!([{"v": "b1"}]));
    deliver(sink.as_ref(), 2, 3, &[upsert(json!({"id": 1, "v": "c"}))]).await.expect("owner 3 writes");
}

async fn exactly_once_applies_a_batch_once_and_records_what_sink_mode_resumes_from(ctx: &mut Ctx) {
    // GIVEN an exactly-once sink on a table whose trigger logs every applied row
    let t = ctx.table("sink_once");
    let log = ctx.table("sink_once_log");
    ctx.exec(&format!(
        "CREATE TABLE [dbo].[{t}] ([id] bigint PRIMARY KEY, [v] int NOT NULL); CREATE TABLE [dbo].[{log}] ([id] bigint NOT NULL)"
    ))
    .await;
    ctx.exec(&format!(
        "CREATE TRIGGER [dbo].[{t}_applied] ON [dbo].[{t}] AFTER INSERT, UPDATE AS INSERT INTO [dbo].[{log}] ([id]) SELECT [id] FROM inserted"
    ))
    .await;
    let sink = sink_on(ctx, &t, "once", json!({"exactlyOnce": true}));
    let batch = [upsert(json!({"id": 1, "v": 1})), upsert(json!({"id": 2, "v": 2}))];
    let (from, to) = (Value::Null, json!(["100", "2"]));
    let once = |batch_id: u64, from: Value, to: Value, fence: u64| {
        let (sink, batch) = (sink.clone(), batch.clone());
        let range = BatchRange::new(batch_id, from, to, batch.len() as u64);
        async move {
            let b = SinkBatch { app: "app", function: "F", fence, changes: &batch, range: &range };
            sink.deliver(&b).await
        }
    };

    // WHEN batch 7 is delivered three times (the acknowledgement lost twice; the last time by a new owner)
    once(7, from.clone(), to.clone(), 1).await.expect("first");
    once(7, from.clone(), to.clone(), 1).await.expect("again");
    once(7, from.clone(), to.clone(), 2).await.expect("by the next owner");

    // THEN its rows were applied once, and what the sink recorded is the batch and the newest token
    let applied = format!("SELECT [id], COUNT(*) AS [n] FROM [dbo].[{log}] GROUP BY [id] ORDER BY [id] FOR JSON PATH");
    assert_eq!(json_rows(ctx, &applied).await, json!([{"id": 1, "n": 1}, {"id": 2, "n": 1}]));
    let recorded = sink.resume_position("app", "F").await.expect("what the sink recorded");
    assert_eq!(
        recorded,
        Some(Resume { fence: 2, applied: Some(Applied { batch_id: 7, from: from.clone(), to: to.clone() }) })
    );

    // AND the next batch, or the same id over another range (after a reset), is applied
    once(8, to.clone(), json!(["101", "1"]), 2).await.expect("next");
    once(7, from, json!(["99", "1"]), 2).await.expect("a reset's batch 7");
    assert_eq!(json_rows(ctx, &applied).await, json!([{"id": 1, "n": 3}, {"id": 2, "n": 3}]));
}

async fn a_temporal_table_is_written_without_its_period_columns_and_a_clr_column_is_named(ctx: &mut Ctx) {
    // GIVEN a system-versioned table: NOT NULL period columns the server fills in, and a geography column
    let t = ctx.table("sink_temporal");
    let history = ctx.table("sink_temporal_history");
    ctx.exec(&format!(
        "CREATE TABLE [dbo].[{t}] ([id] int NOT NULL PRIMARY KEY, [name] nvarchar(20) NOT NULL, [place] geography NULL, \
         [ValidFrom] datetime2 GENERATED ALWAYS AS ROW START NOT NULL, [ValidTo] datetime2 GENERATED ALWAYS AS ROW END NOT NULL, \
         PERIOD FOR SYSTEM_TIME ([ValidFrom], [ValidTo])) WITH (SYSTEM_VERSIONING = ON (HISTORY_TABLE = [dbo].[{history}]))"
    ))
    .await;
    let sink = sink_on(ctx, &t, "temporal", json!({}));

    // WHEN items that leave the period columns out insert a row, then update it
    deliver(sink.as_ref(), 1, 1, &[upsert(json!({"id": 1, "name": "a"}))]).await.expect("insert");
    deliver(sink.as_ref(), 2, 1, &[upsert(json!({"id": 1, "name": "b"}))]).await.expect("update");

    // THEN the table holds the update and its history the row it replaced (the server set both periods)
    let got = json_rows(ctx, &format!("SELECT [id], [name] FROM [dbo].[{t}] FOR JSON PATH")).await;
    assert_eq!(got, json!([{"id": 1, "name": "b"}]));
    let old = json_rows(ctx, &format!("SELECT [name] FROM [dbo].[{history}] FOR JSON PATH")).await;
    assert_eq!(old, json!([{"name": "a"}]));

    // AND an item carrying a period column, or the geography column, is refused naming it
    let e = deliver(sink.as_ref(), 3, 1, &[upsert(json!({"id": 2, "name": "c", "ValidFrom": "2026-01-01T00:00:00"}))])
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("which is computed or generated"), "{e}");
    let e = deliver(sink.as_ref(), 3, 1, &[upsert(json!({"id": 2, "name": "c", "place": "POINT(1 2)"}))])
        .await
        .expect_err("refused");
    assert!(e.to_string().contains(r#"column "place""#) && e.to_string().contains("(geography)"), "{e}");

    // A system-versioned table cannot be dropped: versioning goes off first (the suite then drops both)
    ctx.exec(&format!("ALTER TABLE [dbo].[{t}] SET (SYSTEM_VERSIONING = OFF)")).await;
}

async fn varchar_columns_keep_characters_of_their_own_code_page_and_keys_match_under_their_collation(ctx: &mut Ctx) {
    // GIVEN varchar columns in code pages other than the database's (Greek, Cyrillic), keyed on the Greek
    // one and on an nvarchar column in a case-sensitive collation
    let t = ctx.table("sink_collations");
    ctx.exec(&format!(
        "CREATE TABLE [dbo].[{t}] ([code] varchar(10) COLLATE Greek_CI_AS NOT NULL, \
         [region] nvarchar(4) COLLATE Latin1_General_100_CS_AS NOT NULL, [label] varchar(20) COLLATE Cyrillic_General_CI_AS NULL, \
         PRIMARY KEY ([code], [region]))"
    ))
    .await;
    let sink = sink_on(ctx, &t, "collations", json!({}));

    // WHEN rows are inserted, one updated by its key, one deleted by its key
    let first = [
        upsert(json!({"code": "αβ", "region": "EU", "label": "привет"})),
        upsert(json!({"code": "γ", "region": "eu", "label": "мир"})),
    ];
    deliver(sink.as_ref(), 1, 1, &first).await.expect("insert");
    let second =
        [upsert(json!({"code": "αβ", "region": "EU", "label": "пока"})), delete(json!({"code": "γ", "region": "eu"}))];
    deliver(sink.as_ref(), 2, 1, &second).await.expect("update and delete");

    // THEN the characters arrived whole (not '?'), and the keys matched the rows they name
    let got = json_rows(ctx, &format!("SELECT [code], [region], [label] FROM [dbo].[{t}] FOR JSON PATH")).await;
    assert_eq!(got, json!([{"code": "αβ", "region": "EU", "label": "пока"}]));
}

async fn nested_json_is_stored_as_its_text_in_character_columns_and_refused_elsewhere(ctx: &mut Ctx) {
    // GIVEN character columns (as a PostgreSQL json, jsonb or array column is copied into) and an int one
    let t = ctx.table("sink_nested");
    ctx.exec(&format!(
        "CREATE TABLE [dbo].[{t}] ([id] int PRIMARY KEY, [doc] nvarchar(max) NULL, [tags] varchar(100) NULL, [n] int NULL)"
    ))
    .await;
    let sink = sink_on(ctx, &t, "nested", json!({}));

    // WHEN an object and an array arrive for them, and plain strings for another row
    let batch = [
        upsert(json!({"id": 1, "doc": {"a": [1, 2], "b": "x"}, "tags": ["red", "blue"]})),
        upsert(json!({"id": 2, "doc": "plain", "tags": "t"})),
    ];
    deliver(sink.as_ref(), 1, 1, &batch).await.expect("written");

    // THEN the nested values are stored as their JSON text (not NULL), and the strings as they were
    let got = json_rows(ctx, &format!("SELECT [id], [doc], [tags] FROM [dbo].[{t}] ORDER BY [id] FOR JSON PATH")).await;
    assert_eq!(
        got,
        json!([{"id": 1, "doc": r#"{"a":[1,2],"b":"x"}"#, "tags": r#"["red","blue"]"#}, {"id": 2, "doc": "plain", "tags": "t"}])
    );

    // AND an object for the int column is refused before anything is sent (OPENJSON would read NULL)
    let e = deliver(sink.as_ref(), 2, 1, &[upsert(json!({"id": 3, "n": {"x": 1}}))]).await.expect_err("refused");
    assert!(e.to_string().contains(r#"which column "n""#), "{e}");
}

async fn change_tracking_into_the_sink_copies_columns_named_with_slashes_and_backslashes(ctx: &mut Ctx) {
    // GIVEN a tracked table with columns named with `/` and `\` (FOR JSON writes them `\/` and `\\`, in
    // names and values), and a copy of it as the sink's target
    let source_table =
        tracked(ctx, "slash_source", "[id] int PRIMARY KEY, [Name/Test] nvarchar(20) NULL, [Cost\\Test] int NULL")
            .await;
    let t = ctx.table("sink_slash");
    ctx.exec(&format!(
        "CREATE TABLE [dbo].[{t}] ([id] int PRIMARY KEY, [Name/Test] nvarchar(20) NULL, [Cost\\Test] int NULL)"
    ))
    .await;
    let source = ctx.ct(&format!("dbo.{source_table}"), json!({}));
    let start = source.start_position(StartFrom::Now).await.expect("start");
    let sink = sink_on(ctx, &t, "slash", json!({}));

    // WHEN rows are inserted, then one updated, and what change tracking reports is delivered to the sink
    ctx.exec(&format!(
        "INSERT INTO [dbo].[{source_table}] VALUES (1, N'a/b', 1), (2, N'c\\d', 2); UPDATE [dbo].[{source_table}] SET [Name/Test] = N'e/f' WHERE [id] = 2"
    ))
    .await;
    let (batches, _) = drain(&source, &start, 100).await;
    for (n, b) in batches.iter().enumerate() {
        deliver(sink.as_ref(), n as u64 + 1, 1, &b.changes).await.expect("delivered");
    }

    // THEN the copy holds every column's value (a path that missed the escaped name would have read NULL)
    let got =
        json_rows(ctx, &format!("SELECT * FROM [dbo].[{t}] ORDER BY [id] FOR JSON PATH, INCLUDE_NULL_VALUES")).await;
    assert_eq!(
        got,
        json!([{"id": 1, "Name/Test": "a/b", "Cost\\Test": 1}, {"id": 2, "Name/Test": "e/f", "Cost\\Test": 2}])
    );
}

async fn more_statements_than_parameters_sql_server_takes_are_written_in_one_request(ctx: &mut Ctx) {
    // GIVEN one row per statement and a batch of 2,500 rows and 100 deletes: 2,600 statements, which with a
    // parameter each would pass SQL Server's 2,100 (error 8003)
    let t = ctx.table("sink_bound");
    ctx.exec(&format!("CREATE TABLE [dbo].[{t}] ([id] int PRIMARY KEY, [v] nvarchar(10) NULL)")).await;
    ctx.exec(&format!(
        "INSERT INTO [dbo].[{t}] SELECT TOP (100) -ROW_NUMBER() OVER (ORDER BY (SELECT NULL)), N'old' FROM sys.all_objects"
    ))
    .await;
    let sink = sink_on(ctx, &t, "bound", json!({"maxRowsPerStatement": 1}));
    let mut batch: Vec<Change> = (1..=100).map(|i| delete(json!({"id": -i}))).collect();
    batch.extend((1..=2500).map(|i| upsert(json!({"id": i, "v": format!("v{i}")}))));

    // WHEN it is delivered
    deliver(sink.as_ref(), 1, 1, &batch).await.expect("written in one request");

    // THEN every statement read its own rows: the deletes applied, each row written once with its value
    let got = json_rows(
        ctx,
        &format!("SELECT COUNT(*) AS [rows], MIN([id]) AS [min], SUM(CASE WHEN [v] = CONCAT(N'v', [id]) THEN 1 ELSE 0 END) AS [right] FROM [dbo].[{t}] FOR JSON PATH"),
    )
    .await;
    assert_eq!(got, json!([{"rows": 2500, "min": 1, "right": 2500}]));
}
