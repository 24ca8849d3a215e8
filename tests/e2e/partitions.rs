//! Partitions of a postgres-cursor function under the Functions host: the folders `handler partitions generate`
//! writes, each a timer function firing on its schedule under the strict host model while a writer inserts and
//! updates; every committed version reaches a consumer, each key's in commit order, each partition only its own
//! keys. Also the start-up check of the partition index and the plan a partition's fetch runs.

use crate::common::{orders_app, shared_blob_store, start, trigger_json, unique_app_name, Orders, FUNCTION};
use crate::support;
use serde_json::{json, Value};
use sql_pseudo_trigger::config::{Env, Partition, SourceOptions, SourceSpec};
use sql_pseudo_trigger::source::postgres::PostgresCursor;
use sql_pseudo_trigger::state::StateStore;
use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const COUNT: u32 = 4;

/// The partition expression of the orders table's key for 4 partitions, as docs/postgres.md gives it.
const EXPRESSION: &str = "((hashtextextended(id::text, 0) & 9223372036854775807) % 4)";

/// The statement the handler prints when the index is missing, for the orders table and 4 partitions.
const INDEX_DDL: &str = "CREATE INDEX CONCURRENTLY ON \"public\".\"orders\" (((hashtextextended(\"id\"::text, 0) & 9223372036854775807) % 4), \"version\", \"id\")";

/// [`INDEX_DDL`] for `count` partitions: the index every partition's fetch needs.
pub(crate) fn index_ddl(count: u32) -> String {
    INDEX_DDL.replace("% 4)", &format!("% {count})"))
}

/// Runs `handler partitions generate` on the app folder, as an operator would.
pub(crate) fn generate(app: &support::AppFolder, count: u32) -> String {
    let out = std::process::Command::new(support::handler_exe())
        .args(["partitions", "generate", FUNCTION, &count.to_string(), "--remove-original", "--app-root"])
        .arg(app.root())
        .output()
        .expect("the handler runs");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "generate failed: {}{stdout}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// The partition PostgreSQL puts each order in.
async fn partition_of(orders: &Orders) -> BTreeMap<i64, u32> {
    let rows =
        orders.db.query(&format!("SELECT id, {EXPRESSION}::int4 FROM orders"), &[]).await.expect("partition query");
    rows.iter().map(|r| (r.get::<_, i64>(0), r.get::<_, i32>(1) as u32)).collect()
}

/// `(id, amount)` of a delivered message (the writer counts versions in `amount`).
fn version(m: &Value) -> (i64, i64) {
    let id = m["Item"]["id"].as_i64().unwrap_or_else(|| panic!("no Item.id in {m}"));
    let amount = m["Item"]["amount"].as_f64().unwrap_or_else(|| panic!("no Item.amount in {m}"));
    (id, amount as i64)
}

/// Inserts and updates orders over many keys in small transactions: new keys at version 1, updates adding 1.
/// Returns every committed `(id, version)`.
async fn write_orders(url: String, rounds: i64) -> Vec<(i64, i64)> {
    let db = testbed::embedded::connect(&url).await.expect("writer connects");
    let mut committed = Vec::new();
    let mut seed: u64 = 0x5eed;
    for round in 0..rounds {
        let new: Vec<i64> = (round * 10 + 1..=round * 10 + 10).collect();
        db.execute(
            "INSERT INTO orders (id, customer, amount) SELECT i, 'c' || i, 1 FROM unnest($1::bigint[]) AS i",
            &[&new],
        )
        .await
        .expect("insert");
        committed.extend(new.iter().map(|id| (*id, 1)));
        // Updates of keys written so far, some of them several times over the run.
        let mut picked = BTreeSet::new();
        for _ in 0..8 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            picked.insert((seed >> 33) as i64 % (round * 10 + 10) + 1);
        }
        let picked: Vec<i64> = picked.into_iter().collect();
        let rows = db
            .query("UPDATE orders SET amount = amount + 1 WHERE id = ANY($1) RETURNING id, amount::int8", &[&picked])
            .await
            .expect("update");
        committed.extend(rows.iter().map(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1))));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    committed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_partition_functions_on_their_schedules_deliver_every_change_of_their_own_keys_in_key_order() {
    // GIVEN the orders table with its partition index, and four partition folders generated from one function
    let orders = Orders::new("partitions").await;
    orders.db.batch_execute(INDEX_DDL).await.expect("create the partition index");
    let app_name = unique_app_name("partitions");
    let app = orders_app(&orders, &app_name, json!({"maxBatchSize": 25}), &[]);
    let printed = generate(&app, COUNT);
    assert!(printed.contains("OrdersChanged-p3"), "{printed}");
    let functions: Vec<String> = (0..COUNT).map(|i| format!("{FUNCTION}-p{i}")).collect();
    let host = start(&app).await;

    // WHEN each partition's timer fires on its schedule (simulated time, as the listener paces it) while a
    // writer inserts and updates keys concurrently, and then until every key's last version is delivered
    let (committed, by_function) = fire_under_writer(&host, &orders, &functions, 40).await;

    // THEN every key and its last version were delivered, each key's versions in commit order
    assert_every_last_version_in_key_order(&host, &committed);
    // ... each partition only its own keys, and every partition some
    let partition = partition_of(&orders).await;
    for (i, f) in functions.iter().enumerate() {
        let messages = &by_function[f];
        assert!(!messages.is_empty(), "{f} delivered nothing");
        for m in messages {
            let (id, _) = version(m);
            assert_eq!(partition[&id], i as u32, "{f} delivered order {id} of partition {}", partition[&id]);
        }
    }
    // ... and each partition's state is its own document under the group's name, the original's absent
    let store = shared_blob_store();
    for i in 0..COUNT {
        let key = format!("{app_name}/{FUNCTION}/partition-{i}-of-{COUNT}.json");
        assert!(store.load(&key).await.expect("state store").is_some(), "no state document {key}");
    }
    assert!(store.load(&format!("{app_name}/{FUNCTION}.json")).await.expect("state store").is_none());
    assert!(!host.output().contains("no index serves"), "{}", host.output());
}

/// Fires each of `functions`' timers on its schedule (simulated time, as the listener paces it) while a writer
/// writes `rounds` rounds of orders ([`write_orders`]), then every timer until the last version of every key is
/// delivered (the xid8 guard may hold the last writes back while another transaction of the cluster runs).
/// Every firing must succeed. Returns every committed `(id, version)` and each function's messages.
pub(crate) async fn fire_under_writer(
    host: &testbed::driver::HostDriver,
    orders: &Orders,
    functions: &[String],
    rounds: i64,
) -> (Vec<(i64, i64)>, BTreeMap<String, Vec<Value>>) {
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let done = Arc::clone(&done);
        let url = orders.url.clone();
        tokio::spawn(async move {
            let committed = write_orders(url, rounds).await;
            done.store(true, Ordering::SeqCst);
            committed
        })
    };
    let start_at = time::OffsetDateTime::now_utc();
    let timers = futures::future::join_all(functions.iter().map(|f| {
        let done = Arc::clone(&done);
        async move {
            host.run_schedule(f, start_at, Duration::from_secs(3600), move |firing| {
                done.load(Ordering::SeqCst) && firing.run.applied.get("changes").is_none_or(Vec::is_empty)
            })
            .await
            .unwrap_or_else(|e| panic!("{f} fires: {e}"))
        }
    }))
    .await;
    let committed = writer.await.expect("writer");
    let mut by_function: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for (f, paced) in functions.iter().zip(&timers) {
        assert!(paced.firings.len() > 1, "{f} fired {} times", paced.firings.len());
        for firing in &paced.firings {
            assert!(firing.run.succeeded, "{f}: {:?}\n{}", firing.run.attempts.last(), host.output());
            by_function
                .entry(f.clone())
                .or_default()
                .extend(firing.run.applied.get("changes").cloned().unwrap_or_default());
        }
    }
    let last = last_versions(&committed);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen: BTreeSet<(i64, i64)> = host.delivered("changes").iter().map(version).collect();
        if last.iter().all(|(id, v)| seen.contains(&(*id, *v))) {
            break;
        }
        assert!(Instant::now() < deadline, "not everything delivered within 20 s\n{}", host.output());
        for f in functions {
            let run = host.run_timer(f).await.expect("timer run");
            assert!(run.succeeded, "{f}: {:?}", run.attempts.last());
            by_function.entry(f.clone()).or_default().extend(run.applied.get("changes").cloned().unwrap_or_default());
        }
    }
    (committed, by_function)
}

/// Every key written and its last version were delivered, nothing that was not committed, and each key's
/// versions in commit order (a re-delivered version may come again, never an older one).
pub(crate) fn assert_every_last_version_in_key_order(host: &testbed::driver::HostDriver, committed: &[(i64, i64)]) {
    let last = last_versions(committed);
    let delivered: Vec<(i64, i64)> = host.delivered("changes").iter().map(version).collect();
    let delivered_set: BTreeSet<(i64, i64)> = delivered.iter().copied().collect();
    let committed_set: BTreeSet<(i64, i64)> = committed.iter().copied().collect();
    assert_eq!(delivered.iter().map(|(id, _)| *id).collect::<BTreeSet<_>>(), last.keys().copied().collect());
    assert!(
        delivered_set.is_subset(&committed_set),
        "delivered versions never committed: {:?}",
        &delivered_set - &committed_set
    );
    let last_set: BTreeSet<(i64, i64)> = last.iter().map(|(id, v)| (*id, *v)).collect();
    assert!(last_set.is_subset(&delivered_set), "last versions missing: {:?}", &last_set - &delivered_set);
    // ... each key's versions in commit order (a re-delivered version may come again, never an older one)
    let mut newest: BTreeMap<i64, i64> = BTreeMap::new();
    for (id, v) in &delivered {
        let before = newest.insert(*id, *v).unwrap_or(0);
        assert!(*v >= before, "order {id}: version {v} delivered after version {before}");
    }
}

/// The last committed version of each key.
fn last_versions(committed: &[(i64, i64)]) -> BTreeMap<i64, i64> {
    committed.iter().fold(BTreeMap::new(), |mut m, (id, v)| {
        let e = m.entry(*id).or_insert(*v);
        *e = (*e).max(*v);
        m
    })
}

/// Waits until the handler's start-up check of each of `functions` has finished (passed or failed).
async fn wait_for_start_up_checks(host: &testbed::driver::HostDriver, functions: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let output = host.output();
        if output.matches("start-up check").count() >= functions {
            return output;
        }
        assert!(Instant::now() < deadline, "start-up checks not done within 15 s:\n{output}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_partition_index_is_named_once_at_start_up_with_the_statement_that_creates_it() {
    // GIVEN four partition folders over an orders table that has only the (version, id) index
    let orders = Orders::new("partition-index").await;
    orders.insert(1..=50).await;
    let app = orders_app(&orders, &unique_app_name("partition-index"), json!({}), &[]);
    generate(&app, COUNT);

    // WHEN the handler starts
    let host = start(&app).await;
    let output = wait_for_start_up_checks(&host, COUNT as usize).await;

    // THEN one warning (not one per partition) names the statement and what a fetch costs without it
    assert_eq!(output.matches("no index serves").count(), 1, "{output}");
    assert_eq!(output.matches(INDEX_DDL).count(), 1, "{output}");
    assert!(output.contains("about 4 times the rows of a batch"), "{output}");
    assert_eq!(
        output.matches("start-up check passed").count(),
        COUNT as usize,
        "the check warns, never refuses:\n{output}"
    );
    host.terminate().await.expect("stops");

    // WHEN the index exists and the handler starts again
    orders.db.batch_execute(INDEX_DDL).await.expect("create the partition index");
    let host = start(&app).await;
    let output = wait_for_start_up_checks(&host, COUNT as usize).await;
    // THEN no warning
    assert!(!output.contains("no index serves"), "{output}");
}

/// The partition source of the orders table as the handler builds it.
fn partition_source(orders: &Orders, index: u32) -> PostgresCursor {
    let env = Env::from_pairs([("PostgresConnectionString".to_string(), orders.url.clone())]);
    let mut spec = SourceSpec::from_json(&trigger_json(json!({})), &env).unwrap_or_else(|e| panic!("spec: {e}"));
    spec.partition = Partition::new(index, NonZeroU32::new(COUNT).expect("count"));
    new_cursor(spec)
}

/// A cursor source built from `spec` as the handler builds it (`app.rs`): with its kind's options.
fn new_cursor(spec: SourceSpec) -> PostgresCursor {
    let SourceOptions::PostgresCursor(options) = spec.options.clone() else { panic!("{:?}", spec.options) };
    PostgresCursor::new(spec, options, &Default::default()).expect("source")
}

/// Every node of a plan, depth first.
fn nodes(plan: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    let mut stack = vec![&plan[0]["Plan"]];
    while let Some(n) = stack.pop() {
        out.push(n);
        stack.extend(n.get("Plans").and_then(Value::as_array).into_iter().flatten());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_partition_index_a_partition_fetch_is_one_index_range_scan_without_sort() {
    // GIVEN 20,000 orders written by 200 transactions (so the cursor varies as it does in a live table),
    // analyzed, and the partition index beside the (version, id) one
    let orders = Orders::new("partition-plan").await;
    for t in 0..200 {
        orders.insert(t * 100 + 1..=t * 100 + 100).await;
    }
    orders.db.batch_execute(INDEX_DDL).await.expect("create the partition index");
    orders.db.batch_execute("ANALYZE orders").await.expect("analyze");
    let source = partition_source(&orders, 2);
    let row = orders
        .db
        .query_one("SELECT version::text, id::text FROM orders ORDER BY version, id OFFSET 10000 LIMIT 1", &[])
        .await
        .expect("a position");
    let after = json!([row.get::<_, String>(0), row.get::<_, String>(1)]);

    // WHEN PostgreSQL plans the fetch after a position in the middle of the table, and the first fetch
    for (what, position, keyset) in [("after a position", after, true), ("from the beginning", Value::Null, false)] {
        let plan = source.explain_fetch(&position, 100).await.unwrap_or_else(|e| panic!("explain: {e}"));
        let all = nodes(&plan);
        // THEN one index scan of the partition index bounds the partition and (after a position) the row-value
        // keyset in its Index Cond, with no filter on the partition and no sort above it
        let scan = all
            .iter()
            .find(|n| n["Node Type"] == "Index Scan")
            .unwrap_or_else(|| panic!("{what}: no index scan in {plan:#}"));
        let cond = scan["Index Cond"].as_str().unwrap_or_default();
        assert!(cond.contains("hashtextextended"), "{what}: partition not in the Index Cond: {plan:#}");
        if keyset {
            assert!(cond.contains("ROW(version, id) >"), "{what}: keyset not in the Index Cond: {plan:#}");
        }
        assert!(
            !scan.get("Filter").and_then(Value::as_str).unwrap_or_default().contains("hashtextextended"),
            "{what}: {plan:#}"
        );
        assert!(!all.iter().any(|n| n["Node Type"].as_str().unwrap_or_default().contains("Sort")), "{what}: {plan:#}");
        assert!(!all.iter().any(|n| n["Node Type"] == "Seq Scan"), "{what}: {plan:#}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_index_without_statistics_is_named_with_analyze_and_after_analyze_the_fetch_is_a_range_scan() {
    // GIVEN 40,000 orders written by 400 transactions with autovacuum off (as after a bulk load, before
    // autovacuum's turn), and the partition index created before the load, so PostgreSQL has no statistics on
    // its expression
    let orders = Orders::new("partition-analyze").await;
    orders.db.batch_execute("ALTER TABLE orders SET (autovacuum_enabled = off)").await.expect("autovacuum off");
    orders.db.batch_execute(INDEX_DDL).await.expect("create the partition index");
    for t in 0..400 {
        orders.insert(t * 100 + 1..=t * 100 + 100).await;
    }
    let app = orders_app(&orders, &unique_app_name("partition-analyze"), json!({}), &[]);
    generate(&app, COUNT);
    let source = partition_source(&orders, 3);
    let range_scan = |plan: &Value| {
        let all = nodes(plan);
        let cond = |n: &&Value| n["Index Cond"].as_str().unwrap_or_default().contains("hashtextextended");
        all.iter().any(cond) && !all.iter().any(|n| n["Node Type"].as_str().unwrap_or_default().contains("Sort"))
    };

    // WHEN PostgreSQL plans the partition's first fetch before ANALYZE, and the handler starts
    let before = source.explain_fetch(&Value::Null, 100).await.unwrap_or_else(|e| panic!("explain: {e}"));
    let host = start(&app).await;
    let output = wait_for_start_up_checks(&host, COUNT as usize).await;
    host.terminate().await.expect("stops");

    // THEN the fetch is no range scan of the partition index, and the handler names the index and ANALYZE, once,
    // not the statement that creates an index which exists
    assert!(!range_scan(&before), "before ANALYZE: {before:#}");
    let advice = "exists but PostgreSQL does not use it";
    assert_eq!(output.matches(advice).count(), 1, "{output}");
    assert!(output.contains("no statistics on the partition expression"), "{output}");
    assert!(output.contains("Run ANALYZE public.orders"), "{output}");
    assert!(!output.contains("no index serves") && !output.contains(INDEX_DDL), "{output}");

    // WHEN the operator runs ANALYZE, and the handler starts again
    orders.db.batch_execute("ANALYZE orders").await.expect("analyze");
    let after = source.explain_fetch(&Value::Null, 100).await.unwrap_or_else(|e| panic!("explain: {e}"));
    let host = start(&app).await;
    let output = wait_for_start_up_checks(&host, COUNT as usize).await;
    host.terminate().await.expect("stops");

    // THEN the fetch is one range scan of the partition index, and nothing is said
    assert!(range_scan(&after), "after ANALYZE: {after:#}");
    assert!(!output.contains(advice) && !output.contains("no index serves"), "{output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_partition_index_is_named_with_the_statements_that_rebuild_it() {
    // GIVEN the partition index, left invalid as a cancelled CREATE INDEX CONCURRENTLY leaves it
    let orders = Orders::new("partition-invalid").await;
    orders.insert(1..=50).await;
    orders.db.batch_execute(INDEX_DDL).await.expect("create the partition index");
    orders
        .db
        .batch_execute(
            "UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'orders_expr_version_id_idx'::regclass",
        )
        .await
        .expect("mark the index invalid");
    let app = orders_app(&orders, &unique_app_name("partition-invalid"), json!({}), &[]);
    generate(&app, COUNT);

    // WHEN the handler starts
    let host = start(&app).await;
    let output = wait_for_start_up_checks(&host, COUNT as usize).await;
    host.terminate().await.expect("stops");

    // THEN one warning names the index as invalid and the statements that drop it and create it again
    assert_eq!(output.matches("is invalid").count(), 1, "{output}");
    assert!(output.contains(&format!("DROP INDEX CONCURRENTLY orders_expr_version_id_idx; {INDEX_DDL}")), "{output}");
    assert!(!output.contains("no index serves") && !output.contains("Run ANALYZE"), "{output}");
}

/// Partitions that stopped inside one transaction's rows hold one cursor value with different keys; a merge
/// starts one unit of the cursor before it. A cursor column that keeps fewer fractional digits than a
/// microsecond (`timestamptz(3)`) rounds a microsecond less back up to the value itself, which started the merged
/// partition at one of the tied checkpoints and skipped the keys of the other below it.
#[tokio::test]
async fn tied_checkpoints_of_a_millisecond_timestamp_cursor_merge_strictly_before_them() {
    // GIVEN a cursor source over a table whose cursor column keeps milliseconds
    let url = support::fixture().fresh_database("merge_ms").await;
    let db = testbed::embedded::connect(&url).await.expect("connect");
    db.batch_execute("CREATE TABLE public.events (id bigint PRIMARY KEY, updated_at timestamptz(3) NOT NULL)")
        .await
        .expect("the table");
    let env = Env::from_pairs([("PostgresConnectionString".to_string(), url.clone())]);
    let trigger = json!({
        "source": "postgres-cursor", "tableName": "public.events", "connectionStringSetting": "PostgresConnectionString",
        "cursorColumn": "updated_at", "startFrom": "earliest"
    });
    let spec = SourceSpec::from_json(&trigger, &env).unwrap_or_else(|e| panic!("spec: {e}"));
    let source = new_cursor(spec);

    // WHEN two old partitions stopped at one cursor value, at keys 12 and 4, merge
    let cursor = "2026-01-01 00:00:00.123+00";
    let start =
        sql_pseudo_trigger::source::Source::no_later_than(&source, &[json!([cursor, "12"]), json!([cursor, "4"])])
            .await
            .expect("the database orders them")
            .expect("a position before them");

    // THEN the start's cursor is strictly before that value as the column holds it: no key of it is skipped
    let stepped = start[0].as_str().unwrap_or_else(|| panic!("a cursor text: {start}")).to_string();
    let before: bool = db
        .query_one("SELECT ($1::text)::timestamptz(3) < ($2::text)::timestamptz(3)", &[&stepped, &cursor])
        .await
        .expect("compare")
        .get(0);
    assert!(before, "the merged partition starts at {start}, not before {cursor}: the keys below 12 at it are skipped");
}
