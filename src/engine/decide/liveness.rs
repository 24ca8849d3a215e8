//! Liveness: whether a function has gone quiet for longer than its cadence allows, and whether to say so now.
//!
//! Why the handler checks this at all: the host can stop firing a timer while the process stays healthy (a
//! deployment on Flex Consumption, a disabled function, a listener that died), and nothing else in the process
//! would notice. The decision is a pure function of the cadence, what the process heard from its ticks and
//! `now`, so tests move time by hand; the watchdog (`crate::watchdog`) only applies it and logs.

use crate::config::ncrontab::Schedule;
use std::time::Duration;
use time::{OffsetDateTime, PrimitiveDateTime};

/// How long after the handler is ready a function's first firing may come before its silence counts, when the
/// schedule's own two periods are shorter. The host starts a function's timer only after the worker answered its
/// readiness probe, once the function's listener has taken the timer's singleton lock in AzureWebJobsStorage;
/// that takes seconds (a Flex Consumption instance starts functions 0.4 to 10 s after the worker is ready,
/// azure-functions-host#11526), and the host itself gives a starting worker 30 s
/// (../shared/reference/functions-custom-handler.md, "Process and readiness"). So the first firing of an
/// every-second timer coming 3 s after readiness is a normal start, not a stopped timer; one that has not come
/// 30 s after readiness is worth an alarm, whatever the schedule.
pub const START_GRACE: Duration = Duration::from_secs(30);

/// How often a function is expected to run.
#[derive(Debug, Clone, Copy)]
pub enum Cadence<'a> {
    /// The host's timer, on the function's NCRONTAB schedule.
    Schedule(&'a Schedule),
    /// `handler run`'s own loop: one tick at least this often (the tick's budget plus the longest pause).
    Every(Duration),
}

impl Cadence<'_> {
    fn next_after(&self, at: OffsetDateTime) -> OffsetDateTime {
        match self {
            Self::Schedule(schedule) => {
                schedule.next_after(PrimitiveDateTime::new(at.date(), at.time())).assume_offset(at.offset())
            }
            Self::Every(every) => at + *every,
        }
    }
}

/// What this process heard from a function's ticks: the trigger keeps it as ticks end (`Trigger::liveness`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Heard {
    /// When the last tick started (an invocation by the host, or a turn of the runner's loop).
    pub last_invocation: Option<OffsetDateTime>,
    /// When the last tick that ended without an error ended.
    pub last_success: Option<OffsetDateTime>,
    /// Ticks that ended with an error since the last one that did not.
    pub consecutive_failures: u64,
    /// "paused" or "halted" when the last tick found the function stopped by an operator or by poison: its
    /// quiet is then expected and not alerted on.
    pub stopped: Option<&'static str>,
    /// Since when the process has watched (its start): the baseline while nothing was heard yet.
    pub watched_since: OffsetDateTime,
    /// When the last tick ended, whatever its result.
    pub last_end: Option<OffsetDateTime>,
    /// While a tick runs: when its time budget ends. A long tick is not a silence (the host's timer never
    /// overlaps a function's invocations), but one that never ends is, once its budget is spent.
    pub ticking_until: Option<OffsetDateTime>,
}

impl Heard {
    /// Seconds since the last invocation, or since watching began when there was none.
    pub fn seconds_since_invocation(&self, now: OffsetDateTime) -> f64 {
        seconds(self.last_invocation.unwrap_or(self.watched_since), now)
    }

    /// Seconds since the last tick that ended without an error, or since watching began when there was none.
    pub fn seconds_since_success(&self, now: OffsetDateTime) -> f64 {
        seconds(self.last_success.unwrap_or(self.watched_since), now)
    }
}

fn seconds(since: OffsetDateTime, now: OffsetDateTime) -> f64 {
    (now - since).as_seconds_f64().max(0.0)
}

/// A function that has been quiet for more than two periods.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Silence {
    /// The last invocation, or `None` when there was none since watching began.
    pub last_invocation: Option<OffsetDateTime>,
    /// The second run the cadence expected after the last one (or after watching began), which did not come.
    pub second_missed: OffsetDateTime,
    /// The cadence's period there: how often a silence is reported again.
    pub period: Duration,
}

/// The watchdog's verdict on one function.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// Invoked recently enough.
    Alive,
    /// Quiet, but stopped on purpose (paused or halted): nothing to report.
    Stopped(&'static str),
    /// Quiet for more than two periods; `report` is true once per period (log it now).
    Silent { silence: Silence, report: bool },
}

/// Whether a function is silent at `now`: no run came by the second one the cadence expected after the last
/// (plus a little slack, so a firing that is a moment late is not an alert). Before the host's timer first fired,
/// the silence counts only from [`START_GRACE`] after watching began (when that is later). `last_report` is when
/// this silence was last reported; it is reported again once a period has passed since.
pub fn check(cadence: Cadence<'_>, heard: &Heard, last_report: Option<OffsetDateTime>, now: OffsetDateTime) -> Verdict {
    if let Some(why) = heard.stopped {
        return Verdict::Stopped(why);
    }
    if heard.ticking_until.is_some_and(|until| now < until) {
        return Verdict::Alive;
    }
    // From the end of the last tick: the timer schedules its next firing once an invocation has finished.
    let since = heard.last_invocation.max(heard.last_end).unwrap_or(heard.watched_since);
    let first = cadence.next_after(since);
    let second = cadence.next_after(first);
    let period = Duration::try_from(second - first).unwrap_or(Duration::ZERO);
    // Half a period, at most a minute: a timer's firing lands a moment after its second, never half a period.
    let slack = (period / 2).min(Duration::from_secs(60));
    let mut alarm_after = second + slack;
    let never_fired = heard.last_invocation.is_none() && heard.last_end.is_none();
    if never_fired && matches!(cadence, Cadence::Schedule(_)) {
        alarm_after = alarm_after.max(heard.watched_since + START_GRACE);
    }
    if now <= alarm_after {
        return Verdict::Alive;
    }
    let report = last_report.is_none_or(|at| now - at >= period);
    Verdict::Silent {
        silence: Silence { last_invocation: heard.last_invocation, second_missed: second, period },
        report,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    const T0: OffsetDateTime = datetime!(2026-01-01 00:00:00 UTC);

    fn heard(last: Option<OffsetDateTime>) -> Heard {
        Heard {
            last_invocation: last,
            last_success: None,
            consecutive_failures: 0,
            stopped: None,
            watched_since: T0,
            last_end: last,
            ticking_until: None,
        }
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn a_minute_schedule_is_silent_only_after_two_missed_firings_and_a_little_slack() {
        let every_minute = Schedule::parse("0 * * * * *").expect("schedule");
        let cadence = Cadence::Schedule(&every_minute);
        let last = T0 + secs(1);
        // The firings after 00:00:01 are 00:01:00 and 00:02:00; slack is 30 s.
        assert_eq!(check(cadence, &heard(Some(last)), None, T0 + secs(120)), Verdict::Alive);
        assert_eq!(check(cadence, &heard(Some(last)), None, T0 + secs(150)), Verdict::Alive);
        let Verdict::Silent { silence, report } = check(cadence, &heard(Some(last)), None, T0 + secs(151)) else {
            panic!("silent after two missed firings");
        };
        assert!(report);
        assert_eq!(silence.second_missed, T0 + secs(120));
        assert_eq!(silence.period, secs(60));
        assert_eq!(silence.last_invocation, Some(last));
    }

    #[test]
    fn a_silence_is_reported_once_per_period() {
        let every_minute = Schedule::parse("0 * * * * *").expect("schedule");
        let cadence = Cadence::Schedule(&every_minute);
        let reported = T0 + secs(151);
        let report_at = |now| match check(cadence, &heard(Some(T0)), Some(reported), now) {
            Verdict::Silent { report, .. } => report,
            other => panic!("still silent: {other:?}"),
        };
        assert!(!report_at(reported + secs(1)));
        assert!(!report_at(reported + secs(59)));
        assert!(report_at(reported + secs(60)));
    }

    #[test]
    fn a_function_never_invoked_counts_from_when_watching_began() {
        let every_ten_minutes = Schedule::parse("0 */10 * * * *").expect("schedule");
        let cadence = Cadence::Schedule(&every_ten_minutes);
        // Expected at 00:10 and 00:20, with a minute of slack
        assert_eq!(check(cadence, &heard(None), None, T0 + secs(1260)), Verdict::Alive);
        let Verdict::Silent { silence, .. } = check(cadence, &heard(None), None, T0 + secs(1261)) else {
            panic!("never invoked for two periods of a ten-minute schedule");
        };
        assert_eq!(silence.last_invocation, None);
        assert_eq!(silence.second_missed, T0 + secs(1200));
    }

    #[test]
    fn a_first_firing_of_a_short_schedule_has_thirty_seconds_from_ready_before_its_silence_counts() {
        let every_second = Schedule::parse("* * * * * *").expect("schedule");
        let cadence = Cadence::Schedule(&every_second);
        // Watching began at ready (T0): a first firing 3 s or 29 s late is a host starting its timer
        assert_eq!(check(cadence, &heard(None), None, T0 + secs(3)), Verdict::Alive);
        assert_eq!(check(cadence, &heard(None), None, T0 + START_GRACE), Verdict::Alive);
        // Past the grace with still no firing: silent, counted from the two periods the schedule expected
        let Verdict::Silent { silence, report } = check(cadence, &heard(None), None, T0 + START_GRACE + secs(1)) else {
            panic!("silent once the start-up grace is spent");
        };
        assert!(report);
        assert_eq!(silence.second_missed, T0 + secs(2));
        assert_eq!(silence.last_invocation, None);
        // Once it fired, the grace is over: two periods and a little slack, as always
        assert!(matches!(check(cadence, &heard(Some(T0 + secs(5))), None, T0 + secs(8)), Verdict::Silent { .. }));
    }

    #[test]
    fn a_schedule_longer_than_the_grace_keeps_its_own_two_periods_and_the_runner_has_no_grace() {
        let every_minute = Schedule::parse("0 * * * * *").expect("schedule");
        // Never fired, ready at T0: 00:01 and 00:02 expected, 30 s slack, longer than the grace
        assert_eq!(check(Cadence::Schedule(&every_minute), &heard(None), None, T0 + secs(150)), Verdict::Alive);
        assert!(matches!(
            check(Cadence::Schedule(&every_minute), &heard(None), None, T0 + secs(151)),
            Verdict::Silent { .. }
        ));
        // `handler run` ticks at once at start: no host start to wait for
        assert!(matches!(check(Cadence::Every(secs(2)), &heard(None), None, T0 + secs(6)), Verdict::Silent { .. }));
    }

    #[test]
    fn a_paused_or_halted_function_is_never_silent() {
        let cadence = Cadence::Every(secs(10));
        for why in ["paused", "halted"] {
            let stopped = Heard { stopped: Some(why), ..heard(Some(T0)) };
            assert_eq!(check(cadence, &stopped, None, T0 + secs(3600)), Verdict::Stopped(why));
        }
    }

    #[test]
    fn the_runner_loop_is_silent_after_two_of_its_periods() {
        let cadence = Cadence::Every(secs(10));
        assert_eq!(check(cadence, &heard(Some(T0)), None, T0 + secs(25)), Verdict::Alive);
        assert!(matches!(
            check(cadence, &heard(Some(T0)), None, T0 + secs(26)),
            Verdict::Silent { report: true, silence: Silence { period, .. } } if period == secs(10)
        ));
    }

    #[test]
    fn a_long_tick_is_not_a_silence_until_its_budget_is_spent_and_the_quiet_counts_from_its_end() {
        let every_second = Schedule::parse("* * * * * *").expect("schedule");
        let cadence = Cadence::Schedule(&every_second);
        // A tick started at T0 with a budget of a minute, still running 30 s later
        let running = Heard { last_end: None, ticking_until: Some(T0 + secs(60)), ..heard(Some(T0)) };
        assert_eq!(check(cadence, &running, None, T0 + secs(30)), Verdict::Alive);
        // Past its budget with no end recorded (its task was dropped): silent
        assert!(matches!(check(cadence, &running, None, T0 + secs(61)), Verdict::Silent { .. }));
        // Ended at T0 + 30 s: the firings expected after it are at 31 and 32 s
        let ended = Heard { last_end: Some(T0 + secs(30)), ..heard(Some(T0)) };
        assert_eq!(check(cadence, &ended, None, T0 + secs(32)), Verdict::Alive);
        assert!(matches!(check(cadence, &ended, None, T0 + secs(33)), Verdict::Silent { .. }));
    }

    #[test]
    fn seconds_since_count_from_watching_until_heard() {
        let h = heard(None);
        assert_eq!(h.seconds_since_invocation(T0 + secs(5)), 5.0);
        let h = Heard { last_invocation: Some(T0 + secs(4)), last_success: Some(T0 + secs(2)), ..h };
        assert_eq!(h.seconds_since_invocation(T0 + secs(5)), 1.0);
        assert_eq!(h.seconds_since_success(T0 + secs(5)), 3.0);
    }
}
