//! How many connections the handler opens (issue 32): one pool per database per process, shared by every
//! partition function, at most `Sql_Trigger_MaxConnectionsPerDatabase` connections, counted by the server
//! itself (`pg_stat_activity`) while the real binary delivers 16 partitions under a concurrent writer; and
//! `handler state status` of a 16-partition function on a server that takes only a few clients, which must
//! answer for every partition or fail naming the ones that did not answer, never print a partial total.

use crate::common::{orders_app, start, unique_app_name, Orders, FUNCTION};
use crate::logical::cli;
use crate::partitions::{assert_every_last_version_in_key_order, fire_under_writer, generate, index_ddl};
use serde_json::{json, Value};
use sql_pseudo_trigger::state::StateStore;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use testbed::embedded;

const PARTITIONS: u32 = 16;

/// `handler state status` reads this many partitions at a time (docs/operations.md, "Connections").
const STATUS_FAN_OUT: i64 = 4;

/// The handler's sessions in `database`, as the server counts them (its pools name themselves
/// `sql-pseudo-trigger`, the test's own sessions do not).
const HANDLER_SESSIONS: &str = "SELECT count(*) FROM pg_stat_activity \
     WHERE datname = $1 AND application_name = 'sql-pseudo-trigger' AND backend_type = 'client backend'";

/// Samples the handler's sessions in a database every few milliseconds until stopped: the most seen at once.
struct PeakSessions {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<i64>,
}

impl PeakSessions {
    async fn start(url: &str) -> Self {
        let db = embedded::connect(url).await.expect("the sampler connects");
        let database: String = db.query_one("SELECT current_database()", &[]).await.expect("database").get(0);
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let stop = Arc::clone(&stop);
            async move {
                let mut peak = 0;
                while !stop.load(Ordering::SeqCst) {
                    let now: i64 = db.query_one(HANDLER_SESSIONS, &[&database]).await.expect("pg_stat_activity").get(0);
                    peak = peak.max(now);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                peak
            }
        });
        Self { stop, task }
    }

    async fn finish(self) -> i64 {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("the sampler")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_partition_functions_in_one_process_share_one_pool_of_at_most_the_cap() {
    // GIVEN 16 partition folders of one function over the orders table (with its partition index), in one
    // handler process whose cap is 4 connections per database
    let cap: i64 = 4;
    let orders = Orders::new("connections").await;
    orders.db.batch_execute(&index_ddl(PARTITIONS)).await.expect("create the partition index");
    let settings = [("Sql_Trigger_MaxConnectionsPerDatabase", "4")];
    let app = orders_app(&orders, &unique_app_name("connections"), json!({"maxBatchSize": 25}), &settings);
    generate(&app, PARTITIONS);
    let functions: Vec<String> = (0..PARTITIONS).map(|i| format!("{FUNCTION}-p{i}")).collect();
    let peak = PeakSessions::start(&orders.url).await;
    let host = start(&app).await;

    // WHEN all 16 timers fire on their schedules at once while a writer inserts and updates orders
    let (committed, _) = fire_under_writer(&host, &orders, &functions, 20).await;

    // THEN the server never saw more than the cap of the handler's sessions: one database, one pool
    let peak = peak.finish().await;
    println!("peak handler sessions with 16 partition functions and cap {cap}: {peak}");
    assert!((1..=cap).contains(&peak), "the handler held {peak} connections at once; the cap is {cap}");
    // ... and every change was delivered all the same
    assert_every_last_version_in_key_order(&host, &committed);
}

/// An orders table with `rows` rows in a database of `server`, the partition index for 16, and an app whose
/// function has 16 partitions and state in the shared Azurite.
async fn sixteen_partitions_on(
    server: &embedded::EmbeddedPostgres,
    rows: i64,
) -> (Orders, crate::support::AppFolder, String) {
    let name = crate::support::unique_database_name("status");
    let url = tokio::task::block_in_place(|| server.create_database(&name)).expect("create database");
    let orders = Orders::on(url).await;
    orders.db.batch_execute(&index_ddl(PARTITIONS)).await.expect("create the partition index");
    orders.insert(1..=rows).await;
    let app_name = unique_app_name("status");
    let app = orders_app(&orders, &app_name, json!({"partitions": PARTITIONS}), &[]);
    (orders, app, app_name)
}

/// A server of the test's own that takes at most `max_connections` sessions (superusers included: the
/// handler logs in as `postgres`, so no reserved slot helps it).
async fn small_server(max_connections: u32) -> embedded::EmbeddedPostgres {
    let options = embedded::PostgresOptions::default().setting("max_connections", &max_connections.to_string());
    tokio::task::spawn_blocking(move || embedded::EmbeddedPostgres::start_with(options))
        .await
        .expect("join")
        .unwrap_or_else(|e| panic!("a private PostgreSQL starts: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_of_sixteen_partitions_on_a_server_of_twelve_connections_answers_for_every_partition() {
    // GIVEN a server that takes 12 sessions, and 2,000 orders pending for a function of 16 partitions
    let server = small_server(12).await;
    let (orders, app, _) = sixteen_partitions_on(&server, 2000).await;
    let peak = PeakSessions::start(&orders.url).await;

    // WHEN an operator asks for the status of the whole function
    let status = cli(&app, &["state", "status", FUNCTION]).await;

    // THEN every partition answered, the total is every pending order, and the CLI never held more than the
    // fan-out of sessions
    let peak = peak.finish().await;
    println!("peak handler sessions of `handler state status` over 16 partitions: {peak}");
    let status = status.unwrap_or_else(|e| panic!("status failed: {e}"));
    let errors: Vec<&Value> = status["partition_status"]
        .as_array()
        .expect("partitions")
        .iter()
        .filter(|p| p.get("error").is_some())
        .collect();
    assert!(errors.is_empty(), "partitions did not answer: {errors:?}");
    assert_eq!((&status["pending"], &status["served"], &status["unanswered"]), (&json!(2000), &json!(16), &json!(0)));
    assert!((1..=STATUS_FAN_OUT).contains(&peak), "status held {peak} connections at once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_that_misses_a_partition_fails_naming_it_and_prints_no_total() {
    // GIVEN a function of 16 partitions, 300 orders pending, and the state document of partition 5 damaged
    let server = small_server(12).await;
    let (_orders, app, app_name) = sixteen_partitions_on(&server, 300).await;
    let store = crate::common::shared_blob_store();
    let key = format!("{app_name}/{FUNCTION}/partition-5-of-{PARTITIONS}.json");
    store.save_if(&key, b"{ not a state document", None).await.expect("write the damaged document");

    // WHEN an operator asks for the status of the whole function
    let refused = cli(&app, &["state", "status", FUNCTION]).await;

    // THEN it fails (exit 1), naming the partition that did not answer and why, instead of a total of 15
    let error = match refused {
        Ok(status) => panic!("a partial status was printed as the function's: {status}"),
        Err(stderr) => stderr,
    };
    assert!(error.contains("OrdersChanged-p5"), "{error}");
    assert!(error.contains("1 of 16 partitions"), "{error}");
    assert!(!error.contains("OrdersChanged-p4"), "only the partition that did not answer is named: {error}");
}
