//! The timer listener's pacing (azure-webjobs-sdk-extensions `TimerListener`), on a simulated clock or on real
//! seconds.
//!
//! What the listener does, and so what the model does:
//! - it fires at the schedule's next occurrence (`ScheduleStatus.Next`), runs the whole retry loop under its
//!   invocation lock, and only then computes the following occurrence, from the firing's own time
//!   (`InvokeJobFunction`: `_schedule.GetNextOccurrence(adjustedInvocationTime)`);
//! - when the invocation (with its retries) took past that occurrence, the next firing comes at once
//!   (`GetNextTimerInterval` turns a negative interval into one tick): missed occurrences are not caught up,
//!   one late firing replaces them all;
//! - the schedule monitor (`ScheduleStatus` in the request) is off for sub-minute schedules
//!   (`TimerSchedule.ShouldDisableScheduleMonitor`) and when the binding says `useMonitor: false`.
//!
//! On simulated time a firing costs what it really took plus its retry delays, counted rather than slept, so an
//! hour of firings every five seconds runs in the time the handler needs for 720 invocations, and the pace it
//! reports is the one the host would impose, handler time included.

use super::{DriverError, FunctionSpec, HostDriver, Time, TimerRun};
use sql_pseudo_trigger::config::ncrontab::Schedule;
use std::time::{Duration, Instant};
use time::{OffsetDateTime, PrimitiveDateTime};

/// One timer firing and what came of it.
#[derive(Debug, Clone)]
pub struct Firing {
    /// When the listener fired, on the run's clock.
    pub at: OffsetDateTime,
    pub run: TimerRun,
    /// Real time the retry loop took (HTTP, the handler, the model's writes), delays not included.
    pub took: Duration,
}

/// A run of firings on the schedule.
#[derive(Debug, Clone)]
pub struct Paced {
    pub start: OffsetDateTime,
    /// The end of the span asked for, or of the last firing when the run stopped early.
    pub end: OffsetDateTime,
    pub firings: Vec<Firing>,
}

impl Paced {
    /// Messages or rows written to `binding` over the run.
    pub fn written(&self, binding: &str) -> usize {
        self.firings.iter().filter_map(|f| f.run.applied.get(binding)).map(Vec::len).sum()
    }

    /// `written(binding)` per second of the run's clock.
    pub fn per_second(&self, binding: &str) -> f64 {
        let span = (self.end - self.start).as_seconds_f64();
        if span <= 0.0 {
            0.0
        } else {
            self.written(binding) as f64 / span
        }
    }
}

/// True when the host keeps a schedule monitor for this timer, and so sends `ScheduleStatus`.
pub(super) fn monitored(spec: &FunctionSpec, schedule: &Schedule) -> bool {
    let use_monitor =
        spec.trigger().and_then(|t| t.raw.get("useMonitor")).and_then(serde_json::Value::as_bool).unwrap_or(true);
    use_monitor && !sub_minute(spec, schedule)
}

/// `ShouldDisableScheduleMonitor`: a constant schedule under a minute, or a six-field expression whose minute
/// and higher fields are all `*` that fires more than once in the next minute.
fn sub_minute(spec: &FunctionSpec, schedule: &Schedule) -> bool {
    match schedule {
        Schedule::Every(every) => *every < Duration::from_secs(60),
        Schedule::Cron(_) => {
            let tokens: Vec<&str> = spec.schedule().unwrap_or("").split_whitespace().collect();
            if tokens.len() != 6 || tokens[1..].iter().any(|t| *t != "*") {
                return false;
            }
            let now = OffsetDateTime::now_utc();
            let from = PrimitiveDateTime::new(now.date(), now.time());
            let first = schedule.next_after(from);
            schedule.next_after(first) <= from + Duration::from_secs(60)
        }
    }
}

impl HostDriver {
    /// The function's schedule, `%Setting%` resolved from the app settings the handler gets.
    pub fn schedule(&self, spec: &FunctionSpec) -> Result<Schedule, DriverError> {
        let raw = spec.schedule().ok_or_else(|| DriverError::BadAppFile {
            path: self.app.root.join(&spec.name).join("function.json"),
            reason: "the timer trigger has no schedule".into(),
        })?;
        let resolved = super::app::expand_settings(raw, |name| {
            self.options
                .env
                .iter()
                .chain(&self.app.settings)
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        });
        Schedule::parse(&resolved).map_err(|reason| DriverError::BadAppFile {
            path: self.app.root.join(&spec.name).join("function.json"),
            reason,
        })
    }

    /// Fires `function` on its schedule for `span` of simulated time from `start`, as the timer listener would,
    /// without waiting: each firing costs the real time it took plus its retry delays. Stops early when `stop`
    /// says so after a firing (say, once a backlog is drained).
    pub async fn run_schedule(
        &self,
        function: &str,
        start: OffsetDateTime,
        span: Duration,
        mut stop: impl FnMut(&Firing) -> bool,
    ) -> Result<Paced, DriverError> {
        let spec = self.app.function(function)?;
        let schedule = self.schedule(spec)?;
        let end = start + span;
        let mut firings = Vec::new();
        let mut at = next(&schedule, start);
        while at <= end {
            if !self.is_running() {
                return Err(DriverError::NotRunning);
            }
            let firing = self.fire(spec, at, Time::Simulated).await?;
            let done = stop(&firing);
            let finished = at + firing.took + firing.run.waited;
            // The next occurrence after this firing's own time; at once if the firing ran past it.
            let following = next(&schedule, at).max(finished);
            firings.push(firing);
            if done {
                return Ok(Paced { start, end: finished.min(end), firings });
            }
            at = following;
        }
        Ok(Paced { start, end, firings })
    }

    /// Fires `function` on its schedule on the wall clock, `count` times: the model's pacing checked against real
    /// seconds (slow: a firing every second takes `count` seconds).
    pub async fn run_schedule_real(&self, function: &str, count: usize) -> Result<Paced, DriverError> {
        let spec = self.app.function(function)?;
        let schedule = self.schedule(spec)?;
        let start = OffsetDateTime::now_utc();
        let mut at = next(&schedule, start);
        let mut firings = Vec::new();
        for _ in 0..count {
            let wait = (at - OffsetDateTime::now_utc()).max(time::Duration::ZERO);
            tokio::time::sleep(wait.try_into().unwrap_or(Duration::ZERO)).await;
            let fired = OffsetDateTime::now_utc();
            let firing = self.fire(spec, fired, Time::Real).await?;
            let following = next(&schedule, fired.max(at)).max(OffsetDateTime::now_utc());
            firings.push(firing);
            at = following;
        }
        let end = OffsetDateTime::now_utc();
        Ok(Paced { start, end, firings })
    }

    async fn fire(&self, spec: &FunctionSpec, at: OffsetDateTime, time: Time) -> Result<Firing, DriverError> {
        let data = self.next_timer_data(spec, at);
        let began = Instant::now();
        let run = self.run_chain(spec, &data, time).await?;
        let took = began.elapsed().saturating_sub(if time == Time::Real { run.waited } else { Duration::ZERO });
        Ok(Firing { at, run, took })
    }
}

fn next(schedule: &Schedule, after: OffsetDateTime) -> OffsetDateTime {
    schedule.next_after(PrimitiveDateTime::new(after.date(), after.time())).assume_utc()
}
