//! Newtonsoft's writer: how a token becomes text again (`JsonTextWriter`, `JsonConvert.ToString(double)`,
//! `DateTimeUtils.WriteDateTimeString`, `JavaScriptUtils.WriteEscapedJavaScriptString`, `JValue.ToString()` in
//! JamesNK/Newtonsoft.Json 13.0.3).

use super::super::dotnet::{self, DateTime, DateTimeKind, HostZone};
use super::JToken;

/// `Formatting.None` or `Formatting.Indented` with the platform's newline (`Environment.NewLine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Formatting {
    None,
    Indented { newline: &'static str },
}

/// How dates are written: the default ISO form, or a custom .NET format (the SQL extension's
/// `yyyy'-'MM'-'dd'T'HH':'mm':'ss'.'fffZ`, which is all this model needs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DateFormat {
    Iso,
    /// `yyyy-MM-ddTHH:mm:ss.fff` and a literal `Z`, whatever the kind.
    SqlExtension,
}

/// `JToken.ToString(formatting)`: the token written by a `JsonTextWriter` at its defaults.
pub fn write(token: &JToken, formatting: Formatting, zone: HostZone) -> String {
    let mut out = String::new();
    write_token(&mut out, token, formatting, DateFormat::Iso, zone, 0);
    out
}

/// A token written with a custom date format (`JsonSerializer` with `DateFormatString`), compact.
pub fn write_with_dates(token: &JToken, dates: DateFormat, zone: HostZone) -> String {
    let mut out = String::new();
    write_token(&mut out, token, Formatting::None, dates, zone, 0);
    out
}

fn write_token(out: &mut String, token: &JToken, f: Formatting, dates: DateFormat, zone: HostZone, level: usize) {
    let indent = |out: &mut String, level: usize| {
        if let Formatting::Indented { newline } = f {
            out.push_str(newline);
            out.extend(std::iter::repeat_n(' ', level * 2));
        }
    };
    match token {
        JToken::Object(members) => {
            out.push('{');
            for (i, (key, value)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                indent(out, level + 1);
                escape_into(out, key);
                out.push(':');
                if matches!(f, Formatting::Indented { .. }) {
                    out.push(' ');
                }
                write_token(out, value, f, dates, zone, level + 1);
            }
            if !members.is_empty() {
                indent(out, level);
            }
            out.push('}');
        }
        JToken::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                indent(out, level + 1);
                write_token(out, item, f, dates, zone, level + 1);
            }
            if !items.is_empty() {
                indent(out, level);
            }
            out.push(']');
        }
        JToken::Integer(n) => out.push_str(&n.to_string()),
        JToken::BigInteger(digits) => out.push_str(digits),
        JToken::Float(x) => out.push_str(&json_double(*x)),
        JToken::String(s) => escape_into(out, s),
        JToken::Boolean(b) => out.push_str(if *b { "true" } else { "false" }),
        JToken::Null => out.push_str("null"),
        JToken::Date(d) => {
            out.push('"');
            out.push_str(&match dates {
                DateFormat::Iso => iso_date(d, zone),
                DateFormat::SqlExtension => sql_extension_date(d),
            });
            out.push('"');
        }
    }
}

/// `JsonConvert.ToString(double, FloatFormatHandling.String, '"', false)`.
pub fn json_double(x: f64) -> String {
    let text = dotnet::double_r(x);
    if !x.is_finite() {
        return format!("\"{text}\"");
    }
    if text.contains(['.', 'E', 'e']) {
        text
    } else {
        text + ".0"
    }
}

/// `DateTimeUtils.WriteDateTimeString` with `DateFormatHandling.IsoDateFormat`.
pub fn iso_date(d: &DateTime, zone: HostZone) -> String {
    let (y, m, day, h, mi, s, fraction) = d.parts();
    let mut out = format!("{y:04}-{m:02}-{day:02}T{h:02}:{mi:02}:{s:02}");
    if fraction != 0 {
        let digits = format!("{fraction:07}");
        out.push('.');
        out.push_str(digits.trim_end_matches('0'));
    }
    match d.kind {
        DateTimeKind::Utc => out.push('Z'),
        DateTimeKind::Local => {
            let minutes = zone.offset_minutes;
            let sign = if minutes >= 0 { '+' } else { '-' };
            out.push_str(&format!("{sign}{:02}:{:02}", minutes.abs() / 60, minutes.abs() % 60));
        }
        DateTimeKind::Unspecified => {}
    }
    out
}

/// `DateTime.ToString("yyyy'-'MM'-'dd'T'HH':'mm':'ss'.'fffZ")`: `fff` truncates to milliseconds, `Z` is a
/// literal letter, and the clock reading is written whatever its kind.
fn sql_extension_date(d: &DateTime) -> String {
    let (y, m, day, h, mi, s, fraction) = d.parts();
    format!("{y:04}-{m:02}-{day:02}T{h:02}:{mi:02}:{s:02}.{:03}Z", fraction / 10_000)
}

/// `JsonTextWriter.WriteValue(string)` / `WritePropertyName`: `JavaScriptUtils.WriteEscapedJavaScriptString`
/// with `StringEscapeHandling.Default` and a double quote.
fn escape_into(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{85}' => out.push_str("\\u0085"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `JValue.ToString()` (and `object.ToString()` of the plain values the serializer makes for a top-level
/// output): the raw value's own text, not JSON. A string is itself, unquoted; a container is indented JSON.
pub fn to_display_string(token: &JToken, newline: &'static str, zone: HostZone) -> String {
    match token {
        JToken::String(s) => s.clone(),
        JToken::Integer(n) => n.to_string(),
        JToken::BigInteger(digits) => digits.clone(),
        // double.ToString(): 'G' with the shortest digits, the same text as "R" (culture assumed invariant).
        JToken::Float(x) => dotnet::double_r(*x),
        JToken::Boolean(b) => if *b { "True" } else { "False" }.into(),
        JToken::Null => String::new(),
        JToken::Date(d) => d.to_invariant_string(),
        JToken::Object(_) | JToken::Array(_) => write(token, Formatting::Indented { newline }, zone),
    }
}
