//! `handler run`: the same functions without the Functions host, for containers, VMs and laptops.
//!
//! One loop per function plays the host's part: it ticks, hands the batch to the function's sink, and on a
//! failed delivery ticks again as a *retry* (the signal a host retry gives), so the engine re-delivers the same
//! batch and counts the failure toward `Sql_Trigger_MaxAttempts`. After a full batch it ticks again at once
//! (draining a backlog); otherwise it waits `Sql_Trigger_PollingIntervalMs`. On SIGTERM the batch in hand is
//! finished, the last delivered batch is acknowledged, and the lease released, so nothing is lost and the next
//! process starts at once.

use crate::app::App;
use crate::protocol::RetryContext;
use crate::sink::{Sink, SinkBatch};
use crate::trigger::{OutcomeKind, Trigger};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How often a draining function logs its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    /// Stop each function after its first empty tick (drain the backlog, then exit).
    pub once: bool,
}

/// Runs every function until `stop` turns true (or, with `once`, until each is drained).
pub async fn run(
    app: Arc<App>,
    sinks: Vec<(Arc<Trigger>, Arc<dyn Sink>)>,
    options: RunOptions,
    stop: watch::Receiver<bool>,
) -> RunSummary {
    let mut tasks = Vec::new();
    for (trigger, sink) in sinks {
        let app_name = app.config.app_name.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move { run_one(&app_name, trigger, sink, options, stop).await }));
    }
    let mut summary = RunSummary::default();
    for t in tasks {
        if let Ok(s) = t.await {
            summary.delivered += s.delivered;
            summary.batches += s.batches;
            summary.failed_deliveries += s.failed_deliveries;
        }
    }
    summary
}

#[derive(Debug, Default, Clone, Copy)]
pub struct RunSummary {
    pub delivered: u64,
    pub batches: u64,
    pub failed_deliveries: u64,
}

async fn run_one(
    app: &str,
    trigger: Arc<Trigger>,
    sink: Arc<dyn Sink>,
    options: RunOptions,
    mut stop: watch::Receiver<bool>,
) -> RunSummary {
    let name = trigger.name().to_string();
    let settings = trigger.config().settings.clone();
    tracing::info!(function = %name, sink = %sink.describe(), "running without the Functions host");
    let mut summary = RunSummary::default();
    let mut retry = RetryContext::default();
    let mut last_delivered_ok = false;
    let mut window = (Instant::now(), 0u64);
    loop {
        if *stop.borrow() {
            break;
        }
        let pause = match trigger.tick(retry).await {
            Ok(outcome) if !outcome.changes.is_empty() => {
                let batch = SinkBatch {
                    app,
                    function: &name,
                    batch_id: outcome.batch_id.unwrap_or(0),
                    fence: outcome.fence,
                    changes: &outcome.changes,
                };
                match sink.deliver(&batch).await {
                    Ok(()) => {
                        let n = outcome.changes.len() as u64;
                        summary.delivered += n;
                        summary.batches += 1;
                        window.1 += n;
                        retry = RetryContext::default();
                        last_delivered_ok = true;
                        if outcome.changes.len() >= settings.max_batch_size {
                            Duration::ZERO
                        } else {
                            settings.polling_interval
                        }
                    }
                    Err(e) => {
                        summary.failed_deliveries += 1;
                        last_delivered_ok = false;
                        // The next tick is a retry: the engine re-delivers this batch and counts the failure.
                        retry = RetryContext { retry_count: retry.retry_count + 1, max_retry_count: -1 };
                        tracing::warn!(function = %name, batch_id = batch.batch_id, error = %e, "delivery failed; the batch will be delivered again");
                        backoff(retry.retry_count, settings.polling_interval)
                    }
                }
            }
            Ok(outcome) => {
                if options.once && matches!(outcome.kind, OutcomeKind::Empty) && retry.retry_count == 0 {
                    break;
                }
                settings.polling_interval
            }
            Err(e) => {
                tracing::warn!(function = %name, error = %e, hint = e.hint(), "tick failed");
                backoff(retry.retry_count + 1, settings.polling_interval)
            }
        };
        if window.0.elapsed() >= PROGRESS_EVERY && window.1 > 0 {
            let rate = window.1 as f64 / window.0.elapsed().as_secs_f64();
            tracing::info!(function = %name, delivered = summary.delivered, rows_per_second = rate.round(), "draining");
            window = (Instant::now(), 0);
        }
        if !pause.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                _ = stop.changed() => {}
            }
        }
    }
    if last_delivered_ok {
        match trigger.settle().await {
            Ok(true) => {
                tracing::info!(function = %name, "acknowledged the last delivered batch and released the lease")
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(function = %name, error = %e, "could not acknowledge the last batch; the next run re-delivers it")
            }
        }
    }
    tracing::info!(function = %name, delivered = summary.delivered, batches = summary.batches, "stopped");
    summary
}

fn backoff(attempt: i64, base: Duration) -> Duration {
    let factor = 1u32 << attempt.clamp(0, 6) as u32;
    (base * factor).min(Duration::from_secs(60))
}
