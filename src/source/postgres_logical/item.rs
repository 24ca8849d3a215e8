//! `Item`s built in the handler from the WAL's text values, for tables whose every column has a type whose
//! JSON the handler can write exactly as the cursor source's `row_to_json` would: no second round trip.
//!
//! pgoutput sends each value as its type's output function writes it. For the types below, `row_to_json`
//! writes that same output text, quoted and escaped or not by the type's JSON category
//! (`datum_to_json` in PostgreSQL's `json.c`), and nothing about it depends on a session setting:
//!
//! | types (OIDs)                                     | the WAL's text            | `row_to_json`                    |
//! |--------------------------------------------------|---------------------------|----------------------------------|
//! | int2, int4, int8 (21, 23, 20)                    | `-12`                     | the text                         |
//! | numeric (1700)                                   | `1.50`, `NaN`, `Infinity` | the text; `NaN`/`±Infinity` quoted |
//! | bool (16)                                        | `t`, `f`                  | `true`, `false`                  |
//! | text, varchar, bpchar, name, uuid (25, 1043, 1042, 19, 2950) | the text      | a JSON string (`escape_json`)    |
//! | json, jsonb (114, 3802)                          | the text                  | the text (json keeps its text; jsonb's output is canonical) |
//! | date, timestamp, timestamptz (1082, 1114, 1184)  | ISO (`DateStyle` pinned)  | ISO 8601 with `T`, quoted        |
//!
//! The session contract (`db::postgres::session`) pins `DateStyle`, so the WAL's text of a date or time is ISO
//! whichever reader decoded it, in the pooled sessions' time zone, which is the zone `row_to_json` writes in.
//! A relation with a column of any other type (bytea is sent as base64; floats, arrays, domains, enums,
//! ranges…), a
//! relation whose columns differ from the catalog read at start (the statement casts to the table's types), a
//! json or jsonb key column (the statement renders a key as a plain column), and a value this module does
//! not recognise (a text an integer type would never write; an unchanged TOAST value left out of the WAL) all
//! take the statement (`sql::items`) instead.

use serde_json::{Map, Value};

/// How a whitelisted type's text becomes JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Render {
    Integer,
    Numeric,
    Bool,
    /// A JSON string of the text.
    Text,
    /// The text itself (json, jsonb).
    Json,
    /// date, timestamp, timestamptz written in ISO (`DateStyle` ISO): `row_to_json`'s ISO 8601 with `T`.
    Date,
    Timestamp,
    TimestampTz,
}

/// The render of a type OID pgoutput names, when it is on the whitelist.
pub(super) fn render_of(type_oid: u32) -> Option<Render> {
    Some(match type_oid {
        20 | 21 | 23 => Render::Integer,
        1700 => Render::Numeric,
        16 => Render::Bool,
        19 | 25 | 1042 | 1043 | 2950 | 5069 => Render::Text,
        114 | 3802 => Render::Json,
        1082 => Render::Date,
        1114 => Render::Timestamp,
        1184 => Render::TimestampTz,
        _ => return None,
    })
}

/// What builds a relation's `Item`s: each column's name, JSON key (quoted) and render, for the row and for the
/// key. Made by `catalog::Shape::plan`, which checks the relation against the catalog read at start.
#[derive(Debug, Clone)]
pub(super) struct Plan {
    row: Vec<(String, String, Render)>,
    key: Vec<(String, String, Render)>,
}

impl Plan {
    pub fn new(row: Vec<(String, String, Render)>, key: Vec<(String, String, Render)>) -> Self {
        Self { row, key }
    }
}

/// The `Item` of a change (`kind` as `sql::items` reads it: 0 the row, 1 the key), or `None` when the
/// statement must build it: a column left out of `values`, a value not recognised, or kind 2.
pub(super) fn build(plan: &Plan, kind: i32, values: &Map<String, Value>) -> Option<String> {
    let columns = match kind {
        0 => &plan.row,
        1 => &plan.key,
        _ => return None,
    };
    let mut out = String::with_capacity(64);
    out.push('{');
    for (i, (name, key, render)) in columns.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(key);
        out.push(':');
        match values.get(name)? {
            Value::Null => out.push_str("null"),
            Value::String(text) => render_value(*render, text, &mut out)?,
            _ => return None,
        }
    }
    out.push('}');
    Some(out)
}

/// Appends `text` (the type's output) as `row_to_json` writes it, or `None` when it is not what the type's
/// output function writes.
fn render_value(render: Render, text: &str, out: &mut String) -> Option<()> {
    match render {
        Render::Integer if is_number(text, false) => out.push_str(text),
        Render::Numeric if is_number(text, true) => out.push_str(text),
        Render::Numeric if matches!(text, "NaN" | "Infinity" | "-Infinity") => {
            out.push('"');
            out.push_str(text);
            out.push('"');
        }
        Render::Bool if text == "t" => out.push_str("true"),
        Render::Bool if text == "f" => out.push_str("false"),
        Render::Text => out.push_str(&escape_json(text)),
        Render::Json => out.push_str(text),
        Render::Date | Render::Timestamp | Render::TimestampTz => {
            let iso = if matches!(text, "infinity" | "-infinity") { text.to_string() } else { iso_8601(render, text)? };
            out.push('"');
            out.push_str(&iso);
            out.push('"');
        }
        _ => return None,
    }
    Some(())
}

/// A date or time in `DateStyle` ISO (`2024-02-29 23:59:59.5+05:30`) as `row_to_json` writes it (XSD: `T`
/// between date and time, a time zone always with minutes); `None` for what ISO output does not write (and
/// for BC dates, left to the statement).
fn iso_8601(render: Render, text: &str) -> Option<String> {
    let digits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit());
    let (date, rest) = match render {
        Render::Date => (text, None),
        _ => text.split_once(' ').map(|(d, r)| (d, Some(r)))?,
    };
    let mut d = date.split('-');
    let (y, m, day) = (d.next()?, d.next()?, d.next()?);
    if d.next().is_some() || y.len() < 4 || !digits(y, y.len()) || !digits(m, 2) || !digits(day, 2) {
        return None;
    }
    let Some(rest) = rest else { return Some(date.to_string()) };
    let (time, zone) = match render {
        Render::TimestampTz => {
            let at = rest.find(['+', '-'])?;
            (&rest[..at], Some((&rest[at..at + 1], &rest[at + 1..])))
        }
        _ => (rest, None),
    };
    let (hms, fraction) = match time.split_once('.') {
        Some((hms, f)) if !f.is_empty() && f.len() <= 6 && digits(f, f.len()) => (hms, Some(f)),
        Some(_) => return None,
        None => (time, None),
    };
    let mut t = hms.split(':');
    let (h, mi, s) = (t.next()?, t.next()?, t.next()?);
    if t.next().is_some() || !digits(h, 2) || !digits(mi, 2) || !digits(s, 2) {
        return None;
    }
    let mut out = format!("{date}T{hms}");
    if let Some(f) = fraction {
        out.push('.');
        out.push_str(f);
    }
    if let Some((sign, zone)) = zone {
        let parts: Vec<&str> = zone.split(':').collect();
        if parts.is_empty() || parts.len() > 3 || !parts.iter().all(|p| digits(p, 2)) {
            return None;
        }
        out.push_str(sign);
        out.push_str(zone);
        if parts.len() == 1 {
            out.push_str(":00");
        }
    }
    Some(out)
}

/// `-?(0|[1-9][0-9]*)`, and with `fraction` an optional `.[0-9]+`: what int and numeric output write for a
/// finite value, and a JSON number as written.
fn is_number(text: &str, fraction: bool) -> bool {
    let digits = text.strip_prefix('-').unwrap_or(text);
    let (whole, frac) = match digits.split_once('.') {
        Some((w, f)) if fraction => (w, Some(f)),
        Some(_) => return false,
        None => (digits, None),
    };
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    all_digits(whole) && (whole == "0" || !whole.starts_with('0')) && frac.is_none_or(all_digits)
}

/// A JSON string of `text`, escaped as PostgreSQL's `escape_json` does: `\b \f \n \r \t \" \\`, other
/// control characters as `\u00xx` (lowercase hex), everything else (non-ASCII included) as it is.
pub(super) fn escape_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plan_of(row: &[(&str, Render)], key: &[(&str, Render)]) -> Plan {
        let f = |cols: &[(&str, Render)]| cols.iter().map(|(n, r)| (n.to_string(), escape_json(n), *r)).collect();
        Plan { row: f(row), key: f(key) }
    }

    fn one(render: Render, text: &str) -> Option<String> {
        let plan = plan_of(&[("v", render)], &[]);
        let values = json!({ "v": text });
        build(&plan, 0, values.as_object().expect("an object"))
            .map(|s| s.strip_prefix("{\"v\":").and_then(|s| s.strip_suffix('}')).expect("one column").to_string())
    }

    #[test]
    fn integers_and_numerics_are_written_as_numbers_and_numeric_nan_and_infinities_as_strings() {
        for n in ["0", "-1", "32767", "-9223372036854775808"] {
            assert_eq!(one(Render::Integer, n).as_deref(), Some(n));
        }
        for n in ["0", "0.0000000001", "-0.5", "12345678901234567890.0123456789", "1.50"] {
            assert_eq!(one(Render::Numeric, n).as_deref(), Some(n));
        }
        assert_eq!(one(Render::Numeric, "NaN").as_deref(), Some("\"NaN\""));
        assert_eq!(one(Render::Numeric, "Infinity").as_deref(), Some("\"Infinity\""));
        assert_eq!(one(Render::Numeric, "-Infinity").as_deref(), Some("\"-Infinity\""));
    }

    #[test]
    fn a_text_no_output_function_writes_is_left_to_the_statement() {
        for n in ["", "-", "1.5", "01", "+1", "1e3", " 1", "NaN"] {
            assert_eq!(one(Render::Integer, n), None, "{n:?}");
        }
        for n in ["", ".5", "5.", "1e3", "00.1", "-", "nan", "inf"] {
            assert_eq!(one(Render::Numeric, n), None, "{n:?}");
        }
        for b in ["true", "false", "", "T"] {
            assert_eq!(one(Render::Bool, b), None, "{b:?}");
        }
    }

    #[test]
    fn booleans_are_true_and_false() {
        assert_eq!(one(Render::Bool, "t").as_deref(), Some("true"));
        assert_eq!(one(Render::Bool, "f").as_deref(), Some("false"));
    }

    #[test]
    fn text_is_escaped_as_postgres_escape_json_does() {
        assert_eq!(one(Render::Text, "").as_deref(), Some("\"\""));
        assert_eq!(
            one(Render::Text, "a\"b\\c\nd\re\tf\u{8}g\u{c}h\u{1}i\u{1f}j\u{7f}k/é€😀").as_deref(),
            Some("\"a\\\"b\\\\c\\nd\\re\\tf\\bg\\fh\\u0001i\\u001fj\u{7f}k/é€😀\"")
        );
        assert_eq!(one(Render::Text, "ab  ").as_deref(), Some("\"ab  \""));
    }

    #[test]
    fn iso_dates_and_times_become_iso_8601_with_t_and_a_zone_with_minutes() {
        let q = |s: &str| Some(format!("\"{s}\""));
        assert_eq!(one(Render::Date, "2024-02-29"), q("2024-02-29"));
        assert_eq!(one(Render::Date, "12345-01-01"), q("12345-01-01"));
        assert_eq!(one(Render::Timestamp, "1999-12-31 23:59:59.999999"), q("1999-12-31T23:59:59.999999"));
        assert_eq!(one(Render::Timestamp, "1999-12-31 23:59:59"), q("1999-12-31T23:59:59"));
        assert_eq!(one(Render::TimestampTz, "2024-02-29 20:29:59.123456+02"), q("2024-02-29T20:29:59.123456+02:00"));
        assert_eq!(one(Render::TimestampTz, "2024-02-29 14:29:59-04:30"), q("2024-02-29T14:29:59-04:30"));
        assert_eq!(one(Render::TimestampTz, "1850-01-01 00:00:00+00:19:32"), q("1850-01-01T00:00:00+00:19:32"));
        for r in [Render::Date, Render::Timestamp, Render::TimestampTz] {
            assert_eq!(one(r, "infinity"), q("infinity"));
            assert_eq!(one(r, "-infinity"), q("-infinity"));
        }
    }

    #[test]
    fn dates_and_times_in_another_style_or_bc_are_left_to_the_statement() {
        for text in ["2024-02-29 BC", "02/29/2024", "29.02.2024", "2024-2-29", "Thu Feb 29 2024", ""] {
            assert_eq!(one(Render::Date, text), None, "{text:?}");
        }
        for text in ["0001-01-01 00:00:00 BC", "2024-02-29T23:59:59", "Thu Feb 29 23:59:59 2024", "2024-02-29 23:59"] {
            assert_eq!(one(Render::Timestamp, text), None, "{text:?}");
        }
        for text in [
            "0001-01-01 00:00:00+00 BC",
            "2024-02-29 23:59:59",
            "2024-02-29 23:59:59 CET",
            "2024-02-29 23:59:59+2",
            "Thu 29 Feb 23:59:59 2024 CET",
        ] {
            assert_eq!(one(Render::TimestampTz, text), None, "{text:?}");
        }
    }

    #[test]
    fn json_keeps_its_text() {
        let text = "{\"b\":1,  \"a\" : 2, \"a\": 3}";
        assert_eq!(one(Render::Json, text).as_deref(), Some(text));
    }

    #[test]
    fn items_follow_the_plans_order_nulls_are_null_and_a_left_out_value_needs_the_statement() {
        let plan = plan_of(
            &[("id", Render::Integer), ("na\"me", Render::Text), ("ok", Render::Bool)],
            &[("id", Render::Integer)],
        );
        let values = json!({ "ok": "t", "na\"me": null, "id": "7" });
        let values = values.as_object().expect("an object");
        assert_eq!(build(&plan, 0, values).as_deref(), Some("{\"id\":7,\"na\\\"me\":null,\"ok\":true}"));
        assert_eq!(build(&plan, 1, values).as_deref(), Some("{\"id\":7}"));
        assert_eq!(build(&plan, 2, values), None);
        let partial = json!({ "id": "7", "ok": "t" });
        assert_eq!(build(&plan, 0, partial.as_object().expect("an object")), None);
        assert_eq!(build(&plan, 1, partial.as_object().expect("an object")).as_deref(), Some("{\"id\":7}"));
    }

    #[test]
    fn only_the_whitelisted_types_have_a_render() {
        for oid in [20, 21, 23, 1700, 16, 19, 25, 1042, 1043, 2950, 5069, 114, 3802, 1082, 1114, 1184] {
            assert!(render_of(oid).is_some(), "{oid}");
        }
        // float4, float8, bytea, time, timetz, interval, oid, xid, "char", text[], money
        for oid in [700, 701, 17, 1083, 1266, 1186, 26, 28, 18, 1009, 790] {
            assert_eq!(render_of(oid), None, "{oid}");
        }
    }
}
