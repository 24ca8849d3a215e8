//! The few .NET primitives the Functions host's JSON handling rests on, ported exactly so the host model can
//! show what a consumer really receives: `double.ToString("R")`, `DateTime` (ticks and kind), the host's time
//! zone, and `Convert.FromBase64String`.
//!
//! Sources (the host runs on .NET 8; these paths are in dotnet/runtime):
//! - `src/libraries/System.Private.CoreLib/src/System/Number.Formatting.cs`: `FormatDouble`,
//!   `GetFloatingPointMaxDigitsAndPrecision` (`'R'`: shortest round-trippable digits, `precision = -1`),
//!   `NumberToString` (`'R'` becomes `'G'`), `FormatGeneral` (scientific when `scale > nMaxDigits || scale < -3`,
//!   `nMaxDigits = Math.Max(DigitsCount, DoublePrecision)` with `DoublePrecision = 17`) and `FormatExponent`
//!   (`E+dd`, at least two digits). .NET Core 3.0 and later; .NET Framework printed 15 digits.
//! - `src/libraries/System.Private.CoreLib/src/System/Convert.Base64.cs` (`TryDecodeFromUtf16`) and `Convert.cs`
//!   (`FromBase64CharPtr`: trailing whitespace dropped, whitespace inside skipped).

use std::fmt::Write as _;

/// `double.ToString("R", CultureInfo.InvariantCulture)` on .NET Core 3.0+: the shortest digits that read back
/// as the same double, fixed notation unless the decimal exponent is above `max(digits, 17)` or below -4.
///
/// For example 12345678901234568.0 prints `12345678901234568`, 1e20 `1E+20`, 0.00001 `1E-05`.
pub fn double_r(value: f64) -> String {
    if value.is_nan() {
        return "NaN".into();
    }
    if value.is_infinite() {
        return if value < 0.0 { "-Infinity".into() } else { "Infinity".into() };
    }
    let mut out = String::new();
    if value.is_sign_negative() {
        // .NET Core 3.0+ prints negative zero as "-0" (number.IsNegative = double.IsNegative(value)).
        out.push('-');
    }
    if value == 0.0 {
        out.push('0');
        return out;
    }
    // Rust's `{:e}` prints the shortest round-trip digits, as Grisu3/Dragon4 do for 'R' in .NET.
    let shortest = format!("{:e}", value.abs());
    let (mantissa, exponent) = shortest.split_once('e').unwrap_or((shortest.as_str(), "0"));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let scale = exponent + 1; // NumberBuffer.Scale: the position of the decimal point
    let max_digits = digits.len().max(17) as i32;
    if scale > max_digits || scale < -3 {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let exp = scale - 1;
        let _ = write!(out, "E{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    } else if scale > 0 {
        let scale = scale as usize;
        if digits.len() <= scale {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', scale - digits.len()));
        } else {
            out.push_str(&digits[..scale]);
            out.push('.');
            out.push_str(&digits[scale..]);
        }
    } else {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-scale) as usize));
        out.push_str(&digits);
    }
    out
}

/// 100-nanosecond ticks since 0001-01-01T00:00:00, as `DateTime.Ticks`.
pub const TICKS_PER_SECOND: i64 = 10_000_000;
const TICKS_PER_DAY: i64 = 86_400 * TICKS_PER_SECOND;
/// `DateTime.MaxValue.Ticks` (9999-12-31T23:59:59.9999999).
pub const MAX_TICKS: i64 = 3_155_378_975_999_999_999;

/// `DateTimeKind`: what a `DateTime`'s clock reading is relative to. Newtonsoft writes `Utc` with `Z`,
/// `Local` with the host zone's offset, `Unspecified` with nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DateTimeKind {
    Unspecified,
    Utc,
    Local,
}

/// A .NET `DateTime`: a clock reading in ticks and its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DateTime {
    pub ticks: i64,
    pub kind: DateTimeKind,
}

impl DateTime {
    /// `new DateTime(year, month, day, hour, minute, second)`; `None` where .NET throws.
    pub fn from_parts(year: i64, month: i64, day: i64, hour: i64, minute: i64, second: i64) -> Option<i64> {
        if !(1..=9999).contains(&year) || !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
            return None;
        }
        if !(0..24).contains(&hour) || !(0..60).contains(&minute) || !(0..60).contains(&second) {
            return None;
        }
        let days = days_from_civil(year, month, day) - days_from_civil(1, 1, 1);
        Some(days * TICKS_PER_DAY + ((hour * 60 + minute) * 60 + second) * TICKS_PER_SECOND)
    }

    /// (year, month, day, hour, minute, second, ticks within the second).
    pub fn parts(&self) -> (i64, i64, i64, i64, i64, i64, i64) {
        let days = self.ticks.div_euclid(TICKS_PER_DAY);
        let rest = self.ticks.rem_euclid(TICKS_PER_DAY);
        let (y, m, d) = civil_from_days(days + days_from_civil(1, 1, 1));
        let seconds = rest / TICKS_PER_SECOND;
        (y, m, d, seconds / 3600, seconds / 60 % 60, seconds % 60, rest % TICKS_PER_SECOND)
    }

    /// `DateTime.ToString()` under the invariant culture (`MM/dd/yyyy HH:mm:ss`), which is what
    /// `JValue.ToString()` gives for a date when the host's current culture is invariant (assumed: the
    /// culture of the Functions host process is not verified here).
    pub fn to_invariant_string(&self) -> String {
        let (y, m, d, h, mi, s, _) = self.parts();
        format!("{m:02}/{d:02}/{y:04} {h:02}:{mi:02}:{s:02}")
    }
}

/// `DateTime.DaysInMonth`.
pub fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        _ => 28,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm), the calendar of `DateTime`.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { yoe + era * 400 + 1 } else { yoe + era * 400 }, m, d)
}

/// The host process's local time zone, which Newtonsoft converts every offset date to. A fixed offset: the
/// model has no DST rules. Azure Functions hosts run in UTC unless `WEBSITE_TIME_ZONE` (Windows) or `TZ`
/// (Linux) says otherwise, so the driver uses [`HostZone::UTC`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostZone {
    pub offset_minutes: i32,
}

impl HostZone {
    pub const UTC: Self = Self { offset_minutes: 0 };

    pub fn offset_ticks(&self) -> i64 {
        i64::from(self.offset_minutes) * 60 * TICKS_PER_SECOND
    }

    /// `DateTime.ToLocalTime()` of a UTC reading, clamped to the `DateTime` range as .NET clamps it.
    pub fn to_local(&self, utc_ticks: i64) -> DateTime {
        DateTime { ticks: (utc_ticks + self.offset_ticks()).clamp(0, MAX_TICKS), kind: DateTimeKind::Local }
    }
}

/// `Convert.FromBase64String`: `None` where it throws a `FormatException`. Whitespace (space, tab, CR, LF) is
/// ignored anywhere, the rest must be whole groups of four alphabet characters with at most two `=` at the
/// very end; unused low bits are not checked. An empty string decodes to no bytes.
pub fn from_base64(text: &str) -> Option<Vec<u8>> {
    let chars: Vec<u8> = text.bytes().filter(|b| !matches!(b, b' ' | b'\t' | b'\r' | b'\n')).collect();
    if !text.is_ascii() || !chars.len().is_multiple_of(4) {
        return None;
    }
    let padding = chars.iter().rev().take_while(|&&b| b == b'=').count();
    if padding > 2 || chars[..chars.len() - padding].contains(&b'=') {
        return None;
    }
    let value = |b: u8| -> Option<u32> {
        Some(match b {
            b'A'..=b'Z' => b - b'A',
            b'a'..=b'z' => b - b'a' + 26,
            b'0'..=b'9' => b - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => 0,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(chars.len() / 4 * 3);
    for (i, quad) in chars.chunks(4).enumerate() {
        let mut n = 0u32;
        for &c in quad {
            n = (n << 6) | value(c)?;
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        let last = i == chars.len() / 4 - 1;
        out.extend_from_slice(&bytes[..if last { 3 - padding } else { 3 }]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::excessive_precision)] // the literals are what the databases send, before a double rounds them
    fn doubles_print_like_dotnet_core_r() {
        // Number.Formatting.cs FormatGeneral: fixed up to scale max(digits, 17), scientific below 1E-04.
        for (value, text) in [
            (120.0, "120"),
            (1.25, "1.25"),
            (0.1, "0.1"),
            (12345678901234567.89, "12345678901234568"),
            (1e15, "1000000000000000"),
            (1e17, "1E+17"),
            (1.5e-7, "1.5E-07"),
            (0.0001, "0.0001"),
            (0.00001, "1E-05"),
            (922337203685477.5807, "922337203685477.6"),
            (-0.0, "-0"),
            (1.7976931348623157e308, "1.7976931348623157E+308"),
            (f64::INFINITY, "Infinity"),
        ] {
            assert_eq!(double_r(value), text, "{value:e}");
        }
    }

    #[test]
    fn dates_round_trip_through_ticks() {
        let ticks = DateTime::from_parts(2024, 2, 29, 23, 59, 58).expect("valid");
        let d = DateTime { ticks: ticks + 1_234_567, kind: DateTimeKind::Utc };
        assert_eq!(d.parts(), (2024, 2, 29, 23, 59, 58, 1_234_567));
        assert_eq!(DateTime::from_parts(2023, 2, 29, 0, 0, 0), None);
        assert_eq!(DateTime::from_parts(9999, 12, 31, 23, 59, 59).map(|t| t + 9_999_999), Some(MAX_TICKS));
        assert_eq!(DateTime::from_parts(1, 1, 1, 0, 0, 0), Some(0));
    }

    #[test]
    fn base64_decodes_like_convert_from_base64_string() {
        assert_eq!(from_base64("AAEC"), Some(vec![0, 1, 2]));
        assert_eq!(from_base64("AQID/w=="), Some(vec![1, 2, 3, 255]));
        assert_eq!(from_base64(" AA EC \n"), Some(vec![0, 1, 2]));
        assert_eq!(from_base64(""), Some(vec![]));
        assert_eq!(from_base64("QR=="), Some(vec![0x41]), "unused bits are not checked");
        assert_eq!(from_base64("abc"), None);
        assert_eq!(from_base64("a=bc"), None);
        assert_eq!(from_base64("[{}]"), None);
        assert_eq!(from_base64("{\"a\":1}"), None);
        assert_eq!(from_base64("true"), Some(vec![0xb6, 0xbb, 0x9e]), "a word of four letters is base64");
    }
}
