//! The lag in status on real PostgreSQL, read as an operator reads it (`handler state status`): the age of the
//! oldest undelivered change, dated by a timestamp cursor itself or, for xid8 cursors, by commit timestamps
//! when the server records them. Every expected age is bounded by clocks read around the status call and the
//! times the test wrote or measured for the rows, never by a sleep.
//!
//! The commit-timestamp tests start their own server with `track_commit_timestamp` set explicitly (the
//! setting takes effect only at server start), so they prove the same thing whatever the shared server has.

use crate::common::*;
use crate::operations::handler_cli;
use crate::support::{self, AppFolder};
use serde_json::{json, Value};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use testbed::embedded::{self, EmbeddedPostgres, PostgresOptions};

/// Seconds since the Unix epoch, now.
fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_secs_f64()
}

/// An app whose one function watches `table` with `trigger` keys, file state, and `handler run`'s stdout sink.
fn app(url: &str, trigger: Value) -> AppFolder {
    let app_name = unique_app_name("lag");
    support::write_app(
        FUNCTION,
        support::timer_function_json(Some(3)),
        trigger,
        &[
            ("PostgresConnectionString", url),
            ("Sql_Trigger_StateStore", "file"),
            ("Sql_Trigger_AppName", app_name.as_str()),
        ],
    )
}

/// `handler state status`, with the seconds since `at` (epoch seconds) read just before and just after it:
/// the bounds the age of a change made at `at` must fall between.
async fn status_since(app: &AppFolder, at: f64) -> (Value, std::ops::RangeInclusive<f64>) {
    let before = now() - at;
    let status = status(app).await;
    let after = now() - at;
    (status, before..=after)
}

async fn status(app: &AppFolder) -> Value {
    let args = ["state", "status", FUNCTION].map(String::from);
    let output = handler_cli(app.root(), &args).await;
    assert!(output.status.success(), "status failed: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("status is JSON")
}

/// `handler run --once` until status shows nothing pending and `delivered` changes acknowledged (the xid8 guard
/// may hold fresh rows back while some transaction of the cluster runs), for at most 20 s.
async fn drain_until_delivered(app: &AppFolder, delivered: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let output = handler_cli(app.root(), &["run", "--once"].map(String::from)).await;
        assert!(output.status.success(), "run --once failed: {}", String::from_utf8_lossy(&output.stderr));
        let status = status(app).await;
        if status["pending"] == 0 && status["counters"]["delivered"] == delivered {
            return status;
        }
        assert!(Instant::now() < deadline, "not drained within 20 s: {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn lag(status: &Value) -> f64 {
    status["lag_seconds"].as_f64().unwrap_or_else(|| panic!("no lag in {status}"))
}

const EVENTS: &str = "CREATE TABLE events (id bigint PRIMARY KEY, changed_at timestamptz NOT NULL);
    CREATE INDEX events_changed_at_id ON events (changed_at, id);";

#[tokio::test]
async fn a_timestamp_cursors_lag_is_the_age_of_its_oldest_undelivered_row_and_zero_once_delivered() {
    // GIVEN rows stamped two hours and one hour ago, on a timestamptz cursor with a one-minute safety lag
    let url = support::fixture().fresh_database("lag_stamp").await;
    let db = embedded::connect(&url).await.expect("connect");
    db.batch_execute(EVENTS).await.expect("create events");
    let app = app(
        &url,
        json!({ "source": "postgres-cursor", "tableName": "public.events", "connectionStringSetting": "PostgresConnectionString",
                "cursorColumn": "changed_at", "safetyLagMs": 60000 }),
    );
    let two_hours_ago = (now() - 7200.0).floor();
    let insert = "INSERT INTO events VALUES ($1, to_timestamp($2::float8))";
    db.execute(insert, &[&1i64, &two_hours_ago]).await.expect("insert 1");
    db.execute(insert, &[&2i64, &(two_hours_ago + 3600.0)]).await.expect("insert 2");

    // WHEN status is read THEN both are pending and the lag is the older one's age: two hours
    let (s, bounds) = status_since(&app, two_hours_ago).await;
    assert_eq!((&s["pending"], &s["lag_unknown_reason"]), (&json!(2), &Value::Null), "{s}");
    assert!(bounds.contains(&lag(&s)), "lag {} not in {bounds:?}", lag(&s));

    // WHEN both are delivered and acknowledged THEN nothing waits and the lag is 0
    let s = drain_until_delivered(&app, 2).await;
    assert_eq!(lag(&s), 0.0, "{s}");

    // WHEN a row stamped a second ago arrives, inside the safety lag so not yet deliverable
    let a_second_ago = (now() - 1.0).floor();
    db.execute(insert, &[&3i64, &a_second_ago]).await.expect("insert 3");
    let (s, bounds) = status_since(&app, a_second_ago).await;

    // THEN it is not pending, but it is waiting: the lag is its age
    assert_eq!(s["pending"], 0, "{s}");
    assert!(bounds.contains(&lag(&s)), "lag {} not in {bounds:?}", lag(&s));
}

/// A server of this test's own with `track_commit_timestamp` as given, and the orders table in a database on it.
async fn orders_on_own_server(track_commit_timestamp: &str) -> (EmbeddedPostgres, Orders) {
    let options = PostgresOptions::default().setting("track_commit_timestamp", track_commit_timestamp);
    let server = tokio::task::spawn_blocking(move || EmbeddedPostgres::start_with(options))
        .await
        .expect("join")
        .unwrap_or_else(|e| panic!("a private PostgreSQL starts: {e}"));
    let url = embedded::create_database(&server.url(), &support::unique_database_name("lag_xid8"))
        .await
        .expect("create a database");
    let orders = Orders::on(url).await;
    (server, orders)
}

#[tokio::test]
async fn an_xid8_cursor_without_commit_timestamps_has_an_unknown_lag_that_says_what_to_turn_on() {
    // GIVEN the orders table (xid8 cursor) on a server with track_commit_timestamp off, and orders waiting
    let (_server, orders) = orders_on_own_server("off").await;
    let app = app(&orders.url, trigger_json(json!({})));
    orders.insert(1..=3).await;

    // WHEN status is read
    let s = status(&app).await;

    // THEN the lag is unknown, and the reason names the setting and the alternative
    assert_eq!(s["lag_seconds"], Value::Null, "{s}");
    let reason = s["lag_unknown_reason"].as_str().unwrap_or_else(|| panic!("no reason in {s}"));
    assert!(reason.contains("track_commit_timestamp is off") && reason.contains("timestamptz cursor"), "{reason}");

    // AND once everything is delivered the lag is known again: nothing waits
    let s = drain_until_delivered(&app, 3).await;
    assert_eq!((&s["lag_seconds"], &s["lag_unknown_reason"]), (&json!(0.0), &Value::Null), "{s}");
}

#[tokio::test]
async fn an_xid8_cursor_with_commit_timestamps_has_the_age_of_its_oldest_pending_commit_as_its_lag() {
    // GIVEN the orders table on a server that records commit timestamps, and orders committed in a window
    // the test measured
    let (_server, orders) = orders_on_own_server("on").await;
    let app = app(&orders.url, trigger_json(json!({})));
    let committing = now();
    orders.insert(1..=3).await;
    let committed = now();

    // WHEN status is read
    let before = now();
    let s = status(&app).await;
    let after = now();

    // THEN the lag is the age of that commit: at least since it was surely committed, at most since it began
    let lag = lag(&s);
    let bounds = (before - committed)..=(after - committing);
    assert!(bounds.contains(&lag), "lag {lag} not in {bounds:?}: {s}");
    assert_eq!(s["lag_unknown_reason"], Value::Null);

    // AND once delivered the lag is 0
    let s = drain_until_delivered(&app, 3).await;
    assert_eq!(s["lag_seconds"], json!(0.0), "{s}");
}

#[tokio::test]
async fn the_state_cli_reports_the_ceiling_the_hosts_timer_allows() {
    // GIVEN a host app whose function fires every five seconds (`*/5 * * * * *`) and delivers at most 40 changes
    // per firing
    let orders = Orders::new("ceiling").await;
    let app = app(&orders.url, trigger_json(json!({ "maxBatchSize": 40 })));

    // WHEN an operator reads its status with the CLI
    let s = status(&app).await;

    // THEN it reports what the timer allows: 40 changes per firing, one firing every five seconds
    assert_eq!(s["ceiling_per_second"], json!(8.0), "{s}");
}
