//! What a tick and a status poll record, through a capturing exporter on the SDK's own periodic reader (flushed
//! by hand), so these tests need no network; tests/telemetry.rs checks the OTLP wire end to end.

use opentelemetry::KeyValue;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider, Temporality};
use sql_pseudo_trigger::config::FunctionConfig;
use sql_pseudo_trigger::engine::Trigger;
use sql_pseudo_trigger::state::MemoryStore;
use sql_pseudo_trigger::telemetry::Telemetry;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testbed::MemorySource;

/// One exported data point: a sum's or gauge's value, or a histogram's sum and count.
#[derive(Debug, Clone, PartialEq)]
struct Point {
    metric: String,
    attributes: BTreeMap<String, String>,
    value: f64,
    count: u64,
}

/// Keeps the points of the latest export (cumulative, so the latest holds everything so far).
#[derive(Debug, Clone, Default)]
struct Capture(Arc<Mutex<Vec<Point>>>);

impl Capture {
    fn points(&self, metric: &str) -> Vec<Point> {
        self.0.lock().expect("capture lock").iter().filter(|p| p.metric == metric).cloned().collect()
    }

    /// The one point of `metric` whose attributes include every pair in `with`.
    fn point(&self, metric: &str, with: &[(&str, &str)]) -> Option<Point> {
        let matching: Vec<Point> = self
            .points(metric)
            .into_iter()
            .filter(|p| with.iter().all(|(k, v)| p.attributes.get(*k).map(String::as_str) == Some(*v)))
            .collect();
        assert!(matching.len() <= 1, "{metric} {with:?} matches {matching:?}");
        matching.into_iter().next()
    }
}

fn flatten<T: Copy>(metric: &str, data: &MetricData<T>, to_f64: fn(T) -> f64, out: &mut Vec<Point>) {
    let attributes = |attrs: &mut dyn Iterator<Item = &KeyValue>| {
        attrs.map(|kv| (kv.key.as_str().to_string(), kv.value.as_str().into_owned())).collect()
    };
    match data {
        MetricData::Gauge(g) => out.extend(g.data_points().map(|p| Point {
            metric: metric.into(),
            attributes: attributes(&mut p.attributes()),
            value: to_f64(p.value()),
            count: 1,
        })),
        MetricData::Sum(s) => out.extend(s.data_points().map(|p| Point {
            metric: metric.into(),
            attributes: attributes(&mut p.attributes()),
            value: to_f64(p.value()),
            count: 1,
        })),
        MetricData::Histogram(h) => out.extend(h.data_points().map(|p| Point {
            metric: metric.into(),
            attributes: attributes(&mut p.attributes()),
            value: to_f64(p.sum()),
            count: p.count(),
        })),
        _ => {}
    }
}

impl PushMetricExporter for Capture {
    fn export(&self, metrics: &ResourceMetrics) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let mut points = Vec::new();
        for scope in metrics.scope_metrics() {
            for m in scope.metrics() {
                match m.data() {
                    AggregatedMetrics::U64(d) => flatten(m.name(), d, |v| v as f64, &mut points),
                    AggregatedMetrics::I64(d) => flatten(m.name(), d, |v| v as f64, &mut points),
                    AggregatedMetrics::F64(d) => flatten(m.name(), d, |v| v, &mut points),
                }
            }
        }
        *self.0.lock().expect("capture lock") = points;
        std::future::ready(Ok(()))
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }

    fn temporality(&self) -> Temporality {
        Temporality::Cumulative
    }
}

/// A function named `orders` (the engine reads only its settings).
fn function_config() -> FunctionConfig {
    testbed::config::function("orders", testbed::config::settings())
}

struct Setup {
    source: Arc<MemorySource>,
    trigger: Arc<Trigger>,
    capture: Capture,
    provider: SdkMeterProvider,
    telemetry: Telemetry,
}

/// A trigger over memory, observed by telemetry whose only reader is the capture, exported on `flush`.
fn setup(poll_every: Duration) -> Setup {
    let source = Arc::new(MemorySource::new());
    let trigger = Arc::new(Trigger::new(
        function_config(),
        "app",
        source.clone(),
        Arc::new(MemoryStore::new()),
        "owner-1".into(),
    ));
    let capture = Capture::default();
    // The reader's own schedule never fires within a test: `flush` exports.
    let reader = PeriodicReader::builder(capture.clone()).with_interval(Duration::from_secs(3600)).build();
    let provider = SdkMeterProvider::builder().with_reader(reader).build();
    let telemetry = Telemetry::over(provider.clone(), vec![trigger.clone()], poll_every);
    Setup { source, trigger, capture, provider, telemetry }
}

impl Setup {
    fn flush(&self) {
        self.provider.force_flush().expect("export");
    }

    /// Waits until a status poll has recorded its gauges (the poll's first run is at once).
    async fn wait_for_a_status_poll(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            self.flush();
            if self.capture.point("sql_trigger.changes.pending", &[("function", "orders")]).is_some() {
                return;
            }
            assert!(Instant::now() < deadline, "no status poll within 10 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tick_is_counted_by_outcome_with_its_batch_size_and_duration() {
    // GIVEN three changes waiting, and the status poll's first run (at once, then not for an hour) over: a
    // tick's store operations are the store's count across the tick, which a poll running meanwhile would add to
    let s = setup(Duration::from_secs(3600));
    s.wait_for_a_status_poll().await;
    s.source.upsert([1, 2, 3], 1);

    // WHEN one tick delivers them and the next acknowledges them and finds nothing new
    let first = s.trigger.tick(&testbed::attempts::first()).await.expect("tick");
    assert_eq!(first.changes.len(), 3);
    s.trigger.tick(&testbed::attempts::first()).await.expect("tick");
    s.flush();

    // THEN each tick is counted once under its outcome
    let f = ("function", "orders");
    let ticks = |outcome: &str| s.capture.point("sql_trigger.ticks", &[f, ("outcome", outcome)]).map(|p| p.value);
    assert_eq!((ticks("delivered"), ticks("empty")), (Some(1.0), Some(1.0)));
    // AND the batch's changes, size and duration are recorded
    let delivered = s.capture.point("sql_trigger.changes.delivered", &[f, ("outcome", "delivered")]).expect("changes");
    assert_eq!(delivered.value, 3.0);
    let size = s.capture.point("sql_trigger.batch.size", &[f]).expect("batch size");
    assert_eq!((size.count, size.value), (1, 3.0), "only the tick that answered a batch is a batch");
    let durations: u64 = s.capture.points("sql_trigger.tick.duration").iter().map(|p| p.count).sum();
    assert_eq!(durations, 2);
    // AND the state-store operations of both ticks (the first reads and commits, the second commits from the
    // document the first wrote)
    let ops = s.capture.point("sql_trigger.store.operations", &[f]).expect("store operations");
    assert_eq!(ops.value, 3.0);
    assert!(s.capture.points("sql_trigger.failures").is_empty());
    s.telemetry.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_tick_counts_a_failure_by_kind() {
    // GIVEN a database that is down for the next fetch
    let s = setup(Duration::from_secs(3600));
    s.source.upsert([1], 1);
    s.source.fail_next_fetches(1);

    // WHEN a tick fails on it
    s.trigger.tick(&testbed::attempts::first()).await.expect_err("the fetch fails");
    s.flush();

    // THEN it is a transient failure and a failed tick, with no batch recorded
    let f = ("function", "orders");
    let failures = s.capture.point("sql_trigger.failures", &[f, ("kind", "transient")]).expect("failure");
    assert_eq!(failures.value, 1.0);
    assert!(s.capture.point("sql_trigger.failures", &[f, ("kind", "operator")]).is_none());
    assert_eq!(s.capture.point("sql_trigger.ticks", &[f, ("outcome", "failed")]).map(|p| p.value), Some(1.0));
    assert!(s.capture.points("sql_trigger.batch.size").is_empty());
    s.telemetry.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gauges_report_the_last_status_poll() {
    // GIVEN 2,500 changes committed an hour ago waiting, and a status poll every 20 ms
    let s = setup(Duration::from_millis(20));
    let hour_ago = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
    s.source.upsert_at(1..=2500, 1, hour_ago);

    // WHEN a poll has run
    let deadline = Instant::now() + Duration::from_secs(10);
    let pending = loop {
        s.flush();
        // The first poll may have run before the changes were written: wait for one that saw them.
        match s.capture.point("sql_trigger.changes.pending", &[("function", "orders")]) {
            Some(p) if p.value > 0.0 => break p,
            _ => assert!(Instant::now() < deadline, "no status poll saw the changes within 10 s"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    // THEN the gauges carry what status computes: pending, ceil(pending / 1000) workers, nothing quarantined
    assert_eq!(pending.value, 2500.0);
    let gauge = |metric: &str| s.capture.point(metric, &[("function", "orders")]).map(|p| p.value);
    assert_eq!(gauge("sql_trigger.target_workers"), Some(3.0));
    assert_eq!(gauge("sql_trigger.batches.quarantined"), Some(0.0));
    assert!(gauge("sql_trigger.seconds_since_progress").is_some());
    // AND the lag is the hour those changes have waited, as of that poll (between then and now)
    let since_commit = (time::OffsetDateTime::now_utc() - hour_ago).as_seconds_f64();
    let lag = gauge("sql_trigger.lag").expect("the memory source dates its changes");
    assert!((3600.0..=since_commit).contains(&lag), "lag {lag}, at most {since_commit}");
    s.telemetry.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_liveness_gauges_report_the_failure_streak_and_the_time_since_at_collection() {
    // GIVEN a trigger on a manual clock, a status poll once an hour (its first runs at once), and a database
    // down for the next two fetches
    let source = Arc::new(MemorySource::new());
    let clock = sql_pseudo_trigger::clock::ManualClock::default();
    let trigger = Trigger::new(function_config(), "app", source.clone(), Arc::new(MemoryStore::new()), "o".into())
        .with_clock(Arc::new(clock.clone()));
    let trigger = Arc::new(trigger);
    let capture = Capture::default();
    let reader = PeriodicReader::builder(capture.clone()).with_interval(Duration::from_secs(3600)).build();
    let provider = SdkMeterProvider::builder().with_reader(reader).build();
    let telemetry = Telemetry::over(provider.clone(), vec![trigger.clone()], Duration::from_secs(3600));
    source.upsert([1], 1);
    source.fail_next_fetches(2);

    // WHEN two ticks fail five seconds apart, and two more seconds pass
    trigger.tick(&testbed::attempts::first()).await.expect_err("the fetch fails");
    clock.advance(Duration::from_secs(5));
    trigger.tick(&testbed::attempts::first()).await.expect_err("the fetch fails");
    clock.advance(Duration::from_secs(2));
    provider.force_flush().expect("export");

    // THEN the gauges say two failures in a row, the last invocation 2 s ago and no success in the 7 s since
    // the first tick: read from the trigger at collection, not from the status poll
    let gauge = |metric: &str| capture.point(metric, &[("function", "orders")]).map(|p| p.value);
    assert_eq!(gauge("sql_trigger.consecutive_failures"), Some(2.0));
    assert_eq!(gauge("sql_trigger.seconds_since_last_invocation"), Some(2.0));
    assert_eq!(gauge("sql_trigger.seconds_since_last_success"), Some(7.0));
    telemetry.shutdown().await;
}
