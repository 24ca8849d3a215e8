//! JSON lines on standard output: exactly one compact JSON object per change, one per line,
//! `{"function","batch_id","Operation","Item"}`, plus `"Metadata"` when the source was asked for it
//! (`includeMetadata`); docs/sinks.md has the line shape.
//! Useful for piping into other tools and for looking at a drain; a write to stdout that fails (closed pipe)
//! is a failed delivery, so nothing is acknowledged that nobody read.
//!
//! Items are the JSON text the source built, which keeps a `json` column's own whitespace (tabs, newlines
//! between its tokens): [`compact`] drops whitespace outside strings so a change never spans two lines, and
//! never re-serializes a value, so numbers and strings keep their exact bytes.

use super::{Sink, SinkBatch, SinkError};
use std::borrow::Cow;
use std::io::Write;

#[derive(Debug, Default)]
pub struct StdoutSink;

impl StdoutSink {
    pub fn new() -> Self {
        Self
    }
}

#[async_trait::async_trait]
impl Sink for StdoutSink {
    async fn deliver(&self, batch: &SinkBatch<'_>) -> Result<(), SinkError> {
        let mut text = String::with_capacity(batch.changes.len() * 128);
        for c in batch.changes {
            let op = c.operation as u8;
            let metadata = c.metadata.as_ref().map_or(String::new(), |m| format!(",\"Metadata\":{}", compact(m.get())));
            text.push_str(&format!(
                "{{\"function\":{},\"batch_id\":{},\"Operation\":{op},\"Item\":{}{metadata}}}\n",
                serde_json::Value::String(batch.function.to_string()),
                batch.range.batch_id,
                compact(c.item.get())
            ));
        }
        tokio::task::spawn_blocking(move || {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes()).and_then(|()| out.flush())
        })
        .await
        .map_err(|e| SinkError::Transient(format!("stdout writer failed: {e}")))?
        .map_err(|e| SinkError::Transient(format!("cannot write to stdout: {e}")))
    }

    fn describe(&self) -> String {
        "stdout (JSON lines)".into()
    }
}

/// `json` (valid JSON text) without the whitespace JSON allows between tokens (space, tab, line feed, carriage
/// return), scanned once; strings, numbers and literals keep their bytes. Borrowed when there is none, as for
/// every item built by `row_to_json` or `FOR JSON` from columns other than `json`. A valid JSON string holds no
/// raw control character, so what is left has no line break.
fn compact(json: &str) -> Cow<'_, str> {
    let bytes = json.as_bytes();
    let mut in_string = false;
    let mut escaped = false;
    let mut out: Option<Vec<u8>> = None;
    for (i, &b) in bytes.iter().enumerate() {
        let insignificant = !in_string && matches!(b, b' ' | b'\t' | b'\n' | b'\r');
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
        } else if b == b'"' {
            in_string = true;
        }
        match (&mut out, insignificant) {
            (None, true) => out = Some(bytes[..i].to_vec()),
            (Some(out), false) => out.push(b),
            _ => {}
        }
    }
    match out {
        None => Cow::Borrowed(json),
        // Only ASCII bytes outside strings were dropped, so the rest is still UTF-8.
        Some(out) => {
            Cow::Owned(String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whitespace_between_tokens_is_dropped_and_strings_numbers_and_escapes_keep_their_bytes() {
        let json =
            "{ \"tab\":\t\"a \\\" b\\\\\",\n\r \"nl\" : [ 1.50 , -0e+10 , true , null ] ,\"s\":\"\\u0000 \\n\" }";
        assert_eq!(compact(json), r#"{"tab":"a \" b\\","nl":[1.50,-0e+10,true,null],"s":"\u0000 \n"}"#);
        assert!(matches!(compact(r#"{"a":"x y","b":1}"#), Cow::Borrowed(_)));
        assert_eq!(compact("\"é\u{2028}\" "), "\"é\u{2028}\"");
    }
}
