//! OpenTelemetry metrics, exported only when an exporter is configured: OTLP over http/protobuf
//! (`OTEL_EXPORTER_OTLP_ENDPOINT`, e.g. an OpenTelemetry Collector) and/or Application Insights
//! (`APPLICATIONINSIGHTS_CONNECTION_STRING`). With neither, [`start`] returns `None` and nothing is built: no
//! thread, no HTTP client, no observer on the triggers. docs/telemetry.md lists what is exported.
//!
//! Two sources feed the instruments, on purpose:
//! - **Every tick** reaches the counters and histograms through a
//!   [`TickObserver`](crate::engine::TickObserver) set on each trigger. A poll of
//!   `Trigger::last_tick()` would miss every tick but the last between two polls, and histograms need them all.
//!   Recording is an in-memory aggregation on the tick's task: no IO, no lock held across an await.
//! - **The gauges** (pending changes, target workers, lag, seconds since progress, pace, seconds to drain,
//!   quarantined batches) need the database, so a separate task refreshes them from `ops::status` every `Sql_Trigger_MetricsIntervalMs`, one
//!   function at a time with a timeout, and the gauge callbacks only read the last snapshot. The poll never
//!   takes a function's tick lock, so it cannot delay a tick, and a slow database delays only the gauges.
//! - **The liveness gauges** (seconds since the last invocation and success, consecutive failures) read each
//!   trigger's memory at collection (`telemetry::liveness`), so they keep reporting while the database is down.
//!
//! The SDK's periodic reader exports from its own thread with a blocking client, so one reqwest 0.13 blocking
//! client serves both exporters (no second HTTP stack, no gRPC). [`start`] is cheap and runs after the
//! listener is bound, so the host's readiness probe never waits for it.

mod config;
mod instruments;
mod liveness;

pub use config::TelemetryConfig;

use crate::app::App;
use crate::engine::Trigger;
use instruments::{register_gauges, Snapshots, StatusGauges, Targets, TickInstruments};
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::Resource;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The instrumentation scope of every instrument.
pub const METER_NAME: &str = "sql-pseudo-trigger";

/// Longest one export may take before the HTTP client gives up (the SDK's thread waits for it).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest one function's status may take in a poll; less when the interval is shorter.
const STATUS_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest shutdown waits for the last export, so a dead collector cannot hold up the process's exit.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Running metrics: the meter provider (and its export threads) and the status poll. End it with
/// [`Telemetry::shutdown`], which exports what was recorded since the last export.
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkMeterProvider,
    poll: AbortOnDrop,
}

/// Ends the status poll when dropped, so a forgotten [`Telemetry`] does not leave it querying the database.
#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts metrics for `app` if an exporter is configured. A telemetry problem never stops the trigger: it is
/// logged as an error naming the setting, and the handler runs without metrics. Call from within the runtime.
pub fn start(app: &App) -> Option<Telemetry> {
    let config = match TelemetryConfig::from_env(&app.config.env, &app.config.app_name) {
        Ok(Some(config)) => config,
        Ok(None) => return None,
        Err(errors) => {
            tracing::error!("metrics are off: {errors}");
            return None;
        }
    };
    let triggers: Vec<Arc<Trigger>> = app.triggers().cloned().collect();
    match Telemetry::start(&config, &app.owner, triggers) {
        Ok(telemetry) => Some(telemetry),
        Err(e) => {
            tracing::error!(error = %e, "metrics are off: the exporter could not be set up");
            None
        }
    }
}

impl Telemetry {
    /// Builds the exporters `config` names and starts observing `triggers`. `instance` is `service.instance.id`
    /// (the process's lease owner string, so metrics and leases name an instance alike).
    pub fn start(config: &TelemetryConfig, instance: &str, triggers: Vec<Arc<Trigger>>) -> Result<Self, String> {
        let started = Instant::now();
        let client = blocking_client()?;
        let resource = Resource::builder()
            .with_service_name(config.service_name.clone())
            .with_attribute(KeyValue::new("service.instance.id", instance.to_string()))
            .build();
        let mut builder = SdkMeterProvider::builder().with_resource(resource);
        let mut exporters = Vec::new();
        if let Some(endpoint) = &config.otlp_endpoint {
            use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
            let headers: HashMap<String, String> =
                config.otlp_headers.iter().map(|(k, v)| (k.clone(), v.expose().to_string())).collect();
            let exporter = opentelemetry_otlp::MetricExporter::builder()
                .with_http()
                .with_http_client(client.clone())
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(endpoint.clone())
                .with_headers(headers)
                .build()
                .map_err(|e| format!("OTLP exporter to {endpoint}: {e}"))?;
            builder = builder.with_reader(PeriodicReader::builder(exporter).with_interval(config.interval).build());
            exporters.push("otlp");
        }
        if let Some(connection_string) = &config.app_insights {
            let exporter = opentelemetry_application_insights::Exporter::new_from_connection_string(
                connection_string.expose(),
                client,
            )
            .map_err(|e| {
                format!("{} is not usable: {e}", crate::config::settings::APPLICATIONINSIGHTS_CONNECTION_STRING.name)
            })?;
            builder = builder.with_reader(PeriodicReader::builder(exporter).with_interval(config.interval).build());
            exporters.push("appinsights");
        }
        let telemetry = Self::over(builder.build(), triggers, config.interval);
        tracing::info!(
            exporters = ?exporters,
            endpoint = config.otlp_endpoint.as_deref().unwrap_or("-"),
            interval_ms = config.interval.as_millis() as u64,
            setup_ms = started.elapsed().as_secs_f64() * 1000.0,
            "metrics export started"
        );
        Ok(telemetry)
    }

    /// Records into `provider`: the observer on every trigger, the gauges and their status poll.
    pub fn over(provider: SdkMeterProvider, triggers: Vec<Arc<Trigger>>, interval: Duration) -> Self {
        let meter = provider.meter(METER_NAME);
        let observer = Arc::new(TickInstruments::new(&meter));
        for trigger in &triggers {
            if !trigger.observe(observer.clone()) {
                tracing::debug!(function = %trigger.name(), "this trigger already reports to another meter");
            }
        }
        let snapshots = Snapshots::default();
        let targets = Targets::default();
        register_gauges(&meter, &snapshots, &targets);
        liveness::register_gauges(&meter, &triggers);
        let poll = tokio::spawn(poll_status(triggers, snapshots, targets, interval));
        Self { provider, poll: AbortOnDrop(poll) }
    }

    /// Stops the status poll and exports what was recorded since the last export (waiting at most a few seconds).
    pub async fn shutdown(self) {
        let Self { provider, poll } = self;
        drop(poll);
        // The SDK's shutdown blocks until its export thread has sent the last batch: keep it off the runtime.
        let flush = tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT));
        match tokio::time::timeout(SHUTDOWN_TIMEOUT + Duration::from_secs(1), flush).await {
            Ok(Ok(Ok(()))) => tracing::debug!("metrics exported and stopped"),
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "the last metrics export failed"),
            Ok(Err(_)) | Err(_) => tracing::warn!("the last metrics export did not finish in time; exiting anyway"),
        }
    }
}

/// Shuts `telemetry` down if metrics were started: the entry points' one line at exit.
pub async fn stop(telemetry: Option<Telemetry>) {
    if let Some(telemetry) = telemetry {
        telemetry.shutdown().await;
    }
}

/// One reqwest 0.13 blocking client for every exporter. Built on a plain thread: reqwest's blocking client runs
/// its own small runtime and must not be created inside ours.
fn blocking_client() -> Result<reqwest::blocking::Client, String> {
    // reqwest is built without a crypto provider; the binary installs ring, tests and library users may not.
    let _ = rustls::crypto::ring::default_provider().install_default();
    std::thread::Builder::new()
        .name("metrics-http-setup".into())
        .spawn(|| {
            reqwest::blocking::Client::builder().timeout(EXPORT_TIMEOUT).connect_timeout(Duration::from_secs(5)).build()
        })
        .map_err(|e| format!("cannot start a thread for the metrics HTTP client: {e}"))?
        .join()
        .map_err(|_| "building the metrics HTTP client panicked".to_string())?
        .map_err(|e| format!("cannot build the metrics HTTP client: {e}"))
}

/// Refreshes the snapshots every `interval`, one function at a time, each status bounded by a timeout. A
/// function whose status fails drops out of the gauges (a stale value would hide the outage) until it answers
/// again; the failure is logged when it starts and the recovery when it ends, not at every poll.
async fn poll_status(triggers: Vec<Arc<Trigger>>, snapshots: Snapshots, targets: Targets, interval: Duration) {
    let bound = STATUS_TIMEOUT.min(interval);
    let mut failing = std::collections::BTreeSet::new();
    let mut every = tokio::time::interval(interval);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        for trigger in &triggers {
            let name = trigger.name();
            let result = match tokio::time::timeout(bound, crate::ops::status(trigger)).await {
                Ok(Ok(status)) => Ok(StatusGauges {
                    partition: status.partition.map(|p| (p.group, p.index)),
                    pending: status.pending,
                    target_workers: status.target_workers,
                    seconds_since_progress: status.seconds_since_progress,
                    lag: status.lag_seconds,
                    quarantined: status.quarantined as u64,
                    pace: status.pace_per_second,
                    seconds_to_drain: status.seconds_to_drain,
                }),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no answer within {bound:?}")),
            };
            let mut snapshots = snapshots.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match result {
                Ok(gauges) => {
                    snapshots.insert(name.to_string(), gauges);
                    if failing.remove(name) {
                        tracing::info!(function = %name, "status answers again; the metrics gauges report it");
                    }
                }
                Err(error) => {
                    snapshots.remove(name);
                    if failing.insert(name.to_string()) {
                        tracing::warn!(function = %name, error = %error, "status for the metrics gauges failed; they leave this function out until it answers");
                    }
                }
            }
        }
        let computed = {
            let snapshots = snapshots.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            replica_targets(&triggers, &snapshots)
        };
        *targets.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = computed;
    }
}

/// The replicas each function's backlog asks for, from the snapshots: a partitioned function (by its
/// `partitionGroup`) sums its partitions' pending changes, and is left out while any of them has no snapshot
/// (a backlog read in part would ask for too few).
fn replica_targets(triggers: &[Arc<Trigger>], snapshots: &BTreeMap<String, StatusGauges>) -> BTreeMap<String, u64> {
    // function -> (pending, partitions, max changes per worker, complete)
    let mut sums: BTreeMap<String, (u64, u32, u64, bool)> = BTreeMap::new();
    for t in triggers {
        let config = t.config();
        let (function, partitions) = match config.partition() {
            Some(p) => (config.partitioning.group.clone(), p.count.get()),
            None => (t.name().to_string(), 1),
        };
        let entry = sums.entry(function).or_insert((0, partitions, config.settings.max_changes_per_worker, true));
        match snapshots.get(t.name()) {
            Some(gauges) => entry.0 += gauges.pending,
            None => entry.3 = false,
        }
    }
    sums.into_iter()
        .filter(|(_, (_, _, _, complete))| *complete)
        .map(|(function, (pending, partitions, per_worker, _))| {
            (function, crate::partitions::status::target_replicas(pending, per_worker, partitions))
        })
        .collect()
}

#[cfg(test)]
mod tests;
