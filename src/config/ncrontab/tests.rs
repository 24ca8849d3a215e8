//! Each case states a rule of NCrontab (or of the host's `TimerSchedule.Create`) with the occurrence it implies,
//! worked out by hand from the calendar.

use super::*;
use time::macros::datetime;

fn next(expression: &str, after: PrimitiveDateTime) -> PrimitiveDateTime {
    Schedule::parse(expression).unwrap_or_else(|e| panic!("{expression}: {e}")).next_after(after)
}

#[test]
fn occurrences_follow_ncrontabs_rules() {
    let cases = [
        // Six fields: seconds first. The base time itself is never an occurrence.
        ("*/5 * * * * *", datetime!(2026-11-25 10:00:00), datetime!(2026-11-25 10:00:05)),
        ("*/5 * * * * *", datetime!(2026-11-25 10:00:03.7), datetime!(2026-11-25 10:00:05)),
        ("*/5 * * * * *", datetime!(2026-11-25 23:59:58), datetime!(2026-11-26 00:00:00)),
        // Five fields: minutes first, second 0.
        ("*/15 * * * *", datetime!(2026-11-25 10:07:30), datetime!(2026-11-25 10:15:00)),
        // `n/step` runs from n to the field's maximum.
        ("7/20 * * * * *", datetime!(2026-11-25 10:00:47), datetime!(2026-11-25 10:01:07)),
        // Lists of single values and ranges; a reversed range is swapped.
        ("0 0 9,17-18 * * *", datetime!(2026-11-25 09:00:00), datetime!(2026-11-25 17:00:00)),
        ("0 0 18-17 * * *", datetime!(2026-11-25 17:00:00), datetime!(2026-11-25 18:00:00)),
        // Day of week: 0 is Sunday; names match by prefix, in any case. 2026-11-25 is a Wednesday.
        ("0 30 6 * * 0", datetime!(2026-11-25 12:00:00), datetime!(2026-11-29 06:30:00)),
        ("0 30 6 * * sun", datetime!(2026-11-25 12:00:00), datetime!(2026-11-29 06:30:00)),
        ("0 0 8 * * Mon-Fri", datetime!(2026-11-27 09:00:00), datetime!(2026-11-30 08:00:00)),
        // Day of month AND day of week must both hold (Vixie cron would fire on 1 December, a Tuesday):
        // the next 13th that is a Friday after 25 November 2026 is 13 August 2027.
        ("0 0 0 13 * 5", datetime!(2026-11-25 00:00:00), datetime!(2027-08-13 00:00:00)),
        // Months by name; a day the month lacks is skipped (31 November does not exist).
        ("0 0 0 31 * *", datetime!(2026-11-25 00:00:00), datetime!(2026-12-31 00:00:00)),
        ("0 0 12 1 Jun *", datetime!(2026-11-25 00:00:00), datetime!(2027-06-01 12:00:00)),
        ("0 0 0 29 2 *", datetime!(2026-11-25 00:00:00), datetime!(2028-02-29 00:00:00)),
        // A step below 1 counts as 1.
        ("*/0 * * * * *", datetime!(2026-11-25 10:00:00), datetime!(2026-11-25 10:00:01)),
        // A time span: the interval after the base time.
        ("00:00:05", datetime!(2026-11-25 10:00:03), datetime!(2026-11-25 10:00:08)),
        ("1.00:00:00", datetime!(2026-11-25 10:00:00), datetime!(2026-11-26 10:00:00)),
    ];
    for (expression, after, expected) in cases {
        assert_eq!(next(expression, after), expected, "{expression} after {after}");
    }
}

#[test]
fn what_ncrontab_refuses_is_refused_naming_the_field() {
    for (expression, problem) in [
        ("*/5 * * * * 7", "7 is out of range in the day of week field \"7\" (allowed: 0 to 6)"),
        ("60 * * * * *", "60 is out of range in the second field \"60\" (allowed: 0 to 59)"),
        ("* * * 0 * *", "0 is out of range in the day field \"0\" (allowed: 1 to 31)"),
        ("* * * * Foo *", "\"Foo\" is not a value of this field in the month field \"Foo\" (allowed: 1 to 12)"),
        ("* * * * * 1,,2", "an empty value in the day of week field \"1,,2\" (allowed: 0 to 6)"),
    ] {
        assert_eq!(
            Schedule::parse(expression),
            Err(format!("schedule {expression:?} is not a valid NCRONTAB expression: {problem}")),
        );
    }
    assert_eq!(
        Schedule::parse("every 5 seconds"),
        Err("schedule \"every 5 seconds\" is neither an NCRONTAB expression ({second} {minute} {hour} {day} {month} \
             {day-of-week}, e.g. \"*/5 * * * * *\") nor a time span (\"00:00:05\")"
            .to_string())
    );
}

#[test]
fn the_pace_of_a_schedule_is_its_firings_per_second() {
    let from = datetime!(2026-11-25 00:00:00);
    let pace = |e: &str| Schedule::parse(e).expect("valid").firings_per_second(from);
    assert_eq!(pace("*/5 * * * * *"), 0.2);
    assert_eq!(pace("* * * * * *"), 1.0);
    assert_eq!(pace("0 */5 * * * *"), 1.0 / 300.0);
    assert_eq!(pace("00:00:10"), 0.1);
    // Working hours only: 9 hours of 12 firings a minute in 24.
    assert_eq!(pace("*/5 * 9-17 * * *"), 9.0 * 3600.0 / 5.0 / 86_400.0);
}

/// Found writing the schedule's fuzz target (its inputs are in fuzz/corpus/ncrontab): a time span of more days than the calendar
/// holds made `next_after` panic ("resulting value is out of range"), and a day count near u64::MAX overflowed
/// while the span was read. .NET's TimeSpan ends at 10675199 days: longer is refused, as the host refuses it,
/// and an occurrence past the end of the calendar is the end of time, as for a schedule that never fires.
#[test]
fn a_time_span_past_the_calendar_never_fires_and_one_past_dotnets_timespan_is_refused() {
    let end = PrimitiveDateTime::new(Date::MAX, Time::MIDNIGHT);
    let longest = Schedule::parse("10675199.00:00:00").expect("TimeSpan's longest whole-day span");
    assert_eq!(longest.next_after(datetime!(2026-11-25 10:00:00)), end);
    assert!(longest.firings_per_second(datetime!(2026-11-25 10:00:00)) > 0.0);
    for refused in ["10675200.00:00:00", "213503982334601.00:00:00", "18446744073709551615.23:59:59"] {
        assert!(Schedule::parse(refused).is_err(), "{refused}");
    }
    // The end of time is no base for a panic either.
    assert_eq!(Schedule::parse("*/5 * * * * *").expect("valid").next_after(PrimitiveDateTime::MAX), end);
    assert_eq!(Schedule::parse("00:00:05").expect("valid").next_after(PrimitiveDateTime::MAX), end);
}
