//! Liveness through the real `handler` on real PostgreSQL and Azurite: the host model fires the timer on real
//! seconds, then stops it, as a host whose timer died would; the handler then logs an error naming the
//! function, its last invocation and the likely causes, and its status counts the seconds of silence. When
//! the timer fires again, the handler says so. Under `handler run`, status counts a failure streak and the
//! time since the last success.

use crate::common::*;
use crate::runner::Runner;
use crate::support;
use axum::http::StatusCode;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
use prost::Message;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testbed::driver::HostDriver;

const ADMIN_KEY: &str = "e2e-liveness-key-41b7";
const SILENCE: &str = "no invocation for more than two periods of the timer schedule";
const RUNS_AGAIN: &str = "the function runs again after a silence";

/// Waits until the handler's output has `needle` `times` times, at most `limit`; the output so far.
async fn wait_for_output(host: &HostDriver, needle: &str, times: usize, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let output = host.output();
        if output.matches(needle).count() >= times {
            return output;
        }
        assert!(Instant::now() < deadline, "{needle:?} not logged {times} time(s) within {limit:?}:\n{output}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every `sql_trigger.seconds_since_last_invocation` point for [`FUNCTION`] an OTLP receiver got, in order.
type Points = Arc<Mutex<Vec<f64>>>;

/// An OTLP/HTTP metrics receiver on 127.0.0.1 keeping the liveness gauge's points; returns its base URL.
async fn otlp_receiver(points: Points) -> String {
    let app = axum::Router::new().route(
        "/v1/metrics",
        axum::routing::post(move |body: axum::body::Bytes| {
            let points = points.clone();
            async move {
                let Ok(request) = ExportMetricsServiceRequest::decode(body) else { return StatusCode::BAD_REQUEST };
                let metrics = request.resource_metrics.iter().flat_map(|r| &r.scope_metrics).flat_map(|s| &s.metrics);
                for metric in metrics.filter(|m| m.name == "sql_trigger.seconds_since_last_invocation") {
                    let Some(metric::Data::Gauge(gauge)) = &metric.data else { continue };
                    for point in &gauge.data_points {
                        let ours = point.attributes.iter().any(|kv| {
                            kv.key == "function"
                                && matches!(kv.value.as_ref().and_then(|v| v.value.as_ref()),
                                    Some(any_value::Value::StringValue(f)) if f == FUNCTION)
                        });
                        if let (true, Some(number_data_point::Value::AsDouble(v))) = (ours, point.value) {
                            points.lock().expect("points").push(v);
                        }
                    }
                }
                StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the OTLP receiver");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve OTLP") });
    url
}

async fn status(host: &HostDriver) -> Value {
    let url = format!("{}/admin/{FUNCTION}/status", host.base_url());
    let response =
        support::http_client().get(url).header("x-functions-key", ADMIN_KEY).send().await.expect("status answers");
    assert!(response.status().is_success(), "status: {}", response.status());
    response.json().await.expect("status is JSON")
}

#[tokio::test]
async fn a_timer_the_host_stops_firing_is_reported_with_its_last_invocation_and_causes() {
    // GIVEN a function on a timer every second, with the admin routes on
    let orders = Orders::new("liveness").await;
    let mut function_json = support::timer_function_json(Some(3));
    function_json["bindings"][0]["schedule"] = json!("* * * * * *");
    let azurite = support::fixture().azurite_connection_string();
    let app_name = unique_app_name("liveness");
    let app = support::write_app(
        FUNCTION,
        function_json,
        trigger_json(json!({})),
        &[
            ("PostgresConnectionString", orders.url.as_str()),
            ("AzureWebJobsStorage", azurite.as_str()),
            ("Sql_Trigger_StateStore", "blob"),
            ("Sql_Trigger_AppName", app_name.as_str()),
            ("Sql_Trigger_AdminKey", ADMIN_KEY),
        ],
    );
    // AND metrics exported every 200 ms to an OTLP receiver, where the alert rule of docs/operations.md reads
    // them: silent for more than three periods
    let points = Points::default();
    let otlp = otlp_receiver(points.clone()).await;
    let host =
        app.start_handler(&[("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp), ("Sql_Trigger_MetricsIntervalMs", "200")]).await;
    let alert_fires = |points: &Points| points.lock().expect("points").last().is_some_and(|&s| s > 3.0);

    // WHEN the host model fires it on its schedule for three seconds, then stops its timer
    let paced = host.run_schedule_real(FUNCTION, 3).await.expect("the timer fires");
    assert!(paced.firings.iter().all(|f| f.run.succeeded), "every firing succeeded:\n{}", host.output());
    let stopped = Instant::now();
    assert!(!host.output().contains(SILENCE), "no silence reported while the timer fired:\n{}", host.output());
    let while_firing = points.lock().expect("points").clone();
    assert!(!while_firing.is_empty(), "the gauge was exported while the timer fired");
    assert!(while_firing.iter().all(|&s| s <= 3.0), "the alert rule held while the timer fired: {while_firing:?}");

    // THEN after two missed firings (plus slack) the handler logs an error naming the function, its last
    // invocation and the likely causes
    let output = wait_for_output(&host, SILENCE, 1, Duration::from_secs(15)).await;
    let waited = stopped.elapsed();
    assert!(waited >= Duration::from_secs(2), "reported after {waited:?}, before two periods passed");
    let line = output.lines().find(|l| l.contains(SILENCE)).expect("the line");
    assert!(line.contains("ERROR"), "logged as an error: {line}");
    assert!(line.contains(&format!("function={FUNCTION}")), "names the function: {line}");
    assert!(line.contains("last_invocation=20"), "names the last invocation's time: {line}");
    assert!(line.contains(r#"schedule="* * * * * *""#), "names the schedule: {line}");
    assert!(line.contains("AzureWebJobs.<function>.Disabled"), "names the likely causes: {line}");
    // AND status counts the silence, with no failure among the ticks that ran
    let answer = status(&host).await;
    let silent = answer["seconds_since_last_invocation"].as_f64().expect("seconds_since_last_invocation");
    assert!(silent >= 2.0, "{answer}");
    // (the last tick succeeded: its success is its end, a moment after its start)
    let since_success = answer["seconds_since_last_success"].as_f64().expect("seconds_since_last_success");
    assert!((2.0..=silent).contains(&since_success), "{answer}");
    assert_eq!(answer["consecutive_failures"], 0, "{answer}");
    // AND the metrics alert rule fires on the exported gauge
    let deadline = Instant::now() + Duration::from_secs(10);
    while !alert_fires(&points) {
        assert!(Instant::now() < deadline, "the gauge never passed 3 s: {:?}", points.lock().expect("points"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // AND it is reported again once per period (every second here) while the silence lasts
    wait_for_output(&host, SILENCE, 3, Duration::from_secs(10)).await;

    // WHEN the timer fires again THEN the handler says the function runs again, and status agrees
    assert!(host.run_timer(FUNCTION).await.expect("fires").succeeded);
    wait_for_output(&host, RUNS_AGAIN, 1, Duration::from_secs(5)).await;
    // AND the metrics alert resolves
    let deadline = Instant::now() + Duration::from_secs(10);
    while alert_fires(&points) {
        assert!(Instant::now() < deadline, "the gauge stayed above 3 s: {:?}", points.lock().expect("points"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answer = status(&host).await;
    assert!(answer["seconds_since_last_invocation"].as_f64().expect("seconds") < silent, "{answer}");
}

#[tokio::test]
async fn a_first_firing_seconds_after_ready_is_a_host_starting_not_a_silence() {
    // GIVEN a function on a timer every second
    let orders = Orders::new("liveness_late").await;
    let mut function_json = support::timer_function_json(Some(3));
    function_json["bindings"][0]["schedule"] = json!("* * * * * *");
    let azurite = support::fixture().azurite_connection_string();
    let app_name = unique_app_name("liveness-late");
    let app = support::write_app(
        FUNCTION,
        function_json,
        trigger_json(json!({})),
        &[
            ("PostgresConnectionString", orders.url.as_str()),
            ("AzureWebJobsStorage", azurite.as_str()),
            ("Sql_Trigger_StateStore", "blob"),
            ("Sql_Trigger_AppName", app_name.as_str()),
        ],
    );
    let host = app.start_handler(&[]).await;
    let ready = Instant::now();

    // WHEN the host fires it first 4 s after the handler is ready, as a Flex instance may (0.4 to 10 s): past
    // the two periods and slack of a running every-second timer (2.5 s), and a watchdog look (every second)
    // after them. The wait is the host's late start being modelled, not a timing the test hopes for.
    tokio::time::sleep_until((ready + Duration::from_secs(4)).into()).await;
    assert!(host.run_timer(FUNCTION).await.expect("fires").succeeded, "{}", host.output());

    // THEN no silence was logged for the start
    assert!(!host.output().contains(SILENCE), "a late first firing was reported as a silence:\n{}", host.output());
}

/// A webhook that answers 503 until told to accept; counts the requests it got.
#[derive(Clone, Default)]
struct Hook {
    accept: Arc<AtomicBool>,
    requests: Arc<AtomicUsize>,
}

async fn start_hook(hook: Hook) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the webhook");
    let url = format!("http://{}/hooks/orders", listener.local_addr().expect("address"));
    let app = axum::Router::new().route(
        "/hooks/orders",
        axum::routing::post(move || {
            let hook = hook.clone();
            async move {
                hook.requests.fetch_add(1, Ordering::SeqCst);
                if hook.accept.load(Ordering::SeqCst) {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                }
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve the webhook") });
    url
}

#[tokio::test]
async fn handler_run_reports_its_failure_streak_and_last_success_until_a_tick_succeeds() {
    // GIVEN `handler run` with its admin routes, delivering to a webhook that is down
    let orders = Orders::new("liveness_run").await;
    let hook = Hook::default();
    let url = start_hook(hook.clone()).await;
    let sink = json!({ "type": "webhook", "url": url, "maxRetries": 0, "timeoutMs": 5000 });
    let app = orders_app(
        &orders,
        &unique_app_name("liveness-run"),
        json!({ "pollingIntervalMs": 10, "sink": sink }),
        &[("Sql_Trigger_StateStore", "file"), ("Sql_Trigger_AdminKey", ADMIN_KEY)],
    );
    let port = testbed::embedded::free_port().expect("a free port").to_string();
    let mut runner = Runner::start(&app, &["--admin-port", &port]);
    let status = || async {
        let url = format!("http://127.0.0.1:{port}/admin/{FUNCTION}/status");
        match support::http_client().get(url).header("x-functions-key", ADMIN_KEY).send().await {
            Ok(response) if response.status().is_success() => response.json::<Value>().await.ok(),
            _ => None,
        }
    };

    // WHEN orders arrive and every delivery fails
    orders.insert(1..=3).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let failing = loop {
        if let Some(s) = status().await.filter(|s| s["consecutive_failures"].as_u64().unwrap_or(0) >= 3) {
            break s;
        }
        assert!(Instant::now() < deadline, "no failure streak within 20 s:\n{}", runner.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    // THEN status counts the streak, and the last success is older than the last invocation (the loop runs,
    // its ticks fail)
    assert!(hook.requests.load(Ordering::SeqCst) >= 3, "the failures are the webhook's");
    let since_invocation = failing["seconds_since_last_invocation"].as_f64().expect("since invocation");
    let since_success = failing["seconds_since_last_success"].as_f64().expect("since success");
    assert!(since_success > since_invocation, "{failing}");

    // WHEN the webhook comes back THEN the streak ends
    hook.accept.store(true, Ordering::SeqCst);
    loop {
        if let Some(s) = status().await.filter(|s| s["consecutive_failures"] == 0) {
            assert!(s["seconds_since_last_success"].as_f64().expect("since success") < since_success, "{s}");
            break;
        }
        assert!(Instant::now() < deadline + Duration::from_secs(70), "the streak did not end:\n{}", runner.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    runner.terminate();
    let exit = runner.exit(Duration::from_secs(10)).await;
    assert!(exit.success(), "{exit}\n{}", runner.stderr());

    // AND `handler state status`, a process that runs no ticks, reports no liveness numbers rather than a
    // silence counted from its own start
    let args = ["state", "status", FUNCTION].map(String::from);
    let output = crate::operations::handler_cli(app.root(), &args).await;
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let cli: Value = serde_json::from_slice(&output.stdout).expect("JSON on stdout");
    assert_eq!(cli["seconds_since_last_invocation"], Value::Null, "{cli}");
    assert_eq!(cli["consecutive_failures"], Value::Null, "{cli}");
    assert!(cli["pending"].is_u64(), "the rest of the status is there: {cli}");
}
