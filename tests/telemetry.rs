//! The metrics export on the wire: a trigger over memory ticks, the real OTLP/HTTP exporter sends, and a tiny
//! OTLP receiver on 127.0.0.1 (axum, POST /v1/metrics) decodes what arrives with the protobuf types the exporter
//! itself uses. What this proves: the settings turn the exporter on, the request is OTLP http/protobuf at the
//! standard path with the configured headers, and every `sql_trigger.*` instrument arrives with its `function`
//! attribute and the values of the ticks that ran.

mod support;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point, NumberDataPoint};
use prost::Message;
use serde_json::json;
use sql_pseudo_trigger::config::{AppConfig, Env};
use sql_pseudo_trigger::engine::Trigger;
use sql_pseudo_trigger::protocol::{Attempt, RetryContext};
use sql_pseudo_trigger::state::MemoryStore;
use sql_pseudo_trigger::telemetry::{Telemetry, TelemetryConfig};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testbed::MemorySource;

/// What the receiver got: each request's headers and decoded body.
type Received = Arc<Mutex<Vec<(HeaderMap, ExportMetricsServiceRequest)>>>;

/// Starts the receiver on a free loopback port; returns its base URL.
async fn receiver(received: Received) -> String {
    async fn accept(State(received): State<Received>, headers: HeaderMap, body: Bytes) -> StatusCode {
        match ExportMetricsServiceRequest::decode(body) {
            Ok(request) => {
                received.lock().expect("received lock").push((headers, request));
                StatusCode::OK
            }
            Err(_) => StatusCode::BAD_REQUEST,
        }
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
    let url = format!("http://{}", listener.local_addr().expect("local address"));
    let app = Router::new().route("/v1/metrics", post(accept)).with_state(received);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    url
}

/// A trigger named `Orders` over an in-memory source and store, configured from an app folder.
fn trigger(source: Arc<MemorySource>) -> Arc<Trigger> {
    Arc::new(trigger_on(source, Arc::new(sql_pseudo_trigger::clock::SystemClock)))
}

fn trigger_on(source: Arc<MemorySource>, clock: Arc<dyn sql_pseudo_trigger::clock::Clock>) -> Trigger {
    let sqltrigger = json!({
        "source": "postgres-cursor", "tableName": "public.orders", "connectionStringSetting": "Pg",
        "cursorColumn": "version"
    });
    let app = support::write_app("Orders", support::timer_function_json(Some(3)), sqltrigger, &[]);
    // A zero proof window: the second tick proves the first one's batch, so the counts below are final.
    let env = Env::from_pairs(
        [("Pg", "postgres://nobody@127.0.0.1:1/none"), ("Sql_Trigger_ProofWindowMs", "0")]
            .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    let config = AppConfig::load_from(app.root(), env).expect("the app config loads");
    let function = config.functions[0].clone();
    Trigger::new(function, "app", source, Arc::new(MemoryStore::new()), "owner-1".into()).with_clock(clock)
}

fn string_attribute<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a str> {
    attributes.iter().find(|kv| kv.key == key).and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.as_str()),
        _ => None,
    })
}

fn number(point: &NumberDataPoint) -> f64 {
    match point.value {
        Some(number_data_point::Value::AsInt(v)) => v as f64,
        Some(number_data_point::Value::AsDouble(v)) => v,
        None => f64::NAN,
    }
}

/// The latest value of a sum or gauge point of `name` whose attributes include `with`, or a histogram's count.
fn latest(received: &Received, name: &str, with: &[(&str, &str)]) -> Option<f64> {
    let received = received.lock().expect("received lock");
    let mut found = None;
    for (_, request) in received.iter() {
        for metric in request.resource_metrics.iter().flat_map(|r| &r.scope_metrics).flat_map(|s| &s.metrics) {
            if metric.name != name {
                continue;
            }
            let matches = |attrs: &[KeyValue]| with.iter().all(|(k, v)| string_attribute(attrs, k) == Some(*v));
            let point = match metric.data.as_ref() {
                Some(metric::Data::Sum(sum)) => {
                    sum.data_points.iter().rev().find(|p| matches(&p.attributes)).map(number)
                }
                Some(metric::Data::Gauge(gauge)) => {
                    gauge.data_points.iter().rev().find(|p| matches(&p.attributes)).map(number)
                }
                Some(metric::Data::Histogram(h)) => {
                    h.data_points.iter().rev().find(|p| matches(&p.attributes)).map(|p| p.count as f64)
                }
                _ => None,
            };
            found = point.or(found);
        }
    }
    found
}

const EXPECTED: &[&str] = &[
    "sql_trigger.ticks",
    "sql_trigger.changes.delivered",
    "sql_trigger.batch.size",
    "sql_trigger.tick.duration",
    "sql_trigger.store.operations",
    "sql_trigger.changes.pending",
    "sql_trigger.target_workers",
    "sql_trigger.seconds_since_progress",
    "sql_trigger.lag",
    "sql_trigger.batches.quarantined",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticks_and_status_arrive_at_an_otlp_receiver() {
    // GIVEN a receiver, and settings that point the OTLP exporter at it with a header, exporting every 100 ms
    let received = Received::default();
    let url = receiver(received.clone()).await;
    let env = Env::from_pairs(
        [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_str()),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=test%20key"),
            ("Sql_Trigger_MetricsIntervalMs", "100"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    let config = TelemetryConfig::from_env(&env, "telemetry-test").expect("valid settings").expect("an exporter");
    let source = Arc::new(MemorySource::new());
    let trigger = trigger(source.clone());
    let started = Instant::now();
    let telemetry = Telemetry::start(&config, "instance-1", vec![trigger.clone()]).expect("the exporter starts");
    assert!(started.elapsed() < Duration::from_secs(1), "start-up took {:?}", started.elapsed());

    // WHEN a tick delivers three changes and the next acknowledges them, and two more wait
    source.upsert([1, 2, 3], 1);
    let first = trigger.tick(&Attempt::fresh(Some(RetryContext::first(5)))).await.expect("tick");
    assert_eq!(first.changes.len(), 3);
    trigger.tick(&Attempt::fresh(Some(RetryContext::first(5)))).await.expect("tick");
    source.upsert([4, 5], 2);

    // THEN every instrument arrives with the ticks' values and the status poll's
    let f = ("function", "Orders");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let arrived = EXPECTED.iter().all(|name| latest(&received, name, &[f]).is_some())
            && latest(&received, "sql_trigger.changes.pending", &[f]) == Some(2.0);
        if arrived {
            break;
        }
        assert!(Instant::now() < deadline, "metrics did not arrive within 20 s; got {:?}", names(&received));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(latest(&received, "sql_trigger.ticks", &[f, ("outcome", "delivered")]), Some(1.0));
    assert_eq!(latest(&received, "sql_trigger.ticks", &[f, ("outcome", "empty")]), Some(1.0));
    assert_eq!(latest(&received, "sql_trigger.changes.delivered", &[f]), Some(3.0));
    assert_eq!(latest(&received, "sql_trigger.batch.size", &[f]), Some(1.0), "one batch");
    assert_eq!(latest(&received, "sql_trigger.target_workers", &[f]), Some(1.0));
    // AND the request carries the header and names the service and the instance
    {
        let received = received.lock().expect("received lock");
        let (headers, request) = received.last().expect("a request");
        assert_eq!(headers.get("x-api-key").and_then(|v| v.to_str().ok()), Some("test key"));
        assert_eq!(headers.get("content-type").and_then(|v| v.to_str().ok()), Some("application/x-protobuf"));
        let resource = request.resource_metrics[0].resource.as_ref().expect("a resource");
        assert_eq!(string_attribute(&resource.attributes, "service.name"), Some("telemetry-test"));
        assert_eq!(string_attribute(&resource.attributes, "service.instance.id"), Some("instance-1"));
    }

    // AND shutdown exports once more and returns promptly
    let requests_before = received.lock().expect("received lock").len();
    let stopping = Instant::now();
    telemetry.shutdown().await;
    assert!(stopping.elapsed() < Duration::from_secs(5), "shutdown took {:?}", stopping.elapsed());
    assert!(received.lock().expect("received lock").len() > requests_before, "no final export");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pace_and_the_time_to_drain_arrive_once_the_pace_is_known() {
    // GIVEN a function on a manual clock that acknowledged two batches 30 s apart and has a third in flight
    let received = Received::default();
    let url = receiver(received.clone()).await;
    let env = Env::from_pairs(
        [("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_str()), ("Sql_Trigger_MetricsIntervalMs", "100")]
            .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    let config = TelemetryConfig::from_env(&env, "pace-test").expect("valid settings").expect("an exporter");
    let source = Arc::new(MemorySource::new());
    let clock = Arc::new(sql_pseudo_trigger::clock::ManualClock::default());
    let trigger = Arc::new(trigger_on(source.clone(), clock.clone()));
    source.upsert(1..=300, 1);
    for _ in 0..3 {
        trigger.tick(&Attempt::fresh(Some(RetryContext::first(5)))).await.expect("tick");
        clock.advance(Duration::from_secs(30));
    }
    let status = sql_pseudo_trigger::ops::status(&trigger).await.expect("status");
    let (pace, drain) = (status.pace_per_second.expect("known"), status.seconds_to_drain.expect("moving"));

    // WHEN the status poll exports them
    let telemetry = Telemetry::start(&config, "instance-1", vec![trigger.clone()]).expect("the exporter starts");

    // THEN the gauges carry status's values
    let f = ("function", "Orders");
    let deadline = Instant::now() + Duration::from_secs(20);
    while latest(&received, "sql_trigger.seconds_to_drain", &[f]).is_none() {
        assert!(Instant::now() < deadline, "the gauges did not arrive within 20 s; got {:?}", names(&received));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(latest(&received, "sql_trigger.pace", &[f]), Some(pace));
    assert_eq!(latest(&received, "sql_trigger.seconds_to_drain", &[f]), Some(drain));
    assert_eq!(status.pending, 100, "the batch in flight");
    telemetry.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_is_down_neither_blocks_ticks_nor_shutdown() {
    // GIVEN an exporter pointed at a port where nothing listens
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    drop(listener);
    let env = Env::from_pairs(
        [("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_str()), ("Sql_Trigger_MetricsIntervalMs", "50")]
            .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    let config = TelemetryConfig::from_env(&env, "down").expect("valid").expect("an exporter");
    let source = Arc::new(MemorySource::new());
    let trigger = trigger(source.clone());
    let telemetry = Telemetry::start(&config, "instance-1", vec![trigger.clone()]).expect("starts");

    // WHEN ticks run while exports fail
    source.upsert([1], 1);
    for _ in 0..3 {
        trigger.tick(&Attempt::fresh(Some(RetryContext::first(5)))).await.expect("tick");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    // THEN the ticks were unaffected and shutdown still returns promptly
    assert_eq!(trigger.last_tick().expect("ticks ran").ticks, 3);
    let stopping = Instant::now();
    telemetry.shutdown().await;
    assert!(stopping.elapsed() < Duration::from_secs(7), "shutdown took {:?}", stopping.elapsed());
}

fn names(received: &Received) -> Vec<String> {
    let received = received.lock().expect("received lock");
    let mut names: Vec<String> = received
        .iter()
        .flat_map(|(_, r)| r.resource_metrics.iter())
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .map(|m| m.name.clone())
        .collect();
    names.sort();
    names.dedup();
    names
}
