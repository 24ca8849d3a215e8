//! The liveness watchdog: logs an error, once per period, for each function that has not run for more than two
//! periods of its cadence (the host's timer schedule, or `handler run`'s loop), naming the function, its last
//! invocation and the likely causes. The decision is `engine::decide::liveness::check`; this file applies it.
//!
//! Why a task of its own: a host that stopped firing sends nothing, so nothing on the invocation path can
//! notice. It reads only what the triggers keep in memory (no state-store or database read), so checking every
//! second costs nothing and cannot be slowed by an outage.

use crate::app::App;
use crate::config::{Mode, TriggerSettings};
use crate::engine::decide::liveness::{check, Cadence, Silence, Verdict};
use crate::engine::Trigger;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// How often the watchdog looks: well under any period worth alerting on, and free (memory only).
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// The runner's longest pause after a failed tick (`runner::backoff`).
const RUNNER_BACKOFF_CAP: Duration = Duration::from_secs(60);

/// The running watchdog; it stops when dropped.
#[derive(Debug)]
pub struct Watchdog(tokio::task::JoinHandle<()>);

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts watching every function of `app`, driven as `mode` says (the cadence the watchdog expects depends on
/// who invokes the functions: the host's timer schedule, or `handler run`'s loop). Call from within the runtime.
pub fn start(app: &App, mode: Mode) -> Watchdog {
    let triggers: Vec<Arc<Trigger>> = app.triggers().cloned().collect();
    // Fix each function's baseline now, so "never invoked" counts from the start of the process.
    for trigger in &triggers {
        trigger.liveness();
    }
    Watchdog(tokio::spawn(watch(triggers, mode)))
}

async fn watch(triggers: Vec<Arc<Trigger>>, mode: Mode) {
    let mut reported: HashMap<String, OffsetDateTime> = HashMap::new();
    let mut every = tokio::time::interval(CHECK_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        for trigger in &triggers {
            let last = reported.get(trigger.name()).copied();
            match look(trigger, mode, last) {
                Some(at) => reported.insert(trigger.name().to_string(), at),
                None => reported.remove(trigger.name()),
            };
        }
    }
}

/// The runner's cadence: a tick at least every tick budget plus its longest pause (the polling interval, or
/// the backoff after a failure).
pub fn runner_period(settings: &TriggerSettings, failing: bool) -> Duration {
    let pause = if failing { settings.polling_interval.max(RUNNER_BACKOFF_CAP) } else { settings.polling_interval };
    settings.tick_timeout + pause
}

/// Checks one function and logs what changed. `reported` is when its current silence was last logged; answers
/// the same for the next check (`None` once it runs again, or when it is not watched).
pub fn look(trigger: &Trigger, mode: Mode, reported: Option<OffsetDateTime>) -> Option<OffsetDateTime> {
    let heard = trigger.liveness();
    let cadence = match (mode, trigger.config().schedule.as_ref()) {
        (Mode::Host, Some(schedule)) => Cadence::Schedule(schedule),
        // A host-invoked function with no known schedule has no expected cadence to hold it to.
        (Mode::Host, None) => return None,
        (Mode::Runner, _) => Cadence::Every(runner_period(&trigger.config().settings, heard.consecutive_failures > 0)),
        // An operator's command runs no ticks: there is no cadence to hold a function to.
        (Mode::Operator, _) => return None,
    };
    let now = trigger.now();
    match check(cadence, &heard, reported, now) {
        Verdict::Silent { silence, report: true } => {
            log_silence(trigger, cadence, &silence, heard.watched_since, now);
            Some(now)
        }
        Verdict::Silent { report: false, .. } => reported,
        Verdict::Alive | Verdict::Stopped(_) => {
            if reported.is_some() {
                tracing::info!(function = %trigger.name(), "the function runs again after a silence");
            }
            None
        }
    }
}

/// Logs a silence in the words of whoever drives the function: the host's timer (`cadence` a schedule) or the
/// run loop.
fn log_silence(
    trigger: &Trigger,
    cadence: Cadence<'_>,
    silence: &Silence,
    watched_since: OffsetDateTime,
    now: OffsetDateTime,
) {
    let stamp = |at: OffsetDateTime| at.format(&Rfc3339).unwrap_or_default();
    let last_invocation = match silence.last_invocation {
        Some(at) => stamp(at),
        None => format!("never since the handler started at {}", stamp(watched_since)),
    };
    let silent_for_s = (now - silence.last_invocation.unwrap_or(watched_since)).whole_seconds();
    match cadence {
        Cadence::Schedule(_) => tracing::error!(
            function = %trigger.name(),
            last_invocation = %last_invocation,
            silent_for_s,
            schedule = trigger.config().timer_schedule.as_deref().unwrap_or("-"),
            expected_by = %stamp(silence.second_missed),
            "no invocation for more than two periods of the timer schedule; likely causes: the function is disabled (AzureWebJobs.<function>.Disabled), the host's timer stopped (after a deployment, or the app scaled in or is stopped), another instance holds the timer (a timer fires on one instance of the app: check the others), or the host cannot reach its storage (AzureWebJobsStorage) for the timer's lock"
        ),
        Cadence::Every(_) => tracing::error!(
            function = %trigger.name(),
            last_invocation = %last_invocation,
            silent_for_s,
            period_s = silence.period.as_secs(),
            "no tick for more than two periods of the run loop; likely causes: a tick hangs past Sql_Trigger_TickTimeoutMs, or the process is starved of CPU or stopped"
        ),
    }
}
