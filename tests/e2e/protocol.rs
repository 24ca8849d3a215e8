//! The real process speaks the custom-handler protocol: every timer variant the host sends is accepted,
//! hostile bodies are refused with a reason and never take the process down, and SIGTERM exits cleanly.

use crate::common::*;
use crate::support;
use serde_json::json;

/// A GUID, as the host sends, with a tail a log search can find.
const INVOCATION_ID: &str = "7f1e2d3c-0000-4000-8000-00000000c0de";

async fn post(base: &str, path: &str, body: Vec<u8>) -> (u16, String) {
    let response = support::http_client()
        .post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .header("X-Azure-Functions-InvocationId", INVOCATION_ID)
        .body(body)
        .send()
        .await
        .expect("the handler answers");
    (response.status().as_u16(), response.text().await.unwrap_or_default())
}

#[tokio::test]
async fn accepts_every_timer_payload_variant_the_host_sends() {
    let orders = Orders::new("variants").await;
    let app = orders_app(&orders, &unique_app_name("variants"), json!({}), &[]);
    let host = start(&app).await;
    let base = host.base_url();
    // Every attempt carries a RetryContext (count 0 on the first), since the function has a retry policy.
    let variants = [
        // first run: Last without an offset
        r#"{"Data":{"timer":{"Schedule":{"AdjustForDST":true},"ScheduleStatus":{"Last":"0001-01-01T00:00:00","Next":"2026-11-22T02:50:00+00:00","LastUpdated":"0001-01-01T00:00:00"},"IsPastDue":false}},"Metadata":{"sys":{"MethodName":"OrdersChanged","UtcNow":"2026-11-22T02:50:00.0123456Z","RandGuid":"24ad4c06-24ad-4e5b-8294-3da9714877e9"},"RetryContext":{"RetryCount":0,"MaxRetryCount":3,"Exception":null,"Instance":null,"State":{}}}}"#,
        // manual or admin run, or a schedule under a minute (monitor off): null ScheduleStatus
        r#"{"Data":{"timer":{"Schedule":{"AdjustForDST":true},"ScheduleStatus":null,"IsPastDue":false}},"Metadata":{"RetryContext":{"RetryCount":0,"MaxRetryCount":3,"Exception":null}}}"#,
        // seven fractional digits and another offset
        r#"{"Data":{"timer":{"ScheduleStatus":{"Last":"2026-11-22T02:45:00.0031245+01:00","Next":"2026-11-22T02:50:00+01:00","LastUpdated":"2026-11-22T02:45:00.0031245+01:00"},"IsPastDue":true}},"Metadata":{"sys":{"UtcNow":"2026-11-22T02:50:00.0123456Z"},"RetryContext":{"RetryCount":0,"MaxRetryCount":3}}}"#,
        // a retry, naming the attempt that failed
        r#"{"Data":{"timer":{}},"Metadata":{"RetryContext":{"RetryCount":1,"MaxRetryCount":3,"Exception":{"ClassName":"Microsoft.Azure.WebJobs.Host.FunctionInvocationException","Message":"queue down","InstanceId":"5d3f3c2e-41b4-4c1a-9d0e-2b7c6a1f9e10"}}}}"#,
        // an empty body
        "",
    ];
    for body in variants {
        let (status, answer) = post(&base, "/OrdersChanged", body.as_bytes().to_vec()).await;
        assert_eq!(status, 200, "body {body:?} answered {answer}");
        let answer: serde_json::Value = serde_json::from_str(&answer).expect("JSON answer");
        assert!(answer.get("Outputs").is_some() && answer.get("Logs").is_some(), "{answer}");
    }
    // The invocation id is on the process's log lines of that invocation.
    assert!(host.output().contains(INVOCATION_ID), "{}", host.output());
}

#[tokio::test]
async fn hostile_bodies_are_refused_and_the_process_keeps_serving() {
    let orders = Orders::new("hostile").await;
    let app = orders_app(&orders, &unique_app_name("hostile"), json!({}), &[]);
    let host = start(&app).await;
    let base = host.base_url();
    let bodies: Vec<Vec<u8>> = vec![
        b"{\"Data\":{\"timer\":".to_vec(),
        b"{\"Data\":42}".to_vec(),
        b"{\"Metadata\":{\"RetryContext\":{\"RetryCount\":[]}}}".to_vec(),
        vec![0xc3, 0x28, 0xa0, 0xa1],
        format!("{}{}", "{\"a\":".repeat(50_000), "}".repeat(50_000)).into_bytes(),
        format!("{{\"Data\":{{\"s\":\"{}\"}}", "x".repeat(900_000)).into_bytes(),
        vec![b'['; 2 * 1024 * 1024],
    ];
    for body in bodies {
        let preview = String::from_utf8_lossy(&body[..body.len().min(30)]).into_owned();
        let (status, answer) = post(&base, "/OrdersChanged", body).await;
        assert!(status == 400 || status == 413, "{preview:?} answered {status} {answer}");
        if status == 400 {
            assert!(answer.contains("error"), "{answer}");
        }
    }
    let (status, answer) = post(&base, "/NotAFunction", b"{}".to_vec()).await;
    assert_eq!(status, 404);
    assert!(answer.contains("OrdersChanged"), "the 404 names the configured functions: {answer}");
    // Still alive and still delivering.
    assert!(host.is_running());
    orders.insert([1]).await;
    assert_eq!(ops(&fire_until_delivered(&host, FUNCTION).await), vec![(0, 1)]);
}

#[tokio::test]
async fn sigterm_exits_cleanly() {
    let orders = Orders::new("sigterm").await;
    let app = orders_app(&orders, &unique_app_name("sigterm"), json!({}), &[]);
    let host = start(&app).await;
    let status = host.terminate().await.expect("terminates");
    assert!(status.success(), "exit status {status:?}\n{}", host.output());
}

#[tokio::test]
async fn sigterm_lets_the_invocation_in_flight_finish_before_exiting() {
    // GIVEN an invocation stuck in its fetch: another session holds an exclusive lock on the table (on a
    // private server, since an open transaction holds back the guard of every database in a cluster)
    let server = tokio::task::spawn_blocking(testbed::embedded::EmbeddedPostgres::start)
        .await
        .expect("join")
        .expect("a private PostgreSQL starts");
    let url = testbed::embedded::create_database(&server.url(), "drain").await.expect("database");
    let orders = Orders::on(url).await;
    orders.insert(1..=3).await;
    let app = orders_app(&orders, &unique_app_name("drain"), json!({}), &[]);
    let host = std::sync::Arc::new(start(&app).await);
    // The first tick validates the table and creates the state, so the next one goes straight to the fetch.
    host.invoke(FUNCTION, None).await.expect("first tick");
    let locker = testbed::embedded::connect(&orders.url).await.expect("connect");
    locker.batch_execute("BEGIN; LOCK TABLE orders IN ACCESS EXCLUSIVE MODE").await.expect("lock");
    let pending = {
        let host = host.clone();
        tokio::spawn(async move { host.invoke(FUNCTION, None).await })
    };
    // Wait until the fetch is really blocked on the lock.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let waiting: i64 = locker
            .query_one("SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'orders'::regclass", &[])
            .await
            .expect("pg_locks")
            .get(0);
        if waiting > 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the invocation never reached the table");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    // WHEN SIGTERM arrives while that invocation is in flight (a supervisor or Ctrl-C: the Functions host itself
    // only ever kills, which tests/e2e/crashes.rs covers), and the lock is released afterwards
    let terminating = {
        let host = host.clone();
        tokio::spawn(async move { host.terminate().await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!terminating.is_finished(), "the process must not exit with an invocation in flight");
    locker.batch_execute("COMMIT").await.expect("unlock");

    // THEN the invocation completes with its answer and the process exits cleanly
    let answer = pending.await.expect("join").expect("the in-flight invocation is answered");
    assert_eq!(answer.status, 200, "{}", answer.body);
    let status = terminating.await.expect("join").expect("terminates");
    assert!(status.success(), "exit status {status:?}\n{}", host.output());
}
