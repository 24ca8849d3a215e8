//! The `sqltrigger.json` keys only the SQL Server sources read, checked when the source is built so a typo
//! fails at start-up with the key's name rather than on the first tick.

use crate::source::SourceError;
use serde_json::{Map, Value};

/// What to do when change tracking no longer holds the changes after the stored position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnPositionLost {
    /// Stop with `SourceError::PositionLost` (the default): losing changes silently is the official
    /// trigger's behaviour and the one thing this source refuses to copy.
    Fail,
    /// Walk the table again (every current row as an Insert), then follow changes from there. Deletes that
    /// happened in the lost window are not reported.
    Resync,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub on_position_lost: OnPositionLost,
    /// Changes made under this `CHANGE_TRACKING_CONTEXT` are skipped (`skipOwnChangesContext`).
    pub skip_context: Option<Vec<u8>>,
    /// `Metadata` on each change: version, creation version and changed columns.
    pub include_metadata: bool,
    /// `startFrom: snapshot`: walk the current rows first, then follow changes.
    pub snapshot_start: bool,
}

/// Longest `CHANGE_TRACKING_CONTEXT` SQL Server accepts.
const MAX_CONTEXT_BYTES: usize = 128;

impl Options {
    pub fn parse(o: &Map<String, Value>) -> Result<Self, SourceError> {
        let bad = |key: &str, what: &str| SourceError::Invalid(format!("{key} in sqltrigger.json {what}"));
        let on_position_lost = match o.get("onPositionLost") {
            None => OnPositionLost::Fail,
            Some(Value::String(s)) if s == "fail" => OnPositionLost::Fail,
            Some(Value::String(s)) if s == "resync" => OnPositionLost::Resync,
            Some(_) => return Err(bad("onPositionLost", "must be \"fail\" (the default) or \"resync\"")),
        };
        let skip_context = match o.get("skipOwnChangesContext") {
            None | Some(Value::Bool(false)) | Some(Value::Null) => None,
            // `true`: skip what this app writes under its own changeTrackingContext.
            Some(Value::Bool(true)) => match o.get("changeTrackingContext").and_then(Value::as_str) {
                Some(ctx) => Some(context_bytes(ctx).map_err(|e| bad("changeTrackingContext", &e))?),
                None => {
                    return Err(bad(
                        "skipOwnChangesContext",
                        "is true but changeTrackingContext is not set; set the context (a string, or hex as 0x...) in either key",
                    ))
                }
            },
            Some(Value::String(s)) => Some(context_bytes(s).map_err(|e| bad("skipOwnChangesContext", &e))?),
            Some(_) => return Err(bad("skipOwnChangesContext", "must be a string (text, or hex as 0x...) or true")),
        };
        let include_metadata = match o.get("includeMetadata") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(bad("includeMetadata", "must be true or false")),
        };
        let snapshot_start = o.get("startFrom").and_then(Value::as_str) == Some("snapshot");
        Ok(Self { on_position_lost, skip_context, include_metadata, snapshot_start })
    }
}

/// `0x0A0B...` is hex; anything else is the UTF-8 bytes of the text (what `CAST('text' AS varbinary(128))`
/// stores for ASCII text; for `N'text'` contexts, which are UTF-16, give the hex form).
pub fn context_bytes(text: &str) -> Result<Vec<u8>, String> {
    let bytes = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => {
            if hex.is_empty() || hex.len() % 2 != 0 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!("{text:?} is not hex: write an even number of hex digits after 0x"));
            }
            (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).map_err(|e| e.to_string()))
                .collect::<Result<Vec<u8>, String>>()?
        }
        None => text.as_bytes().to_vec(),
    };
    if bytes.is_empty() || bytes.len() > MAX_CONTEXT_BYTES {
        return Err(format!(
            "must be 1 to {MAX_CONTEXT_BYTES} bytes (CHANGE_TRACKING_CONTEXT is varbinary(128)), got {}",
            bytes.len()
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<Options, SourceError> {
        Options::parse(v.as_object().expect("object"))
    }

    #[test]
    fn defaults_refuse_lost_positions_and_skip_nothing() {
        let o = parse(json!({})).expect("valid");
        assert_eq!(o.on_position_lost, OnPositionLost::Fail);
        assert_eq!(o.skip_context, None);
        assert!(!o.include_metadata && !o.snapshot_start);
    }

    #[test]
    fn a_context_is_hex_or_text() {
        assert_eq!(context_bytes("0x0A0b").expect("hex"), vec![0x0a, 0x0b]);
        assert_eq!(context_bytes("my-app").expect("text"), b"my-app".to_vec());
        assert!(context_bytes("0xABC").unwrap_err().contains("even number"));
        assert!(context_bytes(&"x".repeat(129)).unwrap_err().contains("1 to 128 bytes"));
        let o = parse(json!({"skipOwnChangesContext": true, "changeTrackingContext": "0x01"})).expect("valid");
        assert_eq!(o.skip_context, Some(vec![1]));
        let e = parse(json!({"skipOwnChangesContext": true})).unwrap_err().to_string();
        assert!(e.contains("changeTrackingContext is not set"), "{e}");
    }

    #[test]
    fn bad_values_name_their_key() {
        let e = parse(json!({"onPositionLost": "skip"})).unwrap_err().to_string();
        assert!(e.starts_with("onPositionLost in sqltrigger.json"), "{e}");
        let e = parse(json!({"includeMetadata": "yes"})).unwrap_err().to_string();
        assert!(e.starts_with("includeMetadata"), "{e}");
        assert!(parse(json!({"onPositionLost": "resync", "startFrom": "snapshot"})).expect("valid").snapshot_start);
    }
}
