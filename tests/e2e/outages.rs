//! Outages of the two servers the handler depends on, with servers of the test's own (the shared ones serve
//! every other test): while a server is down every invocation fails with a 500 whose message names the
//! server and says nothing committed is lost; once it is back, every row is delivered and the only
//! duplicates are of the batch that was in flight when it went down.

use crate::common::*;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use testbed::driver::{AttemptOutcome, TimerRun};
use testbed::embedded::{self, Azurite, EmbeddedPostgres};

/// The error message of a failed attempt's answer.
fn error_message(run: &TimerRun, attempt: usize) -> String {
    let invocation = run.attempts[attempt].invocation.as_ref().expect("the handler answers");
    assert_eq!(invocation.status, 500, "{}", invocation.body);
    let body: Value = serde_json::from_str(&invocation.body).expect("a JSON error");
    body["error"].as_str().expect("an error message").to_string()
}

#[tokio::test]
async fn an_azurite_outage_fails_invocations_naming_the_state_store_and_the_batch_whose_write_failed_comes_again() {
    // The host writes outputs after the handler answers and never says whether that worked; only a retry says
    // it did not. Here every retry then fails inside the handler because the state store is down (often the
    // same storage account as the failing queue). The next normal invocation must not take the process's
    // memory of having answered the batch as proof that the host wrote it.
    let azurite = private_azurite().await;
    let cs = azurite.connection_string();
    let orders = Orders::new("azurite_down").await;
    let app_name = unique_app_name("azurite-down");
    let app = orders_app(&orders, &app_name, json!({}), &[("AzureWebJobsStorage", &cs)]);
    let host = start(&app).await;
    orders.insert(1..=3).await;

    // GIVEN batch 1 (orders 1-3) answered, and the host's write of it failed (the host plays by hand here)
    let first = invoke_until_answered(&host, FUNCTION).await;
    assert_eq!(ids_of(&answered_changes(&first)), vec![1, 2, 3]);

    // WHEN Azurite stops while orders keep arriving, and the host makes its three retries
    let azurite = on_server(azurite, "stop Azurite", Azurite::stop).await;
    orders.insert(4..=6).await;
    let mut failed = first;
    for n in 1..=3 {
        // The first retry names batch 1's attempt; each later one the retry before it, which failed here.
        let retry = host.retry(FUNCTION, n, &failed).await.expect("invoke");

        // THEN each fails with a 500 naming the state store, its document, and that nothing committed is lost
        assert_eq!(retry.status, 500, "{}", retry.body);
        let body: Value = serde_json::from_str(&retry.body).expect("a JSON error");
        let message = body["error"].as_str().expect("an error message");
        assert!(message.starts_with("state store: the state store is unavailable"), "{message}");
        assert!(message.contains(&state_key(&app_name)), "{message}");
        assert!(message.contains("nothing committed is lost"), "{message}");
        failed = retry;
    }

    // WHEN Azurite comes back and the timer fires normally, with orders 7-8 waiting too
    let _azurite = on_server(azurite, "start Azurite again", Azurite::start_again).await;
    orders.insert(7..=8).await;
    let counts = fire_until_all_delivered(&host, &ids(1..=8)).await;

    // THEN batch 1 is re-delivered rather than acknowledged: every order reaches the queue exactly once
    assert_nothing_lost(&counts, &ids(1..=8), &BTreeSet::new());
    let logs = host.output();
    assert!(
        logs.contains("re-delivering batch 1 with 3 change(s) because its write failed (1 known failure(s))"),
        "{logs}"
    );
}

#[tokio::test]
async fn postgres_down_or_restarted_fails_invocations_naming_the_database_and_nothing_is_lost() {
    // GIVEN a private PostgreSQL and batch 1 (orders 1-3) answered and written
    let server = private_postgres().await;
    let url = embedded::create_database(&server.url(), "pg_down").await.expect("database");
    let orders = Orders::on(url.clone()).await;
    let app = orders_app(&orders, &unique_app_name("pg-down"), json!({}), &[]);
    let host = start(&app).await;
    orders.insert(1..=3).await;
    let batch_1: BTreeSet<i64> = ids_of(&fire_until_delivered(&host, FUNCTION).await).into_iter().collect();
    assert_eq!(batch_1, ids(1..=3));

    // WHEN PostgreSQL stops and the timer fires
    let server = on_server(server, "stop PostgreSQL", EmbeddedPostgres::stop).await;
    let run = host.run_timer(FUNCTION).await.expect("timer run");

    // THEN every attempt fails with a 500 naming PostgreSQL and the connection setting
    assert!(!run.succeeded);
    for attempt in 0..run.attempt_count() {
        let message = error_message(&run, attempt);
        assert!(message.starts_with("source: cannot connect to PostgreSQL"), "{message}");
        assert!(message.contains("PostgresConnectionString"), "{message}");
        assert!(message.contains("nothing committed is lost"), "{message}");
    }

    // WHEN it starts again and orders keep arriving
    let server = on_server(server, "start PostgreSQL again", EmbeddedPostgres::start_again).await;
    let orders = Orders::on(url.clone()).await;
    orders.insert(4..=6).await;
    let counts = fire_until_all_delivered(&host, &ids(1..=6)).await;

    // THEN every order is written; only batch 1, in flight during the outage, may come twice
    assert_nothing_lost(&counts, &ids(1..=6), &batch_1);

    // WHEN PostgreSQL restarts between two firings, with orders written before and after
    orders.insert(7..=8).await;
    let before: BTreeSet<i64> = tally(&host.delivered("changes")).0;
    let in_flight = fire_until_delivered(&host, FUNCTION).await;
    let in_flight: BTreeSet<i64> = ids_of(&in_flight).into_iter().collect();
    assert!(in_flight.is_disjoint(&before), "{in_flight:?} came again");
    let _server = on_server(server, "restart PostgreSQL", EmbeddedPostgres::restart).await;
    let orders = Orders::on(url).await;
    orders.insert(9..=10).await;
    let run = host.run_timer(FUNCTION).await.expect("timer run");

    // THEN a firing that meets the restart fails with a clear message, or succeeds
    for attempt in &run.attempts {
        if let AttemptOutcome::HandlerFailed { reason } = &attempt.outcome {
            assert!(reason.contains("500") && reason.contains("PostgreSQL"), "{reason}");
        }
    }
    // AND every order is written; the duplicates are only of batches in flight at an outage
    let counts = fire_until_all_delivered(&host, &ids(1..=10)).await;
    assert_nothing_lost(&counts, &ids(1..=10), &(&batch_1 | &in_flight));
}

#[tokio::test]
async fn a_refused_login_or_a_missing_database_needs_an_operator_and_says_what_to_fix() {
    // GIVEN connection strings naming a role and a database the server does not have
    let orders = Orders::new("refused_login").await;
    // postgres://user@host:port/database (the fixture's URLs), or a TEST_POSTGRES_URL of that shape
    let (base, _) = orders.url.rsplit_once('/').expect("a URL with a database");
    let no_database = format!("{base}/nosuchdb");
    let (scheme, rest) = orders.url.split_once("://").expect("a URL");
    let host_part = rest.split_once('@').map_or(rest, |(_, host)| host);
    let no_role = format!("{scheme}://nosuchrole@{host_part}");
    for (connection, sqlstate, fix) in [
        (no_role.as_str(), "SQLSTATE 28000", "check the user name and password"),
        (no_database.as_str(), "SQLSTATE 3D000", "correct dbname, or create the database"),
    ] {
        let app =
            orders_app(&orders, &unique_app_name("refused"), json!({}), &[("PostgresConnectionString", connection)]);
        let host = start(&app).await;

        // WHEN the timer fires
        let run = host.run_timer(FUNCTION).await.expect("timer run");

        // THEN every attempt fails naming the cause and the fix, classified as needing an operator, not as an
        // outage a retry would outlast
        assert!(!run.succeeded);
        let message = error_message(&run, 0);
        assert!(message.contains(sqlstate) && message.contains(fix), "{message}");
        assert!(message.contains("needs an operator"), "{message}");
        assert!(!message.contains("transient"), "{message}");
    }
}
