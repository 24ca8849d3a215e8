//! Changing the partition count end to end: a postgres-cursor function with 4 partitions under `handler run`
//! mirrors `orders` into a PostgreSQL table while a writer keeps writing; it is stopped (SIGTERM), changed to 8
//! partitions with `handler partitions change`, its folder updated and started again: every order arrives with
//! its last values (nothing lost, nothing skipped), and the old documents are retired. And back the other way,
//! 8 → 4, with the partitions stopped inside one transaction that spans them all.

use crate::common::*;
use crate::operations::handler_cli;
use crate::runner::Runner;
use crate::support;
use serde_json::{json, Value};
use sql_pseudo_trigger::state::StateStore;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use testbed::embedded;

const COPY_TABLE: &str = "CREATE TABLE public.orders_copy (
    id bigint PRIMARY KEY, customer text NOT NULL, amount numeric(12, 2) NOT NULL)";

/// id -> (customer, amount) of `table`.
async fn rows(db: &tokio_postgres::Client, table: &str) -> BTreeMap<i64, (String, String)> {
    let rows = db.query(&format!("SELECT id, customer, amount::text FROM {table}"), &[]).await.expect(table);
    rows.iter().map(|r| (r.get(0), (r.get(1), r.get(2)))).collect()
}

/// One older order, by the writer's next id `$1`.
const UPDATE_ONE: &str = "UPDATE orders SET amount = amount + 1 WHERE id = $1";
/// Every 40th order, by the writer's next id `$1`: one transaction whose rows lie in every partition.
const UPDATE_SPANNING: &str = "UPDATE orders SET amount = amount + 1 WHERE id % 40 = $1::bigint % 40";

/// A writer on its own connection: five new orders per transaction and then `update` (`UPDATE_*`), every few
/// milliseconds, until `stop`; `next` is the next id it inserts.
fn writer(
    url: String,
    next: Arc<AtomicI64>,
    stop: Arc<AtomicBool>,
    update: &'static str,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let db = embedded::connect(&url).await.expect("the writer connects");
        while !stop.load(Ordering::Relaxed) {
            let first = next.fetch_add(5, Ordering::Relaxed);
            db.execute(
                "INSERT INTO orders (id, customer, amount) SELECT i, 'c' || i, i * 1.25 FROM generate_series($1::bigint, $1 + 4) AS i",
                &[&first],
            )
            .await
            .expect("insert");
            db.execute(update, &[&(first / 2 + 1)]).await.expect("update");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}

/// Sets `"partitions"` in the function's sqltrigger.json.
fn set_partitions(app: &support::AppFolder, n: u32) {
    let path = app.root().join(FUNCTION).join("sqltrigger.json");
    let mut trigger: Value = serde_json::from_slice(&std::fs::read(&path).expect("sqltrigger.json")).expect("JSON");
    trigger["partitions"] = json!(n);
    std::fs::write(&path, serde_json::to_vec_pretty(&trigger).expect("JSON")).expect("write sqltrigger.json");
}

/// Partition `i` of `n`'s state document, as stored.
async fn state_doc(store: &impl StateStore, app_name: &str, n: u32, i: u32) -> Value {
    let key = format!("{app_name}/{FUNCTION}/partition-{i}-of-{n}.json");
    let stored = store.load(&key).await.expect("load").unwrap_or_else(|| panic!("{key} exists"));
    serde_json::from_slice::<Value>(&stored.bytes).expect("JSON")
}

/// Waits until `done` holds for the rows of `orders` and `orders_copy`, at most `limit`.
async fn wait_for_copy(
    orders: &Orders,
    limit: Duration,
    what: &str,
    runner: &Runner,
    done: impl Fn(&BTreeMap<i64, (String, String)>, &BTreeMap<i64, (String, String)>) -> bool,
) {
    let deadline = Instant::now() + limit;
    loop {
        let (source, copy) = (rows(&orders.db, "orders").await, rows(&orders.db, "orders_copy").await);
        if done(&source, &copy) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} not reached within {limit:?}: {} orders, {} copied\n{}",
            source.len(),
            copy.len(),
            runner.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn four_partitions_changed_to_eight_with_a_writer_running_lose_and_skip_nothing() {
    // GIVEN orders mirrored by a function with 4 partitions under `handler run`, a backlog, and a writer running
    let orders = Orders::new("repartition").await;
    orders.db.batch_execute(COPY_TABLE).await.expect("create orders_copy");
    let app_name = unique_app_name("repartition");
    let sink = json!({ "type": "postgres", "tableName": "public.orders_copy", "connectionStringSetting": "TargetDb" });
    let trigger = json!({
        "partitions": 4, "sink": sink, "columns": ["id", "customer", "amount"], "leaseDurationMs": 1000,
        "pollingIntervalMs": 10, "maxBatchSize": 20
    });
    let app = orders_app(&orders, &app_name, trigger, &[("TargetDb", orders.url.as_str())]);
    orders.insert(1..=400).await;
    let (next, stop) = (Arc::new(AtomicI64::new(401)), Arc::new(AtomicBool::new(false)));
    let writing = writer(orders.url.clone(), next.clone(), stop.clone(), UPDATE_ONE);
    let mut runner = Runner::start(&app, &[]);
    wait_for_copy(&orders, Duration::from_secs(60), "300 orders copied", &runner, |_, copy| copy.len() >= 300).await;
    // AND every partition ran (the process claims them one balancing cycle at a time), so each has a checkpoint
    let store = shared_blob_store();
    let deadline = Instant::now() + Duration::from_secs(60);
    for i in 0..4 {
        let key = format!("{app_name}/{FUNCTION}/partition-{i}-of-4.json");
        while store.load(&key).await.expect("load").is_none() {
            assert!(Instant::now() < deadline, "partition {i} never ran within 60 s:\n{}", runner.stderr());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // WHEN it is stopped with SIGTERM, mid-stream
    runner.terminate();
    let status = runner.exit(Duration::from_secs(30)).await;
    assert!(status.success(), "handler run exits cleanly on SIGTERM ({status}):\n{}", runner.stderr());
    let stopped_at = rows(&orders.db, "orders_copy").await.len();

    // AND changed to 8 partitions right away (SIGTERM released every lease the process held)
    let args: Vec<String> = ["partitions", "change", FUNCTION, "--to", "8"].iter().map(|a| a.to_string()).collect();
    let output = handler_cli(app.root(), &args).await;
    let table = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(output.status.success(), "refused: {}", String::from_utf8_lossy(&output.stderr));
    assert!(table.contains(&format!("{FUNCTION}: partition count changed from 4 to 8")), "{table}");
    assert_eq!(table.lines().filter(|l| l.ends_with("written")).count(), 8, "{table}");
    // Each new partition j starts exactly where old partition j mod 4 stopped (4 divides 8: its keys are a subset).
    let doc = |n: u32, i: u32| state_doc(&store, &app_name, n, i);
    for j in 0..8 {
        let (new, old) = (doc(8, j).await, doc(4, j % 4).await);
        assert_eq!(new["checkpoint"], old["checkpoint"], "new partition {j} starts where old {} stopped", j % 4);
        assert!(new["next_batch_id"].as_u64() >= old["next_batch_id"].as_u64(), "batch ids go on: {new}");
    }

    // AND the folder says 8 partitions, and the function starts again, the writer still running
    set_partitions(&app, 8);
    let mut runner = Runner::start(&app, &[]);
    wait_for_copy(&orders, Duration::from_secs(60), "more orders copied", &runner, |_, copy| {
        copy.len() > stopped_at + 100
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    writing.await.expect("the writer ran");

    // THEN every order arrives with its last values: nothing lost, nothing skipped
    wait_for_copy(&orders, Duration::from_secs(90), "the copy equal to the orders", &runner, |source, copy| {
        source == copy
    })
    .await;
    let written = next.load(Ordering::Relaxed) - 1;
    assert_eq!(rows(&orders.db, "orders_copy").await.len() as i64, written, "every order written is copied");
    runner.terminate();
    runner.exit(Duration::from_secs(30)).await;

    // AND the 4 old documents are retired, and the 8 new ones carry the function on
    for i in 0..4 {
        let old = doc(4, i).await;
        let halted = old["halted"].as_str().unwrap_or_default();
        assert!(halted.starts_with("re-partitioned into 8 partitions"), "old partition {i}: {halted}");
    }
    for j in 0..8 {
        let new = doc(8, j).await;
        assert_eq!(new["seeded"]["from_partitions"], 4, "new partition {j}: {new}");
        assert!(new["halted"].is_null() && new["counters"]["batches"].as_u64() > Some(0), "new partition {j}: {new}");
    }
}

/// The cursor (an xid8's text) of a stored checkpoint `[cursor, id]`, as a number (`None`: `null`, before
/// everything).
fn cursor_of(checkpoint: &Value) -> Option<u64> {
    checkpoint[0].as_str()?.parse().ok()
}

#[tokio::test]
async fn eight_partitions_stopped_inside_one_transaction_change_to_four_at_once_and_lose_nothing() {
    // GIVEN orders mirrored by a function with 8 partitions under `handler run`, small batches, a lease far longer
    // than the test waits, and a writer whose updates span the partitions
    let orders = Orders::new("repartition-merge").await;
    orders.db.batch_execute(COPY_TABLE).await.expect("create orders_copy");
    let app_name = unique_app_name("repartition-merge");
    let sink = json!({ "type": "postgres", "tableName": "public.orders_copy", "connectionStringSetting": "TargetDb" });
    let trigger = json!({
        "partitions": 8, "sink": sink, "columns": ["id", "customer", "amount"], "leaseDurationMs": 120000,
        "pollingIntervalMs": 10, "maxBatchSize": 5
    });
    let app = orders_app(&orders, &app_name, trigger, &[("TargetDb", orders.url.as_str())]);
    orders.insert(1..=400).await;
    let (next, stop) = (Arc::new(AtomicI64::new(401)), Arc::new(AtomicBool::new(false)));
    let writing = writer(orders.url.clone(), next.clone(), stop.clone(), UPDATE_SPANNING);
    let mut runner = Runner::start(&app, &[]);
    wait_for_copy(&orders, Duration::from_secs(90), "400 orders copied", &runner, |_, copy| copy.len() >= 400).await;
    stop.store(true, Ordering::Relaxed);
    writing.await.expect("the writer ran");

    // AND one transaction updating every order, whose rows each of the 8 partitions is delivering when it stops
    orders.db.batch_execute("UPDATE orders SET amount = amount + 1").await.expect("update every order");
    let row = orders.db.query_one("SELECT DISTINCT version::text FROM orders", &[]).await.expect("one version");
    let x: u64 = row.get::<_, String>(0).parse().expect("an xid8");
    let store = shared_blob_store();
    let deadline = Instant::now() + Duration::from_secs(90);
    for i in 0..8 {
        let key = format!("{app_name}/{FUNCTION}/partition-{i}-of-8.json");
        while store.load(&key).await.expect("load").is_none()
            || cursor_of(&state_doc(&store, &app_name, 8, i).await["checkpoint"]) != Some(x)
        {
            assert!(Instant::now() < deadline, "partition {i} did not reach transaction {x}:\n{}", runner.stderr());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    // WHEN it is stopped with SIGTERM and changed to 4 partitions right away
    runner.terminate();
    let status = runner.exit(Duration::from_secs(30)).await;
    assert!(status.success(), "handler run exits cleanly on SIGTERM ({status}):\n{}", runner.stderr());
    let args: Vec<String> = ["partitions", "change", FUNCTION, "--to", "4"].iter().map(|a| a.to_string()).collect();
    let output = handler_cli(app.root(), &args).await;

    // THEN the change is made at the first attempt: SIGTERM released every lease, and the checkpoints of one
    // transaction are no reason to refuse
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "partitions change refused:\n{stderr}\n{stdout}");
    assert!(stdout.contains(&format!("{FUNCTION}: partition count changed from 8 to 4")), "{stdout}");
    // AND each new partition j starts one cursor unit before the transaction both its old partitions (j, j + 4)
    // stopped in, so none of that transaction's rows is skipped
    for j in 0..4 {
        let (new, a, b) = (
            state_doc(&store, &app_name, 4, j).await,
            state_doc(&store, &app_name, 8, j).await,
            state_doc(&store, &app_name, 8, j + 4).await,
        );
        let old = (cursor_of(&a["checkpoint"]), cursor_of(&b["checkpoint"]));
        assert_eq!(old, (Some(x), Some(x)), "old partitions {j}, {}", j + 4);
        assert_eq!(cursor_of(&new["checkpoint"]), Some(x - 1), "new partition {j}: {new}");
        assert_eq!(new["seeded"]["from"], json!([j, j + 4]), "new partition {j}: {new}");
    }

    // WHEN the folder says 4 partitions and the function starts again, the spanning writer running
    set_partitions(&app, 4);
    stop.store(false, Ordering::Relaxed);
    let writing = writer(orders.url.clone(), next.clone(), stop.clone(), UPDATE_SPANNING);
    let mut runner = Runner::start(&app, &[]);
    let stopped_at = next.load(Ordering::Relaxed);
    wait_for_copy(&orders, Duration::from_secs(90), "orders written after the restart copied", &runner, |_, copy| {
        copy.keys().next_back().is_some_and(|last| *last > stopped_at + 50)
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    writing.await.expect("the writer ran");

    // THEN the copy is exactly the orders, each with its last values: nothing lost, nothing skipped
    wait_for_copy(&orders, Duration::from_secs(90), "the copy equal to the orders", &runner, |source, copy| {
        source == copy
    })
    .await;
    let written = next.load(Ordering::Relaxed) - 1;
    assert_eq!(
        rows(&orders.db, "orders_copy").await.keys().copied().collect::<Vec<_>>(),
        (1..=written).collect::<Vec<_>>()
    );
    runner.terminate();
    runner.exit(Duration::from_secs(30)).await;
}
