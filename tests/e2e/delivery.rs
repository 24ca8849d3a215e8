//! Changes reach the output bindings in the official trigger's payload shape, in order, in bounded batches.

use crate::common::*;
use serde_json::json;

#[tokio::test]
async fn delivers_inserts_updates_and_soft_deletes_in_the_official_payload_shape() {
    // GIVEN three new orders
    let orders = Orders::new("shape").await;
    let app = orders_app(&orders, &unique_app_name("shape"), json!({}), &[]);
    let host = start(&app).await;
    orders.insert(1..=3).await;

    // WHEN the timer fires
    let first = fire_until_delivered(&host, FUNCTION).await;

    // THEN the queue binding gets three inserts with every column, numerics as the host re-serializes them: the
    // handler sends numeric(12, 2) exactly ("2.50"), the host's Newtonsoft writes the double 2.5 (docs/values.md)
    assert_eq!(ops(&first), vec![(0, 1), (0, 2), (0, 3)]);
    assert_eq!(first[0]["Item"]["amount"].to_string(), "1.25");
    let received = host.received("changes");
    assert!(received[1].text().contains("\n    \"amount\": 2.5,\n"), "{}", received[1].text());
    let item = &first[0]["Item"];
    for column in ["id", "customer", "amount", "placed_at", "deleted", "created_version", "version"] {
        assert!(item.get(column).is_some(), "column {column} missing from {item}");
    }

    // WHEN order 2 is updated and order 3 soft-deleted
    orders.set_amount(2, "1234567890.12").await;
    orders.soft_delete(3).await;
    let changes = fire_until_delivered(&host, FUNCTION).await;

    // THEN one update and one delete carrying only the key arrive
    assert_eq!(ops(&changes), vec![(1, 2), (2, 3)]);
    assert_eq!(changes[0]["Item"]["amount"].to_string(), "1234567890.12");
    assert!(
        host.received("changes")[3].text().contains("\n    \"amount\": 1234567890.12,\n"),
        "12 digits survive a double"
    );
    assert_eq!(changes[1]["Item"], json!({"id": 3}));

    // AND a tick with nothing new sends no output at all
    let third = host.invoke(FUNCTION, None).await.expect("invoke");
    assert!(third.outputs.is_empty(), "{}", third.body);
}

#[tokio::test]
async fn max_batch_size_gives_each_invocation_at_most_n_rows_and_splits_a_large_transaction() {
    // GIVEN 25 orders written by one transaction (one cursor value) and a batch size of 10
    let orders = Orders::new("batch").await;
    let app = orders_app(&orders, &unique_app_name("batch"), json!({"maxBatchSize": 10}), &[]);
    let host = start(&app).await;
    orders.insert(1..=25).await;

    // WHEN the timer fires until nothing is left
    let mut sizes = vec![fire_until_delivered(&host, FUNCTION).await.len()];
    loop {
        let run = host.run_timer(FUNCTION).await.expect("timer");
        let n = run.applied.get("changes").map_or(0, Vec::len);
        if n == 0 {
            break;
        }
        sizes.push(n);
    }

    // THEN the batches are 10, 10, 5 and every order arrived exactly once
    assert_eq!(sizes, vec![10, 10, 5]);
    let (seen, counts) = tally(&host.delivered("changes"));
    assert_eq!(seen, ids(1..=25));
    assert!(counts.values().all(|&c| c == 1), "{counts:?}");
}

#[tokio::test]
async fn a_host_retry_redelivers_the_identical_batch_and_the_next_invocation_acknowledges_it() {
    let orders = Orders::new("retry").await;
    let app = orders_app(&orders, &unique_app_name("retry"), json!({}), &[]);
    let host = start(&app).await;
    orders.insert(1..=4).await;

    // GIVEN a batch answered to the host
    let mut first = host.invoke(FUNCTION, None).await.expect("invoke");
    while !first.outputs.contains_key("changes") {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        first = host.invoke(FUNCTION, None).await.expect("invoke");
    }
    // WHEN the host retries (its output write failed)
    let retry = host.retry(FUNCTION, 1, &first).await.expect("invoke");
    // THEN the retry carries the identical batch
    assert_eq!(retry.outputs["changes"], first.outputs["changes"]);
    assert!(retry.logs.iter().any(|l| l.contains("re-delivering batch 1")), "{:?}", retry.logs);

    // WHEN a normal invocation follows and a new order arrives
    orders.insert([5]).await;
    let next = fire_until_delivered(&host, FUNCTION).await;
    // THEN batch 1 is acknowledged and only the new order is delivered
    assert_eq!(ops(&next), vec![(0, 5)]);
}

#[tokio::test]
async fn a_late_commit_is_delivered_after_newer_rows() {
    // The guard waits for the oldest transaction of the whole cluster, so this test holds one open on a server
    // of its own rather than stalling every other test's deliveries on the shared one.
    let server = tokio::task::spawn_blocking(testbed::embedded::EmbeddedPostgres::start)
        .await
        .expect("join")
        .expect("a private PostgreSQL starts");
    let url = testbed::embedded::create_database(&server.url(), "late").await.expect("database");
    // GIVEN a transaction that wrote order 1 and is still open
    let orders = Orders::on(url).await;
    let app = orders_app(&orders, &unique_app_name("late"), json!({}), &[]);
    let host = start(&app).await;
    let slow = testbed::embedded::connect(&orders.url).await.expect("connect");
    slow.batch_execute("BEGIN; INSERT INTO orders (id, customer, amount) VALUES (1, 'slow', 1)").await.expect("begin");
    // AND a newer transaction that committed order 2
    orders.insert([2]).await;

    // WHEN the timer fires while the old transaction is open
    let before = host.run_timer(FUNCTION).await.expect("timer");
    // THEN nothing newer than the open transaction is read yet (it could still commit an older cursor)
    assert!(before.applied.get("changes").is_none_or(|m| m.is_empty()), "{:?}", before.applied);

    // WHEN the old transaction commits late
    slow.batch_execute("COMMIT").await.expect("commit");
    drain(&host, 5).await;

    // THEN both orders are delivered, the late one included
    let (seen, _) = tally(&host.delivered("changes"));
    assert_eq!(seen, ids(1..=2));
}

#[tokio::test]
async fn start_from_now_skips_rows_that_existed_before_the_first_tick() {
    let orders = Orders::new("now").await;
    orders.insert(1..=3).await;
    let app = orders_app(&orders, &unique_app_name("now"), json!({"startFrom": "now"}), &[]);
    let host = start(&app).await;

    let first = host.run_timer(FUNCTION).await.expect("timer");
    assert!(first.applied.get("changes").is_none_or(|m| m.is_empty()));
    orders.insert([4]).await;
    orders.set_amount(1, "9.99").await;
    fire_until_delivered(&host, FUNCTION).await;
    drain(&host, 5).await;
    assert_eq!(ops(&host.delivered("changes")), vec![(0, 4), (1, 1)]);
}

#[tokio::test]
async fn two_functions_on_one_table_each_get_every_change() {
    let orders = Orders::new("two").await;
    let azurite = crate::support::fixture().azurite_connection_string();
    let app_name = unique_app_name("two");
    let app = crate::support::AppBuilder::new()
        .function("First", crate::support::timer_function_json(Some(3)), Some(trigger_json(json!({}))))
        .function(
            "Second",
            crate::support::timer_function_json(Some(3)),
            Some(trigger_json(json!({"maxBatchSize": 2}))),
        )
        .setting("PostgresConnectionString", &orders.url)
        .setting("AzureWebJobsStorage", &azurite)
        .setting("Sql_Trigger_StateStore", "blob")
        .setting("Sql_Trigger_AppName", &app_name)
        .write();
    let host = start(&app).await;
    orders.insert(1..=5).await;
    fire_until_delivered(&host, "First").await;
    fire_until_delivered(&host, "Second").await;
    for _ in 0..5 {
        host.run_timer("First").await.expect("timer");
        host.run_timer("Second").await.expect("timer");
    }
    let (first, _) = tally(&host.delivered("changes"));
    assert_eq!(first, ids(1..=5));
    // Both functions write to a binding named "changes": each id twice in all, once per function.
    let (_, counts) = tally(&host.delivered("changes"));
    assert!(counts.values().all(|&c| c == 2), "{counts:?}");
}

#[tokio::test]
async fn an_empty_tick_costs_one_state_read_and_a_delivering_tick_one_write() {
    let orders = Orders::new("ops").await;
    let app = orders_app(&orders, &unique_app_name("ops"), json!({}), &[("Sql_Trigger_LogLevel", "info")]);
    let host = start(&app).await;
    orders.insert(1..=3).await;
    // The first tick creates the state document (and usually delivers 1..3; the guard may hold them back).
    fire_until_delivered(&host, FUNCTION).await;
    orders.insert([4]).await;
    fire_until_delivered(&host, FUNCTION).await;
    host.run_timer(FUNCTION).await.expect("acknowledging tick");
    host.run_timer(FUNCTION).await.expect("empty tick");
    let costs: Vec<(String, u64)> = host
        .output()
        .lines()
        .filter(|l| l.contains("tick finished"))
        .filter_map(|l| {
            let outcome = l.split("outcome=").nth(1)?.split_whitespace().next()?.to_string();
            let ops = l.split("store_operations=").nth(1)?.split_whitespace().next()?.parse().ok()?;
            Some((outcome, ops))
        })
        .collect();
    let out = host.output();
    // The first tick reads (absent), creates the container (once per process) and the document: 3.
    assert_eq!(costs[0].1, 3, "{out}");
    // Every later delivering tick: one conditional write (acknowledgement and new batch in one PUT), from the
    // document this process wrote last, without reading it back.
    let delivering: Vec<u64> = costs[1..].iter().filter(|(o, _)| o == "Delivered").map(|(_, n)| *n).collect();
    assert!(!delivering.is_empty() && delivering.iter().all(|&n| n == 1), "{costs:?}\n{out}");
    // The acknowledging tick writes once; the final empty tick only reads (to check nobody else wrote).
    assert_eq!(costs[costs.len() - 2], ("Empty".to_string(), 1), "{out}");
    assert_eq!(costs[costs.len() - 1], ("Empty".to_string(), 1), "{out}");
}
