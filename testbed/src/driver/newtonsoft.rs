//! Newtonsoft.Json 13.0.3 as the Functions host uses it on a custom handler's answer: the reader at default
//! settings, the `JToken` tree it builds, and the writer that turns tokens back into text. Ported rule by rule
//! so the host model can show what a consumer receives; every rule names the file and method it comes from
//! (JamesNK/Newtonsoft.Json at tag 13.0.3, `Src/Newtonsoft.Json/...`).
//!
//! Reading (`JsonTextReader` at its defaults, `DateParseHandling.DateTime`, `FloatParseHandling.Double`,
//! `DateTimeZoneHandling.RoundtripKind`):
//! - a number without `.`, `e` or `E` is an `Int64`, or a `BigInteger` past its range, and a reader error past
//!   380 characters; any other number is a `double` (`JsonTextReader.ParseReadNumber`);
//! - a string of 19 to 40 characters starting with a digit, with `T` at index 10, that `DateTimeParser.Parse`
//!   accepts, or `/Date(ms[+-hhmm])/`, becomes a `DateTime`: `Z` gives a UTC reading, an offset is converted to
//!   the host's local time (`DateTimeUtils.TryParseDateTime`, `TryParseDateTimeIso`, `TryParseDateTimeMicrosoft`);
//! - a duplicate property replaces the earlier one and moves to the end (`JTokenWriter.WritePropertyName`);
//! - more than `MaxDepth` nested containers is a reader error (`JsonReader.Push`).
//!
//! Writing (`JsonTextWriter` at its defaults): `JToken.ToString()` is indented by two spaces with the
//! platform's newline; a double is `double.ToString("R")` plus `.0` when that has no `.` or exponent
//! (`JsonConvert.ToString(double, ...)`, `EnsureDecimalPlace`), NaN and infinities are quoted strings
//! (`EnsureFloatFormat`, `FloatFormatHandling.String`); a date is ISO 8601 with up to seven fraction digits and
//! `Z` (UTC), the host zone's offset (Local) or nothing (Unspecified) (`DateTimeUtils.WriteDateTimeString`,
//! `WriteDefaultIsoDate`); strings escape `"`, `\`, control characters and U+0085, U+2028, U+2029
//! (`JavaScriptUtils.WriteEscapedJavaScriptString`).

mod date;
mod write;

pub use date::parse_date;
pub use write::{iso_date, json_double, to_display_string, write, write_with_dates, DateFormat, Formatting};

use super::dotnet::{DateTime, HostZone};

/// The reader depth the host sets (System.Net.Http.Formatting 5.2.8 `FormattingUtilities.DefaultMaxDepth`,
/// applied in `BaseJsonMediaTypeFormatter.ReadFromStream`).
pub const HOST_MAX_DEPTH: usize = 256;
/// `JsonReader`'s own default `MaxDepth` (13.0.1 and later), for `JToken.Parse`.
pub const DEFAULT_MAX_DEPTH: usize = 64;
/// `JsonTextReader.MaximumJavascriptIntegerCharacterLength`.
const MAX_INTEGER_CHARS: usize = 380;

/// A JSON value as Newtonsoft holds it after reading.
#[derive(Debug, Clone, PartialEq)]
pub enum JToken {
    /// Properties in order; names are unique (a later duplicate replaced the earlier one).
    Object(Vec<(String, JToken)>),
    Array(Vec<JToken>),
    Integer(i64),
    /// An integer beyond `Int64`, kept exactly (its canonical digits).
    BigInteger(String),
    Float(f64),
    String(String),
    Boolean(bool),
    Null,
    Date(DateTime),
}

/// Why Newtonsoft refused the text: the host then fails the whole invocation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ReadError(pub String);

/// How the reader treats strings and how deep it may go.
#[derive(Debug, Clone, Copy)]
pub struct ReadOptions {
    pub zone: HostZone,
    pub max_depth: usize,
}

/// Reads one JSON document the way `JsonTextReader` + `JTokenWriter` do (`JToken.Parse`, or the serializer
/// building `object` values).
pub fn parse(text: &str, options: ReadOptions) -> Result<JToken, ReadError> {
    let mut reader = Reader { text, pos: 0, options, depth: 0, dates: true };
    let token = reader.value()?;
    reader.skip_whitespace();
    if reader.pos != text.len() {
        return Err(reader.error("Additional text encountered after finished reading JSON content"));
    }
    Ok(token)
}

/// `HttpScriptInvocationResult` as `ReadAsAsync` builds it (Azure/azure-functions-host
/// `DefaultHttpWorkerService.GetHttpScriptInvocationResult`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostAnswer {
    /// `Outputs`: a `Dictionary<string, object>`, so keys match binding names exactly, and a later duplicate
    /// key replaces the earlier one. Values are tokens; a top-level string stays a plain string.
    pub outputs: Vec<(String, JToken)>,
    pub return_value: Option<JToken>,
}

impl HostAnswer {
    pub fn output(&self, name: &str) -> Option<&JToken> {
        self.outputs.iter().find(|(key, _)| key == name).map(|(_, value)| value)
    }
}

/// Reads a handler's answer body as the host does. The top-level property names match case-insensitively
/// (Newtonsoft's `JsonPropertyCollection.GetClosestMatchProperty`); `Logs` is read as strings, so no date
/// parsing happens there. Any read error fails the invocation in the host.
pub fn read_answer(body: &str, zone: HostZone) -> Result<HostAnswer, ReadError> {
    let options = ReadOptions { zone, max_depth: HOST_MAX_DEPTH };
    let mut reader = Reader { text: body, pos: 0, options, depth: 0, dates: true };
    reader.skip_whitespace();
    if reader.peek() != Some(b'{') {
        return Err(reader
            .error("Cannot deserialize the answer into type 'HttpScriptInvocationResult': it is not a JSON object"));
    }
    let mut answer = HostAnswer::default();
    reader.pos += 1;
    reader.depth = 1;
    loop {
        reader.skip_whitespace();
        if reader.eat(b'}') {
            break;
        }
        let key = reader.string()?;
        reader.skip_whitespace();
        reader.expect(b':')?;
        if key.eq_ignore_ascii_case("logs") {
            reader.dates = false;
            reader.value()?;
            reader.dates = true;
        } else if key.eq_ignore_ascii_case("outputs") {
            answer.outputs = match reader.value()? {
                JToken::Null => Vec::new(),
                JToken::Object(members) => members,
                _ => return Err(reader.error("Outputs: cannot deserialize into IDictionary<string, object>")),
            };
        } else if key.eq_ignore_ascii_case("returnvalue") {
            answer.return_value = Some(reader.value()?).filter(|v| *v != JToken::Null);
        } else {
            reader.value()?;
        }
        reader.skip_whitespace();
        if reader.eat(b',') {
            continue;
        }
        reader.expect(b'}')?;
        break;
    }
    reader.skip_whitespace();
    if reader.pos != body.len() {
        return Err(reader.error("Additional text encountered after finished reading JSON content"));
    }
    Ok(answer)
}

struct Reader<'a> {
    text: &'a str,
    pos: usize,
    options: ReadOptions,
    /// Open containers, the root included.
    depth: usize,
    /// False while reading strings as strings (`ReadAsString`), where no date is parsed.
    dates: bool,
}

impl Reader<'_> {
    fn error(&self, what: &str) -> ReadError {
        ReadError(format!("{what} (Newtonsoft.Json, at character {})", self.pos))
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn eat(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        if found {
            self.pos += 1;
        }
        found
    }

    fn expect(&mut self, byte: u8) -> Result<(), ReadError> {
        if self.eat(byte) {
            Ok(())
        } else {
            Err(self.error(&format!("expected '{}'", byte as char)))
        }
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    /// `JsonReader.Push`: a container nested below `MaxDepth` others is an error.
    fn open(&mut self) -> Result<(), ReadError> {
        self.depth += 1;
        if self.depth > self.options.max_depth {
            return Err(self.error(&format!("The reader's MaxDepth of {} has been exceeded.", self.options.max_depth)));
        }
        Ok(())
    }

    fn value(&mut self) -> Result<JToken, ReadError> {
        self.skip_whitespace();
        match self.peek() {
            Some(b'{') => {
                self.pos += 1;
                self.open()?;
                let mut members: Vec<(String, JToken)> = Vec::new();
                self.skip_whitespace();
                if !self.eat(b'}') {
                    loop {
                        self.skip_whitespace();
                        let key = self.string()?;
                        self.skip_whitespace();
                        self.expect(b':')?;
                        let value = self.value()?;
                        // JTokenWriter.WritePropertyName: "last property name wins" (remove, then add at the end).
                        members.retain(|(k, _)| *k != key);
                        members.push((key, value));
                        self.skip_whitespace();
                        if self.eat(b',') {
                            continue;
                        }
                        self.expect(b'}')?;
                        break;
                    }
                }
                self.depth -= 1;
                Ok(JToken::Object(members))
            }
            Some(b'[') => {
                self.pos += 1;
                self.open()?;
                let mut items = Vec::new();
                self.skip_whitespace();
                if !self.eat(b']') {
                    loop {
                        items.push(self.value()?);
                        self.skip_whitespace();
                        if self.eat(b',') {
                            continue;
                        }
                        self.expect(b']')?;
                        break;
                    }
                }
                self.depth -= 1;
                Ok(JToken::Array(items))
            }
            Some(b'"') => {
                let text = self.string()?;
                if self.dates {
                    if let Some(date) = parse_date(&text, self.options.zone)? {
                        return Ok(JToken::Date(date));
                    }
                }
                Ok(JToken::String(text))
            }
            Some(b't') if self.text[self.pos..].starts_with("true") => {
                self.pos += 4;
                Ok(JToken::Boolean(true))
            }
            Some(b'f') if self.text[self.pos..].starts_with("false") => {
                self.pos += 5;
                Ok(JToken::Boolean(false))
            }
            Some(b'n') if self.text[self.pos..].starts_with("null") => {
                self.pos += 4;
                Ok(JToken::Null)
            }
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => Err(self.error("Unexpected character encountered while parsing value")),
        }
    }

    /// `JsonTextReader.ParseReadNumber` for `ReadType.Read`.
    fn number(&mut self) -> Result<JToken, ReadError> {
        let start = self.pos;
        while matches!(self.peek(), Some(b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')) {
            self.pos += 1;
        }
        let text = &self.text[start..self.pos];
        let is_integer = !text.contains(['.', 'e', 'E']);
        if is_integer {
            if let Ok(n) = text.parse::<i64>() {
                return Ok(JToken::Integer(n));
            }
            if text.len() > MAX_INTEGER_CHARS {
                return Err(self.error(&format!("JSON integer {text} is too large to parse.")));
            }
            let (sign, digits) = text.strip_prefix('-').map_or(("", text), |d| ("-", d));
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(self.error(&format!("Input string '{text}' is not a valid number.")));
            }
            let digits = digits.trim_start_matches('0');
            return Ok(JToken::BigInteger(format!("{sign}{digits}")));
        }
        // double.TryParse(NumberStyles.Float, InvariantCulture): correctly rounded since .NET Core 3.0, and an
        // overflow is an infinity rather than a failure.
        text.parse::<f64>()
            .map(JToken::Float)
            .map_err(|_| self.error(&format!("Input string '{text}' is not a valid number.")))
    }

    fn string(&mut self) -> Result<String, ReadError> {
        self.expect(b'"')?;
        let mut out = String::new();
        loop {
            let rest = &self.text[self.pos..];
            let Some(stop) = rest.find(['"', '\\']) else {
                return Err(self.error("Unterminated string. Expected delimiter: \""));
            };
            out.push_str(&rest[..stop]);
            self.pos += stop;
            if self.eat(b'"') {
                return Ok(out);
            }
            self.pos += 1; // the backslash
            let escaped = self.peek().ok_or_else(|| self.error("Unterminated string"))?;
            self.pos += 1;
            match escaped {
                b'"' => out.push('"'),
                b'\\' => out.push('\\'),
                b'/' => out.push('/'),
                b'b' => out.push('\u{8}'),
                b'f' => out.push('\u{c}'),
                b'n' => out.push('\n'),
                b'r' => out.push('\r'),
                b't' => out.push('\t'),
                b'u' => {
                    let unit = self.hex4()?;
                    let c = if (0xD800..0xDC00).contains(&unit) && self.text[self.pos..].starts_with("\\u") {
                        let save = self.pos;
                        self.pos += 2;
                        let low = self.hex4()?;
                        if (0xDC00..0xE000).contains(&low) {
                            char::from_u32(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00))
                        } else {
                            self.pos = save;
                            None
                        }
                    } else {
                        char::from_u32(unit)
                    };
                    // A lone surrogate cannot be held in a Rust string; Newtonsoft keeps it in its UTF-16 string
                    // and the queue's UTF-8 encoder replaces it, so U+FFFD is what a consumer would see.
                    out.push(c.unwrap_or('\u{FFFD}'));
                }
                _ => return Err(self.error("Bad JSON escape sequence")),
            }
        }
    }

    fn hex4(&mut self) -> Result<u32, ReadError> {
        let hex = self.text.get(self.pos..self.pos + 4).ok_or_else(|| self.error("Invalid Unicode escape sequence"))?;
        let unit = u32::from_str_radix(hex, 16).map_err(|_| self.error("Invalid Unicode escape sequence"))?;
        self.pos += 4;
        Ok(unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> JToken {
        parse(text, ReadOptions { zone: HostZone::UTC, max_depth: DEFAULT_MAX_DEPTH }).expect("reads")
    }

    fn round_trip(text: &str) -> String {
        write(&read(text), Formatting::None, HostZone::UTC)
    }

    #[test]
    fn dates_are_read_only_in_the_shapes_datetimeparser_accepts() {
        for (input, output) in [
            (r#""2024-01-02T03:04:05""#, r#""2024-01-02T03:04:05""#),
            (r#""2024-01-02T03:04:05.1200000Z""#, r#""2024-01-02T03:04:05.12Z""#),
            (r#""2024-07-02T03:04:05.12+02:00""#, r#""2024-07-02T01:04:05.12+00:00""#),
            (r#""2024-07-02T03:04:05-0130""#, r#""2024-07-02T04:34:05+00:00""#),
            (r#""2024-07-02T03:04:05+02""#, r#""2024-07-02T01:04:05+00:00""#),
            (r#""2024-01-02T24:00:00""#, r#""2024-01-03T00:00:00""#),
            // eight fraction digits: the parser stops after seven and the rest does not parse as a zone
            (r#""2024-01-02T03:04:05.12345678""#, r#""2024-01-02T03:04:05.12345678""#),
            // nine: the last two digits are read as zone minutes with no zone, so it is a date after all
            (r#""2024-01-02T03:04:05.123456789""#, r#""2024-01-02T03:04:05.1234567""#),
            (r#""1900-01-01T00:19:32+00:19:32""#, r#""1900-01-01T00:19:32+00:19:32""#),
            (r#""2024-02-30T00:00:00""#, r#""2024-02-30T00:00:00""#),
            (r#""2024-01-02 03:04:05""#, r#""2024-01-02 03:04:05""#),
            (r#""2024-01-02""#, r#""2024-01-02""#),
            (r#""/Date(1700000000000)/""#, r#""2023-11-14T22:13:20Z""#),
            (r#""/Date(1700000000000+0100)/""#, r#""2023-11-14T22:13:20+00:00""#),
        ] {
            assert_eq!(round_trip(input), output, "{input}");
        }
        let past_the_end = parse(r#""9999-12-31T24:00:00""#, ReadOptions { zone: HostZone::UTC, max_depth: 64 });
        assert!(past_the_end.is_err(), "AddDays past DateTime.MaxValue throws");
    }

    #[test]
    fn numbers_become_long_biginteger_or_double() {
        assert_eq!(
            round_trip("[120.00,1,-0,12345678901234567890,1e2,1E400,-0.0,0.1]"),
            r#"[120.0,1,0,12345678901234567890,100.0,"Infinity",-0.0,0.1]"#
        );
        let huge = format!("[1{}]", "0".repeat(400));
        assert!(parse(&huge, ReadOptions { zone: HostZone::UTC, max_depth: 64 }).is_err());
    }

    #[test]
    fn duplicates_move_to_the_end_and_depth_is_bounded() {
        assert_eq!(round_trip(r#"{"a":1,"b":2,"a":3}"#), r#"{"b":2,"a":3}"#);
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        let options = ReadOptions { zone: HostZone::UTC, max_depth: 64 };
        assert!(parse(&deep(64), options).is_ok());
        assert!(parse(&deep(65), options).is_err());
    }

    #[test]
    fn indented_output_matches_jsontextwriter() {
        let token = read(r#"{"Operation":0,"Item":{"id":1,"tags":[],"o":{},"s":"a\"\\\u0001\u2028é"}}"#);
        assert_eq!(
            write(&token, Formatting::Indented { newline: "\n" }, HostZone::UTC),
            "{\n  \"Operation\": 0,\n  \"Item\": {\n    \"id\": 1,\n    \"tags\": [],\n    \"o\": {},\n    \"s\": \"a\\\"\\\\\\u0001\\u2028é\"\n  }\n}"
        );
    }

    #[test]
    fn answers_are_read_as_httpscriptinvocationresult() {
        let answer = read_answer(
            r#"{"outputs":{"q":[1],"q":[2],"Q":"x"},"Logs":["2024-01-02T03:04:05Z"],"ReturnValue":null}"#,
            HostZone::UTC,
        )
        .expect("reads");
        assert_eq!(answer.output("q"), Some(&JToken::Array(vec![JToken::Integer(2)])));
        assert_eq!(answer.output("Q"), Some(&JToken::String("x".into())));
        assert_eq!(answer.return_value, None);
        assert!(read_answer("[1]", HostZone::UTC).is_err());
        assert!(read_answer(r#"{"Outputs":[1]}"#, HostZone::UTC).is_err());
    }
}
