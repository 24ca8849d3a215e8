//! Which strings Newtonsoft's reader turns into dates, and what `DateTime` it makes of them
//! (`DateTimeUtils.TryParseDateTime`, `TryParseDateTimeIso`, `DateTimeParser.Parse`,
//! `TryParseDateTimeMicrosoft` in JamesNK/Newtonsoft.Json 13.0.3), ported literally.

use super::super::dotnet::{self, DateTime, DateTimeKind, HostZone, MAX_TICKS, TICKS_PER_SECOND};
use super::ReadError;

/// `DateTimeUtils.TryParseDateTime` with `DateTimeZoneHandling.RoundtripKind` and no `DateFormatString`:
/// `Ok(None)` leaves the string a string; `Err` is a value .NET cannot hold (it throws, failing the read).
pub fn parse_date(text: &str, zone: HostZone) -> Result<Option<DateTime>, ReadError> {
    // Every character the parsers accept is ASCII, so a non-ASCII string is never a date, and for an ASCII
    // string UTF-16 lengths and indexes are byte lengths and indexes.
    if !text.is_ascii() || text.is_empty() {
        return Ok(None);
    }
    let s = text.as_bytes();
    if s[0] == b'/' {
        if s.len() >= 9 && text.starts_with("/Date(") && text.ends_with(")/") {
            return parse_microsoft_date(text, zone);
        }
        return Ok(None);
    }
    if s.len() >= 19 && s.len() <= 40 && s[0].is_ascii_digit() && s[10] == b'T' {
        return parse_iso_date(s, zone);
    }
    Ok(None)
}

/// `DateTimeUtils.TryParseDateTimeIso` over `DateTimeParser.Parse`, ported literally (including how it reads
/// past seven fraction digits).
fn parse_iso_date(s: &[u8], zone: HostZone) -> Result<Option<DateTime>, ReadError> {
    let end = s.len();
    let digit2 = |at: usize| -> Option<i64> {
        (at + 1 < end && s[at].is_ascii_digit() && s[at + 1].is_ascii_digit())
            .then(|| i64::from(s[at] - b'0') * 10 + i64::from(s[at + 1] - b'0'))
    };
    let char_at = |at: usize, c: u8| at < end && s[at] == c;
    // ParseDate
    let year = (end > 3 && s[..4].iter().all(u8::is_ascii_digit))
        .then(|| s[..4].iter().fold(0i64, |n, d| n * 10 + i64::from(d - b'0')));
    let Some(year) = year.filter(|&y| y >= 1) else { return Ok(None) };
    let Some(month) = char_at(4, b'-').then(|| digit2(5)).flatten().filter(|m| (1..=12).contains(m)) else {
        return Ok(None);
    };
    let Some(day) =
        char_at(7, b'-').then(|| digit2(8)).flatten().filter(|&d| d >= 1 && d <= dotnet::days_in_month(year, month))
    else {
        return Ok(None);
    };
    if !char_at(10, b'T') {
        return Ok(None);
    }
    // ParseTime
    let (Some(hour), Some(minute), Some(second)) = (digit2(11), digit2(14), digit2(17)) else { return Ok(None) };
    if hour > 24 || !char_at(13, b':') || minute >= 60 || !char_at(16, b':') || second >= 60 {
        return Ok(None);
    }
    if hour == 24 && (minute != 0 || second != 0) {
        return Ok(None);
    }
    let mut start = 19;
    let mut fraction = 0i64;
    if char_at(start, b'.') {
        let mut digits = 0;
        loop {
            start += 1;
            if start >= end || digits >= 7 {
                break;
            }
            if !s[start].is_ascii_digit() {
                break;
            }
            fraction = fraction * 10 + i64::from(s[start] - b'0');
            digits += 1;
        }
        if digits < 7 {
            if digits == 0 {
                return Ok(None);
            }
            fraction *= 10i64.pow(7 - digits);
        }
        if hour == 24 && fraction != 0 {
            return Ok(None);
        }
    }
    // ParseZone
    #[derive(PartialEq)]
    enum Zone {
        Unspecified,
        Utc,
        West,
        East,
    }
    let mut kind = Zone::Unspecified;
    let (mut zone_hour, mut zone_minute) = (0, 0);
    if start < end {
        let ch = s[start];
        if ch == b'Z' || ch == b'z' {
            kind = Zone::Utc;
            start += 1;
        } else {
            if start + 2 < end {
                if let Some(h) = digit2(start + 1) {
                    zone_hour = h;
                    match ch {
                        b'-' => {
                            kind = Zone::West;
                            start += 3;
                        }
                        b'+' => {
                            kind = Zone::East;
                            start += 3;
                        }
                        _ => {}
                    }
                }
            }
            if start < end {
                if char_at(start, b':') {
                    start += 1;
                    if start + 1 < end {
                        if let Some(m) = digit2(start) {
                            zone_minute = m;
                            start += 2;
                        }
                    }
                } else if start + 1 < end {
                    if let Some(m) = digit2(start) {
                        zone_minute = m;
                        start += 2;
                    }
                }
            }
        }
    }
    if start != end {
        return Ok(None);
    }
    // CreateDateTime: hour 24 is midnight of the next day (AddDays(1) throws past 9999-12-31).
    let base = DateTime::from_parts(year, month, day, if hour == 24 { 0 } else { hour }, minute, second)
        .ok_or_else(|| ReadError("the DateTime is out of range".into()))?;
    let mut ticks = base + fraction;
    if hour == 24 {
        ticks += 86_400 * TICKS_PER_SECOND;
        if ticks > MAX_TICKS {
            return Err(ReadError(
                "The added or subtracted value results in an un-representable DateTime (Newtonsoft.Json)".into(),
            ));
        }
    }
    let offset = (zone_hour * 60 + zone_minute) * 60 * TICKS_PER_SECOND;
    Ok(Some(match kind {
        Zone::Unspecified => DateTime { ticks, kind: DateTimeKind::Unspecified },
        Zone::Utc => DateTime { ticks, kind: DateTimeKind::Utc },
        Zone::West if ticks + offset <= MAX_TICKS => zone.to_local(ticks + offset),
        Zone::East if ticks - offset >= 0 => zone.to_local(ticks - offset),
        // Past the range: the reading plus the local offset, clamped, as Local.
        Zone::West | Zone::East => {
            let shifted = if kind == Zone::West { ticks + offset } else { ticks - offset };
            DateTime { ticks: (shifted + zone.offset_ticks()).clamp(0, MAX_TICKS), kind: DateTimeKind::Local }
        }
    }))
}

/// `DateTimeUtils.TryParseDateTimeMicrosoft`: `/Date(milliseconds)/` is UTC; with an offset after the
/// milliseconds it is the same instant in the host's local time (the offset only marks it Local). A reading
/// outside the `DateTime` range throws in `ConvertJavaScriptTicksToDateTime`.
fn parse_microsoft_date(text: &str, zone: HostZone) -> Result<Option<DateTime>, ReadError> {
    let inner = &text[6..text.len() - 2];
    // TryParseMicrosoftDate looks for '+' then '-' from index 7, so a leading minus is the sign of the number.
    let search_from = 1.min(inner.len());
    let sign_at = inner[search_from..].find('+').or_else(|| inner[search_from..].find('-')).map(|i| i + search_from);
    let (number, local) = match sign_at {
        Some(i) => {
            let offset = &inner[i + 1..];
            let hours_ok = offset.len() >= 2 && offset[..2].bytes().all(|b| b.is_ascii_digit());
            let minutes_ok =
                offset.len() <= 2 || (offset.len() >= 4 && offset[2..4].bytes().all(|b| b.is_ascii_digit()));
            if !hours_ok || !minutes_ok {
                return Ok(None);
            }
            (&inner[..i], true)
        }
        None => (inner, false),
    };
    let Ok(millis) = number.parse::<i64>() else { return Ok(None) };
    let ticks = millis.checked_mul(10_000).and_then(|t| t.checked_add(621_355_968_000_000_000));
    let Some(ticks) = ticks.filter(|t| (0..=MAX_TICKS).contains(t)) else {
        return Err(ReadError(format!(
            "{text}: Ticks must be between DateTime.MinValue.Ticks and DateTime.MaxValue.Ticks"
        )));
    };
    Ok(Some(if local { zone.to_local(ticks) } else { DateTime { ticks, kind: DateTimeKind::Utc } }))
}
