//! `handler run`: the same functions without the Functions host, for containers, VMs and laptops.
//!
//! One loop per function. Each tick records the batch in flight, hands it to the function's sink and
//! acknowledges it once the sink took it ([`Trigger::tick_into`], the sink delivery mode's tick, whatever the
//! function's `deliveryMode`: `deferred` and `immediate` describe the host's output bindings, and there is no
//! host here). A sink's refusal counts toward `Sql_Trigger_MaxAttempts` (then quarantine or halt); an outage of
//! the destination is not the batch's fault and is never counted, so it never quarantines a batch; a fencing
//! refusal is not counted either (see `Trigger::raise_fence_on`). After a full batch the loop ticks again at
//! once (draining a backlog); otherwise it waits `Sql_Trigger_PollingIntervalMs`; after a failure it backs off.
//! On SIGTERM the tick in hand finishes (its batch delivered and acknowledged), a batch recorded for the next
//! tick and never delivered is withdrawn, and the lease released, so nothing is lost and the next process
//! starts at once.
//!
//! A partitioned function (`"partitions": N`) is shared by the processes of a deployment: each runs a balancer
//! and the loops of only the partitions it owns (`partitions.rs`). A `--once` drain runs every partition, as it
//! runs every function: it drains what is there and stops, owning nothing.

mod drain;
mod partitions;

use crate::app::App;
use crate::clock::SystemClock;
use crate::config::DeliveryMode;
use crate::engine::{OutcomeKind, RetryDirective, TickError, TickOutcome, Trigger};
use crate::partitions::{Group, Owners};
use crate::sink::Sink;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How often a draining function logs its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy)]
pub struct RunOptions {
    /// Drain each function's backlog, then exit: stop once an empty tick finds the source past the position
    /// it had when the drain started (`drain.rs`).
    pub once: bool,
    /// With `once`: how long a function may fail without a break (its source, state store or destination
    /// unavailable) before its drain gives up and says so in the exit status. A long-running process never
    /// gives up: it waits out any outage.
    pub give_up_after: Duration,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self { once: false, give_up_after: DEFAULT_GIVE_UP_AFTER }
    }
}

/// How long a `--once` drain waits out an outage before it gives up.
pub const DEFAULT_GIVE_UP_AFTER: Duration = Duration::from_secs(300);

/// Since when a function has been failing without a break (any successful tick or delivery ends a streak).
#[derive(Debug)]
struct Streak {
    /// `None` when the run never gives up (not `--once`).
    limit: Option<Duration>,
    since: Option<Instant>,
}

impl Streak {
    fn new(options: RunOptions) -> Self {
        Self { limit: options.once.then_some(options.give_up_after), since: None }
    }

    fn ok(&mut self) {
        self.since = None;
    }

    /// Records a failure; `true` when the failures have lasted `limit` or longer: time to give up.
    fn failed(&mut self) -> bool {
        let since = *self.since.get_or_insert_with(Instant::now);
        self.limit.is_some_and(|limit| since.elapsed() >= limit)
    }

    /// How the drain's result names the error it gave up at.
    fn gave_up(&self, error: &dyn std::fmt::Display) -> String {
        let secs = self.since.map_or(0, |s| s.elapsed().as_secs());
        format!(
            "still failing after {secs} s, so this drain gave up: {error} (the next run goes on from the last acknowledged batch; --give-up-after sets the wait)"
        )
    }
}

/// Runs every function until `stop` turns true (or, with `once`, until each is drained).
pub async fn run(app: Arc<App>, options: RunOptions, stop: watch::Receiver<bool>) -> RunSummary {
    let mut tasks = Vec::new();
    // Built for `handler run`, every trigger delivers through a sink (stdout JSON lines when none is named).
    let sinks = app.triggers().filter_map(|t| Some((t.clone(), t.sink()?.clone())));
    // A partitioned function's partitions, by group and count, balanced among the processes (not in a drain).
    let mut groups: BTreeMap<(String, u32), partitions::Parts> = BTreeMap::new();
    for (trigger, sink) in sinks {
        let app_name = app.config.app_name.clone();
        if let (false, Some(p)) = (options.once, trigger.config().partition()) {
            let key = (trigger.config().partitioning.group.clone(), p.count.get());
            groups.entry(key).or_default().insert(p.index, (trigger, sink));
            continue;
        }
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move { run_one(&app_name, trigger, sink, options, stop).await }));
    }
    for ((group, _), parts) in groups {
        let Some((first, _)) = parts.values().next() else { continue };
        let Some(count) = first.config().partition().map(|p| p.count) else { continue };
        let lease = first.config().settings.lease_duration;
        let group =
            Group { app: app.config.app_name.clone(), name: group, count, served: parts.keys().copied().collect() };
        let owners = Owners::new(app.store.clone(), group, &app.owner, lease, Arc::new(SystemClock));
        let (app_name, stop) = (app.config.app_name.clone(), stop.clone());
        tasks.push(tokio::spawn(partitions::run_group(app_name, owners, parts, options, stop)));
    }
    let mut summary = RunSummary::default();
    for t in tasks {
        if let Ok(s) = t.await {
            summary.delivered += s.delivered;
            summary.batches += s.batches;
            summary.failed_deliveries += s.failed_deliveries;
            summary.stopped.extend(s.stopped);
        }
    }
    summary
}

#[derive(Debug, Default, Clone)]
pub struct RunSummary {
    pub delivered: u64,
    pub batches: u64,
    pub failed_deliveries: u64,
    /// Functions a `--once` drain gave up on because of an error only an operator can clear (a halt, a changed
    /// source, a refused store, a table that does not fit the configuration), each with what to do. Not empty
    /// means the drain did not finish: the process must say so in its exit status, or a script that runs
    /// `handler run --once` would take a stuck function for a drained one.
    pub stopped: Vec<Stopped>,
}

/// A function whose drain stopped at an operator error.
#[derive(Debug, Clone, PartialEq)]
pub struct Stopped {
    pub function: String,
    /// The error and its hint, as the log line gives them.
    pub error: String,
}

impl RunSummary {
    /// `Err` naming every function a drain stopped at, with its error: the process's exit status.
    pub fn result(&self) -> Result<(), String> {
        if self.stopped.is_empty() {
            return Ok(());
        }
        let lines: Vec<String> = self.stopped.iter().map(|s| format!("function {}: {}", s.function, s.error)).collect();
        Err(format!("the drain stopped before the end of the backlog:\n  {}", lines.join("\n  ")))
    }
}

/// One function's loop: each tick delivers through the sink and acknowledges by itself ([`Trigger::tick_into`]);
/// a failed tick is followed by a back-off, and the engine re-delivers the same batch (counting it toward
/// MaxAttempts if the sink rejected it, never for an outage).
pub async fn run_one(
    app: &str,
    trigger: Arc<Trigger>,
    sink: Arc<dyn Sink>,
    options: RunOptions,
    mut stop: watch::Receiver<bool>,
) -> RunSummary {
    let name = trigger.name().to_string();
    let settings = trigger.config().settings.clone();
    tracing::info!(function = %name, app, sink = %sink.describe(), "running without the Functions host");
    if settings.delivery_mode != DeliveryMode::Sink {
        tracing::info!(function = %name, mode = ?settings.delivery_mode,
            "without the Functions host every function delivers through its sink and acknowledges after it (at-least-once): deliveryMode deferred and immediate are about the host's output bindings");
    }
    let mut summary = RunSummary::default();
    let mut failures = 0i64;
    let mut window = (Instant::now(), 0u64);
    let mut streak = Streak::new(options);
    let mut drain = options.once.then(|| drain::Drain::new(options.give_up_after));
    while !*stop.borrow() {
        let ticked = match drain.as_mut() {
            Some(d) => match d.begin(&trigger).await {
                Ok(()) => trigger.tick_into(sink.as_ref()).await,
                Err(e) => Err(e),
            },
            None => trigger.tick_into(sink.as_ref()).await,
        };
        let ticked = match (ticked, drain.as_mut()) {
            (Ok(outcome), Some(d)) if matches!(outcome.kind, OutcomeKind::Empty | OutcomeKind::Paused) => {
                d.after_empty(&trigger, &outcome).await.map(|verdict| (outcome, Some(verdict)))
            }
            (ticked, _) => ticked.map(|outcome| (outcome, None)),
        };
        let pause = match ticked {
            Ok((outcome, verdict)) => {
                failures = 0;
                streak.ok();
                let n = outcome.changes.len() as u64;
                summary.delivered += n;
                summary.batches += u64::from(n > 0);
                window.1 += n;
                match (verdict, drain.as_mut()) {
                    (Some(drain::Verdict::Done), _) => break,
                    (Some(drain::Verdict::GaveUp(error)), _) => {
                        tracing::error!(function = %name, "{error}");
                        summary.stopped.push(Stopped { function: name.clone(), error });
                        break;
                    }
                    (None, Some(d)) if n > 0 => d.delivered(),
                    _ => {}
                }
                pause_after(&outcome, settings.max_batch_size, settings.polling_interval)
            }
            // A rejected batch is retried until MaxAttempts quarantines it; other operator errors do not pass
            // by waiting, so a drain stops at them.
            Err(e) if options.once && e.directive() == RetryDirective::Stop => {
                tracing::error!(function = %name, error = %e, hint = e.hint(), "tick failed; stopping this drain");
                summary.stopped.push(Stopped { function: name.clone(), error: format!("{e} ({})", e.hint()) });
                break;
            }
            Err(e) => {
                failures += 1;
                summary.failed_deliveries += u64::from(matches!(e, TickError::Sink(_)));
                tracing::warn!(function = %name, error = %e, hint = e.hint(), "tick failed; the batch will be delivered again");
                // A rejected batch ends in quarantine (or a halt) by itself; an outage is waited out, up to a
                // point for a drain.
                if e.directive() == RetryDirective::RetryLater && !*stop.borrow() && streak.failed() {
                    let error = streak.gave_up(&e);
                    tracing::error!(function = %name, "{error}");
                    summary.stopped.push(Stopped { function: name.clone(), error });
                    break;
                }
                backoff(failures, settings.polling_interval)
            }
        };
        pace(&name, &summary, &mut window, pause, &mut stop).await;
    }
    crate::app::release_on_stop(&trigger).await;
    tracing::info!(function = %name, delivered = summary.delivered, batches = summary.batches, "stopped");
    summary
}

/// How long a function's loop waits after a successful tick: not at all while there is a backlog, which is a
/// full batch (more changes are likely waiting) or a delivering tick while a backfill runs (its chunks are
/// waiting whatever the live fetch found); the polling interval otherwise. Without the second, a trickle of
/// live changes (each tick finds a few, and a chunk gets only the ticks that find none, or one in five) would
/// hold a backfill to about one chunk per interval: with the default second, a million rows in chunks of 1000
/// would take most of an hour. An empty tick always waits, so a paused or leased-away backfill never spins.
fn pause_after(outcome: &TickOutcome, max_batch_size: usize, polling_interval: Duration) -> Duration {
    let delivered = outcome.changes.len();
    if delivered >= max_batch_size || (delivered > 0 && outcome.backfill_running) {
        Duration::ZERO
    } else {
        polling_interval
    }
}

/// Logs the drain's rate now and then, then waits `pause` (cut short by a stop).
async fn pace(
    name: &str,
    summary: &RunSummary,
    window: &mut (Instant, u64),
    pause: Duration,
    stop: &mut watch::Receiver<bool>,
) {
    if window.0.elapsed() >= PROGRESS_EVERY && window.1 > 0 {
        let rate = window.1 as f64 / window.0.elapsed().as_secs_f64();
        tracing::info!(function = %name, delivered = summary.delivered, rows_per_second = rate.round(), "draining");
        *window = (Instant::now(), 0);
    }
    if !pause.is_zero() {
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = stop.changed() => {}
        }
    }
}

fn backoff(attempt: i64, base: Duration) -> Duration {
    let factor = 1u32 << attempt.clamp(0, 6) as u32;
    (base * factor).min(Duration::from_secs(60))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_drain_gives_up_and_any_success_starts_the_wait_again() {
        let never = RunOptions { once: false, give_up_after: Duration::ZERO };
        let mut streak = Streak::new(never);
        assert!(!streak.failed(), "a long-running process waits out any outage");
        let drain = RunOptions { once: true, give_up_after: Duration::from_secs(3600) };
        let mut streak = Streak::new(drain);
        assert!(!streak.failed());
        streak.since = Some(Instant::now() - Duration::from_secs(3600));
        assert!(streak.failed(), "an hour of failures without a break");
        streak.ok();
        assert!(!streak.failed(), "a success ends the streak");
    }

    #[test]
    fn a_loop_waits_the_polling_interval_only_without_a_backlog_and_never_after_a_delivering_tick_of_a_backfill() {
        let second = Duration::from_secs(1);
        let change = || crate::change::Change::from_json(crate::change::Operation::Insert, "{}".into()).expect("json");
        let outcome = |rows: usize, backfill_running| TickOutcome {
            changes: (0..rows).map(|_| change()).collect(),
            backfill_running,
            ..TickOutcome::default()
        };
        assert_eq!(pause_after(&outcome(10, false), 10, second), Duration::ZERO, "a full batch");
        assert_eq!(pause_after(&outcome(3, false), 10, second), second, "a live trickle without a backfill");
        assert_eq!(pause_after(&outcome(3, true), 10, second), Duration::ZERO, "a live trickle beside a backfill");
        assert_eq!(pause_after(&outcome(0, true), 10, second), second, "an empty tick (paused, leased away)");
    }

    #[test]
    fn backoff_doubles_from_the_polling_interval_and_stops_at_a_minute() {
        let base = Duration::from_secs(1);
        assert_eq!(backoff(1, base), Duration::from_secs(2));
        assert_eq!(backoff(3, base), Duration::from_secs(8));
        assert_eq!(backoff(6, base), Duration::from_secs(60));
        assert_eq!(backoff(1_000, base), Duration::from_secs(60));
        assert_eq!(backoff(-5, base), base);
    }
}
