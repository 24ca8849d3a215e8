//! Backfills of both SQL Server sources through the strict tap (docs/operations.md, "Backfill"): a backfill run
//! by the engine for each source, `startFrom: snapshot`, beside live changes; and each source's chunk and
//! estimate statements with a composite key, a filter and a partition, with the values they bind.
//!
//! The mock has no engine: the rows it answers are the rows SQL Server would, given the reviewed statement
//! (`tests/golden/mssql/*backfill*`), which is what reaches the server. What these tests prove is that the
//! statement sent binds the bound the rule needs (the checkpoint's version or rowversion at the start, never a
//! later one), the keys and the filter's values, and that the engine delivers what comes back, in key order,
//! marked, beside the live changes and never in place of a newer one. That the server applies the bound is
//! tier 3 (`tests/mssql_real.rs`).

use super::*;
use sql_pseudo_trigger::engine::document::BackfillState;
use sql_pseudo_trigger::ops::Action;
use sql_pseudo_trigger::sink::{Sink, SinkBatch, SinkError};
use sql_pseudo_trigger::source::Filter;
use std::collections::BTreeMap;
use testbed::chunks::ChunkRows;

/// What a consumer received: each batch's backfill id (none: live) and its rows as encoded.
#[derive(Debug, Default)]
struct Consumer {
    batches: Mutex<Vec<(Option<String>, String)>>,
    /// Refuse the next chunk (a transient failure: the engine delivers the same chunk again).
    fail_next_chunk: Mutex<bool>,
}

#[async_trait::async_trait]
impl Sink for Consumer {
    async fn deliver(&self, batch: &SinkBatch<'_>) -> Result<(), SinkError> {
        if batch.range.backfill.is_some() && std::mem::take(&mut *self.fail_next_chunk.lock().expect("flag")) {
            return Err(SinkError::Transient("the consumer is briefly unavailable".into()));
        }
        let rows = encode_batch(batch.changes).get().to_string();
        self.batches.lock().expect("batches").push((batch.range.backfill.clone(), rows));
        Ok(())
    }

    fn describe(&self) -> String {
        "the wire test's consumer".into()
    }
}

impl Consumer {
    fn batches(&self) -> Vec<(Option<String>, String)> {
        self.batches.lock().expect("batches").clone()
    }

    /// The consumer's view: every delivered row applied in order (an upsert by `ID`).
    fn view(&self) -> BTreeMap<i64, Value> {
        let mut view = BTreeMap::new();
        for (_, rows) in self.batches() {
            for change in serde_json::from_str::<Vec<Value>>(&rows).expect("a batch") {
                let item = change["Item"].clone();
                view.insert(item["ID"].as_i64().expect("an ID"), item);
            }
        }
        view
    }
}

/// An app folder whose one function is stated by `sqltrigger`, with a batch size of 2, loaded as the handler
/// loads it (the tests hand its trigger their consumer as its sink: each tick delivers and acknowledges a batch).
fn function(mock: &Mock, name: &str, sqltrigger: Value) -> sql_pseudo_trigger::config::FunctionConfig {
    let root = std::env::temp_dir().join(format!("mssql-wire-backfill-{name}-{}-{}", std::process::id(), mock.port));
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).expect("app folder");
    std::fs::write(root.join("host.json"), r#"{"version":"2.0"}"#).expect("host.json");
    std::fs::write(
        dir.join("function.json"),
        r#"{"bindings":[{"type":"timerTrigger","direction":"in","name":"timer","schedule":"*/5 * * * * *"},{"type":"queue","direction":"out","name":"changes","queueName":"orders","connection":"AzureWebJobsStorage"}],"retry":{"strategy":"fixedDelay","maxRetryCount":3,"delayInterval":"00:00:05"}}"#,
    )
    .expect("function.json");
    std::fs::write(dir.join("sqltrigger.json"), sqltrigger.to_string()).expect("sqltrigger.json");
    let env = Env::from_pairs([
        ("SqlConnectionString".to_string(), mock.connection_string("ConnectRetryCount=1")),
        ("Sql_Trigger_MaxBatchSize".to_string(), "2".to_string()),
    ]);
    let config = AppConfig::load_from(&root, env).expect("the app config loads");
    let _ = std::fs::remove_dir_all(&root);
    config.functions[0].clone()
}

/// A chunk's answer: `(item json, key texts)` rows, `ITEM, K1..Kn`.
fn chunk(rows: &[(&str, &[&str])], keys: usize) -> QueryResponse {
    let mut cols = vec![Col::new("ITEM", T::NVarCharMax)];
    cols.extend((1..=keys).map(|i| Col::new(format!("K{i}"), T::NVarCharMax)));
    let rows = rows
        .iter()
        .map(|(item, key)| {
            let mut values = vec![nvarchar_max(item)];
            values.extend(key.iter().map(|k| nvarchar_max(k)));
            Row::new(values)
        })
        .collect();
    QueryResponse::new(cols, rows)
}

/// One timer invocation, by the host's first attempt: what kind of batch it delivered, or why it failed.
async fn invoke(trigger: &Trigger) -> Result<OutcomeKind, String> {
    let attempt = Attempt::fresh(Some(RetryContext::first(3)));
    trigger.tick(&attempt).await.map(|out| out.kind).map_err(|e| e.to_string())
}

/// The consumer's view a test expects: `(ID, Item JSON)`.
fn table_of(rows: &[(i64, &str)]) -> BTreeMap<i64, Value> {
    rows.iter().map(|(k, v)| (*k, serde_json::from_str(v).expect("item json"))).collect()
}

fn estimate(n: i64) -> QueryResponse {
    QueryResponse::new(vec![Col::new("ESTIMATE", T::BigInt)], vec![Row::new(vec![V::BigInt(n)])])
}

/// A row as the consumer receives it: `"Operation"`, `"Item"`, and for a backfilled row its mark.
fn row(op: i32, item: &str, backfill: Option<&str>) -> String {
    match backfill {
        Some(id) => format!(r#"{{"Operation":{op},"Item":{item},"Metadata":{{"Backfill":{{"Id":"{id}"}}}}}}"#),
        None => format!(r#"{{"Operation":{op},"Item":{item}}}"#),
    }
}

fn batch(rows: &[String]) -> String {
    format!("[{}]", rows.join(","))
}

fn ints(values: &[Wire]) -> Vec<Option<i64>> {
    values.iter().map(|v| if let Wire::Int(n) = v { Some(*n) } else { None }).collect()
}

const ONE: &str = r#"{"ID":1,"NAME":"one"}"#;
const TWO_OLD: &str = r#"{"ID":2,"NAME":"two"}"#;
const TWO_NEW: &str = r#"{"ID":2,"NAME":"two, changed after the start"}"#;
const THREE: &str = r#"{"ID":3,"NAME":"three"}"#;
const FOUR: &str = r#"{"ID":4,"NAME":"four"}"#;
const FIVE: &str = r#"{"ID":5,"NAME":"five, inserted during the backfill"}"#;

#[tokio::test]
async fn a_change_tracking_snapshot_start_backfills_in_key_order_beside_live_changes_and_skips_a_row_changed_since() {
    // GIVEN a new function with startFrom: snapshot on a table of rows 1 to 4 at version 42; row 2 is updated
    // at version 45, after the start, and row 5 inserted at 51 while the backfill runs
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register("ct_versions", versions(10, 42)).await;
    mock.register("ct_backfill_estimate", estimate(4)).await;
    mock.register("ct_fetch_start", changes(50, 10, &[(45, 1, TWO_NEW, "2")])).await;
    let function = function(
        &mock,
        "OrdersChanged",
        json!({"source": "mssql-change-tracking", "tableName": "[DBO].[ORDERS]",
            "connectionStringSetting": "SqlConnectionString", "startFrom": "snapshot"}),
    );
    assert_eq!(function.source.start_from, StartFrom::Snapshot);
    let source = Arc::new(new_change_tracking(function.source.clone()).expect("source"));
    let consumer = Arc::new(Consumer::default());
    let trigger = Trigger::new(function, "wire-app", source, Arc::new(MemoryStore::new()), "owner-1".into())
        .with_sink(consumer.clone());
    let tick = || invoke(&trigger);

    // WHEN it ticks: the live change first; then, with no live change waiting, the first chunk (the server
    // leaves row 2 out: its version, 45, passed the bound); the insert made meanwhile; the second chunk, whose
    // delivery fails once and is delivered again from the same key range; and a last, empty chunk
    assert_eq!(tick().await.expect("tick 1"), OutcomeKind::Delivered);
    mock.register("ct_fetch_start", changes(50, 10, &[])).await;
    mock.register("ct_backfill_first", chunk(&[(ONE, &["1"]), (THREE, &["3"])], 1)).await;
    assert_eq!(tick().await.expect("tick 2"), OutcomeKind::Delivered);
    mock.register("ct_fetch_start", changes(52, 10, &[(51, 0, FIVE, "5")])).await;
    assert_eq!(tick().await.expect("tick 3"), OutcomeKind::Delivered);
    mock.register("ct_fetch_start", changes(52, 10, &[])).await;
    mock.register("ct_backfill_after", chunk(&[(FOUR, &["4"])], 1)).await;
    mock.register("ct_backfill_range", chunk(&[(FOUR, &["4"])], 1)).await;
    *consumer.fail_next_chunk.lock().expect("flag") = true;
    assert!(tick().await.is_err(), "tick 4: the consumer refused the chunk");
    assert_eq!(tick().await.expect("tick 5"), OutcomeKind::Redelivered);
    mock.register("ct_backfill_after", chunk(&[], 1)).await;
    assert_eq!(tick().await.expect("tick 6"), OutcomeKind::Empty);

    // THEN the consumer got the live changes unmarked and the rows that exist marked, in key order, each once
    let (doc, _) = trigger.load().await.expect("load").expect("state written");
    let b = doc.backfill().cloned().expect("a backfill");
    let id = b.id.as_str();
    assert_eq!(
        consumer.batches(),
        vec![
            (None, batch(&[row(1, TWO_NEW, None)])),
            (Some(id.to_string()), batch(&[row(0, ONE, Some(id)), row(0, THREE, Some(id))])),
            (None, batch(&[row(0, FIVE, None)])),
            (Some(id.to_string()), batch(&[row(0, FOUR, Some(id))])),
        ]
    );
    assert_eq!(consumer.view(), table_of(&[(1, ONE), (2, TWO_NEW), (3, THREE), (4, FOUR), (5, FIVE)]));
    assert!(!consumer.batches().iter().any(|(_, rows)| rows.contains(TWO_OLD)), "no old value of row 2");

    // AND every chunk was bounded by the version the live path started at (42), after the last key delivered,
    // and the redelivery re-read exactly the failed chunk's range
    assert_eq!(b.bound, json!(42));
    assert_eq!((b.estimate, b.rows, b.chunks, b.redone, b.after.clone()), (Some(4), 3, 2, 1, json!(["4"])));
    assert_eq!(b.state, BackfillState::Done);
    assert_eq!(mock.values("ct_backfill_first"), vec![Wire::Int(2), Wire::Int(42)]);
    let afters: Vec<Vec<Wire>> = mock.sent("ct_backfill_after").into_iter().map(|s| s.values).collect();
    assert_eq!(
        afters,
        vec![
            vec![Wire::Int(2), Wire::Int(42), Wire::Text("3".into())],
            vec![Wire::Int(2), Wire::Int(42), Wire::Text("4".into())]
        ]
    );
    assert_eq!(
        mock.values("ct_backfill_range"),
        vec![Wire::Int(2), Wire::Int(42), Wire::Text("3".into()), Wire::Text("4".into())]
    );
    assert_eq!(ints(&mock.values("ct_fetch_start"))[2], Some(52), "the live path went on after the insert");
    assert_eq!(checkpoint(&trigger).await, json!({"phase": "changes", "base": 52}));
}

const ITEM_2_NEW: &str = r#"{"ID":2,"TITLE":"b, changed after the start","IS_DELETED":false}"#;
const ITEM_3_NEW: &str = r#"{"ID":3,"TITLE":"c, changed after its chunk","IS_DELETED":false}"#;
const ITEM_4: &str = r#"{"ID":4,"TITLE":"d","IS_DELETED":false}"#;

fn newest(rv: i64) -> QueryResponse {
    QueryResponse::new(vec![Col::new("RV", T::BigInt)], vec![Row::new(vec![V::BigInt(rv)])])
}

#[tokio::test]
async fn a_rowversion_snapshot_start_backfills_below_the_start_and_a_row_changed_after_its_chunk_arrives_newer() {
    // GIVEN a new function with startFrom: snapshot on the items at MIN_ACTIVE_ROWVERSION() - 1 = 1999; row 2 is
    // updated (rowversion 2001) before the first chunk, row 3 (2003) after the chunk that holds it
    let mut mock = Mock::start().await;
    mock.register("catalog_database", database(None)).await;
    mock.register("catalog_table", table(None, false)).await;
    mock.register("catalog_columns", columns(ITEMS)).await;
    mock.register("rv_newest", newest(1999)).await;
    mock.register("rv_backfill_estimate", estimate(4)).await;
    mock.register("rv_fetch_after_version", rv_rows(&[(2001, 1, ITEM_2_NEW, &["2"])])).await;
    let function = function(
        &mock,
        "ItemsChanged",
        json!({"source": "mssql-rowversion", "tableName": "[DBO].[ITEMS]", "connectionStringSetting": "SqlConnectionString",
            "startFrom": "snapshot", "softDeleteColumn": "IS_DELETED", "columns": ["ID", "TITLE", "IS_DELETED"]}),
    );
    let source = Arc::new(new_rowversion(function.source.clone()).expect("source"));
    let consumer = Arc::new(Consumer::default());
    let trigger = Trigger::new(function, "wire-app", source, Arc::new(MemoryStore::new()), "owner-1".into())
        .with_sink(consumer.clone());
    let tick = || invoke(&trigger);

    // WHEN it ticks: the live change; the first chunk (the server leaves row 2 out: 2001 passed the bound);
    // the change of row 3; the second chunk; a last, empty chunk
    assert_eq!(tick().await.expect("tick 1"), OutcomeKind::Delivered);
    mock.register("rv_fetch_after_key", rv_rows(&[])).await;
    mock.register("rv_backfill_first", chunk(&[(ITEM_1, &["1"]), (ITEM_3, &["3"])], 1)).await;
    assert_eq!(tick().await.expect("tick 2"), OutcomeKind::Delivered);
    mock.register("rv_fetch_after_key", rv_rows(&[(2003, 1, ITEM_3_NEW, &["3"])])).await;
    assert_eq!(tick().await.expect("tick 3"), OutcomeKind::Delivered);
    mock.register("rv_fetch_after_key", rv_rows(&[])).await;
    mock.register("rv_backfill_after", chunk(&[(ITEM_4, &["4"])], 1)).await;
    assert_eq!(tick().await.expect("tick 4"), OutcomeKind::Delivered);
    mock.register("rv_backfill_after", chunk(&[], 1)).await;
    assert_eq!(tick().await.expect("tick 5"), OutcomeKind::Empty);

    // THEN the rows that exist came marked, in key order, and row 3's backfilled value came before its newer one
    let (doc, _) = trigger.load().await.expect("load").expect("state written");
    let b = doc.backfill().cloned().expect("a backfill");
    let id = b.id.as_str();
    assert_eq!(
        consumer.batches(),
        vec![
            (None, batch(&[row(1, ITEM_2_NEW, None)])),
            (Some(id.to_string()), batch(&[row(0, ITEM_1, Some(id)), row(0, ITEM_3, Some(id))])),
            (None, batch(&[row(1, ITEM_3_NEW, None)])),
            (Some(id.to_string()), batch(&[row(0, ITEM_4, Some(id))])),
        ]
    );
    let table = table_of(&[(1, ITEM_1), (2, ITEM_2_NEW), (3, ITEM_3_NEW), (4, ITEM_4)]);
    assert_eq!(consumer.view(), table, "the consumer's view is the table's");

    // AND every chunk was bounded by the rowversion the live path started after (1999)
    assert_eq!(
        (b.bound.clone(), b.estimate, b.rows, b.chunks, b.state),
        (json!(1999), Some(4), 3, 2, BackfillState::Done)
    );
    assert_eq!(mock.values("rv_backfill_first"), vec![Wire::Int(2), Wire::Int(1999)]);
    let afters: Vec<Vec<Wire>> = mock.sent("rv_backfill_after").into_iter().map(|s| s.values).collect();
    assert_eq!(
        afters,
        vec![
            vec![Wire::Int(2), Wire::Int(1999), Wire::Text("3".into())],
            vec![Wire::Int(2), Wire::Int(1999), Wire::Text("4".into())]
        ]
    );
    assert_eq!(mock.values("rv_fetch_after_version"), vec![Wire::Int(2), Wire::Int(1999)]);
    assert_eq!(checkpoint(&trigger).await, json!({"rv": 2003, "key": ["3"]}));
}

#[tokio::test]
async fn an_operators_filtered_backfill_of_a_running_change_tracking_function_delivers_the_matching_rows() {
    // GIVEN a running function (startFrom earliest) whose first tick found nothing after the minimum valid version
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register("ct_versions", versions(10, 42)).await;
    mock.register("ct_fetch_start", changes(42, 10, &[])).await;
    let function = function(
        &mock,
        "OrdersChanged",
        json!({"source": "mssql-change-tracking", "tableName": "[DBO].[ORDERS]", "connectionStringSetting": "SqlConnectionString"}),
    );
    let source = Arc::new(new_change_tracking(function.source.clone()).expect("source"));
    let consumer = Arc::new(Consumer::default());
    let trigger = Trigger::new(function, "wire-app", source, Arc::new(MemoryStore::new()), "owner-1".into())
        .with_sink(consumer.clone());
    assert_eq!(invoke(&trigger).await.expect("tick 1"), OutcomeKind::Empty);
    assert_eq!(checkpoint(&trigger).await, json!({"phase": "changes", "base": 42}), "the empty tick proved 42");

    // WHEN an operator starts a backfill naming a column the table does not have, then one with a valid filter
    let start = |filter: &str| Action::BackfillStart { filter: Some(filter.to_string()) };
    let refused = trigger.operate(start("name = 'Zoë'"), "test").await.expect_err("no such column").to_string();
    mock.register("ct_backfill_filter_estimate", estimate(1)).await;
    let started = trigger.operate(start("NAME = 'Zoë' AND PRICE >= 10.5"), "test").await.expect("starts");
    mock.register("ct_backfill_filter_first", chunk(&[(ONE, &["1"])], 1)).await;
    assert_eq!(invoke(&trigger).await.expect("tick 2"), OutcomeKind::Delivered);
    mock.register("ct_backfill_filter_after", chunk(&[], 1)).await;
    assert_eq!(invoke(&trigger).await.expect("tick 3"), OutcomeKind::Empty);

    // THEN the refusal names the column and the table's, the start reports its estimate, and the matching row came
    // marked, read under the checkpoint's version with the filter's values bound after the key
    assert!(refused.contains("\"name\"") && refused.contains("ID, NAME, PRICE"), "{refused}");
    assert_eq!(
        (started["backfill"]["state"].clone(), started["backfill"]["rows_estimated"].clone()),
        (json!("running"), json!(1))
    );
    let (doc, _) = trigger.load().await.expect("load").expect("state written");
    let b = doc.backfill().expect("a backfill");
    assert_eq!((b.state, b.rows, b.bound.clone()), (BackfillState::Done, 1, json!(42)));
    assert_eq!(consumer.batches(), vec![(Some(b.id.clone()), batch(&[row(0, ONE, Some(&b.id))]))]);
    let texts = |t: &[&str]| t.iter().map(|s| Wire::Text((*s).into())).collect::<Vec<_>>();
    let mut want = vec![Wire::Int(2), Wire::Int(42)];
    want.extend(texts(&["Zoë", "10.5"]));
    assert_eq!(mock.values("ct_backfill_filter_first"), want);
    assert_eq!(mock.values("ct_backfill_filter_after")[2], Wire::Text("1".into()));
}

fn parse(filter: &str) -> Filter {
    Filter::parse(filter).expect("a filter")
}

#[tokio::test]
async fn a_change_tracking_backfill_binds_its_bound_keys_and_filter_values_for_a_composite_and_a_one_column_key() {
    // GIVEN the order lines (composite key, READ COMMITTED) and the orders
    let mut mock = Mock::start().await;
    order_lines_catalog(&mut mock).await;
    let lines = order_lines_source(&mock);
    let filter = parse("Qty > 2 OR \"Line №\" IN ('a', 'b')");
    let line = r#"{"Order Id":7,"Line №":"b","Qty":3}"#;
    mock.register("ct_options_backfill_filter_estimate", estimate(7)).await;
    mock.register("ct_options_backfill_estimate", estimate(9)).await;
    mock.register("ct_options_backfill_first", chunk(&[(line, &["7", "a"]), (line, &["7", "b"])], 2)).await;
    mock.register("ct_options_backfill_filter_range", chunk(&[(line, &["7", "b"])], 2)).await;

    // WHEN backfills start from a checkpoint inside a version and from a base, and chunks are read
    let mid = json!({"phase": "changes", "base": 30, "last": {"version": 35, "key": ["7", "a"]}});
    let filtered = lines.backfill_start(&mid, Some(&filter)).await.expect("starts");
    let all = lines.backfill_start(&json!({"phase": "changes", "base": 30}), None).await.expect("starts");
    let first = lines.chunk_rows(&json!(35), &Value::Null, None, None, 2).await.expect("chunk");
    let range = lines.chunk_rows(&json!(35), &json!(["7", "a"]), Some(&json!(["7", "b"])), Some(&filter), 2).await;

    // THEN the bound is the last version the checkpoint covers, the rows are inserts ending at their key, and
    // the filter's literals travel as values after the keys
    assert_eq!((filtered.bound, filtered.estimate), (json!(35), Some(7)));
    assert_eq!((all.bound, all.estimate), (json!(30), Some(9)));
    let texts = |t: &[&str]| t.iter().map(|s| Wire::Text((*s).into())).collect::<Vec<_>>();
    assert_eq!(mock.values("ct_options_backfill_filter_estimate"), texts(&["2", "a", "b"]));
    assert_eq!(first.last, Some(json!(["7", "b"])));
    assert_eq!(encode_batch(&first.changes).get(), batch(&[row(0, line, None), row(0, line, None)]));
    assert_eq!(mock.values("ct_options_backfill_first"), vec![Wire::Int(2), Wire::Int(35)]);
    assert_eq!(range.expect("range").last, Some(json!(["7", "b"])));
    let mut want = vec![Wire::Int(2), Wire::Int(35)];
    want.extend(texts(&["7", "a", "7", "b", "2", "a", "b"]));
    assert_eq!(mock.values("ct_options_backfill_filter_range"), want);

    // AND a filter naming a column the table does not have, or a stored position of another key, is refused
    // with what to do, before any statement
    let e = lines.backfill_start(&mid, Some(&parse("qty > 2"))).await.expect_err("no such column").to_string();
    assert!(e.contains("\"qty\"") && e.contains("Order Id, Line №, Note, Qty"), "{e}");
    let e = lines.chunk_rows(&json!(35), &json!(["7"]), None, None, 2).await.expect_err("misfit").to_string();
    assert!(e.contains("--cancel"), "{e}");

    // AND GIVEN the orders, a function with nothing recorded yet: the bound is the current version
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register("ct_versions", versions(10, 42)).await;
    mock.register("ct_backfill_filter_estimate", estimate(2)).await;
    mock.register("ct_backfill_filter_after", chunk(&[(ONE, &["1"])], 1)).await;
    let orders = ct_source(&mock, json!({}));
    let filter = parse("NAME = 'Zoë' AND PRICE >= 10.5");
    let plan = orders.backfill_start(&Value::Null, Some(&filter)).await.expect("starts");
    let fetched = orders.chunk_rows(&json!(42), &json!(["0"]), None, Some(&filter), 10).await.expect("chunk");
    assert_eq!((plan.bound, plan.estimate), (json!(42), Some(2)));
    assert_eq!(mock.values("ct_backfill_filter_estimate"), texts(&["Zoë", "10.5"]));
    assert_eq!(fetched.last, Some(json!(["1"])));
    let mut want = vec![Wire::Int(10), Wire::Int(42)];
    want.extend(texts(&["0", "Zoë", "10.5"]));
    assert_eq!(mock.values("ct_backfill_filter_after"), want);
}

#[tokio::test]
async fn a_rowversion_backfill_binds_its_bound_keys_and_filter_values_for_a_composite_and_a_one_column_key() {
    // GIVEN the item log (composite key, a soft-delete column that is not bit, READ COMMITTED)
    let mut mock = Mock::start().await;
    mock.register("catalog_database", database_with(None, false)).await;
    mock.register("catalog_table", table(None, false)).await;
    mock.register("catalog_columns", columns(ITEM_LOG)).await;
    let log = new_rowversion(spec(
        &mock,
        SourceKind::MssqlRowversion,
        "[app].[Item Log]",
        json!({"softDeleteColumn": "Deleted At", "insertedColumn": "Created Version", "columns": ["Tenant", "At", "Body"]}),
        "",
    ))
    .expect("source");
    let filter = parse("Body IS NOT NULL AND At >= '2026-01-01' AND Tenant = 'a'");
    let item = r#"{"Tenant":"a","At":"2026-01-02T00:00:00","Body":"b"}"#;
    let at = "2026-01-02 00:00:00.0000000";
    mock.register("rv_options_backfill_filter_estimate", estimate(5)).await;
    mock.register("rv_options_backfill_estimate", estimate(8)).await;
    mock.register("rv_options_backfill_first", chunk(&[(item, &["a", at])], 2)).await;
    mock.register("rv_options_backfill_filter_range", chunk(&[(item, &["a", at])], 2)).await;

    // WHEN backfills start mid-backlog and with nothing delivered yet, and chunks are read
    let mid = json!({"rv": 3008, "key": ["c", at], "base": 3003});
    let filtered = log.backfill_start(&mid, Some(&filter)).await.expect("starts");
    let all = log.backfill_start(&json!({"rv": 3010}), None).await.expect("starts");
    let nothing = log.backfill_start(&Value::Null, Some(&filter)).await.expect("starts");
    let first = log.chunk_rows(&json!(3008), &Value::Null, None, None, 2).await.expect("chunk");
    let range = log.chunk_rows(&json!(3008), &json!(["a", at]), Some(&json!(["b", at])), Some(&filter), 2).await;
    let none = log.chunk_rows(&Value::Null, &Value::Null, None, None, 2).await.expect("nothing to read");

    // THEN the bound is the checkpoint's rowversion; with nothing delivered the live path reads every row, so
    // there is nothing to backfill and nothing is sent
    assert_eq!((filtered.bound, filtered.estimate), (json!(3008), Some(5)));
    assert_eq!((all.bound, all.estimate), (json!(3010), Some(8)));
    assert_eq!((nothing.bound, nothing.estimate), (Value::Null, Some(0)));
    assert!(none.changes.is_empty() && none.last.is_none());
    let texts = |t: &[&str]| t.iter().map(|s| Wire::Text((*s).into())).collect::<Vec<_>>();
    let mut want = vec![Wire::Int(3008)];
    want.extend(texts(&["2026-01-01", "a"]));
    assert_eq!(mock.values("rv_options_backfill_filter_estimate"), want);
    assert_eq!(mock.values("rv_options_backfill_estimate"), vec![Wire::Int(3010)]);
    assert_eq!(first.last, Some(json!(["a", at])));
    assert_eq!(mock.values("rv_options_backfill_first"), vec![Wire::Int(2), Wire::Int(3008)]);
    assert_eq!(range.expect("range").last, Some(json!(["a", at])));
    let mut want = vec![Wire::Int(2), Wire::Int(3008)];
    want.extend(texts(&["a", at, "b", at, "2026-01-01", "a"]));
    assert_eq!(mock.values("rv_options_backfill_filter_range"), want);
    assert_eq!(mock.sent("rv_options_backfill_filter_estimate").len(), 1, "the start with nothing delivered sent none");

    // AND GIVEN the items (one-column key): a filtered chunk, its estimate, and a chunk read again
    let mut mock = Mock::start().await;
    let items = items_source(&mut mock).await;
    mock.register("rv_backfill_filter_estimate", estimate(1)).await;
    mock.register("rv_backfill_filter_after", chunk(&[(ITEM_3, &["3"])], 1)).await;
    mock.register("rv_backfill_range", chunk(&[(ITEM_3, &["3"])], 1)).await;
    let filter = parse("TITLE <> 'draft' AND ID IN (1, 2, 3)");
    let plan = items.backfill_start(&json!({"rv": 2002, "key": ["2"]}), Some(&filter)).await.expect("starts");
    let fetched = items.chunk_rows(&json!(2002), &json!(["1"]), None, Some(&filter), 5).await.expect("chunk");
    let again = items.chunk_rows(&json!(2002), &json!(["1"]), Some(&json!(["3"])), None, 5).await.expect("again");
    assert_eq!((plan.bound, plan.estimate), (json!(2002), Some(1)));
    let mut want = vec![Wire::Int(2002)];
    want.extend(texts(&["draft", "1", "2", "3"]));
    assert_eq!(mock.values("rv_backfill_filter_estimate"), want);
    assert_eq!(encode_batch(&fetched.changes).get(), encode_batch(&again.changes).get());
    let mut want = vec![Wire::Int(5), Wire::Int(2002)];
    want.extend(texts(&["1", "draft", "1", "2", "3"]));
    assert_eq!(mock.values("rv_backfill_filter_after"), want);
    let mut want = vec![Wire::Int(5), Wire::Int(2002)];
    want.extend(texts(&["1", "3"]));
    assert_eq!(mock.values("rv_backfill_range"), want);
}

#[tokio::test]
async fn a_partitions_backfill_reads_and_counts_only_its_own_keys() {
    // GIVEN partition 2 of 4 of the orders (change tracking: the key hashed inline)
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register("ct_part_backfill_estimate", estimate(25)).await;
    mock.register("ct_part_backfill_first", chunk(&[(ONE, &["1"])], 1)).await;
    let orders = new_change_tracking(generated_partition_spec(&mock, 2, 4)).expect("source builds");
    let plan = orders.backfill_start(&json!({"phase": "changes", "base": 42}), None).await.expect("starts");
    let fetched = orders.chunk_rows(&json!(42), &Value::Null, None, None, 100).await.expect("chunk");
    assert_eq!((plan.bound, plan.estimate, fetched.changes.len()), (json!(42), Some(25), 1));
    assert_eq!(mock.values("ct_part_backfill_estimate"), vec![Wire::Int(4), Wire::Int(2)]);
    assert_eq!(mock.values("ct_part_backfill_first"), vec![Wire::Int(100), Wire::Int(42), Wire::Int(4), Wire::Int(2)]);

    // AND GIVEN partition 3 of 8 of the items, through the partition column P8
    let mut mock = Mock::start().await;
    let items = partitioned_items_source(&mut mock, 3, true).await;
    mock.register("catalog_partition_column", partition_column_facts(P8_DEFINITION, true, 1)).await;
    mock.register("rv_part_column_backfill_estimate", estimate(12)).await;
    mock.register("rv_part_column_backfill_first", chunk(&[(ITEM_1, &["1"])], 1)).await;
    let plan = items.backfill_start(&json!({"rv": 2002}), None).await.expect("starts");
    let fetched = items.chunk_rows(&json!(2002), &Value::Null, None, None, 100).await.expect("chunk");
    assert_eq!((plan.bound, plan.estimate, fetched.changes.len()), (json!(2002), Some(12), 1));
    assert_eq!(mock.values("rv_part_column_backfill_estimate"), vec![Wire::Int(2002), Wire::Int(3)]);
    assert_eq!(mock.values("rv_part_column_backfill_first"), vec![Wire::Int(100), Wire::Int(2002), Wire::Int(3)]);
}
