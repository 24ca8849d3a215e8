//! The SQL upsert sink and sink delivery mode against a real PostgreSQL.
//!
//! Two levels. The sink itself (`sink::from_options` + `deliver`) for every rule of the official output
//! binding, the fence and the exactly-once checkpoint, each in a fresh database. Then the real `handler` in
//! sink delivery mode, played by the host driver, mirroring `orders` into `orders_copy`, including crashes
//! between the sink's commit and the state's, and an exactly-once drain under kill -9 at random points.
//!
//! `orders_copy` counts how many times each row was written (`applications`, set by a trigger on the
//! target), so a duplicate application is visible even though an upsert leaves the same values behind.

use crate::common::*;
use crate::support::{self, AppFolder};
use serde_json::{json, Value};
use sql_pseudo_trigger::change::{Change, Operation};
use sql_pseudo_trigger::config::Env;
use sql_pseudo_trigger::failpoint;
use sql_pseudo_trigger::sink::{self, Sink, SinkBatch, SinkError};
use sql_pseudo_trigger::source::BatchRange;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use testbed::driver::HostDriver;
use testbed::embedded;

// ---------------------------------------------------------------------------------------------------------------
// The sink on its own
// ---------------------------------------------------------------------------------------------------------------

/// A fresh database with `ddl` run in it, and a client on it.
async fn target_database(prefix: &str, ddl: &str) -> (String, tokio_postgres::Client) {
    let url = support::fixture().fresh_database(prefix).await;
    let db = embedded::connect(&url).await.expect("connect to the test database");
    db.batch_execute(ddl).await.expect("create the target");
    (url, db)
}

/// A PostgreSQL sink on `table` in the database at `url`, with `extra` options.
fn pg_sink(url: &str, table: &str, extra: Value) -> Arc<dyn Sink> {
    let mut options = json!({ "type": "postgres", "tableName": table, "connectionStringSetting": "TargetDb" });
    if let (Some(o), Some(extra)) = (options.as_object_mut(), extra.as_object()) {
        o.extend(extra.clone());
    }
    let env = Env::from_pairs([("TargetDb".to_string(), url.to_string())]);
    sink::from_options("F", Some(&options), &env, &Default::default()).unwrap_or_else(|e| panic!("a valid sink: {e}"))
}

fn change(op: Operation, item: Value) -> Change {
    Change::from_json(op, item.to_string()).expect("json")
}

fn upsert(item: Value) -> Change {
    change(Operation::Update, item)
}

async fn deliver(sink: &dyn Sink, batch_id: u64, fence: u64, changes: &[Change]) -> Result<(), SinkError> {
    let range = BatchRange::new(batch_id, Value::Null, Value::Null, changes.len() as u64);
    sink.deliver(&SinkBatch { app: "app", function: "F", fence, changes, range: &range }).await
}

/// Rows of `query` as JSON objects (`row_to_json`), in its order.
async fn rows(db: &tokio_postgres::Client, query: &str) -> Vec<Value> {
    let sql = format!("SELECT row_to_json(r)::text FROM ({query}) r");
    db.query(&sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .map(|r| serde_json::from_str(r.get::<_, &str>(0)).expect("row json"))
        .collect()
}

const UNICODE_TABLE: &str = r#"
    CREATE SCHEMA "Sales Ünïcode";
    CREATE TABLE "Sales Ünïcode"."Order Lines" (
        id bigint PRIMARY KEY,
        "order" integer,
        "Ünïcode Col" text NOT NULL,
        note text DEFAULT 'none',
        blob bytea,
        CONSTRAINT positive_order CHECK ("order" IS NULL OR "order" >= 0)
    );"#;
const UNICODE_NAME: &str = "\"Sales Ünïcode\".\"Order Lines\"";

#[tokio::test]
async fn upserts_and_deletes_by_primary_key_with_reserved_and_unicode_column_names() {
    // GIVEN a table in a unicode schema with a reserved word, a unicode column and a bytea column
    let (url, db) = target_database("sink_rules", UNICODE_TABLE).await;
    let sink = pg_sink(&url, UNICODE_NAME, json!({}));

    // WHEN a batch inserts three rows and the next updates one and deletes another
    let first = [
        upsert(json!({"id": 1, "order": 1, "Ünïcode Col": "één", "blob": "AAEC"})),
        upsert(json!({"id": 2, "order": 2, "Ünïcode Col": "two"})),
        upsert(json!({"id": 3, "order": 3, "Ünïcode Col": "three", "note": null})),
    ];
    deliver(sink.as_ref(), 1, 1, &first).await.expect("first batch");
    let second =
        [upsert(json!({"id": 2, "order": 20, "Ünïcode Col": "TWO"})), change(Operation::Delete, json!({"id": 3}))];
    deliver(sink.as_ref(), 2, 1, &second).await.expect("second batch");

    // THEN the table holds exactly what the changes say, binary decoded from base64, defaults where omitted
    let got = rows(
        &db,
        &format!(
            "SELECT id, \"order\", \"Ünïcode Col\", note, encode(blob, 'hex') AS blob FROM {UNICODE_NAME} ORDER BY id"
        ),
    )
    .await;
    assert_eq!(
        got,
        vec![
            json!({"id": 1, "order": 1, "Ünïcode Col": "één", "note": "none", "blob": "000102"}),
            json!({"id": 2, "order": 20, "Ünïcode Col": "TWO", "note": "none", "blob": null}),
        ]
    );
    // AND the fence table was created beside the target, holding this function's token
    let fence = rows(&db, "SELECT function, token FROM \"Sales Ünïcode\".sql_pseudo_trigger_fence").await;
    assert_eq!(fence, vec![json!({"function": "app/F", "token": 1})]);
}

#[tokio::test]
async fn several_changes_of_one_key_in_a_batch_leave_the_last_one() {
    let (url, db) = target_database("sink_dupes", UNICODE_TABLE).await;
    let sink = pg_sink(&url, UNICODE_NAME, json!({}));
    let batch = [
        upsert(json!({"id": 1, "order": 1, "Ünïcode Col": "a"})),
        upsert(json!({"id": 1, "order": 2, "Ünïcode Col": "b"})),
        upsert(json!({"id": 2, "order": 1, "Ünïcode Col": "c"})),
        change(Operation::Delete, json!({"id": 2})),
        change(Operation::Delete, json!({"id": 1})),
        upsert(json!({"id": 1, "order": 3, "Ünïcode Col": "d"})),
    ];
    deliver(sink.as_ref(), 1, 1, &batch).await.expect("one statement per shape, no duplicate key error");
    let got = rows(&db, &format!("SELECT id, \"order\", \"Ünïcode Col\" FROM {UNICODE_NAME} ORDER BY id")).await;
    assert_eq!(got, vec![json!({"id": 1, "order": 3, "Ünïcode Col": "d"})]);
}

#[tokio::test]
async fn an_identity_or_default_key_absent_from_the_rows_is_a_plain_insert_and_present_is_an_upsert() {
    // GIVEN a GENERATED ALWAYS identity key and a uuid key with a default
    let (url, db) = target_database(
        "sink_identity",
        "CREATE TABLE ident (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, name text NOT NULL);
         CREATE TABLE defaulted (id uuid PRIMARY KEY DEFAULT md5(random()::text || clock_timestamp()::text)::uuid, name text);",
    )
    .await;
    let ident = pg_sink(&url, "public.ident", json!({}));
    let defaulted = pg_sink(&url, "public.defaulted", json!({}));

    // WHEN rows without the key arrive twice, and then a row naming an identity value
    let keyless = [upsert(json!({"name": "a"})), upsert(json!({"name": "a"}))];
    deliver(ident.as_ref(), 1, 1, &keyless).await.expect("plain inserts");
    deliver(ident.as_ref(), 2, 1, &keyless).await.expect("plain inserts again");
    deliver(ident.as_ref(), 3, 1, &[upsert(json!({"id": 2, "name": "named"}))]).await.expect("an upsert");
    deliver(defaulted.as_ref(), 1, 1, &keyless).await.expect("plain inserts");
    let uuid = "00000000-0000-0000-0000-000000000001";
    deliver(defaulted.as_ref(), 2, 1, &[upsert(json!({"id": uuid, "name": "x"}))]).await.expect("insert");
    deliver(defaulted.as_ref(), 3, 1, &[upsert(json!({"id": uuid, "name": "y"}))]).await.expect("upsert");

    // THEN keyless rows were each inserted with a new key, and a given key was upserted
    let got = rows(&db, "SELECT id, name FROM ident ORDER BY id").await;
    assert_eq!(
        got,
        vec![
            json!({"id": 1, "name": "a"}),
            json!({"id": 2, "name": "named"}),
            json!({"id": 3, "name": "a"}),
            json!({"id": 4, "name": "a"})
        ]
    );
    let count: i64 = db.query_one("SELECT count(*) FROM defaulted", &[]).await.expect("count").get(0);
    assert_eq!(count, 3, "two keyless inserts and one upserted key");
    let named = rows(&db, &format!("SELECT name FROM defaulted WHERE id = '{uuid}'")).await;
    assert_eq!(named, vec![json!({"name": "y"})]);
}

#[tokio::test]
async fn an_extra_property_or_a_missing_not_null_column_is_refused_naming_it_and_nothing_is_written() {
    let (url, db) = target_database("sink_refuse", UNICODE_TABLE).await;
    let sink = pg_sink(&url, UNICODE_NAME, json!({}));
    let valid = upsert(json!({"id": 1, "Ünïcode Col": "ok"}));

    let extra =
        deliver(sink.as_ref(), 1, 1, &[valid.clone(), upsert(json!({"id": 2, "Ünïcode Col": "x", "colour": "red"}))])
            .await
            .unwrap_err();
    assert!(matches!(extra, SinkError::Rejected(_)), "{extra}");
    assert!(extra.to_string().contains("property \"colour\" of change 1 is not a column"), "{extra}");
    assert!(!extra.to_string().contains("red"), "no row value in errors: {extra}");

    let case = deliver(sink.as_ref(), 1, 1, &[upsert(json!({"ID": 1, "Ünïcode Col": "x"}))]).await.unwrap_err();
    assert!(case.to_string().contains("did you mean \"id\""), "{case}");

    let missing = deliver(sink.as_ref(), 1, 1, &[valid, upsert(json!({"id": 2, "order": 1}))]).await.unwrap_err();
    assert!(missing.to_string().contains("lacks column \"Ünïcode Col\""), "{missing}");

    let count: i64 = db.query_one(&format!("SELECT count(*) FROM {UNICODE_NAME}"), &[]).await.expect("count").get(0);
    assert_eq!(count, 0, "a refused batch writes nothing");
}

#[tokio::test]
async fn a_batch_failing_in_its_last_statement_leaves_no_partial_upsert() {
    // GIVEN a row already there
    let (url, db) = target_database("sink_partial", UNICODE_TABLE).await;
    let sink = pg_sink(&url, UNICODE_NAME, json!({"maxRowsPerStatement": 2}));
    deliver(sink.as_ref(), 1, 1, &[upsert(json!({"id": 1, "order": 1, "Ünïcode Col": "before"}))]).await.expect("seed");

    // WHEN a batch of five statements (two rows each, a delete first) breaks a CHECK in its last row
    let mut batch = vec![change(Operation::Delete, json!({"id": 1}))];
    batch.extend((2..=9).map(|i| upsert(json!({"id": i, "order": i, "Ünïcode Col": "new"}))));
    batch.push(upsert(json!({"id": 10, "order": -1, "Ünïcode Col": "new"})));
    let e = deliver(sink.as_ref(), 2, 1, &batch).await.unwrap_err();

    // THEN it is refused with the constraint named, and the table is as before: nothing of it was applied
    assert!(matches!(e, SinkError::Rejected(_)) && e.to_string().contains("positive_order"), "{e}");
    let got = rows(&db, &format!("SELECT id, \"Ünïcode Col\" FROM {UNICODE_NAME} ORDER BY id")).await;
    assert_eq!(got, vec![json!({"id": 1, "Ünïcode Col": "before"})]);

    // AND a batch larger than one statement goes through whole once valid
    batch.pop();
    deliver(sink.as_ref(), 3, 1, &batch).await.expect("valid batch");
    let count: i64 = db.query_one(&format!("SELECT count(*) FROM {UNICODE_NAME}"), &[]).await.expect("count").get(0);
    assert_eq!(count, 8);
}

#[tokio::test]
async fn a_deposed_owners_late_write_is_refused_by_the_fence() {
    // GIVEN owner A (token 1) wrote, then owner B (token 2) took over and wrote newer values
    let (url, db) = target_database("sink_fence", UNICODE_TABLE).await;
    let a = pg_sink(&url, UNICODE_NAME, json!({}));
    let b = pg_sink(&url, UNICODE_NAME, json!({}));
    deliver(a.as_ref(), 1, 1, &[upsert(json!({"id": 1, "Ünïcode Col": "a1"}))]).await.expect("A writes");
    deliver(b.as_ref(), 1, 2, &[upsert(json!({"id": 1, "Ünïcode Col": "b1"}))]).await.expect("B writes");

    // WHEN A, deposed, writes the stale batch it still held
    let late = deliver(a.as_ref(), 1, 1, &[upsert(json!({"id": 1, "Ünïcode Col": "stale"}))]).await;

    // THEN it is refused with both tokens, and B's values stay
    assert!(matches!(late, Err(SinkError::Fenced { ours: 1, stored: 2 })), "{late:?}");
    let got = rows(&db, &format!("SELECT \"Ünïcode Col\" AS v FROM {UNICODE_NAME}")).await;
    assert_eq!(got, vec![json!({"v": "b1"})]);
    // AND B goes on writing, as does any later owner
    deliver(b.as_ref(), 2, 2, &[upsert(json!({"id": 1, "Ünïcode Col": "b2"}))]).await.expect("B again");
    deliver(a.as_ref(), 3, 3, &[upsert(json!({"id": 1, "Ünïcode Col": "a3"}))]).await.expect("A as owner 3");
}

#[tokio::test]
async fn exactly_once_applies_a_batch_once_however_often_it_is_delivered() {
    // GIVEN an exactly-once sink on a table that counts its writes, with the checkpoint table named
    let (url, db) = target_database("sink_once", COPY_TABLE).await;
    let sink =
        pg_sink(&url, "public.orders_copy", json!({"exactlyOnce": true, "checkpointTable": "public.my_checkpoints"}));
    let batch = [
        upsert(json!({"id": 1, "customer": "c", "amount": 1})),
        upsert(json!({"id": 2, "customer": "c", "amount": 2})),
    ];
    let (from, to) = (Value::Null, json!(["100", "2"]));
    let once = |batch_id: u64, from: &Value, to: &Value, fence: u64| {
        let (sink, batch) = (sink.clone(), batch.clone());
        let range = BatchRange::new(batch_id, from.clone(), to.clone(), batch.len() as u64);
        async move {
            let b = SinkBatch { app: "app", function: "F", fence, changes: &batch, range: &range };
            sink.deliver(&b).await
        }
    };

    // WHEN batch 7 is delivered three times (the acknowledgement lost twice; the last by a new owner)
    once(7, &from, &to, 1).await.expect("first");
    once(7, &from, &to, 1).await.expect("again");
    once(7, &from, &to, 2).await.expect("by the next owner");

    // THEN its rows were written once, and the checkpoint row names it
    let got = rows(&db, "SELECT id, applications FROM orders_copy ORDER BY id").await;
    assert_eq!(got, vec![json!({"id": 1, "applications": 1}), json!({"id": 2, "applications": 1})]);
    let cp = rows(&db, "SELECT function, batch_id, from_position, to_position, fence FROM my_checkpoints").await;
    assert_eq!(
        cp,
        vec![
            json!({"function": "app/F", "batch_id": 7, "from_position": null, "to_position": ["100", "2"], "fence": 1})
        ]
    );

    // AND another batch (or the same id over another range, after a reset) is applied
    once(8, &to, &json!(["101", "1"]), 2).await.expect("next");
    once(7, &from, &json!(["99", "1"]), 2).await.expect("a reset's batch 7");
    let got = rows(&db, "SELECT applications FROM orders_copy ORDER BY id").await;
    assert_eq!(got, vec![json!({"applications": 3}), json!({"applications": 3})]);
    // (A batch without a range cannot reach a sink: every `SinkBatch` carries its `BatchRange`, and
    // configuration refuses exactlyOnce outside deliveryMode sink, as the last test of this file shows.)
}

#[tokio::test]
async fn a_missing_table_or_key_is_refused_with_what_to_do() {
    let (url, _db) = target_database("sink_missing", "CREATE TABLE nokey (id bigint, v text);").await;
    let e =
        deliver(pg_sink(&url, "public.nope", json!({})).as_ref(), 1, 1, &[upsert(json!({"id": 1}))]).await.unwrap_err();
    assert!(e.to_string().contains("sink table public.nope does not exist"), "{e}");
    let e = deliver(pg_sink(&url, "public.nokey", json!({})).as_ref(), 1, 1, &[upsert(json!({"id": 1}))])
        .await
        .unwrap_err();
    assert!(e.to_string().contains("has no primary key") && e.to_string().contains("ADD PRIMARY KEY"), "{e}");
}

// ---------------------------------------------------------------------------------------------------------------
// The handler in sink delivery mode
// ---------------------------------------------------------------------------------------------------------------

/// The target: the orders' key and values, and how many times each row was written.
const COPY_TABLE: &str = "
    CREATE TABLE public.orders_copy (
        id bigint PRIMARY KEY, customer text NOT NULL, amount numeric(12, 2) NOT NULL,
        applications integer NOT NULL DEFAULT 0);
    CREATE FUNCTION public.count_applications() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'INSERT' THEN NEW.applications := 1; ELSE NEW.applications := OLD.applications + 1; END IF;
        RETURN NEW;
    END $$;
    CREATE TRIGGER count_applications BEFORE INSERT OR UPDATE ON public.orders_copy
        FOR EACH ROW EXECUTE FUNCTION public.count_applications();";

/// `orders` and `orders_copy` in one fresh database, and an app mirroring one into the other in sink mode.
async fn mirror(prefix: &str, sink_extra: Value, trigger_extra: Value) -> (Orders, AppFolder, String) {
    let orders = Orders::new(prefix).await;
    orders.db.batch_execute(COPY_TABLE).await.expect("create orders_copy");
    let app_name = unique_app_name(prefix);
    let mut sink =
        json!({ "type": "postgres", "tableName": "public.orders_copy", "connectionStringSetting": "TargetDb" });
    if let (Some(s), Some(extra)) = (sink.as_object_mut(), sink_extra.as_object()) {
        s.extend(extra.clone());
    }
    let mut trigger = trigger_json(json!({
        "deliveryMode": "sink", "sink": sink, "columns": ["id", "customer", "amount"], "leaseDurationMs": 1000
    }));
    if let (Some(t), Some(extra)) = (trigger.as_object_mut(), trigger_extra.as_object()) {
        t.extend(extra.clone());
    }
    let function = json!({ "bindings": [
        { "type": "timerTrigger", "direction": "in", "name": "timer", "schedule": "*/5 * * * * *" }
    ]});
    let azurite = support::fixture().azurite_connection_string();
    let app = support::write_app(
        FUNCTION,
        function,
        trigger,
        &[
            ("PostgresConnectionString", orders.url.as_str()),
            ("TargetDb", orders.url.as_str()),
            ("AzureWebJobsStorage", azurite.as_str()),
            ("Sql_Trigger_StateStore", "blob"),
            ("Sql_Trigger_AppName", app_name.as_str()),
        ],
    );
    (orders, app, app_name)
}

/// id -> (customer, amount) of the live orders.
async fn source_rows(orders: &Orders) -> BTreeMap<i64, (String, String)> {
    let rows =
        orders.db.query("SELECT id, customer, amount::text FROM orders WHERE NOT deleted", &[]).await.expect("orders");
    rows.iter().map(|r| (r.get(0), (r.get(1), r.get(2)))).collect()
}

/// id -> ((customer, amount), applications) of the copy.
async fn copy_rows(orders: &Orders) -> BTreeMap<i64, ((String, String), i32)> {
    let rows =
        orders.db.query("SELECT id, customer, amount::text, applications FROM orders_copy", &[]).await.expect("copy");
    rows.iter().map(|r| (r.get(0), ((r.get(1), r.get(2)), r.get(3)))).collect()
}

/// Fires the timer until the copy matches the source and nothing is in flight, for at most 20 s.
async fn fire_until_mirrored(host: &HostDriver, orders: &Orders, app_name: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let store = shared_blob_store();
    loop {
        let run = host.run_timer(FUNCTION).await.expect("timer run");
        assert!(run.succeeded, "timer run failed: {:?}\n{}", run.attempts.last().map(|a| &a.outcome), host.output());
        for invocation in run.attempts.iter().filter_map(|a| a.invocation.as_ref()) {
            assert!(invocation.outputs.is_empty(), "sink mode answers no outputs: {}", invocation.body);
        }
        let source = source_rows(orders).await;
        let copy: BTreeMap<i64, (String, String)> =
            copy_rows(orders).await.into_iter().map(|(k, (v, _))| (k, v)).collect();
        let settled = load_state(&store, app_name).await.is_some_and(|(doc, _)| doc.in_flight().is_none());
        if source == copy && settled {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not mirrored within 20 s: source {source:?}, copy {copy:?}\n{}",
            host.output()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Fires the timer until the handler is gone (a failpoint aborted it), for at most 10 s.
async fn fire_until_crashed(host: &HostDriver) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while host.is_running() {
        let _ = host.run_timer(FUNCTION).await;
        assert!(Instant::now() < deadline, "the failpoint was not reached within 10 s:\n{}", host.output());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits out the lease of a crashed owner, if it left a batch in flight.
async fn wait_for_takeover(app_name: &str) {
    let store = shared_blob_store();
    if load_state(&store, app_name).await.is_some_and(|(doc, _)| doc.in_flight().is_some() && doc.lease().is_some()) {
        wait_until_lease_expired(&store, app_name).await;
    }
}

#[tokio::test]
async fn sink_mode_mirrors_inserts_updates_and_deletes_and_answers_the_host_no_outputs() {
    // GIVEN orders mirrored in sink mode
    let (orders, app, app_name) = mirror("sink_mirror", json!({}), json!({})).await;
    let host = start(&app).await;
    orders.insert(1..=30).await;

    // WHEN they are drained, then changed and deleted
    fire_until_mirrored(&host, &orders, &app_name).await;
    orders.set_amount(3, "99.99").await;
    orders.soft_delete(4).await;
    orders.insert([31]).await;
    fire_until_mirrored(&host, &orders, &app_name).await;

    // THEN the copy equals the live orders (the delete applied by key), each write applied once here
    let copy = copy_rows(&orders).await;
    assert!(!copy.contains_key(&4));
    assert_eq!(copy[&3], (("c3".to_string(), "99.99".to_string()), 2));
    assert!(copy.values().filter(|(_, n)| *n != 1).count() == 1, "{copy:?}");
}

#[tokio::test]
async fn a_crash_after_the_sinks_commit_redelivers_the_batch_and_the_upsert_absorbs_it() {
    // GIVEN a handler that dies right after the sink committed its first batch (before the acknowledgement)
    let (orders, app, app_name) = mirror("sink_crash", json!({}), json!({})).await;
    orders.insert(1..=5).await;
    let crashing = app.start_handler(&[(failpoint::ENV, "after-sink")]).await;
    fire_until_crashed(&crashing).await;
    assert!(crashing.output().contains("failpoint after-sink hit"), "{}", crashing.output());
    assert_eq!(copy_rows(&orders).await.len(), 5, "the sink committed before the crash");

    // WHEN a new process takes over once the lease expired
    wait_for_takeover(&app_name).await;
    let host = start(&app).await;
    fire_until_mirrored(&host, &orders, &app_name).await;

    // THEN nothing is lost, and the batch was applied twice: at-least-once, with the same values left behind
    let copy = copy_rows(&orders).await;
    assert_eq!(copy.keys().copied().collect::<Vec<_>>(), ids(1..=5).into_iter().collect::<Vec<_>>());
    assert!(copy.values().all(|(_, n)| *n == 2), "{copy:?}");
}

#[tokio::test]
async fn with_exactly_once_a_crash_after_the_sinks_commit_applies_nothing_twice() {
    // GIVEN the same crash with exactlyOnce
    let (orders, app, app_name) = mirror("sink_crash_once", json!({"exactlyOnce": true}), json!({})).await;
    orders.insert(1..=5).await;
    let crashing = app.start_handler(&[(failpoint::ENV, "after-sink")]).await;
    fire_until_crashed(&crashing).await;

    // WHEN a new process takes over
    wait_for_takeover(&app_name).await;
    let host = start(&app).await;
    fire_until_mirrored(&host, &orders, &app_name).await;

    // THEN every row was applied exactly once, and the redelivery said why it wrote nothing
    let copy = copy_rows(&orders).await;
    assert_eq!(copy.len(), 5);
    assert!(copy.values().all(|(_, n)| *n == 1), "{copy:?}");
    assert!(host.output().contains("already applied"), "{}", host.output());
}

/// What [`lose_state_mid_stream`] leaves: the copy, the rows applied before the loss, the state documents
/// before the loss and at the end, and the handler's output.
struct AfterLoss {
    copy: BTreeMap<i64, ((String, String), i32)>,
    applied_before: usize,
    /// Rows of a batch recorded in flight with the last acknowledgement before the loss: the process delivers
    /// them from memory at its next tick, before it finds the document gone.
    chained_rows: usize,
    before: sql_pseudo_trigger::engine::document::StateDoc,
    after: sql_pseudo_trigger::engine::document::StateDoc,
    output: String,
}

/// Mirrors 40 orders in batches of 7 with the state in a file: a first process applies a batch, a second
/// takes over (fencing token 2) and applies another, then the state document is deleted, and the timer fires
/// until the copy holds all 40 and nothing is in flight.
async fn lose_state_mid_stream(prefix: &str, sink_extra: Value) -> AfterLoss {
    let (orders, app, app_name) = mirror(prefix, sink_extra, json!({"maxBatchSize": 7})).await;
    for t in 0..4 {
        orders.insert(t * 10 + 1..=t * 10 + 10).await;
    }
    let dir = embedded::ScratchDir::new(prefix).expect("a state directory");
    let dir_text = dir.path().display().to_string();
    let file_state = [("Sql_Trigger_StateStore", "file"), ("Sql_Trigger_StateDirectory", dir_text.as_str())];
    let store = sql_pseudo_trigger::state::FileStore::new(dir.path());
    let mut host = app.start_handler(&file_state).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    for applied in [7, 14] {
        if applied == 14 {
            host.kill();
            host = app.start_handler(&file_state).await;
        }
        while copy_rows(&orders).await.len() < applied {
            assert!(host.run_timer(FUNCTION).await.expect("timer run").succeeded, "{}", host.output());
            assert!(Instant::now() < deadline, "{applied} rows not applied within 20 s:\n{}", host.output());
        }
    }
    let applied_before = copy_rows(&orders).await.len();
    let (before, _) = state(&store, &app_name).await;
    // Sink mode acknowledges in the tick that delivers; while a backlog drains that acknowledgement also
    // records the next batch in flight, which the process delivers at its next tick from memory.
    let chained_rows = before.in_flight().map_or(0, |f| f.range.rows as usize);
    assert!(copy_rows(&orders).await.len() + chained_rows <= 40);
    assert_eq!(before.lease().map(|l| l.token), Some(2), "the second process wrote under token 2");

    std::fs::remove_file(dir.path().join(state_key(&app_name))).expect("delete the state document");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let run = host.run_timer(FUNCTION).await.expect("timer run");
        assert!(run.succeeded, "{}", host.output());
        let settled = load_state(&store, &app_name).await.is_some_and(|(doc, _)| doc.in_flight().is_none());
        if settled && copy_rows(&orders).await.len() == 40 {
            break;
        }
        assert!(Instant::now() < deadline, "not mirrored within 20 s:\n{}", host.output());
    }
    let (after, _) = state(&store, &app_name).await;
    AfterLoss { copy: copy_rows(&orders).await, applied_before, chained_rows, before, after, output: host.output() }
}

#[tokio::test]
async fn with_exactly_once_a_state_document_deleted_mid_stream_resumes_from_the_targets_checkpoint_row() {
    // GIVEN 40 orders mirrored exactly once, startFrom earliest
    // WHEN the state document is deleted after a few batches, and the timer keeps firing
    let r = lose_state_mid_stream("sink_lost_state_once", json!({"exactlyOnce": true})).await;

    // THEN the copy holds the 40 orders, each applied exactly once: the new document started after the batch
    // the checkpoint row named, not from the beginning, and delivered exactly the rows not yet applied
    let twice: Vec<i64> = r.copy.iter().filter(|(_, (_, n))| *n != 1).map(|(id, _)| *id).collect();
    assert_eq!(r.copy.len(), 40);
    assert!(twice.is_empty(), "applied more than once: {twice:?}\n{}", r.output);
    assert_eq!(
        r.after.counters().delivered as usize,
        40 - r.applied_before - r.chained_rows,
        "{:?}",
        r.after.counters()
    );
    assert!(r.after.next_batch_id() > r.before.next_batch_id(), "batch ids continue after the recorded batch");
    assert!(r.output.contains("records batch"), "{}", r.output);
}

#[tokio::test]
async fn at_least_once_a_state_document_deleted_mid_stream_starts_over_above_the_targets_fencing_token() {
    // GIVEN the same mirror without exactlyOnce (the target records its fence, no position)
    // WHEN the state document is deleted after a few batches, and the timer keeps firing
    let r = lose_state_mid_stream("sink_lost_state_fence", json!({})).await;

    // THEN the new document (tokens restarting at 1, below the target's 2) starts over from startFrom
    // (earliest) under token 3 instead of being refused as fenced forever: the rows applied before the loss
    // (and a chained batch the old lineage delivered from memory) are applied a second time
    // (at-least-once), the others once
    assert_eq!(r.copy.len(), 40);
    let twice = r.copy.values().filter(|(_, n)| *n == 2).count();
    assert_eq!(twice, r.applied_before + r.chained_rows, "{:?}", r.copy);
    assert!(r.copy.values().all(|(_, n)| *n <= 2), "{:?}", r.copy);
    assert_eq!(r.after.counters().delivered, 40, "{:?}", r.after.counters());
    assert!(r.output.contains("holds fencing token 2, above this state document's 1"), "{}", r.output);
    assert_eq!(r.after.lease().map(|l| l.token), Some(3));
}

/// A tiny deterministic generator (xorshift), seeded per run and printed, so a failing run can be replayed.
struct Dice(u64);

impl Dice {
    fn new() -> Self {
        let seed = std::env::var("SINK_KILL_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| (uuid::Uuid::new_v4().as_u128() as u64) | 1);
        eprintln!("exactly-once kill test seed: {seed} (SINK_KILL_SEED={seed} replays it)");
        Self(seed)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[tokio::test]
async fn exactly_once_under_kill_9_at_random_points_leaves_the_exact_rows_each_applied_once() {
    // GIVEN 300 orders in 30 transactions, batches of 25, mirrored exactly once
    let (orders, app, app_name) =
        mirror("sink_kills", json!({"exactlyOnce": true, "maxRowsPerStatement": 10}), json!({"maxBatchSize": 25}))
            .await;
    for t in 0..30 {
        orders.insert(t * 10 + 1..=t * 10 + 10).await;
    }
    let mut dice = Dice::new();
    let points = ["after-fetch", "after-commit", "sink-before-commit", "after-sink"];

    // WHEN six processes in turn die: two at the points that matter most (after the sink committed, and
    // inside its transaction), then four at a random failpoint (on its 1st-3rd hit) or by SIGKILL at a random
    // moment; each takes over from the last once its lease expired
    let mut history = Vec::new();
    for round in 0..6 {
        wait_for_takeover(&app_name).await;
        let point = match round {
            0 => Some("after-sink@2".to_string()),
            1 => Some("sink-before-commit@1".to_string()),
            _ if dice.below(3) == 0 => None,
            _ => Some(format!("{}@{}", points[dice.below(4) as usize], 1 + dice.below(3))),
        };
        match point {
            None => {
                let host = start(&app).await;
                let after = Duration::from_millis(dice.below(150));
                tokio::join!(
                    async {
                        let _ = host.run_timer(FUNCTION).await;
                        let _ = host.run_timer(FUNCTION).await;
                    },
                    async {
                        tokio::time::sleep(after).await;
                        host.kill();
                    }
                );
                history.push(format!("kill -9 after {after:?}"));
            }
            Some(point) => {
                let host = app.start_handler(&[(failpoint::ENV, point.as_str())]).await;
                let deadline = Instant::now() + Duration::from_secs(5);
                while host.is_running() && Instant::now() < deadline {
                    let _ = host.run_timer(FUNCTION).await;
                }
                let crashed = !host.is_running();
                host.kill();
                history.push(format!("{point}: {}", if crashed { "aborted" } else { "not reached" }));
            }
        }
    }
    assert!(history[..2].iter().all(|h| h.ends_with("aborted")), "{history:?}");
    wait_for_takeover(&app_name).await;
    let host = start(&app).await;
    fire_until_mirrored(&host, &orders, &app_name).await;

    // THEN the copy holds exactly the 300 orders, each applied exactly once
    let copy = copy_rows(&orders).await;
    let twice: Vec<i64> = copy.iter().filter(|(_, (_, n))| *n != 1).map(|(id, _)| *id).collect();
    assert_eq!(copy.len(), 300, "crashes: {history:?}");
    assert!(twice.is_empty(), "applied more than once: {twice:?}; crashes: {history:?}");
    let (doc, _) = state(&shared_blob_store(), &app_name).await;
    assert_eq!(doc.counters().delivered, 300, "crashes: {history:?}; counters {:?}", doc.counters());
}

/// `handler run --once` on the app at `root` with its state in files under `state`; killed (and the test
/// failed) if it has not ended within 60 s, so a drain that never ends cannot hang the suite.
async fn run_once_with_file_state(root: &std::path::Path, state: &std::path::Path) -> std::process::Output {
    let run = tokio::process::Command::new(support::handler_exe())
        .args(["run", "--once", "--app-root"])
        .arg(root)
        .env("Sql_Trigger_StateStore", "file")
        .env("Sql_Trigger_StateDirectory", state)
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("handler run --once ends within 60 s")
        .expect("handler run")
}

#[tokio::test]
async fn handler_run_once_drains_into_a_postgres_sink_in_sink_mode() {
    // GIVEN orders and an app for `handler run` (no host: file state, no timer needed)
    let (orders, app, _) = mirror("sink_run", json!({"exactlyOnce": true}), json!({"maxBatchSize": 7})).await;
    orders.insert(1..=40).await;
    orders.soft_delete(5).await;
    let state = embedded::ScratchDir::new("sink-run-state").expect("a state directory");

    // WHEN `handler run --once` drains it (the guard may hold rows back briefly: run until mirrored)
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let output = run_once_with_file_state(app.root(), state.path()).await;
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        assert!(output.stdout.is_empty(), "a postgres sink prints nothing on stdout");
        let copy: BTreeMap<i64, (String, String)> =
            copy_rows(&orders).await.into_iter().map(|(k, (v, _))| (k, v)).collect();
        if copy == source_rows(&orders).await {
            break;
        }
        assert!(Instant::now() < deadline, "not mirrored within 20 s: {copy:?}");
    }

    // THEN the copy holds the 39 live orders, each written once
    let copy = copy_rows(&orders).await;
    assert_eq!(copy.len(), 39);
    assert!(!copy.contains_key(&5));
    assert!(copy.values().all(|(_, n)| *n == 1), "{copy:?}");
}

#[tokio::test]
async fn handler_run_in_deferred_mode_after_its_state_is_deleted_goes_above_the_targets_fencing_token() {
    // GIVEN `handler run --once` in deferred mode mirroring orders, state in a file, run twice (two owners:
    // the target's fence table holds token 2 or more)
    let (orders, app, app_name) =
        mirror("sink_run_lost_deferred", json!({}), json!({"deliveryMode": "deferred", "maxBatchSize": 7})).await;
    let state_dir = embedded::ScratchDir::new("sink-run-lost-state").expect("a state directory");
    let store = sql_pseudo_trigger::state::FileStore::new(state_dir.path());
    let drain = |what: &'static str| {
        let (root, dir) = (app.root().to_path_buf(), state_dir.path().to_path_buf());
        let orders = &orders;
        async move {
            // The late-commit guard may hold the newest rows back for a moment: drain until mirrored.
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let output = run_once_with_file_state(&root, &dir).await;
                let stderr = String::from_utf8_lossy(&output.stderr).to_string();
                assert!(output.status.success(), "{what}: {stderr}");
                let copy: BTreeMap<i64, (String, String)> =
                    copy_rows(orders).await.into_iter().map(|(k, (v, _))| (k, v)).collect();
                if copy == source_rows(orders).await {
                    return stderr;
                }
                assert!(Instant::now() < deadline, "{what}: not mirrored within 20 s: {copy:?}\n{stderr}");
            }
        }
    };
    orders.insert(1..=20).await;
    drain("first run").await;
    orders.insert(21..=30).await;
    drain("second run").await;
    // Each run is a new owner and takes the lease over with the next token: 2 or more by now.
    let (before, _) = state(&store, &app_name).await;
    let token = before.lease().map_or(0, |l| l.token);
    assert!(token >= 2, "two runs, two owners: {:?}", before.lease());

    // WHEN the state document is deleted (its tokens start again at 1) and the next run drains new orders
    std::fs::remove_file(state_dir.path().join(state_key(&app_name))).expect("delete the state document");
    orders.insert(31..=40).await;
    let output = drain("run after the loss").await;

    // THEN every order is mirrored, nothing was quarantined or counted as failed: the new document went above
    // the target's token once instead of being refused until MaxAttempts quarantined each batch
    let (after, _) = state(&store, &app_name).await;
    assert_eq!((after.counters().quarantined, after.counters().delivered), (0, 40), "{:?}\n{output}", after.counters());
    assert_eq!(after.lease().map(|l| l.token), Some(token + 1), "{output}");
    assert!(output.contains(&format!("holds fencing token {token}, above this state document's 1")), "{output}");
    let copy = copy_rows(&orders).await;
    assert_eq!(copy.len(), 40);
    // AND the orders applied before the loss were applied again (startFrom earliest), the others once
    assert!(copy.iter().all(|(id, (_, n))| *n == if *id <= 30 { 2 } else { 1 }), "{copy:?}");
}

/// `handler run` mirroring 3,000 orders in batches of 20 with `delivery_mode`, stopped by SIGTERM mid-drain and
/// run again with `--once`: the copy must end equal to the orders, every row written at most twice.
async fn sigterm_mid_drain_into_a_postgres_sink_loses_nothing(prefix: &str, delivery_mode: &str) {
    // GIVEN 3,000 orders mirrored into orders_copy by `handler run` (state in the shared Azurite)
    let (orders, app, app_name) = mirror(
        prefix,
        json!({}),
        json!({ "deliveryMode": delivery_mode, "maxBatchSize": 20, "pollingIntervalMs": 10 }),
    )
    .await;
    orders.insert(1..=3000).await;
    let copied = || async {
        let n: i64 = orders.db.query_one("SELECT count(*) FROM orders_copy", &[]).await.expect("count").get(0);
        n
    };

    // WHEN the runner has copied some batches and gets SIGTERM
    let mut runner = crate::runner::Runner::start(&app, &[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while copied().await < 100 {
        assert!(Instant::now() < deadline, "nothing copied within 30 s:\n{}", runner.stderr());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    runner.terminate();
    let status = runner.exit(Duration::from_secs(10)).await;

    // THEN it exits 0 before the end of the backlog, with nothing left in flight
    assert!(status.success(), "exit after SIGTERM: {status}\n{}", runner.stderr());
    let first = copied().await;
    assert!(first < 3000, "the drain finished before SIGTERM; nothing was tested");
    let (doc, _) = state(&shared_blob_store(), &app_name).await;
    assert!(doc.in_flight().is_none(), "{:?}\n{}", doc.in_flight(), runner.stderr());

    // WHEN the runner runs again with --once
    let mut again = crate::runner::Runner::start(&app, &["--once"]);
    let status = again.exit(Duration::from_secs(60)).await;
    assert!(status.success(), "{status}\n{}", again.stderr());

    // THEN the copy holds exactly the orders' rows and values, each written once or, if re-delivered, twice
    let copy = copy_rows(&orders).await;
    let values: BTreeMap<i64, (String, String)> = copy.iter().map(|(k, (v, _))| (*k, v.clone())).collect();
    assert_eq!(values, source_rows(&orders).await);
    let duplicates: i32 = copy.values().map(|(_, n)| n - 1).sum();
    assert!(copy.values().all(|(_, n)| (1..=2).contains(n)), "a row written more than twice: {copy:?}");
    assert!(duplicates <= 20, "{duplicates} duplicates: more than the one batch in hand");
    eprintln!("{delivery_mode}: SIGTERM after {first} rows; {duplicates} duplicate write(s) absorbed by the upsert");
}

#[tokio::test]
async fn handler_run_sigterm_mid_drain_into_a_postgres_sink_loses_nothing_in_deferred_mode() {
    sigterm_mid_drain_into_a_postgres_sink_loses_nothing("sink_term_deferred", "deferred").await;
}

#[tokio::test]
async fn handler_run_sigterm_mid_drain_into_a_postgres_sink_loses_nothing_in_sink_mode() {
    sigterm_mid_drain_into_a_postgres_sink_loses_nothing("sink_term_sink", "sink").await;
}

#[test]
fn a_mapping_naming_an_unknown_binding_or_shape_stops_the_handler_at_start() {
    let app = support::AppBuilder::new()
        .function(
            "Orders",
            support::timer_function_json(Some(3)),
            Some(json!({
                "source": "postgres-cursor", "tableName": "orders", "connectionStringSetting": "Pg",
                "cursorColumn": "version",
                "outputs": { "changes": { "shape": "lines" }, "audit": { "shape": "batch" } }
            })),
        )
        .function(
            "Deferred",
            support::timer_function_json(Some(3)),
            Some(json!({
                "source": "postgres-cursor", "tableName": "orders", "connectionStringSetting": "Pg",
                "cursorColumn": "version",
                "sink": { "type": "postgres", "tableName": "copy", "connectionStringSetting": "Pg", "exactlyOnce": true }
            })),
        )
        .function(
            "Mirror",
            json!({"bindings": [{ "type": "timerTrigger", "direction": "in", "name": "timer", "schedule": "* * * * * *" }]}),
            Some(json!({
                "source": "postgres-cursor", "tableName": "orders", "connectionStringSetting": "Pg",
                "cursorColumn": "version", "deliveryMode": "sink"
            })),
        )
        .write();
    let output = std::process::Command::new(support::handler_exe())
        .env("FUNCTIONS_APP_ROOT_PATH", app.root())
        .env("FUNCTIONS_CUSTOMHANDLER_PORT", "0")
        .env("Pg", "postgres://nobody@127.0.0.1:1/none")
        .output()
        .expect("the handler runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    for expected in [
        "outputs.audit in Orders/sqltrigger.json: names output binding \"audit\", which function.json does not have (its output bindings: changes)",
        "outputs.changes in Orders/sqltrigger.json: shape \"lines\" is not a shape",
        "sink in Mirror/sqltrigger.json: deliveryMode sink under the Functions host needs a sink",
        "sink in Deferred/sqltrigger.json: exactlyOnce needs deliveryMode sink",
    ] {
        assert!(stderr.contains(expected), "missing {expected:?} in:\n{stderr}");
    }
}
