//! Changing the partition count end to end: a postgres-cursor function with 4 partitions under `handler run`
//! mirrors `orders` into a PostgreSQL table while a writer keeps writing; it is stopped (SIGTERM), changed to 8
//! partitions with `handler partitions change`, its folder updated and started again: every order arrives with
//! its last values (nothing lost, nothing skipped), and the old documents are retired.

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

/// A writer on its own connection: five new orders per transaction and an update of an older one, every few
/// milliseconds, until `stop`; `next` is the next id it inserts.
fn writer(url: String, next: Arc<AtomicI64>, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
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
            db.execute("UPDATE orders SET amount = amount + 1 WHERE id = $1", &[&(first / 2 + 1)])
                .await
                .expect("update");
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
    let writing = writer(orders.url.clone(), next.clone(), stop.clone());
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

    // AND changed to 8 partitions (once the stopped process's leases expire: the command refuses until then)
    let args: Vec<String> = ["partitions", "change", FUNCTION, "--to", "8"].iter().map(|a| a.to_string()).collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    let table = loop {
        let output = handler_cli(app.root(), &args).await;
        let stderr = String::from_utf8_lossy(&output.stderr).to_string();
        if output.status.success() {
            break String::from_utf8_lossy(&output.stdout).to_string();
        }
        assert!(stderr.contains("is leased to") && stderr.contains("nothing was written"), "refused: {stderr}");
        assert!(Instant::now() < deadline, "the leases did not expire within 20 s: {stderr}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(table.contains(&format!("{FUNCTION}: partition count changed from 4 to 8")), "{table}");
    assert_eq!(table.lines().filter(|l| l.ends_with("written")).count(), 8, "{table}");
    // Each new partition j starts exactly where old partition j mod 4 stopped (4 divides 8: its keys are a subset).
    let doc = |n: u32, i: u32| {
        let (store, key) = (&store, format!("{app_name}/{FUNCTION}/partition-{i}-of-{n}.json"));
        async move {
            let stored = store.load(&key).await.expect("load").unwrap_or_else(|| panic!("{key} exists"));
            serde_json::from_slice::<Value>(&stored.bytes).expect("JSON")
        }
    };
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
