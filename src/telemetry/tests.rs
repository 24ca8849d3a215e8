//! The metrics settings and exporters (tests/engine/telemetry.rs checks what a tick and a status poll record,
//! tests/telemetry.rs the OTLP wire end to end).

use super::instruments::outcome_label;
use super::*;
use crate::config::{ConfigErrors, Env};
use crate::engine::{ErrorKind, OutcomeKind};

fn env(pairs: &[(&str, &str)]) -> Env {
    Env::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
}

fn config(pairs: &[(&str, &str)]) -> Result<Option<TelemetryConfig>, ConfigErrors> {
    TelemetryConfig::from_env(&env(pairs), "my-app")
}

// ---- settings ----

#[test]
fn without_an_exporter_nothing_is_configured() {
    assert!(config(&[]).expect("valid").is_none());
    assert!(config(&[("Sql_Trigger_MetricsIntervalMs", "5000")]).expect("valid").is_none());
}

#[test]
fn the_otlp_base_endpoint_gets_the_metrics_path_and_the_signal_endpoint_is_taken_as_is() {
    let c = config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")]).expect("valid").expect("on");
    assert_eq!(c.otlp_endpoint.as_deref(), Some("http://collector:4318/v1/metrics"));
    assert_eq!(c.interval, Duration::from_secs(30));
    assert_eq!(c.service_name, "my-app");
    let c = config(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://ignored:4318"),
        ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "https://otlp.example/custom/path"),
        ("OTEL_SERVICE_NAME", "orders-trigger"),
    ])
    .expect("valid")
    .expect("on");
    assert_eq!(c.otlp_endpoint.as_deref(), Some("https://otlp.example/custom/path"));
    assert_eq!(c.service_name, "orders-trigger");
}

#[test]
fn grpc_and_bad_urls_are_refused_naming_the_setting() {
    let errors = config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")])
        .expect_err("grpc is refused")
        .to_string();
    assert!(errors.contains("OTEL_EXPORTER_OTLP_PROTOCOL") && errors.contains("http/protobuf"), "{errors}");
    let errors = config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")]).expect_err("not a URL").to_string();
    assert!(errors.contains("OTEL_EXPORTER_OTLP_ENDPOINT") && errors.contains("http://"), "{errors}");
    let errors = config(&[
        ("APPLICATIONINSIGHTS_CONNECTION_STRING", "InstrumentationKey=k"),
        ("Sql_Trigger_MetricsIntervalMs", "0"),
    ])
    .expect_err("zero interval")
    .to_string();
    assert!(errors.contains("Sql_Trigger_MetricsIntervalMs"), "{errors}");
}

#[test]
fn headers_are_url_decoded_and_never_printed() {
    let c = config(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=s3cr%3Dt, x-team = data"),
        ("APPLICATIONINSIGHTS_CONNECTION_STRING", "InstrumentationKey=very-secret"),
    ])
    .expect("valid")
    .expect("on");
    let headers: Vec<(&str, &str)> = c.otlp_headers.iter().map(|(k, v)| (k.as_str(), v.expose())).collect();
    assert_eq!(headers, [("api-key", "s3cr=t"), ("x-team", "data")]);
    let printed = format!("{c:?}");
    assert!(!printed.contains("s3cr") && !printed.contains("very-secret"), "{printed}");
    let errors = config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), ("OTEL_EXPORTER_OTLP_HEADERS", "token")])
        .expect_err("not key=value")
        .to_string();
    assert!(errors.contains("OTEL_EXPORTER_OTLP_HEADERS") && !errors.contains("token"), "{errors}");
}

#[test]
fn metrics_can_be_turned_off_or_limited_to_one_exporter() {
    let both = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
        ("APPLICATIONINSIGHTS_CONNECTION_STRING", "InstrumentationKey=k"),
    ];
    let with = |extra: (&str, &str)| {
        let mut pairs = both.to_vec();
        pairs.push(extra);
        config(&pairs).expect("valid")
    };
    assert!(with(("Sql_Trigger_Metrics", "off")).is_none());
    assert!(with(("OTEL_SDK_DISABLED", "true")).is_none());
    assert!(with(("OTEL_METRICS_EXPORTER", "none")).is_none());
    let otlp = with(("Sql_Trigger_Metrics", "otlp")).expect("on");
    assert!(otlp.otlp_endpoint.is_some() && otlp.app_insights.is_none());
    let ai = with(("Sql_Trigger_Metrics", "AppInsights")).expect("on");
    assert!(ai.otlp_endpoint.is_none() && ai.app_insights.is_some());
    let auto = with(("Sql_Trigger_Metrics", "auto")).expect("on");
    assert!(auto.otlp_endpoint.is_some() && auto.app_insights.is_some());
}

// ---- recording ----

#[test]
fn outcomes_have_stable_lowercase_labels() {
    assert_eq!(outcome_label(Ok(OutcomeKind::LeaseHeld)), "lease_held");
    assert_eq!(outcome_label(Ok(OutcomeKind::Redelivered)), "redelivered");
    assert_eq!(outcome_label(Err(ErrorKind::Operator)), "failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_insights_is_set_up_from_its_connection_string_without_the_network() {
    // GIVEN a connection string (its ingestion endpoint is never reached: nothing is recorded)
    let ikey = "InstrumentationKey=00000000-0000-0000-0000-000000000000;IngestionEndpoint=https://127.0.0.1:9/";
    let c = config(&[("APPLICATIONINSIGHTS_CONNECTION_STRING", ikey)]).expect("valid").expect("on");

    // WHEN metrics start and stop
    let started = Instant::now();
    let telemetry = Telemetry::start(&c, "instance-1", Vec::new()).expect("the exporter is built");

    // THEN start-up is quick and so is a shutdown with nothing to send
    assert!(started.elapsed() < Duration::from_secs(1), "start-up took {:?}", started.elapsed());
    let stopping = Instant::now();
    telemetry.shutdown().await;
    assert!(stopping.elapsed() < Duration::from_secs(2), "shutdown took {:?}", stopping.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_connection_string_is_an_error_naming_the_setting() {
    let c = config(&[("APPLICATIONINSIGHTS_CONNECTION_STRING", "InstrumentationKey=k;Authorization=AAD")])
        .expect("valid")
        .expect("on");
    let error = Telemetry::start(&c, "instance-1", Vec::new()).expect_err("Entra ID auth is not supported");
    assert!(error.contains("APPLICATIONINSIGHTS_CONNECTION_STRING"), "{error}");
}
