//! A timer trigger's schedule, read and evaluated as the Functions host does, so the handler can check it at
//! start-up, tell the pace it allows (status), and the test bench can fire on it.
//!
//! The host (azure-webjobs-sdk-extensions `TimerSchedule.Create`) tries the expression as NCRONTAB first
//! (`CronSchedule.TryCreate`: six fields with seconds, five without), then as a .NET `TimeSpan`
//! (`ConstantSchedule`: every interval after the last run). NCRONTAB's rules are NCrontab's own
//! (atifaziz/NCrontab, `CrontabFieldImpl.InternalParse`, `CrontabField.Accumulate`,
//! `CrontabSchedule.TryGetNextOccurrence`), which differ from Vixie cron in ways that matter here:
//! - day of week is 0-6 with 0 = Sunday (7 is refused), names match by prefix (`Mon`, `Monday`);
//! - a day-of-month and a day-of-week restriction must *both* hold (Vixie cron fires when either does);
//! - a reversed range is swapped (`10-2` is `2-10`); `5/15` means from 5 to the maximum every 15; a step below
//!   1 counts as 1; `*/x` lists from the field's minimum.
//!
//! Times are evaluated in UTC: the host evaluates in its local zone, which is UTC on Linux plans unless
//! `WEBSITE_TIME_ZONE` says otherwise (daylight saving shifts are not modelled).

use std::time::Duration;
use time::{Date, PrimitiveDateTime, Time};

/// A parsed timer schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Schedule {
    Cron(Cron),
    /// A .NET `TimeSpan` (`hh:mm:ss`): the next run is this long after the previous one started.
    Every(Duration),
}

/// The six NCRONTAB fields as sets of allowed values (bit i = value i).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cron {
    seconds: u64,
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    days_of_week: u64,
}

struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const SECOND: Field = Field { name: "second", min: 0, max: 59, names: &[] };
const MINUTE: Field = Field { name: "minute", min: 0, max: 59, names: &[] };
const HOUR: Field = Field { name: "hour", min: 0, max: 23, names: &[] };
const DAY: Field = Field { name: "day", min: 1, max: 31, names: &[] };
const MONTH: Field = Field {
    name: "month",
    min: 1,
    max: 12,
    names: &[
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ],
};
const DAY_OF_WEEK: Field = Field {
    name: "day of week",
    min: 0,
    max: 6,
    names: &["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"],
};

impl Schedule {
    /// Reads a schedule as the host does. The error names the field and what it accepts.
    pub fn parse(expression: &str) -> Result<Self, String> {
        let tokens: Vec<&str> = expression.split(' ').filter(|t| !t.is_empty()).collect();
        let cron = match tokens.len() {
            6 => Some(Cron::from_fields(&tokens)),
            5 => Some(Cron::from_fields(&[&["0"][..], &tokens].concat())),
            _ => None,
        };
        match cron {
            Some(Ok(cron)) => Ok(Self::Cron(cron)),
            Some(Err(e)) => match timespan(expression) {
                Some(every) => Ok(Self::Every(every)),
                None => Err(format!("schedule {expression:?} is not a valid NCRONTAB expression: {e}")),
            },
            None => timespan(expression).map(Self::Every).ok_or_else(|| {
                format!(
                    "schedule {expression:?} is neither an NCRONTAB expression ({{second}} {{minute}} {{hour}} {{day}} \
                     {{month}} {{day-of-week}}, e.g. \"*/5 * * * * *\") nor a time span (\"00:00:05\")"
                )
            }),
        }
    }

    /// The first occurrence strictly after `after` (NCrontab's `GetNextOccurrence`, which never returns its
    /// base time). For a time span, `after` plus the span. An occurrence
    /// past the end of the calendar, the end of time (as for a schedule that never fires).
    pub fn next_after(&self, after: PrimitiveDateTime) -> PrimitiveDateTime {
        match self {
            Self::Every(every) => {
                time::Duration::try_from(*every).ok().and_then(|every| after.checked_add(every)).unwrap_or(END_OF_TIME)
            }
            Self::Cron(cron) => cron.next_after(after),
        }
    }

    /// How many times it fires in the 24 hours after `from`, on average per second: the schedule's pace.
    pub fn firings_per_second(&self, from: PrimitiveDateTime) -> f64 {
        if let Self::Every(every) = self {
            return if every.is_zero() { 0.0 } else { 1.0 / every.as_secs_f64() };
        }
        let end = from.checked_add(time::Duration::DAY).unwrap_or(END_OF_TIME);
        let mut at = from;
        let mut count = 0u64;
        loop {
            at = self.next_after(at);
            if at > end || at == END_OF_TIME {
                break;
            }
            count += 1;
        }
        count as f64 / 86_400.0
    }
}

/// What NCrontab answers for a schedule with no next occurrence, and [`Schedule::next_after`] for one past
/// the end of the calendar.
const END_OF_TIME: PrimitiveDateTime = PrimitiveDateTime::new(Date::MAX, Time::MIDNIGHT);

/// The most whole days a .NET `TimeSpan` holds (`TimeSpan.MaxValue` is 10675199.02:48:05.4775807).
const TIMESPAN_MAX_DAYS: u64 = 10_675_199;

/// A .NET `TimeSpan` as `TimeSpan.TryParse` reads the usual forms: `hh:mm`, `hh:mm:ss`, `d.hh:mm:ss`, with an
/// optional fraction of seconds, and at most [`TIMESPAN_MAX_DAYS`] days.
fn timespan(text: &str) -> Option<Duration> {
    let text = text.trim();
    let (days, clock) = match text.split_once('.') {
        Some((days, clock)) if clock.contains(':') && !days.contains(':') => (days.parse::<u64>().ok()?, clock),
        _ => (0, text),
    };
    if days > TIMESPAN_MAX_DAYS {
        return None;
    }
    let parts: Vec<&str> = clock.split(':').collect();
    let (h, m, s) = match parts.as_slice() {
        [h, m] => (*h, *m, "0"),
        [h, m, s] => (*h, *m, *s),
        _ => return None,
    };
    let (h, m): (u64, u64) = (h.parse().ok()?, m.parse().ok()?);
    let s: f64 = s.parse().ok()?;
    if h > 23 || m > 59 || !(0.0..60.0).contains(&s) {
        return None;
    }
    Duration::from_secs(days * 86_400 + h * 3_600 + m * 60).checked_add(Duration::try_from_secs_f64(s).ok()?)
}

impl Cron {
    fn from_fields(tokens: &[&str]) -> Result<Self, String> {
        Ok(Self {
            seconds: parse_field(&SECOND, tokens[0])?,
            minutes: parse_field(&MINUTE, tokens[1])?,
            hours: parse_field(&HOUR, tokens[2])?,
            days: parse_field(&DAY, tokens[3])?,
            months: parse_field(&MONTH, tokens[4])?,
            days_of_week: parse_field(&DAY_OF_WEEK, tokens[5])?,
        })
    }

    /// Walks forward second by second through allowed values, coarsest field first: the next allowed month,
    /// day, hour, minute and second after `after`, and a day only when its weekday is allowed too.
    fn next_after(&self, after: PrimitiveDateTime) -> PrimitiveDateTime {
        let Some(start) = after.checked_add(time::Duration::SECOND) else { return END_OF_TIME };
        let start = start.replace_nanosecond(0).unwrap_or(start);
        let mut date = start.date();
        let mut from = Some(start.time());
        // Every allowed day comes back within a few years (29 February with a weekday: 28 years); bound the walk.
        for _ in 0..(366 * 30) {
            if allows(self.months, date.month() as u32)
                && allows(self.days, u32::from(date.day()))
                && allows(self.days_of_week, u32::from(date.weekday().number_days_from_sunday()))
            {
                if let Some(time) = self.first_time(from) {
                    return PrimitiveDateTime::new(date, time);
                }
            }
            let Some(next) = date.next_day() else { break };
            date = next;
            from = None;
        }
        // A schedule that allows no day (31 February): NCrontab answers its end time; so does this.
        END_OF_TIME
    }

    /// The first allowed time of a day at or after `from` (the start of the day when `None`).
    fn first_time(&self, from: Option<Time>) -> Option<Time> {
        let (h0, m0, s0) = from.map_or((0, 0, 0), |t| (t.hour(), t.minute(), t.second()));
        for h in h0..24 {
            if !allows(self.hours, u32::from(h)) {
                continue;
            }
            let m_start = if h == h0 { m0 } else { 0 };
            for m in m_start..60 {
                if !allows(self.minutes, u32::from(m)) {
                    continue;
                }
                let s_start = if h == h0 && m == m0 { s0 } else { 0 };
                if let Some(s) = (s_start..60).find(|s| allows(self.seconds, u32::from(*s))) {
                    return Time::from_hms(h, m, s).ok();
                }
            }
        }
        None
    }
}

fn allows(set: u64, value: u32) -> bool {
    set & (1u64 << value) != 0
}

/// One field: a list of `*`, `n`, `a-b`, each with an optional `/step`, or names where the field has them.
fn parse_field(field: &Field, text: &str) -> Result<u64, String> {
    let mut set = 0u64;
    for part in text.split(',') {
        set |= parse_part(field, part).map_err(|e| {
            format!("{e} in the {} field {text:?} (allowed: {} to {})", field.name, field.min, field.max)
        })?;
    }
    Ok(set)
}

fn parse_part(field: &Field, part: &str) -> Result<u64, String> {
    if part.is_empty() {
        return Err("an empty value".into());
    }
    let (range, step) = match part.split_once('/') {
        Some((range, step)) => {
            (range, Some(step.parse::<u32>().map_err(|_| format!("step {step:?} is not a number"))?))
        }
        None => (part, None),
    };
    let (mut start, mut end) = if range == "*" {
        (field.min, field.max)
    } else if let Some((a, b)) = range.split_once('-') {
        (value(field, a)?, value(field, b)?)
    } else {
        let v = value(field, range)?;
        // `5/15` runs from 5 to the maximum.
        (v, if step.is_some() { field.max } else { v })
    };
    if start > end {
        std::mem::swap(&mut start, &mut end);
    }
    let step = step.unwrap_or(1).max(1);
    Ok((start..=end).step_by(step as usize).fold(0u64, |set, v| set | (1u64 << v)))
}

fn value(field: &Field, text: &str) -> Result<u32, String> {
    if text.is_empty() {
        return Err("an empty value".into());
    }
    let v = if text.starts_with(|c: char| c.is_ascii_digit()) {
        text.parse::<u32>().map_err(|_| format!("{text:?} is not a number"))?
    } else {
        let lower = text.to_ascii_lowercase();
        let index = field
            .names
            .iter()
            .position(|name| name.to_ascii_lowercase().starts_with(&lower))
            .ok_or_else(|| format!("{text:?} is not a value of this field"))?;
        field.min + index as u32
    };
    if v < field.min || v > field.max {
        return Err(format!("{v} is out of range"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests;
