//! Every documented difference between a path and the oracle, as a named rule (docs/values.md names the same
//! rules). A path's cell either equals the oracle's byte for byte, or differs exactly as one of that path's
//! rules says; anything else is a finding. Each rule is checked both ways: a cell it explains must really
//! differ as the rule says (never "anything goes"), and [`Findings::require`] fails a rule that never fired,
//! so a rule that no longer describes anything cannot stay in the docs.

use super::oracle::preview;
use serde_json::Value;
use std::collections::BTreeSet;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Every path: of a database's own settings only `TimeZone` shows, in the values that carry an offset
/// ([`OFFSET_COLUMNS`]); `DateStyle`, `IntervalStyle`, `extra_float_digits` and `bytea_output` change nothing.
pub const ONLY_THE_TIME_ZONE_SHOWS: &str = "every path: only the database's TimeZone shows";
/// The columns whose text carries a UTC offset (timestamptz, alone or inside a range, an array, a composite).
pub const OFFSET_COLUMNS: &[&str] = &["tstz", "tstzrange", "tstzmultirange", "tstz_array", "composite"];
/// Host json: a number with a fraction or an exponent is a .NET double to the host, written back in .NET's
/// form (`120.00` → `120.0`, `1e+15` → `1000000000000000.0`, 40 digits → 17): the same double, not the same text.
pub const DECIMALS_BECOME_DOUBLES: &str = "host json: decimals become doubles";
/// Host json: a string Newtonsoft takes for a date with an offset (19 to 40 characters, a digit first, `T` at
/// index 10) is moved to the host's zone (UTC): the same instant, `+00:00`, the writer's offset lost. Applies to
/// timestamptz and to any text, json string or array element that looks like one.
pub const OFFSETS_MOVE_TO_THE_HOSTS_ZONE: &str = "host json: offsets move to the host's zone";
/// Host json: a json/jsonb value, an array or a composite is re-read and re-written by Newtonsoft: spacing and
/// indentation change, numbers inside follow the two rules above, a duplicate key keeps its last value.
pub const NESTED_JSON_IS_REWRITTEN: &str = "host json: nested values are re-written";
/// Host json: `-0` has no fraction, so Newtonsoft reads it as the integer 0: the sign of a negative zero float
/// is lost.
pub const NEGATIVE_ZERO_LOSES_ITS_SIGN: &str = "host json: -0 becomes 0";
/// Host json: a string is re-written by Newtonsoft with its own escapes (`\u2028` for a raw U+2028 line
/// separator): the same string, other bytes.
pub const STRINGS_ARE_ESCAPED_ANEW: &str = "host json: strings are escaped anew";
/// stdout: a change is one line, so a json value's own spacing between tokens (line breaks included) is dropped;
/// strings, numbers and everything else keep their bytes.
pub const STDOUT_COMPACTS_JSON_VALUES: &str = "stdout: json values lose the spacing between their tokens";
/// PostgreSQL sink: `json_to_recordset` takes a json value without the spaces around it (`  [ ]  ` → `[ ]`).
pub const JSON_OUTER_SPACES_ARE_TRIMMED: &str = "postgres sink: spaces around a json value are trimmed";
/// Every JSON path: a json/jsonb `null` and SQL NULL are both `null` in an Item, so the PostgreSQL sink writes
/// SQL NULL for both.
pub const JSON_NULL_IS_SQL_NULL: &str = "every path: json null and SQL NULL are both null";
/// Every JSON path: an array is a JSON array, so its lower bound is lost (`[0:2]={1,2,3}` is `[1,2,3]`), and
/// the PostgreSQL sink writes it with the default lower bound 1.
pub const ARRAY_LOWER_BOUNDS_ARE_LOST: &str = "every path: array lower bounds are lost";

/// The findings of one test: cells no rule explains, and the rules that explained something.
#[derive(Default)]
pub struct Findings {
    unexplained: Vec<String>,
    fired: BTreeSet<&'static str>,
}

impl Findings {
    /// A difference no rule explains.
    pub fn unexplained(&mut self, what: String) {
        self.unexplained.push(what);
    }

    pub fn fired(&mut self, rule: &'static str) {
        self.fired.insert(rule);
    }

    /// Fails the test listing every unexplained difference, and every rule of `required` that never fired.
    pub fn require(self, test: &str, required: &[&'static str]) {
        let mut problems = self.unexplained;
        for rule in required {
            if !self.fired.contains(rule) {
                problems.push(format!(
                    "documented rule \"{rule}\" never applied: the docs describe a difference that does not exist"
                ));
            }
        }
        assert!(problems.is_empty(), "{test}: {} finding(s):\n{}", problems.len(), problems.join("\n"));
    }
}

/// A host json cell against the oracle's: the rule that explains the difference, or why none does.
pub fn host_json_cell(oracle: &str, consumer: &str) -> Result<Option<&'static str>, String> {
    if oracle == consumer {
        return Ok(None);
    }
    let parse =
        |text: &str| serde_json::from_str::<Value>(text).map_err(|e| format!("not JSON ({e}): {}", preview(text)));
    let (want, got) = (parse(oracle)?, parse(consumer)?);
    let rule = match &want {
        Value::Number(_) if oracle == "-0" || oracle == "-0.0" => {
            (got.as_i64() == Some(0) && consumer == "0").then_some(NEGATIVE_ZERO_LOSES_ITS_SIGN)
        }
        Value::Number(_) if oracle.contains(['.', 'e', 'E']) => {
            (oracle.parse::<f64>().ok() == consumer.parse::<f64>().ok()).then_some(DECIMALS_BECOME_DOUBLES)
        }
        Value::String(w) => match &got {
            Value::String(g) if w == g => Some(STRINGS_ARE_ESCAPED_ANEW),
            Value::String(g) if same_instant_in_utc(w, g) => Some(OFFSETS_MOVE_TO_THE_HOSTS_ZONE),
            _ => None,
        },
        Value::Object(_) | Value::Array(_) => same_reread(&want, &got).then_some(NESTED_JSON_IS_REWRITTEN),
        _ => None,
    };
    rule.map(Some).ok_or_else(|| format!("oracle {}, consumer read {}", preview(oracle), preview(consumer)))
}

/// Two numbers inside a json value that are the same double. serde_json's own reading of a long mantissa may be
/// off by an ulp (its exact reader is a feature this build does not enable), so within a relative 1e-15; the
/// top-level cells are compared exactly, from their text.
fn same_double(a: &Value, b: &Value) -> bool {
    matches!((a.as_f64(), b.as_f64()), (Some(x), Some(y)) if x == y || (x - y).abs() <= 1e-15 * x.abs().max(y.abs()))
}

/// Newtonsoft's test for a date: 19 to 40 characters, a digit first, `T` at index 10.
fn looks_like_a_date(s: &str) -> bool {
    (19..=40).contains(&s.len()) && s.starts_with(|c: char| c.is_ascii_digit()) && s.as_bytes().get(10) == Some(&b'T')
}

/// `got` is `want`'s instant written at `+00:00` (and `want` a date to Newtonsoft, with an offset).
fn same_instant_in_utc(want: &str, got: &str) -> bool {
    if !looks_like_a_date(want) || !got.ends_with("+00:00") {
        return false;
    }
    match (OffsetDateTime::parse(want, &Rfc3339), OffsetDateTime::parse(got, &Rfc3339)) {
        (Ok(w), Ok(g)) => w == g,
        _ => false,
    }
}

/// `got` is `want` re-read by Newtonsoft: equal structure, numbers equal as doubles, date strings moved to UTC.
fn same_reread(want: &Value, got: &Value) -> bool {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            w.len() == g.len() && w.iter().all(|(k, v)| g.get(k).is_some_and(|x| same_reread(v, x)))
        }
        (Value::Array(w), Value::Array(g)) => w.len() == g.len() && w.iter().zip(g).all(|(v, x)| same_reread(v, x)),
        (Value::Number(_), Value::Number(_)) => same_double(want, got),
        (Value::String(w), Value::String(g)) => w == g || same_instant_in_utc(w, g),
        _ => want == got,
    }
}

/// A PostgreSQL sink's target cell (`::text`) against the source's, with the column's type.
pub fn sink_text_cell(ty: &str, source: Option<&str>, target: Option<&str>) -> Result<Option<&'static str>, String> {
    if source == target {
        return Ok(None);
    }
    let rule = match (source, target) {
        (Some("null"), None) if ty == "json" || ty == "jsonb" => Some(JSON_NULL_IS_SQL_NULL),
        (Some(s), Some(t)) if ty == "json" && s.trim_matches(JSON_SPACE) == t => Some(JSON_OUTER_SPACES_ARE_TRIMMED),
        (Some(s), Some(t))
            if s.starts_with('[') && s.split_once("]={").is_some_and(|(_, rest)| format!("{{{rest}") == t) =>
        {
            Some(ARRAY_LOWER_BOUNDS_ARE_LOST)
        }
        _ => None,
    };
    let show = |v: Option<&str>| v.map_or("NULL".to_string(), preview);
    rule.map(Some).ok_or_else(|| format!("source {}, target {}", show(source), show(target)))
}

/// A PostgreSQL sink's target Item cell against the source's: only a json value's outer spaces may differ.
pub fn sink_item_cell(oracle: &str, target: &str) -> Result<Option<&'static str>, String> {
    if oracle == target {
        Ok(None)
    } else if oracle.trim_matches(JSON_SPACE) == target {
        Ok(Some(JSON_OUTER_SPACES_ARE_TRIMMED))
    } else {
        Err(format!("source {}, target {}", preview(oracle), preview(target)))
    }
}

/// A stdout cell against the oracle's: only a json value's spacing between tokens may be gone.
pub fn stdout_cell(oracle: &str, got: &str) -> Result<Option<&'static str>, String> {
    if oracle == got {
        Ok(None)
    } else if without_spacing(oracle) == got {
        Ok(Some(STDOUT_COMPACTS_JSON_VALUES))
    } else {
        Err(format!("oracle {}, got {}", preview(oracle), preview(got)))
    }
}

/// `json` without the spaces, tabs and line breaks between its tokens (inside strings everything stays).
fn without_spacing(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in json.chars() {
        if in_string {
            (in_string, escaped) = (escaped || c != '"', !escaped && c == '\\');
        } else if JSON_SPACE.contains(&c) {
            continue;
        } else {
            in_string = c == '"';
        }
        out.push(c);
    }
    out
}

const JSON_SPACE: [char; 4] = [' ', '\t', '\n', '\r'];
